"""Stanza's performance models (Stanza §4.2 and §7.1) and its node assignment (eq. 5).

Layer separation's model -- eqs. (2)-(4), the constants of Table 3 (:class:`Constants`) and
the search of eq. (5) (:func:`node_assignment`) -- is what the ``stanza`` scheme runs for
``fc_workers: auto``, so it lives beside the scheme, in
:mod:`traffic.schemes.stanza.assignment` (notation and equations documented there); this
module re-exports it and adds the parameter server's model that §7 compares against:

    (6)  t_ps  = 2 n_w P / (n_s B) + T_ps
    (7)  throughput_ps(n_w, n_s) = n_w K / t_ps

(``n_w`` workers, ``n_s`` servers, ``B`` in bits per second as ``bw_bps``),
:func:`ps_node_assignment`, the analogous search §7.2 applies to PS, and
:func:`stanza_vs_ps`, one point of §7.2's numerical simulation (Fig. 8): both systems on
the same ``N`` nodes, each with its throughput-maximizing node assignment.
"""

from __future__ import annotations

from dataclasses import dataclass

from traffic.schemes.stanza.assignment import (
    BYTES_PER_VALUE,
    Assignment,
    Constants,
    allreduce_rounds,
    best_split,
    check_counts,
    node_assignment,
    split_activations,
    stanza_compute_time,
    stanza_iteration_time,
    stanza_throughput,
    transfer_seconds,
)

__all__ = [
    "BYTES_PER_VALUE",
    "Constants",
    "Assignment",
    "Comparison",
    "allreduce_rounds",
    "stanza_compute_time",
    "stanza_iteration_time",
    "stanza_throughput",
    "ps_iteration_time",
    "ps_throughput",
    "node_assignment",
    "ps_node_assignment",
    "split_activations",
    "stanza_vs_ps",
]


def ps_iteration_time(c: Constants, n_w: int, n_s: int, bw_bps: float) -> float:
    """Stanza eq. (6): PS training time per iteration ``t_ps = 2 n_w P / (n_s B) + T_ps`` (s).

    Raises:
        ValueError: ``n_w`` or ``n_s`` < 1, or ``bw_bps`` <= 0.
    """
    check_counts(n_w, n_s)
    return transfer_seconds(2 * n_w * c.P / n_s, bw_bps) + c.T_ps


def ps_throughput(c: Constants, n_w: int, n_s: int, bw_bps: float) -> float:
    """Stanza eq. (7): ``n_w K / t_ps`` in samples per second."""
    return n_w * c.K / ps_iteration_time(c, n_w, n_s, bw_bps)


def ps_node_assignment(c: Constants, N: int, bw_bps: float) -> Assignment:
    """The PS counterpart (§7.2): ``(n_w, n_s)`` with ``n_w + n_s = N`` maximizing eq. (7).

    Raises:
        ValueError: ``N`` < 2 or ``bw_bps`` <= 0.
    """
    if N < 2:
        raise ValueError(f"PS needs at least 2 nodes, got N={N}")
    return best_split(N, lambda a, b: ps_iteration_time(c, a, b, bw_bps), lambda a, b: ps_throughput(c, a, b, bw_bps))


@dataclass(frozen=True)
class Comparison:
    """Stanza against PS on ``N`` nodes in total at ``bw_bps`` (one point of Fig. 8).

    Attributes:
        N: nodes in total (both systems).
        bw_bps: bandwidth at each node, bits per second.
        stanza: eq. (5)'s assignment: ``n_c`` CONV and ``n_f`` FC workers, eq. (3)'s
            ``time_s``, eq. (4)'s ``throughput`` (samples/s).
        ps: §7.2's PS assignment: ``n_c`` = workers ``n_w``, ``n_f`` = servers ``n_s``,
            eq. (6)'s ``time_s``, eq. (7)'s ``throughput`` (samples/s).
    """

    N: int
    bw_bps: float
    stanza: Assignment
    ps: Assignment

    @property
    def speedup(self) -> float:
        """Stanza's throughput over PS's (§7.2 compares throughputs: the two systems' global
        batches ``n_c K`` and ``n_w K`` may differ)."""
        return self.stanza.throughput / self.ps.throughput


def stanza_vs_ps(c: Constants, N: int, bw_bps: float) -> Comparison:
    """Stanza §7.2 (Fig. 8) at one point: :func:`node_assignment` and
    :func:`ps_node_assignment` on ``N`` nodes at ``bw_bps``, with the same constants ``c``
    (``T_c``, ``T_f`` for Stanza, ``T_ps`` for PS).

    Raises:
        ValueError: ``N`` < 2 or ``bw_bps`` <= 0.
    """
    return Comparison(N, bw_bps, node_assignment(c, N, bw_bps), ps_node_assignment(c, N, bw_bps))
