"""Emulated compute and time dilation on loopback; the same iteration time at two dilations on a
real network is tests/e2e/test_dilation_e2e.py.
"""

import pandas as pd
import pytest
import torch

from analysis.load import to_emulated_time
from tests.small_runs import write_profile
from traffic.hostmodel import costs as hostcost
from traffic.models import build_model
from traffic.runtime.emulation import EmulatedCompute, PreciseSleeper


def test_sleeper_pays_back_overshoot(monkeypatch):
    clock = {"t": 0.0}
    asked = []

    def fake_sleep(d):  # every sleep wakes up 1 ms late
        asked.append(d)
        clock["t"] += d + 0.001

    monkeypatch.setattr(hostcost.time, "sleep", fake_sleep)
    monkeypatch.setattr(hostcost.time, "perf_counter", lambda: clock["t"])
    s = PreciseSleeper()
    for _ in range(10):
        s.sleep(0.010)
    assert asked[0] == pytest.approx(0.010)
    assert all(a == pytest.approx(0.009) for a in asked[1:])  # the 1 ms owed is taken off
    assert clock["t"] == pytest.approx(0.100 + 0.001)  # total = requested + one overshoot
    s.sleep(0.0005)  # shorter than the debt: no sleep at all, debt shrinks
    assert len(asked) == 10 and s.debt_s == pytest.approx(0.0005)


def test_emulated_gradients_are_real_tensors_of_the_true_sizes():
    model = build_model("digits_mlp", 0, (64,), 10)
    em = EmulatedCompute(model, [0.0] * 3, [0.0] * 3, seed=1)
    params = list(model.layers[1].parameters())
    em.backward(1, params)
    assert [p.grad.shape for p in params] == [torch.Size([512, 512]), torch.Size([512])]
    assert all(p.grad.abs().sum() > 0 for p in params)
    other = EmulatedCompute(model, [0.0] * 3, [0.0] * 3, seed=2)
    assert not torch.equal(other.grads[id(params[0])], em.grads[id(params[0])])  # distinct per worker
    with pytest.raises(ValueError, match="profile has 2 layers"):
        EmulatedCompute(model, [0.0] * 2, [0.0] * 2, seed=1)


def test_dilated_clocks_are_converted_back():
    ev = pd.DataFrame({"ts": [100.0, 104.0], "dur": [4.0, 8.0], "requested_s": [4.0, 4.0]})
    tr = pd.DataFrame({"time": [100.0, 100.04], "iface": ["a", "a"]})
    empty = pd.DataFrame()
    tr2, q2, c2, ev2 = to_emulated_time(4.0, tr, empty, empty, ev)
    assert list(ev2["ts"]) == [100.0, 101.0] and list(ev2["dur"]) == [1.0, 2.0]
    assert list(ev2["requested_s"]) == [1.0, 1.0]
    assert list(tr2["time"]) == pytest.approx([100.0, 100.01])
    assert q2.empty and c2.empty


@pytest.mark.parametrize("scheme", ["ps", "allreduce"])
def test_emulated_compute_end_to_end_on_loopback(tmp_path, scheme):
    import analysis
    from testbed.loopback import run_local
    from testbed.spec import from_dict

    prof = write_profile(tmp_path / "p.json", [0.004, 0.006, 0.002], [0.008, 0.012, 0.004])
    exp = from_dict(
        {
            "topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 3},
            "workload": {
                "scheme": scheme,
                "iterations": 6,
                "warmup_iterations": 1,
                "compute": {"mode": "emulated", "profile": prof},
            },
        }
    )
    run_dir = run_local(exp, tmp_path / "run")
    ev = analysis.read_events(run_dir) if hasattr(analysis, "read_events") else analysis.load(run_dir).events
    fwd = ev[(ev.kind == "forward") & (ev.role == "worker")]
    bwd = ev[(ev.kind == "backward") & (ev.role == "worker")]
    assert len(fwd) == len(bwd) == 3 * 6 * 3  # workers x iterations x layers
    assert set(fwd["requested_s"].round(6)) == {0.004, 0.006, 0.002}
    # slept, not skipped: each layer's overshoot is paid back by the next one, so totals match
    # to within the carried debt (<= 5 ms per worker), never far below
    want = fwd["requested_s"].sum() + bwd["requested_s"].sum()
    assert fwd["dur"].sum() + bwd["dur"].sum() >= want - 3 * 0.005
    assert (ev[ev.kind == "eval"]).empty  # no data, nothing evaluated
    comm = ev[ev.kind.isin(["push", "pull", "allreduce"])]
    assert comm["bytes"].sum() > 0
