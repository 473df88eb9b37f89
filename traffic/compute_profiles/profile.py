"""Compute profiles: per-layer forward/backward times, their files and loading (see :mod:`traffic.compute_profiles`)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.errors import TestbedError
from traffic import models

__all__ = [
    "DATA_DIR",
    "LayerProfile",
    "Profile",
    "load_profile",
    "available_profiles",
    "profile_filename",
    "layer_names",
    "build_for_profile",
    "example_input",
    "METHOD_PUBLISHED",
    "METHOD_MEASURED",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Directory of the shipped profile files ``<model>-<device>-b<batch>.json``."""

METHOD_PUBLISHED = "flops-split of published per-batch time"
METHOD_MEASURED = "measured"
METHOD_ZERO = "zero"


@dataclass
class LayerProfile:
    """One layer's times (seconds per batch) and FLOPs (per batch; ``None`` if not counted)."""

    index: int
    name: str
    forward_s: float
    backward_s: float
    flops_forward: float | None = None
    flops_backward: float | None = None


@dataclass
class Profile:
    """Per-layer forward/backward compute times of one model on one device at one batch size.

    Attributes:
        model: registry name of the model (``traffic.models``).
        device: device name, e.g. ``"gtx1080ti"``, ``"v100"``, ``"cpu"``, ``"zero"``.
        batch_size: samples per batch the times are for.
        source: citation (paper, table) or ``"measured on <cpu/gpu> by testbed profile at <date>"``.
        method: ``"flops-split of published per-batch time"``, ``"measured"``,
            ``"derived: <ratio and its source>"`` or ``"zero"``.
        derived: true when the times were scaled from another profile rather than taken from a
            publication or a measurement.
        layers: one :class:`LayerProfile` per layer of the model, in forward order.
    """

    model: str
    device: str
    batch_size: int
    source: str
    method: str
    derived: bool
    layers: list[LayerProfile] = field(default_factory=list)

    def forward_s(self) -> list[float]:
        """Forward time of each layer, seconds per batch, forward order."""
        return [l.forward_s for l in self.layers]

    def backward_s(self) -> list[float]:
        """Backward time of each layer, seconds per batch, forward order (layer 0 first,
        although backward runs the last layer first)."""
        return [l.backward_s for l in self.layers]

    def total_s(self) -> float:
        """Forward plus backward time of the whole model, seconds per batch."""
        return sum(self.forward_s()) + sum(self.backward_s())

    def scaled(self, factor: float, device: str, method: str, source: str | None = None) -> Profile:
        """A derived copy: every time multiplied by ``factor`` (FLOPs kept), for ``device``.

        ``method`` should state the ratio and its source (``"derived: ..."``); ``derived`` is
        set. ``source`` defaults to this profile's source.
        """
        return Profile(
            model=self.model,
            device=device,
            batch_size=self.batch_size,
            source=self.source if source is None else source,
            method=method,
            derived=True,
            layers=[
                LayerProfile(
                    l.index, l.name, l.forward_s * factor, l.backward_s * factor, l.flops_forward, l.flops_backward
                )
                for l in self.layers
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dictionary (the file format in the module docstring)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "profile") -> Profile:
        """Parse the file format; raises :class:`TestbedError` naming ``origin`` when malformed."""
        try:
            layers = [
                LayerProfile(
                    index=int(l["index"]),
                    name=str(l["name"]),
                    forward_s=float(l["forward_s"]),
                    backward_s=float(l["backward_s"]),
                    flops_forward=l.get("flops_forward"),
                    flops_backward=l.get("flops_backward"),
                )
                for l in d["layers"]
            ]
            p = cls(
                model=str(d["model"]),
                device=str(d["device"]),
                batch_size=int(d["batch_size"]),
                source=str(d["source"]),
                method=str(d["method"]),
                derived=bool(d["derived"]),
                layers=layers,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TestbedError(
                f"{origin} is not a valid profile ({type(e).__name__}: {e}); expected keys "
                "model, device, batch_size, source, method, derived, layers[index, name, "
                "forward_s, backward_s, flops_forward, flops_backward]"
            ) from None
        if [l.index for l in layers] != list(range(len(layers))):
            raise TestbedError(f"{origin}: layer indices must be 0..{len(layers) - 1} in order")
        if any(l.forward_s < 0 or l.backward_s < 0 for l in layers):
            raise TestbedError(f"{origin}: negative layer time")
        return p

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the profile as JSON to ``path``; returns the path.

        Raises:
            TestbedError: ``path`` exists and ``overwrite`` is false, or cannot be written.
        """
        path = Path(path)
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        try:
            with open(path, "w" if overwrite else "x") as f:
                f.write(text)
        except FileExistsError:
            raise TestbedError(
                f"{path} exists; profiles are never overwritten: remove it or pass another --out"
            ) from None
        except OSError as e:
            raise TestbedError(f"cannot write profile {path}: {e}") from None
        return path

    def save_new(self, path: str | os.PathLike) -> Path | None:
        """Write the profile to ``path`` unless a file is there already (it is kept as it is);
        returns the path written, or ``None`` when one was kept.

        Raises:
            TestbedError: ``path`` cannot be written.
        """
        try:
            return self.save(path)
        except TestbedError:
            if Path(path).exists():
                return None
            raise


def profile_filename(model: str, device: str, batch_size: int) -> str:
    """``<model>-<device>-b<batch>.json``, the name of a data file."""
    return f"{model}-{device}-b{int(batch_size)}.json"


def _read(path: Path) -> Profile:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TestbedError(f"cannot read profile {path}: {e}") from None
    return Profile.from_dict(d, origin=str(path))


def available_profiles(data_dir: str | os.PathLike | None = None) -> list[tuple[str, str, int]]:
    """``(model, device, batch_size)`` of every shipped profile file, sorted."""
    d = Path(data_dir) if data_dir is not None else DATA_DIR
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            meta = json.loads(p.read_text())
            out.append((str(meta["model"]), str(meta["device"]), int(meta["batch_size"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a profile
    return sorted(out)


def _available_text(model: str) -> str:
    have = [f"{dev} b{b}" for m, dev, b in available_profiles() if m == model]
    listed = ", ".join(have) if have else "no shipped profiles"
    return (
        f"available for {model!r}: {listed}; or 'zero' (infinitely fast compute), or the path of "
        f"a JSON file written by 'testbed profile {model} --batch B'"
    )


# ----------------------------------------------------------------------- models


def build_for_profile(model: str, device: str | None = None, seed: int = 0):
    """Build the registered model ``model`` at its native input (``device="meta"``: shapes
    only, no memory).

    Raises:
        TestbedError: no model of that name is registered.
    """

    if model not in models.available_models():
        raise TestbedError(f"unknown model {model!r}; available: {', '.join(models.available_models())}")
    return models.build_model(model, seed, device=device)


def example_input(net, batch_size: int, device=None):
    """A batch of ``batch_size`` samples of ``net``'s native input (``LayeredModel.example_input``)."""
    return net.example_input(batch_size, device)


def layer_names(net) -> list[str]:
    """The model's short name per layer (``LayeredModel.layer_names``, e.g. ``"conv1"``)."""
    return [str(n) for n in net.layer_names]


def _model_layers(model: str) -> list[str]:
    """Layer names of the registered model (``model_info``: a cached build on the meta device)."""

    if model not in models.available_models():
        raise TestbedError(f"unknown model {model!r}; available: {', '.join(models.available_models())}")
    return list(models.model_info(model)["layer_names"])


# ----------------------------------------------------------------------- lookup


def zero_profile(model: str, batch_size: int, n_layers: int | None = None) -> Profile:
    """All-zero times for every layer of ``model`` (PHub's ``ZeroComputeEngine``, Section 4.4).

    ``n_layers`` given: that many layers (the model need not be registered); otherwise the
    registered model's layers.
    """
    names = _model_layers(model) if n_layers is None else [f"layer{i}" for i in range(n_layers)]
    return Profile(
        model=model,
        device="zero",
        batch_size=int(batch_size),
        source="infinitely fast compute (PHub ZeroComputeEngine, PHub Section 4.4)",
        method=METHOD_ZERO,
        derived=False,
        layers=[LayerProfile(i, n, 0.0, 0.0, None, None) for i, n in enumerate(names)],
    )


def load_profile(ref: str, model: str, batch_size: int, n_layers: int | None = None) -> Profile:
    """The profile ``ref`` of ``model`` at ``batch_size``.

    Args:
        ref: ``"zero"`` (all times zero), a device name such as ``"gtx1080ti"`` (the data file
            ``traffic/compute_profiles/data/<model>-<device>-b<batch>.json``), or the path of a JSON
            profile (e.g. written by ``testbed profile``).
        model: registry name of the model the profile must be for.
        batch_size: samples per batch the profile must be for.
        n_layers: the model's number of layers; ``None``: build ``model`` on the meta device
            to count them.

    Returns:
        The :class:`Profile`, one entry per layer.

    Raises:
        TestbedError: no such profile (the message lists what is available for ``model``); the
            file is for another model or batch size; its layer count differs from the model's.
    """
    batch_size = int(batch_size)
    if ref == "zero":
        return zero_profile(model, batch_size, n_layers)
    looks_like_path = ref.endswith(".json") or os.sep in ref or "/" in ref
    if looks_like_path:
        path = Path(ref)
        if not path.is_file():
            raise TestbedError(f"profile file {ref} not found; {_available_text(model)}")
    else:
        path = DATA_DIR / profile_filename(model, ref.lower(), batch_size)
        if not path.is_file():
            raise TestbedError(f"no profile of {model!r} on {ref!r} at batch {batch_size}; {_available_text(model)}")
    prof = _read(path)
    if prof.model != model or prof.batch_size != batch_size:
        raise TestbedError(
            f"profile {path} is for {prof.model!r} at batch {prof.batch_size}, not "
            f"{model!r} at batch {batch_size}; {_available_text(model)}"
        )
    expected = n_layers if n_layers is not None else len(_model_layers(model))
    if len(prof.layers) != expected:
        raise TestbedError(
            f"profile {path} has {len(prof.layers)} layers but model {model!r} has "
            f"{expected}: the model changed since the profile was made; regenerate it "
            "(python -m traffic.compute_profiles.generate, or testbed profile)"
        )
    return prof
