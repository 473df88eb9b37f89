"""Benchmark: what the harness costs a run, and how many hosts this machine emulates faithfully.

Prints, each from real runs through ``testbed.runner`` on this machine:

1. per process count (4, 8, 16, 32 workers of ring allreduce on digits_mlp, 10 iterations,
   racks of 4 hosts behind a 2:1 core), per launcher (``zygote``, ``exec``) and repeat
   (``--reps``): each phase of a single run in seconds of wall clock (:func:`phases`: the
   prelude of planning, capacity check, lock, run directory and provenance; the network
   build; the launch; the rendezvous; training; the drain; teardown; the summary's
   analysis) and ``outside_s``, the wall time of ``run_experiment`` outside training;
2. a quickstart-sized sweep of 10 points (``experiments/quickstart.yaml``'s workload: 60
   iterations, warm-up 5, an evaluation every 10; its two schemes x 5 host_bw_mbps values),
   or with ``--sweep-iterations N`` ring allreduce at N iterations per point: its wall time
   and the share of it spent training (first iteration start to last iteration end, summed
   over points), and the wall time per point outside training;
3. ring-allreduce fidelity (the ring bound 2 (p-1)/p * n / B over the achieved time, VGG-19's
   gradients) for 8, 16, 24, 32 hosts at an emulated 1 Gbit/s, each at the smallest dilation
   that the capacity model (:mod:`testbed.capacity`) says keeps 35 % of the CPU idle.

Run it alone on an idle machine (it builds networks one after the other)::

    sudo .venv/bin/python benchmarks/harness_overhead.py [--quick] [--sizes 4,8,16,32] [--launchers zygote,exec]

``--quick``: sizes 4 and 8, a 4-point sweep, fidelity at 8 hosts. ``--launchers default``
leaves ``run.launcher`` out of the specs (the spec's default; also for a checkout that
predates the field: run this file with ``PYTHONPATH`` at that checkout to compare).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from testbed.runner import plan_point, run_experiment  # noqa: E402
from testbed.spec import from_dict  # noqa: E402


def spec(runs_dir: Path, hosts: int, launcher: str, iterations: int = 10, **extra) -> dict:
    d = {
        "name": "overhead",
        "topology": {
            "kind": "rack_core",
            "racks": max(1, hosts // 4),
            "hosts_per_rack": min(4, hosts),
            "host_bw_mbps": 100,
            "oversubscription": 2,
        },
        "workload": {
            "scheme": "allreduce",
            "model": "digits_mlp",
            "dataset": "digits",
            "batch_size": 32,
            "iterations": iterations,
            "warmup_iterations": 2,
        },
        "run": {
            "runs_dir": str(runs_dir),
            "timeout_s": 600,
            **({} if launcher == "default" else {"launcher": launcher}),
        },
    }
    for k, v in extra.items():
        d.setdefault(k, {}).update(v) if isinstance(v, dict) else d.__setitem__(k, v)
    return d


#: harness.log lines whose time marks a phase's start or end
_MARKS = {
    "processes fork from": "open",
    "building network": "build",
    "network up": "up",
    "launching": "launch",
    "all processes done": "done",
    "torn down": "down",
}
#: harness.log lines that give a phase's own duration in seconds
_DURATIONS = re.compile(r"(launch took|summarized in) ([0-9.]+) s")


def _harness_log(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """From one read of ``logs/harness.log``: the unix time of each first mark of
    :data:`_MARKS` (by key), and the durations it logs (``launch``, ``summary``; seconds)."""
    times, durations = {}, {}
    for line in (run_dir / "logs" / "harness.log").read_text().splitlines():
        for text, key in _MARKS.items():
            if text in line and key not in times:
                times[key] = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        m = _DURATIONS.search(line)
        if m:
            durations.setdefault("launch" if m.group(1) == "launch took" else "summary", float(m.group(2)))
    return times, durations


def _events(run_dir: Path) -> list[dict]:
    return [
        json.loads(l)
        for f in glob.glob(str(run_dir / "events" / "*.jsonl"))
        for l in open(f)
        if l.strip().endswith("}")
    ]


def phases(run_dir: Path, t_call: float | None = None, t_return: float | None = None) -> dict[str, float]:
    """Wall-clock seconds of each phase of one run, from its ``logs/harness.log`` and events:
    ``prelude_s`` (``run_experiment`` called to the site opened: planning, the capacity check,
    preflight, the lock, the run directory and provenance; given ``t_call``), ``build_s``,
    ``launch_s`` (launch to every process forked and started), ``ready_s`` (launch to the last
    ``init`` event's end: rendezvous), ``first_iteration_s``, ``training_s`` (first iteration
    start to last iteration end), ``drain_s`` (last iteration end to every process done),
    ``teardown_s``, ``summary_s`` (the summary's analysis), ``after_s`` (teardown end to
    ``run_experiment``'s return; given ``t_return``) and ``outside_s``, all but training."""
    t, logged = _harness_log(run_dir)
    ev = _events(run_dir)
    its = [e for e in ev if e["kind"] == "iteration"]
    ready = max(e["ts"] + e["dur"] for e in ev if e["kind"] == "init" and "world_size" in e)
    first, last = min(e["ts"] for e in its), max(e["ts"] + e["dur"] for e in its)
    out = {
        "prelude_s": t.get("open", t["build"]) - t_call if t_call is not None else math.nan,
        "build_s": t["up"] - t["build"],
        "launch_s": logged.get("launch", math.nan),
        "ready_s": ready - t["launch"],
        "first_iteration_s": first - t["launch"],
        "training_s": last - first,
        "drain_s": t["done"] - last,
        "teardown_s": t["down"] - t["done"] if "down" in t else math.nan,
        "summary_s": logged.get("summary", math.nan),
        "after_s": t_return - t["down"] if t_return is not None and "down" in t else math.nan,
    }
    if t_call is not None and t_return is not None:
        out["outside_s"] = (t_return - t_call) - out["training_s"]
    return out


def training_s(run_dir: Path) -> float:
    its = [e for e in _events(run_dir) if e["kind"] == "iteration"]
    return max(e["ts"] + e["dur"] for e in its) - min(e["ts"] for e in its)


def startup(work: Path, sizes: list[int], launchers: list[str], reps: int = 1) -> None:
    cols = [
        "prelude_s",
        "build_s",
        "launch_s",
        "ready_s",
        "first_iteration_s",
        "training_s",
        "drain_s",
        "teardown_s",
        "summary_s",
        "after_s",
        "outside_s",
    ]
    print("processes  launcher  rep  " + "  ".join(cols) + "  idle%")
    for n in sizes:
        for launcher in launchers:
            for rep in range(reps):
                exp = from_dict(spec(work / f"start-{n}-{launcher}-{rep}", n, launcher))
                t_call = time.time()
                (res,) = run_experiment(exp, progress=False)
                t_return = time.time()
                if not res.ok:
                    print(f"{n:9d}  {launcher:8s}  {rep:3d}  failed: {(res.summary.error or '')[:200]}")
                    continue
                p = phases(res.run_dir, t_call, t_return)
                idle = res.summary.fidelity.idle_pct_mean if res.summary.fidelity else None
                print(
                    f"{n:9d}  {launcher:8s}  {rep:3d}  "
                    + "  ".join(f"{p[c]:{len(c)}.2f}" for c in cols)
                    + f"  {idle if idle is None else round(idle)}",
                    flush=True,
                )


def sweep_share(work: Path, points: int, launcher: str, iterations: int | None) -> None:
    if iterations is None:  # quickstart-sized: the quickstart's own spec, its schemes x bandwidths
        d = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
        d["run"] = {
            **d.get("run", {}),
            "runs_dir": str(work / f"sweep-{launcher}"),
            **({} if launcher == "default" else {"launcher": launcher}),
        }
        d["sweep"] = {
            "workload.scheme": ["ps", "allreduce"],
            "topology.host_bw_mbps": [100 + 10 * i for i in range(max(1, points // 2))],
        }
        what = "quickstart-sized"
    else:
        d = spec(work / f"sweep-{launcher}", 8, launcher, iterations=iterations)
        d["sweep"] = {"topology.host_bw_mbps": [100 + 10 * i for i in range(points)]}
        what = f"allreduce, {iterations} iterations each"
    t0 = time.time()
    results = run_experiment(from_dict(d), progress=False)
    wall = time.time() - t0
    train = sum(training_s(r.run_dir) for r in results if r.ok)
    print(
        f"sweep of {len(results)} points ({what}; launcher {launcher}): wall {wall:.0f} s, training {train:.0f} s: "
        f"{100 * train / wall:.0f}% of the wall time spent training, {(wall - train) / len(results):.1f} s per "
        f"point outside training ({sum(r.ok for r in results)} ok)",
        flush=True,
    )


def fidelity(hosts_list: list[int], reps: int) -> None:
    from emulation_fidelity import hosts_at_1g  # the allreduce measurement, shared with that benchmark

    from testbed import capacity
    from traffic.models import model_info

    n_params = model_info("vgg19")["param_bytes"] // 4
    for n in hosts_list:
        exp = from_dict(
            {
                "topology": {
                    "kind": "rack_core",
                    "racks": 2,
                    "hosts_per_rack": n // 2,
                    "host_bw_mbps": 1000,
                    "oversubscription": 2,
                },
                "workload": {
                    "scheme": "allreduce",
                    "model": "vgg19",
                    "workers": n,
                    "compute": {"mode": "emulated", "profile": "gtx1080ti"},
                },
            }
        )
        hosts, procs = plan_point(exp)
        est = capacity.estimate(exp, hosts, procs)
        scale = max(1.0, float(math.ceil(est.min_scale)))
        print(f"capacity model: {n} hosts at 1 Gbit/s need scale >= {est.min_scale:.2f}; running at {scale:g}")
        hosts_at_1g(n_params, [n], [scale], reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="process counts, default 4,8,16,32 (--quick: 4,8); '' for none")
    ap.add_argument("--launchers", default="zygote,exec")
    ap.add_argument("--sweep-points", type=int, default=None)
    ap.add_argument(
        "--sweep-iterations",
        type=int,
        default=None,
        help="ring allreduce at this many iterations per point (default: the quickstart-sized sweep)",
    )
    ap.add_argument("--fidelity-hosts", default=None, help="default 8,16,24,32 (--quick: 8); '' for none")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()

    def ints(text: str | None, default: str) -> list[int]:  # '' selects nothing
        return [int(x) for x in (default if text is None else text).split(",") if x]

    sizes = ints(a.sizes, "4,8" if a.quick else "4,8,16,32")
    launchers = [x for x in a.launchers.split(",") if x]
    points = a.sweep_points if a.sweep_points is not None else (4 if a.quick else 10)
    fid = ints(a.fidelity_hosts, "8" if a.quick else "8,16,24,32")
    work = Path(tempfile.mkdtemp(prefix="harness-overhead-", dir="."))
    try:
        if sizes:
            startup(work, sizes, launchers, a.reps)
        if points:
            for launcher in launchers:
                sweep_share(work, points, launcher, a.sweep_iterations)
        if fid:
            fidelity(fid, a.reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
