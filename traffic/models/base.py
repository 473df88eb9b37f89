"""The layered model, the model registry and how models are built (see :mod:`traffic.models`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LayeredModel", "register_model", "available_models", "build_model", "model_info", "model_output_shape"]


class LayeredModel(nn.Module):
    """A model as an ordered list of layers; ``forward`` runs them in order.

    Args:
        layers: the blocks in forward order; each should own parameters.
        name: the registry name (for messages and results).
        split_index: index in ``layers`` of the first fully-connected layer for models
            with a convolutional part followed by a fully-connected part (Stanza's layer
            separation); ``None`` when not applicable.
        layer_names: a short name per layer (``"conv1"``, ``"fc6"``, ``"layer3.5"`` ...) for
            reports; default ``"0"``, ``"1"`` ...
        aux_weight: weight of auxiliary classifiers' losses in :meth:`loss` (see below).

    Attributes:
        layers: ``nn.ModuleList`` in forward order; layer 0 gets the input.
        split_index, layer_names, aux_weight: see above.
        input_shape: shape of one input sample, without the batch dimension (set by
            :func:`build_model`; ``None`` for a model built by hand).
        input_dtype: ``torch.float32`` for images/features, ``torch.long`` for token ids.
        input_high: for integer input, the exclusive upper bound of the ids (vocabulary
            size); ``None`` for float input.
        num_classes: number of output classes (target vocabulary for sequence models).

    Auxiliary classifiers (Inception-v3's ``AuxLogits``): a layer may set an attribute
    ``aux_logits`` to a ``(batch, num_classes)`` tensor during a training-mode forward
    (``None`` in eval mode). :meth:`forward` then returns the main logits with
    ``0 * aux_logits.sum()`` added -- the value is unchanged, but every parameter stays on
    the gradient path, so a plain ``cross_entropy(model(x), y)`` gives the auxiliary head
    (zero) gradients and per-layer gradient hooks fire for every layer. :meth:`loss` adds
    ``aux_weight * cross_entropy(aux_logits, y)``, the way the head is trained for real.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        name: str = "",
        split_index: int | None = None,
        layer_names: Sequence[str] | None = None,
        aux_weight: float = 0.0,
    ):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.name = name
        self.split_index = split_index
        if layer_names is not None and len(layer_names) != len(self.layers):
            raise ValueError(f"{len(layer_names)} layer names for {len(self.layers)} layers")
        self.layer_names = list(layer_names) if layer_names is not None else [str(i) for i in range(len(self.layers))]
        self.aux_weight = float(aux_weight)
        self.input_shape: tuple[int, ...] | None = None
        self.input_dtype: torch.dtype = torch.float32
        self.input_high: int | None = None
        self.num_classes: int | None = None
        self._aux: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run every layer in order.

        ``x``: ``(batch, *input_shape)`` of ``input_dtype``. Returns logits, ``(batch,
        num_classes)`` for classifiers, ``(batch, seq_len, vocab)`` for sequence models.
        """
        aux: list[torch.Tensor] = []
        for layer in self.layers:
            x = layer(x)
            a = getattr(layer, "aux_logits", None)
            if a is not None:
                aux.append(a)
                layer.aux_logits = None  # the model keeps it (for loss()) until the next forward
        self._aux = aux
        if aux and self.training:
            x = x + 0.0 * sum(a.sum() for a in aux)
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean training loss of the last forward's ``logits`` against ``targets``.

        Classifiers: ``cross_entropy(logits, targets)`` with ``targets`` ``(batch,)`` int64.
        Sequence models (``logits`` ``(batch, seq_len, vocab)``): cross-entropy over the
        flattened tokens, ``targets`` ``(batch, seq_len)`` int64 -- the mean over
        ``batch * seq_len`` tokens. Models with auxiliary classifiers add
        ``aux_weight * cross_entropy(aux_logits, targets)`` per auxiliary output of the
        last training-mode forward.
        """
        if logits.dim() == 3:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        else:
            loss = F.cross_entropy(logits, targets)
        if self.training and self.aux_weight:
            for a in self._aux:
                loss = loss + self.aux_weight * F.cross_entropy(a, targets)
        return loss

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

    def num_params(self) -> int:
        """Total number of parameter elements (works on the meta device too)."""
        return sum(p.numel() for p in self.parameters())

    def _device(self, device: torch.device | str | None) -> torch.device:
        if device is not None:
            return torch.device(device)
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def example_input(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        """A dummy input batch ``(batch_size, *input_shape)`` of ``input_dtype``.

        Float models get standard-normal values, token models ids in ``[0, input_high)``;
        the values are the same on every call (a private generator seeded 0; the global
        RNG is not touched). ``device``: default the device of the parameters, so a model
        built on ``"meta"`` gets a meta tensor (no memory).

        Raises:
            ValueError: ``input_shape`` unknown (a model not made by :func:`build_model`).
        """
        if self.input_shape is None:
            raise ValueError(f"model {self.name!r} has no input_shape; build it with build_model()")
        dev = self._device(device)
        shape = (int(batch_size), *self.input_shape)
        if dev.type == "meta":
            return torch.empty(shape, dtype=self.input_dtype, device=dev)
        g = torch.Generator().manual_seed(0)
        if self.input_dtype.is_floating_point:
            x = torch.randn(shape, generator=g, dtype=self.input_dtype)
        else:
            x = torch.randint(0, self.input_high or 2, shape, generator=g, dtype=self.input_dtype)
        return x.to(dev)

    def example_target(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Dummy labels matching :meth:`example_input`: ``(batch_size,)`` int64 class ids, or
        ``(batch_size, seq_len)`` token ids for sequence models; for :meth:`loss`."""
        if self.num_classes is None or self.input_shape is None:
            raise ValueError(f"model {self.name!r} has no num_classes/input_shape; build it with build_model()")
        dev = self._device(device)
        shape = (int(batch_size), *self.input_shape) if not self.input_dtype.is_floating_point else (int(batch_size),)
        if dev.type == "meta":
            return torch.empty(shape, dtype=torch.long, device=dev)
        g = torch.Generator().manual_seed(1)
        return torch.randint(0, self.num_classes, shape, generator=g).to(dev)


Builder = Callable[[tuple[int, ...], int], LayeredModel]


@dataclass(frozen=True)
class _Entry:
    builder: Builder
    input_shape: tuple[int, ...] | None
    num_classes: int | None
    input_dtype: torch.dtype
    input_high: int | None


_MODELS: dict[str, _Entry] = {}


def register_model(
    name: str,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    *,
    input_dtype: torch.dtype = torch.float32,
    input_high: int | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator: register ``builder(input_shape, num_classes) -> LayeredModel`` as ``name``.

    Args:
        name: registry name (``workload.model``).
        input_shape: the model's native shape of one sample (without batch), used by
            :func:`build_model` when the caller gives none; ``None``: callers must give one.
        num_classes: the native number of classes (likewise).
        input_dtype: ``torch.float32`` (images, features) or ``torch.long`` (token ids).
        input_high: for integer input, the number of distinct ids (source vocabulary).
    """

    def deco(fn: Builder) -> Builder:
        _MODELS[name] = _Entry(
            fn,
            tuple(int(d) for d in input_shape) if input_shape is not None else None,
            int(num_classes) if num_classes is not None else None,
            input_dtype,
            int(input_high) if input_high is not None else None,
        )
        _info.cache_clear()
        return fn

    return deco


def available_models() -> list[str]:
    """Names of every registered model, sorted."""
    return sorted(_MODELS)


def _entry(name: str) -> _Entry:
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    return _MODELS[name]


def build_model(
    name: str,
    seed: int,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    device: torch.device | str | None = None,
) -> LayeredModel:
    """Build model ``name`` with parameters initialised deterministically from ``seed``.

    Args:
        name: a name from :func:`available_models`.
        seed: initialisation seed; the same ``(name, seed, input_shape, num_classes)`` gives
            bit-identical parameters in every process. The caller's torch RNG state is left
            untouched.
        input_shape: shape of one sample, without the batch dimension, e.g. ``(64,)``;
            default the model's native shape (:func:`model_info`).
        num_classes: number of output logits; default the model's native class count.
        device: where to create the parameters; default the CPU. ``"meta"`` creates
            shape-only tensors (no memory, no initialisation): for counting parameters,
            layer sizes, output shapes and FLOPs of big models.

    Returns:
        The model in training mode, float32, with ``input_shape``, ``input_dtype``,
        ``input_high`` and ``num_classes`` set (so :meth:`LayeredModel.example_input` works).

    Raises:
        KeyError: unknown ``name`` (the spec validation reports it first as a SpecError).
        ValueError: no ``input_shape``/``num_classes`` given and the model has no native one.
    """
    e = _entry(name)
    shape = tuple(int(d) for d in input_shape) if input_shape is not None else e.input_shape
    classes = int(num_classes) if num_classes is not None else e.num_classes
    if shape is None or classes is None:
        raise ValueError(f"model {name!r} has no native input_shape/num_classes; give both to build_model()")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if device is None:
            model = e.builder(shape, classes)
        else:
            with torch.device(device):
                model = e.builder(shape, classes)
    if not isinstance(model, LayeredModel):
        raise TypeError(f"model builder {name!r} returned {type(model).__name__}, not a LayeredModel")
    model.input_shape, model.num_classes = shape, classes
    model.input_dtype, model.input_high = e.input_dtype, e.input_high
    return model.train()


def model_info(name: str) -> dict[str, Any]:
    """What a model is, from a build on the meta device, without running it (cheap; cached
    per name). Its output's shape is :func:`model_output_shape`.

    Returns a dict:
        ``name``; ``input_shape`` (native shape of one sample, a tuple); ``input_dtype``
        (``torch.float32`` or ``torch.long``); ``input_high`` (vocabulary size of integer
        input, else ``None``); ``num_classes``; ``split_index``; ``num_layers``;
        ``layer_names``; ``layer_numels`` (parameters per layer); ``num_params``;
        ``param_bytes`` (float32); ``description`` (first line of the builder's docstring).

    Raises:
        KeyError: unknown ``name``.
        ValueError: the model has no native input shape / class count.
    """
    return dict(_info(name))


@functools.cache
def model_output_shape(name: str) -> tuple[int, ...]:
    """The shape of one sample's logits: ``(num_classes,)`` or ``(seq_len, vocab)``, from a
    forward pass on the meta device (its first call in a process loads torch's meta kernels,
    which take seconds: the harness never needs it). Raises as :func:`model_info`."""
    m = build_model(name, 0, device="meta")
    with torch.no_grad():
        return tuple(m.eval()(m.example_input(1)).shape[1:])


@functools.cache
def _info(name: str) -> tuple:
    e = _entry(name)
    m = build_model(name, 0, device="meta")
    n = m.num_params()
    doc = (e.builder.__doc__ or "").strip().splitlines()
    return tuple(
        dict(
            name=name,
            input_shape=m.input_shape,
            input_dtype=m.input_dtype,
            input_high=m.input_high,
            num_classes=m.num_classes,
            split_index=m.split_index,
            num_layers=len(m.layers),
            layer_names=tuple(m.layer_names),
            layer_numels=tuple(m.layer_numels()),
            num_params=n,
            param_bytes=4 * n,
            description=doc[0] if doc else "",
        ).items()
    )


# the builders register themselves on import
