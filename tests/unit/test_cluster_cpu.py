"""CPU headroom of a run spread over several machines: ``cpu_stats`` and the
``cpu_starved`` flag judge every machine on its own samples.

The traces are built as the samplers write them (:mod:`testbed.capture.cpu`: ``time`` with
6 decimals, ``busy_pct`` with 2, core ids ``0``, ``1``, process rows ``harness``,
``bwm-ng`` and the training processes), one file per machine on its own clock, and merged
by :func:`testbed.capture.merge.merge_traces` as the controller merges them, so the core
ids carry the ``"<machine>:"`` prefix exactly as in a real cluster run. The two machines
sample at interleaved instants (they never share a timestamp).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import analysis  # noqa: E402
from analysis import metrics  # noqa: E402
from testbed.capture.cpu import CPU_FIELDS  # noqa: E402
from testbed.capture.merge import TracePart, merge_traces  # noqa: E402
from traffic.summary import RunSummary  # noqa: E402

A, B, C = "10.251.0.11", "10.251.0.12", "10.251.0.13"
T0 = 1795238073.0  # controller clock, s
N, PERIOD = 40, 0.1  # samples per machine, s
PHASE = {A: 0.03, B: 0.08}  # each machine's sampling instant within a period (controller clock)
OFFSET = {A: 2.5, B: -0.75}  # each machine's clock minus the controller's, s
PROCS = {A: {"harness": 3.0, "bwm-ng": 1.0, "worker0": 150.0}, B: {"harness": 2.0, "worker1": 20.0}}


def machine_csv(path: Path, machine: str, busy) -> None:
    """The ``cpu.csv`` a machine's own sampler writes: per sample k, core rows with
    ``busy(k) = (core 0 busy %, core 1 busy %)``, then its process rows; times on its clock."""
    rows = [",".join(CPU_FIELDS)]
    for k in range(N):
        t = T0 + k * PERIOD + PHASE[machine] + OFFSET[machine]
        for core, b in enumerate(busy(k)):
            rows.append(f"{t:.6f},core,{core},{b:.2f}")
        rows += [f"{t:.6f},proc,{name},{b:.2f}" for name, b in PROCS[machine].items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def cluster_run(tmp_path: Path, busy: dict, listed=(A, B)) -> Path:
    """A run directory as a cluster run leaves it: each machine's traces under
    ``machines/<addr>/traces``, merged into ``traces/cpu.csv``, and ``cluster.json``."""
    d = tmp_path / "run"
    parts = []
    for m, f in busy.items():
        src = d / "machines" / m / "traces"
        machine_csv(src / "cpu.csv", m, f)
        parts.append(TracePart(m, src, OFFSET[m]))
    assert merge_traces(d / "traces", parts) == {"cpu.csv": sum(N * (2 + len(PROCS[m])) for m in busy)}
    (d / "cluster.json").write_text(
        json.dumps(
            {
                "machines": list(listed),
                "tunnel": "gre",
                "clock_offset_s": {m: {"offset": OFFSET.get(m, 0.0), "uncertainty": 0.001} for m in listed},
            }
        )
    )
    return d


def constant(b0, b1):
    return lambda k: (b0, b1)


BUSY = constant(85.0, 95.0)  # idle 15 % and 5 %: 10 % on average
IDLE = constant(5.0, 15.0)  # idle 95 % and 85 %: 90 % on average


def test_merged_file_has_prefixed_cores_at_interleaved_times(tmp_path):
    cpu = analysis.load(cluster_run(tmp_path, {A: BUSY, B: IDLE})).cpu
    cores = cpu[cpu["kind"] == "core"]
    assert set(cores["id"]) == {f"{A}:0", f"{A}:1", f"{B}:0", f"{B}:1"}
    times = {m: set(cores.loc[cores["id"].str.startswith(m + ":"), "time"].round(6)) for m in (A, B)}
    assert len(times[A]) == len(times[B]) == N and not times[A] & times[B]
    assert min(times[A]) == pytest.approx(T0 + 0.03) and min(times[B]) == pytest.approx(T0 + 0.08)


def test_one_busy_machine_starves_the_run(tmp_path):
    d = cluster_run(tmp_path, {A: BUSY, B: IDLE})
    c = metrics.cpu_stats(analysis.load(d).cpu)
    assert c["machines"] == {
        A: {
            "idle_pct_mean": pytest.approx(10.0),
            "idle_pct_per_core": {"0": pytest.approx(15.0), "1": pytest.approx(5.0)},
            "min_idle_pct": pytest.approx(10.0),
            "window": "capture",
            "procs_busy_pct_mean": {"bwm-ng": pytest.approx(1.0), "harness": pytest.approx(3.0)},
        },
        B: {
            "idle_pct_mean": pytest.approx(90.0),
            "idle_pct_per_core": {"0": pytest.approx(95.0), "1": pytest.approx(85.0)},
            "min_idle_pct": pytest.approx(90.0),
            "window": "capture",
            "procs_busy_pct_mean": {"harness": pytest.approx(2.0)},
        },
    }
    # top level: the busy machine (averaging both machines' cores would say 50 %)
    assert c["worst_machine"] == A
    assert c["idle_pct_mean"] == pytest.approx(10.0) and c["min_idle_pct"] == pytest.approx(10.0)
    assert c["idle_pct_per_core"] == {f"{A}:0": pytest.approx(15.0), f"{A}:1": pytest.approx(5.0)}
    assert c["window"] == "capture"
    assert c["procs_busy_pct_mean"] == {
        f"{A}:bwm-ng": pytest.approx(1.0),
        f"{A}:harness": pytest.approx(3.0),
        f"{B}:harness": pytest.approx(2.0),
        "worker0": pytest.approx(150.0),
        "worker1": pytest.approx(20.0),
    }
    s = metrics.summarize(d)
    f = s.fidelity
    assert f.cpu_starved is True and f.rule == metrics.CPU_IDLE_RULE_CLUSTER
    assert f.idle_pct_mean == pytest.approx(10.0) and f.min_idle_pct == pytest.approx(10.0)
    assert RunSummary.load(d).cpu.machines[B].idle_pct_mean == pytest.approx(90.0)


def test_every_machine_idle_is_not_starved(tmp_path):
    d = cluster_run(tmp_path, {A: IDLE, B: constant(25.0, 35.0)})  # B: idle 75 % and 65 %
    s = metrics.summarize(d)
    assert s.fidelity.cpu_starved is False
    assert s.cpu.worst_machine == B and s.cpu.idle_pct_mean == pytest.approx(70.0)
    assert {m: r.idle_pct_mean for m, r in s.cpu.machines.items()} == {A: pytest.approx(90.0), B: pytest.approx(70.0)}


def test_min_idle_is_the_lowest_over_machines(tmp_path):
    # A: always 30 % idle; B: 90 % idle but 20 % for exactly 1 s (samples 10..19)
    dip = lambda k: (80.0, 80.0) if 10 <= k < 20 else (10.0, 10.0)  # noqa: E731
    run = analysis.load(cluster_run(tmp_path, {A: constant(70.0, 70.0), B: dip}))
    c = metrics.cpu_stats(run.cpu)
    assert c["machines"][B]["idle_pct_mean"] == pytest.approx((30 * 90 + 10 * 20) / 40)
    assert c["machines"][B]["min_idle_pct"] == pytest.approx(20.0)
    assert c["worst_machine"] == A and c["idle_pct_mean"] == pytest.approx(30.0)
    assert c["min_idle_pct"] == pytest.approx(20.0)  # B's dip, not the worst machine's minimum
    # the measured window [T0 + 1.05, T0 + 2.0] holds B's samples 10..19 and A's 11..19: B is the worst there
    w = metrics.cpu_stats(run.cpu, (T0 + 1.05, T0 + 2.0))
    assert w["worst_machine"] == B and w["idle_pct_mean"] == pytest.approx(20.0)
    assert w["machines"][A]["idle_pct_mean"] == pytest.approx(30.0) and w["window"] == "measured iterations"
    # a window holding one of A's samples and none of B's: B falls back to its whole capture
    w = metrics.cpu_stats(run.cpu, (T0 + 0.52, T0 + 0.54))
    assert w["machines"][A]["window"] == "measured iterations" and w["machines"][B]["window"] == "capture"
    assert w["window"] == "capture" and w["machines"][B]["idle_pct_mean"] == pytest.approx(72.5)


def test_a_machine_without_samples_leaves_the_flag_open(tmp_path):
    d = cluster_run(tmp_path, {A: IDLE, B: IDLE}, listed=(A, B, C))
    s = metrics.summarize(d)
    assert s.cpu.machines[C].idle_pct_mean is None and s.cpu.idle_pct_mean == pytest.approx(90.0)
    assert s.fidelity.cpu_starved is None  # C may have starved
    d2 = cluster_run(tmp_path / "busy", {A: BUSY, B: IDLE}, listed=(A, B, C))
    assert metrics.summarize(d2).fidelity.cpu_starved is True  # A did, whatever C did
    # no cpu.csv at all: every machine listed, none known
    (d / "traces" / "cpu.csv").unlink()
    s = metrics.summarize(d)
    assert s.dump()["cpu"]["machines"] == {
        m: {
            "idle_pct_mean": None,
            "idle_pct_per_core": {},
            "min_idle_pct": None,
            "window": "capture",
            "procs_busy_pct_mean": {},
        }
        for m in (A, B, C)
    }
    assert s.fidelity.cpu_starved is None and s.fidelity.rule == metrics.CPU_IDLE_RULE_CLUSTER


def test_controller_rows_are_a_machine_of_their_own():
    rows = []
    for k in range(N):
        t = T0 + k * PERIOD
        rows += [
            (t, "core", "0", 20.0),
            (t, "core", "1", 40.0),
            (t, "proc", "harness", 5.0),
            (t + 0.05, "core", f"{A}:0", 50.0),
            (t + 0.05, "core", f"{A}:1", 50.0),
        ]
    c = metrics.cpu_stats(pd.DataFrame(rows, columns=CPU_FIELDS))
    assert set(c["machines"]) == {metrics.CONTROLLER, A}
    ctl = c["machines"][metrics.CONTROLLER]
    assert ctl["idle_pct_mean"] == pytest.approx(70.0) and ctl["procs_busy_pct_mean"] == {"harness": pytest.approx(5.0)}
    assert c["worst_machine"] == A and c["idle_pct_per_core"] == {
        f"{A}:0": pytest.approx(50.0),
        f"{A}:1": pytest.approx(50.0),
    }


def test_one_machine_run_has_no_machines_key(tmp_path):
    rows = [(T0 + k * PERIOD, "core", str(core), b) for k in range(N) for core, b in enumerate((85.0, 95.0))]
    c = metrics.cpu_stats(pd.DataFrame(rows, columns=CPU_FIELDS))
    assert set(c) == {"idle_pct_mean", "idle_pct_per_core", "min_idle_pct", "window", "procs_busy_pct_mean"}
    assert c["idle_pct_mean"] == pytest.approx(10.0)
