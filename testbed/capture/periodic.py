"""Sampling on a fixed time grid: the thread that drives the qdisc and CPU samplers and the
recorder that appends their rows to a CSV file.

Samplers schedule on a fixed grid (``k * interval``); a sample that overruns its slot skips
the missed slots (the next one starts on the next free slot) instead of bursting to catch
up, so a slow sample lowers the rate and the timestamps show the rate achieved.

A sampler (:class:`testbed.capture.qdisc.QdiscSampler`, :class:`testbed.capture.cpu.CpuSampler`)
has ``open()``, ``read()`` (a list of rows, the CSV columns after ``time``) and ``close()``,
all three called from the sampling thread.
"""

from __future__ import annotations

import csv
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class Sampler(Protocol):
    """What :class:`SampledCsv` drives: ``open``, then ``read`` once per sample, then ``close``."""

    def open(self): ...

    def read(self) -> list[tuple]: ...

    def close(self) -> None: ...


class Periodic(threading.Thread):
    """A daemon thread calling ``step()`` on a fixed time grid (``k * period_s``) until stopped.

    ``on_start``/``on_exit`` run in the thread before the first and after the last step (for
    resources tied to a thread, like pyroute2 sockets); a failing ``on_start`` is recorded in
    ``errors`` and ends the thread. A step that overruns its slot skips the missed slots: the
    next step starts on the next free slot, so a slow step lowers the rate, never piles up.
    """

    def __init__(
        self,
        name: str,
        period_s: float,
        step: Callable[[], None],
        errors: list,
        on_start: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
        first_after_period: bool = False,
    ):
        super().__init__(name=f"capture-{name}", daemon=True)
        self.period_s, self.step, self.errors = period_s, step, errors
        self.on_start, self.on_exit = on_start, on_exit
        self.first_after_period = first_after_period
        self.stop_event = threading.Event()
        self.steps = self.overruns = 0  # steps taken, steps that overran their slot

    def run(self):
        try:
            if self.on_start:
                self.on_start()
            self._loop()
        except Exception as e:  # noqa: BLE001 -- on_start failed: record it, never raise in a thread
            log.warning("%s sampler could not start: %s", self.name, e)
            self.errors.append(f"{self.name}: could not start: {e}")
        finally:
            if self.on_exit:
                self.on_exit()

    def _loop(self):
        t0 = time.monotonic()
        k = 0
        if self.first_after_period and self.stop_event.wait(self.period_s):
            return
        t0 += self.period_s if self.first_after_period else 0.0
        failures = 0
        while not self.stop_event.is_set():
            try:
                self.step()
                failures = 0
            except Exception as e:  # noqa: BLE001 -- a sampler must never take the run down
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("%s sampler: %s", self.name, e)
                    self.errors.append(f"{self.name}: {e}")
            k += 1
            self.steps += 1
            now = time.monotonic()
            nxt = t0 + k * self.period_s
            if nxt < now:  # overran: skip the missed slots
                self.overruns += 1
                if self.overruns == 1:
                    log.info(
                        "%s sampler: a step took longer than the %.1f ms period; skipping missed slots",
                        self.name,
                        1000 * self.period_s,
                    )
                k = int((now - t0) / self.period_s) + 1
                nxt = t0 + k * self.period_s
            self.stop_event.wait(nxt - now)


class SampledCsv:
    """A recorder: ``sampler`` read every ``period_s`` by a :class:`Periodic` thread, each row
    appended to the CSV file ``path`` (header ``fields``) after the sample's ``time``.

    Args:
        name: the sampler's name (the thread is ``capture-<name>``).
        sampler: opened, read and closed in the sampling thread (a sampler that cannot open
            is recorded in ``errors``; the run goes on without its rows).
        path: the CSV file (created, truncated).
        fields: its header, ``time`` first.
        period_s: the sampling period, s.
        errors: sampler problems are appended here (a sampler logs and keeps going).
        row_format: turns a row of ``sampler.read()`` into the CSV columns after ``time``
            (default: as is).
        first_after_period: take the first sample one period after the start.

    ``time`` is the unix time (s, 6 decimals) at which the sample was requested; all rows of
    a sample share it. The file is flushed after every sample; ``first_sample`` (a
    ``threading.Event``) is set once the first one is written. :meth:`stop` is idempotent
    and safe without a :meth:`start`.
    """

    def __init__(
        self,
        name: str,
        sampler: Sampler,
        path: str | Path,
        fields: Sequence[str],
        period_s: float,
        errors: list[str],
        row_format: Callable[[tuple], Sequence] = tuple,
        first_after_period: bool = False,
    ):
        self.name, self.sampler, self.path, self.fields = name, sampler, Path(path), list(fields)
        self.period_s, self.errors = period_s, errors
        self.row_format, self.first_after_period = row_format, first_after_period
        self.thread: Periodic | None = None  # kept after stop()
        self.first_sample = threading.Event()
        self._file = None
        self._writer = None
        self._stopped = False

    def start(self) -> SampledCsv:
        """Create the file, write its header and start the sampling thread (a start that
        fails closes the file)."""
        self._file = open(self.path, "w", newline="")
        try:
            self._writer = csv.writer(self._file)
            self._writer.writerow(self.fields)
            self._file.flush()
            t = Periodic(
                self.name,
                self.period_s,
                self._step,
                self.errors,
                on_start=self.sampler.open,
                on_exit=self.sampler.close,
                first_after_period=self.first_after_period,
            )
            t.start()
            self.thread = t
        except BaseException:
            self.stop()
            raise
        return self

    def _step(self) -> None:
        now = time.time()  # the kernel fills a dump when asked; decoding comes after
        for row in self.sampler.read():
            self._writer.writerow([f"{now:.6f}", *self.row_format(row)])
        self._file.flush()
        self.first_sample.set()

    def stop(self) -> None:
        """Stop the thread (waiting up to 5 s; one that does not stop is reported in
        ``errors``), then close the file (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        t = self.thread
        if t is not None:
            t.stop_event.set()
            t.join(timeout=5.0)
            if t.is_alive():
                self.errors.append(f"{t.name} sampler did not stop within 5 s")
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def __enter__(self) -> SampledCsv:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
