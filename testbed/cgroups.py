"""Throttling an emulated host's processes with the cpu cgroup controller (a straggler with
real compute, :mod:`testbed.event_applier`).

One cgroup per throttled host, directly under the root of the cpu hierarchy, named
``testbed-<run>-<host>`` (:data:`CGROUP_PREFIX`), with a quota of ``1/slowdown`` of one core.
cgroup v2 is preferred when its ``cpu`` controller is available (``cpu.max``); else a cgroup
v1 hierarchy with the ``cpu`` controller (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``).
This machine (Debian 12 container, kernel 6.x) has the v1 ``cpu`` controller at
``/sys/fs/cgroup/cpu`` and a cgroup2 at ``/sys/fs/cgroup/unified`` whose ``cpu`` controller is
bound to v1, so v1 is used there.

Removing a cgroup moves its processes back where they were (each one's previous cgroup of
that hierarchy, or the root) and deletes it; :func:`remove_cgroup` does the same for a
cgroup named in a dead run's ledger (:mod:`testbed.ledger`).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "CpuController",
    "CpuThrottle",
    "cpu_controller",
    "quota_us",
    "netns_pids",
    "remove_cgroup",
    "testbed_cgroups",
    "CGROUP_PREFIX",
    "MISSING",
]

#: every cgroup the testbed creates is named with this prefix (``testbed clean`` and the
#: tests' leftover check look for it)
CGROUP_PREFIX = "testbed-"
#: the v1 controllers whose hierarchies may hold the testbed's cgroups (a straggler's in
#: ``cpu``; a run's, :mod:`testbed.lifetime`, in the first of them mounted)
V1_CONTROLLERS = ("freezer", "pids", "memory", "cpuset", "cpuacct", "cpu")
#: what is missing when no cpu controller is found, in words
MISSING = (
    "the cpu cgroup controller: a cgroup v2 hierarchy with 'cpu' in its cgroup.controllers, or a cgroup v1 "
    "hierarchy with the cpu controller (e.g. 'mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu' as root)"
)
#: the CFS period, microseconds (the kernel's default)
PERIOD_US = 100_000
#: the smallest quota the kernel takes, microseconds
MIN_QUOTA_US = 1_000
#: the longest period the kernel takes, microseconds
MAX_PERIOD_US = 1_000_000


@dataclass(frozen=True)
class CpuController:
    """A mounted cgroup hierarchy that has the cpu controller: ``version`` 2 or 1, ``root``
    its mount point."""

    version: int
    root: Path


def _mounts(path: str | Path) -> list[tuple[str, str, list[str]]]:
    """(mount point, file system type, options) of every mount in ``path`` (/proc/mounts format)."""
    out = []
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[1].replace("\\040", " "), parts[2], parts[3].split(",")))
    return out


def cpu_controller(mounts: str | Path = "/proc/mounts") -> CpuController | None:
    """The hierarchy to throttle with: cgroup v2 when its root lists ``cpu`` in
    ``cgroup.controllers``, else a cgroup v1 hierarchy mounted with the ``cpu`` option; None
    when neither exists (see :data:`MISSING`)."""
    ms = _mounts(mounts)
    for point, fstype, _ in ms:
        if fstype == "cgroup2":
            try:
                if "cpu" in (Path(point) / "cgroup.controllers").read_text().split():
                    return CpuController(2, Path(point))
            except OSError:
                continue
    for point, fstype, opts in ms:
        if fstype == "cgroup" and "cpu" in opts and (Path(point) / "cpu.cfs_quota_us").exists():
            return CpuController(1, Path(point))
    return None


def quota_us(slowdown: float) -> tuple[int, int]:
    """``(quota, period)`` in microseconds for 1/``slowdown`` of one core: period
    :data:`PERIOD_US`, lengthened (up to 1 s) when the quota would fall below the kernel's
    1 ms minimum.

    Raises:
        ValueError: ``slowdown`` is not a finite number > 0.
    """
    if not (isinstance(slowdown, (int, float)) and math.isfinite(slowdown) and slowdown > 0):
        raise ValueError(f"a slowdown must be a finite number > 0, not {slowdown!r}")
    period = PERIOD_US
    if period / slowdown < MIN_QUOTA_US:
        period = min(MAX_PERIOD_US, math.ceil(MIN_QUOTA_US * slowdown))
    return max(MIN_QUOTA_US, round(period / slowdown)), period


def netns_pids(pid: int) -> list[int]:
    """Every process in the network namespace of process ``pid`` (a Mininet host's shell):
    the host's processes. Empty if ``pid`` is gone."""
    try:
        target = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return []
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/ns/net") == target:
                    out.append(int(d))
            except OSError:
                continue
    return sorted(out)


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _cgroup_of(pid: int, ctl: CpuController) -> str | None:
    """The path of ``pid``'s cgroup in ``ctl``'s hierarchy (``/`` for the root), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if ctl.version == 2 and hid == "0" and controllers == "":
            return path
        if ctl.version == 1 and "cpu" in controllers.split(","):
            return path
    return None


def _move(pids, to: Path) -> None:
    for pid in pids:
        try:
            _write(to / "cgroup.procs", str(pid))
        except OSError as e:  # gone meanwhile (ESRCH), or a kernel thread
            if e.errno not in (errno.ESRCH, errno.EINVAL):
                log.warning("could not move pid %s to %s: %s", pid, to, e)


def _rmdir(path: Path, timeout_s: float = 2.0) -> bool:
    """Delete an emptied cgroup, waiting for exiting processes to leave; False if it stays."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > end:
                log.warning("could not remove cgroup %s: %s", path, e)
                return False
            _move(_procs(path), path.parent)
            time.sleep(0.05)


def remove_cgroup(path: str | Path) -> bool:
    """Move the processes of the cgroup ``path`` (one the testbed made, directly under its
    hierarchy's root) to the root, and delete it. True if it was there and is gone."""
    p = Path(path)
    if not p.name.startswith(CGROUP_PREFIX) or not p.is_dir():  # only what the testbed made
        return False
    _move(_procs(p), p.parent)
    return _rmdir(p)


def testbed_cgroups() -> list[Path]:
    """The cgroups the testbed made (:data:`CGROUP_PREFIX`) present in any cpu or freezer
    hierarchy or cgroup v2 (a straggler's, and a run's process cgroup, :mod:`testbed.lifetime`)."""
    out = []
    for point, fstype, opts in _mounts("/proc/mounts"):
        if fstype == "cgroup2" or (fstype == "cgroup" and any(c in opts for c in V1_CONTROLLERS)):
            try:
                out += [d for d in Path(point).iterdir() if d.name.startswith(CGROUP_PREFIX) and d.is_dir()]
            except OSError:
                continue
    return out


class CpuThrottle:
    """One cgroup that holds a host's processes to a share of one core.

    Args:
        ctl: the hierarchy (:func:`cpu_controller`).
        name: the cgroup's name after :data:`CGROUP_PREFIX` (e.g. ``<run>-h4``).
        on_cgroup: called with the cgroup's path once it exists (the run's ledger).

    Raises:
        OSError (from :meth:`apply`): the cgroup cannot be made or configured (not root, a
            read-only hierarchy).
    """

    def __init__(self, ctl: CpuController, name: str, on_cgroup: Callable[[str], None] | None = None):
        self.ctl, self.on_cgroup = ctl, on_cgroup
        self.path = ctl.root / f"{CGROUP_PREFIX}{name}"[:255]
        self._origin: dict[int, str] = {}
        self._enabled_cpu = False

    def apply(self, slowdown: float, pids: list[int]) -> dict:
        """Create the cgroup (once), set its quota to 1/``slowdown`` of a core, move ``pids``
        into it. Returns ``{"cgroup", "cgroup_version", "quota_us", "period_us", "pids"}``
        (``pids``: how many were moved)."""
        quota, period = quota_us(slowdown)
        if not self.path.is_dir():
            if self.ctl.version == 2:
                ctl_file = self.ctl.root / "cgroup.subtree_control"
                if "cpu" not in ctl_file.read_text().split():
                    _write(ctl_file, "+cpu")
                    self._enabled_cpu = True
            self.path.mkdir()
            if self.on_cgroup is not None:
                self.on_cgroup(str(self.path))
        if self.ctl.version == 2:
            _write(self.path / "cpu.max", f"{quota} {period}")
        else:
            _write(self.path / "cpu.cfs_quota_us", "-1")  # a period below the quota is refused: unlimited first
            _write(self.path / "cpu.cfs_period_us", str(period))
            _write(self.path / "cpu.cfs_quota_us", str(quota))
        moved = 0
        for pid in pids:
            if pid not in self._origin:
                origin = _cgroup_of(pid, self.ctl)
                if origin is None:
                    continue
                self._origin[pid] = origin
            try:
                _write(self.path / "cgroup.procs", str(pid))
                moved += 1
            except OSError as e:
                if e.errno != errno.ESRCH:
                    raise
        return {
            "cgroup": str(self.path),
            "cgroup_version": self.ctl.version,
            "quota_us": quota,
            "period_us": period,
            "pids": moved,
        }

    def remove(self) -> bool:
        """Move every process back to the cgroup it came from (the root if that is gone) and
        delete the cgroup (idempotent). True if nothing is left of it."""
        if not self.path.is_dir():
            return True
        for pid in _procs(self.path):
            origin = self._origin.get(pid, "/")
            dest = self.ctl.root / origin.lstrip("/")
            _move([pid], dest if dest.is_dir() else self.ctl.root)
        gone = _rmdir(self.path)
        if gone and self._enabled_cpu:
            try:
                _write(self.ctl.root / "cgroup.subtree_control", "-cpu")
            except OSError:  # another cgroup uses it meanwhile: left enabled
                pass
            self._enabled_cpu = False
        return gone
