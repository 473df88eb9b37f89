"""The derivation scripts of experiments/*_profiles, and the profiles they ship, for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from traffic.compute_profiles import Profile, load_profile

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_script(name: str, folder: str = "stanza_profiles"):
    """experiments/<folder>/<name>.py as a module (the experiments folder is no package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def assert_shipped(path: Path, want: Profile, rel: float = 1e-12) -> None:
    """The profile file at ``path`` is ``want``: its citation, method, layers, FLOPs, and its
    times within ``rel``."""
    shipped = load_profile(str(path), want.model, want.batch_size)
    assert (shipped.device, shipped.batch_size, shipped.source, shipped.method, shipped.derived) == (
        want.device,
        want.batch_size,
        want.source,
        want.method,
        True,
    )
    assert [l.name for l in shipped.layers] == [l.name for l in want.layers]
    for a, w in zip(shipped.layers, want.layers):
        assert a.forward_s == pytest.approx(w.forward_s, rel=rel)
        assert a.backward_s == pytest.approx(w.backward_s, rel=rel)
        assert (a.flops_forward, a.flops_backward) == (w.flops_forward, w.flops_backward)
