"""Stanza's performance model of layer separation (Stanza §4.2) and its node assignment
(eq. 5): what the ``stanza`` scheme runs for ``fc_workers: auto``; :mod:`analysis.paper_models.stanza`
re-exports it and adds the parameter server's model (eqs. (6), (7)).

Notation (Stanza Table 3); counts are numbers of values (float32: 4 bytes each), times
seconds, bandwidth ``B`` given here in bits per second (``bw_bps``):

    N          total number of nodes
    n_c, n_f   number of CONV workers and FC workers
    K          per-node batch size
    P          total number of parameters of the model
    A          number of activations of the last CONV layer (the split layer's output),
               per sample
    P_c        number of parameters in all CONV layers
    T_c        single-worker CONV computation time per iteration (forward + backward of
               the CONV layers for one batch of K)
    T_f        single-worker FC computation time per iteration for one CONV worker's
               activations (forward + backward of the FC layers for K samples)
    T_ps       a PS worker's computation time per iteration (the whole model, batch K)

Equations (numbered as in the paper):

    (2)  t_s^c = T_c + (n_c / n_f) T_f
    (3)  t_s   = t_s^c + 2 n_c A K / (n_f B) + P_c R(n_c) / B,
               R(n) = log2 n if n is a power of two, else floor(log2 n) + 2
               (recursive-doubling rounds, §4.1.2; FC-worker communication overlaps the
               CONV allreduce and is not counted, §4.2.1)
    (4)  throughput_s(n_c, n_f) = n_c K / t_s
    (5)  maximize throughput_s subject to N = n_c + n_f, n_c > 0, n_f > 0 (exhaustive search)

:meth:`Constants.from_profile` reads the constants off a model of the zoo
(:mod:`traffic.models`, its ``split_index``; ``A`` from :func:`split_shape`) and a compute
profile (:mod:`traffic.compute_profiles`); :func:`node_assignment` is the search of eq. (5), over
:func:`best_split`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from traffic.collectives.recursive_doubling import rounds
from traffic.models import LayeredModel, build_model

__all__ = [
    "BYTES_PER_VALUE",
    "Constants",
    "Assignment",
    "allreduce_rounds",
    "transfer_seconds",
    "check_counts",
    "stanza_compute_time",
    "stanza_iteration_time",
    "stanza_throughput",
    "node_assignment",
    "best_split",
    "split_activations",
    "split_shape",
]

BYTES_PER_VALUE = 4
"""Bytes of one parameter, gradient or activation (float32)."""


def transfer_seconds(values: float, bw_bps: float) -> float:
    """Time to move ``values`` float32 values at ``bw_bps`` bits per second (seconds).

    Raises:
        ValueError: ``bw_bps`` <= 0.
    """
    if bw_bps <= 0:
        raise ValueError(f"bandwidth must be > 0 bit/s, got {bw_bps}")
    return values * BYTES_PER_VALUE * 8 / bw_bps


def allreduce_rounds(n: int) -> int:
    """Rounds of Stanza's recursive doubling among ``n`` workers (§4.1.2, used in eq. (3)):
    ``log2 n`` for a power of two, else ``floor(log2 n) + 2`` (0 for ``n = 1``).

    Raises:
        ValueError: ``n`` < 1.
    """
    return rounds(n)


def split_shape(model: LayeredModel) -> tuple[int, ...]:
    """Shape of one sample's activations at the CONV/FC boundary: the output of layer
    ``split_index - 1`` at the model's input shape, without the batch dimension (AlexNet:
    ``(256, 6, 6)``, 9,216 values, Stanza §3.2). Computed on the meta device (no memory).

    Raises:
        ValueError: the model has no ``split_index``.
    """
    if model.split_index is None:
        raise ValueError(f"model {model.name!r} has no CONV/FC split_index")
    meta = build_model(model.name, 0, model.input_shape, model.num_classes, device="meta").eval()
    with torch.no_grad():
        x = meta.example_input(1)
        for layer in meta.layers[: meta.split_index]:
            x = layer(x)
    return tuple(int(d) for d in x.shape[1:])


def split_activations(model: LayeredModel) -> int:
    """Activations per sample at the CONV/FC boundary (``A`` of Table 3): the number of
    elements of the output of layer ``split_index - 1`` for one sample of the model's
    input (:func:`split_shape`; meta device, no memory).

    Args:
        model: a :class:`traffic.models.LayeredModel` with ``input_shape`` and ``split_index``.

    Raises:
        ValueError: no ``split_index``.
    """
    return int(math.prod(split_shape(model)))


@dataclass(frozen=True)
class Constants:
    """The known constants of Stanza Table 3 for one model, device and per-node batch.

    Attributes:
        K: per-node batch size (samples).
        P: parameters of the whole model (values).
        P_c: parameters of the CONV layers (values).
        A: activations of the split layer per sample (values).
        T_c: CONV forward + backward time per batch of ``K`` (seconds).
        T_f: FC forward + backward time for one CONV worker's ``K`` activations (seconds).
        T_ps: whole-model forward + backward time per batch of ``K`` (seconds); ``T_c + T_f``
            when taken from one per-layer profile.
    """

    K: int
    P: int
    P_c: int
    A: int
    T_c: float
    T_f: float
    T_ps: float

    @classmethod
    def from_profile(cls, model: str, profile) -> Constants:
        """Constants of zoo model ``model`` with the per-layer times of ``profile``.

        ``profile`` is a :class:`traffic.compute_profiles.Profile` (e.g. from
        :func:`traffic.compute_profiles.load_profile`); its ``batch_size`` is ``K``. ``T_c`` sums forward + backward
        of the layers before the model's
        ``split_index``, ``T_f`` of the others; ``A`` comes from the split layer's output
        shape at the model's native input (:func:`split_activations`).

        Raises:
            KeyError: unknown model.
            ValueError: the model has no ``split_index``, or the profile's layer count
                differs from the model's.
        """
        m = build_model(model, 0, device="meta")
        s = m.split_index
        if s is None:
            raise ValueError(f"model {model!r} has no CONV/FC split_index")
        if len(profile.layers) != len(m.layers):
            raise ValueError(f"profile has {len(profile.layers)} layers, model {model!r} {len(m.layers)}")
        t = [l.forward_s + l.backward_s for l in profile.layers]
        numels = m.layer_numels()
        return cls(
            K=int(profile.batch_size),
            P=m.num_params(),
            P_c=sum(numels[:s]),
            A=split_activations(m),
            T_c=sum(t[:s]),
            T_f=sum(t[s:]),
            T_ps=sum(t),
        )


def check_counts(n_c: int, n_f: int) -> None:
    """Check a split of the nodes into two kinds (CONV/FC workers, PS workers/servers).

    Raises:
        ValueError: ``n_c`` or ``n_f`` < 1.
    """
    if n_c < 1 or n_f < 1:
        raise ValueError(f"need n_c >= 1 and n_f >= 1, got n_c={n_c}, n_f={n_f}")


def stanza_compute_time(c: Constants, n_c: int, n_f: int) -> float:
    """Stanza eq. (2): computation time per iteration ``t_s^c = T_c + (n_c/n_f) T_f`` (s).

    Raises:
        ValueError: ``n_c`` or ``n_f`` < 1.
    """
    check_counts(n_c, n_f)
    return c.T_c + n_c / n_f * c.T_f


def stanza_iteration_time(c: Constants, n_c: int, n_f: int, bw_bps: float, *, parts: bool = False):
    """Stanza eq. (3): training time per iteration ``t_s`` (s).

    ``t_s = t_s^c + 2 n_c A K / (n_f B) + P_c R(n_c) / B`` with ``R`` the recursive-doubling
    rounds (:func:`allreduce_rounds`). With ``parts`` returns a dict ``compute`` (eq. 2),
    ``conv_fc`` (activations and their gradients), ``conv_allreduce`` and ``total``.

    Raises:
        ValueError: ``n_c`` or ``n_f`` < 1, or ``bw_bps`` <= 0.
    """
    comp = stanza_compute_time(c, n_c, n_f)
    conv_fc = transfer_seconds(2 * n_c * c.A * c.K / n_f, bw_bps)
    allred = transfer_seconds(c.P_c * allreduce_rounds(n_c), bw_bps)
    total = comp + conv_fc + allred
    if parts:
        return {"compute": comp, "conv_fc": conv_fc, "conv_allreduce": allred, "total": total}
    return total


def stanza_throughput(c: Constants, n_c: int, n_f: int, bw_bps: float) -> float:
    """Stanza eq. (4): ``n_c K / t_s`` in samples per second."""
    return n_c * c.K / stanza_iteration_time(c, n_c, n_f, bw_bps)


@dataclass(frozen=True)
class Assignment:
    """A node assignment and its predicted performance.

    ``n_c``/``n_f`` are CONV/FC workers for Stanza (PS: workers/servers), ``time_s`` the
    predicted iteration time and ``throughput`` samples per second.
    """

    n_c: int
    n_f: int
    time_s: float
    throughput: float


def node_assignment(c: Constants, N: int, bw_bps: float) -> Assignment:
    """Stanza eq. (5): the ``(n_c, n_f)`` with ``n_c + n_f = N`` that maximizes eq. (4).

    Exhaustive search over ``n_c = 1 .. N-1`` (§4.2.2). Ties go to the larger ``n_c``
    (the larger global batch at the same throughput).

    Raises:
        ValueError: ``N`` < 2 or ``bw_bps`` <= 0.
    """
    if N < 2:
        raise ValueError(f"Stanza needs at least 2 nodes (one CONV and one FC worker), got N={N}")
    return best_split(
        N, lambda a, b: stanza_iteration_time(c, a, b, bw_bps), lambda a, b: stanza_throughput(c, a, b, bw_bps)
    )


def best_split(N: int, time_s: Callable[[int, int], float], throughput: Callable[[int, int], float]) -> Assignment:
    """Exhaustive search over ``a = 1 .. N-1``, ``b = N - a``: the split of highest
    ``throughput(a, b)`` (samples/s; ``time_s(a, b)`` its iteration time, seconds), ties to
    the larger ``a``. ``N`` >= 2."""
    best = None
    for a in range(1, N):
        cand = Assignment(a, N - a, time_s(a, N - a), throughput(a, N - a))
        if best is None or cand.throughput >= best.throughput:
            best = cand
    return best
