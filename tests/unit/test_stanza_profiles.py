"""Stanza's derived V100 profiles ship as their derivation scripts write them.

experiments/stanza_profiles/derive_batch.py scales the batch-32 V100 profiles to Stanza Table 5's
batches; derive_table1.py scales those to the compute Table 1 leaves. Every shipped file must be
what its script derives today, so that a changed zoo, FLOP count or citation shows here.
"""

from __future__ import annotations

import pytest

from tests.profile_scripts import EXPERIMENTS, assert_shipped, load_script
from traffic.compute_profiles import load_profile


@pytest.mark.parametrize("model", ["alexnet", "vgg16", "vgg19"])
def test_batch_profiles_are_the_batch32_v100_profile_times_the_table5_batch(model):
    d = load_script("derive_batch")
    want = d.derive(model)
    base = load_profile("v100", model, 32)
    factor = d.BATCH[model] // 32
    assert want.total_s() == pytest.approx(base.total_s() * factor, rel=1e-12)
    assert f"x {factor} (batch {d.BATCH[model]}, Stanza Table 5)" in want.method
    assert_shipped(EXPERIMENTS / "stanza_profiles" / f"{model}-v100-b{d.BATCH[model]}.json", want)


@pytest.mark.parametrize("model, residual_s", [("alexnet", 0.43), ("vgg16", 1.40), ("vgg19", 1.49)])
def test_table1_profiles_total_the_measured_minus_estimated_communication(model, residual_s):
    d = load_script("derive_table1")
    want = d.derive(model)
    assert want.total_s() == pytest.approx(residual_s, abs=1e-9)
    assert_shipped(EXPERIMENTS / "stanza_profiles" / f"{model}-v100table1-b{want.batch_size}.json", want)


def test_save_new_writes_once_and_keeps_what_is_there(tmp_path):
    p = load_script("derive_batch").derive("alexnet")
    target = tmp_path / "alexnet-v100-b128.json"
    assert p.save_new(target) == target
    before = target.read_text()
    assert p.scaled(2.0, "v100", "derived: x 2").save_new(target) is None
    assert target.read_text() == before
    assert load_profile(str(target), "alexnet", 128).total_s() == pytest.approx(p.total_s(), rel=1e-12)
