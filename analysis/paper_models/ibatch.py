"""iBatch's model of the pull-plus-forward phase and its batching algorithms, for analysis.

iBatch (Wang, Pi, Zhou, AAAI 2019) pulls a model's parameters in
*batches* of consecutive layers, overlapping the pull of batch ``i+1`` with the forward
computation of batch ``i``. The timing model (eqs. (1)-(5)), the greedy Algorithms 1 and 2
and the exact optimum are what the ``ibatch`` scheme runs to choose its batches, so they
live beside it, in :mod:`traffic.schemes.ibatch.batching` (notation, formulas and the cases
the paper leaves open are documented there); this module re-exports them for reports and
tests, and adds what only analysis needs: :func:`brute_force_batching`, the minimum of
eq. (4) over every one of the ``2^(L-1)`` contiguous batchings, to check the algorithms.
"""

from __future__ import annotations

from traffic.schemes.ibatch.batching import (
    STRATEGIES,
    PullProfile,
    algorithm1,
    algorithm2,
    batch_ranges,
    choose_batching,
    exe_parts,
    exe_time,
    optimal_batching,
    pipeline_time,
    satisfies_constraint,
    strategy_ends,
    validate_ends,
)

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
    "brute_force_batching",
    "strategy_ends",
    "STRATEGIES",
    "BRUTE_FORCE_MAX_LAYERS",
]

BRUTE_FORCE_MAX_LAYERS = 22


def brute_force_batching(p: PullProfile) -> tuple[tuple[int, ...], float]:
    """Minimum of eq. (4) over every contiguous batching meeting eq. (5), by enumeration of
    all ``2^(L-1)`` batchings (for tests).

    Raises:
        ValueError: more than ``BRUTE_FORCE_MAX_LAYERS`` layers.
    """
    L = p.layers
    if L > BRUTE_FORCE_MAX_LAYERS:
        raise ValueError(f"brute force over 2^{L - 1} batchings refused (at most {BRUTE_FORCE_MAX_LAYERS} layers)")
    best = None
    for mask in range(1 << (L - 1)):
        ends = tuple(i + 1 for i in range(L - 1) if mask >> i & 1) + (L,)
        if satisfies_constraint(p, ends):
            t = exe_time(p, ends)
            if best is None or t < best[1]:
                best = (ends, t)
    return best
