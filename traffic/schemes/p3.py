"""Priority-based parameter propagation (``p3``), P3 paper (Jayarajan et al., SysML 2019), Sec. 4.

A parameter server (the ``ps`` scheme's servers, initialisation and layer-wise overlap,
:class:`~traffic.schemes.ps.ParameterServer`) with two changes:

* **Slicing** (P3 Sec. 4.2, "parameter slicing"): every key (parameter tensor) is cut into
  contiguous *slices* of ``slice_params`` elements (option, default 50,000, the paper's
  value, Sec. 5.6; MXNet's later ``dist_p3`` uses 40,000), the last slice of a key holding
  the rest. Slices are numbered in key order (the slice id, also the message tag) and go
  to the servers round robin: slice ``j`` to server ``j mod S`` (:func:`assign_slices`).
  There is no big-array split: slicing replaces it.
* **Priority** (option ``priority``, default true): a slice inherits its layer's priority,
  the layer index in forward order (0 = first layer = most urgent).

Worker (per iteration ``it``):

* ``after_backward(it, l)`` on the compute thread (the *producer*): post the receives of
  every slice of layer ``l`` straight into the model's parameters, then submit one job per
  slice -- a blocking ``send`` of the gradient slice to its server -- to the comm thread
  (the *consumer*), a :class:`~traffic.runtime.comm.PriorityCommThread` keyed by the slice's
  priority. The consumer always starts the queued slice of highest priority (lowest
  number; equal priorities in production order); a slice being sent is never interrupted,
  so a later-produced higher-priority slice preempts the queued lower-priority ones at slice
  granularity. With ``priority: false`` the consumer is FIFO (slicing only: the paper's
  middle curve in Fig. 7).
* ``before_forward(it + 1, l)``: wait until every slice of layer ``l`` has arrived.

Every push is followed by an 8-byte *meta* message (the slice id, tag ``META_TAG``) on the
same worker-server pair, as ps-lite's messages carry their key: a server cannot know in
which order a worker sends (priorities decide), and gloo receives need a tag. Server, per
round: the receives of every own slice from every worker (tag = slice id) and of each
worker's ``n`` meta messages are all posted when the round starts, so a worker's send
never waits for the server to post its receive (gloo hands a send to the socket at once
when the matching receive is already posted; otherwise it first waits a round trip for
the receiver). One receiver thread per worker then takes that worker's meta messages in
arrival order (receives with one tag from one peer match in posting order); the slice
named by meta ``k`` arrived before it on the same connection, so its copy is in; the thread
counts each slice's copies. A slice whose ``W`` copies are all in enters the ready queue, a
priority queue keyed by ``(priority, slice id)`` (with ``priority: false`` a FIFO). The
server's main thread (the consumer) repeatedly takes the head of the ready queue, averages
and updates that slice (SGD, as ``ps``) and at once sends it to every worker
(``broadcast``; there is no pull request, P3 Sec. 4.2).

Events (each with ``iteration``, ``layer``, ``key``, ``slice``, ``priority``, ``bytes``):
worker ``enqueue`` (instant, logged right *after* the slice entered the send queue),
``push`` and ``meta`` (dir tx, each spans its blocking send, on the ``comm`` thread) and
``broadcast`` (dir rx, posted in ``after_backward``, ends when ``before_forward`` has it);
server ``meta`` and ``push`` (dir rx, posted at the round's start; each ends when the
receiver thread ``recv<j>`` of worker ``j`` finds it complete), ``update`` and ``broadcast`` (dir tx, starts when the send is
posted, after the update).
"""
from __future__ import annotations

import itertools
import queue
import threading
from functools import partial
from typing import Iterator, Sequence

import torch
from pydantic import Field

from traffic.runtime.comm import PriorityCommThread
from traffic.runtime.transport import nbytes
from traffic.schemes import register
from traffic.schemes.base import SchemeOptions
from traffic.schemes.ps import ParameterServer, Shard

__all__ = ["SLICE_PARAMS", "assign_slices", "P3"]

SLICE_PARAMS = 50_000
META_TAG = 1 << 30  # tag of the slices' meta messages (slice ids are the data tags)


def assign_slices(numels: Sequence[int], num_servers: int, slice_params: int = SLICE_PARAMS,
                  names: Sequence[str] | None = None) -> list[Shard]:
    """Cut keys into slices of at most ``slice_params`` elements, servers round robin.

    Args:
        numels: elements of each key, in key order.
        num_servers: ``S`` >= 1.
        slice_params: maximum elements per slice; key ``k`` of ``n`` elements gives
            ``ceil(n / slice_params)`` slices ``[i*slice_params, min((i+1)*slice_params, n))``.
        names: the keys' names (default ``"key<i>"``).

    Returns:
        :class:`~traffic.schemes.ps.Shard` s ordered by key then offset, ``id`` = slice id
        = position, ``server = id mod S``; every element of every key is in exactly one.

    Raises:
        ValueError: ``num_servers`` < 1 or ``slice_params`` < 1.
    """
    if num_servers < 1:
        raise ValueError(f"need at least one server, got {num_servers}")
    if slice_params < 1:
        raise ValueError(f"slice_params must be >= 1, got {slice_params}")
    names = list(names) if names is not None else [f"key{k}" for k in range(len(numels))]
    out: list[Shard] = []
    for k, n in enumerate(numels):
        for lo in range(0, int(n), slice_params):
            j = len(out)
            out.append(Shard(j, k, names[k], j % num_servers, lo, min(lo + slice_params, int(n))))
    return out


class P3Options(SchemeOptions):
    """Options of ``p3`` (P3 always overlaps, and slices replace ``ps``'s key split)."""
    slice_params: int = Field(SLICE_PARAMS, gt=0)
    """Maximum parameters per slice (P3 Sec. 4.1: 50,000)."""
    priority: bool = True
    """Send and process slices by priority (false: FIFO, slicing only)."""


@register("p3")
class P3(ParameterServer):
    """Priority-based parameter propagation (see the module docstring). Options: :class:`P3Options`."""
    Options = P3Options
    push_kind = "push"
    pull_kind = "broadcast"

    @property
    def overlapped(self) -> bool:
        """P3 always overlaps communication with backward and forward."""
        return True

    @property
    def prioritized(self) -> bool:
        return self.opts.priority

    def _make_shards(self) -> list[Shard]:
        named = list(self.ctx.model.named_parameters())
        return assign_slices([p.numel() for _, p in named], len(self.server_ranks),
                             self.opts.slice_params, [n for n, _ in named])

    # ---------------------------------------------------------------- worker

    def setup(self) -> None:
        """The ``ps`` setup (slices, initial values to the servers); priority consumer thread."""
        super().setup()
        if self.prioritized:
            self.ctx.comm.close(wait=False)  # never started: nothing ran on it
            self.ctx.comm = PriorityCommThread("comm")

    def _submit_push(self, it: int, layer: int, items: list[tuple[Shard, torch.Tensor]]) -> None:
        """Producer: one job per slice (blocking send + meta), queued with the slice's priority."""
        comm, ev = self.ctx.comm, self.ctx.events
        for s, g in items:
            f = self._fields(it, s)
            comm.submit(partial(self._send_slice, g, s, f), priority=f["priority"])
            ev.instant("enqueue", bytes=nbytes(g), **f)  # after the put: the slice is queued by now

    def _send_slice(self, g: torch.Tensor, s: Shard, f: dict) -> None:
        """Consumer job: the slice's gradient, then its meta message (its id, tag ``META_TAG``)."""
        tr, dst = self.ctx.transport, self.server_ranks[s.server]
        tr.send(g, dst, tag=s.id, kind=self.push_kind, **f)
        tr.send(torch.tensor([s.id], dtype=torch.int64), dst, tag=META_TAG, kind="meta", **f)

    # ---------------------------------------------------------------- server

    def _aggregated(self, it: int) -> Iterator[int]:
        """Complete slices, highest priority first among those complete at each choice
        (completion order with ``priority: false``).

        Every receive of the round is posted first (the slices' into ``self._bufs``, the
        meta messages into one ``(W, n)`` int64 tensor); then one receiver thread per worker
        takes that worker's ``n`` meta messages in the order it sent them and counts the
        copy of the slice each names; a slice whose ``W`` copies are in enters the ready
        queue (the P3Server's priority queue). Raises what a receiver thread raised.
        """
        tr, W, n = self.ctx.transport, len(self.worker_ranks), len(self.mine)
        index = {s.id: i for i, s in enumerate(self.mine)}
        pushes = [[tr.irecv(self._bufs[i][j], wr, tag=s.id, kind=self.push_kind, **self._fields(it, s))
                   for j, wr in enumerate(self.worker_ranks)] for i, s in enumerate(self.mine)]
        metas = torch.empty((W, n), dtype=torch.int64)
        meta_recvs = [[tr.irecv(metas[j, k:k + 1], wr, tag=META_TAG, kind="meta", iteration=it)
                       for k in range(n)] for j, wr in enumerate(self.worker_ranks)]
        left = [W] * n
        lock = threading.Lock()
        ready: queue.Queue = queue.PriorityQueue() if self.prioritized else queue.Queue()
        seq = itertools.count()

        def receive(j: int) -> None:
            try:
                for k in range(n):
                    meta_recvs[j][k].wait()
                    i = index[int(metas[j, k])]
                    pushes[i][j].wait()  # sent before its meta on the same connection: in already
                    with lock:
                        left[i] -= 1
                        if left[i] == 0:
                            s = self.mine[i]
                            order = (self._priority(s), s.id) if self.prioritized else (next(seq),)
                            ready.put((order, i))
            except BaseException as e:  # noqa: BLE001 - handed to the server loop
                ready.put(((-1,), e))

        threads = [threading.Thread(target=receive, args=(j,), name=f"recv{j}", daemon=True)
                   for j in range(W)]
        for t in threads:
            t.start()
        for _ in range(n):
            _, i = ready.get()
            if isinstance(i, BaseException):
                raise i
            yield i
        for t in threads:
            t.join()
