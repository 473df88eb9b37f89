"""Communication over torch.distributed (gloo) that logs every transfer as an event.

A thin layer: point-to-point ``send``/``recv``/``isend``/``irecv`` with tags, and the
collectives gloo offers (``all_reduce``, ``broadcast``, ``all_gather``, ``reduce``, ``reduce_scatter``,
``all_to_all``, ``gather``, ``scatter``, ``barrier``) on the
default group or a group from :meth:`Transport.new_group`. Ranks are always *global*
torch.distributed ranks (see ``Context.ranks(role)``).

Each completed operation writes one event (see :mod:`.events`): ``kind`` (``send``/``recv``
by default; schemes pass their own, e.g. ``push``, ``pull``, ``allreduce``), ``bytes`` (the
payload: ``numel * element_size`` of the tensor sent, received or reduced -- not the bytes on
the wire, which for a ring all_reduce are ``2(p-1)/p`` times that per process), ``peer`` (the
other end's rank, point-to-point only), ``dir`` (``tx``/``rx``, point-to-point only) and
``group_size`` and, on a group other than the default, ``group`` (its members' global ranks; collectives only), plus
whatever fields the caller passes (``iteration``,
``layer``, ``key`` ...). A blocking call's event spans the call; an asynchronous one's spans
from posting to the return of :meth:`Pending.wait` -- call ``wait`` to get the event.

Host costs: with a :class:`~traffic.hostmodel.costs.HostCosts` whose model states a
per-message software overhead (``host.message_overhead_us``: the software cost per message
sent and per message received), every point-to-point message is charged
one ``message`` cost (``nbytes`` = its payload) on each end: the sender pays before the
message is posted (``send``, ``isend``: on the calling thread, as a sender's CPU does), the
receiver once it is in (``recv`` after the data arrived; an ``irecv`` in the first
:meth:`Pending.wait`). A blocking call's event includes its charge, as does an ``irecv``'s;
an ``isend``'s starts after it (at posting). A transfer that is not a separate message of
the emulated system passes ``message=False``. Collectives are *not* charged per message:
gloo's algorithms send messages of their own that this layer never sees (a scheme that
models a collective's messages builds it from point-to-point calls, e.g.
:mod:`traffic.collectives.ring`). With no costs, or an overhead of 0, nothing is charged
and no statistics are kept.

Matching rules are gloo's: messages between a pair of ranks with the same tag arrive in the
order sent; a ``recv`` with ``src=None`` takes a message from any rank (with that tag).
Collectives must be issued in the same order by every member of the group: issue them from
one thread (e.g. the comm thread) when several threads communicate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from traffic.hostmodel.costs import HostCosts
from traffic.runtime.events import EventLog, thread_name

__all__ = ["Transport", "Pending", "nbytes"]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def nbytes(t: torch.Tensor) -> int:
    """Payload size of a tensor in bytes (``numel * element_size``)."""
    return t.numel() * t.element_size()


class Pending:
    """An asynchronous operation in flight; :meth:`wait` completes it and logs its event.

    ``charge``: the host costs that charge one ``message`` (the payload's ``bytes``) when the
    operation completes (a received message), or ``None``.
    """

    def __init__(
        self,
        log: EventLog | None,
        work,
        kind: str,
        fields: dict,
        on_done=None,
        charge: HostCosts | None = None,
        on_arrival=None,
    ):
        self._log, self._work, self._kind, self._fields = log, work, kind, fields
        self._on_arrival = on_arrival
        self._ts, self._t0 = time.time(), time.perf_counter()
        self._thread = thread_name()
        self._on_done = on_done
        self._charge = charge
        self._done = False
        self.source: int | None = fields.get("peer")

    def wait(self) -> int | None:
        """Block until the operation completes (idempotent: a received message is charged
        its host cost once, in the first call).

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
        if self._on_arrival is not None:
            self._fields.update(self._on_arrival() or {})
        if self._charge is not None:
            _charge_message(self._charge, self._fields["bytes"])
        if self._on_done:
            self._on_done(self._fields)
        if self._log is not None:
            self._log.record(self._kind, self._ts, time.perf_counter() - self._t0, thread=self._thread, **self._fields)
        return self.source if self._fields.get("dir") == "rx" else None

    def is_completed(self) -> bool:
        """True once the operation finished (does not log; call :meth:`wait`)."""
        return self._done or self._work.is_completed()


def _charge_message(costs: HostCosts, nbytes: int) -> None:
    """One message's software overhead (no real work in the block: the transfer is gloo's)."""
    with costs.charge("message", nbytes=nbytes, span=False):
        pass


class Transport:
    """Logged communication primitives for one process.

    Args:
        events: where events go (``None``: log nothing, e.g. in tests).
        rank: this process's global rank.
        world_size: number of processes.
        costs: the process's host costs: each point-to-point message is charged
            ``costs.model.message_overhead_s`` on each end (module docstring); ``None``, or
            an overhead of 0: nothing is charged. Fixed at construction.

    Attributes:
        bytes_sent / bytes_received: point-to-point payload bytes so far.
        bytes_reduced: payload bytes of completed collectives so far.
    """

    def __init__(self, events: EventLog | None, rank: int, world_size: int, *, costs: HostCosts | None = None):
        self.events, self.rank, self.world_size = events, rank, world_size
        self.costs = costs
        # the costs that charge messages, or None: the default path tests one attribute
        self._message_costs = costs if costs is not None and costs.model.message_overhead_s > 0 else None
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

    def _costs_of(self, message: bool) -> HostCosts | None:
        return self._message_costs if message else None

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        *,
        tag: int = 0,
        kind: str = "send",
        group=None,
        message: bool = True,
        **fields,
    ) -> None:
        """Send ``tensor`` to rank ``dst``; blocks until gloo has sent it.

        ``message``: the transfer is a message of the emulated system (charged its host cost
        before it is posted; module docstring); false: not charged.

        Raises:
            RuntimeError / DistBackendError: the peer is gone or the op timed out.
        """
        tensor = tensor.contiguous()
        f = {**fields, "bytes": nbytes(tensor), "peer": int(dst), "dir": "tx", "tag": tag}
        ts, t0 = time.time(), time.perf_counter()
        costs = self._costs_of(message)
        if costs is not None:
            _charge_message(costs, f["bytes"])
        dist.send(tensor, dst, group=group, tag=tag)
        self._log(kind, ts, t0, f)

    def recv(
        self,
        tensor: torch.Tensor,
        src: int | None = None,
        *,
        tag: int = 0,
        kind: str = "recv",
        group=None,
        message: bool = True,
        **fields,
    ) -> int:
        """Receive into ``tensor`` (contiguous, of the sent size) from ``src`` (``None``: any rank).

        ``message``: as :meth:`send` (charged once the data is in).

        Returns:
            The sender's rank.

        Raises:
            ValueError: ``tensor`` is not contiguous.
            RuntimeError / DistBackendError: the peer is gone or the op timed out.
        """
        self._check_recv_buffer(tensor)
        ts, t0 = time.time(), time.perf_counter()
        source = dist.recv(tensor, src, group=group, tag=tag)
        costs = self._costs_of(message)
        if costs is not None:
            _charge_message(costs, nbytes(tensor))
        f = {**fields, "bytes": nbytes(tensor), "peer": int(source), "dir": "rx", "tag": tag}
        self._log(kind, ts, t0, f)
        return int(source)

    def isend(
        self,
        tensor: torch.Tensor,
        dst: int,
        *,
        tag: int = 0,
        kind: str = "send",
        group=None,
        message: bool = True,
        **fields,
    ) -> Pending:
        """Start sending ``tensor`` to ``dst``; do not modify it before ``wait()`` returns.

        ``message``: as :meth:`send` (the calling thread pays the charge before posting).
        """
        tensor = tensor.contiguous()
        f = {**fields, "bytes": nbytes(tensor), "peer": int(dst), "dir": "tx", "tag": tag}
        costs = self._costs_of(message)
        if costs is not None:
            _charge_message(costs, f["bytes"])
        work = dist.isend(tensor, dst, group=group, tag=tag)
        p = Pending(self.events, work, kind, f, on_done=self._count)
        p._keep = tensor  # keep a contiguous copy alive until sent
        return p

    def irecv(
        self,
        tensor: torch.Tensor,
        src: int | None = None,
        *,
        tag: int = 0,
        kind: str = "recv",
        group=None,
        message: bool = True,
        on_arrival=None,
        **fields,
    ) -> Pending:
        """Start receiving into ``tensor`` from ``src`` (``None``: any rank).

        ``Pending.wait()`` returns the sender's rank. ``message``: as :meth:`send` (charged
        in the first ``wait()``, on the waiting thread, once the data is in).
        ``on_arrival``: called with no argument once the data is in, before the receive is
        counted, charged and logged; the dict it returns updates the event's fields (for a
        message whose size or identity is known only from its payload: P3's slices).
        The message may be shorter than ``tensor`` (gloo accepts it); then ``on_arrival``
        should return the real ``bytes``.

        Raises:
            ValueError: ``tensor`` is not contiguous.
        """
        self._check_recv_buffer(tensor)
        f = {**fields, "bytes": nbytes(tensor), "peer": None if src is None else int(src), "dir": "rx", "tag": tag}
        work = dist.irecv(tensor, src, group=group, tag=tag)
        return Pending(
            self.events, work, kind, f, on_done=self._count, charge=self._costs_of(message), on_arrival=on_arrival
        )

    @staticmethod
    def wait_all(pendings: Sequence[Pending]) -> None:
        """``wait()`` on each, in order."""
        for p in pendings:
            p.wait()

    # ------------------------------------------------------------------ collectives

    @staticmethod
    def _group_of(group) -> dict:
        """A collective's ``group_size`` and, on a group other than the default, its members
        (``group``: their global ranks, sorted)."""
        if group is None:
            return {"group_size": dist.get_world_size()}
        return {"group_size": dist.get_world_size(group), "group": sorted(dist.get_process_group_ranks(group))}

    def all_reduce(
        self,
        tensor: torch.Tensor,
        *,
        op: str = "sum",
        group=None,
        async_op: bool = False,
        kind: str = "allreduce",
        **fields,
    ) -> Pending | None:
        """Reduce ``tensor`` in place over ``group`` (default: all processes); gloo's ring algorithm.

        ``op``: ``sum``, ``max``, ``min`` or ``product``. With ``async_op`` returns a
        :class:`Pending` (the tensor holds the result after ``wait()``).

        Raises:
            KeyError: unknown ``op``.
            RuntimeError / DistBackendError: a member is gone or the op timed out.
        """
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group), "op": op}
        return self._collective(
            kind, f, async_op, lambda: dist.all_reduce(tensor, op=_OPS[op], group=group, async_op=async_op)
        )

    def broadcast(
        self, tensor: torch.Tensor, src: int, *, group=None, async_op: bool = False, kind: str = "broadcast", **fields
    ) -> Pending | None:
        """Copy ``tensor`` of global rank ``src`` into ``tensor`` of every member of ``group``."""
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group), "src": int(src)}
        return self._collective(kind, f, async_op, lambda: dist.broadcast(tensor, src, group=group, async_op=async_op))

    def all_gather(
        self,
        out: list[torch.Tensor],
        tensor: torch.Tensor,
        *,
        group=None,
        async_op: bool = False,
        kind: str = "all_gather",
        **fields,
    ) -> Pending | None:
        """Gather every member's ``tensor`` into ``out`` (one tensor per member, group order).

        ``bytes`` is the size of this process's contribution.
        """
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group)}
        return self._collective(kind, f, async_op, lambda: dist.all_gather(out, tensor, group=group, async_op=async_op))

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        *,
        op: str = "sum",
        group=None,
        async_op: bool = False,
        kind: str = "reduce",
        **fields,
    ) -> Pending | None:
        """Reduce ``tensor`` of every member into ``tensor`` of global rank ``dst``."""
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group), "op": op, "dst": int(dst)}
        return self._collective(
            kind, f, async_op, lambda: dist.reduce(tensor, dst, op=_OPS[op], group=group, async_op=async_op)
        )

    def reduce_scatter(
        self,
        out: torch.Tensor,
        inputs: list[torch.Tensor],
        *,
        op: str = "sum",
        group=None,
        async_op: bool = False,
        kind: str = "reduce_scatter",
        **fields,
    ) -> Pending | None:
        """Reduce ``inputs[i]`` of every member into ``out`` of the ``i``-th member (group
        order). ``bytes`` is the whole buffer reduced (the sum of ``inputs``)."""
        f = {**fields, "bytes": sum(nbytes(t) for t in inputs), **self._group_of(group), "op": op}
        return self._collective(
            kind, f, async_op, lambda: dist.reduce_scatter(out, inputs, op=_OPS[op], group=group, async_op=async_op)
        )

    def all_to_all(
        self,
        out: torch.Tensor,
        tensor: torch.Tensor,
        *,
        group=None,
        async_op: bool = False,
        kind: str = "all_to_all",
        **fields,
    ) -> Pending | None:
        """Member ``j`` gets the ``i``-th equal part of ``tensor`` of member ``i`` as the ``j``-th part of
        ``out`` (``torch.distributed.all_to_all_single``). ``bytes`` is ``tensor``'s whole size."""
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group)}
        return self._collective(
            kind, f, async_op, lambda: dist.all_to_all_single(out, tensor, group=group, async_op=async_op)
        )

    def gather(
        self,
        tensor: torch.Tensor,
        out: list[torch.Tensor] | None,
        dst: int,
        *,
        group=None,
        async_op: bool = False,
        kind: str = "gather",
        **fields,
    ) -> Pending | None:
        """Gather every member's ``tensor`` into ``out`` (one per member) on global rank ``dst``
        (``out`` None elsewhere). ``bytes`` is this process's contribution."""
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group), "dst": int(dst)}
        return self._collective(
            kind, f, async_op, lambda: dist.gather(tensor, out, dst, group=group, async_op=async_op)
        )

    def scatter(
        self,
        tensor: torch.Tensor,
        parts: list[torch.Tensor] | None,
        src: int,
        *,
        group=None,
        async_op: bool = False,
        kind: str = "scatter",
        **fields,
    ) -> Pending | None:
        """Give the ``i``-th of ``parts`` of global rank ``src`` (None elsewhere) to the ``i``-th
        member, into ``tensor``. ``bytes`` is the part this process gets."""
        f = {**fields, "bytes": nbytes(tensor), **self._group_of(group), "src": int(src)}
        return self._collective(
            kind, f, async_op, lambda: dist.scatter(tensor, parts, src, group=group, async_op=async_op)
        )

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
