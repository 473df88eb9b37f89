"""iBatch Fig. 7 (``testbed report ibatch --fig7``): the execution-time breakdown from the events.

Synthetic run directories (no network, no training process) of the ``ibatch`` scheme, as
:mod:`traffic.schemes.ibatch` writes them: per worker iteration an ``iteration`` span, a
``sync`` span on the pull thread, ``pull_batch`` spans and one ``forward`` span per layer,
``backward`` spans; at time dilation ``scale = 2``, so every expected value below is the
wall-clock layout halved. The layouts (seconds of wall clock from the iteration's start):

    default         sync 0-0.2 | pull 0.2-0.6 | forward 0.62-0.82, 0.82-1.02 | backward 1.02-1.42
    layer_by_layer  sync 0-0.2 | pulls 0.2-0.3, 0.3-0.5, 0.5-0.8 | forward 0.3-0.4, 0.5-0.55, 0.82-0.9
    ibatch          sync 0-0.2 | pulls 0.2-0.4, 0.4-0.7 | forward 0.4-0.6, 0.6-0.75, 0.75-0.9

each iteration 1.6 s on worker 0 and 1.8 s on worker 1. Iterations 0-2 (profiling, P = 1,
and warm-up, 3 iterations) have a much longer pull, which must not count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import ibatch_report
from analysis import report as skeleton
from analysis.load import load
from testbed.cli import main as cli_main
from tests.markdown import tables as _tables

T0 = 1_700_000_000.0
SCALE = 2.0
ITERATIONS = 5  # 0 .. 4; 3 and 4 are measured
#: pull -> (pull_batch spans, forward spans), wall seconds from the iteration's start
LAYOUTS = {
    "default": ([(0.2, 0.6)], [(0.62, 0.82), (0.82, 1.02)]),
    "layer_by_layer": ([(0.2, 0.3), (0.3, 0.5), (0.5, 0.8)], [(0.3, 0.4), (0.5, 0.55), (0.82, 0.9)]),
    "ibatch": ([(0.2, 0.4), (0.4, 0.7)], [(0.4, 0.6), (0.6, 0.75), (0.75, 0.9)]),
}
ITER_WALL = {"worker0": 1.6, "worker1": 1.8}

#: pull -> expected means in emulated seconds: (exe, comm only, overlap, comp only, idle)
EXPECTED = {
    "default": (0.41, 0.2, 0.0, 0.2, 0.01),
    "layer_by_layer": (0.35, 0.225, 0.075, 0.04, 0.01),
    "ibatch": (0.35, 0.1, 0.15, 0.1, 0.0),
}


def _events(pull: str) -> dict[str, list[dict]]:
    pulls, fwds = LAYOUTS[pull]
    out = {}
    for w, (proc, dur) in enumerate(ITER_WALL.items()):
        evs = []
        for it in range(ITERATIONS):
            t = T0 + 10.0 * it + 0.01 * w

            def ev(kind, a, b, thread="main", **kw):
                return {
                    "proc": proc,
                    "role": "worker",
                    "rank": w,
                    "thread": thread,
                    "kind": kind,
                    "ts": t + a,
                    "dur": b - a,
                    "iteration": it,
                    **kw,
                }

            evs.append(ev("iteration", 0.0, dur, samples=32))
            evs.append(ev("sync", 0.0, 0.2, thread="pull", servers=1))
            if it < 3:  # profiling / warm-up: one long pull, then the forward pass
                evs.append(ev("pull_batch", 0.2, 1.0, thread="pull", batch=0, profiling=it >= 1))
                evs += [ev("forward", 1.0 + 0.1 * i, 1.1 + 0.1 * i, layer=i) for i in range(len(fwds))]
                continue
            evs += [ev("pull_batch", a, b, thread="pull", batch=i, profiling=False) for i, (a, b) in enumerate(pulls)]
            evs += [ev("forward", a, b, layer=i) for i, (a, b) in enumerate(fwds)]
            end = fwds[-1][1]
            evs.append(ev("backward", end, end + 0.4, layer=0))
        out[proc] = evs
    return out


def _doc(pull: str) -> dict:
    L = len(LAYOUTS[pull][1])
    ends = {"default": [L], "layer_by_layer": list(range(1, L + 1)), "ibatch": [1, L]}[pull]
    return {
        "strategy": pull,
        "profile_iterations": 1,
        "scale": SCALE,
        "workers": 2,
        "servers": 1,
        "layers": L,
        "profile": {"startup_s": 0.01, "transfer_s": [0.1] * L, "forward_s": [0.1] * L},
        "candidates": {"algorithm1": {"ends": ends}},
        "chosen": "algorithm1",
        "optimal": {"exe_s": 0.5},
        "used": {"ends": ends, "exe_s": 0.6, "pipeline_s": 0.5, "meets_constraint": True},
    }


def _run(d: Path, pull: str, startup_ms: float) -> Path:
    (d / "events").mkdir(parents=True)
    spec = {
        "name": "ibatch_fig7",
        "scale": SCALE,
        "host": {"request_startup_ms": startup_ms},
        "workload": {
            "scheme": "ibatch",
            "model": "googlenet",
            "warmup_iterations": 3,
            "options": {"pull": pull, "profile_iterations": 1},
        },
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    procs = [{"name": f"worker{i}", "role": "worker", "rank": i, "host": f"h{i + 1}"} for i in range(2)]
    (d / "processes.json").write_text(
        json.dumps({"processes": procs + [{"name": "server0", "role": "server", "rank": 2, "host": "h3"}]})
    )
    (d / "summary.json").write_text(json.dumps({"status": "ok", "throughput": {"mean": 100.0}}))
    (d / "ibatch.json").write_text(json.dumps(_doc(pull)))
    for proc, evs in _events(pull).items():
        (d / "events" / f"{proc}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return d


def build(root: Path) -> Path:
    """A sweep: the three pulls at request_startup_ms 2, and ibatch alone at 5 (no default
    there: nothing to normalize by)."""
    d = root / "ibatch_fig7"
    d.mkdir(parents=True)
    rows = []
    for i, (pull, ms) in enumerate((("default", 2.0), ("layer_by_layer", 2.0), ("ibatch", 2.0), ("ibatch", 5.0))):
        run = _run(d / f"{i:03d}_{pull}_{ms:g}", pull, ms)
        rows.append(
            {"variant": pull, "host.request_startup_ms": ms, "scheme": "ibatch", "status": "ok", "run_dir": str(run)}
        )
    (d / "sweep.yaml").write_text(yaml.safe_dump({"name": "ibatch_fig7"}))
    pd.DataFrame(rows).to_csv(d / "sweep.csv", index=False)
    return d


def test_each_iteration_is_split_at_the_span_boundaries(tmp_path):
    run = _run(tmp_path / "run", "layer_by_layer", 2.0)
    b = ibatch_report.iteration_breakdown(load(run).events, first_iteration=3)
    assert list(zip(b["worker"], b["iteration"])) == [("worker0", 3), ("worker1", 3), ("worker0", 4), ("worker1", 4)]
    w0 = b.iloc[0]
    # comm [0.2, 0.8]; comp 0.1 + 0.05 + 0.08; both 0.1 + 0.05; wall seconds / 2
    assert w0["exe_s"] == pytest.approx(0.35, abs=1e-6)
    assert w0["comm_only_s"] == pytest.approx(0.45 / 2, abs=1e-6)
    assert w0["overlap_s"] == pytest.approx(0.15 / 2, abs=1e-6)
    assert w0["comp_only_s"] == pytest.approx(0.08 / 2, abs=1e-6)
    assert w0["idle_s"] == pytest.approx(0.02 / 2, abs=1e-6)
    assert w0["sync_s"] == pytest.approx(0.1, abs=1e-6)
    assert w0["after_s"] == pytest.approx((1.6 - 0.9) / 2, abs=1e-6)
    assert b.iloc[1]["after_s"] == pytest.approx((1.8 - 0.9) / 2, abs=1e-6)
    parts = b[list(ibatch_report.PARTS)].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(b["iteration_s"].to_numpy(), abs=1e-6)
    # from iteration 0 on, the profiling iterations' long pull (0.8 s of wall clock) counts too
    early = ibatch_report.iteration_breakdown(load(run).events, first_iteration=0)
    assert len(early) == 2 * ITERATIONS
    assert early.iloc[0]["comm_only_s"] == pytest.approx(0.4, abs=1e-6)


def test_breakdown_per_run_against_hand_computed_means(tmp_path):
    t = ibatch_report.breakdown_table([build(tmp_path)])
    assert list(zip(t["pull"], t["setting"])) == [
        ("default", "request_startup_ms=2.0"),
        ("layer_by_layer", "request_startup_ms=2.0"),
        ("ibatch", "request_startup_ms=2.0"),
        ("ibatch", "request_startup_ms=5.0"),
    ]
    assert list(t["worker_iterations"]) == [4, 4, 4, 4] and list(t["nodes"]) == [2, 2, 2, 2]
    default_exe = EXPECTED["default"][0]
    for i, pull in enumerate(("default", "layer_by_layer", "ibatch")):
        exe, comm, both, comp, idle = EXPECTED[pull]
        r = t.iloc[i]
        assert (r["exe_s"], r["comm_only_s"], r["overlap_s"], r["comp_only_s"], r["idle_s"]) == pytest.approx(
            (exe, comm, both, comp, idle), abs=1e-6
        ), pull
        assert r["sync_s"] == pytest.approx(0.1, abs=1e-6)
        # after forward: iteration end - last forward end, mean of worker 0 (1.6 s) and worker 1 (1.8 s)
        last = LAYOUTS[pull][1][-1][1]
        assert r["after_s"] == pytest.approx(((1.6 - last) + (1.8 - last)) / 4, abs=1e-6)
        assert r["iteration_s"] == pytest.approx(0.85, abs=1e-6)
        assert (
            r["norm_exe"],
            r["norm_overlap"],
            r["norm_comm_only"],
            r["norm_comp_only"],
            r["norm_idle"],
        ) == pytest.approx(
            (exe / default_exe, both / default_exe, comm / default_exe, comp / default_exe, idle / default_exe),
            abs=1e-6,
        )
    assert t.iloc[0]["norm_exe"] == pytest.approx(1.0) and t.iloc[0]["norm_overlap"] == 0.0
    # ibatch at 5 ms has the same spans but no default run at its setting
    assert t.iloc[3]["overlap_s"] == pytest.approx(0.15, abs=1e-6)
    assert t.iloc[3][["norm_exe", "norm_overlap"]].isna().all()


def test_testbed_report_ibatch_fig7_prints_and_draws_it(tmp_path, capsys):
    sweep = build(tmp_path)
    assert cli_main(["report", "ibatch", str(sweep)]) == 0
    assert "Execution time per iteration" not in capsys.readouterr().out  # only with --fig7
    assert cli_main(["report", "ibatch", str(sweep), "--fig7", "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    ms, norm = [t for t in _tables(out) if "overlap" in t[0]]
    row = {"pull": "ibatch", "setting": "request_startup_ms=2.0"}

    def pick(table):
        return [r for r in table if all(r[k] == v for k, v in row.items())]

    (r,) = pick(ms)
    assert (r["ExeTime"], r["comm only"], r["overlap"], r["comp only"], r["idle"], r["sync"]) == (
        "350.0",
        "100.0",
        "150.0",
        "100.0",
        "0.0",
        "100.0",
    )
    (r,) = pick(norm)
    assert (r["overlap"], r["ExeTime"]) == (f"{0.15 / 0.41:.3f}", f"{0.35 / 0.41:.3f}")
    assert [r["overlap"] for r in norm if r["pull"] == "default"] == ["0.0"]
    flat = " ".join(out.split())
    assert (
        "None of Fig. 7's three parts is missing from the events; what they cannot give is the paper's "
        "normalization base" in flat
    )
    assert skeleton.FLAGS_NOTE not in out
    pngs = [line.split("plot: ", 1)[1] for line in out.splitlines() if line.startswith("plot: ")]
    assert str(tmp_path / "plots" / "breakdown.png") in pngs
    assert Path(tmp_path / "plots" / "breakdown.png").stat().st_size > 5_000
