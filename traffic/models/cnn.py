"""Small convolutional nets for real-compute runs: ``digits_cnn`` (Stanza's accuracy check on ``digits``)."""

from __future__ import annotations

import math

from torch import nn

from traffic.models.base import LayeredModel, register_model


@register_model("digits_cnn", input_shape=(64,), num_classes=10)
def digits_cnn(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """Two convolutions then two fully connected layers for ``digits`` (8x8 images): 71,754 parameters.

    The digits come as 64 features (``traffic.data.digits``); ``conv1`` reshapes them to one
    8x8 channel (an input shape ``(1, 8, 8)`` is taken as is)::

        conv1  [Unflatten to (1, 8, 8)] + Conv 3x3 1->16 (pad 1) + ReLU      -> (16, 8, 8)
        conv2  Conv 3x3 16->32 (pad 1) + ReLU + MaxPool 2                      -> (32, 4, 4)
        fc1    Flatten + Linear 512->128 + ReLU   (the 512 activations per sample that
               Stanza's CONV workers send to their FC worker)
        fc2    Linear 128->num_classes

    ``split_index = 2``: like the ImageNet CNNs of Stanza §3.1 the CONV layers hold few
    parameters (160 + 4,640 = 4,800, 6.7 %) and the FC layers most (65,664 + 1,290 =
    66,954, 93.3 %). Parameters: 160 + 4,640 + 65,664 + 1,290 = 71,754 (10 classes).

    Raises:
        ValueError: ``input_shape`` is neither ``(64,)``-like (a square number of features)
            nor ``(1, H, W)``.
    """
    if len(input_shape) == 1:
        side = math.isqrt(int(input_shape[0]))
        if side * side != input_shape[0]:
            raise ValueError(f"digits_cnn needs a square number of features, got {input_shape}")
        h = w = side
        head: list[nn.Module] = [nn.Unflatten(1, (1, h, w))]
    elif len(input_shape) == 3 and input_shape[0] == 1:
        _, h, w = input_shape
        head = []
    else:
        raise ValueError(f"digits_cnn takes (n,) or (1, H, W) inputs, got {input_shape}")
    layers = [
        nn.Sequential(*head, nn.Conv2d(1, 16, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(32 * (h // 2) * (w // 2), 128), nn.ReLU()),
        nn.Linear(128, num_classes),
    ]
    return LayeredModel(layers, name="digits_cnn", split_index=2, layer_names=["conv1", "conv2", "fc1", "fc2"])
