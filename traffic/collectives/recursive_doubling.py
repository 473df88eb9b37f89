"""Recursive-doubling allreduce (sum) over point-to-point transfers, as Stanza §4.1.2 uses it.

The algorithm is MPICH's recursive doubling (Thakur, Rabenseifner and Gropp 2005, Stanza's
reference [44]) for ``p`` processes, indices ``0 .. p-1`` into the ``ranks`` list:

* ``p`` a power of two: ``log2 p`` rounds. In round ``k`` (``k = 1 .. log2 p``) process ``i``
  exchanges its running sum with process ``i XOR 2^(k-1)`` -- neighbours first, then nodes
  2, 4 ... spots away (Stanza Figure 5) -- both directions at once (full duplex), and
  both add the two sums.
* otherwise, with ``q = 2^floor(log2 p)`` and ``r = p - q`` *surplus* processes (Stanza
  §4.1.2): round 0 (``fold``): each surplus process ``q + j`` (``j < r``) sends its tensor
  to process ``j``, which adds it; rounds ``1 .. log2 q``: recursive doubling among
  ``0 .. q-1``; last round (``unfold``): process ``j`` sends the result to ``q + j``.
  ``floor(log2 p) + 2`` rounds in all, as the paper states. The paper picks the surplus
  nodes and their partners at random; here they are the last ``r`` indices and their
  partners the first ``r`` (MPICH pairs them by parity; any fixed choice costs the same).

Every process ends with bit-identical sums: each addition adds the same two operands on
both partners, and floating-point addition of two numbers is commutative (Stanza's
footnote 3: its allreduce must not let workers' copies drift through different rounding).

Each transfer is one :class:`~traffic.runtime.transport.Transport` ``isend``/``irecv`` and so
one event, with ``round`` (0-based, as in :func:`schedule`), ``phase`` (``fold``,
``exchange``, ``unfold``) and the caller's fields; ``bytes`` is the payload of the tensor.

Local sums. Every addition of a received tensor into one's own (the ``fold`` partner's
once, then one per ``exchange`` round; a surplus process sums nothing) is charged, when the
caller passes its host-cost accountant, as host cost ``aggregate`` of the tensor's bytes
(:func:`sums`): ``log2 p`` sums per process when ``p`` is a power of two.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch

from traffic.hostmodel.costs import HostCosts
from traffic.runtime.transport import Transport

__all__ = ["rounds", "schedule", "sums", "allreduce"]


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def rounds(p: int) -> int:
    """Rounds recursive doubling takes for ``p`` processes (Stanza §4.1.2 and eq. (3)).

    ``log2 p`` if ``p`` is a power of two, else ``floor(log2 p) + 2``; 0 for ``p = 1``.

    Raises:
        ValueError: ``p`` < 1.
    """
    if p < 1:
        raise ValueError(f"need at least one process, got {p}")
    q = _pof2(p)
    k = q.bit_length() - 1
    return k if q == p else k + 2


def schedule(p: int) -> list[list[tuple[int, int, str]]]:
    """The transfers of each round: ``schedule(p)[r]`` lists ``(src, dst, phase)`` triples
    (indices into the ranks list) of round ``r``; an ``exchange`` pair appears in both
    directions. ``len(schedule(p)) == rounds(p)``.

    Raises:
        ValueError: ``p`` < 1.
    """
    rounds(p)
    q = _pof2(p)
    r = p - q
    out: list[list[tuple[int, int, str]]] = []
    if r:
        out.append([(q + j, j, "fold") for j in range(r)])
    mask = 1
    while mask < q:
        out.append([(i, i ^ mask, "exchange") for i in range(q)])
        mask <<= 1
    if r:
        out.append([(j, q + j, "unfold") for j in range(r)])
    return out


def sums(p: int, i: int) -> int:
    """Local sums (additions of a received tensor into one's own) process ``i`` of ``p`` does
    in :func:`allreduce`: one per ``exchange`` round it takes part in, plus one for a ``fold``
    partner; 0 for a surplus process and for ``p = 1``.

    Raises:
        ValueError: ``p`` < 1 or ``i`` not in ``0 .. p-1``.
    """
    if not 0 <= i < p:
        raise ValueError(f"need 0 <= i < p, got i={i}, p={p}")
    q = _pof2(p)
    if i >= q:
        return 0
    return (q.bit_length() - 1) + (1 if i < p - q else 0)


def allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    ranks: Sequence[int],
    *,
    tag: int = 0,
    kind: str = "allreduce",
    costs: HostCosts | None = None,
    **fields,
) -> int:
    """Sum ``tensor`` over the processes ``ranks`` in place by recursive doubling.

    Every process of ``ranks`` must call it with a tensor of the same shape and dtype, the
    same ``ranks`` (in the same order) and ``tag``; other processes must not.

    Args:
        transport: this process's transport (its ``rank`` must be in ``ranks``).
        tensor: contiguous tensor, overwritten with the sum over ``ranks``.
        ranks: global ranks of the participants; index ``i`` is the position in this list.
        tag: message tag of every transfer (keep it apart from the caller's other traffic
            between the same processes).
        kind: event kind of every transfer; ``fields`` are added to each event (e.g.
            ``iteration``; not ``group``, which the transport reserves for process groups).
        costs: the process's host-cost accountant: each local sum (:func:`sums` of them) is
            charged as ``aggregate`` of the tensor's bytes, recorded as a ``host_aggregate``
            span with ``round``, ``phase`` and ``fields``; None: their real time only.

    Returns:
        The number of rounds of the algorithm (:func:`rounds` of ``len(ranks)``), whether or
        not this process took part in every round.

    Raises:
        ValueError: this process is not in ``ranks``, ranks repeat, or ``tensor`` is not
            contiguous.
        RuntimeError / DistBackendError: a peer failed.
    """
    ranks = [int(r) for r in ranks]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks repeat: {ranks}")
    if transport.rank not in ranks:
        raise ValueError(f"rank {transport.rank} is not among the allreduce ranks {ranks}")
    if not tensor.is_contiguous():
        raise ValueError("allreduce needs a contiguous tensor (it is reduced in place)")
    p, i = len(ranks), ranks.index(transport.rank)
    n_rounds = rounds(p)
    if p == 1:
        return n_rounds
    q = _pof2(p)
    r = p - q
    f = dict(fields, group_size=p)
    buf = torch.empty_like(tensor)
    nbytes = tensor.numel() * tensor.element_size()

    def charged(rnd: int, phase: str):
        if costs is None:
            return nullcontext()
        return costs.charge("aggregate", nbytes=nbytes, round=rnd, phase=phase, **f)

    rnd = 0
    if r:
        if i >= q:  # surplus: fold in, then wait for the result
            transport.send(tensor, ranks[i - q], tag=tag, kind=kind, round=0, phase="fold", **f)
            transport.recv(tensor, ranks[i - q], tag=tag, kind=kind, round=n_rounds - 1, phase="unfold", **f)
            return n_rounds
        if i < r:
            transport.recv(buf, ranks[i + q], tag=tag, kind=kind, round=0, phase="fold", **f)
            with charged(0, "fold"):
                tensor.add_(buf)
        rnd = 1
    mask = 1
    while mask < q:
        peer = ranks[i ^ mask]
        rx = transport.irecv(buf, peer, tag=tag, kind=kind, round=rnd, phase="exchange", **f)
        tx = transport.isend(tensor, peer, tag=tag, kind=kind, round=rnd, phase="exchange", **f)
        tx.wait()
        rx.wait()
        with charged(rnd, "exchange"):
            tensor.add_(buf)
        mask <<= 1
        rnd += 1
    if r and i < r:
        transport.send(tensor, ranks[i + q], tag=tag, kind=kind, round=rnd, phase="unfold", **f)
    return n_rounds
