"""iBatch's model of the pull-plus-forward phase and its batching algorithms (what the
``ibatch`` scheme runs to choose its batches; :mod:`analysis.paper_models.ibatch` re-exports them).

iBatch (Wang, Pi, Zhou, AAAI 2019, "iBatch Design and
Implementation") pulls a model's parameters from the parameter servers in *batches* of
consecutive layers, overlapping the pull of batch ``i+1`` with the forward computation of
batch ``i``. A profile (:class:`PullProfile`) gives, per layer ``i`` (forward order), the
forward time ``C^i`` and the transfer time ``T_t^i`` of its parameters, and the start-up
time ``T_s`` that every pull pays once.

A batching is written as the paper writes it: the tuple ``ends = (l_1, ..., l_N)`` of the
last layer of each batch, 1-based, strictly increasing, ``l_N = L``; batch ``i`` is layers
``l_{i-1}+1 .. l_i`` (``l_0 = 0``). In 0-based Python ranges, batch ``i`` is
``range(l_{i-1}, l_i)`` (:func:`batch_ranges`). The ``default`` parameter server is the
batching ``(L,)``, the layer-by-layer strategy ``(1, 2, ..., L)`` (:func:`strategy_ends`).

Formulas (times in seconds, any consistent unit):

* eq. (1) ``EXE_1 = T_s + sum_{1<=i<=l_1} T_t^i`` (pull of the first batch, not overlapped);
* eq. (2) ``EXE_2 = (N-1) T_s + sum_{l_1<i<=L} T_t^i`` (pulls of batches 2..N);
* eq. (3) ``EXE_3 = sum_{l_{N-1}<i<=L} C^i`` (forward of the last batch);
* eq. (4) ``ExeTime = EXE_1 + EXE_2 + EXE_3`` -- :func:`exe_time`;
* constraint (5): for ``0 < k < N``, ``T_s + sum_{l_k<i<=l_{k+1}} T_t^i >= sum_{l_{k-1}<i<=l_k}
  C^i`` (the pull of batch ``k+1`` covers the forward of batch ``k``) --
  :func:`satisfies_constraint`.

Eq. (4) is the phase's length only when (5) holds (every pull is then on the critical
path). :func:`pipeline_time` is the length of the two-thread timeline for any batching
(pulls back to back on one thread; the forward of a batch starts once its pull is done and
the previous batch's forward is over); it equals eq. (4) under (5).

Algorithms: :func:`algorithm1` (Algorithm 1, ``l_1`` first), :func:`algorithm2`
(Algorithm 2, ``l_{N-1}`` first), :func:`choose_batching` (the smaller eq. (4) of the two).
For comparison (the scheme records it in ``ibatch.json``): :func:`optimal_batching`, the
exact minimum of eq. (4) under (5) by dynamic programming. Plain Python arithmetic on
lists (the module itself uses neither torch nor pandas).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

__all__ = [
    "PullProfile",
    "batch_ranges",
    "validate_ends",
    "exe_parts",
    "exe_time",
    "satisfies_constraint",
    "pipeline_time",
    "algorithm1",
    "algorithm2",
    "choose_batching",
    "optimal_batching",
    "strategy_ends",
    "Strategy",
    "STRATEGIES",
]

Strategy = Literal["default", "layer_by_layer", "ibatch"]
"""A pull strategy: one pull of every layer, one pull per layer, or iBatch's batches."""
STRATEGIES: tuple[str, ...] = get_args(Strategy)


@dataclass
class PullProfile:
    """Per-layer forward times, per-layer pull transfer times and the pull start-up time.

    Attributes:
        forward_s: ``C^i`` of every layer, forward order, seconds (>= 0).
        transfer_s: ``T_t^i`` of every layer's parameters, seconds (>= 0), same length.
        startup_s: ``T_s``, seconds (>= 0), paid once per pull.

    Raises:
        ValueError: lengths differ, no layer, or a negative time.
    """

    forward_s: Sequence[float]
    transfer_s: Sequence[float]
    startup_s: float
    _c: list = field(init=False, repr=False)
    _t: list = field(init=False, repr=False)

    def __post_init__(self):
        self.forward_s = [float(x) for x in self.forward_s]
        self.transfer_s = [float(x) for x in self.transfer_s]
        self.startup_s = float(self.startup_s)
        if not self.forward_s or len(self.forward_s) != len(self.transfer_s):
            raise ValueError(
                f"need as many forward times as transfer times (>= 1 layer); got "
                f"{len(self.forward_s)} and {len(self.transfer_s)}"
            )
        if min(self.forward_s) < 0 or min(self.transfer_s) < 0 or self.startup_s < 0:
            raise ValueError("profile times must be >= 0")
        self._c = [0.0] + list(itertools.accumulate(self.forward_s))
        self._t = [0.0] + list(itertools.accumulate(self.transfer_s))

    @property
    def layers(self) -> int:
        """``L``, the number of layers."""
        return len(self.forward_s)

    def compute(self, a: int, b: int) -> float:
        """Forward time of layers ``a+1 .. b`` (1-based; 0 <= a <= b <= L), seconds."""
        return self._c[b] - self._c[a]

    def transfer(self, a: int, b: int) -> float:
        """Transfer time of layers ``a+1 .. b`` (1-based), seconds (no start-up)."""
        return self._t[b] - self._t[a]

    def pull(self, a: int, b: int) -> float:
        """Time of one pull of layers ``a+1 .. b``: ``T_s + sum T_t^i``, seconds."""
        return self.startup_s + self.transfer(a, b)

    def to_dict(self) -> dict:
        return {"forward_s": list(self.forward_s), "transfer_s": list(self.transfer_s), "startup_s": self.startup_s}


def validate_ends(ends: Sequence[int], layers: int) -> tuple[int, ...]:
    """Check a batching ``(l_1, ..., l_N)``: strictly increasing, ``l_1 >= 1``, ``l_N = L``.

    Returns:
        The batching as a tuple of ints.

    Raises:
        ValueError: not a contiguous cover of layers ``1 .. L``.
    """
    e = tuple(int(x) for x in ends)
    if not e or e[-1] != layers or e[0] < 1 or any(b <= a for a, b in zip(e, e[1:])):
        raise ValueError(f"batch ends {list(e)} are not strictly increasing from >= 1 to L = {layers}")
    return e


def batch_ranges(ends: Sequence[int]) -> list[tuple[int, int]]:
    """0-based half-open layer ranges ``[(lo, hi), ...]`` of the batches (``lo = l_{i-1}``, ``hi = l_i``)."""
    out, prev = [], 0
    for e in ends:
        out.append((prev, int(e)))
        prev = int(e)
    return out


def exe_parts(p: PullProfile, ends: Sequence[int]) -> tuple[float, float, float]:
    """``(EXE_1, EXE_2, EXE_3)`` of iBatch eqs. (1), (2), (3), seconds.

    Raises:
        ValueError: ``ends`` is not a batching of ``p``'s layers.
    """
    e = validate_ends(ends, p.layers)
    n, l1 = len(e), e[0]
    exe1 = p.pull(0, l1)
    exe2 = (n - 1) * p.startup_s + p.transfer(l1, p.layers)
    exe3 = p.compute(e[-2] if n > 1 else 0, p.layers)
    return exe1, exe2, exe3


def exe_time(p: PullProfile, ends: Sequence[int]) -> float:
    """``ExeTime`` of iBatch eq. (4): ``EXE_1 + EXE_2 + EXE_3`` = ``N T_s + sum T_t + C(last batch)``."""
    return sum(exe_parts(p, ends))


def satisfies_constraint(p: PullProfile, ends: Sequence[int]) -> bool:
    """True if every pull of batch ``k+1`` lasts at least the forward of batch ``k`` (iBatch eq. (5))."""
    e = (0,) + validate_ends(ends, p.layers)
    return all(p.pull(e[k], e[k + 1]) >= p.compute(e[k - 1], e[k]) for k in range(1, len(e) - 1))


def pipeline_time(p: PullProfile, ends: Sequence[int]) -> float:
    """Length of the pull-plus-forward phase with the two threads of iBatch's Implementation
    section, for any batching: pulls run back to back from time 0 (pull ``i`` ends at
    ``P_i = P_{i-1} + T_s + T_t(batch i)``), forward of batch ``i`` ends at ``F_i =
    max(P_i, F_{i-1}) + C(batch i)``; returns ``F_N`` (seconds). Equals eq. (4) when (5) holds."""
    pulled = done = 0.0
    for lo, hi in batch_ranges(validate_ends(ends, p.layers)):
        pulled += p.pull(lo, hi)
        done = max(pulled, done) + p.compute(lo, hi)
    return done


def algorithm1(p: PullProfile) -> tuple[int, ...]:
    """iBatch Algorithm 1: derive ``l_1, l_2, ...`` from the first layer.

    First step: among pairs ``(l_1, l_2)`` meeting eq. (5) for ``k = 1``, those with the
    largest forward time of batch 1 (the overlap), of these the one with the smallest pull
    of batch 1; the paper leaves ``l_2`` open among those, here the one with the smallest
    gap ``pull(batch 2) - C(batch 1)`` (the rule of the later steps), then the smaller
    ``l_2``. Rest: ``l_k`` is the ``l_x > l_{k-1}`` meeting eq. (5) whose pull exceeds the
    forward of batch ``k-1`` the least (ties: the smaller ``l_x``), until ``l_k = L``.

    Cases the paper does not cover: no pair meets (5) -> ``(L,)`` (one pull, the default
    PS, is then the only batching meeting (5)); no ``l_x`` meets (5) in a later step ->
    the remaining layers join the last batch (its pull only grows, so (5) still holds).
    The result therefore always meets (5).
    """
    L = p.layers
    best, key = None, None
    for l1 in range(1, L):
        for l2 in range(l1 + 1, L + 1):
            gap = p.pull(l1, l2) - p.compute(0, l1)
            if gap >= 0:
                k = (-p.compute(0, l1), p.pull(0, l1), gap, l1, l2)
                if key is None or k < key:
                    best, key = (l1, l2), k
    if best is None:
        return (L,)
    ends = list(best)
    prev2, prev1 = best
    while prev1 < L:
        need = p.compute(prev2, prev1)
        cands = [(p.pull(prev1, lx) - need, lx) for lx in range(prev1 + 1, L + 1) if p.pull(prev1, lx) >= need]
        if not cands:
            ends[-1] = L
            break
        lk = min(cands)[1]
        ends.append(lk)
        prev2, prev1 = prev1, lk
    return tuple(ends)


def algorithm2(p: PullProfile) -> tuple[int, ...]:
    """iBatch Algorithm 2: derive ``l_{N-1}, l_{N-2}, ...`` from the last layer.

    First step: among pairs ``(l_{N-1}, l_{N-2})`` (``0 <= l_{N-2} < l_{N-1} < L``) meeting
    eq. (5) for ``k = N-1``, those with the largest forward time of batch ``N-1``, of these
    the one with the smallest forward time of the last batch (ties: the larger
    ``l_{N-2}``). Rest: ``l_k`` is the ``l_x < l_{k+1}`` meeting eq. (5) (the pull of batch
    ``k+2`` covers the forward of layers ``l_x+1 .. l_{k+1}``) with the smallest gap (ties:
    the larger ``l_x``), until ``l_k = 0``.

    Cases the paper does not cover: no pair meets (5) -> ``(L,)``; no ``l_x`` meets (5) in
    a later step (one layer's forward outlasts the next batch's pull) -> the remaining
    layers form the first batch, and the result violates (5) (:func:`choose_batching`
    then does not choose it).
    """
    L = p.layers
    best, key = None, None
    for a in range(1, L):  # a = l_{N-1}
        for b in range(0, a):  # b = l_{N-2}
            if p.pull(a, L) >= p.compute(b, a):
                k = (-p.compute(b, a), p.compute(a, L), -b, -a)
                if key is None or k < key:
                    best, key = (a, b), k
    if best is None:
        return (L,)
    a, b = best
    ends = {L, a}
    nxt1, nxt2 = b, a  # l_{k+1}, l_{k+2}
    while nxt1 > 0:
        ends.add(nxt1)
        comm = p.pull(nxt1, nxt2)
        cands = [(comm - p.compute(lx, nxt1), -lx) for lx in range(0, nxt1) if comm >= p.compute(lx, nxt1)]
        lk = -min(cands)[1] if cands else 0
        nxt1, nxt2 = lk, nxt1
    return tuple(sorted(ends))


def choose_batching(p: PullProfile) -> dict:
    """Both greedy candidates, their eq. (4) times, and the one iBatch uses.

    Returns:
        ``{"algorithm1": ends, "algorithm2": ends, "exe_s": {"algorithm1": s, "algorithm2":
        s}, "meets_constraint": {...: bool}, "chosen": "algorithm1" | "algorithm2", "ends":
        the chosen ends}``: the candidate meeting eq. (5) with the smaller eq. (4) (ties:
        Algorithm 1; Algorithm 1's always meets (5)).
    """
    cands = {"algorithm1": algorithm1(p), "algorithm2": algorithm2(p)}
    exe = {k: exe_time(p, e) for k, e in cands.items()}
    ok = {k: satisfies_constraint(p, e) for k, e in cands.items()}
    chosen = min((k for k in cands if ok[k]), key=lambda k: (exe[k], k))
    return {**cands, "exe_s": exe, "meets_constraint": ok, "chosen": chosen, "ends": cands[chosen]}


def optimal_batching(p: PullProfile) -> tuple[tuple[int, ...], float]:
    """Exact minimum of eq. (4) over the batchings meeting eq. (5), by dynamic programming.

    Eq. (4) is ``N T_s + sum_i T_t^i + C(last batch)``; ``g[a][b]`` is the fewest batches of
    a chain meeting (5) that covers layers ``1..b`` and ends with batch ``a+1..b``. ``O(L^3)``.

    Returns:
        ``(ends, exe_s)``; ties go to the batching found first (fewest batches, then the
        smaller last-batch start).
    """
    L, INF = p.layers, float("inf")
    g = [[INF] * (L + 1) for _ in range(L + 1)]
    parent: dict[tuple[int, int], int | None] = {}
    for b in range(1, L + 1):
        g[0][b], parent[(0, b)] = 1, None
    for a in range(1, L):
        for b in range(a + 1, L + 1):
            comm = p.pull(a, b)
            for c in range(0, a):
                if g[c][a] + 1 < g[a][b] and comm >= p.compute(c, a):
                    g[a][b], parent[(a, b)] = g[c][a] + 1, c
    best = min(
        (g[a][L] * p.startup_s + p.transfer(0, L) + p.compute(a, L), g[a][L], a) for a in range(L) if g[a][L] < INF
    )
    ends, a, b = [L], best[2], L
    while a:
        ends.append(a)
        a, b = parent[(a, b)], a
    return tuple(sorted(ends)), best[0]


def strategy_ends(strategy: str, layers: int, ibatch_ends: Sequence[int] | None = None) -> tuple[int, ...]:
    """The batching of a pull strategy: ``default`` ``(L,)``, ``layer_by_layer``
    ``(1, ..., L)``, ``ibatch`` the given ``ibatch_ends`` (from :func:`choose_batching`).

    Raises:
        ValueError: unknown strategy, or ``ibatch`` without ends.
    """
    if strategy == "default":
        return (layers,)
    if strategy == "layer_by_layer":
        return tuple(range(1, layers + 1))
    if strategy == "ibatch":
        if ibatch_ends is None:
            raise ValueError("strategy 'ibatch' needs the batch ends chosen by choose_batching")
        return validate_ends(ibatch_ends, layers)
    raise ValueError(f"unknown pull strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
