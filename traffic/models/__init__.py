"""Models split into layers, registered by name (``workload.model``).

A model is a :class:`LayeredModel`: an ``nn.Module`` whose ``layers`` (an ``nn.ModuleList``
in forward order) are the units the schemes act on. A *layer* is a block that owns
parameters (e.g. ``Linear`` + ``ReLU``, or ``Conv2d`` + ``ReLU`` + ``MaxPool2d``, or one
residual/inception block); the training loop calls a scheme's ``before_forward(it, layer)``
/ ``after_backward(it, layer)`` hooks per layer, and the parameter server's *keys* are the
model's parameter tensors, each belonging to one layer.

Registering a model, with its native input (shape of one sample, dtype) and class count::

    @register_model("my_mlp", input_shape=(64,), num_classes=10)
    def my_mlp(input_shape, num_classes):
        return LayeredModel([...], name="my_mlp")

:func:`build_model` seeds torch's RNG (without disturbing the caller's RNG state) before
calling the builder, so every process that builds ``(name, seed)`` gets identical
parameters: this is how workers and servers agree on the initial model without sending it.
``build_model(name, seed, device="meta")`` builds without allocating memory (parameter
counts, layer sizes, shape and FLOP analysis of the big ImageNet models on a small machine);
:func:`model_info` describes a model that way without building it for real.

The zoo (one module per family; every parameter count is checked in ``tests/unit/test_models.py``)::

    name              params      native input            classes  follows
    digits_mlp         301,066    (64,)          float32       10  the quick-start model
    digits_cnn          71,754    (64,)          float32       10  Stanza Table 6 check on digits (2 conv + 2 FC)
    mnist_mlp          648,010    (784,)         float32       10  Pipe-SGD §4 (784-500-500-10)
    stanza_mlp       8,435,722    (3072,)        float32       10  Stanza Table 7 (1024-1024-4096, CIFAR-10)
    cifar100_alexnet   151,428    (3, 32, 32)    float32      100  Pipe-SGD §4 / Liao et al. 2016 [32]
    alexnet         61,100,840    (3, 224, 224)  float32     1000  Stanza Table 1 (61.1M)
    vgg16          138,357,544    (3, 224, 224)  float32     1000  Stanza Table 1 (138M)
    vgg19          143,667,240    (3, 224, 224)  float32     1000  Stanza, iBatch Table 1 (143M)
    vgg19_22k      229,052,817    (3, 224, 224)  float32    21841  iBatch Table 1 (VGG19-22K, 229M)
    vgg16_cifar10   33,638,218    (3, 32, 32)    float32       10  Stanza Table 5 (33.6M)
    resnet18        11,689,512    (3, 224, 224)  float32     1000  PHub Table 3 (45 MB)
    resnet50        25,557,032    (3, 224, 224)  float32     1000  P3, PHub Table 3
    resnet152       60,192,808    (3, 224, 224)  float32     1000  Stanza Table 1 (60.2M)
    googlenet        6,624,904    (3, 224, 224)  float32     1000  torchvision (iBatch Table 1: 5M)
    inception_v3    27,161,264    (3, 299, 299)  float32     1000  Stanza, iBatch Table 1 (27M, aux head)
    sockeye_lstm    54,638,384    (50,)          int64      30000  P3 §5 (Sockeye; heaviest layer first)

Classifiers return ``(batch, num_classes)`` logits; ``sockeye_lstm`` returns ``(batch,
seq_len, vocab)`` logits (:meth:`LayeredModel.loss`: cross-entropy over flattened tokens).

``split_index`` is the index of the first fully-connected layer (Stanza's CONV/FC
boundary: the CONV part is every layer up to and including the last pooling after the last
convolution), ``None`` for models without such a boundary. For ``stanza_mlp`` it is where
Stanza's Table 7 separates the MLP (after the second hidden layer).
"""

from __future__ import annotations

# the zoo: each module registers its models
from traffic.models import alexnet, cnn, inception, mlp, resnet, seq2seq, vgg  # noqa: F401
from traffic.models.base import (
    LayeredModel,
    available_models,
    build_model,
    model_info,
    model_output_shape,
    register_model,
)

__all__ = ["LayeredModel", "register_model", "available_models", "build_model", "model_info", "model_output_shape"]
