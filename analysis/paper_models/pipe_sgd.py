"""Pipe-SGD's timing models (Li et al., NeurIPS 2018, Section 3.1, eqs. (2)-(7)).

Notation (the paper's): ``T`` iterations; ``l_up``, ``l_comp`` (= ``l_for + l_back``),
``l_comm``: seconds per iteration of the model update, the gradient computation and the
gradient communication; ``K`` the iteration dependency; ``p`` workers; ``alpha`` the network
latency (s per message); ``n`` the model size in bytes; ``beta`` the byte transfer time
(s/byte, ``8 / bandwidth_bps``); ``gamma`` the byte sum-reduction time (s/byte); ``S`` the
global synchronization time (s); ``L`` gradient segments; ``l_b`` the backward time of the
first segment.

    (2) l_total_sync   = T (l_up + l_comp + l_comm)
    (3) l_total_pipe   = T / K (l_up + l_comp + l_comm)                  unlimited resources
    (4) l_total_pipe   = T max(l_up + l_comp, l_comm)                    limited resources, K >= 2
    (5) l_total_pipe_s = T max(l_up + l_for + l_back,
                               2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma + S)
    (6) l_total_pipe_p = T max(l_up + l_for + l_b,
                               2(p-1) L alpha + 2 (p-1)/p n beta + (p-1)/p n gamma + L S)
    (7) SE = (l_up + l_comp) / max(l_up + l_comp, l_comm)

The communication term of (5)/(6) is Thakur et al.'s ring allreduce [47]:
:func:`ring_allreduce_s`. Two extensions, not in the paper's equations, are marked as ours
where they appear:

* compression inside the ring (Section 3.2 describes it, the equations omit it): the
  ``beta`` term carries ``wire_ratio`` (bytes on the wire per float32 byte: 1, 1/2 for 16-bit
  truncation, ~1/4 for 8-bit quantization) and the codec's own time is
  :func:`ring_codec_s` (encode and decode steps of :mod:`traffic.collectives.ring`);
* the synchronous parameter server with one server node (PS-Sync, the paper's centralized
  baseline, which it measures but does not model): :func:`ps_sync_comm_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Network",
    "beta_from_mbps",
    "ring_allreduce_s",
    "ring_codec_s",
    "ps_sync_comm_s",
    "sync_total_s",
    "pipe_ideal_total_s",
    "pipe_total_s",
    "pipe_sequential_total_s",
    "pipe_pipelined_total_s",
    "scaling_efficiency",
    "IterationModel",
    "iteration_model",
]


@dataclass(frozen=True)
class Network:
    """The network and reduction constants of eqs. (5)/(6).

    Attributes:
        alpha_s: latency per message (seconds).
        beta_s_per_byte: byte transfer time (seconds per byte).
        gamma_s_per_byte: byte sum-reduction time (seconds per float32 byte summed).
        sync_s: global synchronization time ``S`` (seconds).
    """

    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0
    gamma_s_per_byte: float = 0.0
    sync_s: float = 0.0


def beta_from_mbps(bw_mbps: float) -> float:
    """Byte transfer time ``beta`` (s/byte) of a link of ``bw_mbps`` Mbit/s.

    Raises:
        ValueError: ``bw_mbps`` <= 0.
    """
    if bw_mbps <= 0:
        raise ValueError(f"bandwidth must be > 0 Mbit/s, got {bw_mbps}")
    return 8.0 / (bw_mbps * 1e6)


def _check_p(p: int) -> None:
    if p < 1:
        raise ValueError(f"need p >= 1 workers, got {p}")


def ring_allreduce_s(n_bytes: float, p: int, net: Network, segments: int = 1, wire_ratio: float = 1.0) -> float:
    """Ring allreduce time, the communication term of eqs. (5) (``segments = 1``) and (6):
    ``2(p-1) L alpha + 2 (p-1)/p n r beta + (p-1)/p n gamma + L S`` seconds.

    Args:
        n_bytes: float32 bytes reduced (the model size ``n``).
        p: workers.
        net: ``alpha``, ``beta``, ``gamma``, ``S``.
        segments: ``L``, the number of allreduces the gradient is cut into.
        wire_ratio: ``r``, wire bytes per float32 byte (ours: 1 in the paper's equations).

    Raises:
        ValueError: ``p`` < 1 or ``segments`` < 1.
    """
    _check_p(p)
    if segments < 1:
        raise ValueError(f"need segments >= 1, got {segments}")
    if p == 1:
        return 0.0
    f = (p - 1) / p
    return (
        2 * (p - 1) * segments * net.alpha_s
        + 2 * f * n_bytes * wire_ratio * net.beta_s_per_byte
        + f * n_bytes * net.gamma_s_per_byte
        + segments * net.sync_s
    )


def ring_codec_s(n_bytes: float, p: int, encode_s_per_byte: float, decode_s_per_byte: float) -> float:
    """Codec time of one compressed ring allreduce (ours; :mod:`traffic.collectives.ring`):
    ``p`` encodes and ``2p - 1`` decodes of blocks of ``n/p`` bytes, i.e.
    ``n * enc + (2p - 1)/p * n * dec`` seconds (rates per float32 byte); 0 for ``p = 1``."""
    _check_p(p)
    if p == 1:
        return 0.0
    return n_bytes * encode_s_per_byte + (2 * p - 1) / p * n_bytes * decode_s_per_byte


def ps_sync_comm_s(n_bytes: float, p: int, net: Network) -> float:
    """Communication time of a bulk-synchronous parameter server on one server node (ours;
    the paper's PS-Sync baseline is measured, not modelled): the server's link carries the
    ``p`` pushes in, then the ``p`` pulls out, ``2 p n beta``, plus the sum ``p n gamma`` and
    two message latencies."""
    _check_p(p)
    return 2 * net.alpha_s + 2 * p * n_bytes * net.beta_s_per_byte + p * n_bytes * net.gamma_s_per_byte


def sync_total_s(T: int, l_up: float, l_comp: float, l_comm: float) -> float:
    """Eq. (2): synchronous SGD, ``T (l_up + l_comp + l_comm)`` seconds."""
    return T * (l_up + l_comp + l_comm)


def pipe_ideal_total_s(T: int, K: int, l_up: float, l_comp: float, l_comm: float) -> float:
    """Eq. (3): Pipe-SGD with unlimited resources, ``T / K (l_up + l_comp + l_comm)``.

    Raises:
        ValueError: ``K`` < 1.
    """
    if K < 1:
        raise ValueError(f"need K >= 1, got {K}")
    return T / K * (l_up + l_comp + l_comm)


def pipe_total_s(T: int, l_up: float, l_comp: float, l_comm: float) -> float:
    """Eq. (4): Pipe-SGD (``K >= 2``) with limited resources, ``T max(l_up + l_comp, l_comm)``."""
    return T * max(l_up + l_comp, l_comm)


def pipe_sequential_total_s(
    T: int, l_up: float, l_for: float, l_back: float, n_bytes: float, p: int, net: Network
) -> float:
    """Eq. (5): Pipe-SGD with sequential gradient communication (one allreduce after backward)."""
    return T * max(l_up + l_for + l_back, ring_allreduce_s(n_bytes, p, net))


def pipe_pipelined_total_s(
    T: int, l_up: float, l_for: float, l_b: float, n_bytes: float, p: int, segments: int, net: Network
) -> float:
    """Eq. (6): Pipe-SGD with pipelined gradient communication in ``segments`` = ``L`` parts;
    ``l_b`` is the backward time of the first segment."""
    return T * max(l_up + l_for + l_b, ring_allreduce_s(n_bytes, p, net, segments))


def scaling_efficiency(l_up: float, l_comp: float, l_comm: float) -> float:
    """Eq. (7): ``(l_up + l_comp) / max(l_up + l_comp, l_comm)`` (1 = linear speed-up)."""
    return (l_up + l_comp) / max(l_up + l_comp, l_comm)


@dataclass(frozen=True)
class IterationModel:
    """Predicted seconds per iteration of one variant, with its parts.

    Attributes:
        variant: a label (``D-Sync+T``, ``Pipe-SGD+Q`` ...).
        l_up, l_comp: update and computation (forward + backward) seconds.
        l_comm: communication seconds (ring or PS transfers and reductions).
        l_codec: compression seconds on the communication path (0 uncompressed).
        iteration_s: ``l_up + l_comp + l_comm + l_codec`` (K = 1 or PS-Sync, eq. (2)) or
            ``max(l_up + l_comp, l_comm + l_codec)`` (K >= 2, eq. (4)/(5); the codec runs on
            the communication thread).
    """

    variant: str
    l_up: float
    l_comp: float
    l_comm: float
    l_codec: float
    iteration_s: float


def iteration_model(
    variant: str,
    *,
    K: int,
    n_bytes: float,
    p: int,
    net: Network,
    l_comp: float,
    l_up: float = 0.0,
    wire_ratio: float = 1.0,
    encode_s_per_byte: float = 0.0,
    decode_s_per_byte: float = 0.0,
    ps: bool = False,
) -> IterationModel:
    """Seconds per iteration of one variant from eqs. (2), (4) and (5).

    Args:
        variant: label for reports.
        K: iteration dependency (1: D-Sync, eq. (2); >= 2: Pipe-SGD, eq. (4) with eq. (5)'s
            ring term). Ignored for ``ps``.
        n_bytes: float32 model size in bytes.
        p: workers.
        net: network constants.
        l_comp: forward + backward seconds; ``l_up``: update seconds.
        wire_ratio, encode_s_per_byte, decode_s_per_byte: compression (see
            :func:`ring_allreduce_s`, :func:`ring_codec_s`).
        ps: PS-Sync (:func:`ps_sync_comm_s`, eq. (2) shape).

    Raises:
        ValueError: ``K`` < 1 or ``p`` < 1.
    """
    if K < 1:
        raise ValueError(f"need K >= 1, got {K}")
    if ps:
        comm, codec = ps_sync_comm_s(n_bytes, p, net), 0.0
    else:
        comm = ring_allreduce_s(n_bytes, p, net, wire_ratio=wire_ratio)
        codec = ring_codec_s(n_bytes, p, encode_s_per_byte, decode_s_per_byte) if wire_ratio != 1.0 else 0.0
    if ps or K == 1:
        it = l_up + l_comp + comm + codec
    else:
        it = max(l_up + l_comp, comm + codec)
    return IterationModel(variant, l_up, l_comp, comm, codec, it)
