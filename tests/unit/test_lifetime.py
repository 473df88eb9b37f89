"""A run's processes live and die together: one cgroup per run killed whole (daemons included),
pids from a ledger signalled only with their recorded start time, helpers that die with the
harness, a dead run's ledger swept by the next run, an interrupted analysis that still writes
its summary, and files that may hold secrets kept private. Root for the cgroup cases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from common.errors import TestbedError
from testbed import clean as clean_mod
from testbed import ledger as ledger_mod
from testbed.lifetime import Hierarchy, RunCgroup, kill_cgroup, process_hierarchy, tied_preexec
from tests.leftovers import needs_root

root_only = pytest.mark.skipif(needs_root, reason="needs root (cgroups)")

# a child that double-forks a daemon (re-parented to init, in its own session) and exits 0
DAEMON = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
os.wait()
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_file(path: Path, timeout_s: float = 10) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.is_file() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


def _hierarchies() -> list[Hierarchy]:
    out = []
    h = process_hierarchy()
    if h is not None:
        out.append(h)
    for v1 in ("freezer", "pids"):  # with a freezer, and without one (members killed until none is left)
        if (Path("/sys/fs/cgroup") / v1 / "cgroup.procs").exists():
            out.append(Hierarchy(1, Path("/sys/fs/cgroup") / v1))
    return out


def test_the_run_cgroup_goes_in_cgroup_v2_else_the_best_v1_hierarchy_mounted(tmp_path):
    def mounts(*lines):
        for point in [line.split()[1] for line in lines]:
            Path(point).mkdir(parents=True, exist_ok=True)
            (Path(point) / "cgroup.procs").write_text("")
        f = tmp_path / "mounts"
        f.write_text("".join(line + " 0 0\n" for line in lines))
        return f

    cpu, pids, v2 = (
        f"cgroup {tmp_path}/cpu cgroup rw,cpu",
        f"cgroup {tmp_path}/pids cgroup rw,pids",
        f"cgroup2 {tmp_path}/unified cgroup2 rw",
    )
    assert process_hierarchy(mounts(cpu, pids, v2)) == Hierarchy(2, tmp_path / "unified")
    assert process_hierarchy(mounts(cpu, pids)) == Hierarchy(1, tmp_path / "pids")
    assert process_hierarchy(mounts(cpu)) == Hierarchy(1, tmp_path / "cpu")
    assert process_hierarchy(mounts(f"cgroup {tmp_path}/ro cgroup ro,freezer")) is None


@root_only
@pytest.mark.parametrize("hierarchy", _hierarchies(), ids=lambda h: f"v{h.version}-{h.root.name}")
def test_a_daemon_forked_by_a_run_process_dies_with_the_run_cgroup(tmp_path, hierarchy):
    cg = RunCgroup(f"test-{os.getpid()}-v{hierarchy.version}", hierarchy)
    try:
        (tmp_path / "d.py").write_text(DAEMON)
        p = subprocess.Popen(
            [sys.executable, "-P", str(tmp_path / "d.py"), str(tmp_path / "pid")], preexec_fn=tied_preexec(cg.preexec)
        )
        assert p.wait(timeout=20) == 0
        daemon = int(_wait_file(tmp_path / "pid"))
        assert _alive(daemon) and daemon in cg.pids()  # born inside, whatever it forked
        left = cg.close()
        assert any(line.startswith(f"{daemon} ") for line in left), left
        time.sleep(0.1)
        assert not _alive(daemon)
        assert not cg.path.exists()
        assert cg.close() == []  # idempotent
    finally:
        kill_cgroup(cg.path)


@root_only
def test_a_helper_started_from_the_main_thread_dies_with_its_parent(tmp_path):
    # the parent (a Python process standing for the harness) starts sleep tied to it, then is killed -9
    code = (
        "import subprocess, sys\n"
        "from testbed.lifetime import tied_preexec\n"
        "p = subprocess.Popen(['sleep', '600'], preexec_fn=tied_preexec())\n"
        "open(sys.argv[1], 'w').write(str(p.pid))\n"
        "import time; time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "pid")])
    try:
        child = int(_wait_file(tmp_path / "pid"))
        assert _alive(child)
        parent.kill()
        parent.wait()
        end = time.monotonic() + 5
        while _alive(child) and time.monotonic() < end:
            time.sleep(0.02)
        assert not _alive(child)
    finally:
        parent.kill()


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"])


def test_a_ledger_pid_is_signalled_only_with_its_recorded_start_time(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_mod, "LEDGER_DIR", tmp_path)
    a, b, c = _sleeper(), _sleeper(), _sleeper()
    try:
        led = ledger_mod.Ledger(path=tmp_path / "x.json", owner_pid=a.pid + 10**6, owner_start=0.0)
        led.pids = {"right": a.pid, "reused": b.pid, "unknown": c.pid}
        led.starts = {
            "right": psutil.Process(a.pid).create_time(),
            "reused": psutil.Process(b.pid).create_time() - 5.0,
        }  # the pid's earlier owner
        removed = led.sweep()
        assert removed == [f"process right (pid {a.pid})"]
        assert not _alive(a.pid)
        assert b.poll() is None and c.poll() is None  # another process now, or a start time not recorded
    finally:
        for p in (a, b, c):
            p.kill()
            p.wait()


def test_a_swept_orphan_is_dead_on_return_and_a_swept_child_is_reaped(tmp_path, monkeypatch):
    """An orphan (its parent gone, so init's child) is dead when the sweep returns, a zombie at
    most until init reaps it; a child of this process is reaped by the sweep itself."""
    monkeypatch.setattr(ledger_mod, "LEDGER_DIR", tmp_path)
    pid_file = tmp_path / "orphan.pid"
    subprocess.run([sys.executable, "-c", DAEMON, str(pid_file)], check=True)
    orphan = int(_wait_file(pid_file))
    child = _sleeper()
    try:
        led = ledger_mod.Ledger(path=tmp_path / "x.json", owner_pid=child.pid + 10**6, owner_start=0.0)
        led.pids = {"orphan": orphan, "child": child.pid}
        led.starts = {"orphan": psutil.Process(orphan).create_time(), "child": psutil.Process(child.pid).create_time()}
        assert sorted(led.sweep()) == [f"process child (pid {child.pid})", f"process orphan (pid {orphan})"]
        assert not _alive(orphan)
        with pytest.raises(ChildProcessError):  # already reaped: no zombie of this process is left
            os.waitpid(child.pid, os.WNOHANG)
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        child.kill()
        child.wait()


def test_add_pid_records_the_start_time(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_mod, "LEDGER_DIR", tmp_path)
    led = ledger_mod.Ledger.create("r", str(tmp_path))
    led.add_pid("me", os.getpid())
    back = ledger_mod.Ledger.read(led.path)
    assert back.starts["me"] == pytest.approx(psutil.Process().create_time())


@root_only
def test_the_next_run_sweeps_a_dead_runs_ledger_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_mod, "LEDGER_DIR", tmp_path / "ledger")
    monkeypatch.setattr(clean_mod, "stale_ledgers", ledger_mod.stale_ledgers)
    dead = subprocess.Popen(["true"])
    dead.wait()  # the dead runner: its pid is gone
    cg = RunCgroup(f"test-dead-{os.getpid()}")
    try:
        p = subprocess.Popen(["sleep", "600"], preexec_fn=cg.preexec)
        (tmp_path / "ledger").mkdir()
        led = ledger_mod.Ledger(
            path=tmp_path / "ledger" / "dead.json",
            owner_pid=dead.pid,
            owner_start=1.0,
            run_dir="",
            process_cgroup=str(cg.path),
        )
        led.save()
        lines = clean_mod.sweep_dead_runs()
        assert len(lines) == 1 and "had died" in lines[0] and "1 process" in lines[0], lines
        assert p.wait(timeout=5) == -signal.SIGKILL
        assert not cg.path.exists() and not led.path.exists()
        assert clean_mod.sweep_dead_runs() == []
    finally:
        kill_cgroup(cg.path)


def test_the_next_run_refuses_when_interfaces_of_a_lost_ledger_remain(tmp_path, monkeypatch):
    monkeypatch.setattr(clean_mod, "stale_ledgers", lambda: [])
    net = tmp_path / "net"  # stands for /sys/class/net
    for name in ("lo", "eth0", "h1-eth0", "tor1"):
        (net / name).mkdir(parents=True)
    with pytest.raises(TestbedError, match=r"h1-eth0, tor1.*testbed clean"):
        clean_mod.sweep_dead_runs(net)
    (net / "h1-eth0").rmdir()
    (net / "tor1").rmdir()
    assert clean_mod.sweep_dead_runs(net) == []


def test_an_interrupted_analysis_still_writes_its_summary(tmp_path, monkeypatch):
    from analysis import metrics

    run = tmp_path / "r"
    (run / "logs").mkdir(parents=True)
    (run / "spec.yaml").write_text("name: r\nworkload: {scheme: allreduce, iterations: 3}\n")
    (run / "processes.json").write_text(json.dumps({"processes": []}))

    def interrupt(*a, **k):
        raise KeyboardInterrupt()

    monkeypatch.setattr(metrics, "_cpu_section", interrupt)
    with pytest.raises(KeyboardInterrupt):
        metrics.summarize(run, status="ok")
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "interrupted"
    assert "interrupted" in s["error"] and "ended ok" in s["error"]
    assert s["run_id"] == "r" and "measured_iterations" in s  # what was computed before is kept


def test_logs_and_a_spec_with_a_program_environment_are_private(tmp_path):
    from testbed.spec import from_dict, write_spec
    from traffic import rundir

    d = rundir.create(tmp_path, "r")
    assert (d / "logs").stat().st_mode & 0o777 == 0o700
    with rundir.open_private(d / "logs" / "x.log") as f:
        f.write(b"token\n")
    assert (d / "logs" / "x.log").stat().st_mode & 0o777 == 0o600
    (tmp_path / "t.py").write_text("")
    exp = from_dict(
        {"workload": {"program": {"command": ["python", "t.py"], "cwd": str(tmp_path), "env": {"TOKEN": "s3cret"}}}}
    )
    write_spec(d / "spec.yaml", exp)
    assert (d / "spec.yaml").stat().st_mode & 0o777 == 0o600
    write_spec(d / "plain.yaml", from_dict({}))
    assert (d / "plain.yaml").stat().st_mode & 0o777 == 0o644 & ~_umask()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_runtime_processes_do_not_import_from_the_working_directory():
    from testbed.launch import runtime_command

    assert runtime_command(Path("/r"), "worker0")[:2] == [sys.executable, "-P"]


def test_python_P_ignores_a_module_in_the_working_directory(tmp_path):
    (tmp_path / "json.py").write_text("raise SystemExit('shadowed')\n")
    ok = subprocess.run([sys.executable, "-P", "-c", "import json"], cwd=tmp_path)
    assert ok.returncode == 0
    bad = subprocess.run([sys.executable, "-c", "import json"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0  # what -P protects against


def test_a_host_profile_error_never_shows_the_files_content(tmp_path):
    from traffic.hostmodel import load_host_profile

    for text in (
        "root:$y$SECRETHASH:19000:0:99999:7:::\n",
        "a: [1, 2\nb: SECRETLINE\n",
        "SECRETKEY: 1\n",
        "- SECRETITEM\n",
        "SECRETTWICE: 1\nSECRETTWICE: 2\n",
    ):
        f = tmp_path / "p.yaml"
        f.write_text(text)
        with pytest.raises(TestbedError) as e:
            load_host_profile(str(f))
        assert "SECRET" not in str(e.value), str(e.value)
        assert str(f) in str(e.value)


def test_a_yaml_syntax_error_names_the_place_but_never_quotes_the_line(tmp_path):
    from testbed.spec import load_spec

    f = tmp_path / "s.yaml"
    f.write_text("name: x\nworkload: [1, 2\nsecret: SECRETLINE\n")
    with pytest.raises(TestbedError) as e:
        load_spec(f)
    assert "line 3, column 7" in str(e.value) and str(f) in str(e.value)
    assert "SECRET" not in str(e.value)
