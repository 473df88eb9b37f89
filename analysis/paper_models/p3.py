"""What the network alone allows P3 to gain over MXNet's layer-wise baseline (P3 Sec. 3).

P3 prints no equation for its speed-ups; this module bounds them from its description of the
two systems, so that a measured ratio can be put beside what the bytes and the compute allow.

**The baseline** (P3 Sec. 3): "worker machines send out gradients of a layer to the KVStore as
soon as they are calculated", last layer first, "and issues a parameter pull request once all
the other workers have finished sending gradient updates for that layer"; "the next forward
propagation can only be started after receiving the parameter updates for the first layer",
which, queued behind the later layers' traffic, arrive last. Its cluster runs "a KVServer on
every machine with a worker process", the parameters "equally sharded", so with ``N`` workers
each host's link carries, per iteration and direction, ``2 (N-1) / N`` of the model ``M``: its
worker's push of the ``(N-1)/N`` held elsewhere and its server's answers to ``N-1`` workers for
its ``M / N`` (:func:`link_bytes`). ``W`` is the time those bytes take at the link's rate.

**Link-busy baseline** (:func:`fifo_baseline_period`): each host's link serves the iteration's
transfers first in, first out, and is never idle while a transfer is queued; a layer's push
enters the queue when its backward ends, its pull answers when its push is done (every host
alike, the servers adding no time); the next iteration's forward of layer ``i`` starts when
layer ``i - 1``'s forward has ended and layer ``i``'s pull is done. Its period lies between
``F + max(B, W)`` and ``F + B + W`` (``F``, ``B``: forward and backward compute of one batch):
layer 1's pull is the last transfer served, and none starts before the backward does. It is
close to the lower end when the last layers' gradients are ready early in the backward, as a
CNN's fully connected layers are.

**P3** cannot beat ``max(F + B, W)`` (:func:`p3_lower_bound`): the compute runs in full, and
the link carries ``W`` each iteration. So over a link-busy baseline P3 gains
:attr:`Bounds.gain` at the most; at the baseline's lower end ``(F + max(B, W)) / max(F + B, W)``,
largest where ``W = F + B``: ``1 + F / (F + B)`` (:attr:`Bounds.max_gain`), whatever the
bandwidth. A larger ratio measured against the paper's baseline means that baseline spent time
neither on the wire nor in compute: :meth:`Bounds.implied_excess_s`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from traffic.compute_profiles import load_profile
from traffic.models import build_model

__all__ = ["Bounds", "bounds", "fifo_baseline_period", "link_bytes", "p3_lower_bound", "zoo_bounds"]

BYTES_PER_VALUE = 4  # float32 gradients and parameters


def link_bytes(model_bytes: float, workers: int) -> float:
    """Bytes one host's link carries per iteration in each direction with a server colocated on
    every worker host and the model sharded equally: ``2 (N-1) / N * M`` (module docstring).

    Raises:
        ValueError: ``workers`` < 1 or ``model_bytes`` < 0.
    """
    if workers < 1 or model_bytes < 0:
        raise ValueError(f"need N >= 1 and M >= 0; got N={workers}, M={model_bytes}")
    return 2.0 * (workers - 1) / workers * model_bytes


def p3_lower_bound(forward_s: float, backward_s: float, wire_s: float) -> float:
    """The least period any schedule of the iteration can have: ``max(F + B, W)`` (s)."""
    return max(forward_s + backward_s, wire_s)


def fifo_baseline_period(
    forward_s: list[float], backward_s: list[float], layer_bytes: list[float], bw_bps: float, workers: int
) -> float:
    """Period (s) of the link-busy layer-wise baseline of the module docstring.

    Args:
        forward_s, backward_s: compute time of each layer for one batch, forward order (s).
        layer_bytes: bytes of each layer's gradient (= its parameters), forward order.
        bw_bps: the host link's rate (bit/s).
        workers: ``N`` >= 1, each host with a worker and a server.

    Returns:
        The time from one backward's start to the next (s): the backward, then the forward
        as the pulls it waits for arrive.

    Raises:
        ValueError: lists of different lengths or empty, ``bw_bps`` <= 0, ``workers`` < 1, or a
            negative time or size.
    """
    n = len(layer_bytes)
    if not n or len(forward_s) != n or len(backward_s) != n:
        raise ValueError(
            f"need one forward time, backward time and size per layer; got {len(forward_s)}, {len(backward_s)} and {n}"
        )
    if bw_bps <= 0 or workers < 1 or min(*forward_s, *backward_s, *layer_bytes) < 0:
        raise ValueError(f"need bw_bps > 0, N >= 1 and no negative time or size; got bw_bps={bw_bps}, N={workers}")
    rate = bw_bps / 8.0  # bytes/s
    share = (workers - 1) / workers  # of a layer, each way: the push out, the server's answers
    ready, t = [0.0] * n, 0.0
    for i in reversed(range(n)):  # backward runs from the last layer to the first
        t += backward_s[i]
        ready[i] = t
    # (arrival, order of queueing, push or pull, layer): first in, first out; at one instant, in
    # the order queued (the pushes in backward order, each pull when its push is done)
    queue = [(ready[i], n - 1 - i, "push", i) for i in range(n)]
    heapq.heapify(queue)
    free, pulled, queued = 0.0, [0.0] * n, n
    while queue:
        arrival, _, kind, i = heapq.heappop(queue)
        free = max(free, arrival) + share * layer_bytes[i] / rate
        if kind == "push":  # every host's push of layer i is done: its pulls are answered
            heapq.heappush(queue, (free, queued, "pull", i))
            queued += 1
        else:
            pulled[i] = free
    end = t  # the backward's end
    for i in range(n):
        end = max(end, pulled[i]) + forward_s[i]
    return end


@dataclass(frozen=True)
class Bounds:
    """One setting's bounds (seconds; ratios are of periods, so of samples/s inverted)."""

    forward_s: float
    backward_s: float
    wire_s: float  # W: :func:`link_bytes` at the link's rate
    baseline_s: float  # :func:`fifo_baseline_period`
    p3_s: float  # :func:`p3_lower_bound`

    @property
    def gain(self) -> float:
        """The most P3 can gain over the link-busy baseline here: ``baseline_s / p3_s``."""
        return self.baseline_s / self.p3_s

    @property
    def max_gain(self) -> float:
        """The most it can gain at any bandwidth over a baseline at its lower end,
        ``F + max(B, W)``: ``1 + F / (F + B)``, reached where ``W = F + B``."""
        return 1.0 + self.forward_s / (self.forward_s + self.backward_s)

    def implied_excess_s(self, ratio: float) -> float:
        """Time per iteration (s) a baseline ``ratio`` times slower than P3 spent beyond the
        link-busy baseline, at the least (P3 taking its lower bound): ``ratio * p3_s - baseline_s``.

        Raises:
            ValueError: ``ratio`` <= 0.
        """
        if ratio <= 0:
            raise ValueError(f"a ratio of periods is > 0 (got {ratio})")
        return ratio * self.p3_s - self.baseline_s


def bounds(
    forward_s: list[float], backward_s: list[float], layer_bytes: list[float], bw_bps: float, workers: int
) -> Bounds:
    """The bounds of the module docstring for per-layer times and sizes (as
    :func:`fifo_baseline_period`, which raises the same errors)."""
    period = fifo_baseline_period(forward_s, backward_s, layer_bytes, bw_bps, workers)
    f, b = sum(forward_s), sum(backward_s)
    w = 8.0 * link_bytes(sum(layer_bytes), workers) / bw_bps
    return Bounds(forward_s=f, backward_s=b, wire_s=w, baseline_s=period, p3_s=p3_lower_bound(f, b, w))


def zoo_bounds(model: str, device: str, batch_size: int, bw_bps: float, workers: int) -> Bounds:
    """:func:`bounds` for a model of :mod:`traffic.models` (float32, built on the meta device)
    and a shipped compute profile, e.g. ``zoo_bounds("vgg19", "p4000", 32, 15e9, 4)`` for P3
    Fig. 7(c)'s 15 Gbit/s point.

    Raises:
        KeyError: unknown model (as :func:`traffic.models.build_model`).
        TestbedError: no such profile, or one for another model, batch or layer count (as
            :func:`traffic.compute_profiles.load_profile`).
    """
    forward_s, backward_s, sizes = _zoo_layers(model, device, int(batch_size))
    return bounds(list(forward_s), list(backward_s), list(sizes), bw_bps, workers)


@lru_cache(maxsize=32)
def _zoo_layers(model: str, device: str, batch_size: int) -> tuple[tuple[float, ...], ...]:
    """(forward s, backward s, gradient bytes) per layer, read once for every bandwidth asked."""
    m = build_model(model, 0, device="meta")
    sizes = tuple(float(BYTES_PER_VALUE * k) for k in m.layer_numels())
    p = load_profile(device, model, batch_size, n_layers=len(sizes))
    return tuple(p.forward_s()), tuple(p.backward_s()), sizes
