"""The memory sampler: ``traces/memory.csv``, the machine's used memory and the training
processes' private memory.

A thread (:class:`testbed.capture.periodic.SampledCsv`) reads, with a :class:`MemorySampler`,
every ``capture.cpu_interval_ms`` (the CPU sampler's period) and from just before the
network is built until the run's teardown: rows ``time, kind, id, bytes`` with ``kind``

``machine`` (``id`` ``used``)
    the machine's used memory, psutil ``virtual_memory()``: ``total - available`` (from
    ``/proc/meminfo``: ``MemTotal - MemAvailable``), bytes; every sample;
``proc`` (``id`` = process name from ``pids()``)
    the process's USS (unique set size: the pages no other process maps, psutil
    ``memory_full_info().uss``, read from ``/proc/<pid>/smaps_rollup``), bytes; the process
    itself, not its descendants. Pages shared copy-on-write with the zygote a process forked
    from are not its own until it writes them, so USS is what one more process costs the
    machine.

USS is costly: the kernel walks every mapping of the process for it, and a process that
imported torch has many (its measured cost, and the recorder's: ``docs/scaling.md``, "What the
capture costs"). So each process is read at most once every :data:`USS_PERIOD_S` (5 s), and
the reads share a budget of :data:`USS_CPU_SHARE` (2 %) of one core: a sample reads the
processes whose turn has come, longest waiting first, while the budget lasts; with many
processes each is read less often than every 5 s, a few at each sample. A ``machine`` row is
cheap and taken every sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil

from testbed.capture.periodic import SampledCsv

__all__ = [
    "MemorySampler",
    "MEMORY_FIELDS",
    "USS_PERIOD_S",
    "USS_CPU_SHARE",
    "machine_used_bytes",
    "used_from_meminfo",
    "memory_recorder",
]

MEMORY_FIELDS = ["time", "kind", "id", "bytes"]

#: seconds, at least, between two USS reads of one process
USS_PERIOD_S = 5.0

#: the share of one core the USS reads take, at most, on average
USS_CPU_SHARE = 0.02


def machine_used_bytes() -> int:
    """This machine's used memory: psutil ``virtual_memory()`` ``total - available``, bytes."""
    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)


def used_from_meminfo(text: str) -> int:
    """Used memory from the text of a machine's ``/proc/meminfo`` (read over SSH):
    ``MemTotal - MemAvailable``, bytes (what :func:`machine_used_bytes` gives there).

    Raises:
        ValueError: the text lacks ``MemTotal`` or ``MemAvailable`` (a kernel before 3.14).
    """
    kib = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable") and rest.split():
            kib[key] = int(rest.split()[0])
    if len(kib) != 2:
        missing = " and ".join(k for k in ("MemTotal", "MemAvailable") if k not in kib)
        raise ValueError(f"/proc/meminfo without {missing}")
    return 1024 * (kib["MemTotal"] - kib["MemAvailable"])


class MemorySampler:
    """The rows of ``memory.csv`` (see the module doc), one sample per :meth:`read`.

    Like :class:`testbed.capture.cpu.CpuSampler`: :meth:`open`, :meth:`read`, :meth:`close`.

    Args:
        pids: called at every sample; returns ``{process name: pid}`` of the processes to
            report (a None pid is skipped, as is a process that has ended or cannot be read).
        uss_period_s: seconds, at least, between two USS reads of one process (a new process
            is due at once).
        uss_cpu_share: the share of one core the USS reads may take on average: each read's
            CPU time is paid from a credit that grows by this share of the time elapsed (at
            most ``uss_cpu_share x uss_period_s``); reads go on while it is not negative.
        clock: monotonic seconds; ``cpu_clock``: this thread's CPU seconds (a test's fakes).
    """

    def __init__(
        self,
        pids: Callable[[], dict],
        uss_period_s: float = USS_PERIOD_S,
        uss_cpu_share: float = USS_CPU_SHARE,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        self.pids, self.uss_period_s, self.uss_cpu_share = pids, uss_period_s, uss_cpu_share
        self.clock, self.cpu_clock = clock, cpu_clock
        self._due: dict[str, float] = {}  # process name -> when its next USS read is due
        self._credit = 0.0  # CPU seconds the USS reads may still take
        self._last: float | None = None

    def open(self) -> MemorySampler:
        self.close()
        return self

    def close(self) -> None:
        self._due.clear()
        self._credit, self._last = 0.0, None

    def read(self) -> list[tuple]:
        """``[("machine", "used", bytes)]``, then ``("proc", name, uss bytes)`` per process
        read this time (see the class doc); bytes are ints."""
        rows = [("machine", "used", machine_used_bytes())]
        now = self.clock()
        if self._last is not None:
            self._credit = min(
                self._credit + self.uss_cpu_share * (now - self._last), self.uss_cpu_share * self.uss_period_s
            )
        self._last = now
        named = {name: pid for name, pid in dict(self.pids() or {}).items() if pid is not None}
        due = sorted((self._due.setdefault(name, now), name) for name in named)  # a new one: due from now
        for when, name in due:
            if when > now or self._credit < 0:
                break
            t = self.cpu_clock()
            try:
                rows.append(("proc", name, int(psutil.Process(int(named[name])).memory_full_info().uss)))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
            self._credit -= self.cpu_clock() - t
            self._due[name] = now + self.uss_period_s
        return rows


def memory_recorder(traces_dir: str | Path, pids: Callable[[], dict], period_s: float, errors: list[str]) -> SampledCsv:
    """The recorder of ``traces_dir/memory.csv``: a :class:`MemorySampler` over ``pids`` read
    every ``period_s`` seconds, the first sample at once (not started; problems appended to
    ``errors``)."""
    return SampledCsv("memory", MemorySampler(pids), Path(traces_dir) / "memory.csv", MEMORY_FIELDS, period_s, errors)
