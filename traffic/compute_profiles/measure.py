"""Measure per-layer forward and backward times on this machine (``testbed profile``).

Method: the layers are run one at a time, each on a detached copy of the previous layer's
output that requires a gradient (layer 0's input does not, as in training), so every
layer's forward and backward can be timed on its own:

- forward of layer ``l``: ``layer(input)``; for the last layer this includes the loss
  (cross-entropy of the logits against the model's ``example_target``, plus auxiliary heads
  as ``LayeredModel.loss``), so that a profile's total is a whole training step's compute;
- backward of layer ``l``, last layer first: ``autograd.backward(output_l, grad)`` with
  ``grad`` the gradient that layer ``l+1``'s backward left on its input (the last layer's
  backward starts from the loss). It covers the layer's input gradient (except layer 0) and
  the accumulation of its parameter gradients, as in ``traffic.runtime.trainer``; a layer
  with an auxiliary head (Inception-v3) also back-propagates the loss's gradient of the
  head's logits.

On CUDA the device is synchronised before and after every timed piece. Each iteration
starts with ``zero_grad(set_to_none=True)`` like the trainer. After ``warmup`` untimed
iterations, the reported time of each layer is the median over ``iterations`` iterations.
"""

from __future__ import annotations

import platform
import statistics
import time
from datetime import datetime

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

from common.errors import TestbedError
from traffic.compute_profiles.flops import _detach, flops_per_layer, take_aux_logits
from traffic.compute_profiles.profile import (
    METHOD_MEASURED,
    LayerProfile,
    Profile,
    build_for_profile,
    example_input,
    layer_names,
)

__all__ = ["time_layers", "measure_profile", "format_table", "device_name"]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _loss(net, out: torch.Tensor, aux: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """The training loss as ``LayeredModel`` makes it: cross-entropy of the logits (flattened
    over tokens for sequence models) plus ``aux_weight`` x cross-entropy of each auxiliary
    head's logits; with ``aux_weight`` 0 the heads still get a (zero) gradient, as in
    ``LayeredModel.forward``."""
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    for a in aux:
        loss = loss + getattr(net, "aux_weight", 0.0) * F.cross_entropy(a, target)
    return loss


def _one_iteration(net, x, target, dev) -> tuple[list[float], list[float]]:
    layers = list(net.layers)
    n = len(layers)
    net.zero_grad(set_to_none=True)
    inputs, outputs, auxes, aux_leaves, fwd = [], [], [], [], []
    h = x
    loss = None
    for i, layer in enumerate(layers):
        inp = _detach(h, requires_grad=i > 0)
        _sync(dev)
        t0 = time.perf_counter()
        out = layer(inp)
        aux = take_aux_logits(layer)
        if aux is not None:  # cut here too: its gradient comes from the loss, its backward is this layer's
            aux_leaves.append(aux.detach().requires_grad_(True))
        if i == n - 1:
            loss = _loss(net, out, aux_leaves, target)
        _sync(dev)
        fwd.append(time.perf_counter() - t0)
        inputs.append(inp)
        outputs.append(out)
        auxes.append((aux, aux_leaves[-1]) if aux is not None else None)
        h = out
    bwd = [0.0] * n
    for i in reversed(range(n)):
        if i == n - 1:
            ys, grads = [loss], [torch.ones_like(loss)]
        else:
            # the gradient layer i+1's backward left on its (detached) input, leaf by leaf
            pairs = [
                (o, nxt.grad)
                for o, nxt in zip(_leaves(outputs[i]), _leaves(inputs[i + 1]))
                if o is not None and o.requires_grad and nxt is not None and nxt.grad is not None
            ]
            ys, grads = [p[0] for p in pairs], [p[1] for p in pairs]
        if auxes[i] is not None and auxes[i][1].grad is not None:
            ys.append(auxes[i][0])
            grads.append(auxes[i][1].grad)
        _sync(dev)
        t0 = time.perf_counter()
        if ys:
            torch.autograd.backward(ys, grads)
        _sync(dev)
        bwd[i] = time.perf_counter() - t0
    return fwd, bwd


def _leaves(y) -> list:
    """Every leaf of ``y`` in order (tensors, ``None`` for anything else), so the leaves of a
    layer's output and of the next layer's detached input pair up by position."""
    return [t if isinstance(t, torch.Tensor) else None for t in tree_leaves(y)]


def time_layers(net, x, iterations: int = 20, warmup: int = 3) -> tuple[list[float], list[float]]:
    """Median forward and backward seconds of each layer of ``net`` on the batch ``x``.

    Args:
        net: a :class:`~traffic.models.LayeredModel` in training mode, on ``x``'s device, with
            ``input_shape``/``num_classes`` set (its ``example_target`` gives the labels).
        x: the input batch, ``(batch, *input_shape)``.
        iterations: timed iterations (the median is over these), >= 1.
        warmup: untimed iterations first.

    Returns:
        ``(forward_s, backward_s)``, one value per layer each, forward order.
    """
    if iterations < 1:
        raise TestbedError(f"--iterations must be at least 1, got {iterations}")
    dev = x.device if isinstance(x, torch.Tensor) else next(net.parameters()).device
    target = net.example_target(len(x), dev)
    for _ in range(max(0, warmup)):
        _one_iteration(net, x, target, dev)
    runs = [_one_iteration(net, x, target, dev) for _ in range(iterations)]
    n = len(net.layers)
    fwd = [statistics.median(r[0][l] for r in runs) for l in range(n)]
    bwd = [statistics.median(r[1][l] for r in runs) for l in range(n)]
    net.zero_grad(set_to_none=True)
    return fwd, bwd


def device_name(dev: torch.device) -> str:
    """The GPU's name, or the CPU's model name with the number of torch threads."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name or platform.processor() or 'unknown CPU'} ({torch.get_num_threads()} torch threads)"


def measure_profile(
    model: str, batch_size: int, device: str = "cpu", iterations: int = 20, warmup: int = 3, seed: int = 0
) -> Profile:
    """Measure a :class:`Profile` (``method="measured"``) of the registered ``model``.

    Args:
        model: registry name.
        batch_size: samples per batch (the model's example input).
        device: ``"cpu"`` or ``"cuda"`` (the first GPU).
        iterations, warmup: see :func:`time_layers`.
        seed: seed of the model's parameters and of the RNG (dropout); the input and labels
            are the model's fixed ``example_input``/``example_target``.

    Raises:
        TestbedError: unknown model, ``cuda`` without a GPU, bad ``iterations``.
    """
    if int(batch_size) < 1:
        raise TestbedError(f"--batch must be at least 1, got {batch_size}")
    if device not in ("cpu", "cuda"):
        raise TestbedError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise TestbedError("--device cuda: torch sees no GPU here; use --device cpu")
    dev = torch.device(device)
    net = build_for_profile(model, device=device, seed=seed).train()
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        x = example_input(net, int(batch_size), dev)
        fwd, bwd = time_layers(net, x, iterations=iterations, warmup=warmup)
    try:
        flops = flops_per_layer(model, batch_size)
    except Exception:  # FLOPs are informative here; a model the meta device cannot run still gets times
        flops = [(None, None)] * len(fwd)
    when = datetime.now().astimezone().isoformat(timespec="seconds")
    layers = [
        LayerProfile(i, name, f, b, fl[0], fl[1])
        for i, (name, f, b, fl) in enumerate(zip(layer_names(net), fwd, bwd, flops))
    ]
    return Profile(
        model=model,
        device=device,
        batch_size=int(batch_size),
        source=f"measured on {device_name(dev)} by testbed profile at {when}",
        method=METHOD_MEASURED,
        derived=False,
        layers=layers,
    )


def format_table(prof: Profile) -> str:
    """Per-layer table: index, name, forward/backward ms, forward/backward GFLOP; a total line."""

    def gf(v):
        return "" if v is None else f"{v / 1e9:.3f}"

    rows = [f"{'layer':>5}  {'name':32s} {'fwd ms':>10} {'bwd ms':>10} {'fwd GFLOP':>10} {'bwd GFLOP':>10}"]
    for l in prof.layers:
        rows.append(
            f"{l.index:5d}  {l.name[:32]:32s} {l.forward_s * 1e3:10.3f} {l.backward_s * 1e3:10.3f} "
            f"{gf(l.flops_forward):>10} {gf(l.flops_backward):>10}"
        )
    fwd, bwd = sum(prof.forward_s()), sum(prof.backward_s())
    rows.append(
        f"{'total':>5}  {'':32s} {fwd * 1e3:10.3f} {bwd * 1e3:10.3f}   "
        f"(forward+backward {prof.total_s() * 1e3:.3f} ms per batch of {prof.batch_size})"
    )
    return "\n".join(rows)
