"""Runs that end badly, and two users at once, on real networks.

Each fault case checks three things: what the user sees (exit status, message, the run's
``summary.json``), that nothing is left on the machine, and that what the run had written is
kept.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed import ledger as ledger_mod
from tests.leftovers import leftovers, needs_root
from traffic.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]

root_only = pytest.mark.skipif(needs_root, reason="needs root")


def cli(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def small_spec_file(tmp_path, runs_dir, **workload) -> Path:
    spec = {
        "name": "fault",
        "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 50, "oversubscription": 2},
        "workload": {
            "scheme": "ps",
            "iterations": 200,
            "warmup_iterations": 2,
            "batch_size": 16,
            "servers": {"count": 1, "placement": "dedicated", "scope": "global"},
            **workload,
        },
        "run": {"runs_dir": str(runs_dir), "timeout_s": 300},
    }
    path = tmp_path / "fault.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start_run(spec: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "run", str(spec), "-q", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell that starts the suite in the background leaves SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for(cond, what: str, timeout_s: float = 150, poll_s: float = 0.02):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def harness_says(runs: Path, text: str):
    def check():
        for log in runs.glob("*/logs/harness.log"):
            try:
                if text in log.read_text():
                    return log.parent.parent
            except OSError:
                pass
        return None

    return check


def iterations_done(runs: Path, proc: str = "worker0", n: int = 3):
    def check():
        for ev in runs.glob(f"*/events/{proc}.jsonl"):
            try:
                its = [json.loads(l) for l in ev.read_text().splitlines() if '"iteration"' in l]
            except (OSError, ValueError):
                continue
            if sum(e.get("kind") == "iteration" for e in its) >= n:
                return ev.parent.parent
        return None

    return check


def ledger_pid(run_dir: Path, proc: str) -> int:
    for led in ledger_mod.all_ledgers():
        if Path(led.run_dir).resolve() == run_dir.resolve() and proc in led.pids:
            return led.pids[proc]
    raise AssertionError(f"{proc} not in a ledger of {run_dir}")


@pytest.mark.slow
@root_only
@pytest.mark.parametrize("scheme, victim", [("allreduce", "worker1"), ("ps", "server0")])
def test_a_killed_worker_or_server_ends_the_run_with_its_name(tmp_path, scheme, victim):
    assert leftovers() == []
    runs = tmp_path / "runs"
    p = start_run(small_spec_file(tmp_path, runs, scheme=scheme))
    run_dir = wait_for(iterations_done(runs, n=3), "three iterations")
    os.kill(ledger_pid(run_dir, victim), signal.SIGKILL)
    killed_at = time.time()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert time.time() - killed_at < 30  # promptly, not at the run's timeout
    s = RunSummary.load(run_dir)
    assert s.status == "failed"
    assert f"process {victim}" in s.error and "killed by signal SIGKILL" in s.error
    assert victim in out and "Traceback" not in err
    assert iterations_done(runs, n=3)()  # what was written is kept
    assert (run_dir / "logs" / f"{victim}.log").is_file() and (run_dir / "traces" / "bwm-ng.csv").stat().st_size > 0
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_sigkilled_runner_is_cleaned_and_its_run_marked_killed(tmp_path):
    assert leftovers() == []
    runs = tmp_path / "runs"
    p = start_run(small_spec_file(tmp_path, runs, scheme="allreduce"))
    run_dir = wait_for(iterations_done(runs, n=3), "three iterations")
    p.kill()  # no teardown at all: the network stays; the processes tied to the harness die with it
    p.communicate()
    assert leftovers() != []
    out = cli("ls", runs)
    assert out.stdout.split()[:2] == [run_dir.name, "killed"], out.stdout
    out = cli("clean")
    assert out.returncode == 0, out.stderr
    assert "bridge tor1" in out.stdout and f"run {run_dir} marked killed" in out.stdout
    time.sleep(0.5)
    assert leftovers() == []
    s = RunSummary.load(run_dir)
    assert s.status == "killed" and "died" in s.error
    # figures from what it had written: worker0 had finished 3 iterations, the others (in step
    # with it in a ring) at least 2 when they died with the runner
    assert s.iterations_completed >= 2 and s.bytes.core > 0
    assert cli("ls", runs).stdout.split()[:2] == [run_dir.name, "killed"]


@pytest.mark.slow
@root_only
@pytest.mark.parametrize("phase", ["building network", "capture started", "launching"])
def test_ctrl_c_in_each_phase_tears_down_and_records_the_run(tmp_path, phase):
    assert leftovers() == []
    runs = tmp_path / "runs"
    p = start_run(small_spec_file(tmp_path, runs))
    run_dir = wait_for(harness_says(runs, phase), phase, poll_s=0.005)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "torn down" in err and "Traceback" not in err
    assert RunSummary.load(run_dir).status == "interrupted"
    assert (run_dir / "spec.yaml").is_file()
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_second_run_and_clean_while_a_run_is_live(tmp_path):
    """A live run (a network built and a process in a host, holding the lock) is never touched."""
    assert leftovers() == []
    live = subprocess.Popen([sys.executable, "-c", LIVE, str(tmp_path)], stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert live.stdout.readline().strip() == b"up"
        live_dir = tmp_path / "live"
        out = cli("run", "experiments/quickstart.yaml", "--runs-dir", tmp_path / "second")
        assert out.returncode == 2 and str(live_dir) in out.stderr and "Traceback" not in out.stderr
        assert not (tmp_path / "second").exists()  # refused before anything was created
        out = cli("clean")
        assert out.returncode == 2 and str(live_dir) in out.stderr
        before = sorted(leftovers())
        out = cli("clean", "--force")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "nothing to clean"
        assert sorted(leftovers()) == before and any("tor1" in x for x in before)
    finally:
        live.kill()
        live.wait()
    out = cli("clean")
    assert out.returncode == 0 and "bridge tor1" in out.stdout
    time.sleep(0.5)
    assert leftovers() == []


LIVE = r"""
import sys, time
from traffic import rundir
from testbed.ledger import Ledger, NetworkLock
from testbed.lifetime import RunCgroup
from testbed.network import Network
from topologies import TopologySpec
d = rundir.create(sys.argv[1], "live")
lock = NetworkLock(run_dir=d).__enter__()
led = Ledger.create("live", d)
cg = RunCgroup(d.name)  # as a run does: its processes in its cgroup, recorded in its ledger
led.set_process_cgroup(str(cg.path))
net = Network(TopologySpec(), [], d, led, cgroup=cg).start()
net.hosts["h1"].popen(["sleep", "600"], preexec_fn=cg.preexec)
print("up", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@root_only
def test_a_disk_that_fills_fails_the_run_clearly_and_harms_nothing_else(tmp_path):
    assert leftovers() == []
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(small)], check=True)
    try:
        p = start_run(small_spec_file(tmp_path, small / "runs"))
        out, err = p.communicate(timeout=300)
        assert p.returncode == 1, out + err
        assert "Traceback" not in err
        (run_dir,) = (small / "runs").iterdir()
        assert "is full" in out and "run.runs_dir" in out
        assert "name: fault" in (run_dir / "spec.yaml").read_text()
        assert (run_dir / "traces" / "bwm-ng.csv").stat().st_size > 0  # kept up to the point it filled
        assert not list(run_dir.rglob("*.tmp"))
        assert leftovers() == []
    finally:
        subprocess.run(["umount", str(small)], check=False)
    assert not os.path.ismount(small)
