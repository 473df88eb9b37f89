"""PHub's hierarchical cross-rack reduction (PHub Sec. 3.4, Fig. 10) and when it pays.

With one PBox per rack, each PBox sums its rack's copies of a chunk, the PBox processes of
the same interface index in every rack then sum their partial sums with a ring allreduce
(:func:`ring_reduce`: :func:`traffic.collectives.ring.ring_allreduce`, reduce-scatter then
all-gather, the "widely used ring reduction" of Sec. 4.8), and each PBox sends the result
to its own rack's workers. The ring runs once per frame (:mod:`~traffic.schemes.phub.frames`:
the frame's chunk sums are one contiguous tensor); its host costs are the emulated
system's, a ring per chunk (Sec. 4.8 models it per chunk: "sending and receiving N
chunk-size messages sequentially, each performing one additional aggregation, for each of
the keys"): each local sum is charged ``aggregate`` by the ring (rate-based, so the frame's
sums cost what the chunks' would), and the per-message overhead is charged per chunk, for
the messages each chunk's own ring would send and receive (:func:`ring_messages`), instead
of per frame transfer.

**When it pays** (Sec. 3.4): when the flat scheme's cross-rack transfer takes longer than
the added latency of a two-level reduction::

    N (R-1) / (R B_Core)  >  max(N / B_PBox, 1 / B_Wkr) + C                  (Sec. 3.4)

per byte of the model, with ``N`` workers per rack, ``R`` racks, ``C = (R-1) / (R B_bn)``,
``B_bn = min(B_PBox, B_Core)`` for the inter-rack step (sharded PSs, or approximately a ring
of racks). Both sides scale as ``1/B``, so any bandwidth unit works if all three use it.
The scheme evaluates it for ``hierarchical: auto`` (:func:`hierarchical_pays`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from traffic.collectives.ring import RingStats, ring_allreduce
from traffic.hostmodel.costs import HostCosts
from traffic.schemes.phub.charges import charge_messages, charges_messages

__all__ = [
    "RING_TAG",
    "inter_rack_cost",
    "HierarchicalTerms",
    "hierarchical_terms",
    "hierarchical_pays",
    "host_racks",
    "ring_tag",
    "ring_messages",
    "ring_reduce",
]

RING_TAG = 1 << 29  # hierarchical ring steps


def inter_rack_cost(racks: int, b_pbox: float, b_core: float) -> float:
    """``C = (R-1) / (R B_bn)``, ``B_bn = min(B_PBox, B_Core)``: time per byte-unit of the
    inter-rack step of hierarchical reduction (PHub Sec. 3.4, sharded PSs or a ring).

    Raises:
        ValueError: ``racks`` < 1 or a bandwidth <= 0.
    """
    if racks < 1 or b_pbox <= 0 or b_core <= 0:
        raise ValueError(f"need R >= 1 and bandwidths > 0; got R={racks}, B_PBox={b_pbox}, B_Core={b_core}")
    return (racks - 1) / (racks * min(b_pbox, b_core))


@dataclass(frozen=True)
class HierarchicalTerms:
    """Both sides of the Sec. 3.4 inequality, per unit of model size over the bandwidth unit.

    ``flat_cross_rack``: ``N (R-1) / (R B_Core)``; ``two_level``: ``max(N / B_PBox,
    1 / B_Wkr) + C``; ``c``: the inter-rack term ``C``; ``pays``: ``flat_cross_rack >
    two_level``.
    """

    flat_cross_rack: float
    two_level: float
    c: float

    @property
    def pays(self) -> bool:
        return self.flat_cross_rack > self.two_level


def hierarchical_terms(
    b_pbox: float, b_core: float, b_wkr: float, racks: int, n: int, c: float | None = None
) -> HierarchicalTerms:
    """The two sides of PHub Sec. 3.4's inequality (module docstring).

    Args:
        b_pbox / b_core / b_wkr: bandwidth of a PBox (all its interfaces), of the network
            core available to one rack (its uplink), of a worker; one unit for all three.
        racks: ``R`` >= 1.
        n: ``N`` workers per rack >= 1.
        c: the inter-rack cost ``C``; default :func:`inter_rack_cost` (a ring of racks).

    Raises:
        ValueError: a bandwidth <= 0, ``racks`` or ``n`` < 1.
    """
    if min(b_pbox, b_core, b_wkr) <= 0 or racks < 1 or n < 1:
        raise ValueError(
            f"need bandwidths > 0, R >= 1, N >= 1; got B_PBox={b_pbox}, B_Core={b_core}, "
            f"B_Wkr={b_wkr}, R={racks}, N={n}"
        )
    c = inter_rack_cost(racks, b_pbox, b_core) if c is None else float(c)
    lhs = n * (racks - 1) / (racks * b_core)
    rhs = max(n / b_pbox, 1 / b_wkr) + c
    return HierarchicalTerms(lhs, rhs, c)


def hierarchical_pays(b_pbox: float, b_core: float, b_wkr: float, racks: int, n: int, c: float | None = None) -> bool:
    """True when PHub Sec. 3.4's inequality holds: hierarchical reduction is potentially
    faster than the flat scheme (arguments as :func:`hierarchical_terms`)."""
    return hierarchical_terms(b_pbox, b_core, b_wkr, racks, n, c).pays


def host_racks(processes: list[dict]) -> dict[str, int]:
    """Rack (from 0) of every host that runs a process of the run, from the entries of
    ``processes.json`` (``ctx.processes``: each with ``host`` and ``rack``, written by the
    harness)."""
    return {p["host"]: p["rack"] for p in processes}


def ring_tag(frame_id: int, racks: int) -> int:
    """Base tag of frame ``frame_id``'s cross-rack ring among ``racks`` PBoxes:
    ``RING_TAG + frame_id * 2(R-1)``; the ring's ``2(R-1)`` steps use the tags from there."""
    return RING_TAG + frame_id * 2 * (racks - 1)


def ring_messages(numel: int, p: int, i: int) -> tuple[int, int]:
    """Messages ``(sent, received)`` member ``i`` of a ring of ``p`` handles in one
    :func:`~traffic.collectives.ring.ring_allreduce` of ``numel`` elements: the ring's
    ``2(p-1)`` steps each send one block and receive one (``p`` near-equal blocks,
    :func:`~traffic.collectives.ring.ring_blocks`), and a transfer of an empty block is
    skipped. ``(0, 0)`` for ``p`` <= 1.

    Raises:
        ValueError: ``i`` not in ``[0, p)`` for ``p`` > 1, or ``numel`` < 0.
    """
    if p <= 1:
        return 0, 0
    if not 0 <= i < p or numel < 0:
        raise ValueError(f"need 0 <= i < p and numel >= 0; got i={i}, p={p}, numel={numel}")
    size = [numel // p + (1 if b < numel % p else 0) for b in range(p)]
    own = (i + 1) % p
    sent = sum(size[(i - s) % p] > 0 for s in range(p - 1)) + sum(size[(own - s) % p] > 0 for s in range(p - 1))
    received = sum(size[(i - s - 1) % p] > 0 for s in range(p - 1)) + sum(size[(i - s) % p] > 0 for s in range(p - 1))
    return sent, received


class _Unmessaged:
    """A transport whose point-to-point transfers are not charged as messages
    (``message=False``): the ring of a frame, whose chunks' messages are charged one by one."""

    def __init__(self, transport):
        self._tr = transport
        self.rank, self.events = transport.rank, transport.events

    def isend(self, *args, **kw):
        return self._tr.isend(*args, message=False, **kw)

    def irecv(self, *args, **kw):
        return self._tr.irecv(*args, message=False, **kw)

    def wait_all(self, pendings) -> None:
        self._tr.wait_all(pendings)


def ring_reduce(
    transport,
    partial: torch.Tensor,
    ring: list[int],
    frame_id: int,
    racks: int,
    chunk_numels: Sequence[int] | None = None,
    costs: HostCosts | None = None,
    **fields,
) -> RingStats:
    """Sum ``partial`` (1-D float32, a PBox's sum of its rack's copies of frame ``frame_id``'s
    chunks, back to back) in place over the PBox processes ``ring`` (global ranks, ring
    order) with a ring allreduce on the tags of :func:`ring_tag` (``racks``: every PBox of the
    run, which fixes the tag range). ``fields`` go into every event of the ring.

    Host costs (module docstring): the ring charges each local sum as ``aggregate`` on
    ``costs``; with ``chunk_numels`` (the elements of each logical chunk in ``partial``) and
    a host model that states a per-message overhead, the ring's transfers are not charged
    per transfer; each chunk is charged the messages of its own ring (:func:`ring_messages`):
    the sent ones before the ring starts, the received ones once it is done.

    Raises:
        RuntimeError / DistBackendError: a peer died or communication timed out.
        ValueError: ``chunk_numels`` do not add up to ``partial``'s elements.
    """
    if chunk_numels is not None and sum(chunk_numels) != partial.numel():
        raise ValueError(f"chunks of {sum(chunk_numels)} elements for a partial sum of {partial.numel()}")
    if chunk_numels is None or not charges_messages(costs) or transport.rank not in ring:
        return ring_allreduce(transport, partial, ring, tag=ring_tag(frame_id, racks), costs=costs, **fields)
    p, i = len(ring), ring.index(transport.rank)
    counts = [ring_messages(n, p, i) for n in chunk_numels]
    sizes = [4 * n // p for n in chunk_numels]  # about one block of the chunk per message
    charge_messages(costs, [b for b, (s, _) in zip(sizes, counts) for _ in range(s)], **fields)
    stats = ring_allreduce(_Unmessaged(transport), partial, ring, tag=ring_tag(frame_id, racks), costs=costs, **fields)
    charge_messages(costs, [b for b, (_, r) in zip(sizes, counts) for _ in range(r)], **fields)
    return stats
