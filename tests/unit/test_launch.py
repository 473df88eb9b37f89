"""Launching a run's processes as one batch forked from the zygote (testbed.launch,
traffic.runtime.zygote): every pid is in the ledger before any child runs, and a child that
fails is reported with its log. On loopback, no Mininet, no root."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from common.errors import RunFailed, TestbedError
from testbed import launch
from testbed import ledger as ledger_mod
from testbed.loopback import free_port
from testbed.spec import dump_spec, from_dict, with_scale
from traffic import rundir


@pytest.fixture(scope="module")
def zygote():
    z = launch.Zygote(netns=False).start()
    yield z
    z.close()


def _run_dir(tmp_path: Path, workers: int, spec: bool = True) -> tuple[Path, dict]:
    """A loopback run directory of ``workers`` allreduce workers (no ``spec.yaml`` unless ``spec``)."""
    run_dir = rundir.create(tmp_path, "run")
    if spec:
        exp = with_scale(
            from_dict(
                {
                    "topology": {"kind": "rack", "hosts_per_rack": workers},
                    "workload": {"scheme": "allreduce", "workers": workers, "iterations": 2, "warmup_iterations": 1},
                    "run": {"timeout_s": 60},
                }
            ),
            1.0,
        )
        (run_dir / "spec.yaml").write_text(dump_spec(exp))
    entries = [
        {
            "name": f"worker{i}",
            "role": "worker",
            "index": i,
            "host": f"h{i + 1}",
            "rack": 0,
            "ip": "127.0.0.1",
            "iface": "lo",
        }
        for i in range(workers)
    ]
    return run_dir, launch.write_processes(run_dir, entries, "127.0.0.1", free_port(), timeout_s=60)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_batch_records_each_childs_own_pid_in_the_ledger_before_any_runs(tmp_path, monkeypatch, zygote):
    monkeypatch.setattr(ledger_mod, "LEDGER_DIR", tmp_path / "ledger")
    led = ledger_mod.Ledger.create("run", str(tmp_path))
    run_dir, doc = _run_dir(tmp_path, 3, spec=False)  # each child fails at once when it runs: no spec.yaml
    seen = []

    def on_start(batch: list[launch.Launched]) -> None:
        led.add_pids({l.info["name"]: l.popen.pid for l in batch})
        back = ledger_mod.Ledger.read(led.path)  # what a sweep after a kill -9 of the harness would read
        seen.append((batch, back, [l.log.read_text() for l in batch], [_alive(l.popen.pid) for l in batch]))

    procs = launch.start(run_dir, doc, on_start=on_start, fork=launch.Fork(zygote, lambda info: (None, None)))
    assert len(seen) == 1  # one batch, one ledger write
    batch, back, logs, alive = seen[0]
    assert [l.info["name"] for l in batch] == ["worker0", "worker1", "worker2"] == [l.info["name"] for l in procs]
    pids = [l.popen.pid for l in batch]
    assert len(set(pids)) == 3
    assert back.pids == {"worker0": pids[0], "worker1": pids[1], "worker2": pids[2]}
    assert set(back.starts) == set(back.pids)
    assert alive == [True, True, True] and logs == ["", "", ""]  # forked, waiting: nothing of the run ran yet
    for l in procs:  # once started, each runs (and fails: no spec.yaml), writing its own log
        assert l.popen.wait(30) == 1
        assert "spec.yaml" in l.log.read_text()


def test_a_child_that_fails_in_a_batch_is_reported_with_its_log(tmp_path, zygote):
    run_dir, doc = _run_dir(tmp_path, 3)
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1

    def target(info: dict):  # worker1 cannot enter its (missing) network namespace
        return (no_such_pid, None) if info["name"] == "worker1" else (None, None)

    procs = launch.start(run_dir, doc, fork=launch.Fork(zygote, target))
    try:
        with pytest.raises(RunFailed) as err:  # the others wait for worker1 at the rendezvous
            launch.watch(procs, timeout_s=60, poll_s=0.05)
    finally:
        launch.kill_all(procs)
    msg = str(err.value)
    assert msg.startswith("process worker1 (role worker on host h2) exited with code 1")
    assert str(run_dir / "logs" / "worker1.log") in msg
    assert f"/proc/{no_such_pid}/ns/net" in msg  # its log's tail: the failed setns
    assert not any(_alive(l.popen.pid) for l in procs)


def test_a_batch_whose_recording_fails_never_runs(tmp_path, zygote):
    run_dir, doc = _run_dir(tmp_path, 2)
    forked = []

    def on_start(batch: list[launch.Launched]) -> None:
        forked.extend(batch)
        raise OSError("No space left on device")  # the ledger could not be written

    with pytest.raises(OSError, match="No space left"):
        launch.start(run_dir, doc, on_start=on_start, fork=launch.Fork(zygote, lambda info: (None, None)))
    assert len(forked) == 2
    for l in forked:
        assert l.popen.wait(30) == -9
        assert l.log.read_text() == ""
    assert list((run_dir / "events").glob("*")) == []


def test_a_request_the_zygote_refuses_raises_and_the_zygote_serves_on(tmp_path, zygote):
    run_dir, doc = _run_dir(tmp_path, 1, spec=False)
    with pytest.raises(TestbedError, match="the zygote could not"):
        zygote.spawn("worker0", lambda procs: None)  # type: ignore[arg-type]  (not a list of requests)
    procs = launch.start(run_dir, doc, fork=launch.Fork(zygote, lambda info: (None, None)))
    assert procs[0].popen.wait(30) == 1  # served: it ran (and failed, no spec.yaml)
    assert "spec.yaml" in procs[0].log.read_text()
