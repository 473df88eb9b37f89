"""Decentralized synchronous SGD (``allreduce``): all_reduce the gradients, step locally.

Role ``worker`` only. After the whole backward pass (``on_backward_end``) every worker
all_reduces (gloo; ring algorithm) its gradients, bucket by bucket, divides them by ``W``
and applies ``torch.optim.SGD`` (momentum, weight decay) to its own copy of the model.
Since every worker starts from the same parameters (built from ``workload.seed``) and
applies the same averaged gradient, the copies stay identical, and equal to a single
process training on the global batch.

Buckets, as torch DDP's: keys (parameter tensors) taken in backward order (last layer
first) are packed into flat buckets of at most ``bucket_mb`` MiB; a key larger than that is
a bucket by itself; ``bucket_mb: 0`` gives one all_reduce per key.

Host cost of the local reduction. gloo's ring all_reduce sums inside the collective, out of
our reach: in its reduce-scatter phase each of the ``p = W`` processes adds ``p - 1``
incoming blocks of ``n/p`` bytes to its own, ``(p-1)/p x n`` bytes of an ``n``-byte bucket
(:func:`ring_reduced_bytes`). Source: Pipe-SGD Sec. 3.1: each worker "transmits
only a block of the entire gradient vector to its neighbor and performs the sum reduction on
the received block", and Eq. (5), the Ring-AllReduce model of Thakur et al. [47], whose
summation term is ``(p-1)/p · n · γ`` with "γ the byte sum reduction time". After each
bucket's all_reduce returns, that many bytes are charged as host cost ``aggregate``
(:mod:`traffic.hostmodel.costs`); the block of the charge is the averaging division ``/= W``
(the only reduction work done in Python, counted in the same charge). The real summation
already took place, and its real time was counted, inside the collective (gloo adds while it
communicates), so the emulated iteration holds the summation twice: this machine's real adds
within the measured collective, plus the stated cost after it. The project's own ring
(:func:`traffic.collectives.ring.ring_allreduce` with ``costs=``, used by Pipe-SGD) avoids
that by charging each sum as it happens, with the real work as the floor; this scheme keeps
gloo's collective.

Light memory (``workload.compute.memory: light``, :mod:`traffic.runtime.buffers`): each
bucket is reduced in place on scratch (no copy of the gradients into it), the averaging
division runs on it, and the optimizer step is replayed on scratch; the same collectives
carry the same bytes.

Events: ``allreduce`` per bucket (``bytes`` = the bucket's payload, ``bucket``, ``keys``,
``group_size``), ``host_aggregate`` per bucket (``bytes`` = the charged
:func:`ring_reduced_bytes`, ``bucket``) and ``update`` for the optimizer step.

Messages on the wire (:func:`gloo_ring_sends`): gloo's ring (``gloo/allreduce.cc``,
``ring()``) cuts an ``n``-byte tensor into ``numSegments = roundUp(max(ceil(n /
maxSegmentSize), 2p), p)`` segments of ``ceil(n / numSegments)`` bytes (rounded up to whole
elements; ``maxSegmentSize`` = ``kMaxSegmentSize`` = 1 MiB, ``gloo/allreduce.h``), and each
process sends ``numSegments - numSegments / p`` of them in the reduce-scatter and as many in
the all-gather, skipping those past the tensor's end: messages of at most 1 MiB and at most
``n / 2p``, not ``n / p``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from traffic.runtime.trainer import make_optimizer
from traffic.schemes import register
from traffic.schemes.base import (
    ELEMENT_BYTES,
    ProcessPlan,
    Scheme,
    SchemeOptions,
    count_roles,
    gradient_sync_bytes,
    model_keys,
)

__all__ = ["AllReduce", "make_buckets", "ring_reduced_bytes", "gloo_ring_sends", "GLOO_MAX_SEGMENT_BYTES"]

#: gloo's largest ring segment (``AllreduceOptions::kMaxSegmentSize``, ``gloo/allreduce.h``)
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024


def make_buckets(key_bytes: list[int], bucket_mb: float) -> list[list[int]]:
    """Group keys into buckets in backward order (highest key index first).

    Args:
        key_bytes: payload bytes of each key, in key (forward) order.
        bucket_mb: bucket capacity in MiB; 0 = one key per bucket.

    Returns:
        Lists of key indices; the first bucket holds the last keys.

    Raises:
        ValueError: ``bucket_mb`` < 0.
    """
    if bucket_mb < 0:
        raise ValueError(f"bucket_mb must be >= 0, got {bucket_mb}")
    cap = bucket_mb * 2**20
    buckets: list[list[int]] = []
    cur, size = [], 0
    for k in reversed(range(len(key_bytes))):
        b = key_bytes[k]
        if cur and size + b > cap:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += b
    if cur:
        buckets.append(cur)
    return buckets


def ring_reduced_bytes(nbytes: int, p: int) -> int:
    """Bytes of incoming data one process sums in a ring allreduce of ``nbytes`` over ``p``
    processes: ``(p-1)/p x nbytes`` (the reduce-scatter's ``p - 1`` blocks of ``nbytes/p``;
    Pipe-SGD Sec. 3.1, Eq. (5)), rounded down; 0 for ``p = 1``.

    Raises:
        ValueError: ``nbytes`` < 0 or ``p`` < 1.
    """
    if nbytes < 0 or p < 1:
        raise ValueError(f"need nbytes >= 0 and p >= 1, got nbytes={nbytes}, p={p}")
    return nbytes * (p - 1) // p


def gloo_ring_sends(nbytes: int, p: int, element_bytes: int = ELEMENT_BYTES) -> tuple[int, int]:
    """Messages and bytes that all ``p`` processes together send in one gloo ring
    all_reduce of an ``nbytes`` tensor (the module docstring: ``gloo/allreduce.cc``,
    ``ring()``: in the reduce-scatter rank ``r`` sends segments ``(r+1) numSegments/p + i``
    and in the all-gather ``r numSegments/p + i``, ``i < numSegments (p-1)/p``, modulo
    ``numSegments``, each only if it starts before the tensor's end).

    Returns:
        ``(messages, bytes)``; ``(0, 0)`` for ``p = 1`` or an empty tensor.

    Raises:
        ValueError: ``nbytes`` < 0, ``p`` < 1 or ``element_bytes`` < 1.
    """
    if nbytes < 0 or p < 1 or element_bytes < 1:
        raise ValueError(f"need nbytes >= 0, p >= 1, element_bytes >= 1; got {nbytes}, {p}, {element_bytes}")
    if p == 1 or nbytes == 0:
        return 0, 0
    max_seg = element_bytes * max(1, GLOO_MAX_SEGMENT_BYTES // element_bytes)
    n_seg = max(math.ceil(nbytes / max_seg), 2 * p)
    n_seg = math.ceil(n_seg / p) * p
    seg = math.ceil(math.ceil(nbytes / n_seg) / element_bytes) * element_bytes
    # in each phase a rank sends every segment but those of one rank's block, so every
    # segment goes out p - 1 times per phase; segments past the end (offset >= nbytes) never
    nonempty = math.ceil(nbytes / seg)
    return 2 * (p - 1) * nonempty, 2 * (p - 1) * nbytes


class AllReduceOptions(SchemeOptions):
    """Options of ``allreduce``."""

    bucket_mb: float = Field(25.0, ge=0)
    """Bucket capacity in MiB (25, as torch DDP's ``bucket_cap_mb``; 0: one bucket per tensor)."""


@register("allreduce")
class AllReduce(Scheme):
    """All_reduce of the gradients after backward, then a local SGD step (module docstring).
    Options: :class:`AllReduceOptions`."""

    roles = ("worker",)
    Options = AllReduceOptions

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message (:meth:`Scheme.message_bytes`): the segments of gloo's ring
        (:func:`gloo_ring_sends`) of each bucket of :func:`make_buckets` (``bucket_mb``,
        option) over the plan's workers: about ``min(bucket / 2W, 1 MiB)``. ``math.inf`` for
        one worker (no message).

        Raises:
            KeyError: unknown model.
        """
        p = count_roles(processes).get("worker", 0)
        key_bytes = [ELEMENT_BYTES * n for n, _ in model_keys(workload.model)]
        msgs = sent = 0
        for keys in make_buckets(key_bytes, cls.options_of(workload).bucket_mb):
            m, b = gloo_ring_sends(sum(key_bytes[k] for k in keys), p)
            msgs, sent = msgs + m, sent + b
        return sent / msgs if msgs else math.inf

    @classmethod
    def min_sent_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float | None:
        """:meth:`Scheme.min_sent_bytes`: the workers all-reduce their whole float32 gradient
        every iteration: :func:`~traffic.schemes.base.gradient_sync_bytes` of the workers (a
        ring sends ``2 (W - 1) / W`` of it from each host, twice the bound)."""
        return gradient_sync_bytes(workload, processes)

    light_refusal = None

    @classmethod
    def light_buffer_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """:meth:`Scheme.light_buffer_bytes`: the largest bucket of :func:`make_buckets`
        (reduced in place on scratch).

        Raises:
            KeyError: unknown model.
        """
        key_bytes = [ELEMENT_BYTES * n for n, _ in model_keys(workload.model)]
        return max(
            sum(key_bytes[k] for k in keys) for keys in make_buckets(key_bytes, cls.options_of(workload).bucket_mb)
        )

    def setup(self) -> None:
        ctx = self.ctx
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        # light memory: no optimizer state; its step is replayed on scratch (traffic.runtime.buffers)
        self.optimizer = None if ctx.buffers.light else make_optimizer(self.params, ctx.workload.optimizer)
        self.buckets = make_buckets([p.numel() * p.element_size() for p in self.params], self.opts.bucket_mb)
        worker_ranks = ctx.ranks("worker")
        # every process is a worker for this scheme; a group only if others share the job
        self.group = None if len(worker_ranks) == ctx.world_size else ctx.transport.new_group(worker_ranks)
        self.W = len(worker_ranks)

    def on_backward_end(self, it: int) -> None:
        """All_reduce each bucket of gradients, average, and step the optimizer. Each
        bucket's local reduction is charged as host cost ``aggregate`` (module docstring)."""
        tr, buffers = self.ctx.transport, self.ctx.buffers
        for b, keys in enumerate(self.buckets):
            grads = [buffers.grad(self.params[k]) for k in keys]
            flat = buffers.flat(grads)
            tr.all_reduce(flat, group=self.group, kind="allreduce", iteration=it, bucket=b, keys=keys)
            # gloo summed inside the collective; charge that sum here (module docstring)
            with self.ctx.costs.charge(
                "aggregate",
                nbytes=ring_reduced_bytes(flat.numel() * flat.element_size(), self.W),
                iteration=it,
                bucket=b,
            ):
                flat /= self.W
            if buffers.light:
                continue
            off = 0
            for g in grads:
                g.copy_(flat[off : off + g.numel()].view_as(g))
                off += g.numel()
        self.step(it)

    def step(self, it: int) -> None:
        """The optimizer step on the averaged gradients (a subclass may change them first)."""
        with self.ctx.events.span("update", iteration=it):
            if self.optimizer is None:
                self.ctx.buffers.replay_sgd(sum(p.numel() for p in self.params), self.ctx.workload.optimizer)
            else:
                self.optimizer.step()
