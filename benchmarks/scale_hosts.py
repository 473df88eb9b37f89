"""Benchmark: how many hosts of a real model does one machine emulate?

For each size in ``--sizes`` (default 32, 64, 128 hosts) it runs ``experiments/scale_vgg19.yaml``
(ring allreduce of VGG-19, batch 32, emulated GTX 1080 Ti compute in light memory, racks of 16
hosts behind a 2:1 core, host links at an emulated 1 Gbit/s, ``scale: auto``) with
``topology.racks`` = size / 16, through :func:`testbed.runner.run_experiment` (the run
directories stay in the spec's ``run.runs_dir``), and prints one row per run:

* ``hosts``, ``scale`` (the capacity model's pick), ``status``, ``starved`` (the summary's
  ``fidelity.cpu_starved``) and ``idle%`` (``fidelity.idle_pct_mean``, over the measured
  iterations); ``model idle%``: the idle the capacity model expects of the run's spec at its
  scale (:func:`testbed.capacity.estimate` with this machine's cost model), to compare with
  the measured one;
* ``build s``, ``ready s``, ``1st iter s``: the network's build, and from the launch to every
  process ready and to the first iteration, s of wall clock
  (:func:`harness_overhead.phases`);
* ``mem +GiB``: the machine's used memory at its peak minus just before the build
  (``memory.machine_growth_bytes``); ``USS med/max MiB``: the median and largest peak USS of a
  worker (``memory.process_uss_peak_bytes``: every process of this scheme is a worker);
* ``sent MB``: bytes a worker sent per measured iteration, the median over workers of its host
  link's tx over the measured window (bwm-ng at its ToR port: what the wire carried, headers
  included; :func:`analysis.metrics.link_bytes`) / measured iterations; ``ring MB``: the ring's
  volume 2 (p-1)/p x n, with n the gradient bytes all-reduced per iteration (the ``bytes`` of
  a worker's ``allreduce`` events in one iteration, median over workers and iterations:
  VGG-19's 575 MB); ``sent/ring``;
* ``ring fid``: the ring bound 2 (p-1)/p x n x 8 / R (R: ``topology.host_bw_mbps``) over the
  achieved communication time of a measured iteration, from the earliest start of a worker's
  ``allreduce`` event of that iteration to the latest end of one (emulated seconds; the host
  cost charged after each bucket's allreduce, and any worker's wait for the slowest, are
  inside it), the median over measured iterations; 1 is the bound met.

Run it alone on an idle machine (it builds networks one after the other)::

    sudo .venv/bin/python benchmarks/scale_hosts.py [--sizes 32,64,128] [--iterations 2] [--warmup-iterations 1]
    .venv/bin/python benchmarks/scale_hosts.py --runs DIR [DIR ...]

``--iterations`` is ``workload.iterations`` (the warm-up included) and ``--warmup-iterations``
``workload.warmup_iterations``: by default one measured iteration. ``--runs`` prints the same
rows from existing run (or sweep) directories of this spec, e.g. one made by
``testbed run experiments/scale_vgg19.yaml``, without running anything. Exit status: 0 every
run ok, 1 some run not ok, 2 a bad argument, a refusal before a run starts (a size that is
not a whole number of racks, the capacity check, not root, a missing tool: the runs made until
then are still shown), or a directory that is not a run of ring allreduce.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_overhead import phases  # noqa: E402

from analysis import metrics  # noqa: E402
from analysis.load import load  # noqa: E402
from common.errors import SpecError, TestbedError  # noqa: E402
from testbed import capacity  # noqa: E402
from testbed.runner import plan_point, run_experiment  # noqa: E402
from testbed.spec import Experiment, load_spec  # noqa: E402
from traffic.rundir import NotARunError, find_runs  # noqa: E402
from traffic.summary import Fidelity, Memory, RunSummary, UssPeaks  # noqa: E402

SPEC = ROOT / "experiments" / "scale_vgg19.yaml"
GIB, MIB, MB = 2**30, 2**20, 1e6


def experiment(hosts: int, iterations: int, warmup: int) -> Experiment:
    """``experiments/scale_vgg19.yaml`` at ``hosts`` hosts: its racks (of 16 hosts) as many as
    they take, ``workload.iterations`` and ``warmup_iterations`` set.

    Raises:
        SpecError: ``hosts`` is not a whole number of the spec's racks, or the iterations are
            refused.
    """
    per_rack = load_spec(SPEC).topology.hosts_per_rack
    if hosts <= 0 or hosts % per_rack:
        raise SpecError("--sizes", hosts, f"a positive multiple of {per_rack} (the spec's racks of {per_rack} hosts)")
    return load_spec(
        SPEC,
        [
            f"topology.racks={hosts // per_rack}",
            f"name=scale_vgg19-{hosts}",
            f"workload.iterations={iterations}",
            f"workload.warmup_iterations={warmup}",
        ],
    )


def ring_figures(run, measured, workers: list[str]) -> dict:
    """n (gradient bytes all-reduced per iteration and worker) and the ring fidelity (the
    bound over the achieved time, median over ``measured`` iterations) from the run's
    ``allreduce`` events (emulated clock)."""
    ev = run.events
    if ev.empty:
        return {"n_bytes": math.nan, "fidelity": math.nan}
    ar = ev[(ev["kind"] == "allreduce") & ev["proc"].isin(workers) & ev["iteration"].isin(measured["iteration"])]
    if ar.empty:
        return {"n_bytes": math.nan, "fidelity": math.nan}
    n = float(ar.groupby(["iteration", "proc"])["bytes"].sum().median())
    p = len(workers)
    rate_bps = float(run.spec["topology"]["host_bw_mbps"]) * 1e6
    bound_s = 2 * (p - 1) / p * n * 8 / rate_bps
    ends = ar["ts"] + ar["dur"]
    achieved = ends.groupby(ar["iteration"]).max() - ar.groupby("iteration")["ts"].min()
    return {"n_bytes": n, "fidelity": float(np.median(bound_s / achieved))}


def model_idle_pct(run_dir: Path) -> float:
    """The idle % of the cores the capacity model expects of the run's ``spec.yaml`` (its
    scale a number) on this machine; NaN when the spec or the cost model cannot be read."""
    try:
        exp = load_spec(run_dir / "spec.yaml")
        est = capacity.estimate(exp, *plan_point(exp))
    except (TestbedError, OSError):
        return math.nan
    return 100.0 * (1.0 - est.cpu_cores / est.cores)


def row(run_dir: Path) -> dict:
    """The figures of one run directory (see the module doc); NaN for what it lacks.

    Raises:
        NotARunError: ``run_dir`` is not a run of ring allreduce (its spec's scheme).
    """
    run = load(run_dir)
    scheme = (run.spec.get("workload") or {}).get("scheme")
    if scheme != "allreduce":
        raise NotARunError(f"{run_dir} is a run of scheme {scheme!r}: give runs of {SPEC.name} (ring allreduce)")
    s = run.summary or RunSummary(status="no summary")
    f, m = s.fidelity or Fidelity(), s.memory or Memory()
    uss = m.process_uss_peak_bytes or UssPeaks()
    workers = [p["name"] for p in run.processes.get("processes", []) if p.get("role") == "worker"]
    hosts = {p["host"] for p in run.processes.get("processes", []) if p.get("role") == "worker"}
    glob = metrics.global_iterations(run.iterations, len(workers) or None)
    measured = metrics.measured_iterations(glob, int(run.spec.get("workload", {}).get("warmup_iterations") or 0))
    sent = math.nan
    if not measured.empty and not run.traces.empty and run.topology:
        window = (float(measured["start"].min()), float(measured["end"].max()))
        tx = [
            v["tx"]
            for h, v in metrics.link_bytes(run.traces, run.topology, window)["per_host"].items()
            if h in hosts and v["tx"] is not None
        ]
        sent = float(np.median(tx)) / len(measured) if tx else math.nan
    ring = ring_figures(run, measured, workers) if not measured.empty else {"n_bytes": math.nan, "fidelity": math.nan}
    p = len(workers)
    volume = 2 * (p - 1) / p * ring["n_bytes"] if p else math.nan
    try:
        times = phases(run_dir)
    except (KeyError, ValueError, OSError):  # a run that failed before it trained
        times = {}

    def num(v, unit=1.0):
        return math.nan if v is None else v / unit

    return {
        "hosts": p,
        "scale": num(s.scale),
        "status": s.status,
        "starved": f.cpu_starved,
        "idle%": num(f.idle_pct_mean),
        "model idle%": model_idle_pct(run_dir),
        "build s": times.get("build_s", math.nan),
        "ready s": times.get("ready_s", math.nan),
        "1st iter s": times.get("first_iteration_s", math.nan),
        "mem +GiB": num(m.machine_growth_bytes, GIB),
        "USS med MiB": num(uss.median, MIB),
        "USS max MiB": num(uss.max, MIB),
        "sent MB": sent / MB,
        "ring MB": volume / MB,
        "sent/ring": sent / volume if volume else math.nan,
        "ring fid": ring["fidelity"],
    }


FORMATS = {
    "scale": "g",
    "idle%": ".0f",
    "model idle%": ".0f",
    "build s": ".1f",
    "ready s": ".1f",
    "1st iter s": ".1f",
    "mem +GiB": ".2f",
    "USS med MiB": ".0f",
    "USS max MiB": ".0f",
    "sent MB": ".0f",
    "ring MB": ".0f",
    "sent/ring": ".3f",
    "ring fid": ".3f",
}


def table(rows: list[dict]) -> str:
    """``rows`` as the benchmark prints them (NaN and None as ``-``)."""

    def cell(k, v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return format(v, FORMATS[k]) if k in FORMATS else str(v)

    return tabulate(
        [{k: cell(k, v) for k, v in r.items()} for r in rows], headers="keys", disable_numparse=True, stralign="right"
    )


def _sizes(text: str) -> list[int]:
    """``--sizes``: host counts separated by commas (each checked by :func:`experiment`)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: host counts separated by commas, e.g. 32,64,128") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", type=_sizes, default=[32, 64, 128], help="hosts per run, multiples of 16 (default 32,64,128)"
    )
    ap.add_argument("--iterations", type=int, default=2, help="workload.iterations, warm-up included (default 2)")
    ap.add_argument("--warmup-iterations", type=int, default=1, help="workload.warmup_iterations (default 1)")
    ap.add_argument("--runs", nargs="+", metavar="DIR", help="report these run or sweep directories instead of running")
    a = ap.parse_args(argv)
    dirs: list[Path] = []
    try:
        if a.runs:
            dirs = find_runs(a.runs)
        else:
            exps = [experiment(n, a.iterations, a.warmup_iterations) for n in a.sizes]  # every size checked first
            for exp in exps:
                (res,) = run_experiment(exp, progress=False, say=lambda line: print(line, file=sys.stderr))
                dirs.append(res.run_dir)
                hosts = exp.topology.racks * exp.topology.hosts_per_rack
                print(f"{hosts} hosts: {res.summary.status}, {res.run_dir}", file=sys.stderr, flush=True)
        rows = [row(d) for d in dirs]
    except TestbedError as e:  # refused before it ran (a size, root, capacity) or not a run: the runs made are shown
        if dirs and not a.runs:
            print(table([row(d) for d in dirs]))
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
