"""The link-busy baseline and P3's lower bound (analysis.paper_models.p3), no emulation.

Small cases are worked out by hand here; random ones are held to the bounds the module states
(the period between ``F + max(B, W)`` and ``F + B + W``, the gain at least 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.paper_models import p3 as pm

GBIT = 1e9


def test_link_bytes_is_two_shares_of_the_model():
    assert pm.link_bytes(1000.0, 4) == pytest.approx(1500.0)  # push 3/4 out, answers 3 x 1/4
    assert pm.link_bytes(1000.0, 1) == 0.0  # one host: its own server, nothing on the wire
    with pytest.raises(ValueError, match="N >= 1"):
        pm.link_bytes(1000.0, 0)


def test_one_layer_is_backward_push_pull_forward():
    # 2 workers: each way half the layer; 1e9 bytes/s; 4e8 bytes -> 0.2 s a transfer
    period = pm.fifo_baseline_period([0.1], [0.3], [4e8], 8 * GBIT, 2)
    assert period == pytest.approx(0.3 + 0.2 + 0.2 + 0.1)


def test_a_later_layers_push_delays_the_first_layers_pull():
    # forward order [a, b]; backward: b ready at 0.1, a at 0.2. b's push (0.5 s of wire) runs
    # 0.1-0.6; a's push waits behind it (0.6-0.7), b's pull follows (0.7-1.2) and a's pull last
    # (1.2-1.3): forward a at 1.3-1.4, forward b at 1.4-1.5
    # (1e9 bytes/s at 8 Gbit/s; 2 workers: half of each layer each way)
    period = pm.fifo_baseline_period([0.1, 0.1], [0.1, 0.1], [0.2e9, 1e9], 8 * GBIT, 2)
    assert period == pytest.approx(1.5)


def test_a_fast_link_leaves_the_compute():
    b = pm.bounds([0.1, 0.2], [0.2, 0.4], [1e6, 1e6], 1e15, 4)
    assert b.baseline_s == pytest.approx(0.9, rel=1e-6) and b.p3_s == pytest.approx(0.9)
    assert b.gain == pytest.approx(1.0, rel=1e-6)


def test_p3_vgg19_at_15_gbit_s():
    # P3 Fig. 7(c)'s headline setting: VGG-19, the p4000 profile, batch 32, 4 workers
    b = pm.zoo_bounds("vgg19", "p4000", 32, 15 * GBIT, 4)
    model_bytes = 4 * 143_667_240  # VGG-19's parameters, float32
    assert b.wire_s == pytest.approx(8 * 1.5 * model_bytes / 15e9)
    assert b.p3_s == pytest.approx(b.forward_s + b.backward_s)  # compute-bound: W < F + B
    assert b.forward_s + b.wire_s <= b.baseline_s <= b.forward_s + b.backward_s + b.wire_s
    assert b.max_gain == pytest.approx(1 + b.forward_s / (b.forward_s + b.backward_s))
    assert 1.0 < b.gain < b.max_gain < 1.66  # the paper's ratio is out of the bytes' reach
    assert b.implied_excess_s(1.66) == pytest.approx(1.66 * b.p3_s - b.baseline_s)
    with pytest.raises(ValueError, match="> 0"):
        b.implied_excess_s(0)


def test_bad_lists_are_refused():
    with pytest.raises(ValueError, match="one forward time"):
        pm.fifo_baseline_period([0.1], [0.1, 0.1], [1.0, 1.0], GBIT, 2)
    with pytest.raises(ValueError, match="bw_bps > 0"):
        pm.fifo_baseline_period([0.1], [0.1], [1.0], 0, 2)
    with pytest.raises(ValueError, match="no negative"):
        pm.fifo_baseline_period([0.1], [-0.1], [1.0], GBIT, 2)


layers = st.lists(st.tuples(st.floats(0, 0.1), st.floats(1e-4, 0.2), st.floats(0, 5e8)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(layers, st.floats(1e8, 1e11), st.integers(1, 16))
def test_the_period_lies_within_its_bounds(ls, bw, n):
    f, bk, size = (list(c) for c in zip(*ls))
    b = pm.bounds(f, bk, size, bw, n)
    tol = 1e-9 * (1 + b.forward_s + b.backward_s + b.wire_s)
    assert b.baseline_s >= b.forward_s + max(b.backward_s, b.wire_s) - tol
    assert b.baseline_s <= b.forward_s + b.backward_s + b.wire_s + tol
    assert b.gain >= 1 - 1e-9


def test_the_p3_report_prints_the_bounds_beside_a_bandwidth_sweep():
    from analysis import p3_report
    from traffic.rundir import read_sweep_spec

    sweep = Path(__file__).resolve().parents[2] / "reproduction/runs/p3_vgg19-20261129-050108"
    text = p3_report.table([sweep])
    line = next(ln for ln in text.splitlines() if ln.startswith("bytes and compute alone"))
    b = pm.zoo_bounds("vgg19", "p4000", 32, 15 * GBIT, 4)
    assert f"15 Gbit/s: link-busy baseline {b.baseline_s * 1000:.0f} ms" in line
    assert f"at most {b.gain:.2f}x" in line and f"at most {b.max_gain:.2f}x" in line
    spec = read_sweep_spec(sweep)
    real = {**spec, "workload": {**spec["workload"], "compute": {"mode": "real"}}}
    apart = {**spec, "workload": {**spec["workload"], "servers": {"placement": "dedicated"}}}
    unknown = {**spec, "workload": {**spec["workload"], "model": "no_such_model"}}
    assert all(p3_report.bounds_line(s, [15000]) is None for s in (real, apart, unknown))
