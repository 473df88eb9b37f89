"""Runs that end badly, and two users at once: the cases that build no network (a spec or a
run directory refused, a second user's command). The cases that build one are
tests/e2e/test_faults_e2e.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from common.errors import TestbedError
from testbed import clean as clean_mod
from testbed import ledger as ledger_mod
from testbed.ledger import Ledger, NetworkLock, lock_holder
from traffic import rundir
from traffic.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """An own ledger and lock directory, in this process and in the CLI processes it starts."""
    d = tmp_path / "state"
    monkeypatch.setattr(ledger_mod, "STATE_DIR", d)
    monkeypatch.setattr(ledger_mod, "LEDGER_DIR", d / "ledger")
    monkeypatch.setattr(ledger_mod, "LOCK_PATH", d / "network.lock")
    return d


HOLD_LOCK = r"""
import sys, time
from testbed.ledger import NetworkLock
NetworkLock(run_dir=sys.argv[1]).__enter__()
print("held", flush=True)
time.sleep(600)
"""


def hold_lock(run_dir, env=None):
    p = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)], stdout=subprocess.PIPE, cwd=ROOT, env=env)
    assert p.stdout.readline().strip() == b"held"
    return p


def fake_run(d: Path, harness: bool) -> Path:
    """A run directory as the harness (``harness``) or the loopback launcher leaves it, before
    summary.json: its spec, its plan and one worker's events."""
    d.mkdir(parents=True)
    for sub in ("logs", "events"):
        (d / sub).mkdir()
    (d / "spec.yaml").write_text(yaml.safe_dump({"name": "t", "workload": {"scheme": "ps"}}))
    (d / "processes.json").write_text(
        json.dumps(
            {
                "world_size": 1,
                "processes": [{"name": "worker0", "role": "worker", "index": 0, "rank": 0, "host": "h1", "rack": 0}],
            }
        )
    )
    (d / "events" / "worker0.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "proc": "worker0",
                    "role": "worker",
                    "rank": 0,
                    "thread": "main",
                    "kind": "iteration",
                    "ts": 100.0 + i,
                    "dur": 0.9,
                    "iteration": i,
                    "layer": None,
                    "samples": 32,
                }
            )
            + "\n"
            for i in range(6)
        )
    )
    if harness:
        (d / "logs" / "harness.log").write_text("2026-11-22 building network\n")
    return d


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_second_lock_holder_is_refused_with_the_name_of_the_run_that_holds_it(state_dir, tmp_path):
    env = {**os.environ, "TESTBED_STATE_DIR": str(state_dir)}
    holder = hold_lock("runs/first-run", env=env)
    try:
        assert lock_holder()["run_dir"] == "runs/first-run"
        assert lock_holder()["pid"] == holder.pid
        with pytest.raises(TestbedError, match=r"runs/first-run \(pid \d+, since") as e:
            NetworkLock().__enter__()
        assert "testbed clean" in str(e.value)
        out = cli("clean", env=env)
        assert out.returncode == 2 and "runs/first-run" in out.stderr and "Traceback" not in out.stderr
    finally:
        holder.kill()
        holder.wait()
    assert lock_holder() is None  # the kernel drops a dead holder's flock
    with NetworkLock(run_dir="runs/second"):
        with NetworkLock(run_dir="runs/second/000_point"):  # the holder may re-enter (a sweep's runs)
            assert lock_holder()["run_dir"] == "runs/second/000_point"
        assert lock_holder()["pid"] == os.getpid()  # still held after the inner exit
    assert lock_holder() is None


def test_ls_tells_running_killed_and_unsummarized_runs_apart(state_dir, tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "killed-run", harness=True)
    fake_run(runs / "local-run", harness=False)
    live = fake_run(runs / "live-run", harness=True)
    owner = subprocess.Popen(["sleep", "60"])
    try:
        led = Ledger.create("live-run", live)
        led.owner_pid, led.owner_start = owner.pid, psutil.Process(owner.pid).create_time()
        led.save()
        out = cli("ls", runs, env={**os.environ, "TESTBED_STATE_DIR": str(state_dir)})
    finally:
        owner.kill()
        owner.wait()
    assert out.returncode == 0, out.stderr
    status = {line.split()[0]: line.split()[1] for line in out.stdout.splitlines()}
    assert status == {"killed-run": "killed", "live-run": "running", "local-run": "no"}  # "no summary"
    assert not (runs / "killed-run" / "summary.json").exists()  # ls only reads


def test_a_ledger_whose_pid_was_reused_is_stale(state_dir, tmp_path):
    led = Ledger.create("r", tmp_path)
    assert not led.owner_alive()  # this process is never its own ledger's live owner
    other = subprocess.Popen(["sleep", "60"])
    try:
        led.owner_pid = other.pid
        led.owner_start = psutil.Process(other.pid).create_time()
        assert led.owner_alive()
        led.owner_start -= 3600  # the pid now belongs to a process that started later
        assert not led.owner_alive()
    finally:
        other.kill()
        other.wait()


def test_a_shared_process_outlives_its_owners_sweep_but_not_anothers(state_dir, tmp_path):
    """A sweep's zygote is shared by its points: each point's own teardown leaves it running;
    the sweep of its ledger by another process (testbed clean of a dead runner) kills it."""
    zygote, child = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        led = Ledger.create("point", tmp_path)
        led.add_pid("zygote", zygote.pid, shared=True)
        led.add_pid("worker0", child.pid)
        assert led.sweep() == [f"process worker0 (pid {child.pid})"]
        child.wait(5)  # ended (psutil reaped it, so its status is not kept)
        assert zygote.poll() is None
        led = Ledger.create("point", tmp_path)
        led.add_pid("zygote", zygote.pid, shared=True)
        stale = Ledger.read(led.path)
        assert stale.shared == ["zygote"]
        stale.owner_pid = os.getpid() + 1  # read by another process: the owner is not the sweeper
        assert stale.sweep() == [f"process zygote (pid {zygote.pid})"]
        zygote.wait(5)
    finally:
        for p in (zygote, child):
            p.kill()
            p.wait()


def test_clean_marks_a_dead_runners_run_killed_and_keeps_its_files(state_dir, tmp_path):
    d = fake_run(tmp_path / "runs" / "r1", harness=True)
    led = Ledger.create("r1", d)
    led.owner_pid, led.owner_start = dead_pid(), None
    led.save()
    events_before = (d / "events" / "worker0.jsonl").read_bytes()
    removed = clean_mod.clean()
    assert f"run {d} marked killed (its files are kept)" in removed
    s = RunSummary.load(d)
    assert s.status == "killed" and f"pid {led.owner_pid}" in s.error and "died" in s.error
    assert (d / "events" / "worker0.jsonl").read_bytes() == events_before
    assert not list((state_dir / "ledger").glob("*.json"))
    # a run that has its summary is left as it is
    assert clean_mod.clean() == []
    assert RunSummary.load(d).status == "killed"


def test_clean_force_never_touches_a_live_runs_processes(state_dir, tmp_path):
    holder = hold_lock("runs/live", env={**os.environ, "TESTBED_STATE_DIR": str(state_dir)})
    try:
        led = Ledger.create("live", tmp_path)
        led.owner_pid, led.owner_start = holder.pid, psutil.Process(holder.pid).create_time()
        led.pids = {"worker0": holder.pid}
        led.save()
        stale = Ledger.create("dead", tmp_path / "gone")
        orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
        stale.owner_pid, stale.owner_start = dead_pid(), None
        stale.pids = {"worker0": orphan.pid, "shared": holder.pid}  # a pid the live run owns is kept
        stale.starts = {
            "worker0": psutil.Process(orphan.pid).create_time(),
            "shared": psutil.Process(holder.pid).create_time(),
        }
        stale.save()
        with pytest.raises(TestbedError, match="runs/live"):
            clean_mod.clean()
        assert orphan.poll() is None and holder.poll() is None  # refused: nothing touched
        removed = clean_mod.clean(force=True)
        assert any(f"pid {orphan.pid}" in r for r in removed)
        orphan.wait(timeout=5)
        assert holder.poll() is None and led.path.exists() and not stale.path.exists()
    finally:
        holder.kill()
        holder.wait()


def test_write_json_never_leaves_a_torn_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"status": "ok"})

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        rundir.write_json(path, {"status": "failed"})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_local_launcher_gives_a_bad_spec_exit_status_2(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.loopback",
            "experiments/quickstart.yaml",
            "--set",
            "topology.host_bw_mbps=-1",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "topology.host_bw_mbps" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()
