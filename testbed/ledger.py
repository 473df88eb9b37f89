"""A ledger of what a run creates on the machine, so that teardown and ``testbed clean``
remove exactly that, even after the harness was killed.

``mn -c`` is no substitute: it misses Linux bridges and deletes ``/tmp/*.log``. Each live
run keeps one JSON file in ``LEDGER_DIR`` (``/run/testbed/ledger``, a tmpfs that a reboot
clears along with the namespaces) listing the bridges and interfaces it plans to create (all
names are known from the Topo before anything is built), and the pids of the processes it
starts (Mininet host shells, training processes, bwm-ng, iperf3) with their start times, the
cgroup that holds all of them (:mod:`testbed.lifetime`) and the cgroups it makes (a
straggler's, :mod:`testbed.cgroups`). A pid is signalled only while its start time is the
one recorded: pids are reused. The file is removed when
teardown completes; a file whose owner is dead (its pid gone, or reused by a process that
started later) marks a run that needs cleaning.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from pyroute2 import IPRoute, NetlinkError

from common.errors import TestbedError
from testbed.lifetime import kill_cgroup

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))
LEDGER_DIR = STATE_DIR / "ledger"
LOCK_PATH = STATE_DIR / "network.lock"

log = logging.getLogger(__name__)
_SAVE_LOCK = threading.Lock()


@dataclass
class Ledger:
    """What one run created. Every ``add_*`` persists the file immediately."""

    path: Path
    owner_pid: int = field(default_factory=os.getpid)
    owner_start: float | None = field(default_factory=lambda: _start_time(os.getpid()))
    """The owner's start time (``psutil.Process.create_time``, unix s), to tell a dead owner
    whose pid was reused from a live one; None in ledgers written before it was recorded."""
    run_dir: str = ""
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    starts: dict[str, float] = field(default_factory=dict)
    """Start time of each process of :attr:`pids` (``psutil.Process.create_time``, unix s):
    a pid whose process started at another time is not the run's and is never signalled."""
    process_cgroup: str = ""
    """The cgroup holding every process of the run on this machine (:class:`testbed.lifetime.RunCgroup`)."""
    shared: list[str] = field(default_factory=list)
    """Names in ``pids`` that the owner still uses after this run (a sweep's zygote): only a
    sweep by another process (``testbed clean`` of a dead owner) kills them."""
    cgroups: list[str] = field(default_factory=list)
    """Paths of the cgroups the run made (:mod:`testbed.cgroups`)."""
    machines: dict[str, dict] = field(default_factory=dict)
    """A cluster run's other machines, address -> what the run made there:
    ``{"ssh": [ssh and its options], "dest": "user@addr", "bridges": [...], "interfaces":
    [...], "pids": {name: pid there}, "staging": the directory its processes write}``;
    :meth:`sweep` removes them over SSH (:func:`remote_sweep_script`)."""

    @classmethod
    def create(cls, run_id: str, run_dir: str) -> Ledger:
        LEDGER_DIR.mkdir(parents=True, exist_ok=True)
        led = cls(path=LEDGER_DIR / f"{run_id}-{os.getpid()}.json", run_dir=str(run_dir))
        led.save()
        return led

    @classmethod
    def read(cls, path: Path) -> Ledger:
        d = json.loads(path.read_text())
        return cls(
            path=path,
            owner_pid=d["owner_pid"],
            owner_start=d.get("owner_start"),
            run_dir=d.get("run_dir", ""),
            bridges=d.get("bridges", []),
            interfaces=d.get("interfaces", []),
            pids={k: int(v) for k, v in d.get("pids", {}).items()},
            starts={k: float(v) for k, v in d.get("starts", {}).items()},
            process_cgroup=d.get("process_cgroup", ""),
            shared=d.get("shared", []),
            cgroups=d.get("cgroups", []),
            machines=d.get("machines", {}),
        )

    def save(self) -> None:
        with _SAVE_LOCK:  # capture threads record pids too (a tcpdump started on a timer)
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "owner_pid": self.owner_pid,
                    "owner_start": self.owner_start,
                    "run_dir": self.run_dir,
                    "bridges": self.bridges,
                    "interfaces": self.interfaces,
                    "pids": self.pids,
                    "starts": self.starts,
                    "process_cgroup": self.process_cgroup,
                    "shared": self.shared,
                    "cgroups": self.cgroups,
                    "machines": self.machines,
                },
                indent=1,
            )
        )
        os.replace(tmp, self.path)

    def add_bridges(self, names) -> None:
        self.bridges += [n for n in names if n not in self.bridges]
        self.save()

    def add_interfaces(self, names) -> None:
        self.interfaces += [n for n in names if n not in self.interfaces]
        self.save()

    def add_pid(self, what: str, pid: int, shared: bool = False) -> None:
        """Record process ``what``; ``shared``: the owner goes on using it after this run
        (:attr:`shared`)."""
        if shared and what not in self.shared:
            self.shared.append(what)
        self.add_pids({what: pid})

    def add_pids(self, pids: dict[str, int]) -> None:
        """Record processes (name -> pid) with their start times, in one write of the file
        (a batch of 128 forked processes: one write instead of 128 growing ones)."""
        for what, pid in pids.items():
            self.pids[what] = int(pid)
            start = _start_time(int(pid))
            if start is not None:
                self.starts[what] = start
        self.save()

    def set_process_cgroup(self, path: str) -> None:
        """Record the cgroup of the run's processes (before the first one starts)."""
        self.process_cgroup = str(path)
        self.save()

    def add_cgroup(self, path: str) -> None:
        """Record a cgroup the run made (removed by :meth:`sweep` if still there)."""
        if path not in self.cgroups:
            self.cgroups.append(path)
        self.save()

    def add_machine(self, addr: str, ssh: list[str], dest: str, staging: str, bridges=(), interfaces=()) -> None:
        """Record another machine of a cluster run before anything is made there: how to
        reach it (``ssh``: the command and its options, ``dest``: ``user@addr``), the
        directory its processes write (``staging``) and the bridges and interfaces the run
        will make there."""
        self.machines[addr] = {
            "ssh": list(ssh),
            "dest": dest,
            "staging": staging,
            "bridges": list(bridges),
            "interfaces": list(interfaces),
            "pids": {},
        }
        self.save()

    def add_remote_pid(self, addr: str, what: str, pid: int) -> None:
        """Record process ``what`` (its pid on machine ``addr``)."""
        self.machines[addr]["pids"][what] = int(pid)
        self.save()

    def owner_alive(self) -> bool:
        """True if the harness that wrote this ledger still runs (and is not this process)."""
        if self.owner_pid == os.getpid():
            return False
        start = _start_time(self.owner_pid)
        if start is None:
            return False
        return self.owner_start is None or abs(start - self.owner_start) < 0.5

    def owner_processes(self) -> set[int]:
        """Pids of the live owner and all its descendants (empty if the owner is dead): the
        processes a live run started, recorded in the ledger yet or not."""
        if not self.owner_alive():
            return set()
        try:
            root = psutil.Process(self.owner_pid)
            return {root.pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def sweep(self, keep_file: bool = False) -> list[str]:
        """Kill every process of the run's cgroup and every recorded process still running with
        its recorded start time (and its descendants), kill and delete every recorded cgroup,
        delete every interface and bridge that still exists, then remove the ledger file. The
        owner's own sweep leaves its :attr:`shared` processes running; anyone else's kills them too.
        ``keep_file``: the owner keeps the (now empty) ledger until the run's summary is written,
        so that if it dies while analysing, the next run or ``testbed clean`` writes the summary.

        Returns:
            what was removed, one line each (empty if nothing was left).
        """
        removed = []
        own = self.owner_pid == os.getpid()
        if self.process_cgroup:
            removed += [f"process {line} (in the run's cgroup)" for line in kill_cgroup(self.process_cgroup)]
        for what, pid in self.pids.items():
            if own and what in self.shared:
                continue
            if _kill_tree(pid, self.starts.get(what)):
                removed.append(f"process {what} (pid {pid})")
        for path in self.cgroups:  # a straggler's: its processes are the run's, and die with it
            existed = Path(path).is_dir()
            removed += [f"process {line} (in cgroup {path})" for line in kill_cgroup(path)]
            if existed and not Path(path).exists():
                removed.append(f"cgroup {path}")
        if self.interfaces or self.bridges:
            with IPRoute() as ipr:
                for name in self.interfaces + self.bridges:
                    bridge = name in self.bridges
                    if delete_link(ipr, name, bridge=bridge):
                        removed.append(f"{'bridge' if bridge else 'interface'} {name}")
        unreached = False
        for addr, entry in self.machines.items():
            try:
                removed += [f"{addr}: {line}" for line in sweep_machine(entry)]
                if self.run_dir and Path(self.run_dir).is_dir():
                    fetch_staging(entry, Path(self.run_dir) / "machines" / addr)
            except TestbedError as e:
                unreached = True
                removed.append(f"{addr}: NOT cleaned ({e}); the ledger {self.path} is kept for 'testbed clean'")
        self.pids, self.starts, self.cgroups, self.process_cgroup = {}, {}, [], ""
        self.bridges, self.interfaces = [], []
        if not unreached and not keep_file:
            self.path.unlink(missing_ok=True)
        elif not unreached:
            self.save()
        return removed


def own_pattern(text: str) -> str:
    """A ``pgrep -f`` pattern (extended regular expression) matching ``text`` literally that
    does not match a command line holding the pattern itself: ``[/]runs/x`` finds ``/runs/x``
    but not the shell running ``pgrep -f '[/]runs/x'``."""
    escaped = re.escape(text)
    return "[" + escaped[0] + "]" + escaped[1:] if escaped[:1].isalnum() or escaped[:1] == "/" else escaped


def remote_sweep_script(entry: dict) -> str:
    """The shell script that removes, on another machine, what a run made there (an entry of
    :attr:`Ledger.machines`): every process whose command line names the run's staging
    directory (its training processes, its capture agent and bwm-ng), the recorded
    processes (the Mininet host shells; their namespaces go with them), then the recorded
    interfaces and bridges. It prints one line per thing it removed."""
    q = shlex.quote
    staging = entry.get("staging") or ""
    lines = ["set +e"]
    if staging:
        pattern = own_pattern(staging)
        lines.append(
            f"for p in $(pgrep -f -- {q(pattern)}); do "
            'kill -KILL $p 2>/dev/null && echo "process $p (of the run)"; done'
        )
    for what, pid in entry.get("pids", {}).items():
        lines.append(
            f"kill -0 {int(pid)} 2>/dev/null && kill -KILL {int(pid)} && echo {q(f'process {what} (pid {pid})')}"
        )
    for name in entry.get("interfaces", []):
        lines.append(
            f"ip link show dev {q(name)} >/dev/null 2>&1 && ip link del dev {q(name)} 2>/dev/null "
            f"&& echo {q('interface ' + name)}"
        )
    for name in entry.get("bridges", []):
        lines.append(
            f"ip link show dev {q(name)} >/dev/null 2>&1 && ip link set dev {q(name)} down && "
            f"ip link del dev {q(name)} 2>/dev/null && echo {q('bridge ' + name)}"
        )
    lines.append("true")
    return "\n".join(lines)


def fetch_staging(entry: dict, dest: Path, timeout_s: float = 300) -> bool:
    """Copy the staging directory of a machine (an entry of :attr:`Ledger.machines`) into
    ``dest`` (created) over SSH (``tar``), then remove it there; False if there was none.

    Raises:
        TestbedError: the machine was not reached, or the copy failed (the staging directory
            is then left where it is).
    """
    staging = entry.get("staging") or ""
    if not (staging.startswith("/") and "@" in Path(staging).name and Path(staging).name.startswith(".")):
        return False  # not a staging directory this harness names: never remove it
    q = shlex.quote(staging)
    ssh = [*entry["ssh"], entry["dest"]]
    try:
        probe = subprocess.run(
            [*ssh, f"test -d {q} && echo yes || echo no"], capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 255:
            raise TestbedError(f"ssh {entry['dest']}: {probe.stderr.strip()}")
        if probe.stdout.strip() != "yes":
            return False
        dest.mkdir(parents=True, exist_ok=True)
        src = subprocess.Popen([*ssh, f"tar -C {q} -cf - ."], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        untar = subprocess.run(
            ["tar", "-C", str(dest), "-xf", "-"], stdin=src.stdout, capture_output=True, timeout=timeout_s
        )
        src.stdout.close()
        src.wait(timeout=timeout_s)
        if src.returncode != 0 or untar.returncode != 0:
            raise TestbedError(
                f"copying {entry['dest']}:{staging} failed: "
                f"{src.stderr.read().decode(errors='replace').strip()} {untar.stderr.decode(errors='replace').strip()}"
            )
        subprocess.run([*ssh, f"rm -rf -- {q}"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TestbedError(f"copying {entry['dest']}:{staging}: {e}") from None
    return True


def sweep_machine(entry: dict, timeout_s: float = 60) -> list[str]:
    """Run :func:`remote_sweep_script` on the machine of ``entry`` over SSH; what it removed.

    Raises:
        TestbedError: the machine was not reached (SSH failed or timed out).
    """
    try:
        r = subprocess.run(
            [*entry["ssh"], entry["dest"], "sh -s"],
            input=remote_sweep_script(entry),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TestbedError(f"ssh {entry.get('dest')}: {e}") from None
    if r.returncode == 255:
        raise TestbedError(f"ssh {entry.get('dest')}: {r.stderr.strip()}")
    return [line for line in r.stdout.splitlines() if line.strip()]


def delete_link(ipr: IPRoute, name: str, bridge: bool = False) -> bool:
    """Delete the link ``name`` of this network namespace through ``ipr`` (a bridge is
    brought down first); True if it was deleted, False if there is no such link (also when
    it vanished meanwhile, e.g. with its veth peer). Any other refusal of the kernel is
    logged, not raised, so that a cleanup goes on with the next object."""
    indices = ipr.link_lookup(ifname=name)
    if not indices:
        return False
    try:
        if bridge:
            ipr.link("set", index=indices[0], state="down")
        ipr.link("del", index=indices[0])
    except NetlinkError as e:
        if e.code != errno.ENODEV:
            log.warning("could not delete link %s: %s", name, e)
        return False
    return True


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _kill_tree(pid: int, start: float | None = None, check_start: bool = True) -> bool:
    """SIGKILL ``pid`` and all its descendants; True if anything was killed. With
    ``check_start`` (a pid read from a ledger), only if the process started at ``start``
    (``psutil.Process.create_time``, unix s; a pid is reused by unrelated processes, and a
    ledger without start times signals nothing)."""
    try:
        root = psutil.Process(pid)
        if check_start and (start is None or abs(root.create_time() - start) > 0.01):
            return False
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _wait_dead(procs, timeout_s=3.0)
    return True


def _dead(p: psutil.Process) -> bool:
    """Whether ``p`` has exited: gone, or a zombie (reaped here when it is this process's child)."""
    try:
        if p.ppid() == os.getpid():
            try:
                return os.waitpid(p.pid, os.WNOHANG)[0] != 0
            except ChildProcessError:
                return True
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> None:
    """Wait until every process of ``procs`` has exited, for at most ``timeout_s`` seconds. A
    zombie has exited: it holds no memory, file or namespace, only its pid until its parent
    reaps it, and the parent of an orphan is the machine's init, which may reap it only seconds
    later (``psutil.wait_procs`` waits for that: about 2 s an orphan on a machine whose init
    reaps every 2 s)."""
    deadline = time.monotonic() + timeout_s
    while not all(_dead(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)


def all_ledgers() -> list[Ledger]:
    """Every ledger on the machine (an unreadable one is deleted: it lists nothing usable)."""
    if not LEDGER_DIR.is_dir():
        return []
    out = []
    for p in sorted(LEDGER_DIR.glob("*.json")):
        try:
            out.append(Ledger.read(p))
        except (OSError, ValueError, KeyError, TypeError):
            p.unlink(missing_ok=True)
    return out


def stale_ledgers() -> list[Ledger]:
    """Ledgers of runs whose harness is gone."""
    return [led for led in all_ledgers() if not led.owner_alive()]


def live_ledgers() -> list[Ledger]:
    """Ledgers of runs whose harness still runs."""
    return [led for led in all_ledgers() if led.owner_alive()]


def lock_holder() -> dict | None:
    """Who holds the network lock: ``{"pid", "run_dir", "since"}`` (``since``: unix s), or
    None when no live process holds it."""
    try:
        fd = open(LOCK_PATH)
    except OSError:
        return None
    with fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held exclusively: read who holds it
            text = fd.read().strip()
            try:
                d = json.loads(text)
                return d if isinstance(d, dict) else {"pid": d, "run_dir": "", "since": None}
            except ValueError:
                return {"pid": text or "unknown", "run_dir": "", "since": None}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None


def describe_holder(holder: dict) -> str:
    """``run runs/x (pid 123, since 12:00:03)`` for a :func:`lock_holder` result."""
    since = time.strftime("%H:%M:%S", time.localtime(holder["since"])) if holder.get("since") else "?"
    what = f"run {holder['run_dir']}" if holder.get("run_dir") else "a run"
    return f"{what} (pid {holder.get('pid')}, since {since})"


class NetworkLock:
    """An exclusive lock on the machine's emulation: one network at a time.

    Interface names (``h1-eth0``, ``tor1``...) are the same in every run, so two runs at
    once would collide; the lock makes the second one fail clearly, naming the run that holds
    it. The lock file records the holder (pid, run or sweep directory, since when). A process
    that holds the lock may enter it again (a sweep holds it across its runs; each run enters
    it too and names itself as the holder).

    Args:
        wait_s: how long to wait for another holder to finish, seconds.
        run_dir: the run (or sweep) directory to name as the holder ('' before it exists).

    Raises:
        TestbedError: another run holds the lock after ``wait_s`` seconds.
    """

    _held: NetworkLock | None = None  # this process's outermost holder
    _depth = 0

    def __init__(self, wait_s: float = 0.0, run_dir: str | Path = ""):
        self.wait_s = wait_s
        self.run_dir = str(run_dir)
        self.fd = None

    def __enter__(self):
        outer = NetworkLock._held
        if outer is not None:  # re-entered by the holder
            NetworkLock._depth += 1
            if self.run_dir:
                outer._write_holder(self.run_dir)
            return self
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.fd = open(LOCK_PATH, "a+")
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.fd.close()
                    holder = lock_holder()
                    raise TestbedError(
                        f"another testbed run is using the network emulation: "
                        f"{describe_holder(holder) if holder else 'a run that has just ended'}. One network at a "
                        f"time: wait for it to finish, or stop it (Ctrl-C in its terminal, or kill its pid) and "
                        f"then run 'testbed clean' if it was killed"
                    ) from None
                time.sleep(0.5)
        NetworkLock._held, NetworkLock._depth = self, 1
        self._write_holder(self.run_dir)
        return self

    def _write_holder(self, run_dir: str) -> None:
        self.fd.seek(0)
        self.fd.truncate()
        self.fd.write(json.dumps({"pid": os.getpid(), "run_dir": run_dir, "since": time.time()}))
        self.fd.flush()

    def __exit__(self, *exc):
        if NetworkLock._held is not self and NetworkLock._held is not None:
            NetworkLock._depth -= 1
            return False
        NetworkLock._held, NetworkLock._depth = None, 0
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self.fd.close()
        return False
