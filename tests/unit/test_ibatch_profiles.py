"""iBatch's derived BigDL compute profile ships as its derivation script writes it.

experiments/ibatch_profiles/derive_fig5.py scales the GTX 1080 Ti GoogLeNet profile to the compute
time at which the default PS's communication, measured on the emulated blades, gives the paper's
26x on 30 nodes (iBatch, Fig. 5).
"""

from __future__ import annotations

import csv

import pytest

from tests.profile_scripts import EXPERIMENTS, assert_shipped, load_script
from traffic.compute_profiles import load_profile


def _script():
    return load_script("derive_fig5", folder="ibatch_profiles")


def test_the_shipped_profile_is_what_the_script_derives():
    d = _script()
    want, _ = d.derive()
    assert_shipped(EXPERIMENTS / "ibatch_profiles" / "googlenet-bigdlfig5-b32.json", want)


def test_the_derived_compute_gives_the_default_ps_the_papers_26x_on_30_nodes():
    d = _script()
    derived, text = d.derive()
    base = load_profile("gtx1080ti", "googlenet", 32)
    with open(d.REFERENCE / "sweep.csv", newline="") as f:
        rows = {r["variant"]: float(r["samples_per_s"]) for r in csv.DictReader(f)}
    t1, t30 = 32 / rows["1node"], 32 * 30 / rows["default"]  # seconds an iteration
    a, b = t1 - base.total_s(), t30 - base.total_s()
    t_c = derived.total_s()
    assert 30 * (t_c + a) / (t_c + b) == pytest.approx(26.0, rel=1e-9)
    factor = t_c / base.total_s()
    assert factor > 10  # a CPU node: far slower than the GPU the reference ran on
    for got, ref in zip(derived.layers, base.layers):  # every layer scaled alike
        assert (got.forward_s, got.backward_s) == pytest.approx((ref.forward_s * factor, ref.backward_s * factor))
    assert f"{t_c:.4f} s per batch of 32" in text and "26x" in derived.method


def test_a_reference_without_the_default_row_is_refused_by_name(tmp_path):
    d = _script()
    (tmp_path / "sweep.csv").write_text("variant,status,samples_per_s\n1node,ok,299.4\n")
    with pytest.raises(SystemExit, match="variant 'default'"):
        d.derive(tmp_path)
