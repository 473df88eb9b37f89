"""Pipe-SGD (``pipe_sgd``): decentralized pipelined SGD with iteration dependency ``K`` and
light compression inside the ring allreduce (Li et al., NeurIPS 2018).

Role ``worker`` only (no servers). Each worker runs Algorithm 1 with two threads:

* the **computation thread** (the :class:`~traffic.runtime.trainer.Trainer` loop, real or
  emulated compute) computes the local gradient of iteration ``t``, copies it into flat
  buffers (the buckets) and hands them to the communication thread, then applies the update
  that depends on the aggregated gradient of iteration ``t - (K - 1)`` (waiting for it only
  if it has not arrived yet);
* the **communication thread** (``ctx.comm``, FIFO) sums each iteration's local gradients
  over all workers with :func:`traffic.collectives.ring.ring_allreduce` -- a ring allreduce
  written over point-to-point transfers so that the codec (``options.compression``:
  ``none``, ``truncation`` = 16-bit truncation "T", ``quantization`` = 8-bit quantization
  "Q", :mod:`traffic.compression`) acts at every transmit-and-reduce step (Section 3.2) --
  and buffers the result for the computation thread.

So with ``K >= 2`` the communication of iteration ``t`` overlaps the computation of
iteration ``t + 1``; ``K = 1`` waits for its own gradient at once: decentralized synchronous
SGD (D-Sync), with the same parameters as ``allreduce`` and a single process on the global
batch. The paper's choice is ``K = 2`` (Section 3.1: larger ``K`` only adds staleness).

**Indexing convention.** Iterations ``t = 0 .. T-1`` as the trainer counts them. The update
made at the end of iteration ``t`` (after its backward pass, before the forward pass of
``t + 1``) is::

    w <- SGD step of w with gradient  g_sum[t - (K - 1)] / W      (zero if t - (K - 1) < 0)

where ``g_sum[j]`` is the sum over the ``W`` workers of the local gradients computed in
iteration ``j`` (on the parameters of iteration ``j``), and the SGD step is
:func:`~traffic.runtime.trainer.make_optimizer`'s (momentum, weight decay). With ``K = 2`` the
update at the end of iteration ``t`` uses exactly the aggregated gradient of iteration
``t - 1``: the staleness is ``K - 1`` = 1. This is Algorithm 1 with its update (lines 4-5 of
iteration ``t + 1``: ``w[t+1] = w[t] - gamma * g_sum[t+1-K]``) written at the end of
iteration ``t`` -- the same operations in the same order on the computation thread -- except
at the two ends: Algorithm 1 starts with an update from ``g_sum[1-K] = 0`` on ``w[0]`` (a
step with a zero gradient, which with weight decay still shrinks ``w[0]`` and which D-Sync does
not have), and ends without applying ``g_sum[T-K+1]``. Here the **first ``K - 1``**
aggregated gradients are zero (updates ``t = 0 .. K-2`` are steps of the optimizer with zero
gradients: only weight decay and momentum act), every one of the ``T`` iterations ends with
an update, and the aggregated gradients of the last ``K - 1`` iterations are communicated
(Algorithm 1's communication thread runs all ``T``) but never applied. With this convention
``K = 1`` is exactly D-Sync.

Buckets (option ``bucket_mb``): ``None`` (default) sends the whole gradient as one ring
allreduce after the backward pass, the paper's *sequential gradient communication*, which its
eq. (5)/(6) show is best when communication-bound; a number cuts the gradient into buckets of
that many MiB as ``allreduce`` does (:func:`traffic.schemes.allreduce.make_buckets`), all
still sent after the backward pass, one ring allreduce each, in order.

Light memory (``workload.compute.memory: light``, :mod:`traffic.runtime.buffers`): the
buckets are views of scratch (no copy of the gradients; iterations in flight share it), the
ring reduces them in place, and the optimizer step is replayed on scratch; the ring sends
the same messages.

Events (worker): per bucket and iteration an ``allreduce`` span on the ``comm`` thread
(``bytes`` = float32 payload, ``wire_bytes`` = bytes this worker sent, ``compression``,
``compress_s``, ``decompress_s``, ``reduce_s``, ``group_size``) containing the ring's own
events (``reduce_scatter``/``all_gather`` transfers, ``compress``/``decompress``/``reduce``
spans, see :mod:`traffic.collectives.ring`); on the computation thread ``pack`` (copying the
local gradient), ``wait_gradient`` (blocked on ``g_sum[t-K+1]``; ``grad_iteration``) and
``update`` (``grad_iteration``: the iteration whose aggregated gradient was applied, ``None``
for a zero gradient; ``staleness`` = ``K - 1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Literal

import torch
from pydantic import Field

from traffic.collectives.ring import ring_allreduce
from traffic.compression import make_codec
from traffic.runtime.trainer import make_optimizer
from traffic.schemes import register
from traffic.schemes.allreduce import make_buckets
from traffic.schemes.base import (
    ELEMENT_BYTES,
    ProcessPlan,
    Scheme,
    SchemeOptions,
    count_roles,
    gradient_sync_bytes,
    model_keys,
)

__all__ = ["PipeSGD", "PipeSGDOptions", "Compression", "grad_iteration", "SWITCH_INTERVAL_S"]

Compression = Literal["none", "truncation", "quantization"]
"""The codecs of :data:`traffic.compression.CODECS` by name: none, 16-bit truncation "T",
8-bit quantization "Q"."""

#: CPython GIL switch interval (seconds) set in Pipe-SGD workers (default 0.005).
SWITCH_INTERVAL_S = 0.0002


def grad_iteration(t: int, K: int) -> int | None:
    """Iteration whose aggregated gradient the update at the end of iteration ``t`` applies:
    ``t - (K - 1)``, or ``None`` (a zero gradient) for the first ``K - 1`` iterations."""
    j = t - (K - 1)
    return j if j >= 0 else None


class PipeSGDOptions(SchemeOptions):
    """Options of ``pipe_sgd``."""

    K: int = Field(2, ge=1)
    """Iteration dependency: the update at the end of iteration ``t`` applies the aggregated
    gradient of iteration ``t - (K - 1)`` (1 = D-Sync; 2 = Pipe-SGD, the paper's choice)."""
    compression: Compression = "none"
    """Codec applied at every transmit-and-reduce step of the ring allreduce: ``none``,
    ``truncation`` (16-bit) or ``quantization`` (8-bit)."""
    bucket_mb: float | None = Field(None, ge=0)
    """``null``: the whole gradient in one ring allreduce (the paper's sequential gradient
    communication); a number of MiB: buckets as ``allreduce``'s (0 = one per parameter tensor)."""


@register("pipe_sgd")
class PipeSGD(Scheme):
    """Pipe-SGD worker (see the module docstring). Options: :class:`PipeSGDOptions`."""

    roles = ("worker",)
    Options = PipeSGDOptions
    # A thread that gets a transfer back must not wait CPython's default 5 ms switch
    # interval for the GIL while the other thread runs Python code: with 2(p-1) ring steps
    # per allreduce that would put up to 2(p-1) x 5 ms on the communication path.
    switch_interval_s = SWITCH_INTERVAL_S
    light_refusal = None

    @classmethod
    def light_buffer_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """:meth:`Scheme.light_buffer_bytes`: the largest bucket (``bucket_mb``; null: the
        whole gradient), reduced in place on scratch.

        Raises:
            KeyError: unknown model.
        """
        o = cls.options_of(workload)
        key_bytes = [ELEMENT_BYTES * n for n, _ in model_keys(workload.model)]
        if o.bucket_mb is None:
            return sum(key_bytes)
        return max(sum(key_bytes[k] for k in keys) for keys in make_buckets(key_bytes, float(o.bucket_mb)))

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message (:meth:`Scheme.message_bytes`): the project's ring
        (:func:`~traffic.collectives.ring.ring_allreduce`) cuts each bucket (``bucket_mb``,
        option; null: the whole gradient) into ``p`` blocks (``torch.tensor_split``), and
        every block goes ``2(p-1)`` times round the ring of the plan's ``p`` workers as the
        codec's payload (``compression``, option: :meth:`~traffic.compression.Codec.payload_bytes`,
        e.g. half the bytes for ``truncation``); empty blocks are not sent. ``math.inf``
        for one worker.

        Raises:
            KeyError: unknown model.
        """
        o = cls.options_of(workload)
        p = count_roles(processes).get("worker", 0)
        if p < 2:
            return math.inf
        codec = make_codec(o.compression)
        numels = [n for n, _ in model_keys(workload.model)]
        buckets = (
            [list(range(len(numels)))]
            if o.bucket_mb is None
            else make_buckets([ELEMENT_BYTES * n for n in numels], float(o.bucket_mb))
        )
        blocks = [
            n // p + (1 if b < n % p else 0)
            for keys in buckets
            for n in [sum(numels[k] for k in keys)]
            for b in range(p)
        ]
        sent = [codec.payload_bytes(n) for n in blocks if n > 0]
        return sum(sent) / len(sent) if sent else math.inf

    @classmethod
    def min_sent_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float | None:
        """:meth:`Scheme.min_sent_bytes`: the workers ring-all-reduce their whole gradient
        every iteration (the last ``K - 1`` iterations' too), each element sent as the codec's
        payload (``compression``: :meth:`~traffic.compression.Codec.payload_bytes` of one
        element beyond an empty block's, i.e. 4, 2 or 1 byte for none, truncation,
        quantization; a quantized block's 4-byte scale is left out):
        :func:`~traffic.schemes.base.gradient_sync_bytes` of the workers at that size."""
        codec = make_codec(cls.options_of(workload).compression)
        return gradient_sync_bytes(workload, processes, element_bytes=codec.payload_bytes(1) - codec.payload_bytes(0))

    def setup(self) -> None:
        ctx = self.ctx
        self.K = self.opts.K
        self.codec = make_codec(self.opts.compression)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        # light memory: no optimizer state; its step is replayed on scratch (traffic.runtime.buffers)
        self.optimizer = None if ctx.buffers.light else make_optimizer(self.params, ctx.workload.optimizer)
        b = self.opts.bucket_mb
        if b is None:
            self.buckets = [list(reversed(range(len(self.params))))]
        else:
            self.buckets = make_buckets([p.numel() * p.element_size() for p in self.params], float(b))
        self.ring = ctx.ranks("worker")
        self.W = len(self.ring)
        self._sums: dict[int, Future] = {}  # iteration -> future of its aggregated buckets
        ctx.results.update(K=self.K, compression=self.codec.name)

    # ---------------------------------------------------------------- communication thread

    def _allreduce(self, it: int, flats: list[torch.Tensor]) -> list[torch.Tensor]:
        """Ring-allreduce each bucket of iteration ``it`` in place (runs on ``ctx.comm``)."""
        ev = self.ctx.events
        for b, flat in enumerate(flats):
            with ev.span(
                "allreduce",
                iteration=it,
                bucket=b,
                keys=self.buckets[b],
                bytes=flat.numel() * 4,
                group_size=self.W,
                compression=self.codec.name,
            ) as f:
                st = ring_allreduce(
                    self.ctx.transport, flat, self.ring, self.codec, costs=self.ctx.costs, iteration=it, bucket=b
                )
                f.update(
                    wire_bytes=st.bytes_sent,
                    compress_s=st.compress_s,
                    decompress_s=st.decompress_s,
                    reduce_s=st.reduce_s,
                )
        return flats

    # ---------------------------------------------------------------- computation thread

    def on_backward_end(self, it: int) -> None:
        """Hand iteration ``it``'s local gradient to the communication thread, then apply the
        update that uses ``g_sum[it - (K - 1)]`` (zero for the first ``K - 1`` iterations)."""
        ev, buffers = self.ctx.events, self.ctx.buffers
        with ev.span("pack", iteration=it):
            flats = [buffers.flat([buffers.grad(self.params[k]) for k in keys]) for keys in self.buckets]
        self._sums[it] = self.ctx.comm.submit(self._allreduce, it, flats)
        j = grad_iteration(it, self.K)
        if self.optimizer is None:  # light memory: wait as a full worker does, then replay the step
            if j is not None:
                with ev.span("wait_gradient", iteration=it, grad_iteration=j):
                    self._sums.pop(j).result()
            with ev.span("update", iteration=it, grad_iteration=j, staleness=self.K - 1):
                buffers.replay_sgd(sum(p.numel() for p in self.params), self.ctx.workload.optimizer)
            return
        if j is None:
            for p in self.params:
                p.grad = torch.zeros_like(p)
        else:
            with ev.span("wait_gradient", iteration=it, grad_iteration=j):
                sums = self._sums.pop(j).result()
            for keys, flat in zip(self.buckets, sums):
                flat /= self.W
                off = 0
                for k in keys:
                    p = self.params[k]
                    p.grad = flat[off : off + p.numel()].view_as(p)
                    off += p.numel()
        with ev.span("update", iteration=it, grad_iteration=j, staleness=self.K - 1):
            self.optimizer.step()

    def finish(self) -> None:
        """Let the communication of the last ``K - 1`` iterations finish (never applied)."""
        for j in sorted(self._sums):
            self._sums.pop(j).result()
        self.ctx.comm.drain()
