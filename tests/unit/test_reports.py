"""The papers' reports on synthetic run directories, and ``testbed report``.

Every run and sweep directory here is written by hand with what the reports read (spec.yaml,
processes.json, topology.json, events, iterations.csv, bwm-ng trace, summary.json, results,
ibatch.json, sweep.yaml, sweep.csv; see :mod:`traffic.rundir`), with numbers chosen so that
each table's key figures are known: speedups per point, ratios to a baseline variant, the
pairing of Stanza with PS, the fallback of iBatch's single-node baseline. No network, no
training process.

The builders (``build_*``) each write one sweep directory and are also usable outside pytest
to compare reports on the same directories.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import ibatch_report, p3_report, phub_report, pipe_sgd_report, stanza_report
from analysis import report as skeleton
from analysis.paper_models.phub import hierarchical_pays
from testbed.cli import main as cli_main
from tests.markdown import tables as _tables
from traffic import rundir

T0 = 1_700_000_000.0  # unix s of every synthetic run's start


# ----------------------------------------------------------------------------- writing runs


def _write_run(
    d: Path,
    spec: dict,
    *,
    summary: dict | None = None,
    processes: list[dict] | None = None,
    events: dict[str, list[dict]] | None = None,
    results: dict[str, dict] | None = None,
    iterations: list[dict] | None = None,
    topology: dict | None = None,
    trace: str | None = None,
    files: dict[str, object] | None = None,
) -> Path:
    for sub in ("events", "results", "logs", "traces"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (d / "processes.json").write_text(json.dumps({"processes": processes or []}))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if topology is not None:
        (d / "topology.json").write_text(json.dumps(topology))
    if trace is not None:
        (d / "traces" / "bwm-ng.csv").write_text(trace)
    if iterations is not None:
        pd.DataFrame(iterations).to_csv(d / "iterations.csv", index=False)
    for proc, evs in (events or {}).items():
        (d / "events" / f"{proc}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    for proc, doc in (results or {}).items():
        (d / "results" / f"{proc}.json").write_text(json.dumps(doc))
    for name, doc in (files or {}).items():
        (d / name).write_text(json.dumps(doc))
    return d


def _sweep(root: Path, name: str, sweep_spec: dict, rows: list[dict]) -> Path:
    """``root/name`` with sweep.yaml and sweep.csv (the run directories already written there)."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "sweep.yaml").write_text(yaml.safe_dump(sweep_spec, sort_keys=False))
    pd.DataFrame(rows).to_csv(d / "sweep.csv", index=False)
    return d


def _headline(run: Path, samples_per_s, status="ok", ci95=1.0, iter_mean_s=0.1, cpu_starved=False, **point) -> dict:
    """A row of sweep.csv as the runner writes it (:func:`testbed.runner.headline`)."""
    return {
        **point,
        "scheme": point.get("scheme", "ps"),
        "status": status,
        "samples_per_s": samples_per_s,
        "samples_per_s_ci95": ci95,
        "iter_mean_s": iter_mean_s,
        "iter_p95_s": iter_mean_s,
        "core_bytes": None,
        "accuracy": None,
        "cpu_starved": cpu_starved,
        "run_dir": str(run),
    }


def _worker_procs(n: int, others: tuple[str, ...] = (), other_role: str = "server") -> list[dict]:
    procs = [{"name": f"worker{i}", "role": "worker", "rank": i, "host": f"h{i + 1}"} for i in range(n)]
    return procs + [{"name": o, "role": other_role, "rank": n + i, "host": f"s{i + 1}"} for i, o in enumerate(others)]


# ----------------------------------------------------------------------------- p3


P3_X = "topology.host_bw_mbps"
#: (bandwidth, variant) -> samples/s; the baseline at 8000 failed
P3_POINTS = {
    (2000, "baseline"): 100.0,
    (2000, "slicing"): 110.0,
    (2000, "p3"): 130.0,
    (4000, "baseline"): 180.0,
    (4000, "slicing"): 180.0,
    (4000, "p3"): 225.0,
    (8000, "baseline"): None,
    (8000, "p3"): 300.0,
}


def _p3_trace(bw_mbps: float, busy: int) -> str:
    """bwm-ng lines of worker 0's switch port s1-eth1 every 10 ms for 1 s: ``busy`` of every
    10 samples at the link's full rate in both directions, the others at 1 %."""
    full = bw_mbps * 1e6 / 8 * 0.01
    lines = []
    for k in range(101):
        b = int(full if k % 10 < busy else full / 100)
        lines.append(f"{T0 + 0.01 * k:.3f};s1-eth1;0;0;0;{b};{b};0;0;0;{b // 1500};{b // 1500};0;0;0;0")
        lines.append(f"{T0 + 0.01 * k:.3f};total;0;0;0;{b};{b};0;0;0;0;0;0;0;0;0")
    return "\n".join(lines) + "\n"


def build_p3(root: Path) -> Path:
    """A P3 bandwidth sweep (Fig. 7): baseline, slicing and p3 at 2, 4 and 8 Gbit/s."""
    d = root / "p3_resnet50"
    rows = []
    for i, ((bw, variant), sps) in enumerate(P3_POINTS.items()):
        run = d / f"{i:03d}_host_bw_mbps={bw}_{variant}"
        busy = {"baseline": 3, "slicing": 5, "p3": 8}[variant]
        dt = 32 / sps if sps else 0.2  # iterations at the row's samples/s
        _write_run(
            run,
            {
                "scale": 1,
                "topology": {"kind": "rack", "racks": 1, "host_bw_mbps": bw},
                "workload": {"scheme": "p3", "model": "resnet50", "warmup_iterations": 1},
            },
            summary={"status": "ok" if sps else "failed"},
            processes=_worker_procs(1),
            topology={
                "switches": [{"name": "s1", "role": "tor"}],
                "hosts": [{"name": "h1"}],
                "links": [
                    {
                        "class": "host",
                        "node1": "h1",
                        "intf1": "h1-eth0",
                        "node2": "s1",
                        "intf2": "s1-eth1",
                        "bw_mbps": bw,
                    }
                ],
            },
            trace=_p3_trace(bw, busy),
            iterations=[
                {
                    "iteration": it,
                    "worker": "worker0",
                    "start": T0 + dt * it,
                    "end": T0 + dt * (it + 1),
                    "duration_s": dt,
                    "samples": 32,
                }
                for it in range(5)
            ],
        )
        rows.append(
            _headline(run, sps, status="ok" if sps else "failed", **{P3_X: bw, "variant": variant, "scheme": "p3"})
        )
    return _sweep(
        root,
        d.name,
        {"name": "p3_resnet50", "scale": 1, "workload": {"model": "resnet50"}, "sweep": {P3_X: [2000, 4000, 8000]}},
        rows,
    )


# ----------------------------------------------------------------------------- phub


def _phub_spec(racks: int, background: bool, oversub: float = 3.0, model: str = "resnet50") -> dict:
    """The sections phub_report reads of a resolved spec."""
    return {
        "scale": 1,
        "topology": {
            "kind": "rack_core" if racks > 1 else "rack",
            "racks": racks,
            "hosts_per_rack": 4,
            "host_bw_mbps": 10000.0,
            "uplink_bw_mbps": None,
            "oversubscription": oversub,
            "background_hosts_per_rack": 1 if background else 0,
        },
        "workload": {
            "scheme": "phub",
            "model": model,
            "servers": {"count": None, "placement": "dedicated", "interfaces": 2},
        },
        "background": [{"src": "bg1", "dst": "bg2", "rate_mbps": 1000, "duration_s": 1}] if background else [],
    }


#: (racks, background, variant) -> (samples/s, training bytes across the core per iteration)
PHUB_POINTS = {
    (2, False, "ps_cs"): (100.0, 8e8),
    (2, False, "phub_flat"): (200.0, 8e8),
    (2, False, "phub_hier"): (300.0, 2e8),
    (2, True, "ps_cs"): (50.0, 8e8),
    (2, True, "phub_flat"): (150.0, 8e8),
    (2, True, "phub_hier"): (100.0, 4e8),
    (1, False, "ps_cs"): (400.0, 0.0),
    (1, False, "phub_flat"): (500.0, 0.0),
}


def build_phub(root: Path) -> Path:
    """A PHub oversubscription sweep (Sec. 3.4, Fig. 19): 2 racks with and without
    background traffic, and 1 rack; variants ps_cs, phub_flat, phub_hier."""
    d = root / "phub_oversub"
    rows = []
    for i, ((racks, bg, variant), (sps, core)) in enumerate(PHUB_POINTS.items()):
        run = d / f"{i:03d}_racks={racks}_bg={bg}_{variant}"
        _write_run(
            run,
            _phub_spec(racks, bg),
            processes=_worker_procs(8),
            summary={
                "status": "ok",
                "workers": 8,
                "bytes_per_iteration": {"core": core + (1e9 if bg else 0), "core_training": core, "worker_link": 2e8},
            },
        )
        rows.append(
            _headline(
                run, sps, iter_mean_s=8 * 32 / sps, **{"topology.racks": racks, "variant": variant, "scheme": "phub"}
            )
        )
    return _sweep(root, d.name, {"name": "phub_oversub", "sweep": {"topology.racks": [1, 2]}}, rows)


def build_phub_jobs(root: Path) -> Path:
    """A PHub multi-tenant sweep (Fig. 18): one job, then two jobs sharing the PBox."""
    d = root / "phub_multitenant"
    rows = []
    for i, (variant, jobs) in enumerate((("1job", [100.0]), ("2jobs", [96.0, 94.0]))):
        run = d / f"{i:03d}_{variant}"
        spec = _phub_spec(1, False)
        spec["workload"].update(workers=2 * len(jobs), options={"jobs": len(jobs)})
        _write_run(
            run,
            spec,
            processes=_worker_procs(2 * len(jobs)),
            summary={"status": "ok", "workers": 2 * len(jobs), "bytes_per_iteration": {"worker_link": 1e8}},
            iterations=[
                {
                    "iteration": it,
                    "worker": f"worker{w}",
                    "start": T0 + it * 64 / v,
                    "end": T0 + (it + 1) * 64 / v,
                    "duration_s": 64 / v,
                    "samples": 32,
                }
                for j, v in enumerate(jobs)
                for w in (2 * j, 2 * j + 1)
                for it in range(3)
            ],
        )
        rows.append(_headline(run, sum(jobs), variant=variant, scheme="phub"))
    return _sweep(root, d.name, {"name": "phub_multitenant", "variants": [{"name": "1job"}, {"name": "2jobs"}]}, rows)


# ----------------------------------------------------------------------------- ibatch


def _ibatch_doc(strategy: str, workers: int, layers: int = 4) -> dict:
    ends = {"default": [layers], "layer_by_layer": list(range(1, layers + 1)), "ibatch": [2, layers]}[strategy]
    plan = {
        "ends": ends,
        "batches": [],
        "exe_s": 0.5 + 0.0123 * len(ends),
        "pipeline_s": 0.45 + 0.0071 * len(ends),
        "meets_constraint": len(ends) < layers,
    }
    return {
        "strategy": strategy,
        "profile_iterations": 1,
        "scale": 2.0,
        "workers": workers,
        "servers": 1,
        "layers": layers,
        "profile": {"startup_s": 0.00437, "transfer_s": [0.01] * layers, "forward_s": [0.02] * layers},
        "candidates": {"algorithm1": {"ends": [2, layers]}, "algorithm2": {"ends": [layers]}},
        "chosen": "algorithm1",
        "optimal": {"exe_s": 0.4},
        "used": plan,
    }


def _ibatch_events(workers: int, layers: int = 4, iterations: int = 4) -> dict[str, list[dict]]:
    """Per worker: ``sync`` ends at iteration start + 0.1 s, the last layer's forward ends
    0.3 s later (real time: 0.15 s emulated at scale 2)."""
    out = {}
    for w in range(workers):
        evs = []
        for it in range(iterations):
            t = T0 + it
            evs.append(
                {
                    "proc": f"worker{w}",
                    "role": "worker",
                    "kind": "iteration",
                    "ts": t,
                    "dur": 0.9,
                    "iteration": it,
                    "samples": 32,
                }
            )
            evs.append({"proc": f"worker{w}", "role": "worker", "kind": "sync", "ts": t, "dur": 0.1, "iteration": it})
            for layer in range(layers):
                evs.append(
                    {
                        "proc": f"worker{w}",
                        "role": "worker",
                        "kind": "forward",
                        "ts": t + 0.1 + 0.075 * layer,
                        "dur": 0.075,
                        "iteration": it,
                        "layer": layer,
                    }
                )
        out[f"worker{w}"] = evs
    return out


#: (model, pull, nodes) -> samples/s; vgg19 has no 1-node ``default`` run (its 1-node ibatch
#: run is the baseline)
IBATCH_POINTS = {
    ("googlenet", "default", 1): 101.2345678,
    ("googlenet", "default", 2): 150.0,
    ("googlenet", "layer_by_layer", 2): 163.3,
    ("googlenet", "ibatch", 2): 187.654321,
    ("googlenet", "ibatch", 4): 323.9506,
    ("vgg19", "ibatch", 1): 40.1,
    ("vgg19", "ibatch", 4): 100.25,
}


def build_ibatch(root: Path) -> Path:
    d = root / "ibatch"
    rows = []
    for i, ((model, pull, nodes), sps) in enumerate(IBATCH_POINTS.items()):
        run = d / f"{i:03d}_{model}_{pull}_{nodes}"
        _write_run(
            run,
            {
                "scale": 2.0,
                "workload": {
                    "scheme": "ibatch",
                    "model": model,
                    "warmup_iterations": 1,
                    "options": {"pull": pull, "overlap": True},
                },
            },
            summary={"status": "ok", "throughput": {"mean": sps}},
            processes=_worker_procs(nodes, ("server0",)),
            events=_ibatch_events(nodes),
            files={"ibatch.json": _ibatch_doc(pull, nodes)},
        )
        rows.append(_headline(run, sps, variant=f"{model}-{pull}", scheme="ibatch"))
    return _sweep(root, d.name, {"name": "ibatch"}, rows)


# ----------------------------------------------------------------------------- stanza


def _stanza_run(
    run: Path,
    scheme: str,
    model: str,
    n: int,
    iter_s: float,
    fc_bytes: int,
    other_bytes: int,
    compute: dict,
    evals: list[tuple[float, float]] = (),
) -> Path:
    """n workers (CONV workers for stanza) and one FC worker / server; per iteration each
    worker sends ``fc_bytes`` of FC traffic and ``other_bytes`` of the rest."""
    K = 32
    others = ("fc0",) if scheme == "stanza" else ("server0",)
    events: dict[str, list[dict]] = {}
    for w in range(n):
        evs = []
        for it in range(4):
            t = T0 + it * iter_s
            evs.append(
                {
                    "proc": f"worker{w}",
                    "role": "worker",
                    "kind": "iteration",
                    "ts": t,
                    "dur": iter_s,
                    "iteration": it,
                    "samples": K,
                }
            )
            if scheme == "stanza":
                evs += [
                    {
                        "proc": f"worker{w}",
                        "role": "worker",
                        "kind": "activation",
                        "dir": "tx",
                        "ts": t,
                        "dur": 0.01,
                        "iteration": it,
                        "bytes": fc_bytes - 8 * K,
                    },
                    {
                        "proc": f"worker{w}",
                        "role": "worker",
                        "kind": "label",
                        "dir": "tx",
                        "ts": t,
                        "dur": 0.0,
                        "iteration": it,
                        "bytes": 8 * K,
                    },
                    {
                        "proc": f"worker{w}",
                        "role": "worker",
                        "kind": "allreduce",
                        "dir": "tx",
                        "ts": t,
                        "dur": 0.02,
                        "iteration": it,
                        "bytes": other_bytes,
                        "members": "conv",
                    },
                ]
            else:
                evs += [
                    {
                        "proc": f"worker{w}",
                        "role": "worker",
                        "kind": "push",
                        "dir": "tx",
                        "ts": t,
                        "dur": 0.01,
                        "iteration": it,
                        "bytes": fc_bytes,
                        "layer": 6,
                    },
                    {
                        "proc": f"worker{w}",
                        "role": "worker",
                        "kind": "push",
                        "dir": "tx",
                        "ts": t,
                        "dur": 0.01,
                        "iteration": it,
                        "bytes": other_bytes,
                        "layer": 0,
                    },
                ]
        events[f"worker{w}"] = evs
    if evals:
        events["worker0"] += [
            {
                "proc": "worker0",
                "role": "worker",
                "kind": "eval",
                "ts": T0 + t,
                "dur": 0.0,
                "iteration": 3,
                "accuracy": a,
                "final": True,
            }
            for t, a in evals
        ]
    spec = {
        "scale": 1,
        "topology": {"kind": "rack", "racks": 1, "host_bw_mbps": 1000.0},
        "workload": {
            "scheme": scheme,
            "model": model,
            "dataset": "digits",
            "batch_size": K,
            "warmup_iterations": 1,
            "seed": 0,
            "compute": compute,
        },
    }
    return _write_run(
        run,
        spec,
        processes=_worker_procs(n, others, "fc" if scheme == "stanza" else "server"),
        events=events,
        summary={
            "status": "ok",
            "iteration_time_s": {"mean": iter_s},
            "bytes_per_iteration": {"host_links": 2 * n * (fc_bytes + other_bytes)},
        },
    )


#: (scheme, workers) -> (iteration s, FC bytes per worker and iteration); 8 workers: no PS run
STANZA_POINTS = {
    ("stanza", 2): (0.5, 1_000_000),
    ("ps", 2): (1.0, 8_000_000),
    ("stanza", 4): (0.6, 1_000_000),
    ("ps", 4): (1.5, 8_000_000),
    ("stanza", 8): (0.8, 1_000_000),
}


def build_stanza(root: Path) -> Path:
    """A Stanza speedup sweep (Figs. 6-7, emulated AlexNet, V100 profile) over 2, 4, 8 workers."""
    d = root / "stanza_speedup"
    rows = []
    emulated = {"mode": "emulated", "profile": "v100"}
    for i, ((scheme, n), (t, fc)) in enumerate(STANZA_POINTS.items()):
        run = _stanza_run(d / f"{i:03d}_workers={n}_{scheme}", scheme, "alexnet", n, t, fc, 4_000_000, emulated)
        rows.append(_headline(run, 32 * n / t, variant=scheme, scheme=scheme))
    return _sweep(root, d.name, {"name": "stanza_speedup_alexnet"}, rows)


def build_stanza_accuracy(root: Path) -> Path:
    """Stanza Table 6: real compute (digits_cnn), stanza and ps, accuracy against wall time."""
    d = root / "stanza_accuracy"
    real = {"mode": "real"}
    rows = []
    for i, (scheme, t, evals) in enumerate(
        (("stanza", 0.2, [(0.5, 0.5), (0.9, 0.9)]), ("ps", 0.4, [(1.0, 0.5), (1.7, 0.89)]))
    ):
        run = _stanza_run(d / f"{i:03d}_{scheme}", scheme, "digits_cnn", 4, t, 20_000, 1_000, real, evals)
        rows.append(_headline(run, 128 / t, variant=scheme, scheme=scheme))
    return _sweep(root, d.name, {"name": "stanza_accuracy"}, rows)


# ----------------------------------------------------------------------------- pipe_sgd


def _pipe_sgd_run(
    run: Path,
    scheme: str,
    K: int | None,
    compression: str,
    period: float,
    allreduce_s: float,
    accuracy: float | None,
    model: str = "resnet50",
    p: int = 4,
    iterations: int = 5,
) -> Path:
    """p workers; iteration i of every worker starts at i x ``period``; forward 0.02 s,
    backward 0.04 s, pack 0.002 s, update 0.003 s, the allreduce ``allreduce_s`` (with
    compress/decompress spans of 0.001 s each when compressing, reduce spans of 0.004 s)."""
    events: dict[str, list[dict]] = {}
    for w in range(p):
        proc = f"worker{w}"
        evs = []
        for it in range(iterations):
            t = T0 + it * period

            def ev(kind, ts, dur, **kw):
                return {
                    "proc": proc,
                    "role": "worker",
                    "kind": kind,
                    "ts": ts,
                    "dur": dur,
                    "iteration": it,
                    **kw,
                }

            evs += [
                ev("iteration", t, period, samples=32),
                ev("forward", t, 0.02),
                ev("backward", t + 0.02, 0.04),
                ev("pack", t + 0.06, 0.002),
                ev("update", t + 0.062, 0.003),
            ]
            if scheme == "pipe_sgd":
                evs += [
                    ev("allreduce", t + 0.065, allreduce_s, bytes=1_000_000, wire_bytes=600_000),
                    ev("reduce", t + 0.07, 0.004, bytes=250_000),
                ]
                if compression != "none":
                    evs += [
                        ev("compress", t + 0.066, 0.001, bytes=250_000),
                        ev("decompress", t + 0.08, 0.001, bytes=250_000),
                    ]
            else:
                evs += [
                    ev("push", t + 0.065, allreduce_s / 2, bytes=1_000_000),
                    ev("pull", t + 0.065 + allreduce_s / 2, allreduce_s / 2, bytes=1_000_000),
                ]
        events[proc] = evs
    if accuracy is not None:
        events["worker0"] += [
            {
                "proc": "worker0",
                "role": "worker",
                "kind": "eval",
                "ts": T0 + (iterations - 1) * period,
                "dur": 0.01,
                "iteration": iterations - 1,
                "accuracy": a,
            }
            for a in (accuracy / 2, accuracy)
        ]
    options = {"K": K, "compression": compression} if scheme == "pipe_sgd" else {}
    spec = {
        "scale": 1,
        "topology": {"kind": "rack", "racks": 1, "host_bw_mbps": 10000.0},
        "workload": {
            "scheme": scheme,
            "model": model,
            "dataset": "digits",
            "batch_size": 32,
            "warmup_iterations": 1,
            "seed": 0,
            "compute": {"mode": "emulated", "profile": "titanxp"},
            "options": options,
        },
    }
    return _write_run(
        run,
        spec,
        processes=_worker_procs(p),
        events=events,
        results={"worker0": {"final_accuracy": accuracy}},
        summary={"status": "ok"},
    )


#: variant -> (scheme, K, compression, period s, allreduce s)
PIPE_SGD_POINTS = {
    "PS-Sync": ("ps", None, "none", 0.4, 0.3),
    "D-Sync": ("pipe_sgd", 1, "none", 0.2, 0.13),
    "Pipe-SGD": ("pipe_sgd", 2, "none", 0.1, 0.13),
    "Pipe-SGD+T": ("pipe_sgd", 2, "truncation", 0.08, 0.07),
}


def build_pipe_sgd(root: Path, evaluations: bool = True) -> Path:
    """A Pipe-SGD timing sweep (Fig. 4 right) of resnet50 on 4 workers, and a run with no
    measured iteration (left out with a note); ``evaluations``: worker 0 logs eval events."""
    d = root / "pipe_sgd_timing"
    rows = []
    for i, (variant, (scheme, K, comp, period, ar)) in enumerate(PIPE_SGD_POINTS.items()):
        run = _pipe_sgd_run(
            d / f"{i:03d}_{variant}", scheme, K, comp, period, ar, accuracy=0.9 + 0.01 * i if evaluations else None
        )
        rows.append(_headline(run, 128 / period, variant=variant, scheme=scheme))
    _pipe_sgd_run(d / "004_short", "pipe_sgd", 2, "none", 0.1, 0.1, None, iterations=1)
    (d / "004_short" / "iterations.csv").write_text("iteration,worker,start,end,duration_s,samples\n")
    rows.append(_headline(d / "004_short", None, status="failed", variant="short", scheme="pipe_sgd"))
    return _sweep(root, d.name, {"name": "pipe_sgd_timing"}, rows)


BUILDERS = {
    "p3": [build_p3],
    "phub": [build_phub, build_phub_jobs],
    "ibatch": [build_ibatch],
    "stanza": [build_stanza, build_stanza_accuracy],
    "pipe_sgd": [build_pipe_sgd],
}


# ----------------------------------------------------------------------------- rundir, skeleton


def test_find_runs_takes_runs_and_sweeps_in_order(tmp_path):
    sweep = build_phub_jobs(tmp_path)
    run = build_p3(tmp_path) / "000_host_bw_mbps=2000_baseline"
    runs = rundir.find_runs([run, sweep])
    assert runs == [run, sweep / "000_1job", sweep / "001_2jobs"]
    assert rundir.read_spec(run)["topology"]["host_bw_mbps"] == 2000
    assert rundir.read_sweep_spec(sweep)["name"] == "phub_multitenant" and rundir.read_sweep_spec(run) == {}
    with pytest.raises(rundir.NotARunError, match="does not exist"):
        rundir.find_runs([tmp_path / "nope"])
    with pytest.raises(rundir.NotARunError, match="neither a run directory"):
        rundir.find_runs([tmp_path])
    with pytest.raises(rundir.NotARunError, match="spec.yaml"):
        rundir.read_spec(tmp_path)


def test_per_point_divides_by_the_baseline_at_the_same_point():
    t = pd.DataFrame({"variant": ["a", "b", "a", "b", "b"], "x": [1, 1, 2, 2, 3], "v": [2.0, 3.0, 4.0, 2.0, 5.0]})
    assert skeleton.per_point(t, "v", "a", ["x"])[:4] == [1.0, 1.5, 1.0, 0.5]
    assert math.isnan(skeleton.per_point(t, "v", "a", ["x"])[4])  # no baseline at x = 3
    assert skeleton.per_point(t, "v", "a", ["x"], inverse=True)[3] == 2.0
    mean = skeleton.per_point(t, "v", (t["variant"] == "a").to_numpy(), [], reduce="mean")
    assert mean == [v / 3.0 for v in t["v"]]
    assert skeleton.baseline_rows(t, "b", ["x"]) == [1, 1, 3, 3, 4]


def test_get_report_knows_every_paper_and_refuses_others():
    for name in skeleton.REPORTS:
        assert skeleton.get_report(name).name == name
    with pytest.raises(skeleton.UnknownReport, match="p3, phub, ibatch, stanza, pipe_sgd"):
        skeleton.get_report("nope")


# ----------------------------------------------------------------------------- each paper's numbers


def test_p3_speedups_per_bandwidth_and_idle_fractions(tmp_path):
    t = p3_report.sweep_table(build_p3(tmp_path)).set_index(["variant", P3_X])
    assert t.loc[("p3", 2000), "speedup"] == pytest.approx(1.3)
    assert t.loc[("slicing", 2000), "speedup"] == pytest.approx(1.1)
    assert t.loc[("p3", 4000), "speedup"] == pytest.approx(1.25)
    assert t.loc[("baseline", 4000), "speedup"] == pytest.approx(1.0)
    assert math.isnan(t.loc[("p3", 8000), "speedup"])  # the baseline at 8 Gbit/s failed
    # worker 0's link idle 7 of 10 windows for the baseline, 2 of 10 for p3
    assert t.loc[("baseline", 2000), "tx_idle"] == pytest.approx(0.7, abs=0.05)
    assert t.loc[("p3", 2000), "tx_idle"] == pytest.approx(0.2, abs=0.05)
    assert t.loc[("baseline", 8000), "status"] == "failed" and pd.isna(t.loc[("baseline", 8000), "tx_idle"])


@pytest.mark.parametrize(
    "model, sweep, paper",
    [
        ("resnet50", {P3_X: [2000]}, "Fig. 7a"),
        ("vgg19", {P3_X: [2000]}, "Fig. 7c"),
        ("vgg19", {"topology.hosts_per_rack": [2, 8]}, "Fig. 10b"),
        ("resnet50", {"topology.racks": [2, 4]}, "Fig. 10a"),
        ("vgg19", {"workload.options.slice_params": [5000]}, "Fig. 12"),
    ],
)
def test_p3_report_names_the_figure_of_what_the_sweep_varies(tmp_path, model, sweep, paper):
    """A sweep over bandwidth is read against Fig. 7 (by model), over the cluster's size
    against Fig. 10, over the slice size against Fig. 12."""
    d = build_p3(tmp_path)
    (d / "sweep.yaml").write_text(
        yaml.safe_dump({"name": d.name, "scale": 1, "workload": {"model": model}, "sweep": sweep})
    )
    (line,) = [x for x in p3_report.table([d]).splitlines() if x.startswith("paper: ")]
    assert line.startswith(f"paper: P3 {paper}:"), line


def test_sweep_tables_and_plots_read_the_spread_under_either_name(tmp_path):
    """A sweep.csv of today names the spread ``samples_per_s_spread95`` and has the mean's
    confidence interval; an older one names the spread ``samples_per_s_ci95`` and has none:
    the tables give both as ``spread95`` (and the interval where known), the sweep plot draws
    the interval as its error bars, or the spread without it."""
    from analysis import plots
    from analysis.load import read_sweep_csv

    d = build_p3(tmp_path / "old")
    assert "samples_per_s_spread95" in read_sweep_csv(d / "sweep.csv").columns
    old = p3_report.sweep_table(d)
    assert (old["spread95"] == 1.0).all() and old["mean_ci95_low"].isna().all()
    assert plots.plot_sweep(d, P3_X, tmp_path / "old.png").stat().st_size > 0
    new = tmp_path / "new" / "p3_resnet50"
    shutil.copytree(d, new)
    df = pd.read_csv(new / "sweep.csv").rename(columns={"samples_per_s_ci95": "samples_per_s_spread95"})
    df["samples_per_s_spread95"] = 2.0
    df["samples_per_s_mean_ci95_low"] = df["samples_per_s"] - 0.5
    df["samples_per_s_mean_ci95_high"] = df["samples_per_s"] + 0.5
    df.to_csv(new / "sweep.csv", index=False)
    t = p3_report.sweep_table(new).set_index(["variant", P3_X])
    assert t.loc[("p3", 2000), "spread95"] == 2.0
    assert (t.loc[("p3", 2000), "mean_ci95_low"], t.loc[("p3", 2000), "mean_ci95_high"]) == (129.5, 130.5)
    assert t.loc[("p3", 2000), "speedup"] == pytest.approx(1.3)
    rows = df[df["status"] == "ok"]
    yerr, words = plots.error_bars(rows, "samples_per_s")
    assert yerr.tolist() == [[0.5] * len(rows), [0.5] * len(rows)] and "confidence interval of the mean" in words
    assert plots.plot_sweep(new, P3_X, tmp_path / "new.png").stat().st_size > 0
    ph = phub_report.sweep_table(build_phub(tmp_path / "phub"), baseline="ps_cs")
    assert (ph["spread95"] == 1.0).all() and "mean_ci95_high" not in ph.columns  # no row has it: left out


def test_phub_ratios_per_point_from_the_plain_spec(tmp_path):
    t = phub_report.sweep_table(build_phub(tmp_path), baseline="ps_cs").set_index(["variant", "racks", "background"])
    assert t.loc[("phub_hier", 2, False), "speedup"] == pytest.approx(3.0)
    assert t.loc[("phub_hier", 2, True), "speedup"] == pytest.approx(2.0)
    assert t.loc[("phub_flat", 1, False), "speedup"] == pytest.approx(1.25)
    assert t.loc[("phub_hier", 2, False), "core_vs_flat"] == pytest.approx(0.25)
    assert t.loc[("phub_hier", 2, True), "core_vs_flat"] == pytest.approx(0.5)
    assert t.loc[("phub_hier", 2, True), "throughput_vs_flat"] == pytest.approx(100 / 150)
    assert t.loc[("phub_hier", 2, True), "one_over_N"] == pytest.approx(0.25)
    # Sec. 3.4 from the spec: B_PBox = 2 x 10 Gbit/s, B_Core = 4 x 10 / 3 Gbit/s, 2 racks of 4
    assert t.loc[("phub_hier", 2, False), "sec34_hier_pays"] == hierarchical_pays(
        b_pbox=20000.0, b_core=40000.0 / 3, b_wkr=10000.0, racks=2, n=4
    )
    assert pd.isna(t.loc[("ps_cs", 1, False), "sec34_hier_pays"])
    jobs = phub_report.sweep_table(build_phub_jobs(tmp_path), baseline=None, flat=None).set_index("variant")
    assert jobs.loc["2jobs", "per_job_drop_pct"] == pytest.approx(5.0) and jobs.loc["1job", "per_job_drop_pct"] == 0


def test_ibatch_speedup_over_one_node(tmp_path):
    t = ibatch_report.report([build_ibatch(tmp_path)]).set_index(["model", "pull", "nodes"])
    base = IBATCH_POINTS[("googlenet", "default", 1)]
    assert t.loc[("googlenet", "ibatch", 4), "speedup"] == pytest.approx(
        IBATCH_POINTS[("googlenet", "ibatch", 4)] / base
    )
    assert t.loc[("googlenet", "layer_by_layer", 2), "speedup"] == pytest.approx(1.613, abs=1e-3)
    # vgg19 has no 1-node default run: over its 1-node ibatch run
    assert t.loc[("vgg19", "ibatch", 4), "speedup"] == pytest.approx(2.5)
    # pull-plus-forward: 0.3 s of the run at scale 2
    assert t.loc[("googlenet", "ibatch", 2), "measured_phase_s"] == pytest.approx(0.15)
    assert t.loc[("googlenet", "ibatch", 2), "model_exe_s"] == pytest.approx((0.5 + 2 * 0.0123) / 2)


def test_stanza_pairs_with_ps_at_the_same_workers(tmp_path):
    runs = rundir.find_runs([build_stanza(tmp_path)])
    rows = [stanza_report.run_figures(r) for r in runs]
    assert [(r["scheme"], r["workers"]) for r in rows] == list(STANZA_POINTS)
    assert rows[0]["fc_bytes_per_iter"] == 2 * 1_000_000 and rows[1]["fc_bytes_per_iter"] == 2 * 8_000_000
    assert rows[0]["predicted_s"] > 0 and rows[0]["fc_workers"] == 1 and rows[1]["servers"] == 1
    j = stanza_report.pair(rows).set_index("workers")
    assert list(j.index) == [2, 4]  # 8 workers: no PS run
    assert j.loc[2, "speedup"] == pytest.approx(2.0) and j.loc[4, "speedup"] == pytest.approx(2.5)
    assert j.loc[2, "fc_data_ratio"] == pytest.approx(8.0)
    assert j.loc[2, "speedup_predicted"] == pytest.approx(rows[1]["predicted_s"] / rows[0]["predicted_s"])


def test_stanza_pairs_each_compute_profile_with_its_own_ps(tmp_path):
    """A sweep over compute profiles (the band: PHub-derived against Table 1) pairs each
    Stanza run with the PS run of the same profile, not the last PS run of its worker count."""
    d = tmp_path / "band"
    runs = [
        _stanza_run(
            d / f"{i:03d}_{profile}_{scheme}",
            scheme,
            "alexnet",
            2,
            t,
            1_000_000,
            4_000_000,
            {"mode": "emulated", "profile": profile},
        )
        for i, (profile, scheme, t) in enumerate(
            (("v100", "stanza", 0.5), ("v100", "ps", 1.0), ("titanxp", "stanza", 0.8), ("titanxp", "ps", 1.2))
        )
    ]
    rows = [stanza_report.run_figures(r) for r in runs]
    assert [r["profile"] for r in rows] == ["v100", "v100", "titanxp", "titanxp"]
    j = stanza_report.pair(rows).set_index("profile")
    assert j.loc["v100", "speedup"] == pytest.approx(2.0) and j.loc["titanxp", "speedup"] == pytest.approx(1.5)


def test_stanza_accuracy_curves_without_prediction(tmp_path):
    text = stanza_report.report([build_stanza_accuracy(tmp_path)])
    assert "stanza: 0.5s 50.0%, 0.9s 90.0%" in text.splitlines()
    assert "ps: 1.0s 50.0%, 1.7s 89.0%" in text.splitlines()
    assert _cell(text, {"scheme": "stanza"}, "acc") == "90.0" and _cell(text, {"scheme": "ps"}, "acc") == "89.0"
    assert _cell(text, {"scheme": "stanza"}, "predicted") == "-"  # real compute: no prediction
    pairs = _tables(text)[1]
    assert pairs == [
        {
            "model": "digits_cnn",
            "n": "4",
            "profile": "real",
            "speedup": "2.00",
            "predicted": "nan",
            "FC-data ps/stanza": "1.0",
            "epoch-data ps/stanza": "1.0",
            "flags": "",
        }
    ]


def test_pipe_sgd_speedups_and_skipped_run(tmp_path):
    out = io.StringIO()
    df = pipe_sgd_report.report([build_pipe_sgd(tmp_path)], out=out)
    notes = [line for line in out.getvalue().splitlines() if line.startswith("skipped ")]
    assert len(notes) == 1 and "004_short" in notes[0] and "no measured iteration" in notes[0]
    assert list(df["variant"]) == list(PIPE_SGD_POINTS)
    assert df.set_index("variant").loc["Pipe-SGD", "period_s"] == pytest.approx(0.1)
    sp = pipe_sgd_report.speedups(df).set_index("variant")
    assert sp.loc["Pipe-SGD", "vs_dsync"] == pytest.approx(2.0) and sp.loc["Pipe-SGD", "vs_ps"] == pytest.approx(4.0)
    assert sp.loc["Pipe-SGD+T", "vs_ps"] == pytest.approx(5.0) and sp.loc["PS-Sync", "vs_dsync"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- testbed report


def _cell(text: str, where: dict, column: str) -> str:
    """The ``column`` cell of the one row (of any table in ``text``) whose cells match ``where``."""
    hits = [r[column] for t in _tables(text) for r in t if column in r and all(r.get(k) == v for k, v in where.items())]
    assert len(hits) == 1, (where, column, hits)
    return hits[0]


#: paper -> (extra arguments, lines its output must hold, [(row, column, value)] of its tables)
CLI = {
    "p3": (
        [],
        ["## p3_resnet50 (resnet50, scale 1)"],
        [({"variant": "p3", P3_X: "2000"}, "speedup", "1.3"), ({"variant": "p3", P3_X: "4000"}, "speedup", "1.25")],
    ),
    "phub": (
        ["--baseline", "ps_cs", "--table2"],
        ["## phub_oversub", "## phub_multitenant", "## The paper"],
        [
            ({"variant": "phub_hier", "racks": "2", "background": "True"}, "speedup", "2"),
            ({"variant": "phub_hier", "racks": "2", "background": "False"}, "core_vs_flat", "0.25"),
            ({"variant": "2jobs"}, "per_job_drop_pct", "5"),
        ],
    ),
    "ibatch": (
        [],
        ["Throughput and speedup over one node (iBatch Fig. 5):"],
        [
            ({"model": "vgg19", "pull": "ibatch", "nodes": "4"}, "speedup", "2.5"),
            ({"model": "googlenet", "pull": "ibatch", "nodes": "2"}, "measured_ms", "150.0"),
        ],
    ),
    "stanza": (
        [],
        ["stanza vs ps (same model, workers, global batch):", "stanza: 0.5s 50.0%, 0.9s 90.0%"],
        [
            ({"model": "alexnet", "n": "4"}, "speedup", "2.50"),
            ({"model": "digits_cnn", "n": "4"}, "speedup", "2.00"),
            ({"scheme": "stanza", "n": "2", "model": "alexnet"}, "FC MB/it", "2.0"),
        ],
    ),
    "pipe_sgd": (
        ["--alpha-us", "5"],
        ["per variant (times in ms per iteration, emulated time):"],
        [
            ({"variant": "Pipe-SGD"}, "vs_dsync", "2"),
            ({"variant": "Pipe-SGD+T"}, "vs_ps", "5"),
            ({"variant": "D-Sync"}, "period_ms", "200"),
        ],
    ),
}


@pytest.mark.parametrize("paper", list(CLI))
def test_testbed_report_reaches_every_paper(paper, tmp_path, capsys):
    dirs = [str(b(tmp_path)) for b in BUILDERS[paper]]
    extra, lines, cells = CLI[paper]
    assert cli_main(["report", paper, *dirs, *extra, "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    for line in lines:
        assert line in out.splitlines(), line
    for where, column, value in cells:
        assert _cell(out, where, column) == value
    pngs = [line.split("plot: ", 1)[1] for line in out.splitlines() if line.startswith("plot: ")]
    assert pngs and all(Path(p).stat().st_size > 5_000 for p in pngs)
    # no run is flagged: every table from runs has an empty flags column and no note
    flag_cells = [r["flags"] for t in _tables(out) for r in t if "flags" in r]
    assert flag_cells and set(flag_cells) == {""}
    assert skeleton.FLAGS_NOTE not in out


# ----------------------------------------------------------------------------- fidelity flags


def _set_fidelity(sweep: Path, run_name: str, **flags: bool) -> None:
    """Flag one run of a sweep as the harness and the runner would: ``summary.json``'s
    ``fidelity`` and the run's row of ``sweep.csv`` (a column the builders did not write, e.g.
    ``host_cost_overrun``, is added, empty for the other rows)."""
    run = sweep / run_name
    summary = json.loads((run / "summary.json").read_text())
    summary.setdefault("fidelity", {}).update(flags)
    (run / "summary.json").write_text(json.dumps(summary))
    df = pd.read_csv(sweep / "sweep.csv")
    row = df["run_dir"].map(lambda p: Path(p).name == run_name)
    assert row.sum() == 1
    for key, value in flags.items():
        if key not in df:
            df[key] = None
        df[key] = df[key].astype(object)
        df.loc[row, key] = value
    df.to_csv(sweep / "sweep.csv", index=False)


HOST = {"host_cost_overrun": True}
BOTH = {"cpu_starved": True, "host_cost_overrun": True}
#: paper -> (the runs flagged: (builder index, run directory, flags), [(row, the flags cell of
#: every table row that matches, in the order printed)], tables with a flagged row)
FLAGGED = {
    "p3": (
        [(0, "005_host_bw_mbps=4000_p3", HOST)],
        [({"variant": "p3", P3_X: "4000"}, ["host-overrun"]), ({"variant": "baseline", P3_X: "4000"}, [""])],
        1,
    ),
    "phub": (
        [(0, "005_racks=2_bg=True_phub_hier", BOTH)],
        [
            ({"variant": "phub_hier", "racks": "2", "background": "True"}, ["cpu-starved+host-overrun"]),
            ({"variant": "phub_hier", "racks": "2", "background": "False"}, [""]),
            ({"variant": "2jobs"}, [""]),
        ],
        1,
    ),
    "ibatch": (
        [(0, "004_googlenet_ibatch_4", HOST)],  # both tables are per run
        [
            ({"model": "googlenet", "pull": "ibatch", "nodes": "4"}, ["host-overrun", "host-overrun"]),
            ({"model": "googlenet", "pull": "ibatch", "nodes": "2"}, ["", ""]),
        ],
        2,
    ),
    "stanza": (
        [(0, "003_workers=4_ps", HOST), (0, "002_workers=4_stanza", {"cpu_starved": True})],
        [
            ({"scheme": "ps", "model": "alexnet", "n": "4"}, ["host-overrun"]),
            ({"scheme": "stanza", "model": "alexnet", "n": "4"}, ["cpu-starved"]),
            ({"model": "alexnet", "n": "4", "speedup": "2.50"}, ["cpu-starved+host-overrun"]),  # the pair
            ({"model": "alexnet", "n": "2"}, ["", "", ""]),
        ],
        2,
    ),  # stanza run, ps run, their pair
    # per variant, then speed-ups: every variant is divided by D-Sync, and Pipe-SGD is cpu-starved
    "pipe_sgd": (
        [(0, "001_D-Sync", HOST), (0, "002_Pipe-SGD", {"cpu_starved": True})],
        [
            ({"variant": "D-Sync"}, ["host-overrun", "host-overrun"]),
            ({"variant": "Pipe-SGD"}, ["cpu-starved", "cpu-starved+host-overrun"]),
            ({"variant": "PS-Sync"}, ["", "host-overrun"]),
        ],
        2,
    ),
}


@pytest.mark.parametrize("paper", list(FLAGGED))
def test_reports_flag_the_rows_of_flagged_runs(paper, tmp_path, capsys):
    dirs = [b(tmp_path) for b in BUILDERS[paper]]
    flagged, cells, noted = FLAGGED[paper]
    for i, run, flags in flagged:
        _set_fidelity(dirs[i], run, **flags)
    extra = CLI[paper][0]
    assert cli_main(["report", paper, *map(str, dirs), *extra]) == 0
    out = capsys.readouterr().out
    for where, values in cells:
        hits = [
            r["flags"] for t in _tables(out) for r in t if "flags" in r and all(r.get(k) == v for k, v in where.items())
        ]
        assert hits == values, where
    # the note, once under each table with a flagged row, after a blank line
    assert out.count(skeleton.FLAGS_NOTE) == noted
    assert out.count("|\n\n" + skeleton.FLAGS_NOTE) == noted


def test_flags_from_summary_and_sweep_rows(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert skeleton.fidelity_flags(run) == ""  # no summary yet
    (run / "summary.json").write_text(json.dumps({"fidelity": {"cpu_starved": None, "host_cost_overrun": True}}))
    assert skeleton.fidelity_flags(run) == "host-overrun"
    (run / "summary.json").write_text(json.dumps({"status": "failed", "fidelity": None}))
    assert skeleton.fidelity_flags(run) == ""
    # sweep.csv cells: bools, NaN for an empty cell, strings in a column pandas left untyped, a missing column
    assert skeleton.row_flags(pd.Series({"cpu_starved": True, "host_cost_overrun": math.nan})) == "cpu-starved"
    assert skeleton.row_flags(pd.Series({"cpu_starved": "False", "host_cost_overrun": "True"})) == "host-overrun"
    assert skeleton.row_flags(pd.Series({"cpu_starved": False})) == ""
    assert skeleton.union_flags("host-overrun", "", None, "cpu-starved+host-overrun") == "cpu-starved+host-overrun"
    assert skeleton.union_flags("", math.nan) == ""


def test_ls_and_show_flag_a_host_cost_overrun(tmp_path, capsys):
    fidelity = {"cpu_starved": False, "host_cost_overrun": True}
    over = _write_run(
        tmp_path / "runs" / "over",
        {"scale": 4},
        summary={
            "status": "ok",
            "scheme": "ps",
            "throughput": {"mean": 12.5},
            "fidelity": fidelity,
            "host_costs": {
                "aggregate": {
                    "count": 3,
                    "modelled": True,
                    "emulated_s": 0.3,
                    "budget_s": 1.2,
                    "real_s": 1.5,
                    "overruns": 2,
                    "overrun_s": 0.3,
                    "overrun_fraction": 0.25,
                }
            },
        },
    )
    _write_run(
        tmp_path / "runs" / "clean",
        {"scale": 4},
        summary={
            "status": "ok",
            "scheme": "ps",
            "throughput": {"mean": 20.0},
            "fidelity": {"cpu_starved": False, "host_cost_overrun": False},
        },
    )
    assert cli_main(["ls", str(tmp_path / "runs")]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["over"].endswith("12.5 samples/s  [host-cost overrun]")
    assert lines["clean"].endswith("20.0 samples/s")
    assert cli_main(["show", str(over)]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[-1] == "flags" and row.endswith("host-cost overrun")
    assert cli_main(["show", str(over), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["fidelity"] == fidelity and shown["host_costs"]["aggregate"]["overruns"] == 2


@pytest.mark.parametrize(
    "module, args",
    [
        ("analysis.p3_report", ["--baseline", "baseline"]),
        ("analysis.phub_report", ["--table2"]),
        ("analysis.ibatch_report", []),
        ("analysis.stanza_report", []),
        ("analysis.pipe_sgd_report", ["--alpha-us", "0"]),
    ],
)
def test_python_m_aliases_still_work(module, args, tmp_path):
    paper = module.split(".")[1].removesuffix("_report")
    dirs = [str(b(tmp_path)) for b in BUILDERS[paper]]
    r = subprocess.run(
        [sys.executable, "-m", module, *dirs, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert r.returncode == 0, r.stderr
    assert _tables(r.stdout)
    r = subprocess.run(
        [sys.executable, "-m", module, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_testbed_report_errors_without_traceback(tmp_path, capsys):
    assert cli_main(["report", "nope", str(tmp_path)]) == 2
    assert "no report 'nope'" in capsys.readouterr().err
    assert cli_main(["report", "stanza", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = build_phub_jobs(tmp_path) / "000_1job"
    assert cli_main(["report", "phub", str(run)]) == 2  # a sweep report given a run
    err = capsys.readouterr().err
    assert "is a run directory" in err and "Traceback" not in err


ARCHIVED = sorted(p for p in (Path(__file__).resolve().parents[2] / "reproduction" / "runs").iterdir() if p.is_dir())


@pytest.mark.parametrize("paper", sorted(skeleton.REPORTS))
def test_every_report_reads_every_archived_run_without_a_traceback(paper, capsys, tmp_path):
    """An archived run keeps only its small files (spec, summary, sweep table): each paper's
    report gives its table, or says clearly what it cannot do (exit 2), on every one of them,
    and draws its plots (``--plots``) on every run of its own paper."""
    assert ARCHIVED
    for d in ARCHIVED:
        plots = ["--plots", str(tmp_path / paper / d.name)] if d.name.startswith(f"{paper}_") else []
        code = cli_main(["report", paper, str(d), *plots])
        out, err = capsys.readouterr()
        assert code in (0, 2), (paper, d.name, err[-2000:])
        assert "Traceback" not in err, (paper, d.name, err[-2000:])
        assert out.strip() if code == 0 else err.strip(), (paper, d.name)


def test_sec34_prediction_needs_a_worker_in_every_rack():
    """PHub Sec. 3.4's hierarchical-reduction prediction is for N >= 1 workers per rack: a
    run with fewer workers than racks (a 1-node run on the blades) gets none, not an error."""
    spec = {
        "topology": {
            "kind": "rack_core",
            "racks": 8,
            "hosts_per_rack": 4,
            "host_bw_mbps": 10000,
            "oversubscription": 1,
        },
        "workload": {"servers": {"interfaces": 8}},
    }
    assert phub_report._sec34(spec, 1) is None
    assert phub_report._sec34(spec, 16) in (True, False)
