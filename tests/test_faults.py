"""Runs that end badly, and two users at once.

Each fault case checks three things: what the user sees (exit status, message, the run's
``summary.json``), that nothing is left on the machine, and that what the run had written is
kept. The cases that build a network are marked ``slow`` and need root.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from common.errors import TestbedError
from testbed import clean as clean_mod
from testbed import ledger as ledger_mod
from testbed.ledger import Ledger, NetworkLock, lock_holder
from tests.leftovers import leftovers, needs_root
from traffic import rundir
from traffic.summary import RunSummary

ROOT = Path(__file__).resolve().parents[1]
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


# ---- without root -------------------------------------------------------------------------


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


# ---- with a network (root, slow) ------------------------------------------------------------


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
