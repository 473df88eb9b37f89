"""Analysis on run directories built by hand, with known answers."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import analysis  # noqa: E402
from analysis import metrics, plots, timeline  # noqa: E402
from analysis.traces import rates  # noqa: E402
from traffic import rundir  # noqa: E402
from traffic.summary import RunSummary, TxRx  # noqa: E402

DATA = Path(__file__).parents[1] / "data"

# ---------------------------------------------------------------------------- a synthetic run

HOSTS = {"h1": 0, "h2": 0, "h3": 1, "h4": 1}
SPANS = [5.0, 3.0, 1.0, 2.0, 4.0, 0.5]  # global iteration time of iterations 0..5
WARMUP, BATCH, WORKERS = 2, 32, 4
T_START, DT, N_SAMPLES = 99.0, 0.01, 2201  # bwm-ng samples at 99.00 ... 121.00
# bytes per 10 ms sample (switch port's view: out = leaves the switch)
PORT_BYTES = {
    "tor1-eth1": (1000, 100),
    "tor1-eth2": (2000, 200),
    "tor2-eth1": (3000, 300),
    "tor2-eth2": (4000, 400),  # (in, out) = (host tx, host rx)
    "tor1-eth3": (300, 700),
    "tor2-eth3": (50, 200),  # ToR ends of the uplinks
    "core1-eth1": (700, 300),
    "core1-eth2": (200, 50),
}


def topology(host_bw=100.0, uplink_bw=200.0) -> dict:
    links = []
    for i, (h, rack) in enumerate(HOSTS.items()):
        tor = f"tor{rack + 1}"
        port = f"{tor}-eth{1 + i % 2}"
        links.append(
            {
                "class": "host",
                "node1": h,
                "intf1": f"{h}-eth0",
                "node2": tor,
                "intf2": port,
                "rack": rack,
                "bw_mbps": host_bw,
                "shaping": {},
            }
        )
    for rack in (0, 1):  # node order of the uplinks differs on purpose: tor side found by role
        tor, core_port = f"tor{rack + 1}", f"core1-eth{rack + 1}"
        ends = [("tor", tor, f"{tor}-eth3"), ("core", "core1", core_port)]
        if rack == 1:
            ends.reverse()
        links.append(
            {
                "class": "uplink",
                "node1": ends[0][1],
                "intf1": ends[0][2],
                "node2": ends[1][1],
                "intf2": ends[1][2],
                "rack": rack,
                "bw_mbps": uplink_bw,
                "shaping": {},
            }
        )
    return {
        "kind": "rack_core",
        "spec": {},
        "hosts": [
            {
                "name": h,
                "rack": r,
                "kind": "worker",
                "ip": f"10.0.0.{i + 1}",
                "tcp_congestion_control": "cubic",
                "intfs": [{"name": f"{h}-eth0", "ip": f"10.0.0.{i + 1}"}],
            }
            for i, (h, r) in enumerate(HOSTS.items())
        ],
        "switches": [
            {"name": "tor1", "role": "tor", "rack": 0},
            {"name": "tor2", "role": "tor", "rack": 1},
            {"name": "core1", "role": "core", "rack": None},
        ],
        "links": links,
    }


def bwm_line(t, iface, bin_, bout, dt=DT):
    rin, rout = bin_ / int(dt * 1000) * 1000, bout / int(dt * 1000) * 1000
    return (
        f"{t:.6f};{iface};{rout:.2f};{rin:.2f};{rin + rout:.2f};{bin_};{bout};0.00;0.00;0.00;"
        f"{bin_ // 1000};{bout // 1000};0.00;0.00;0;0;{8 * rout:.2f};{8 * rin:.2f};{8 * (rin + rout):.2f};"
        f"{8 * bin_};{8 * bout}\n"
    )


def make_run(root: Path, name="synthetic", h1_in=None, busy_inside=(50.0, 70.0), scheme="ps") -> Path:
    """A complete run directory with known answers (see the constants above)."""
    d = root / name
    for sub in ("events", "results", "logs", "traces"):
        (d / sub).mkdir(parents=True)
    spec = {
        "name": name,
        "topology": {"kind": "rack_core"},
        "workload": {
            "scheme": scheme,
            "model": "digits_mlp",
            "dataset": "digits",
            "compute": "real",
            "batch_size": BATCH,
            "iterations": len(SPANS),
            "warmup_iterations": WARMUP,
        },
        "capture": {"interval_ms": 10},
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    (d / "topology.json").write_text(json.dumps(topology()))
    procs = [
        {"name": f"worker{i}", "role": "worker", "index": i, "rank": i, "host": h, "ip": "x", "iface": f"{h}-eth0"}
        for i, h in enumerate(HOSTS)
    ]
    procs.append(
        {"name": "server0", "role": "server", "index": 0, "rank": 4, "host": "h1", "ip": "x", "iface": "h1-eth0"}
    )
    (d / "processes.json").write_text(json.dumps({"world_size": 5, "processes": procs}))
    # events: worker0 starts each iteration, worker3 ends it; the others lie inside
    for w in range(WORKERS):
        lines = []
        for it, span in enumerate(SPANS):
            # warm-up 100-105 and 109-112; from 112 back to back: each measured iteration's time
            # (completion to completion) is its span
            base = 100.0 + 9.0 * it if it < 2 else 100.0 + 6.0 * 2 + sum(SPANS[2:it]) + 0.0
            start = base + (0.0 if w == 0 else 0.1 * span * w / WORKERS)
            end = base + (span if w == WORKERS - 1 else 0.8 * span)
            ev = {
                "proc": f"worker{w}",
                "role": "worker",
                "rank": w,
                "thread": "main",
                "kind": "iteration",
                "ts": start,
                "dur": end - start,
                "iteration": it,
                "layer": None,
                "samples": BATCH,
            }
            lines.append(ev)
            lines.append({**ev, "kind": "forward", "dur": 0.1 * span, "layer": 0, "samples": None})
            lines.append(
                {
                    **ev,
                    "thread": "comm",
                    "kind": "allreduce",
                    "dur": 0.2 * span,
                    "bytes": 4096,
                    "peer": None,
                    "samples": None,
                }
            )
        if w == 0:
            lines.append(
                {
                    "proc": "worker0",
                    "role": "worker",
                    "rank": 0,
                    "thread": "main",
                    "kind": "eval",
                    "ts": 130.0,
                    "dur": 0.2,
                    "iteration": len(SPANS),
                    "accuracy": 0.9,
                    "loss": 0.3,
                }
            )
        text = "".join(json.dumps(e) + "\n" for e in lines)
        if w == 1:
            text += '{"proc": "worker1", "kind": "iter'  # killed mid-line
        (d / "events" / f"worker{w}.jsonl").write_text(text)
    (d / "events" / "server0.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "proc": "server0",
                    "role": "server",
                    "rank": 4,
                    "thread": "main",
                    "kind": "iteration",
                    "ts": 100.0 + i,
                    "dur": 50.0,
                    "iteration": i,
                    "samples": 999,
                }
            )
            + "\n"
            for i in range(6)
        )
    )
    (d / "results" / "worker0.json").write_text(json.dumps({"proc": "worker0", "final_accuracy": 0.8}))
    # bwm-ng trace
    out = []
    for j in range(N_SAMPLES):
        t = T_START + j * DT
        tot_in = tot_out = 0
        for iface, (bin_, bout) in PORT_BYTES.items():
            if iface == "tor1-eth1" and h1_in is not None:
                bin_ = h1_in
            out.append(bwm_line(t + 1e-5, iface, bin_, bout))
            tot_in, tot_out = tot_in + bin_, tot_out + bout
        out.append(bwm_line(t + 2e-5, "total", tot_in, tot_out))
    text = "".join(out) + "121.010000;tor1-eth1;0.00;1000"  # truncated last line
    (d / "traces" / "bwm-ng.csv").write_text(text)
    # cpu: busy 100 % outside the measured window, busy_inside within it
    win = measured_window()
    rows = ["time,kind,id,busy_pct"]
    for j in range(221):
        t = T_START + 0.1 * j + 0.05
        inside = win[0] <= t <= win[1]
        for core in (0, 1):
            rows.append(f"{t:.6f},core,{core},{busy_inside[core] if inside else 100.0}")
        rows.append(f"{t:.6f},proc,worker0,{40.0}")
    (d / "traces" / "cpu.csv").write_text("\n".join(rows) + "\n")
    (d / "traces" / "qdisc.csv").write_text(
        "time,iface,qdisc,backlog_bytes,backlog_packets,drops,overlimits,sent_bytes,sent_packets\n"
        "100.0,tor1-eth3,htb,1500,1,0,3,10000,10\n100.01,tor1-eth3,htb,0,0,1,4,20000,20\n"
    )
    return d


def measured_window():
    base2 = 100.0 + 6.0 * 2
    return base2, base2 + sum(SPANS[2:])


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path)


# ---------------------------------------------------------------------------- tests


def test_load_gives_frames_and_dicts(run_dir):
    run = analysis.load(run_dir)
    assert run.name == "synthetic" and run.scheme == "ps"
    assert len(run.traces) == N_SAMPLES * len(PORT_BYTES)  # total lines and the truncated line dropped
    assert set(run.traces["iface"]) == set(PORT_BYTES)
    assert run.t0 == pytest.approx(T_START + 1e-5)
    assert len(run.events) == WORKERS * len(SPANS) * 3 + 1 + len(SPANS)  # the broken line is skipped
    assert set(run.events["thread"]) == {"main", "comm"}
    assert len(run.iterations) == WORKERS * len(SPANS)  # derived: server "iterations" excluded
    assert set(run.cpu["kind"]) == {"core", "proc"} and all(isinstance(v, str) for v in run.cpu["id"])
    assert list(run.qdisc["backlog_bytes"]) == [1500, 0]
    assert run.topology["kind"] == "rack_core" and run.processes["world_size"] == 5
    ports = run.ports().set_index("iface")
    assert ports.loc["tor2-eth3", "tor_side"] and not ports.loc["core1-eth2", "tor_side"]
    assert ports.loc["tor1-eth2", "host"] == "h2"


def test_rates_from_counters_use_real_intervals():
    tr = pd.DataFrame(
        {
            "time": [10.0, 10.010, 10.025, 10.0, 10.010],
            "iface": ["a", "a", "a", "b", "b"],
            "bytes_in": [7, 500, 1500, 0, 0],
            "bytes_out": [99, 1000, 3000, 0, 125],
            "packets_in": 0,
            "packets_out": 0,
            "errors_in": 0,
            "errors_out": 0,
        }
    )
    r = rates(tr).set_index(["iface", "time"])
    assert len(r) == 3  # the first sample of each interface has no interval
    assert r.loc[("a", 10.010), "tx_bps"] == pytest.approx(1000 * 8 / 0.010)
    assert r.loc[("a", 10.025), "tx_bps"] == pytest.approx(3000 * 8 / 0.015)  # 1.6 Mbit/s, not 2.4
    assert r.loc[("a", 10.025), "rx_bps"] == pytest.approx(1500 * 8 / 0.015)
    assert r.loc[("b", 10.010), "tx_bps"] == pytest.approx(100_000)


def test_summarize_known_answers(run_dir):
    s = metrics.summarize(run_dir)
    assert s.analysis_errors == []
    assert s.status == "ok" and s.error is None and s.scheme == "ps"
    assert s.workers == WORKERS and s.global_batch == WORKERS * BATCH
    assert s.iterations_completed == len(SPANS) and s.measured_iterations == len(SPANS) - WARMUP
    spans = np.array(SPANS[WARMUP:])
    tp = WORKERS * BATCH / spans  # 128, 64, 32, 256 samples/s
    assert s.throughput.mean == pytest.approx(tp.mean()) == pytest.approx(120.0)
    assert s.throughput.spread95 == pytest.approx(1.96 * tp.std()) == pytest.approx(1.96 * 85.790442)
    assert s.throughput.spread == s.throughput.spread95 and s.throughput.ci95 is None
    # Student's t 95 % interval of the mean: t(0.975, 3) = 3.182446 (the tables' value), sd with ddof=1
    half = 3.182446 * tp.std(ddof=1) / 2
    assert half == pytest.approx(157.63, abs=0.01)
    assert s.throughput.mean_ci95_low == pytest.approx(120.0 - half, abs=1e-4)
    assert s.throughput.mean_ci95_high == pytest.approx(120.0 + half, abs=1e-4)
    assert s.throughput.std == pytest.approx(tp.std())
    assert s.throughput.overall == pytest.approx(WORKERS * BATCH * 4 / spans.sum())
    assert s.iteration_time_s.mean == pytest.approx(1.875)
    assert s.iteration_time_s.p50 == pytest.approx(1.5)
    assert s.iteration_time_s.p95 == pytest.approx(3.7)
    b = s.bytes
    assert b.core == (700 + 200) * N_SAMPLES
    assert b.uplinks == (300 + 700 + 50 + 200) * N_SAMPLES
    assert b.host_links == sum(i + o for i, o in list(PORT_BYTES.values())[:4]) * N_SAMPLES
    assert (b.per_host["h3"].tx, b.per_host["h3"].rx) == (3000 * N_SAMPLES, 300 * N_SAMPLES)
    # bytes of the measured window (5 s of samples at 10 ms) per measured iteration
    assert s.bytes_per_iteration.core == pytest.approx(900 * 750 / 4, rel=0.01)
    assert s.bytes_per_iteration.core_training == s.bytes_per_iteration.core  # no background
    worker_link = np.mean([i + o for i, o in list(PORT_BYTES.values())[:4]])  # every host runs a worker
    assert s.bytes_per_iteration.worker_link == pytest.approx(worker_link * 750 / 4, rel=0.01)
    assert s.final_accuracy == 0.9 and "eval" in s.accuracy_source  # eval event beats results/
    assert s.cpu.idle_pct_mean == pytest.approx(40.0)  # the measured window, not start-up
    assert s.cpu.idle_pct_per_core == {"0": pytest.approx(50.0), "1": pytest.approx(30.0)}
    f = s.fidelity
    assert f.cpu_starved is False and f.min_idle_pct == pytest.approx(40.0)
    assert f.rule == "Mininet-HiFi: keep >= 35% CPU idle"
    assert f.shaping_failed is False and len(f.rates.links) == 6
    # files
    assert RunSummary.load(run_dir) == s
    it = pd.read_csv(run_dir / "iterations.csv")
    assert list(it.columns) == ["iteration", "worker", "start", "end", "duration_s", "samples"]
    assert len(it) == WORKERS * len(SPANS) and set(it["worker"]) == {f"worker{i}" for i in range(WORKERS)}
    assert (it["duration_s"] - (it["end"] - it["start"])).abs().max() < 1e-9


def _out_of_step(periods: list[float], skew: float = 0.3, busy: float = 0.7) -> pd.DataFrame:
    """Two workers whose iteration ``i`` both finish ``periods[i]`` s after their iteration
    ``i - 1``, worker1 ``skew`` s behind worker0, each busy ``busy`` of the period."""
    rows, end = [], 0.0
    for i, period in enumerate(periods):
        end += period
        rows += [
            {
                "iteration": i,
                "worker": f"worker{w}",
                "start": end + w * skew - busy * period,
                "end": end + w * skew,
                "duration_s": busy * period,
                "samples": 32,
            }
            for w in (0, 1)
        ]
    return pd.DataFrame(rows)


def test_an_iteration_takes_from_the_completion_of_the_one_before():
    """Workers out of step: each iteration spans 0.79 s (worker0's start to worker1's end) but
    the job completes one every 0.7 s; the throughput is 64 samples per 0.7 s."""
    g = metrics.global_iterations(_out_of_step([0.7] * 6))
    assert g["span_s"].to_numpy() == pytest.approx([0.79] * 6)
    assert g["time_s"].to_numpy() == pytest.approx([0.79] + [0.7] * 5)  # the first: its span
    assert list(g["period_start"].iloc[1:]) == pytest.approx(list(g["end"].iloc[:-1]))
    tp, it = metrics.throughput_stats(metrics.measured_iterations(g, 2))
    assert (
        tp.mean == pytest.approx(64 / 0.7) and tp.overall == pytest.approx(64 / 0.7) and it.mean == pytest.approx(0.7)
    )
    # a run that slows: the overall rate is the samples over the time they took
    g = metrics.global_iterations(_out_of_step([0.5, 0.5, 0.5, 1.0, 1.0]))
    tp, it = metrics.throughput_stats(metrics.measured_iterations(g, 1))
    assert tp.overall == pytest.approx(4 * 64 / 3.0) and tp.mean == pytest.approx((64 / 0.5 + 64 / 0.5 + 64 + 64) / 4)
    assert it.mean == pytest.approx(0.75)


def test_a_summary_is_refigured_from_the_archived_files_by_the_current_definitions(tmp_path):
    """A summary written under another definition: its iteration figures are computed again
    from iterations.csv (the warm-up until steady chosen again); the summary as written
    without iterations.csv, None without a summary."""
    d = tmp_path / "run"
    d.mkdir()
    assert metrics.refigured_summary(d) is None
    (d / "spec.yaml").write_text(
        yaml.safe_dump(
            {"workload": {"scheme": "ps", "iterations": 9, "warmup_iterations": 2, "max_warmup_iterations": 4}}
        )
    )
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": "ok",
                "workers": 2,
                "iterations": 9,
                "warmup_iterations": 4,
                "max_warmup_iterations": 4,
                "throughput": {"mean": 50.0},
            }
        )
    )
    assert metrics.refigured_summary(d).throughput.mean == 50.0
    _out_of_step([2.0, 1.4, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]).to_csv(d / "iterations.csv", index=False)
    s = metrics.refigured_summary(d)
    assert s.warmup_iterations == 2 and s.measured_iterations == 5  # steady from iteration 2 on
    assert s.throughput.mean == pytest.approx(64 / 0.7) and s.iteration_time_s.mean == pytest.approx(0.7)
    assert s.status == "ok" and s.workers == 2  # the rest as written


def test_mean_interval_is_student_s_t():
    # t(0.975, 4) = 2.776445 (the tables' value); sd of 1..5 with ddof=1 = sqrt(2.5)
    low, high = metrics.mean_interval(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert (low, high) == (pytest.approx(3 - half, abs=1e-5), pytest.approx(3 + half, abs=1e-5))
    lo90, hi90 = metrics.mean_interval(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), confidence=0.90)
    assert low < lo90 < 3 < hi90 < high
    assert metrics.mean_interval(np.array([7.0, 7.0, 7.0])) == (7.0, 7.0)
    assert metrics.mean_interval(np.array([7.0])) == (None, None) == metrics.mean_interval(np.array([]))


def test_sweep_rows_hold_the_spread_and_the_mean_s_interval(tmp_path):
    from testbed.runner import RunResult, headline

    s = metrics.summarize(make_run(tmp_path))
    row = headline(RunResult(tmp_path / "synthetic", s, {"variant": "v"}))
    assert list(row) == ["variant", *rundir.SWEEP_FIGURES]
    assert row["samples_per_s_spread95"] == s.throughput.spread95
    assert (row["samples_per_s_mean_ci95_low"], row["samples_per_s_mean_ci95_high"]) == (
        s.throughput.mean_ci95_low,
        s.throughput.mean_ci95_high,
    )
    old = RunSummary.model_validate({"status": "ok", "throughput": {"mean": 5.0, "ci95": 1.5}})
    assert headline(RunResult(tmp_path, old))["samples_per_s_spread95"] == 1.5


def test_fidelity_flags_trip(tmp_path):
    # h1 sends 200 kB per 10 ms = 160 Mbit/s through a 100 Mbit/s link; CPU 80 % busy
    d = make_run(tmp_path, "bad", h1_in=200_000, busy_inside=(80.0, 80.0))
    s = metrics.summarize(d)
    assert s.fidelity.shaping_failed is True
    worst = max(s.fidelity.rates.links, key=lambda l: l.max_ratio)
    assert worst.iface == "tor1-eth1" and worst.max_rx_mbps == pytest.approx(160.0, rel=0.01)
    assert s.fidelity.cpu_starved is True and s.cpu.idle_pct_mean == pytest.approx(20.0)


def test_a_link_raised_by_a_scheduled_event_is_checked_against_its_new_rate(tmp_path):
    # the same 160 Mbit/s through tor1-eth1, after an event raised h1's link to 200 Mbit/s
    d = make_run(tmp_path, "raised", h1_in=200_000, busy_inside=(40.0, 40.0))
    rec = {
        "index": 0,
        "kind": "link_rate",
        "target": "host:h1",
        "applied": True,
        "ts": 0.0,
        "bw_mbps": 200.0,
        "ifaces": ["tor1-eth1", "h1-eth0"],
        "iteration": 0,
    }
    (d / "schedule.jsonl").write_text(json.dumps(rec) + "\n")
    s = metrics.summarize(d)
    assert s.fidelity.shaping_failed is False
    link = next(l for l in s.fidelity.rates.links if l.iface == "tor1-eth1")
    assert link.bw_mbps == 200.0 and link.max_ratio == pytest.approx(0.8, rel=0.01)
    rec["applied"] = False  # an event never reached changes nothing
    (d / "schedule.jsonl").write_text(json.dumps(rec) + "\n")
    assert metrics.summarize(d).fidelity.shaping_failed is True


def test_summarize_failed_run_with_missing_files(tmp_path):
    d = tmp_path / "failed"
    (d / "logs").mkdir(parents=True)
    (d / "spec.yaml").write_text(yaml.safe_dump({"name": "failed", "workload": {"scheme": "ring"}}))
    s = metrics.summarize(d, status="failed", error="worker0 exited with code 1")
    assert s.status == "failed" and s.error == "worker0 exited with code 1"
    assert s.scheme == "ring" and s.analysis_errors == []
    assert s.throughput.mean is None and s.iteration_time_s.p95 is None
    assert s.bytes is None and s.final_accuracy is None
    assert s.fidelity.cpu_starved is None and s.fidelity.shaping_failed is None
    assert RunSummary.load(d).status == "failed"
    run = analysis.load(d)
    assert run.traces.empty and run.events.empty and run.iterations.empty and run.t0 is None
    # a completely empty directory and a missing one
    e = tmp_path / "empty"
    e.mkdir()
    assert metrics.summarize(e, status="failed", error="x").status == "failed"
    assert metrics.summarize(tmp_path / "nope", status="failed").analysis_errors


def test_partial_run_counts_only_complete_iterations(run_dir):
    (run_dir / "events" / "worker3.jsonl").unlink()  # worker3 died: its iterations are missing
    (run_dir / "traces" / "cpu.csv").unlink()
    s = metrics.summarize(run_dir, status="failed", error="worker3 died")
    # processes.json plans 4 workers: iterations with only 3 of them are incomplete
    assert s.workers == WORKERS and s.iterations_completed == 0 and s.measured_iterations == 0
    assert s.throughput.mean is None and s.cpu.idle_pct_mean is None
    assert s.bytes.core == 900 * N_SAMPLES  # traces still summed


def test_summary_on_real_bwm_ng_capture(tmp_path):
    """The real capture (tests/data) through topology -> per-host bytes."""
    d = tmp_path / "real"
    (d / "traces").mkdir(parents=True)
    shutil.copy(DATA / "bwm-ng-veth.csv", d / "traces" / "bwm-ng.csv")
    topo = {
        "hosts": [{"name": "hA"}, {"name": "hB"}],
        "switches": [{"name": "br", "role": "tor"}],
        "links": [
            {"class": "host", "node1": "hA", "intf1": "tbx1a", "node2": "br", "intf2": "tbx0a", "bw_mbps": 100.0},
            {"class": "host", "node1": "hB", "intf1": "tbx1b", "node2": "br", "intf2": "tbx0b", "bw_mbps": 100.0},
        ],
    }
    (d / "topology.json").write_text(json.dumps(topo))
    s = metrics.summarize(d)
    assert s.bytes.per_host["hA"] == TxRx(tx=200 * 1042, rx=50 * 542)
    assert s.bytes.per_host["hB"] == TxRx(tx=50 * 542, rx=200 * 1042)
    assert s.bytes.core == 0 and s.fidelity.shaping_failed is False


def _is_png(p: Path) -> bool:
    return p.is_file() and p.stat().st_size > 1000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_write_pngs(run_dir, tmp_path):
    run = analysis.load(run_dir)
    p1 = plots.plot_interface_rates(run)
    assert p1 == run_dir / "plots" / "rates-h1.png" and _is_png(p1)
    p2 = plots.plot_interface_rates(run_dir, host="h3", path=tmp_path / "r.png", smooth_s=0.05, span=(1.0, 3.0))
    assert _is_png(p2)
    other = make_run(tmp_path, "other", scheme="ring")
    metrics.summarize(other)
    p3 = plots.plot_throughput([run, other], tmp_path / "tp.png")
    assert _is_png(p3)
    p4 = plots.plot_iteration_times(run)
    assert _is_png(p4)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _is_png(plots.plot_interface_rates(empty, path=tmp_path / "e.png"))
    assert _is_png(plots.plot_iteration_times(empty, path=tmp_path / "e2.png"))


def test_timeline_is_valid_chrome_trace(run_dir):
    path = timeline.write_timeline(run_dir)
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    x = [e for e in ev if e["ph"] == "X"]
    run = analysis.load(run_dir)
    assert len(x) == len(run.events)
    meta = [e for e in ev if e["ph"] == "M"]
    names = {e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert "worker0 (worker on h1)" in names and "server0 (server on h1)" in names
    assert "link rates (Mbit/s)" in names  # the link counters are on by default
    assert sum(e["name"] == "process_name" for e in meta) == 5 + 1
    assert sum(e["name"] == "thread_name" for e in meta) == WORKERS * 2 + 1  # main+comm per worker, server main
    # pid = rank + 1; tid 1 = main
    w2 = [e for e in x if e["pid"] == 3 and e["cat"] == "iteration"]
    assert len(w2) == len(SPANS) and all(e["tid"] == 1 for e in w2)
    first = min(e["ts"] for e in x)
    assert first == pytest.approx((100.0 - run.t0) * 1e6)
    it0 = next(e for e in x if e["pid"] == 4 and e["cat"] == "iteration" and e["args"]["iteration"] == 0)
    assert it0["dur"] == pytest.approx(SPANS[0] * 1e6 * (1 - 0.1 * 3 / 4), rel=1e-6)
    assert all(isinstance(e["ts"], (int, float)) and e["ts"] >= 0 for e in x)
    assert next(e for e in x if e["cat"] == "forward")["name"] == "forward L0"
    counters = [e for e in ev if e["ph"] == "C"]
    # one track per host link (the host's tx = its switch port's rx) and per uplink (at its ToR end)
    assert {e["name"] for e in counters} == {"h1 link", "h2 link", "h3 link", "h4 link", "uplink tor1", "uplink tor2"}
    h1 = [e for e in counters if e["name"] == "h1 link"]  # tor1-eth1: 1000 B in, 100 B out per 10 ms
    assert np.median([e["args"]["tx"] for e in h1]) == pytest.approx(1000 * 8 / 0.01 / 1e6, rel=0.01)
    assert np.median([e["args"]["rx"] for e in h1]) == pytest.approx(100 * 8 / 0.01 / 1e6, rel=0.01)
    up2 = [e for e in counters if e["name"] == "uplink tor2"]  # tor2-eth3: 50 B in, 200 B out
    assert np.median([e["args"]["up"] for e in up2]) == pytest.approx(200 * 8 / 0.01 / 1e6, rel=0.01)
    without = json.loads(timeline.write_timeline(run_dir, run_dir / "t2.json", include_rates=False).read_text())
    assert not any(e["ph"] == "C" for e in without["traceEvents"])


def test_timeline_shows_host_costs_as_spans(tmp_path):
    import threading
    import time

    from traffic.hostmodel import HostModel
    from traffic.hostmodel.costs import HostCosts
    from traffic.runtime.events import EventLog, read_events

    d = tmp_path / "hostcost"
    d.mkdir()
    (d / "spec.yaml").write_text(yaml.safe_dump({"name": "hostcost", "scale": 2.0, "workload": {"scheme": "ps"}}))
    (d / "processes.json").write_text(
        json.dumps(
            {
                "processes": [
                    {"name": "worker0", "role": "worker", "rank": 0, "host": "h1"},
                    {"name": "server0", "role": "server", "rank": 1, "host": "h2"},
                ]
            }
        )
    )
    model = HostModel(message_overhead_s=1e-4, aggregate_bytes_per_s=1e9)
    worker = EventLog(d / "events" / "worker0.jsonl", "worker0", "worker", 0)
    server = EventLog(d / "events" / "server0.jsonl", "server0", "server", 1)
    wc, sc = HostCosts(model, 2.0, worker), HostCosts(model, 2.0, server)
    with worker.span("iteration", iteration=0):
        wc.wait("compute", 0.01, iteration=0)  # within its budget of 2 x 10 ms

        def comm():
            with wc.charge("message", nbytes=4096, iteration=0):  # budget 2 x 0.1 ms: overrun
                time.sleep(0.02)

        t = threading.Thread(target=comm, name="comm")
        t.start()
        t.join()
    with sc.charge("aggregate", nbytes=1000):  # budget 2 x 1 us: overrun
        time.sleep(0.005)
    worker.close()
    server.close()
    recorded = {e["kind"]: e for f in ("worker0", "server0") for e in read_events(d / "events" / f"{f}.jsonl")}
    doc = json.loads(timeline.write_timeline(d).read_text())
    ev = doc["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    host = {e["args"]["bytes"] if "bytes" in e["args"] else "compute": e for e in ev if e.get("cat") == "host_cost"}
    assert len(host) == 3 and all(e["ph"] == "X" for e in host.values())
    compute, message, aggregate = host["compute"], host[4096], host[1000]
    # on the process and thread that charged it
    assert procs[compute["pid"]].startswith("worker0") and tracks[(compute["pid"], compute["tid"])] == "main"
    assert procs[message["pid"]].startswith("worker0") and tracks[(message["pid"], message["tid"])] == "comm"
    assert procs[aggregate["pid"]].startswith("server0") and tracks[(aggregate["pid"], aggregate["tid"])] == "main"
    # within budget: plain name and colour; overrun: marked by name, colour and args
    assert compute["name"] == "host_compute" and compute["cname"] == timeline.HOST_COST_CNAME
    assert compute["args"]["overrun"] is False and compute["args"]["emulated_s"] == pytest.approx(0.01)
    assert message["name"] == "host_message OVERRUN" and message["cname"] == timeline.OVERRUN_CNAME
    assert aggregate["name"] == "host_aggregate OVERRUN" and aggregate["cname"] == timeline.OVERRUN_CNAME
    assert message["args"]["overrun"] is True and message["args"]["iteration"] == 0
    assert message["args"]["real_s"] == recorded["host_message"]["real_s"] >= 0.02
    # times in the emulated network's (scale 2) microseconds from the run start (to 0.5 us: a
    # unix time in float64 is good to about 0.2 us)
    t0 = min(e["ts"] for e in recorded.values())
    for e, kind in ((compute, "host_compute"), (message, "host_message"), (aggregate, "host_aggregate")):
        assert e["ts"] == pytest.approx((recorded[kind]["ts"] - t0) / 2 * 1e6, abs=0.5)
        assert e["dur"] == pytest.approx(recorded[kind]["dur"] / 2 * 1e6, abs=0.5)
    # other events keep their kind as category, without a colour
    it = next(e for e in ev if e.get("cat") == "iteration")
    assert it["name"] == "iteration" and "cname" not in it


def test_host_utilization_and_idle_fraction(tmp_path):
    from analysis.utilization import host_utilization, idle_fraction, utilization_summary

    # h1 sends 100,000 bytes per 10 ms sample (80 Mbit/s of its 100) and receives 100 bytes
    d = make_run(tmp_path, h1_in=100_000)
    u = host_utilization(d, "h1", window_s=0.05)
    a, b = measured_window()
    assert len(u) == pytest.approx((b - a) / 0.05, abs=2)  # measured iterations only
    assert u["tx_frac"].to_numpy() == pytest.approx(0.8, rel=0.02)
    assert u["rx_frac"].to_numpy() == pytest.approx(0.0008, rel=0.05)
    assert idle_fraction(u, 0.1, "tx") == 0.0 and idle_fraction(u, 0.1, "rx") == 1.0
    assert idle_fraction(u, 0.1, "both") == 0.0
    s = utilization_summary(d, "h1", window_s=0.05)
    assert s["tx_mean"] == pytest.approx(0.8, rel=0.02) and s["rx_idle"] == 1.0
    # a known share of idle windows
    frame = pd.DataFrame({"tx_frac": [0.0, 0.05, 0.5, 0.9], "rx_frac": [0.5, 0.0, 0.0, 0.2]})
    assert idle_fraction(frame, 0.1, "tx") == 0.5 and idle_fraction(frame, 0.1, "rx") == 0.5
    assert idle_fraction(frame, 0.1, "both") == 0.25
    with pytest.raises(ValueError):
        idle_fraction(frame, 0.1, "up")
    with pytest.raises(ValueError):
        host_utilization(d, "nohost")
    assert _is_png(plots.plot_utilization([d, d], tmp_path / "u.png", labels=["a", "b"], host="h1"))


def test_background_core_bytes_are_told_apart_only_when_they_can_be():
    topo = topology()
    topo["hosts"] += [
        {"name": "bg1", "rack": 0, "kind": "background"},
        {"name": "bg2", "rack": 1, "kind": "background"},
    ]
    per_host = {"h1": {"tx": 50, "rx": 5}, "bg1": {"tx": 1000, "rx": 40}, "bg2": {"tx": 40, "rx": 1000}}
    assert metrics.background_core_bytes(per_host, topo, []) == 0
    # data (bg1 -> bg2) and ACKs (bg2 -> bg1) both cross the core
    assert metrics.background_core_bytes(per_host, topo, [{"src": "bg1", "dst": "bg2"}]) == 1040
    # a flow that touches a training host, or stays in a rack, cannot be told apart
    assert metrics.background_core_bytes(per_host, topo, [{"src": "bg1", "dst": "h3"}]) is None
    assert metrics.background_core_bytes(per_host, topo, [{"src": "h1", "dst": "h2"}]) is None
    assert metrics.background_core_bytes({"bg1": {"tx": None}}, topo, [{"src": "bg1", "dst": "bg2"}]) is None
