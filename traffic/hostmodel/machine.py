"""One emulated host's shared memory system: the clock its whole-host rates are charged on.

A rate of scope ``machine`` (:class:`traffic.hostmodel.SourcedValue`) is the whole emulated
host's, not each process's: ``phub_pbox``'s aggregation and optimizer rates are derived from
the PBox's 120 GB/s of DRAM bandwidth (PHub Sec. 3.2.2: aggregation is "inherently memory
bound"; ``traffic/hostmodel/data/README.md``: "a PBox server process should be charged as one
resource at this rate, not per core"). Eight server processes each charged on their own
clock would get eight times that bandwidth.

The model: the host's memory system is one FIFO server. An operation of a machine-scoped
kind whose dilated budget is ``b`` (``scale x`` its emulated cost), issued at ``t``, reserves
``[start, start + b)`` with ``start = max(t, busy_until)``, and ``busy_until`` becomes its
end. The caller waits until that end (its real work runs meanwhile; real work that ends
later is an overrun, as for any charge). Every machine-scoped kind of a host (aggregation,
optimizer, codec) shares the one clock: they use the same DRAM. The server is
work-conserving, so the host serves at most the stated rate in total, and exactly that while
it is busy; processor sharing (every operation in progress slowed down equally) would serve
the same bytes per second and differ only in which operation waits, so FIFO, which needs one
number, is used.

``busy_until`` is a float64 (``time.monotonic()`` seconds: one clock for every process of the
machine, network namespaces do not change it) in the file ``<run_dir>/hostclock/<host>``,
read and written under ``fcntl.flock``: the run directory is shared by every process of a
run on one machine (on a cluster, each machine's staging directory, and a host's processes
all run on its machine). A thread lock serializes the threads of one process, which share
the file's lock.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostMachine", "Reservation", "CLOCK_DIR"]

#: the run directory's subdirectory that holds one clock file per emulated host
CLOCK_DIR = "hostclock"

_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_FMT = struct.Struct("<d")


@dataclass(frozen=True)
class Reservation:
    """One operation's time on the host's memory system (``time.monotonic()`` seconds).

    Attributes:
        issued: when the operation asked for it.
        start: when its service begins: ``max(issued, busy_until)``.
        end: ``start`` + its budget; the operation is done then.
    """

    issued: float
    start: float
    end: float

    @property
    def queued_s(self) -> float:
        """Seconds it waited for the operations ahead of it."""
        return self.start - self.issued


class HostMachine:
    """The shared clock of one emulated host (see the module's docstring for the model).

    Args:
        path: the clock file (created if missing; an existing one is joined).

    Raises:
        OSError: the file cannot be opened or is not a regular file.
    """

    def __init__(self, path: str | Path, *, _dir_fd: int | None = None):
        self.path = Path(path)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        name = self.path.name if _dir_fd is not None else self.path
        self._fd = os.open(name, flags, 0o644, dir_fd=_dir_fd)
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            raise OSError(f"{self.path} is not a regular file")
        self._lock = threading.Lock()

    @classmethod
    def for_host(cls, run_dir: str | Path, host: str) -> HostMachine:
        """The clock of emulated host ``host`` of the run in ``run_dir``:
        ``<run_dir>/hostclock/<host>``, the directory and the file made if missing. Neither is
        followed if it is a symbolic link, so nothing is made outside the run directory.

        Raises:
            ValueError: ``host`` is not a plain name (letters, digits, ``_.-``).
            OSError: the directory or the file cannot be made or opened.
        """
        if not isinstance(host, str) or not _HOST_NAME.fullmatch(host):
            raise ValueError(f"host name {host!r} cannot name a clock file (letters, digits, '_', '.', '-')")
        d = Path(run_dir) / CLOCK_DIR
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            pass
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return cls(d / host, _dir_fd=dfd)
        finally:
            os.close(dfd)

    def reserve(self, budget_s: float, issued: float | None = None) -> Reservation:
        """Reserve ``budget_s`` seconds of the host's memory system for an operation issued at
        ``issued`` (``time.monotonic()``; default now), after every operation reserved before.

        Raises:
            ValueError: a negative or non-finite budget.
            OSError: the clock file cannot be read or written.
        """
        if not (budget_s >= 0 and math.isfinite(budget_s)):
            raise ValueError(f"a budget must be a finite number of seconds >= 0, got {budget_s!r}")
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                t = time.monotonic() if issued is None else issued
                raw = os.pread(self._fd, _FMT.size, 0)
                busy = _FMT.unpack(raw)[0] if len(raw) == _FMT.size else -math.inf
                start = max(t, busy)
                end = start + budget_s
                os.pwrite(self._fd, _FMT.pack(end), 0)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return Reservation(t, start, end)

    def busy_until(self) -> float:
        """The end of the last reservation (``-inf`` before the first)."""
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            try:
                raw = os.pread(self._fd, _FMT.size, 0)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return _FMT.unpack(raw)[0] if len(raw) == _FMT.size else -math.inf

    def close(self) -> None:
        """Close the clock file (it stays in the run directory)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> HostMachine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
