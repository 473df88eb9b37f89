"""VGG (Simonyan & Zisserman 2014): ``vgg16``, ``vgg19`` (ImageNet), ``vgg19_22k`` (ImageNet-22K, iBatch
Table 1) and ``vgg16_cifar10`` (Stanza Table 5)."""

from __future__ import annotations

from torch import nn

from traffic.models.base import LayeredModel, register_model

# output channels per convolution, "M" = 2x2 max pooling (configurations D and E of the paper)
_CFG = {
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


def _conv_layers(depth: int, in_channels: int) -> tuple[list[nn.Module], list[str]]:
    """One layer per convolution: ``Conv 3x3 (pad 1) + ReLU``, plus the ``MaxPool 2/2`` that follows it."""
    layers: list[list[nn.Module]] = []
    names: list[str] = []
    stage, idx = 1, 0
    c = in_channels
    for v in _CFG[depth]:
        if v == "M":
            layers[-1].append(nn.MaxPool2d(2, 2))
            stage, idx = stage + 1, 0
            continue
        idx += 1
        layers.append([nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)])
        names.append(f"conv{stage}_{idx}")
        c = v
    return [nn.Sequential(*b) for b in layers], names


def _init(model: nn.Module) -> None:
    """torchvision's VGG initialisation: Kaiming-normal (fan_out) convolutions, N(0, 0.01) linears, zero biases."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


def vgg(
    depth: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    name: str,
    pooled: int,
    hidden: int = 4096,
    dropout: float = 0.5,
) -> LayeredModel:
    """VGG-``depth``: one layer per 3x3 convolution (+ReLU, +the max pooling after it), then three FC layers.

    The last convolutional layer ends with ``AdaptiveAvgPool2d((pooled, pooled))``
    (torchvision's; the identity at the native input size), so the CONV part ends
    with ``512 * pooled**2`` activations per sample. FC layers: ``Flatten + Linear + ReLU +
    Dropout``, ``Linear + ReLU + Dropout``, ``Linear`` (``fc6``, ``fc7``, ``fc8``);
    ``split_index`` is the index of ``fc6`` (13 for VGG-16, 16 for VGG-19).
    """
    layers, names = _conv_layers(depth, input_shape[0])
    layers[-1].append(nn.AdaptiveAvgPool2d((pooled, pooled)))
    split = len(layers)
    layers += [
        nn.Sequential(
            nn.Flatten(), nn.Linear(512 * pooled * pooled, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)
        ),
        nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)),
        nn.Linear(hidden, num_classes),
    ]
    names += ["fc6", "fc7", "fc8"]
    model = LayeredModel(layers, name=name, split_index=split, layer_names=names)
    _init(model)
    return model


@register_model("vgg16", input_shape=(3, 224, 224), num_classes=1000)
def vgg16(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """VGG-16 (configuration D) on ImageNet: 138,357,544 parameters (Stanza Table 1: 138M).

    16 layers: 13 convolutional (``conv1_1`` .. ``conv5_3``, the last one with pool5 and a 7x7
    adaptive average pool: 25,088 activations per sample) and fc6 25088->4096, fc7
    4096->4096, fc8 4096->1000 (``split_index = 13``).
    """
    return vgg(16, input_shape, num_classes, "vgg16", pooled=7)


@register_model("vgg19", input_shape=(3, 224, 224), num_classes=1000)
def vgg19(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """VGG-19 (configuration E) on ImageNet: 143,667,240 parameters (Stanza and iBatch Table 1: 143M).

    19 layers: 16 convolutional and fc6/fc7/fc8 as VGG-16 (``split_index = 16``); fc6 holds
    102.8M parameters, 71.5% of the model (P3 §3, Figure 5(c)).
    """
    return vgg(19, input_shape, num_classes, "vgg19", pooled=7)


#: the ImageNet-22K (fall 2011) classes: iBatch's "ImageNet22K ... 14.2 million labeled images from 21841 categories"
IMAGENET_22K_CLASSES = 21_841


@register_model("vgg19_22k", input_shape=(3, 224, 224), num_classes=IMAGENET_22K_CLASSES)
def vgg19_22k(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """VGG-19 on ImageNet-22K (iBatch Table 1: VGG19-22K, 229M): 229,052,817 parameters.

    ``vgg19`` with fc8 4096->21,841 (89,482,577 parameters, 39.1% of the model) instead of
    4096->1000; every other layer as VGG-19. iBatch calls it "an improved version of VGG19
    network" with 229M parameters, trained on ImageNet22K's 21,841 categories; VGG-19 with
    a classifier over those categories has that count: 143.7M - 4.1M (fc8 on 1,000 classes)
    + 89.5M.
    """
    return vgg(19, input_shape, num_classes, "vgg19_22k", pooled=7)


@register_model("vgg16_cifar10", input_shape=(3, 32, 32), num_classes=10)
def vgg16_cifar10(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """VGG-16 for CIFAR-10 (Stanza Table 5: 33.6M): 33,638,218 parameters.

    Stanza §6.2 modifies "the last softmax layer in the original VGG-16 in order to use
    CIFAR-10". The variant that gives 33.6M: VGG-16's 13 convolutions unchanged
    (14,714,688 parameters; a 32x32 image leaves 512x1x1 after pool5)
    and the original FC widths on 512 inputs: fc6 512->4096 (2,101,248), fc7 4096->4096
    (16,781,312), fc8 4096->10 (40,970). Stanza's footnote 5 uses 33.3M in its estimate.
    ``split_index = 13``; the CONV workers send 512 activations per sample.
    """
    return vgg(16, input_shape, num_classes, "vgg16_cifar10", pooled=1)
