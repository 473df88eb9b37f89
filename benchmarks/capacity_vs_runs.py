"""Benchmark: the capacity model's CPU estimate against finished runs on this machine.

For every finished run directory (``spec.yaml``, ``iterations.csv``, ``traces/cpu.csv``,
``summary.json`` with status ``ok``) under the given roots, prints the busy cores the run
measured during training and the CPU estimate of :func:`testbed.capacity.estimate` for its
spec (its own ``scale``) with three versions of the cost model in use
(:func:`testbed.machine_costs.costs_path`: ``$TESTBED_MACHINE_COSTS``, the user's, else the
shipped ``testbed/data/machine_costs.yaml``): ``old``, without any per-message term
(``runtime_message_cpu_s`` = 0 and no scheme's ``<scheme>_message_cpu_s``); ``rt``, with the
runtime's per-message term only (no scheme's own); ``new``, the model as it is (the
runtime's term plus the scheme's own, :func:`testbed.capacity.scheme_message_key`); and the
ratios measured / estimate.

* *measured* (column ``meas``): mean over the CPU sampler's samples (``traces/cpu.csv``,
  rows of kind ``core``, real time) within the measured iterations (``iterations.csv``, in
  the emulated network's time ``t0 + (t - t0) / scale``, taken back to real time: from the
  earliest worker start of the first iteration at or after ``workload.warmup_iterations``
  to the latest worker end) of the sum over the cores of ``busy_pct / 100``: busy cores of
  the whole machine (the harness, capture, runtime processes and the kernel's forwarding
  together). Column ``summ``: the same from ``summary.json`` (``cores x (1 - idle_pct_mean
  / 100)``, the harness's own analysis of the same window), as a check.
* *estimate*: :attr:`testbed.capacity.Estimate.cpu_cores`, an upper bound that assumes every
  host link busy at its dilated line rate; a ratio above 1 means the run used more than the
  bound.

Also prints the scheme's mean message bytes (``msg B``,
:meth:`traffic.schemes.Scheme.message_bytes`), the three estimates (``old``, ``rt``,
``new``), the messages' part of the new one (``msgs``), the ratios (``m/old``, ``m/rt``,
``m/new``) and, per scheme, the range of each ratio. Compute mode ``real`` runs use real
compute's CPU, which the model does not count (marked ``real``). Benchmarks print, they do
not assert.

    .venv/bin/python benchmarks/capacity_vs_runs.py [RUNS_DIR ...]     # default: runs/
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from testbed.capacity import COST_KEYS, Cost, CostModel, Machine, estimate  # noqa: E402
from testbed.machine_costs import OPTIONAL_KEYS  # noqa: E402
from testbed.runner import plan_point  # noqa: E402
from testbed.spec import from_dict  # noqa: E402
from traffic.summary import RunSummary  # noqa: E402


def _first_time(path: Path, sep: str, header: bool) -> float | None:
    """The first field of the first data line of a trace (unix s), or None."""
    if not path.exists():
        return None
    with open(path) as f:
        if header:
            f.readline()
        line = f.readline()
    try:
        return float(line.split(sep)[0])
    except ValueError:
        return None


def run_t0(run_dir: Path) -> float:
    """The real time the run's clocks are dilated around: the earliest timestamp of its
    traces and events (:func:`analysis.load.to_emulated_time`'s ``t0``; the traces' and each
    event log's first lines: each is written in time order from its start)."""
    starts = [
        _first_time(run_dir / "traces" / "bwm-ng.csv", ";", False),
        _first_time(run_dir / "traces" / "qdisc.csv", ",", True),
        _first_time(run_dir / "traces" / "cpu.csv", ",", True),
    ]
    for ev in sorted((run_dir / "events").glob("*.jsonl")):
        with open(ev) as f:
            line = f.readline()
        if line.strip():
            starts.append(float(json.loads(line)["ts"]))
    return min(t for t in starts if t is not None)


def measured_busy_cores(run_dir: Path, warmup: int, scale: float) -> tuple[float, int, float] | None:
    """(mean busy cores, samples, window in real seconds) over the measured iterations, or
    None. ``iterations.csv`` is in the emulated network's time (``t0 + (t - t0) / scale``),
    ``traces/cpu.csv`` in real time: the window is taken back to real time."""
    with open(run_dir / "iterations.csv") as f:
        its = [r for r in csv.DictReader(f)]
    if not its:
        return None
    m = [r for r in its if int(r["iteration"]) >= warmup] or its
    t0 = run_t0(run_dir) if scale != 1 else 0.0
    lo, hi = (t0 + (t - t0) * scale for t in (min(float(r["start"]) for r in m), max(float(r["end"]) for r in m)))
    per_t: dict[float, float] = {}
    with open(run_dir / "traces" / "cpu.csv") as f:
        for r in csv.DictReader(f):
            if r.get("kind") != "core":
                continue
            t = float(r["time"])
            if lo <= t <= hi:
                per_t[t] = per_t.get(t, 0.0) + float(r["busy_pct"]) / 100.0
    if not per_t:
        return None
    return sum(per_t.values()) / len(per_t), len(per_t), hi - lo


def run_dirs(roots: list[Path]) -> list[Path]:
    out = []
    for root in roots:
        for spec in sorted(root.rglob("spec.yaml")):
            d = spec.parent
            if all((d / f).exists() for f in ("traces/cpu.csv", "iterations.csv", "summary.json")):
                out.append(d)
    return out


def finished_runs(roots: list[Path]):
    """Every ``ok`` run under ``roots`` with its busy cores measured: yields ``(run_dir,
    summary, experiment, (busy cores, samples, window s))`` (:func:`measured_busy_cores`)."""
    for d in run_dirs(roots):
        summ = RunSummary.load(d)
        if summ.status != "ok":
            continue
        exp = from_dict(yaml.safe_load((d / "spec.yaml").read_text()))
        meas = measured_busy_cores(d, exp.workload.warmup_iterations, float(exp.scale))
        if meas is not None:
            yield d, summ, exp, meas


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="*", type=Path, default=[ROOT / "runs"], help="directories holding run dirs")
    a = ap.parse_args(argv)
    new_model = CostModel.load()
    # the schemes' own per message: every key that is neither required nor optional
    own = {k: c for k, c in new_model.costs.items() if k not in COST_KEYS and k not in OPTIONAL_KEYS}
    rt_model = CostModel(
        {k: c for k, c in new_model.costs.items() if k not in own},
        new_model.machine,
        "<without the schemes' own per-message terms>",
    )
    old_costs = dict(rt_model.costs)
    c = old_costs["runtime_message_cpu_s"]
    old_costs["runtime_message_cpu_s"] = Cost(0.0, c.unit, "the estimate without the per-message term")
    old_model = CostModel(old_costs, new_model.machine, "<without runtime_message_cpu_s>")
    machine = Machine.current()
    print(
        f"cost model {new_model.path}: runtime_message_cpu_s = {new_model['runtime_message_cpu_s'] * 1e6:.1f} us "
        f"per message; the schemes' own: "
        + (", ".join(f"{k} = {c.value * 1e6:.1f} us" for k, c in own.items()) or "none")
        + f"; machine {machine.cores} cores"
    )
    head = (
        f"{'run':64s} {'scheme':9s} {'scale':>5s} {'msg B':>9s} {'meas':>5s} {'summ':>5s} {'old':>5s} "
        f"{'rt':>5s} {'new':>5s} {'msgs':>5s} {'m/old':>5s} {'m/rt':>5s} {'m/new':>5s}"
    )
    print(head)
    rows = []
    for d, summ, exp, meas in finished_runs(a.roots):
        hosts, procs = plan_point(exp)
        new = estimate(exp, hosts, procs, model=new_model, machine=machine)
        rt = estimate(exp, hosts, procs, model=rt_model, machine=machine)
        old = estimate(exp, hosts, procs, model=old_model, machine=machine)
        busy = meas[0]
        label = str(d.relative_to(d.parents[1]))[:64]
        real = " real" if exp.workload.compute.mode == "real" else ""
        rows.append(
            (label, exp.workload.scheme + real, busy / old.cpu_cores, busy / rt.cpu_cores, busy / new.cpu_cores)
        )
        idle = summ.cpu.idle_pct_mean if summ.cpu else None
        by_summary = f"{machine.cores * (1 - idle / 100):5.2f}" if idle is not None else f"{'-':>5s}"
        print(
            f"{label:64s} {exp.workload.scheme:9s} {new.scale:5g} {new.message_bytes:9.3g} {busy:5.2f} "
            f"{by_summary} {old.cpu_cores:5.2f} {rt.cpu_cores:5.2f} {new.cpu_cores:5.2f} "
            f"{new.cpu_breakdown['messages']:5.2f} {busy / old.cpu_cores:5.2f} {busy / rt.cpu_cores:5.2f} "
            f"{busy / new.cpu_cores:5.2f}{real}",
            flush=True,
        )
    if rows:
        for i, name in ((2, "measured/old"), (3, "measured/rt"), (4, "measured/new")):
            v = sorted(r[i] for r in rows)
            print(
                f"{name}: {len(v)} runs, min {v[0]:.2f}, median {v[len(v) // 2]:.2f}, max {v[-1]:.2f}; "
                f"above 1: {sum(x > 1 for x in v)}"
            )
        print(f"{'scheme':16s} {'runs':>4s} {'m/old':>11s} {'m/rt':>11s} {'m/new':>11s}")
        for scheme in sorted({r[1] for r in rows}):
            mine = [r for r in rows if r[1] == scheme]
            cells = " ".join(f"{min(r[i] for r in mine):5.2f}-{max(r[i] for r in mine):<5.2f}" for i in (2, 3, 4))
            print(f"{scheme:16s} {len(mine):4d} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
