"""End to end: nothing a run started outlives it. A researcher's program that forks a daemon
and exits 0 leaves no process behind; a run started right after a ``kill -9`` of another
succeeds, says it swept the dead run, and nothing of the killed run is still running. Needs
root; slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from testbed.runner import run_experiment
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root
from traffic.summary import RunSummary

root_only = pytest.mark.skipif(needs_root, reason="needs root")
REPO = Path(__file__).resolve().parents[2]

# every rank forks a daemon (double fork, own session: re-parented to init), then exits 0
DAEMONIZING = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
os.wait()
print("forked a daemon", flush=True)
"""

TOPOLOGY = {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 100, "oversubscription": 2}


@pytest.mark.slow
@root_only
def test_a_programs_daemon_does_not_outlive_the_run(tmp_path):
    assert leftovers() == []
    (tmp_path / "daemonize.py").write_text(DAEMONIZING)
    exp = from_dict(
        {
            "name": "daemon",
            "topology": TOPOLOGY,
            "workload": {"workers": 4, "program": {"command": ["python", "daemonize.py"], "cwd": str(tmp_path)}},
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 120},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert "forked a daemon" in (res.run_dir / "logs" / "worker0.log").read_text()
    harness = (res.run_dir / "logs" / "harness.log").read_text()
    assert "in the run's cgroup" in harness  # the teardown names what it had to kill
    assert leftovers() == []


def _testbed(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _training(run_dir: Path, timeout_s: float = 120) -> None:
    """Wait until a worker of ``run_dir`` has logged an iteration."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for f in (run_dir / "events").glob("*.jsonl") if (run_dir / "events").is_dir() else []:
            if '"kind":"iteration"' in f.read_text(errors="replace"):
                return
        time.sleep(0.2)
    raise AssertionError(f"{run_dir} did not start training")


@pytest.mark.slow
@root_only
def test_a_run_started_right_after_a_kill_9_of_another_succeeds_and_nothing_of_it_survives(tmp_path):
    assert leftovers() == []
    runs = tmp_path / "runs"
    spec = str(REPO / "experiments" / "quickstart.yaml")
    killed = _testbed(
        "run",
        spec,
        "--quiet",
        "--set",
        "sweep={}",
        "--set",
        "workload.scheme=allreduce",
        "--set",
        "workload.iterations=5000",
        "--set",
        "run.timeout_s=3600",
        "--set",
        f"run.runs_dir={runs}",
        "--set",
        "run.id=killed",
    )
    try:
        _training(runs / "killed")
    except AssertionError:
        killed.kill()
        raise AssertionError(killed.communicate()[1][-3000:]) from None
    os.kill(killed.pid, signal.SIGKILL)  # no teardown at all
    killed.wait()
    nxt = _testbed(
        "run",
        spec,
        "--quiet",
        "--set",
        "sweep={}",
        "--set",
        "workload.scheme=allreduce",
        "--set",
        "workload.iterations=8",
        "--set",
        "workload.warmup_iterations=2",
        "--set",
        f"run.runs_dir={runs}",
        "--set",
        "run.id=next",
    )
    out, err = nxt.communicate(timeout=600)
    assert nxt.returncode == 0, err[-3000:]
    assert "run " + str(runs / "killed") in err and "had died" in err, err  # said in one line
    assert RunSummary.load(runs / "next" / "summary.json").status == "ok"
    assert RunSummary.load(runs / "killed" / "summary.json").status == "killed"
    mentions = [p.pid for p in psutil.process_iter() if str(runs / "killed") in " ".join(_cmdline(p))]
    assert mentions == []
    assert leftovers() == []


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
