"""Launch one process per planned role and watch them until they all end.

The harness (Mininet hosts) and the local launcher (loopback, for tests and development)
share this module; they differ only in the ``popen`` used to start a command on a host and
in where a forked process goes (:class:`Fork`).

Two ways to start a process (``run.launcher``): ``zygote`` (the default) forks it from a
:class:`Zygote`, one process per run that has imported torch and the runtime once
(:mod:`traffic.runtime.zygote`), all of a run's processes in one batch (:func:`start`);
``exec`` runs ``python -m traffic.runtime`` in the host, each process importing everything
itself. A process bound to a host's second interface
(:func:`testbed.network.bind_to_interface`, run under another uid) always uses ``exec``.

A process that exits non-zero ends the whole run within ``poll_s`` seconds: the others are
killed and :class:`RunFailed` carries the dead process's log tail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from common.errors import RunFailed, SpecError, TestbedError
from testbed.interrupts import deferred_signals
from testbed.lifetime import tied_preexec
from traffic.rundir import open_private, write_json
from traffic.schemes.program import torchrun_env


@dataclass
class Launched:
    """A started process: its plan entry, its Popen (or :class:`ZygoteProcess`) and its log file."""

    info: dict
    popen: subprocess.Popen | ZygoteProcess
    log: Path


def process_entries(plan: list, topology: dict, program=None) -> list[dict]:
    """The ``processes.json`` entries (without ranks) of ``plan`` (the scheme's
    :class:`traffic.schemes.ProcessPlan` list) on the built network (``topology``: its
    ``topology.json`` document): each process's host, rack, interface address and name, and
    a ``workload.program``'s command.

    Raises:
        SpecError: the plan asks for an interface its host does not have.
    """
    by_name = {h["name"]: h for h in topology["hosts"]}
    extra = program_entry(program) if program else {}
    return [
        {
            "name": p.name,
            "role": p.role,
            "index": p.index,
            "host": p.host,
            "rack": by_name[p.host]["rack"],
            **_interface(by_name[p.host], p),
            **extra,
        }
        for p in plan
    ]


def _interface(host: dict, p) -> dict:
    """``{"ip", "iface", "iface_index"}`` of the interface ``p.iface`` of ``host`` (a
    topology.json host).

    Raises:
        SpecError: the plan asks for an interface the host does not have.
    """
    intfs = host["intfs"]
    if not 0 <= p.iface < len(intfs):
        raise SpecError(f"plan of {p.name}", p.iface, f"interfaces 0..{len(intfs) - 1} of host {host['name']}")
    return {"ip": intfs[p.iface]["ip"], "iface": intfs[p.iface]["name"], "iface_index": p.iface}


def write_processes(run_dir: Path, entries: list[dict], master_addr: str, master_port: int, timeout_s: float) -> dict:
    """Write ``processes.json`` (see :mod:`traffic.rundir`) and return its content.

    ``entries``: dicts with name, role, index, host, rack, ip, iface; ranks are given in
    order. ``timeout_s``: the run's time limit (each process's torch.distributed timeout).
    """
    procs = [{**e, "rank": r} for r, e in enumerate(entries)]
    doc = {
        "world_size": len(procs),
        "master_addr": master_addr,
        "master_port": master_port,
        "timeout_s": timeout_s,
        "processes": procs,
    }
    write_json(run_dir / "processes.json", doc)
    return doc


def runtime_command(run_dir: Path, name: str) -> list[str]:
    """The command that runs process ``name`` of a run (same interpreter as the harness)."""
    return [sys.executable, "-P", "-u", "-m", "traffic.runtime", str(run_dir), name]


def runtime_env() -> dict:
    """This process's environment for a runtime process (or the zygote): one compute thread,
    unbuffered output, and the project importable whatever the working directory is."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def process_env(info: dict) -> dict:
    """Environment for one process: :func:`runtime_env`, gloo bound to its host interface and
    connecting to a peer on first use (``TORCH_GLOO_LAZY_INIT``: no full mesh of
    connections at the rendezvous, which at many processes delays the first iteration)."""
    return {**runtime_env(), "GLOO_SOCKET_IFNAME": info["iface"], "TORCH_GLOO_LAZY_INIT": "1"}


PopenFn = Callable[[dict, list[str], dict, object], subprocess.Popen]


def local_popen(info: dict, cmd: list[str], env: dict, log) -> subprocess.Popen:
    """Start ``cmd`` on this machine (the local launcher's ``popen``), in ``info["cwd"]`` if given."""
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=info.get("cwd"),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def program_command(command: list[str]) -> list[str]:
    """A ``workload.program`` command as run: ``python``/``python3`` first means this
    interpreter (the one with torch and the project)."""
    return [sys.executable, *command[1:]] if command[0] in ("python", "python3") else list(command)


def program_entry(program) -> dict:
    """The ``processes.json`` fields of a ``workload.program`` process (``program``: its
    :class:`traffic.spec.ProgramSpec`): ``command`` as run (:func:`program_command`) and
    ``cwd``, its working directory made absolute."""
    return {"command": program_command(program.command), "cwd": str(Path(program.cwd or ".").resolve())}


def program_env(info: dict, doc: dict, run_dir: Path, program) -> dict:
    """Environment of one process of a ``workload.program`` (``program``: its
    :class:`traffic.spec.ProgramSpec`): :func:`runtime_env` (one compute thread, the project
    importable for :mod:`traffic.marks`), ``torchrun``'s variables on the emulated network
    (:func:`traffic.schemes.program.torchrun_env`), ``TESTBED_EVENTS`` (where
    :mod:`traffic.marks` writes), ``TESTBED_PROC`` and ``TESTBED_RUN_DIR``, then
    ``program.env`` over all of them."""
    return {
        **runtime_env(),
        **torchrun_env(info, doc, program.processes_per_host),
        "TESTBED_EVENTS": str(run_dir / "events" / f"{info['name']}.jsonl"),
        "TESTBED_PROC": info["name"],
        "TESTBED_RUN_DIR": str(run_dir),
        **program.env,
    }


@dataclass
class Fork:
    """Processes forked from a :class:`Zygote` instead of started by ``popen``: ``zygote``,
    and ``target(info)`` for a process (a ``processes.json`` entry): ``(netns_pid, cgroup)``,
    the network namespace (the pid of a process in it; None: the zygote's) and the
    ``cgroup.procs`` file (None: none) its child enters, or None when that process is
    started by ``popen`` instead (one bound to a host's second interface)."""

    zygote: Zygote
    target: Callable[[dict], tuple[int | None, str | None] | None]


def start(
    run_dir: Path,
    doc: dict,
    popen: PopenFn = local_popen,
    on_start: Callable[[list[Launched]], None] | None = None,
    env_for: Callable[[dict], dict] | None = None,
    fork: Fork | None = None,
) -> list[Launched]:
    """Start every process of ``processes.json``; logs go to ``logs/<name>.log``.

    A process runs its entry's ``command`` if it has one (a ``workload.program``), else the
    runtime (:func:`runtime_command`); its environment is ``env_for(entry)``, by default
    :func:`process_env`. With ``fork``, the processes it targets are forked from its zygote
    as one batch (:meth:`Zygote.spawn`: one request, and none of them runs before
    ``on_start`` has returned); the others are started one by one with ``popen``.
    ``on_start`` is called with each batch of started processes (a process started by
    ``popen`` is a batch of one) as soon as they exist, so that the ledger records their
    pids with one write per batch, so that a launch does not grow by a request and a ledger
    write per process (``benchmarks/launch.py`` measures it; figures in ``docs/scaling.md``).

    Raises:
        TestbedError: the zygote could not fork the batch (nothing of it runs).
    """
    out = []

    def started(batch: list[Launched]) -> None:
        out.extend(batch)
        if on_start:
            on_start(batch)

    forked = []
    for info in doc["processes"]:
        log_path = run_dir / "logs" / f"{info['name']}.log"
        cmd = info.get("command") or runtime_command(run_dir, info["name"])
        env = (env_for or process_env)(info)
        target = fork.target(info) if fork is not None else None
        if target is not None:
            open_private(log_path).close()  # the child appends to it
            forked.append((info, env, log_path, target))
            continue
        with deferred_signals():  # a Ctrl-C here is delivered once the process is recorded
            with open_private(log_path) as log:
                p = popen(info, cmd, env, log)
            started([Launched(info, p, log_path)])
    if forked:
        reqs = [
            {
                "name": info["name"],
                "run_dir": str(run_dir),
                "netns_pid": netns_pid,
                "env": env,
                "log": str(log_path.resolve()),
                "cgroup": cgroup,
            }
            for info, env, log_path, (netns_pid, cgroup) in forked
        ]
        with deferred_signals():
            fork.zygote.spawn(
                reqs,
                lambda procs: started(
                    [Launched(info, p, log_path) for (info, _, log_path, _), p in zip(forked, procs)]
                ),
            )
    return out


class ZygoteProcess:
    """A process forked by a :class:`Zygote`: the part of ``subprocess.Popen`` that
    :func:`watch` and :func:`kill_all` use (``pid``, ``returncode``, ``poll``, ``wait``,
    ``send_signal``, ``kill``). Its exit status comes from the zygote, its parent."""

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid = zygote, pid

    @property
    def returncode(self) -> int | None:
        return self.zygote.exits.get(self.pid)

    def poll(self) -> int | None:
        rc = self.returncode
        if rc is None and not self.zygote.alive() and not psutil.pid_exists(self.pid):
            return -signal.SIGKILL  # the zygote died before reporting: the process is gone
        return rc

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.poll()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One :mod:`traffic.runtime.zygote` process of a run (or of a whole sweep: its points
    share it), started in this (the root) network namespace; :meth:`spawn` forks a batch of
    training processes from it, each into its host's namespace.

    Start it early (``start()`` returns at once; the imports overlap the network's build);
    :meth:`spawn` waits until it is ready. ``close()`` ends it (its children are the run's,
    stopped by the teardown like any other process).

    Args:
        on_pid: called with the zygote's pid once it runs (the run's ledger).
        ready_timeout_s: how long :meth:`spawn` waits for the imports.
        netns: it serves Mininet hosts (the harness's; ``--netns`` on its command line, which
            ``testbed clean`` recognizes); false for the local launcher's.
        join: run in the zygote between fork and exec (the run's cgroup's
            :meth:`testbed.lifetime.RunCgroup.preexec`: its children are born in it).

    Raises:
        TestbedError (from :meth:`spawn`): the zygote died or did not get ready in time, or
            refused a request; the message has its output.
    """

    def __init__(
        self,
        on_pid: Callable[[int], None] | None = None,
        ready_timeout_s: float = 120.0,
        netns: bool = True,
        join: Callable[[], None] | None = None,
    ):
        self.on_pid = on_pid
        self.join = join
        self.netns = netns
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.exits: dict[int, int] = {}
        self.import_s: float | None = None
        self._replies: list[dict] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._stderr: list[str] = []

    def start(self) -> Zygote:
        env = runtime_env()
        with deferred_signals():
            cmd = [sys.executable, "-P", "-u", "-m", "traffic.runtime.zygote"] + (["--netns"] if self.netns else [])
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
                preexec_fn=tied_preexec(self.join),
            )
            if self.on_pid:
                self.on_pid(self.proc.pid)
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_stderr, name="zygote-stderr", daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if msg.get("op") == "exit":
                    self.exits[int(msg["pid"])] = int(msg["status"])
                else:
                    # a zygote serving several runs may give an earlier child's pid again: that
                    # child's exit came before this reply, the new one's can only come after
                    for pid in msg.get("pids", []) if msg.get("op") == "spawned" else ():
                        self.exits.pop(int(pid), None)
                    if msg.get("op") == "ready":
                        self.import_s = msg.get("import_s")
                    self._replies.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line.decode(errors="replace"))
            del self._stderr[:-50]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _reply(self, op_ok: str, timeout_s: float) -> dict:
        end = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for i, m in enumerate(self._replies):
                    if m.get("op") in (op_ok, "error"):
                        return self._replies.pop(i)
                if not self.alive() and not self._replies:
                    raise TestbedError(
                        f"the zygote (pid {self.proc.pid}) exited with code {self.proc.poll()}: "
                        + "".join(self._stderr)[-2000:]
                    )
                left = end - time.monotonic()
                if left <= 0:
                    raise TestbedError(
                        f"the zygote did not answer within {timeout_s:.0f} s: " + "".join(self._stderr)[-2000:]
                    )
                self._cond.wait(min(left, 0.5))

    def _send(self, req: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # reported by _reply: the zygote is gone

    def spawn(self, reqs: list[dict], on_forked: Callable[[list[ZygoteProcess]], None]) -> list[ZygoteProcess]:
        """Fork one process per request (the protocol's ``spawn`` items of
        :mod:`traffic.runtime.zygote`: ``name``, ``run_dir``, ``netns_pid``, ``env``, ``log``,
        ``cgroup``) in one round trip, call ``on_forked`` with them (in the order of
        ``reqs``) while they wait, then let them run. If ``on_forked`` raises, they are
        killed before they run anything and the exception propagates.

        Raises:
            TestbedError: the zygote died, did not answer, or could not fork one of them (those
                forked before it exit without running); the message names the process.
        """
        if self.import_s is None:
            self._reply("ready", self.ready_timeout_s)
        self._send({"op": "spawn", "procs": reqs})
        msg = self._reply("spawned", 30.0 + 0.5 * len(reqs))
        if msg["op"] == "error":
            what = f"fork {msg['name']}" if msg.get("name") else f"serve a batch of {len(reqs)} processes"
            raise TestbedError(f"the zygote could not {what} (none of the batch runs): {msg.get('error')}")
        procs = [ZygoteProcess(self, int(pid)) for pid in msg["pids"]]
        try:
            on_forked(procs)
        except BaseException:
            for p in procs:
                p.kill()  # waiting on their gate: nothing of theirs ran
            raise
        self._send({"op": "start", "batch": msg["batch"]})
        msg = self._reply("started", 30.0)
        if msg["op"] == "error":
            raise TestbedError(f"the zygote could not start a batch of {len(reqs)} processes: {msg.get('error')}")
        return procs

    def close(self) -> None:
        """End the zygote (idempotent): close its stdin, then SIGKILL if it lingers."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def log_tail(path: Path, lines: int = 25) -> str:
    """Last ``lines`` lines of a log file ('' if missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def watch(
    procs: list[Launched],
    timeout_s: float,
    poll_s: float = 0.2,
    on_poll: Callable[[], None] | None = None,
    killed: Callable[[], dict[str, str]] | None = None,
) -> None:
    """Wait until every process exits 0; ``on_poll`` is called at every poll (a progress
    display; it must be quick). ``killed()`` names the processes the run killed on purpose
    (a scheduled ``kill`` event), each with why: their deaths do not fail the run; a
    survivor that fails after one names it as the likely cause.

    When it returns or raises, every process's exit status is written to ``exits.json`` in
    the directory of their logs (the run's ``logs/``): ``{name: {"exit_code": its status,
    negative for the signal that killed it, null if still running; "killed": why the run
    killed it on purpose, or null}}`` (not written when the disk is full).

    Raises:
        RunFailed: a process exited non-zero (message has its log tail), or ``timeout_s``
            passed. The remaining processes are killed before raising.
    """
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            running = False
            failed = []
            planned = killed() if killed is not None else {}
            for l in procs:
                rc = l.popen.poll()
                if rc is None:
                    running = True
                elif rc != 0 and l.info["name"] not in planned:
                    failed.append((l, rc))
            if failed:
                # the first to fail is the cause; processes that fail because a peer died wait
                # before exiting (traffic.runtime), so they are seen later
                l, rc = failed[0]
                others = ", ".join(f.info["name"] for f, _ in failed[1:])
                kill_all(procs)
                how = f"was killed by signal {_signal_name(-rc)}" if rc < 0 else f"exited with code {rc}"
                after = "; ".join(f"{n} {why}" for n, why in planned.items())
                raise RunFailed(
                    f"process {l.info['name']} (role {l.info['role']} on host {l.info['host']}) "
                    f"{how}"
                    + (f" (also failed: {others})" if others else "")
                    + (f" after {after}" if after else "")
                    + f"; its log {l.log} ends with:\n{log_tail(l.log)}"
                )
            if not running:
                return
            if on_poll is not None:
                on_poll()
            if time.monotonic() > deadline:
                alive = [l.info["name"] for l in procs if l.popen.poll() is None]
                kill_all(procs)
                raise RunFailed(
                    f"run timed out after {timeout_s:.0f} s (run.timeout_s) with "
                    f"{', '.join(alive)} still running; logs are in {procs[0].log.parent}"
                )
            time.sleep(poll_s)
    finally:
        if procs:
            why = killed() if killed is not None else {}
            try:
                write_json(
                    procs[0].log.parent / "exits.json",
                    {l.info["name"]: {"exit_code": l.popen.poll(), "killed": why.get(l.info["name"])} for l in procs},
                )
            except OSError:
                pass


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
