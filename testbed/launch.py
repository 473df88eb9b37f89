"""Launch one process per planned role and watch them until they all end.

The harness (Mininet hosts) and the local launcher (loopback, for tests and development)
share this module; they differ only in the ``popen`` used to start a command on a host.

A process that exits non-zero ends the whole run within ``poll_s`` seconds: the others are
killed and :class:`RunFailed` carries the dead process's log tail.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from testbed.interrupts import deferred_signals
from topologies.errors import RunFailed
from traffic.rundir import write_json


@dataclass
class Launched:
    """A started process: its plan entry, its Popen and its log file."""
    info: dict
    popen: subprocess.Popen
    log: Path


def write_processes(run_dir: Path, entries: list[dict], master_addr: str, master_port: int,
                    timeout_s: float) -> dict:
    """Write ``processes.json`` (see :mod:`traffic.rundir`) and return its content.

    ``entries``: dicts with name, role, index, host, rack, ip, iface; ranks are given in
    order. ``timeout_s``: the run's time limit (each process's torch.distributed timeout).
    """
    procs = [{**e, "rank": r} for r, e in enumerate(entries)]
    doc = {"world_size": len(procs), "master_addr": master_addr, "master_port": master_port,
           "timeout_s": timeout_s, "processes": procs}
    write_json(run_dir / "processes.json", doc)
    return doc


def runtime_command(run_dir: Path, name: str) -> list[str]:
    """The command that runs process ``name`` of a run (same interpreter as the harness)."""
    return [sys.executable, "-u", "-m", "traffic.runtime", str(run_dir), name]


def process_env(info: dict) -> dict:
    """Environment for one process: gloo bound to its host interface, one compute thread."""
    env = dict(os.environ)
    env.update({
        "GLOO_SOCKET_IFNAME": info["iface"],
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    # the project must be importable whatever the host's working directory is
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


PopenFn = Callable[[dict, list[str], dict, object], subprocess.Popen]


def local_popen(info: dict, cmd: list[str], env: dict, log) -> subprocess.Popen:
    """Start ``cmd`` on this machine (the local launcher's ``popen``)."""
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def start(run_dir: Path, doc: dict, popen: PopenFn = local_popen,
          on_start: Callable[[Launched], None] | None = None) -> list[Launched]:
    """Start every process of ``processes.json`` with ``popen``; logs go to ``logs/<name>.log``.

    ``on_start`` is called for each process as soon as it runs (the ledger records pids).
    """
    out = []
    for info in doc["processes"]:
        log_path = run_dir / "logs" / f"{info['name']}.log"
        with deferred_signals():  # a Ctrl-C here is delivered once the process is recorded
            with open(log_path, "ab") as log:
                p = popen(info, runtime_command(run_dir, info["name"]), process_env(info), log)
            launched = Launched(info, p, log_path)
            out.append(launched)
            if on_start:
                on_start(launched)
    return out


def log_tail(path: Path, lines: int = 25) -> str:
    """Last ``lines`` lines of a log file ('' if missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def watch(procs: list[Launched], timeout_s: float, poll_s: float = 0.2) -> None:
    """Wait until every process exits 0.

    Raises:
        RunFailed: a process exited non-zero (message has its log tail), or ``timeout_s``
            passed. The remaining processes are killed before raising.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        running = False
        failed = []
        for l in procs:
            rc = l.popen.poll()
            if rc is None:
                running = True
            elif rc != 0:
                failed.append((l, rc))
        if failed:
            # the first to fail is the cause; processes that fail because a peer died wait
            # before exiting (traffic.runtime), so they are seen later
            l, rc = failed[0]
            others = ", ".join(f.info["name"] for f, _ in failed[1:])
            kill_all(procs)
            how = f"was killed by signal {_signal_name(-rc)}" if rc < 0 else f"exited with code {rc}"
            raise RunFailed(f"process {l.info['name']} (role {l.info['role']} on host {l.info['host']}) "
                            f"{how}" + (f" (also failed: {others})" if others else "") +
                            f"; its log {l.log} ends with:\n{log_tail(l.log)}")
        if not running:
            return
        if time.monotonic() > deadline:
            alive = [l.info["name"] for l in procs if l.popen.poll() is None]
            kill_all(procs)
            raise RunFailed(f"run timed out after {timeout_s:.0f} s (run.timeout_s) with "
                            f"{', '.join(alive)} still running; logs are in {procs[0].log.parent}")
        time.sleep(poll_s)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def kill_all(procs: list[Launched], grace_s: float = 2.0) -> None:
    """SIGTERM every process group still running, then SIGKILL after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [l for l in procs if l.popen.poll() is None]
        for l in alive:
            try:
                os.killpg(l.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    l.popen.send_signal(sig)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + grace_s
        while alive and time.monotonic() < end:
            alive = [l for l in alive if l.popen.poll() is None]
            time.sleep(0.05)
        if not alive:
            return
