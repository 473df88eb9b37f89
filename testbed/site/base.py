"""The interface every site offers (see :mod:`testbed.site`) and what all sites share."""

from __future__ import annotations

import logging
import subprocess
from contextlib import ExitStack
from pathlib import Path

from testbed import launch
from testbed.ledger import Ledger
from testbed.lifetime import RunCgroup, tied_preexec
from testbed.spec import Experiment

__all__ = ["Site", "switch_ports", "uplink_ports", "log_leftovers"]

log = logging.getLogger("testbed")


def switch_ports(topology: dict) -> list[str]:
    """Every switch-side interface of a ``topology.json`` document: what bwm-ng samples."""
    switches = {s["name"] for s in topology["switches"]}
    return [l[f"intf{end}"] for l in topology["links"] for end in ("1", "2") if l[f"node{end}"] in switches]


def uplink_ports(topology: dict) -> list[str]:
    """Both ends of every ToR-core uplink (where the oversubscribed queues build)."""
    return [l[f"intf{e}"] for l in topology["links"] if l["class"] == "uplink" for e in ("1", "2")]


def log_leftovers(left: list[str]) -> None:
    """Log what a teardown still had to remove (normally nothing)."""
    if left:
        log.warning("teardown removed leftovers: %s", ", ".join(left))


class Site:
    """The network and processes of one run (see the module doc); a subclass per kind of site.

    Args:
        exp: the run's experiment (one point, ``scale`` resolved).
        run_dir: the run directory.
        ledger: the run's ledger (every pid, bridge and interface made is recorded first).
        teardown: the run's teardown stack; every start registers its stop on it.

    Attributes:
        network: the :class:`testbed.network.Network` (or its cluster subclass).
        topology: the ``topology.json`` document, once built.
        timings: phase -> seconds, recorded by :meth:`record`.
        cgroup: the :class:`testbed.lifetime.RunCgroup` holding every process the run starts
            on this machine (recorded in the ledger; killed whole at teardown).

    Raises:
        MissingRequirement: no cgroup hierarchy can hold the run's processes.
    """

    def __init__(self, exp: Experiment, run_dir: Path, ledger: Ledger, teardown: ExitStack):
        self.exp, self.run_dir, self.ledger, self.teardown = exp, Path(run_dir), ledger, teardown
        self.topology: dict = {}
        self.timings: dict[str, float] = {}
        self.network = None
        self.cgroup = RunCgroup(self.run_dir.name)
        ledger.set_process_cgroup(str(self.cgroup.path))
        # after every other stop (last in, first out): what is still in the cgroup then was
        # left behind (a program's daemon, a crashed worker's children) and is killed
        teardown.callback(
            lambda: log_leftovers([f"process {line} (left in the run's cgroup)" for line in self.cgroup.close()])
        )

    def adopt(self, what: str, pid: int) -> None:
        """Record process ``what`` (started by the harness itself, e.g. bwm-ng) in the ledger
        and move it into the run's cgroup."""
        self.ledger.add_pid(what, pid)
        self.cgroup.add(pid)

    # ------------------------------------------------------------------ network

    def build(self) -> dict:
        """Build the network, read its shaping back; the ``topology.json`` document.

        Raises:
            TestbedError: the network could not be built or is not shaped as asked.
        """
        self.network.start()
        self.topology = self.network.topology
        return self.topology

    @property
    def hosts(self) -> dict:
        """Host name -> its Mininet node (once built)."""
        return self.network.hosts

    @property
    def netns_pids(self) -> dict[str, int]:
        """Host name -> the pid of its shell (its network namespace), on its machine."""
        return {h: n.pid for h, n in self.network.hosts.items()}

    @property
    def shaper(self):
        """What changes the links while the run trains (:class:`testbed.shaping.LinkShaper`)."""
        return self.network.shaper

    def record(self, phase: str, seconds: float) -> None:
        """Keep how long ``phase`` took."""
        self.timings[phase] = seconds
        log.info("%s took %.2f s", phase, seconds)

    # ------------------------------------------------------------------ files

    def share(self, files: list[str]) -> None:
        """Make ``files`` of the run directory readable by the processes (nothing to do here)."""

    def host_dir(self, host: str) -> Path:
        """The run directory as the processes of ``host`` see it."""
        return self.run_dir

    def fetch(self, host: str, relpath: str) -> None:
        """Bring ``relpath`` (inside :meth:`host_dir`) written by a process of ``host`` into
        the run directory (already there on this machine)."""

    # ------------------------------------------------------------------ processes

    #: processes forked from a zygote rather than started by :meth:`popen` (:class:`testbed.launch.Fork`), or None
    fork: launch.Fork | None = None

    def popen(self, info: dict, cmd: list[str], env: dict, log_file) -> subprocess.Popen:
        """Start process ``info`` (a ``processes.json`` entry) in its host, bound to its
        interface (:func:`testbed.network.bind_to_interface`), output to ``log_file``."""
        raise NotImplementedError

    def run_in(self, host: str, cmd: list[str], log_file) -> subprocess.Popen:
        """Start ``cmd`` in ``host`` (stdin closed, output to ``log_file``)."""
        return self.hosts[host].popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=tied_preexec(self.cgroup.preexec),
        )

    def listening(self, host: str, port: int) -> bool:
        """Whether a TCP socket of ``host`` listens on ``port``."""
        raise NotImplementedError

    def kill(self, launched: launch.Launched) -> None:
        """SIGKILL a process started by :meth:`popen` (and, elsewhere, what it runs there)."""
        launched.popen.kill()

    def stop_matching(self, part: str, grace_s: float) -> None:
        """End the processes whose command line names ``part`` inside :meth:`host_dir` where
        they do not end with their local handle (nothing to do here)."""

    # ------------------------------------------------------------------ capture and events

    def start_memory(self, procs: list[launch.Launched]) -> None:
        """Start recording ``traces/memory.csv`` (:mod:`testbed.capture.memory`) before the
        network is built: the machines' used memory, and the USS of ``procs`` (the run's
        processes, as they start); it stops at teardown."""
        raise NotImplementedError

    def start_capture(self, procs: list[launch.Launched]) -> None:
        """Start the capture of the ``capture`` section (``procs``: the run's processes, as
        they start); it stops at teardown."""
        raise NotImplementedError

    def follow_events(self, entries: list[dict]) -> None:
        """Make the events the processes write readable in ``events/`` while the run trains
        (they are written there on this machine)."""
