"""Emulated compute: each layer's forward and backward take their profiled time, slept.

In ``workload.compute.mode: emulated`` a worker does not compute: for layer ``l`` it sleeps
``profile.forward_s[l] * scale`` where the forward would run and ``profile.backward_s[l] *
scale`` where the backward would, then hands the scheme real gradient tensors of the layer's
true sizes. The scheme's hooks fire at exactly the points they fire in real compute, so a
scheme's code is the same in both modes.

Sleeping is precise on average without burning CPU: :class:`PreciseSleeper` carries each
sleep's overshoot (``time.sleep`` wakes up tens of microseconds late) into the next request,
so over an iteration the slept total tracks the requested total.
"""
from __future__ import annotations

import time

import torch

__all__ = ["PreciseSleeper", "EmulatedCompute"]

#: Overshoot carried over is capped at this (seconds): a long stall (e.g. a blocking
#: before_forward hook that itself overshot) must not erase many later layers.
MAX_DEBT_S = 0.005


class PreciseSleeper:
    """``sleep(d)`` sleeps ``d`` seconds minus the overshoot owed from earlier sleeps.

    Attributes:
        debt_s: overshoot (achieved - requested) carried into the next request, seconds.
    """

    def __init__(self):
        self.debt_s = 0.0

    def sleep(self, seconds: float) -> float:
        """Sleep about ``seconds``; returns the time actually slept (seconds)."""
        if seconds <= 0:
            return 0.0
        want = seconds - self.debt_s
        if want <= 0:
            self.debt_s = -want
            return 0.0
        t0 = time.perf_counter()
        time.sleep(want)
        slept = time.perf_counter() - t0
        self.debt_s = min(max(slept - want, 0.0), MAX_DEBT_S)
        return slept


class EmulatedCompute:
    """Per-layer sleeps from a profile, and real gradient tensors of the true sizes.

    Args:
        model: the LayeredModel (its parameters are real tensors of the true sizes).
        forward_s / backward_s: per-layer times, seconds per batch, forward order (already
            multiplied by the time-dilation scale).
        seed: seeds the gradient values (different per worker so that compression and
            aggregation act on distinct data).

    Gradients are allocated once (``N(0, 1e-3^2)`` values) and assigned as each layer's
    ``.grad`` when its backward ends; they are not recomputed, which would cost a full
    model's worth of memory traffic per iteration for nothing.

    Raises:
        ValueError: the profile's layer count differs from the model's.
    """

    def __init__(self, model, forward_s: list[float], backward_s: list[float], seed: int):
        n = len(model.layers)
        if len(forward_s) != n or len(backward_s) != n:
            raise ValueError(f"profile has {len(forward_s)} layers, model {getattr(model, 'name', '')} has {n}")
        self.forward_s, self.backward_s = list(forward_s), list(backward_s)
        self.sleeper = PreciseSleeper()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.grads = {id(p): torch.randn(p.shape, generator=gen) * 1e-3 for p in model.parameters()}

    def forward(self, layer: int) -> float:
        """Emulate layer ``layer``'s forward; returns the seconds slept."""
        return self.sleeper.sleep(self.forward_s[layer])

    def backward(self, layer: int, params) -> float:
        """Emulate layer ``layer``'s backward and leave its gradients in ``p.grad``."""
        slept = self.sleeper.sleep(self.backward_s[layer])
        for p in params:
            p.grad = self.grads[id(p)]
        return slept
