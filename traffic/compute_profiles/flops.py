"""FLOPs of every layer, and splitting a published per-batch time over the layers by FLOPs.

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on the meta device (shapes
only: no memory, no arithmetic, so counting VGG or ResNet-152 takes well under a second).
Each layer is run on its own, on the output of the previous layer, so each count is for
the layer's real input shape.

Backward FLOPs are *counted*, not assumed: backward is run on the meta tensors (``autograd``
works on meta tensors) under the counter, starting from a gradient of the layer's output
shape. The input of layer 0 does not require a gradient, as in training, so layer 0's
backward computes only its weight gradients (about 1x its forward FLOPs); every later
Conv/Linear layer computes the input and the weight gradient (about 2x). Only if backward
fails on the meta device for some layer is its backward taken as 2x its forward (1x for
layer 0), with a warning.

What the counter counts: matrix products and convolutions (``mm``, ``addmm``, ``bmm``,
``convolution`` and their backward, attention), 2 FLOPs per multiply-add. Element-wise
operations (ReLU, batch norm, pooling, dropout, the loss) and embedding look-ups count 0: a
layer made only of those gets zero time in a FLOPs split.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode

from common.errors import TestbedError
from traffic.compute_profiles.profile import (
    DATA_DIR,
    METHOD_PUBLISHED,
    LayerProfile,
    Profile,
    build_for_profile,
    example_input,
    layer_names,
    profile_filename,
)

__all__ = ["layer_flops", "flops_per_layer", "split_published", "take_aux_logits"]


def _detach(x, requires_grad: bool):
    """``x`` (a tensor or a nest of them) cut from its graph; float tensors get ``requires_grad``."""

    def one(t):
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach()
        return t.requires_grad_(requires_grad) if t.is_floating_point() else t

    return tree_map(one, x)


def _grad_outputs(y) -> list[torch.Tensor]:
    """The tensors of ``y`` (a tensor, a nest of them, or ``None``) that require a gradient."""
    return [t for t in tree_leaves(y) if isinstance(t, torch.Tensor) and t.requires_grad]


def take_aux_logits(layer):
    """The auxiliary logits a layer's last forward left (Inception-v3's ``AuxLogits``, see
    ``LayeredModel``), cleared on the layer; ``None`` if it has none. In training they get a
    gradient (``LayeredModel.forward`` keeps them on the gradient path, ``loss`` weights them),
    so their head's backward is part of the layer's backward."""
    a = getattr(layer, "aux_logits", None)
    if a is not None:
        layer.aux_logits = None
    return a


def layer_flops(net, x) -> list[tuple[int, int]]:
    """``(forward_flops, backward_flops)`` of each layer of ``net`` for the input batch ``x``.

    Args:
        net: a :class:`~traffic.models.LayeredModel`, best on the meta device.
        x: its input batch (on the same device), e.g. ``(batch, 3, 224, 224)``.

    Returns:
        One pair per layer, forward order; FLOPs for the whole batch.
    """
    out = []
    n = len(net.layers)
    for i, layer in enumerate(net.layers):
        inp = _detach(x, requires_grad=i > 0)
        with FlopCounterMode(display=False) as fc:
            y = layer(inp)
        fwd = int(fc.get_total_flops())
        ys = _grad_outputs(y) + _grad_outputs(take_aux_logits(layer))
        try:
            with FlopCounterMode(display=False) as bc:
                if ys:
                    torch.autograd.backward(ys, [torch.ones_like(t) for t in ys])
            bwd = int(bc.get_total_flops())
        except (RuntimeError, NotImplementedError) as e:
            bwd = fwd * (1 if i == 0 else 2)
            warnings.warn(
                f"{getattr(net, 'name', 'model')} layer {i}/{n}: backward failed on "
                f"{inp.device if isinstance(inp, torch.Tensor) else 'its device'} ({e}); "
                "taking backward FLOPs as 2x forward (1x for layer 0)",
                stacklevel=2,
            )
        out.append((fwd, bwd))
        x = _detach(y, requires_grad=False)
    return out


def flops_per_layer(model_name: str, batch_size: int) -> list[tuple[int, int]]:
    """``(forward_flops, backward_flops)`` per layer of the registered model ``model_name`` for a
    batch of ``batch_size`` samples of its example input (counted on the meta device, see the
    module docstring for what is counted).

    Raises:
        TestbedError: unknown model.
    """
    net = build_for_profile(model_name, device="meta")
    return layer_flops(net, example_input(net, int(batch_size), "meta"))


def split_published(
    model: str,
    device: str,
    batch_size: int,
    total_s: float,
    source: str,
    *,
    method: str = METHOD_PUBLISHED,
    derived: bool = False,
    out_dir: str | Path | None = DATA_DIR,
) -> Profile:
    """Split a published forward+backward time per batch over the layers of ``model`` by FLOPs.

    Layer ``l`` gets ``forward_s = total_s * F_l / S`` and ``backward_s = total_s * B_l / S``
    with ``F_l, B_l`` its forward and backward FLOPs (:func:`flops_per_layer`) and
    ``S = sum_l (F_l + B_l)``: the times sum to ``total_s`` and each layer's share is its
    share of the FLOPs.

    Args:
        model: registry name.
        device: device name for the file name and the ``device`` field, e.g. ``"gtx1080ti"``.
        batch_size: the batch the published time is for.
        total_s: published forward+backward seconds per batch.
        source: the citation (paper, table, and any arithmetic made on the published number).
        method, derived: recorded as given (a derived total passes ``"derived: ..."``, True).
        out_dir: where ``<model>-<device>-b<batch>.json`` is written (replacing an older file
            of that name: data files are regenerated); ``None``: do not write.

    Returns:
        The :class:`Profile`.

    Raises:
        TestbedError: unknown model, or a model in which no FLOPs were counted.
    """
    net = build_for_profile(model, device="meta")
    flops = layer_flops(net, example_input(net, int(batch_size), "meta"))
    total_flops = sum(f + b for f, b in flops)
    if total_flops <= 0:
        raise TestbedError(f"no FLOPs counted in {model!r}: cannot split a time over its layers by FLOPs")
    layers = [
        LayerProfile(
            index=i,
            name=name,
            forward_s=total_s * f / total_flops,
            backward_s=total_s * b / total_flops,
            flops_forward=f,
            flops_backward=b,
        )
        for i, (name, (f, b)) in enumerate(zip(layer_names(net), flops))
    ]
    prof = Profile(
        model=model,
        device=device,
        batch_size=int(batch_size),
        source=source,
        method=method,
        derived=derived,
        layers=layers,
    )
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        prof.save(Path(out_dir) / profile_filename(model, device, batch_size), overwrite=True)
    return prof
