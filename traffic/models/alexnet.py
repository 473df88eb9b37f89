"""AlexNet-style convolutional nets: ``alexnet`` (ImageNet) and ``cifar100_alexnet`` (Pipe-SGD's CIFAR-100 net)."""

from __future__ import annotations

from torch import nn

from traffic.models.base import LayeredModel, register_model


@register_model("alexnet", input_shape=(3, 224, 224), num_classes=1000)
def alexnet(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """AlexNet, single-tower "one weird trick" variant (torchvision's definition): 61,100,840 parameters.

    Stanza Table 1/5 and Pipe-SGD §4 give AlexNet [Krizhevsky et al.] 61.1M parameters,
    which is this variant's count (conv widths 64-192-384-256-256 without grouping; the
    original two-GPU net with 96-256-384-384-256 and grouped convolutions has 60.97M).

    Layers (8; ``split_index = 5``)::

        conv1  Conv 11x11/4 3->64 + ReLU + MaxPool 3/2        (3, 224, 224) -> (64, 27, 27)
        conv2  Conv 5x5 64->192 + ReLU + MaxPool 3/2          -> (192, 13, 13)
        conv3  Conv 3x3 192->384 + ReLU
        conv4  Conv 3x3 384->256 + ReLU
        conv5  Conv 3x3 256->256 + ReLU + MaxPool 3/2 + AdaptiveAvgPool 6x6 -> (256, 6, 6)
        fc6    Flatten + Dropout + Linear 9216->4096 + ReLU   (the 9,216 activations per
               sample that Stanza's CONV workers send, §3)
        fc7    Dropout + Linear 4096->4096 + ReLU
        fc8    Linear 4096->num_classes

    ``AdaptiveAvgPool2d((6, 6))`` is the identity at 224x224 and keeps fc6 at 9,216 inputs
    for other sizes.
    """
    c = input_shape[0]
    layers = [
        nn.Sequential(nn.Conv2d(c, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2)),
        nn.Sequential(nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2)),
        nn.Sequential(nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True)),
        nn.Sequential(nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True)),
        nn.Sequential(
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2), nn.AdaptiveAvgPool2d((6, 6))
        ),
        nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True)),
        nn.Sequential(nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True)),
        nn.Linear(4096, num_classes),
    ]
    names = ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
    return LayeredModel(layers, name="alexnet", split_index=5, layer_names=names)


@register_model("cifar100_alexnet", input_shape=(3, 32, 32), num_classes=100)
def cifar100_alexnet(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """Pipe-SGD's CIFAR100-CNN: 3 convolutional + 2 fully-connected layers, 151,428 parameters.

    Pipe-SGD §4 uses "the simple AlexNet-style CIFAR100 architecture in [32]" (Liao,
    Schwing, Zemel, Urtasun: Learning Deep Parsimonious Representations, NIPS 2016) and
    refers to [32] for its parameters. Their code's CIFAR-100 baseline (repository
    ``lrjconan/deep_parsimonious``, ``exp_config.py``/``nn_cell_lib.py``) is Caffe's
    ``cifar10_quick`` layout, followed here::

        conv1  Conv 5x5 3->32 (pad 2) + ReLU + MaxPool 3/2     (3, 32, 32) -> (32, 16, 16)
        conv2  Conv 5x5 32->32 (pad 2) + ReLU + AvgPool 3/2    -> (32, 8, 8)
        conv3  Conv 5x5 32->64 (pad 2) + ReLU + AvgPool 3/2    -> (64, 4, 4)
        fc1    Flatten + Linear 1024->64                        (no activation, as in [32])
        fc2    Linear 64->num_classes

    ``split_index = 3``. The pools use ``ceil_mode`` (Caffe's rounding; the same output
    sizes as TensorFlow's ``SAME`` pooling of [32]). Pipe-SGD's CIFAR100-Convex trains only
    ``fc2`` (the last layer) with the others frozen.
    Parameters: 2,432 + 25,632 + 51,264 + 65,600 + 6,500 = 151,428 (100 classes).
    """
    c, h, w = input_shape
    layers = [
        nn.Sequential(nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True)),
        nn.Sequential(nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True)),
        nn.Sequential(nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True)),
    ]
    side_h, side_w = h, w
    for _ in range(3):
        side_h, side_w = -(-(side_h - 3) // 2) + 1, -(-(side_w - 3) // 2) + 1
    layers += [nn.Sequential(nn.Flatten(), nn.Linear(64 * side_h * side_w, 64)), nn.Linear(64, num_classes)]
    return LayeredModel(
        layers, name="cifar100_alexnet", split_index=3, layer_names=["conv1", "conv2", "conv3", "fc1", "fc2"]
    )
