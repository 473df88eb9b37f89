"""Inception networks, torchvision's definitions: ``googlenet`` (Inception-v1) and ``inception_v3``.

Each inception module is one layer (its branches run side by side, so it is not a plain
sequence); a stem convolution is one layer, with the pooling that follows it.
"""

from __future__ import annotations

import torch
from torch import nn

from traffic.models.base import LayeredModel, register_model


class BasicConv2d(nn.Sequential):
    """Convolution (no bias) + BatchNorm (eps 0.001) + ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size, stride=1, padding=0):
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(cout, eps=0.001),
            nn.ReLU(inplace=True),
        )


def _init(model: nn.Module, std: float) -> None:
    """torchvision's Inception initialisation: truncated normal (``std``, cut at +-2) for convolutions and
    linears (a module's own ``stddev`` attribute wins), BN weight 1 and bias 0."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            s = float(getattr(m, "stddev", std))
            nn.init.trunc_normal_(m.weight, mean=0.0, std=s, a=-2, b=2)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class _Concat(nn.Module):
    """Runs every branch on the same input and concatenates their outputs along the channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


# ----------------------------------------------------------------------------- GoogLeNet


def _inception_v1(cin: int, ch1: int, ch3red: int, ch3: int, ch5red: int, ch5: int, pool_proj: int) -> _Concat:
    return _Concat(
        BasicConv2d(cin, ch1, 1),
        nn.Sequential(BasicConv2d(cin, ch3red, 1), BasicConv2d(ch3red, ch3, 3, padding=1)),
        # torchvision uses a 3x3 here where the paper has a 5x5 (its known deviation; kept for the 6.6M count)
        nn.Sequential(BasicConv2d(cin, ch5red, 1), BasicConv2d(ch5red, ch5, 3, padding=1)),
        nn.Sequential(nn.MaxPool2d(3, 1, padding=1, ceil_mode=True), BasicConv2d(cin, pool_proj, 1)),
    )


@register_model("googlenet", input_shape=(3, 224, 224), num_classes=1000)
def googlenet(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """GoogLeNet (Inception-v1) as torchvision defines it, without auxiliary classifiers: 6,624,904 parameters.

    iBatch Table 1 reports 5M for GoogLeNet in its framework (BigDL); the often-quoted
    "5 million" of the Inception papers and 6.6-7.0M of common implementations differ in
    details. This follows torchvision: batch-normalised convolutions, the "5x5" branch
    implemented with 3x3 kernels, no auxiliary heads (with them: 13.0M; with true 5x5
    kernels: 7.0M). PHub Table 3 lists GoogleNet at 38 MB (~10M parameters in MXNet's variant).

    Layers (13; ``split_index = 12``), with iBatch Figure 3's convention that a pooling
    layer belongs to the convolution before it: ``conv1`` (7x7/2 + max pool), ``conv2``
    (1x1), ``conv3`` (3x3 + max pool), ``inception3a``, ``inception3b`` (+ max pool),
    ``inception4a`` .. ``inception4e`` (+ max pool), ``inception5a``, ``inception5b``
    (+ global average pool: 1,024 activations per sample), ``fc`` (Flatten + Dropout 0.2 +
    Linear 1024 -> num_classes).
    """
    pool = lambda k=3: nn.MaxPool2d(k, 2, ceil_mode=True)  # noqa: E731
    layers = [
        nn.Sequential(BasicConv2d(input_shape[0], 64, 7, stride=2, padding=3), pool()),
        BasicConv2d(64, 64, 1),
        nn.Sequential(BasicConv2d(64, 192, 3, padding=1), pool()),
        _inception_v1(192, 64, 96, 128, 16, 32, 32),
        nn.Sequential(_inception_v1(256, 128, 128, 192, 32, 96, 64), pool()),
        _inception_v1(480, 192, 96, 208, 16, 48, 64),
        _inception_v1(512, 160, 112, 224, 24, 64, 64),
        _inception_v1(512, 128, 128, 256, 24, 64, 64),
        _inception_v1(512, 112, 144, 288, 32, 64, 64),
        nn.Sequential(_inception_v1(528, 256, 160, 320, 32, 128, 128), pool(2)),
        _inception_v1(832, 256, 160, 320, 32, 128, 128),
        nn.Sequential(_inception_v1(832, 384, 192, 384, 48, 128, 128), nn.AdaptiveAvgPool2d((1, 1))),
        nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(1024, num_classes)),
    ]
    names = [
        "conv1",
        "conv2",
        "conv3",
        "inception3a",
        "inception3b",
        "inception4a",
        "inception4b",
        "inception4c",
        "inception4d",
        "inception4e",
        "inception5a",
        "inception5b",
        "fc",
    ]
    model = LayeredModel(layers, name="googlenet", split_index=12, layer_names=names)
    _init(model, std=0.01)
    return model


# ----------------------------------------------------------------------------- Inception-v3


def _avg3() -> nn.AvgPool2d:
    return nn.AvgPool2d(3, stride=1, padding=1)


def _inception_a(cin: int, pool_features: int) -> _Concat:
    return _Concat(
        BasicConv2d(cin, 64, 1),
        nn.Sequential(BasicConv2d(cin, 48, 1), BasicConv2d(48, 64, 5, padding=2)),
        nn.Sequential(BasicConv2d(cin, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, padding=1)),
        nn.Sequential(_avg3(), BasicConv2d(cin, pool_features, 1)),
    )


def _inception_b(cin: int) -> _Concat:
    return _Concat(
        BasicConv2d(cin, 384, 3, stride=2),
        nn.Sequential(BasicConv2d(cin, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, stride=2)),
        nn.MaxPool2d(3, stride=2),
    )


def _inception_c(cin: int, c7: int) -> _Concat:
    return _Concat(
        BasicConv2d(cin, 192, 1),
        nn.Sequential(
            BasicConv2d(cin, c7, 1),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv2d(c7, 192, (7, 1), padding=(3, 0)),
        ),
        nn.Sequential(
            BasicConv2d(cin, c7, 1),
            BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, (1, 7), padding=(0, 3)),
        ),
        nn.Sequential(_avg3(), BasicConv2d(cin, 192, 1)),
    )


def _inception_d(cin: int) -> _Concat:
    return _Concat(
        nn.Sequential(BasicConv2d(cin, 192, 1), BasicConv2d(192, 320, 3, stride=2)),
        nn.Sequential(
            BasicConv2d(cin, 192, 1),
            BasicConv2d(192, 192, (1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, (7, 1), padding=(3, 0)),
            BasicConv2d(192, 192, 3, stride=2),
        ),
        nn.MaxPool2d(3, stride=2),
    )


def _split_1x3_3x1(cin: int) -> _Concat:
    return _Concat(BasicConv2d(cin, 384, (1, 3), padding=(0, 1)), BasicConv2d(cin, 384, (3, 1), padding=(1, 0)))


def _inception_e(cin: int) -> _Concat:
    return _Concat(
        BasicConv2d(cin, 320, 1),
        nn.Sequential(BasicConv2d(cin, 384, 1), _split_1x3_3x1(384)),
        nn.Sequential(BasicConv2d(cin, 448, 1), BasicConv2d(448, 384, 3, padding=1), _split_1x3_3x1(384)),
        nn.Sequential(_avg3(), BasicConv2d(cin, 192, 1)),
    )


class InceptionAux(nn.Module):
    """Inception-v3's auxiliary classifier on the 17x17x768 grid: 5x5/3 average pool, 1x1 conv to 128,
    5x5 conv to 768, global average pool, Linear 768 -> num_classes (3,326,696 parameters at 1000 classes)."""

    def __init__(self, cin: int, num_classes: int):
        super().__init__()
        self.pool = nn.AvgPool2d(5, stride=3)
        self.conv0 = BasicConv2d(cin, 128, 1)
        self.conv1 = BasicConv2d(128, 768, 5)
        self.conv1[0].stddev = 0.01
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(768, num_classes)
        self.fc.stddev = 0.001

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.gap(self.conv1(self.conv0(self.pool(x)))), 1))


class WithAux(nn.Module):
    """A block followed by a side classifier: returns ``block(x)``; in training mode also sets
    ``self.aux_logits = aux(block(x))`` for :class:`~traffic.models.LayeredModel` (``None`` in eval mode)."""

    def __init__(self, block: nn.Module, aux: nn.Module):
        super().__init__()
        self.block, self.aux = block, aux
        self.aux_logits: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        self.aux_logits = self.aux(y) if self.training else None
        return y


@register_model("inception_v3", input_shape=(3, 299, 299), num_classes=1000)
def inception_v3(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """Inception-v3 as torchvision defines it, with the auxiliary classifier: 27,161,264 parameters.

    Stanza and iBatch Table 1 give Inception-V3 27M, which is the count with the auxiliary
    classifier (``AuxLogits``, 3.33M); without it the net has 23.8M. The aux head is part of
    layer ``Mixed_6e`` (it reads that module's output), so it belongs to the CONV part and
    its parameters are exchanged like the others. In training mode it produces side logits;
    :meth:`LayeredModel.loss` adds them with weight 0.4 (the usual recipe), and a plain
    ``cross_entropy(model(x), y)`` leaves them with zero gradients (see
    :class:`~traffic.models.LayeredModel`). In eval mode the head is skipped.

    Layers (17; ``split_index = 16``): ``Conv2d_1a_3x3``, ``Conv2d_2a_3x3``,
    ``Conv2d_2b_3x3`` (+ max pool), ``Conv2d_3b_1x1``, ``Conv2d_4a_3x3`` (+ max pool),
    ``Mixed_5b`` .. ``Mixed_5d``, ``Mixed_6a`` .. ``Mixed_6e`` (+ aux head), ``Mixed_7a`` ..
    ``Mixed_7c`` (+ global average pool: 2,048 activations per sample), ``fc`` (Dropout 0.5 +
    Flatten + Linear 2048 -> num_classes). Input 299x299 (the grid is 35/17/8 in the three
    stages).
    """
    layers = [
        BasicConv2d(input_shape[0], 32, 3, stride=2),
        BasicConv2d(32, 32, 3),
        nn.Sequential(BasicConv2d(32, 64, 3, padding=1), nn.MaxPool2d(3, stride=2)),
        BasicConv2d(64, 80, 1),
        nn.Sequential(BasicConv2d(80, 192, 3), nn.MaxPool2d(3, stride=2)),
        _inception_a(192, 32),
        _inception_a(256, 64),
        _inception_a(288, 64),
        _inception_b(288),
        _inception_c(768, 128),
        _inception_c(768, 160),
        _inception_c(768, 160),
        WithAux(_inception_c(768, 192), InceptionAux(768, num_classes)),
        _inception_d(768),
        _inception_e(1280),
        nn.Sequential(_inception_e(2048), nn.AdaptiveAvgPool2d((1, 1))),
        nn.Sequential(nn.Dropout(0.5), nn.Flatten(), nn.Linear(2048, num_classes)),
    ]
    names = [
        "Conv2d_1a_3x3",
        "Conv2d_2a_3x3",
        "Conv2d_2b_3x3",
        "Conv2d_3b_1x1",
        "Conv2d_4a_3x3",
        "Mixed_5b",
        "Mixed_5c",
        "Mixed_5d",
        "Mixed_6a",
        "Mixed_6b",
        "Mixed_6c",
        "Mixed_6d",
        "Mixed_6e",
        "Mixed_7a",
        "Mixed_7b",
        "Mixed_7c",
        "fc",
    ]
    model = LayeredModel(layers, name="inception_v3", split_index=16, layer_names=names, aux_weight=0.4)
    _init(model, std=0.1)
    return model
