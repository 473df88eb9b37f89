"""Models split into layers, registered by name (``workload.model``).

A model is a :class:`LayeredModel`: an ``nn.Module`` whose ``layers`` (an ``nn.ModuleList``
in forward order) are the units the schemes act on. A *layer* is a block that owns
parameters (e.g. ``Linear`` + ``ReLU``); the training loop calls a scheme's
``before_forward(it, layer)`` / ``after_backward(it, layer)`` hooks per layer, and the
parameter server's *keys* are the model's parameter tensors, each belonging to one layer.

Registering a model::

    @register_model("my_mlp")
    def my_mlp(input_shape, num_classes):
        return LayeredModel([...], name="my_mlp")

:func:`build_model` seeds torch's RNG (without disturbing the caller's RNG state) before
calling the builder, so every process that builds ``(name, seed)`` gets identical
parameters: this is how workers and servers agree on the initial model without sending it.

Room is left for what later issues add: a model zoo (VGG, ResNet ...), the conv/fc split
(``split_index``: index of the first fully-connected layer, used by Stanza's CONV/FC
workers) and emulated compute (per-layer profiled times instead of real computation).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["LayeredModel", "register_model", "available_models", "build_model"]


class LayeredModel(nn.Module):
    """A model as an ordered list of layers; ``forward`` runs them in order.

    Args:
        layers: the blocks in forward order; each should own parameters.
        name: the registry name (for messages and results).
        split_index: index in ``layers`` of the first fully-connected layer for models
            with a convolutional part followed by a fully-connected part (Stanza's layer
            separation); ``None`` when not applicable.

    Attributes:
        layers: ``nn.ModuleList`` in forward order; layer 0 gets the input.
        split_index: see above.
    """

    def __init__(self, layers: Sequence[nn.Module], name: str = "", split_index: int | None = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.name = name
        self.split_index = split_index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run every layer in order. ``x``: ``(batch, *input_shape)`` -> ``(batch, num_classes)`` logits."""
        for layer in self.layers:
            x = layer(x)
        return x

    def param_layers(self) -> list[int]:
        """Layer index of each tensor of ``self.parameters()``, in that order.

        ``parameters()`` enumerates layer 0's tensors first, so the list is non-decreasing.
        """
        out = []
        for i, layer in enumerate(self.layers):
            out += [i] * len(list(layer.parameters()))
        return out

    def layer_numels(self) -> list[int]:
        """Number of parameter elements of each layer (forward order)."""
        return [sum(p.numel() for p in layer.parameters()) for layer in self.layers]


Builder = Callable[[tuple[int, ...], int], LayeredModel]
_MODELS: dict[str, Builder] = {}


def register_model(name: str) -> Callable[[Builder], Builder]:
    """Decorator: register ``builder(input_shape, num_classes) -> LayeredModel`` as ``name``."""
    def deco(fn: Builder) -> Builder:
        _MODELS[name] = fn
        return fn
    return deco


def available_models() -> list[str]:
    """Names of every registered model, sorted."""
    return sorted(_MODELS)


def build_model(name: str, seed: int, input_shape: Sequence[int], num_classes: int) -> LayeredModel:
    """Build model ``name`` with parameters initialised deterministically from ``seed``.

    Args:
        name: a name from :func:`available_models`.
        seed: initialisation seed; the same ``(name, seed, input_shape, num_classes)`` gives
            bit-identical parameters in every process. The caller's torch RNG state is left
            untouched.
        input_shape: shape of one sample, without the batch dimension, e.g. ``(64,)``.
        num_classes: number of output logits.

    Returns:
        The model in training mode, float32, on the CPU.

    Raises:
        KeyError: unknown ``name`` (the spec validation reports it first as a SpecError).
    """
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _MODELS[name](tuple(int(d) for d in input_shape), int(num_classes))
    if not isinstance(model, LayeredModel):
        raise TypeError(f"model builder {name!r} returned {type(model).__name__}, not a LayeredModel")
    return model.train()


# the builders register themselves on import
from traffic.models import mlp  # noqa: E402,F401
