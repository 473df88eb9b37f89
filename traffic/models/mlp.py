"""Multi-layer perceptrons."""
from __future__ import annotations

import math

from torch import nn

from traffic.models import LayeredModel, register_model


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: list[int], name: str) -> LayeredModel:
    """Fully-connected net: ``Flatten`` (if needed) + ``Linear``+``ReLU`` per hidden size + a ``Linear`` head.

    Layers: ``len(hidden) + 1`` blocks, each owning one weight and one bias (two keys).
    Input ``(batch, *input_shape)``, output ``(batch, num_classes)`` logits.
    """
    in_features = math.prod(input_shape)
    layers: list[nn.Module] = []
    for i, h in enumerate(hidden):
        block = [nn.Linear(in_features, h), nn.ReLU()]
        if i == 0 and len(input_shape) > 1:
            block.insert(0, nn.Flatten())
        layers.append(nn.Sequential(*block))
        in_features = h
    layers.append(nn.Linear(in_features, num_classes))
    return LayeredModel(layers, name=name, split_index=None)


@register_model("digits_mlp")
def digits_mlp(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """64 -> 512 -> 512 -> 10 with ReLU (for ``digits``: 8x8 images as 64 features).

    Three layers, six keys: 64*512 + 512 + 512*512 + 512 + 512*10 + 10 = 301,066 parameters.
    """
    return mlp(input_shape, num_classes, [512, 512], name="digits_mlp")
