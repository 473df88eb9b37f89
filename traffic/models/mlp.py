"""Multi-layer perceptrons: ``digits_mlp`` (quick start), ``mnist_mlp`` (Pipe-SGD), ``stanza_mlp`` (Stanza Table 7)."""

from __future__ import annotations

import math

from torch import nn

from traffic.models.base import LayeredModel, register_model


def mlp(
    input_shape: tuple[int, ...], num_classes: int, hidden: list[int], name: str, split_index: int | None = None
) -> LayeredModel:
    """Fully-connected net: ``Flatten`` (if needed) + ``Linear``+``ReLU`` per hidden size + a ``Linear`` head.

    Layers: ``len(hidden) + 1`` blocks, each owning one weight and one bias (two keys),
    named ``fc1``, ``fc2`` ... Input ``(batch, *input_shape)``, output ``(batch, num_classes)``
    logits.
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
    return LayeredModel(
        layers, name=name, split_index=split_index, layer_names=[f"fc{i + 1}" for i in range(len(layers))]
    )


@register_model("digits_mlp", input_shape=(64,), num_classes=10)
def digits_mlp(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """64 -> 512 -> 512 -> 10 with ReLU (for ``digits``: 8x8 images as 64 features).

    Three layers, six keys: 64*512 + 512 + 512*512 + 512 + 512*10 + 10 = 301,066 parameters.
    """
    return mlp(input_shape, num_classes, [512, 512], name="digits_mlp")


@register_model("mnist_mlp", input_shape=(784,), num_classes=10)
def mnist_mlp(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """Pipe-SGD's MNIST-MLP: 784 -> 500 -> 500 -> 10 with ReLU (Pipe-SGD §4, "a classical 3-layer perceptron").

    Native input: a 28x28 MNIST image as 784 features (an input shape ``(1, 28, 28)`` gets a
    ``Flatten`` in front). 784*500 + 500 + 500*500 + 500 + 500*10 + 10 = 648,010
    parameters (0.65M), three layers.
    """
    return mlp(input_shape, num_classes, [500, 500], name="mnist_mlp")


@register_model("stanza_mlp", input_shape=(3072,), num_classes=10)
def stanza_mlp(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """Stanza's MLP (Table 7): 3072 -> 1024 -> 1024 -> 4096 -> 10 with ReLU, on CIFAR-10.

    Table 7 trains it on CIFAR-10, so the native input is a 3x32x32 image as 3,072 features
    (an input shape ``(3, 32, 32)`` gets a ``Flatten`` in front); the paper gives only the
    hidden sizes. 3072*1024 + 1024 + 1024*1024 + 1024 + 1024*4096 + 4096 + 4096*10 + 10 =
    8,435,722 parameters (8.4M), four layers.

    ``split_index = 2``: Stanza separates the model after the second hidden layer; the
    FC worker trains layers 2 and 3 (the 4096-unit hidden layer and the output layer, 4.2M
    parameters), the other nodes layers 0 and 1. There are no convolutions, so this is
    the Table 7 boundary, not a CONV/FC one.
    """
    return mlp(input_shape, num_classes, [1024, 1024, 4096], name="stanza_mlp", split_index=2)
