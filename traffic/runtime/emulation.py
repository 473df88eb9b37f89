"""Emulated compute: each layer's forward and backward take their profiled time, slept.

In ``workload.compute.mode: emulated`` a worker does not compute: for layer ``l`` it sleeps
``profile.forward_s[l] * scale`` where the forward would run and ``profile.backward_s[l] *
scale`` where the backward would, then hands the scheme real gradient tensors of the layer's
true sizes. The scheme's hooks fire at exactly the points they fire in real compute, so a
scheme's code is the same in both modes.

Compute is one kind (``compute``) of the host costs (:mod:`traffic.hostmodel.costs`): each
layer is charged its profiled time, dilated by the accountant's ``scale``, times the
accountant's :meth:`~traffic.hostmodel.costs.HostCosts.compute_factor` (1, or a straggler's
slowdown from the spec's ``events``: :class:`traffic.event_spec.ComputeSlowdown`). Sleeping is
precise on average without burning CPU: :class:`PreciseSleeper` carries each sleep's
overshoot (``time.sleep`` wakes up tens of microseconds late) into the next request, so over
an iteration the slept total tracks the requested total.
"""

from __future__ import annotations

import torch

from traffic.hostmodel.costs import HostCosts, PreciseSleeper

__all__ = ["PreciseSleeper", "EmulatedCompute"]


class EmulatedCompute:
    """Per-layer waits from a profile, and real gradient tensors of the true sizes.

    Args:
        model: the LayeredModel (its parameters are real tensors of the true sizes).
        forward_s / backward_s: per-layer times, emulated seconds per batch, forward order.
        seed: seeds the gradient values (different per worker so that compression and
            aggregation act on distinct data).
        costs: the process's host-cost accountant (it dilates by its ``scale`` and counts
            the ``compute`` kind); default: one of its own at scale 1.
        gradients: allocate the gradients and leave them in ``p.grad`` (false in
            ``workload.compute.memory: light``, where the model is on the meta device and a
            scheme sends ``ctx.buffers.grad(p)``: :mod:`traffic.runtime.buffers`).

    Gradients are allocated once (``N(0, 1e-3^2)`` values) and assigned as each layer's
    ``.grad`` when its backward ends; they are not recomputed, which would cost a full
    model's worth of memory traffic per iteration for nothing.

    Raises:
        ValueError: the profile's layer count differs from the model's.
    """

    def __init__(
        self,
        model,
        forward_s: list[float],
        backward_s: list[float],
        seed: int,
        costs: HostCosts | None = None,
        gradients: bool = True,
    ):
        n = len(model.layers)
        if len(forward_s) != n or len(backward_s) != n:
            raise ValueError(f"profile has {len(forward_s)} layers, model {getattr(model, 'name', '')} has {n}")
        self.forward_s, self.backward_s = list(forward_s), list(backward_s)
        self.costs = costs if costs is not None else HostCosts()
        self.grads: dict[int, torch.Tensor] = {}
        if gradients:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                self.grads = {id(p): torch.randn(p.shape, generator=gen) * 1e-3 for p in model.parameters()}

    def forward(self, layer: int) -> float:
        """Emulate layer ``layer``'s forward; returns the emulated seconds charged (the
        profiled time times the compute factor)."""
        seconds = self.forward_s[layer] * self.costs.compute_factor()
        self.costs.wait("compute", seconds, span=False)
        return seconds

    def backward(self, layer: int, params) -> float:
        """Emulate layer ``layer``'s backward and leave its gradients in ``p.grad`` (when it
        holds gradients); returns the emulated seconds charged."""
        seconds = self.backward_s[layer] * self.costs.compute_factor()
        self.costs.wait("compute", seconds, span=False)
        if self.grads:
            for p in params:
                p.grad = self.grads[id(p)]
        return seconds
