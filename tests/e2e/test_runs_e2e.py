"""End to end through the harness: a real Mininet network, real training, real traces."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

import analysis
from testbed.runner import run_experiment
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root
from tests.small_runs import small_spec
from traffic.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]

root_only = pytest.mark.skipif(needs_root, reason="needs root")


def cross_rack_payload(run) -> int:
    """Bytes the workers' push/pull events say crossed racks (payload only)."""
    rack_of_host = {h["name"]: h["rack"] for h in run.topology["hosts"]}
    rack_of_rank = {p["rank"]: rack_of_host[p["host"]] for p in run.processes["processes"]}
    ev = run.events
    comm = ev[(ev.role == "worker") & ev.kind.isin(["push", "pull"]) & ev.peer.notna()]
    crosses = [rack_of_rank[int(r)] != rack_of_rank[int(p)] for r, p in zip(comm["rank"], comm["peer"])]
    return int(comm[crosses]["bytes"].sum())


@pytest.mark.slow
@root_only
def test_ps_run_counts_the_bytes_that_crossed_the_core(tmp_path):
    assert leftovers() == []
    (res,) = run_experiment(small_spec(tmp_path), progress=False)
    assert res.ok, res.summary.error
    s = res.summary
    run = analysis.load(res.run_dir)
    # the dedicated server ps1 sits in rack 0 (tor1): rack 1's workers push and pull across the core
    assert {h["name"]: h["rack"] for h in run.topology["hosts"]}["ps1"] == 0
    payload = cross_rack_payload(run)
    assert payload > 0
    # bwm-ng counted at the ToR uplink ports: payload plus TCP/IP/Ethernet headers and ACKs
    assert payload <= s.bytes.core <= 1.15 * payload, (payload, s.bytes.core)
    its = pd.read_csv(res.run_dir / "iterations.csv")
    assert len(its) == 4 * 8 and set(its["worker"]) == {f"worker{i}" for i in range(4)}
    assert s.throughput.mean > 0 and s.iteration_time_s.p95 >= s.iteration_time_s.p50
    assert 0 <= s.final_accuracy <= 1
    # every shaped interface was read back and recorded
    assert all(l["shaping"] for l in run.topology["links"])
    # plots and timeline from the run directory alone
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "plot", str(res.run_dir)], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert [p.name for p in (res.run_dir / "plots").glob("*.png")]
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "timeline", str(res.run_dir)], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    trace = json.loads((res.run_dir / "timeline.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in trace if e.get("ph") == "M" and e["name"] == "process_name"}
    assert {"worker0", "server0"} <= {n.split()[0] for n in names}
    assert sum(e.get("ph") == "X" for e in trace) >= len(run.events)
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_worker_crash_ends_the_run_promptly_keeps_logs_and_leaves_nothing(tmp_path, monkeypatch):
    assert leftovers() == []
    monkeypatch.setenv("TESTBED_CRASH_AT", "worker1:3")
    exp = small_spec(tmp_path, scheme="allreduce", iterations=30)
    t0 = time.time()
    (res,) = run_experiment(exp, progress=False)
    elapsed = time.time() - t0
    assert res.summary.status == "failed"
    assert "worker1" in res.summary.error and "exited with code" in res.summary.error
    assert "InjectedCrash" in (res.run_dir / "logs" / "worker1.log").read_text()
    # the crash is at iteration 3; start-up is ~20-40 s on 2 cores, the rest must be seconds
    ev = analysis.load(res.run_dir).events
    last = ev[ev.proc == "worker1"]["ts"].max()
    assert time.time() - last < 20 and elapsed < 120
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_sweep_goes_on_after_a_failed_point(tmp_path):
    exp = small_spec(tmp_path, iterations=4, warmup_iterations=1)
    exp.sweep = {"topology.host_bw_mbps": [50, 60]}
    exp.run.timeout_s = 240
    # the first point fails while it trains (its parameter server killed: the workers fail at once), the second runs
    exp = from_dict({**exp.to_dict(), "sweep": {"events": [[{"at_iteration": 1, "kill": "server0"}], []]}})
    results = run_experiment(exp, progress=False)
    assert [r.summary.status for r in results] == ["failed", "ok"]
    assert "server0 was killed by a scheduled event" in results[0].summary.error, results[0].summary.error
    table = pd.read_csv(results[0].run_dir.parent / "sweep.csv")
    assert list(table["status"]) == ["failed", "ok"]
    # both points forked from one zygote: the failed point's teardown left it to the next
    pids = [
        re.findall(r"fork from the sweep's zygote \(pid (\d+)\)", (r.run_dir / "logs" / "harness.log").read_text())
        for r in results
    ]
    assert pids[0] == pids[1] and len(pids[0]) == 1
    assert not psutil.pid_exists(int(pids[0][0]))  # ended (and reaped) with the sweep
    assert leftovers() == []


@root_only
def test_not_root_gets_one_line_with_the_remedy(tmp_path):
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "experiments/quickstart.yaml",
            "--runs-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "root" in out.stderr and "sudo" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@root_only
def test_ctrl_c_tears_everything_down_and_records_the_run(tmp_path):
    import signal

    assert leftovers() == []
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "experiments/quickstart.yaml",
            "-q",
            "--set",
            "sweep={}",
            "--set",
            "workload.iterations=500",
            "--runs-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell that starts the suite in the background leaves SIGINT ignored,
        # and Python then never raises KeyboardInterrupt: give Ctrl-C back its default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    log = None
    while time.time() < deadline:  # wait until the training processes run
        logs = list(tmp_path.glob("*/events/worker0.jsonl"))
        if logs and '"iteration"' in logs[0].read_text():
            log = logs[0]
            break
        time.sleep(0.5)
    assert log is not None, "training never started"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "torn down" in err
    assert RunSummary.load(log.parent.parent).status == "interrupted"
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_scheme_outside_the_repository_runs_on_the_quickstart_topology(tmp_path):
    """docs/schemes.md "Writing a scheme": examples/mymod.py found through PYTHONPATH as module:Class."""
    assert leftovers() == []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "experiments/quickstart.yaml",
            "--quiet",
            "--set",
            "workload.scheme=mymod:MyAllreduce",
            "--set",
            "workload.iterations=8",
            "--set",
            "workload.warmup_iterations=2",
            "--set",
            f"run.runs_dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (summary,) = tmp_path.rglob("summary.json")  # one run: the override replaced the quickstart's sweep
    s = RunSummary.load(summary)
    assert s.status == "ok" and s.scheme == "mymod:MyAllreduce"
    assert s.bytes.core > 0  # ring allreduce over 8 workers in 2 racks crosses the core
    clips = [e for e in analysis.load(summary.parent).events.to_dict("records") if e["kind"] == "clip"]
    assert len(clips) == 8 * 8  # every worker clipped every iteration
    assert leftovers() == []
