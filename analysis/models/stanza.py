"""Stanza's performance models (stanza.txt §4.2 and §7.1) and its node assignment (eq. 5).

Layer separation's model -- eqs. (2)-(4), the constants of Table 3 (:class:`Constants`) and
the search of eq. (5) (:func:`node_assignment`) -- is what the ``stanza`` scheme runs for
``fc_workers: auto``, so it lives beside the scheme, in
:mod:`traffic.schemes.stanza.assignment` (notation and equations documented there); this
module re-exports it and adds the parameter server's model that §7 compares against:

    (6)  t_ps  = 2 n_w P / (n_s B) + T_ps
    (7)  throughput_ps(n_w, n_s) = n_w K / t_ps

(``n_w`` workers, ``n_s`` servers, ``B`` in bits per second as ``bw_bps``), and
:func:`ps_node_assignment`, the analogous search §7.2 applies to PS.
"""
from __future__ import annotations

from traffic.schemes.stanza.assignment import (BYTES_PER_VALUE, Assignment, Constants, allreduce_rounds,
                                               best_split, check_counts, node_assignment, split_activations,
                                               stanza_compute_time, stanza_iteration_time, stanza_throughput,
                                               transfer_seconds)

__all__ = ["BYTES_PER_VALUE", "Constants", "Assignment", "allreduce_rounds", "stanza_compute_time",
           "stanza_iteration_time", "stanza_throughput", "ps_iteration_time", "ps_throughput",
           "node_assignment", "ps_node_assignment", "split_activations"]


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
    return best_split(N, lambda a, b: ps_iteration_time(c, a, b, bw_bps),
                      lambda a, b: ps_throughput(c, a, b, bw_bps))
