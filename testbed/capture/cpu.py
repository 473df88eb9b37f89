"""The CPU sampler: ``traces/cpu.csv``, how busy the machine and the run's processes are.

A thread (:class:`testbed.capture.periodic.SampledCsv`) samples ``/proc/stat`` (psutil) every
``capture.cpu_interval_ms`` with a :class:`CpuSampler`: ``time, kind, id, busy_pct`` with
``kind`` ``core`` (``id`` = core index, busy % of that core over the interval; iowait counts
as idle) or ``proc`` (``id`` = process name from ``pids()``, busy % of *one* core used by the
process and all its descendants, so 150 means one and a half cores; /proc counts CPU time in
10 ms ticks, so at a 100 ms period a process value is +-10 points; a process gets rows from
its second sample on). Two extra process rows, ``bwm-ng`` and ``harness`` (this Python
process, which also runs the samplers), show what the measurement costs.

The first sample is taken one period after the baselines: /proc times have 10 ms ticks, so a
few-ms interval would give meaningless percentages. A core whose /proc times have not moved
since the previous sample (at a 10-20 ms period, each field rounded down to its tick) gets no
row that sample; its next row covers both periods.

Process rows are sampled every ``ceil(processes / PROCESSES_PER_SAMPLE)`` periods (every
period up to 16 processes), so the sampler's work per second stays that of 16 processes at
the period, which is what the capacity model's flat per-sample cost counts (reading every
process every period at many processes costs far more: ``docs/scaling.md``, "What the capture
costs"). A process's busy % is over the time since its previous row, so its mean is
unchanged; the cores keep every period.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import psutil

from common.errors import TestbedError

CPU_FIELDS = ["time", "kind", "id", "busy_pct"]
#: process rows are read for at most this many processes per period on average (see above)
PROCESSES_PER_SAMPLE = 16


class CpuSampler:
    """Busy % of every core, of named processes (each with its descendants) and of this
    process, between two calls of :meth:`read`.

    Like :class:`testbed.capture.qdisc.QdiscSampler`: :meth:`open` takes the baselines,
    :meth:`read` returns the rows of one sample, :meth:`close` forgets the state; a context
    manager too.

    Args:
        pids: called at every sample; returns ``{process name: pid}`` of the processes to
            report (a None pid is skipped). A process is reported from its second sample on
            (the first one only takes its baseline).
    """

    def __init__(self, pids: Callable[[], dict]):
        self.pids = pids
        self._prev_cores: list | None = None
        self._me: psutil.Process | None = None
        self._procs: dict[int, psutil.Process] = {}  # pid -> Process (psutil keeps its last CPU times)
        self._members_of: dict[int, list[int]] = {}  # root pid -> pids of it and its descendants
        self._tree_age = 0  # samples since the last scan of /proc for descendants
        self._calls = 0  # samples taken (process rows come every ceil(processes / 16) of them)

    def open(self) -> CpuSampler:
        """Take the baselines of the cores and of this process."""
        self._prev_cores = psutil.cpu_times(percpu=True)
        self._me = psutil.Process(os.getpid())
        self._me.cpu_percent(None)
        return self

    def close(self) -> None:
        """Forget the baselines (idempotent)."""
        self._prev_cores = self._me = None
        self._procs.clear()
        self._members_of.clear()
        self._tree_age = 0
        self._calls = 0

    def __enter__(self) -> CpuSampler:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self) -> list[tuple]:
        """The rows of one sample, the ``cpu.csv`` columns after ``time``: ``("core", core
        index, busy %)`` per core, then ``("proc", name, busy % of one core)`` per named
        process past its first sample, then ``("proc", "harness", busy %)``. Busy % are floats.

        Raises:
            TestbedError: called before :meth:`open`.
        """
        if self._prev_cores is None:
            raise TestbedError("CpuSampler.read() before open()")
        rows = []
        cores = psutil.cpu_times(percpu=True)
        for i, (a, b) in enumerate(zip(self._prev_cores, cores)):
            busy = _busy_pct(a, b)
            if busy is not None:
                rows.append(("core", i, busy))
        self._prev_cores = cores
        named = dict(self.pids() or {})
        roots = [int(pid) for pid in named.values() if pid is not None]
        every = max(1, math.ceil(len(roots) / PROCESSES_PER_SAMPLE))
        self._calls += 1
        if self._calls % every and all(r in self._procs for r in roots):  # not this period (a new process: now)
            busy = self._self_busy()
            return rows + ([("proc", "harness", busy)] if busy is not None else [])
        self._tree_age += every
        if self._tree_age >= 10 or any(r not in self._members_of for r in roots):  # new processes: rescan
            self._refresh_tree(roots)
        for name, pid in named.items():
            if pid is None:
                continue
            busy = self._proc_busy(int(pid))
            if busy is not None:
                rows.append(("proc", name, busy))
        busy = self._self_busy()
        if busy is not None:
            rows.append(("proc", "harness", busy))
        return rows

    @staticmethod
    def csv_row(row: tuple) -> tuple:
        """A row of :meth:`read` as ``cpu.csv`` writes it (busy % with 2 decimals)."""
        kind, ident, busy = row
        return kind, ident, f"{busy:.2f}"

    def _refresh_tree(self, roots: list[int]) -> None:
        """One scan of /proc for every root's descendants (psutil's ``children()`` scans
        all of /proc per call: per root and per sample it cost the harness ~30 % of a core)."""
        children: dict[int, list[int]] = {}
        for p in psutil.process_iter(["ppid"]):
            children.setdefault(p.info["ppid"], []).append(p.pid)
        self._members_of.clear()
        for root in roots:
            out, todo = [], [root]
            while todo:
                q = todo.pop()
                out.append(q)
                todo += children.get(q, [])
            self._members_of[root] = out
        self._tree_age = 0

    def _proc_busy(self, pid: int) -> float | None:
        """% of one core used by pid and its descendants since the previous call (None
        on the first call for pid, which only takes the baseline)."""
        cache = self._procs
        new_root = pid not in cache
        try:
            if new_root:
                cache[pid] = psutil.Process(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        total = 0.0
        for q in self._members_of.get(pid, [pid]):
            try:
                p = cache.get(q) or cache.setdefault(q, psutil.Process(q))
                total += p.cpu_percent(None)  # first call per Process gives 0.0 (baseline)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                cache.pop(q, None)
        return None if new_root else total

    def _self_busy(self) -> float | None:
        try:
            return self._me.cpu_percent(None)  # the harness itself (not its children)
        except psutil.Error:
            return None


def _busy_pct(a, b) -> float | None:
    """Busy % of one core between two ``psutil.cpu_times`` samples (iowait counts as idle)."""
    idle_a = a.idle + getattr(a, "iowait", 0.0)
    idle_b = b.idle + getattr(b, "iowait", 0.0)
    # guest time is already included in user time on Linux
    tot_a = sum(a) - getattr(a, "guest", 0.0) - getattr(a, "guest_nice", 0.0)
    tot_b = sum(b) - getattr(b, "guest", 0.0) - getattr(b, "guest_nice", 0.0)
    d = tot_b - tot_a
    if d <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (1.0 - (idle_b - idle_a) / d)))
