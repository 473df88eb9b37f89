"""Ring allreduce over point-to-point transfers: reduce-scatter, then all-gather, with a
pluggable per-step codec (Pipe-SGD Section 3.1, Fig. 2 (c), and Section 3.2, Fig. 3 (b)).

``p`` members in ring order ``ranks[0] -> ranks[1] -> ... -> ranks[p-1] -> ranks[0]``; the
1-D float32 tensor is cut into ``p`` near-equal contiguous blocks (``torch.tensor_split``;
block ``c`` = ``blk[c]``). The member at position ``i`` sends to ``ranks[i+1]`` and receives
from ``ranks[i-1]`` (indices mod ``p``):

* **reduce-scatter**, steps ``s = 0 .. p-2`` ("transmit and reduce"): send the partial sum of
  block ``(i - s) mod p``, receive the partial sum of block ``(i - s - 1) mod p`` and add it to
  one's own copy of that block. Afterwards position ``i`` holds the full sum of block
  ``(i + 1) mod p``.
* **all-gather**, steps ``s = 0 .. p-2`` ("send back reduced results"): send the reduced block
  ``(i + 1 - s) mod p`` (one's own at ``s = 0``, then the one just received), receive block
  ``(i - s) mod p`` and store it.

With a codec (:mod:`traffic.compression`) every transmitted block is the codec's payload:
in the reduce-scatter the sender encodes its partial sum at each step and the receiver
decodes it before the sum (decompress, sum, compress: Fig. 3 (b)); in the all-gather the
owner of a fully reduced block encodes it once, forwards the payload unchanged around the
ring, and *also replaces its own copy by the decoded payload*, so every member ends with
bit-identical values (replicas of the model must stay equal). Per element, the value is
encoded ``p`` times on its way (``p - 1`` reduce-scatter steps and the all-gather encode):
:data:`compressions_per_element` ``= p``. Each encode errs by at most the codec's
:meth:`~traffic.compression.Codec.error_bound` of the partial sum it encodes.

Cost (Thakur et al. [47], used in Pipe-SGD eq. (5)): ``2(p-1)`` steps, each moving
``n/p`` payload elements per member, i.e. ``2(p-1)/p * n`` bytes sent per member uncompressed
(times the codec's ratio compressed), and ``(p-1)/p * n`` elements summed.

Events (through :class:`~traffic.runtime.transport.Transport` and the event log): one
``reduce_scatter`` / ``all_gather`` event per transfer (``dir`` tx/rx, ``bytes`` = the
payload's real size on the wire, ``peer``, ``step``, ``block``); spans ``compress`` and
``decompress`` (``bytes`` = the float32 bytes coded) and ``reduce`` (``bytes`` = float32
bytes summed), each with ``step``; every event also carries the caller's ``fields``
(``iteration``, ``bucket`` ...).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from traffic.compression import Codec, Identity
from traffic.hostmodel.costs import HostCosts
from traffic.runtime.transport import Transport

__all__ = ["RingStats", "ring_allreduce", "compressions_per_element", "ring_blocks"]


@dataclass
class RingStats:
    """What one ring allreduce did (this member's view).

    Attributes:
        steps: transfer steps (``2(p-1)``).
        bytes_sent: payload bytes this member sent (wire size, compressed if a codec is used).
        compress_s / decompress_s / reduce_s: seconds spent encoding, decoding and summing.
        comm_s: seconds spent waiting for transfers.
    """

    steps: int = 0
    bytes_sent: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    reduce_s: float = 0.0
    comm_s: float = 0.0


def compressions_per_element(p: int) -> int:
    """How many times an element's (partial) sum is encoded in a ring of ``p`` members: ``p``
    (``p - 1`` reduce-scatter steps and one all-gather encode); 0 for ``p = 1``."""
    return p if p > 1 else 0


def ring_blocks(tensor: torch.Tensor, p: int) -> list[torch.Tensor]:
    """The ``p`` contiguous blocks (views) of a 1-D ``tensor``: ``torch.tensor_split`` (the
    first ``numel % p`` blocks have one element more)."""
    return list(torch.tensor_split(tensor, p))


def ring_allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    ranks: Sequence[int],
    codec: Codec | None = None,
    *,
    tag: int = 0,
    costs: HostCosts | None = None,
    **fields,
) -> RingStats:
    """Sum ``tensor`` over the members ``ranks`` in place (see the module docstring).

    Args:
        transport: this process's transport (point-to-point ``isend``/``irecv``).
        tensor: 1-D contiguous float32; on return it holds the (decoded) sum, identical on
            every member.
        ranks: global ranks in ring order; must contain ``transport.rank``; every member
            passes the same list and calls in the same order relative to its other ring
            allreduces on the same tags.
        codec: per-step codec (default :class:`~traffic.compression.Identity`: exact sum up
            to float32 summation order).
        tag: base tag; step ``k`` (``0 .. 2p-3``) uses ``tag + k``.
        costs: the process's host-cost accountant: each encode and decode is charged as
            ``codec`` (the uncompressed bytes), each local sum as ``aggregate`` (the bytes
            of the incoming block), inside the ``compress``/``decompress``/``reduce``
            spans; None: their real time only.
        fields: extra event fields (``iteration``, ``bucket`` ...).

    Returns:
        :class:`RingStats` of this member.

    Raises:
        ValueError: ``tensor`` not 1-D contiguous float32, or this rank not in ``ranks``.
        RuntimeError / DistBackendError: a neighbour died or a transfer timed out.
    """
    if tensor.dim() != 1 or not tensor.is_contiguous() or tensor.dtype != torch.float32:
        raise ValueError(
            f"ring_allreduce needs a 1-D contiguous float32 tensor, got {tuple(tensor.shape)} "
            f"{tensor.dtype} contiguous={tensor.is_contiguous()}"
        )
    ranks = [int(r) for r in ranks]
    if transport.rank not in ranks:
        raise ValueError(f"rank {transport.rank} is not a member of the ring {ranks}")
    codec = codec or Identity()
    exact = isinstance(codec, Identity)
    p = len(ranks)
    stats = RingStats()
    if p == 1:
        return stats
    i = ranks.index(transport.rank)
    right, left = ranks[(i + 1) % p], ranks[(i - 1) % p]
    blk = ring_blocks(tensor, p)
    ev = transport.events

    def span(kind: str, t0: float, ts: float, **f) -> None:
        if ev is not None:
            ev.record(kind, ts, time.perf_counter() - t0, **{**fields, **f})

    def exchange(
        kind: str, step: int, send: torch.Tensor, recv: torch.Tensor, send_block: int, recv_block: int
    ) -> None:
        t0 = time.perf_counter()
        pend = []
        if recv.numel():
            pend.append(
                transport.irecv(recv, left, tag=tag + step, kind=kind, **{**fields, "step": step, "block": recv_block})
            )
        if send.numel():
            pend.append(
                transport.isend(send, right, tag=tag + step, kind=kind, **{**fields, "step": step, "block": send_block})
            )
            stats.bytes_sent += send.numel() * send.element_size()
        transport.wait_all(pend)
        stats.comm_s += time.perf_counter() - t0
        stats.steps += 1

    def charged(kind: str, nbytes: int):
        return costs.charge(kind, nbytes=nbytes, span=False) if costs is not None else nullcontext()

    def encode(x: torch.Tensor, step: int) -> torch.Tensor:
        ts, t0 = time.time(), time.perf_counter()
        with charged("codec", x.numel() * 4):
            out = codec.encode(x)
        stats.compress_s += time.perf_counter() - t0
        span("compress", t0, ts, step=step, bytes=x.numel() * 4)
        return out

    def decode(payload: torch.Tensor, out: torch.Tensor, step: int) -> torch.Tensor:
        n = out.numel()
        ts, t0 = time.time(), time.perf_counter()
        with charged("codec", n * 4):
            codec.decode(payload, n, out=out)
        stats.decompress_s += time.perf_counter() - t0
        span("decompress", t0, ts, step=step, bytes=n * 4)
        return out

    # ---- reduce-scatter: p-1 transmit-and-reduce steps; a received block is decoded into one
    # buffer the size of the largest block, reused at every step
    decoded = None if exact else torch.empty(blk[0].numel())
    for s in range(p - 1):
        sb, rb = (i - s) % p, (i - s - 1) % p
        n_r = blk[rb].numel()
        send = blk[sb] if exact else encode(blk[sb], s)
        recv = torch.empty(n_r) if exact else codec.empty_payload(n_r)
        exchange("reduce_scatter", s, send, recv, sb, rb)
        part = recv if exact else decode(recv, decoded[:n_r], s)
        ts, t0 = time.time(), time.perf_counter()
        with charged("aggregate", n_r * 4):
            blk[rb].add_(part)
        stats.reduce_s += time.perf_counter() - t0
        span("reduce", t0, ts, step=s, bytes=n_r * 4)

    # ---- all-gather: p-1 steps sending the reduced blocks around
    own = (i + 1) % p
    if exact:
        for s in range(p - 1):
            sb, rb = (own - s) % p, (i - s) % p
            exchange("all_gather", p - 1 + s, blk[sb], blk[rb], sb, rb)
        return stats
    payload = {own: encode(blk[own], p - 1)}
    decode(payload[own], blk[own], p - 1)  # into the block itself: its payload is a copy
    for s in range(p - 1):
        sb, rb = (own - s) % p, (i - s) % p
        payload[rb] = codec.empty_payload(blk[rb].numel())
        exchange("all_gather", p - 1 + s, payload.pop(sb), payload[rb], sb, rb)  # sent: no longer held
        decode(payload[rb], blk[rb], p - 1 + s)
    return stats
