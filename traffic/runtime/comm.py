"""A background communication thread: callables run one at a time, results as futures.

Schemes that overlap communication with computation hand work to ``ctx.comm`` from the
compute thread's hooks and wait on the futures where they must::

    fut = ctx.comm.submit(ctx.transport.send, grad, dst=server, tag=key)
    ...
    fut.result()           # re-raises the job's exception, if any

:class:`CommThread` runs jobs in submission order (FIFO). :class:`PriorityCommThread` runs
the queued job with the smallest ``priority`` first (ties in submission order): P3 submits
one job per gradient slice with ``priority = layer index``, so slices of the layers the next
forward pass needs first go out first, and a queued low-priority slice waits behind a
newly submitted high-priority one (preemption at slice granularity). A running job is never
interrupted.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["CommThread", "PriorityCommThread"]

_STOP = object()


class CommThread:
    """A daemon thread executing submitted callables in FIFO order.

    Args:
        name: thread name; it is also the ``thread`` field of events logged by the jobs.

    The thread starts on the first :meth:`submit`. It is a daemon, so a process whose main
    thread dies does not hang on it.
    """

    def __init__(self, name: str = "comm"):
        self.name = name
        self._q = self._make_queue()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.error: BaseException | None = None  # first exception raised by a job

    # a subclass changes the ordering by overriding these two
    def _make_queue(self) -> queue.Queue:
        return queue.Queue()

    def _item(self, priority: int, seq: int, job) -> Any:
        return (seq, job)

    def submit(self, fn: Callable, *args, priority: int = 0, **kwargs) -> Future:
        """Queue ``fn(*args, **kwargs)``; returns a Future of its result.

        ``priority`` is ignored by the FIFO thread (see :class:`PriorityCommThread`); ``fn``
        cannot itself take a keyword argument named ``priority``.

        Raises:
            RuntimeError: the thread was closed.
        """
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"comm thread {self.name!r} is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._q.put(self._item(priority, next(self._seq), (fn, args, kwargs, fut)))
        return fut

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            job = item[-1]
            if job is _STOP:
                return
            fn, args, kwargs, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                if self.error is None:
                    self.error = e
                fut.set_exception(e)

    def pending(self) -> int:
        """Approximate number of queued jobs not yet started."""
        return self._q.qsize()

    def check(self) -> None:
        """Re-raise the first exception a job raised, if any (call it from the compute thread)."""
        if self.error is not None:
            raise self.error

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every job submitted so far has run.

        Raises:
            TimeoutError: not drained after ``timeout`` seconds.
            BaseException: the first exception a job raised.
        """
        if self._thread is not None:
            self.submit(lambda: None, priority=_LOWEST).result(timeout)
        self.check()

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop after the queued jobs have run (idempotent). No submit is accepted afterwards.

        ``wait``: join the thread (at most ``timeout`` seconds).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is None:
                return
            self._q.put(self._item(_LOWEST, next(self._seq), _STOP))
        if wait:
            self._thread.join(timeout)


_LOWEST = 1 << 62  # a priority after every real one (drain and close go last)


class PriorityCommThread(CommThread):
    """A :class:`CommThread` that runs the queued job with the smallest ``priority`` first.

    ``priority``: int, 0 = most urgent (P3: the layer index in forward order). Jobs of equal
    priority run in submission order. :meth:`drain` and :meth:`close` queue behind every job.
    """

    def _make_queue(self) -> queue.Queue:
        return queue.PriorityQueue()

    def _item(self, priority: int, seq: int, job) -> Any:
        return (priority, seq, job)
