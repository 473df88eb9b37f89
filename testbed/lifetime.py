"""How long a run's processes live: all of them in one cgroup made for the run, killed as one
at teardown; the harness's own helpers end when the harness dies.

**The run's cgroup.** Every process a run starts on this machine (the Mininet hosts' shells,
training processes, a researcher's program and whatever it forks, background iperf3 flows,
bwm-ng and tcpdump) is in one cgroup, :class:`RunCgroup`, named ``testbed-<run id>.procs``
(:data:`testbed.cgroups.CGROUP_PREFIX`) and recorded in the run's ledger
(:attr:`testbed.ledger.Ledger.process_cgroup`) before the first process starts. A process
joins it between ``fork`` and ``exec`` (:meth:`RunCgroup.preexec`, or the zygote's child
before it runs anything), so that every descendant is born inside: a daemon that double-forks
and re-parents to init stays in it. Teardown and ``testbed clean`` kill the whole cgroup
(:func:`kill_cgroup`): ``cgroup.kill`` on cgroup v2 (Linux >= 5.14), else by freezing it
(the v1 ``freezer``, or v2's ``cgroup.freeze``), SIGKILL to every member, thaw; then the
cgroup is removed. cgroup v2 is used where it is mounted (also the ``unified`` hierarchy of a
hybrid set-up, which needs no controller to hold processes), else the v1 freezer hierarchy,
else any other mounted v1 hierarchy (:data:`V1_PREFERENCE`).

**The harness's helpers.** Capture processes (bwm-ng, tcpdump) and the processes started in
the emulated hosts get ``PR_SET_PDEATHSIG`` = SIGKILL (:func:`tied_preexec`): the kernel
kills them when the thread that started them ends, so a ``kill -9`` of ``testbed run`` ends
them at once instead of leaving bwm-ng appending to the dead run's traces. The signal is
sent when the *thread* that forked ends, so only processes started from the harness's main
thread are tied this way; the others (a packet capture started on a timer) are still in
the run's cgroup, which the next run sweeps (:func:`testbed.ledger.sweep_stale`).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from common.errors import MissingRequirement
from common.process import die_with_parent
from testbed.cgroups import CGROUP_PREFIX, V1_CONTROLLERS, _mounts, _write

__all__ = [
    "Hierarchy",
    "process_hierarchy",
    "RunCgroup",
    "kill_cgroup",
    "cgroup_pids",
    "tied_preexec",
    "RUN_CGROUP_SUFFIX",
    "MISSING_HIERARCHY",
]

log = logging.getLogger(__name__)

#: a run's process cgroup is ``testbed-<run id>`` + this suffix (a straggler's cpu cgroup,
#: :mod:`testbed.cgroups`, is ``testbed-<run id>-<host>``)
RUN_CGROUP_SUFFIX = ".procs"
#: what is missing when no hierarchy can hold a run's processes, in words
MISSING_HIERARCHY = (
    "a cgroup hierarchy to hold each run's processes: cgroup v2 mounted (e.g. 'mount -t cgroup2 "
    "none /sys/fs/cgroup', as systemd does) or a cgroup v1 hierarchy, best the freezer's ('mount -t "
    "cgroup -o freezer freezer /sys/fs/cgroup/freezer'), writable by root"
)


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy that can hold a run's processes: ``version`` 2 (any cgroup2
    mount) or 1 (a v1 mount with the ``freezer`` controller), ``root`` its mount point."""

    version: int
    root: Path


#: v1 controllers whose hierarchy can hold a run's processes, best first: the freezer stops
#: forks while a cgroup is killed; any other hierarchy holds them too (killed until empty)
V1_PREFERENCE = V1_CONTROLLERS


def process_hierarchy(mounts: str | Path = "/proc/mounts") -> Hierarchy | None:
    """The hierarchy for run cgroups: a writable cgroup2 mount, else a writable v1 hierarchy
    (the ``freezer``'s first, then :data:`V1_PREFERENCE`); None when there is none
    (:data:`MISSING_HIERARCHY`)."""
    ms = [(point, fstype, opts) for point, fstype, opts in _mounts(mounts) if "ro" not in opts]
    for point, fstype, _opts in ms:
        if fstype == "cgroup2" and (Path(point) / "cgroup.procs").exists():
            return Hierarchy(2, Path(point))
    for controller in V1_PREFERENCE:
        for point, fstype, opts in ms:
            if fstype == "cgroup" and controller in opts and (Path(point) / "cgroup.procs").exists():
                return Hierarchy(1, Path(point))
    return None


def tied_preexec(join: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """The ``preexec_fn`` for a process the harness starts now from this thread: it joins the
    run's cgroup (``join``, e.g. :meth:`RunCgroup.preexec`) and, when called from the main
    thread, dies with the harness (:func:`common.process.die_with_parent`; from another thread it would die
    when that thread ends). None when there is nothing to do."""
    tie = threading.current_thread() is threading.main_thread()
    if join is None and not tie:
        return None

    def preexec() -> None:
        if join is not None:
            join()
        if tie:
            die_with_parent()

    return preexec


def cgroup_pids(path: str | Path) -> list[int]:
    """The processes in cgroup ``path`` and its descendants (empty if it is gone)."""
    out = []
    for d, _, _ in os.walk(path):
        try:
            out += [int(x) for x in (Path(d) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def _describe(pid: int) -> str:
    try:
        return f"{pid} ({' '.join(psutil.Process(pid).cmdline()[:3])[:80]})"
    except psutil.Error:
        return str(pid)


def kill_cgroup(path: str | Path, timeout_s: float = 5.0) -> list[str]:
    """SIGKILL every process of the cgroup ``path`` (one the testbed made: its name starts
    with :data:`~testbed.cgroups.CGROUP_PREFIX`) and its descendants, then remove it.

    v2 with ``cgroup.kill``: one write kills the whole tree, forks included. Otherwise the
    cgroup is frozen first (v1 ``freezer.state``, v2 ``cgroup.freeze``) so that nothing forks
    while its members are killed, then thawed (SIGKILL is delivered on thaw); without a
    freezer (a v1 ``cpu`` cgroup) members are killed until none is left.

    Returns:
        one line per process that was still there (``<pid> (<command>)``), so that callers
        can say what was left behind; empty when the cgroup was empty or absent.
    """
    p = Path(path)
    if not p.name.startswith(CGROUP_PREFIX) or not p.is_dir():
        return []
    pids = cgroup_pids(p)
    left = [_describe(pid) for pid in pids]
    if pids:
        if (p / "cgroup.kill").exists():
            try:
                _write(p / "cgroup.kill", "1")
            except OSError as e:
                log.warning("cgroup.kill of %s: %s", p, e)
        else:
            _freeze_and_kill(p)
    end = time.monotonic() + timeout_s
    while True:
        pids = cgroup_pids(p)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids:
            break
        if time.monotonic() > end:
            log.warning("cgroup %s still holds %s after SIGKILL", p, pids)
            return left
        time.sleep(0.02)
    for d in sorted((Path(x) for x, _, _ in os.walk(p)), key=lambda x: len(x.parts), reverse=True):
        _rmdir(d, end)
    return left


def _freeze_and_kill(p: Path) -> None:
    state = p / "freezer.state" if (p / "freezer.state").exists() else p / "cgroup.freeze"
    frozen = False
    if state.exists():
        try:
            _write(state, "FROZEN" if state.name == "freezer.state" else "1")
            frozen = True
        except OSError as e:
            log.warning("could not freeze %s: %s", p, e)
    for pid in cgroup_pids(p):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if frozen:
        try:
            _write(state, "THAWED" if state.name == "freezer.state" else "0")
        except OSError as e:
            log.warning("could not thaw %s: %s", p, e)


def _rmdir(d: Path, deadline: float) -> None:
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("could not remove cgroup %s: %s", d, e)
                return
            time.sleep(0.02)


class RunCgroup:
    """The cgroup holding every process of one run on this machine (see the module doc).

    Args:
        run_id: the run directory's name.
        hierarchy: where to make it (default :func:`process_hierarchy`).

    Raises:
        MissingRequirement: no hierarchy can hold processes, or the cgroup cannot be made
            (not root, a read-only mount); the message says what to mount.
    """

    def __init__(self, run_id: str, hierarchy: Hierarchy | None = None):
        h = hierarchy or process_hierarchy()
        if h is None:
            raise MissingRequirement(f"every run needs {MISSING_HIERARCHY}")
        self.hierarchy = h
        self.path = h.root / (f"{CGROUP_PREFIX}{run_id}"[:248] + RUN_CGROUP_SUFFIX)
        try:
            self.path.mkdir()
        except FileExistsError:  # a dead run of the same id (ids are never reused in one runs directory)
            kill_cgroup(self.path)
            self.path.mkdir()
        except OSError as e:
            raise MissingRequirement(
                f"cannot make the run's cgroup {self.path} ({e.strerror or e}): every run needs {MISSING_HIERARCHY}"
            ) from None
        self._procs = self.path / "cgroup.procs"
        self._fd = os.open(self._procs, os.O_WRONLY | os.O_CLOEXEC)

    def preexec(self) -> None:
        """Join the cgroup: for a child between ``fork`` and ``exec`` (``preexec_fn``), with
        a file descriptor opened beforehand (nothing is allocated in the child)."""
        os.write(self._fd, b"0")

    def add(self, pid: int) -> bool:
        """Move process ``pid`` (and, on cgroup v2, all its threads) into the cgroup; False if
        it is gone."""
        try:
            os.write(self._fd, str(int(pid)).encode())
            return True
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.EINVAL):
                return False
            raise

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        return cgroup_pids(self.path)

    def close(self) -> list[str]:
        """Kill everything still in the cgroup and remove it (:func:`kill_cgroup`);
        idempotent. Returns one line per process that was still there."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return kill_cgroup(self.path)
