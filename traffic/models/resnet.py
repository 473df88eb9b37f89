"""Residual networks (He et al. 2015), torchvision's definition (v1.5: stride in the 3x3 convolution).

``resnet18`` (11.7M, PHub Table 3: 45 MB), ``resnet50`` (25.6M, P3 and PHub), ``resnet152``
(60.2M, Stanza Table 1). A residual block is not a plain sequence, so each block is one
layer; the stem and the classifier are layers of their own.
"""

from __future__ import annotations

import torch
from torch import nn

from traffic.models.base import LayeredModel, register_model


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, and the identity (or a 1x1 projection) added before the last ReLU."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _bn(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = _bn(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), _bn(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand (x4), with batch norm; identity or projection shortcut."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = _bn(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = _bn(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), _bn(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def resnet(
    block: type[BasicBlock] | type[Bottleneck],
    depths: list[int],
    input_shape: tuple[int, ...],
    num_classes: int,
    name: str,
) -> LayeredModel:
    """ResNet with ``depths[i]`` blocks in stage ``i + 1`` (64, 128, 256, 512 planes).

    Layers: ``conv1`` (7x7/2 conv + BN + ReLU + 3x3/2 max pool), one layer per block
    (``layer1.0`` ... ; the last block also holds the global average pool, which closes the
    CONV part), ``fc`` (Flatten + Linear 512*expansion -> num_classes). ``split_index`` is
    the index of ``fc``: ``1 + sum(depths)``.
    Initialisation as torchvision: Kaiming-normal (fan_out) convolutions, BN weight 1 and
    bias 0, PyTorch's default for ``fc``.
    """
    layers: list[nn.Module] = [
        nn.Sequential(
            nn.Conv2d(input_shape[0], 64, 7, stride=2, padding=3, bias=False),
            _bn(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    ]
    names = ["conv1"]
    inplanes = 64
    for stage, (planes, n) in enumerate(zip([64, 128, 256, 512], depths), start=1):
        for i in range(n):
            stride = 2 if (i == 0 and stage > 1) else 1
            layers.append(block(inplanes, planes, stride))
            names.append(f"layer{stage}.{i}")
            inplanes = planes * block.expansion
    layers[-1] = nn.Sequential(layers[-1], nn.AdaptiveAvgPool2d((1, 1)))
    split = len(layers)
    layers.append(nn.Sequential(nn.Flatten(), nn.Linear(inplanes, num_classes)))
    names.append("fc")
    model = LayeredModel(layers, name=name, split_index=split, layer_names=names)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


@register_model("resnet18", input_shape=(3, 224, 224), num_classes=1000)
def resnet18(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """ResNet-18: basic blocks [2, 2, 2, 2], 11,689,512 parameters (46.8 MB = 44.6 MiB; PHub Table 3: 45 MB).

    10 layers: conv1, 8 blocks, fc (``split_index = 9``).
    """
    return resnet(BasicBlock, [2, 2, 2, 2], input_shape, num_classes, "resnet18")


@register_model("resnet50", input_shape=(3, 224, 224), num_classes=1000)
def resnet50(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """ResNet-50: bottleneck blocks [3, 4, 6, 3], 25,557,032 parameters (25.6M; PHub Table 3: 97 MB).

    18 layers: conv1, 16 blocks, fc (``split_index = 17``).
    """
    return resnet(Bottleneck, [3, 4, 6, 3], input_shape, num_classes, "resnet50")


@register_model("resnet152", input_shape=(3, 224, 224), num_classes=1000)
def resnet152(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """ResNet-152: bottleneck blocks [3, 8, 36, 3], 60,192,808 parameters (Stanza Table 1: 60.2M).

    52 layers: conv1, 50 blocks, fc (``split_index = 51``).
    """
    return resnet(Bottleneck, [3, 8, 36, 3], input_shape, num_classes, "resnet152")
