"""Communication over torch.distributed (gloo) that logs every transfer as an event.

A thin layer: point-to-point ``send``/``recv``/``isend``/``irecv`` with tags, and the
collectives gloo offers (``all_reduce``, ``broadcast``, ``all_gather``, ``barrier``) on the
default group or a group from :meth:`Transport.new_group`. Ranks are always *global*
torch.distributed ranks (see ``Context.ranks(role)``).

Each completed operation writes one event (see :mod:`.events`): ``kind`` (``send``/``recv``
by default; schemes pass their own, e.g. ``push``, ``pull``, ``allreduce``), ``bytes`` (the
payload: ``numel * element_size`` of the tensor sent, received or reduced -- not the bytes on
the wire, which for a ring all_reduce are ``2(p-1)/p`` times that per process), ``peer`` (the
other end's rank, point-to-point only), ``dir`` (``tx``/``rx``, point-to-point only) and
``group_size`` (collectives only), plus whatever fields the caller passes (``iteration``,
``layer``, ``key`` ...). A blocking call's event spans the call; an asynchronous one's spans
from posting to the return of :meth:`Pending.wait` -- call ``wait`` to get the event.

Matching rules are gloo's: messages between a pair of ranks with the same tag arrive in the
order sent; a ``recv`` with ``src=None`` takes a message from any rank (with that tag).
Collectives must be issued in the same order by every member of the group: issue them from
one thread (e.g. the comm thread) when several threads communicate.
"""
from __future__ import annotations

import threading
import time
from typing import Sequence

import torch
import torch.distributed as dist

from traffic.runtime.events import EventLog, thread_name

__all__ = ["Transport", "Pending", "nbytes"]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT}


def nbytes(t: torch.Tensor) -> int:
    """Payload size of a tensor in bytes (``numel * element_size``)."""
    return t.numel() * t.element_size()


class Pending:
    """An asynchronous operation in flight; :meth:`wait` completes it and logs its event."""

    def __init__(self, log: EventLog | None, work, kind: str, fields: dict, on_done=None):
        self._log, self._work, self._kind, self._fields = log, work, kind, fields
        self._ts, self._t0 = time.time(), time.perf_counter()
        self._thread = thread_name()
        self._on_done = on_done
        self._done = False
        self.source: int | None = fields.get("peer")

    def wait(self) -> int | None:
        """Block until the operation completes (idempotent).

        Returns:
            For a receive, the rank the message came from; otherwise ``None``.

        Raises:
            RuntimeError / DistBackendError: the operation failed (peer died, timeout).
        """
        if self._done:
            return self.source
        self._work.wait()
        self._done = True
        if self._fields.get("dir") == "rx" and self.source is None:
            self.source = int(self._work._source_rank())
            self._fields["peer"] = self.source
        if self._on_done:
            self._on_done(self._fields)
        if self._log is not None:
            self._log.record(self._kind, self._ts, time.perf_counter() - self._t0,
                             thread=self._thread, **self._fields)
        return self.source if self._fields.get("dir") == "rx" else None

    def is_completed(self) -> bool:
        """True once the operation finished (does not log; call :meth:`wait`)."""
        return self._done or self._work.is_completed()


class Transport:
    """Logged communication primitives for one process.

    Args:
        events: where events go (``None``: log nothing, e.g. in tests).
        rank: this process's global rank.
        world_size: number of processes.

    Attributes:
        bytes_sent / bytes_received: point-to-point payload bytes so far.
        bytes_reduced: payload bytes of completed collectives so far.
    """

    def __init__(self, events: EventLog | None, rank: int, world_size: int):
        self.events, self.rank, self.world_size = events, rank, world_size
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_reduced = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ bookkeeping

    def _count(self, fields: dict) -> None:
        with self._lock:
            d = fields.get("dir")
            if d == "tx":
                self.bytes_sent += fields["bytes"]
            elif d == "rx":
                self.bytes_received += fields["bytes"]
            else:
                self.bytes_reduced += fields["bytes"]

    def _log(self, kind: str, ts: float, t0: float, fields: dict) -> None:
        self._count(fields)
        if self.events is not None:
            self.events.record(kind, ts, time.perf_counter() - t0, **fields)

    @staticmethod
    def _check_recv_buffer(tensor: torch.Tensor) -> None:
        if not tensor.is_contiguous():
            raise ValueError("receive buffer must be contiguous (gloo writes it in place)")

    # ------------------------------------------------------------------ point-to-point

    def send(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, kind: str = "send",
             group=None, **fields) -> None:
        """Send ``tensor`` to rank ``dst``; blocks until gloo has sent it.

        Raises:
            RuntimeError / DistBackendError: the peer is gone or the op timed out.
        """
        tensor = tensor.contiguous()
        f = {**fields, "bytes": nbytes(tensor), "peer": int(dst), "dir": "tx", "tag": tag}
        ts, t0 = time.time(), time.perf_counter()
        dist.send(tensor, dst, group=group, tag=tag)
        self._log(kind, ts, t0, f)

    def recv(self, tensor: torch.Tensor, src: int | None = None, *, tag: int = 0,
             kind: str = "recv", group=None, **fields) -> int:
        """Receive into ``tensor`` (contiguous, of the sent size) from ``src`` (``None``: any rank).

        Returns:
            The sender's rank.

        Raises:
            ValueError: ``tensor`` is not contiguous.
            RuntimeError / DistBackendError: the peer is gone or the op timed out.
        """
        self._check_recv_buffer(tensor)
        ts, t0 = time.time(), time.perf_counter()
        source = dist.recv(tensor, src, group=group, tag=tag)
        f = {**fields, "bytes": nbytes(tensor), "peer": int(source), "dir": "rx", "tag": tag}
        self._log(kind, ts, t0, f)
        return int(source)

    def isend(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, kind: str = "send",
              group=None, **fields) -> Pending:
        """Start sending ``tensor`` to ``dst``; do not modify it before ``wait()`` returns."""
        tensor = tensor.contiguous()
        f = {**fields, "bytes": nbytes(tensor), "peer": int(dst), "dir": "tx", "tag": tag}
        work = dist.isend(tensor, dst, group=group, tag=tag)
        p = Pending(self.events, work, kind, f, on_done=self._count)
        p._keep = tensor  # keep a contiguous copy alive until sent
        return p

    def irecv(self, tensor: torch.Tensor, src: int | None = None, *, tag: int = 0,
              kind: str = "recv", group=None, **fields) -> Pending:
        """Start receiving into ``tensor`` from ``src`` (``None``: any rank).

        ``Pending.wait()`` returns the sender's rank.

        Raises:
            ValueError: ``tensor`` is not contiguous.
        """
        self._check_recv_buffer(tensor)
        f = {**fields, "bytes": nbytes(tensor), "peer": None if src is None else int(src),
             "dir": "rx", "tag": tag}
        work = dist.irecv(tensor, src, group=group, tag=tag)
        return Pending(self.events, work, kind, f, on_done=self._count)

    @staticmethod
    def wait_all(pendings: Sequence[Pending]) -> None:
        """``wait()`` on each, in order."""
        for p in pendings:
            p.wait()

    # ------------------------------------------------------------------ collectives

    @staticmethod
    def _group_size(group) -> int:
        return dist.get_world_size(group)

    def all_reduce(self, tensor: torch.Tensor, *, op: str = "sum", group=None, async_op: bool = False,
                   kind: str = "allreduce", **fields) -> Pending | None:
        """Reduce ``tensor`` in place over ``group`` (default: all processes); gloo's ring algorithm.

        ``op``: ``sum``, ``max``, ``min`` or ``product``. With ``async_op`` returns a
        :class:`Pending` (the tensor holds the result after ``wait()``).

        Raises:
            KeyError: unknown ``op``.
            RuntimeError / DistBackendError: a member is gone or the op timed out.
        """
        f = {**fields, "bytes": nbytes(tensor), "group_size": self._group_size(group), "op": op}
        return self._collective(kind, f, async_op,
                                lambda: dist.all_reduce(tensor, op=_OPS[op], group=group, async_op=async_op))

    def broadcast(self, tensor: torch.Tensor, src: int, *, group=None, async_op: bool = False,
                  kind: str = "broadcast", **fields) -> Pending | None:
        """Copy ``tensor`` of global rank ``src`` into ``tensor`` of every member of ``group``."""
        f = {**fields, "bytes": nbytes(tensor), "group_size": self._group_size(group), "src": int(src)}
        return self._collective(kind, f, async_op,
                                lambda: dist.broadcast(tensor, src, group=group, async_op=async_op))

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor, *, group=None,
                   async_op: bool = False, kind: str = "all_gather", **fields) -> Pending | None:
        """Gather every member's ``tensor`` into ``out`` (one tensor per member, group order).

        ``bytes`` is the size of this process's contribution.
        """
        f = {**fields, "bytes": nbytes(tensor), "group_size": self._group_size(group)}
        return self._collective(kind, f, async_op,
                                lambda: dist.all_gather(out, tensor, group=group, async_op=async_op))

    def _collective(self, kind: str, fields: dict, async_op: bool, call) -> Pending | None:
        """Run ``call()`` (a torch.distributed collective) and log it: now if synchronous,
        when its ``Pending`` is waited on if ``async_op``."""
        ts, t0 = time.time(), time.perf_counter()
        work = call()
        if async_op:
            return Pending(self.events, work, kind, fields, on_done=self._count)
        self._log(kind, ts, t0, fields)
        return None

    def barrier(self, group=None, *, kind: str = "barrier", log: bool = True, **fields) -> None:
        """Wait until every member of ``group`` reaches the barrier (logged as ``barrier``, 0 bytes)."""
        ts, t0 = time.time(), time.perf_counter()
        dist.barrier(group=group)
        if log and self.events is not None:
            self.events.record(kind, ts, time.perf_counter() - t0, **fields)

    def new_group(self, ranks: Sequence[int]):
        """A gloo process group of the given global ranks.

        Collective: every process of the job must call it, with the same ``ranks``, in
        the same order relative to other ``new_group`` calls.
        """
        return dist.new_group(sorted(int(r) for r in ranks), backend="gloo")
