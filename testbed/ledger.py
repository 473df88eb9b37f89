"""A ledger of what a run creates on the machine, so that teardown and ``testbed clean``
remove exactly that, even after the harness was killed.

``mn -c`` is no substitute: it misses Linux bridges and deletes ``/tmp/*.log``. Each live
run keeps one JSON file in ``LEDGER_DIR`` (``/run/testbed/ledger``, a tmpfs that a reboot
clears along with the namespaces) listing the bridges and interfaces it plans to create (all
names are known from the Topo before anything is built), and the pids of the processes it
starts (Mininet host shells, training processes, bwm-ng, iperf3). The file is removed when
teardown completes; a file whose owner pid is dead marks a run that needs cleaning.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from pyroute2 import IPRoute, NetlinkError

from topologies.errors import TestbedError

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))
LEDGER_DIR = STATE_DIR / "ledger"
LOCK_PATH = STATE_DIR / "network.lock"

log = logging.getLogger(__name__)


@dataclass
class Ledger:
    """What one run created. Every ``add_*`` persists the file immediately."""
    path: Path
    owner_pid: int = field(default_factory=os.getpid)
    run_dir: str = ""
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def create(cls, run_id: str, run_dir: str) -> "Ledger":
        LEDGER_DIR.mkdir(parents=True, exist_ok=True)
        led = cls(path=LEDGER_DIR / f"{run_id}-{os.getpid()}.json", run_dir=str(run_dir))
        led.save()
        return led

    @classmethod
    def read(cls, path: Path) -> "Ledger":
        d = json.loads(path.read_text())
        return cls(path=path, owner_pid=d["owner_pid"], run_dir=d.get("run_dir", ""),
                   bridges=d.get("bridges", []), interfaces=d.get("interfaces", []),
                   pids={k: int(v) for k, v in d.get("pids", {}).items()})

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner_pid": self.owner_pid, "run_dir": self.run_dir,
                                   "bridges": self.bridges, "interfaces": self.interfaces,
                                   "pids": self.pids}, indent=1))
        os.replace(tmp, self.path)

    def add_bridges(self, names) -> None:
        self.bridges += [n for n in names if n not in self.bridges]
        self.save()

    def add_interfaces(self, names) -> None:
        self.interfaces += [n for n in names if n not in self.interfaces]
        self.save()

    def add_pid(self, what: str, pid: int) -> None:
        self.pids[what] = int(pid)
        self.save()

    def owner_alive(self) -> bool:
        return self.owner_pid != os.getpid() and psutil.pid_exists(self.owner_pid)

    def sweep(self) -> list[str]:
        """Kill every recorded process (and its process group), delete every recorded
        interface and bridge that still exists, then remove the ledger file.

        Returns:
            what was removed, one line each (empty if nothing was left).
        """
        removed = []
        for what, pid in self.pids.items():
            if _kill_tree(pid):
                removed.append(f"process {what} (pid {pid})")
        if self.interfaces or self.bridges:
            with IPRoute() as ipr:
                for name in self.interfaces + self.bridges:
                    bridge = name in self.bridges
                    if delete_link(ipr, name, bridge=bridge):
                        removed.append(f"{'bridge' if bridge else 'interface'} {name}")
        self.path.unlink(missing_ok=True)
        return removed


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


def _kill_tree(pid: int) -> bool:
    """SIGKILL ``pid`` and all its descendants; True if anything was alive."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=3)
    return True


def stale_ledgers(include_live: bool = False) -> list[Ledger]:
    """Ledgers of runs whose harness is gone (or all of them with ``include_live``)."""
    if not LEDGER_DIR.is_dir():
        return []
    out = []
    for p in sorted(LEDGER_DIR.glob("*.json")):
        try:
            led = Ledger.read(p)
        except (OSError, ValueError, KeyError):
            p.unlink(missing_ok=True)
            continue
        if include_live or not led.owner_alive():
            out.append(led)
    return out


class NetworkLock:
    """An exclusive lock on the machine's emulation: one network at a time.

    Interface names (``h1-eth0``, ``tor1``...) are the same in every run, so two runs at
    once would collide; the lock makes the second one fail clearly instead.

    Raises:
        TestbedError: another run holds the lock after ``wait_s`` seconds.
    """

    def __init__(self, wait_s: float = 0.0):
        self.wait_s = wait_s
        self.fd = None

    def __enter__(self):
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.fd = open(LOCK_PATH, "a+")
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.fd.seek(0)
                    holder = self.fd.read().strip() or "unknown"
                    self.fd.close()
                    raise TestbedError(f"another testbed run (pid {holder}) is using the network emulation; "
                                       f"wait for it, or if it was killed run 'testbed clean'") from None
                time.sleep(0.5)
        self.fd.seek(0)
        self.fd.truncate()
        self.fd.write(str(os.getpid()))
        self.fd.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self.fd.close()
        return False
