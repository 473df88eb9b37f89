"""Per-layer compute profiles: FLOPs split of published times, lookup, measurement, CLI."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from torch import nn

import traffic.compute_profiles.profile as profiles  # where DATA_DIR is read
from common.errors import TestbedError
from testbed.cli import main as cli_main
from traffic.compute_profiles import (
    Profile,
    available_profiles,
    flops_per_layer,
    layer_flops,
    load_profile,
    measure_profile,
    split_published,
)
from traffic.compute_profiles.generate import PUBLISHED
from traffic.compute_profiles.measure import time_layers
from traffic.models import LayeredModel, available_models


def _tiny_cnn() -> LayeredModel:
    net = LayeredModel(
        [
            nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
            nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten()),
            nn.Linear(16 * 4 * 4, 10),
        ],
        name="tiny_cnn",
    )
    net.input_shape, net.num_classes = (3, 8, 8), 10
    return net


@functools.cache
def _flops(model: str, batch: int) -> list[tuple[int, int]]:
    return flops_per_layer(model, batch)


def test_layer_flops_counts_backward_on_meta():
    with torch.device("meta"):
        net = _tiny_cnn()
    b = 4
    flops = layer_flops(net, torch.empty(b, 3, 8, 8, device="meta"))
    conv1 = 2 * b * 8 * 8 * 8 * 3 * 9
    conv2 = 2 * b * 16 * 4 * 4 * 8 * 9
    fc = 2 * b * 256 * 10
    assert [f for f, _ in flops] == [conv1, conv2, fc]
    # layer 0: weight gradient only (its input needs no gradient); later layers: input + weight
    assert [bw for _, bw in flops] == [conv1, 2 * conv2, 2 * fc]


def test_split_sums_to_total_and_is_proportional_to_flops(tmp_path):
    prof = split_published("digits_mlp", "testgpu", 32, 0.05, "a test", out_dir=tmp_path)
    assert math.isclose(prof.total_s(), 0.05, rel_tol=1e-12)
    flops = flops_per_layer("digits_mlp", 32)
    assert [(l.flops_forward, l.flops_backward) for l in prof.layers] == flops
    per_flop = 0.05 / sum(f + b for f, b in flops)
    for l, (f, b) in zip(prof.layers, flops):
        assert math.isclose(l.forward_s, f * per_flop, rel_tol=1e-12)
        assert math.isclose(l.backward_s, b * per_flop, rel_tol=1e-12)
    on_disk = json.loads((tmp_path / "digits_mlp-testgpu-b32.json").read_text())
    assert on_disk["method"] == "flops-split of published per-batch time" and on_disk["derived"] is False
    assert Profile.from_dict(on_disk) == prof


@pytest.mark.parametrize("pub", PUBLISHED, ids=lambda p: f"{p.model}-{p.device}-b{p.batch_size}")
def test_shipped_published_profiles_sum_to_the_published_time(pub):
    if pub.model not in available_models():
        pytest.skip(f"{pub.model} is not a registered model")
    prof = load_profile(pub.device, pub.model, pub.batch_size)
    assert math.isclose(prof.total_s(), pub.total_s, rel_tol=1e-9)
    assert prof.method == "flops-split of published per-batch time" and not prof.derived
    assert prof.source == pub.source


@pytest.mark.parametrize("key", available_profiles(), ids=lambda k: f"{k[0]}-{k[1]}-b{k[2]}")
def test_shipped_profiles_match_the_model_and_its_flops(key):
    model, device, batch = key
    if model not in available_models():
        pytest.skip(f"{model} is not a registered model")
    prof = load_profile(device, model, batch)  # also checks the layer count
    assert prof.derived == prof.method.startswith("derived: ")
    # the FLOPs recorded are the model's FLOPs today, and the times are proportional to them
    assert [(l.flops_forward, l.flops_backward) for l in prof.layers] == _flops(model, batch)
    per_flop = prof.total_s() / sum(l.flops_forward + l.flops_backward for l in prof.layers)
    for l in prof.layers:
        assert math.isclose(l.forward_s, l.flops_forward * per_flop, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(l.backward_s, l.flops_backward * per_flop, rel_tol=1e-9, abs_tol=1e-15)


def test_zero_profile():
    prof = load_profile("zero", "digits_mlp", 16)
    assert len(prof.layers) == 3 and prof.total_s() == 0.0
    assert prof.forward_s() == prof.backward_s() == [0.0, 0.0, 0.0]
    assert prof.method == "zero" and prof.batch_size == 16
    assert len(load_profile("zero", "any_model", 16, n_layers=7).layers) == 7


def test_lookup_errors_name_what_is_available(tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "DATA_DIR", tmp_path)
    split_published("digits_mlp", "gtx1080ti", 32, 0.01, "a test", out_dir=tmp_path)
    assert available_profiles() == [("digits_mlp", "gtx1080ti", 32)]
    assert load_profile("GTX1080TI", "digits_mlp", 32).device == "gtx1080ti"
    for ref, batch in [("v100", 32), ("gtx1080ti", 64)]:
        with pytest.raises(TestbedError, match=r"available for 'digits_mlp': gtx1080ti b32.*'zero'"):
            load_profile(ref, "digits_mlp", batch)
    with pytest.raises(TestbedError, match="has 3 layers but model 'digits_mlp' has 5"):
        load_profile("gtx1080ti", "digits_mlp", 32, n_layers=5)
    with pytest.raises(TestbedError, match="not found.*available for 'digits_mlp'"):
        load_profile(str(tmp_path / "missing.json"), "digits_mlp", 32)
    with pytest.raises(TestbedError, match="is for 'digits_mlp' at batch 32, not 'other' at batch 32"):
        load_profile(str(tmp_path / "digits_mlp-gtx1080ti-b32.json"), "other", 32)
    with pytest.raises(TestbedError, match="unknown model 'nope'"):
        load_profile("zero", "nope", 32)


def test_time_layers_local_cnn():
    net = _tiny_cnn()
    fwd, bwd = time_layers(net, net.example_input(4), iterations=3, warmup=1)
    assert len(fwd) == len(bwd) == 3 and all(t > 0 for t in fwd + bwd)


def test_measured_profile_of_digits_mlp():
    prof = measure_profile("digits_mlp", 8, iterations=3, warmup=1)
    assert prof.method == "measured" and not prof.derived and prof.device == "cpu"
    assert prof.source.startswith("measured on ") and " by testbed profile at " in prof.source
    assert len(prof.layers) == 3 and all(t > 0 for t in prof.forward_s() + prof.backward_s())
    assert prof.layers[0].flops_forward == 2 * 8 * 64 * 512


def test_cli_profile_writes_and_refuses_to_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["profile", "digits_mlp", "--batch", "8", "--iterations", "2", "--warmup", "1"]
    assert cli_main(args) == 0
    out = tmp_path / "digits_mlp-cpu-b8.json"
    printed = capsys.readouterr().out
    assert "fc2" in printed and f"wrote {out}" in printed
    before = out.read_text()
    prof = load_profile(str(out), "digits_mlp", 8)
    assert prof.method == "measured" and len(prof.layers) == 3
    assert cli_main(args) == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == before
    other = tmp_path / "sub.json"
    assert cli_main(args + ["--out", str(other)]) == 0 and other.is_file()
    assert cli_main(["profile", "nope", "--batch", "8"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
