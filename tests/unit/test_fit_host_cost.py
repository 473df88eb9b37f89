"""benchmarks/fit_host_cost.py: the least-squares fit of ``path_cpu_s_per_byte_per_host``
and the cost model it evaluates the estimate with (nothing is run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testbed.capacity import CostModel, estimate
from testbed.runner import plan_point
from testbed.spec import from_dict

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fit_host_cost  # noqa: E402


def test_fit_through_origin_recovers_the_slope():
    points = [(d, 7e-12 * d) for d in (2e12, 8e12, 1.6e13)]
    assert fit_host_cost.fit_through_origin(points) == pytest.approx(7e-12)
    # residuals of both signs around the slope: the least-squares value, sum(d r) / sum(d^2)
    assert fit_host_cost.fit_through_origin([(1.0, 1.0), (2.0, 3.0)]) == pytest.approx((1 + 6) / 5)
    with pytest.raises(ValueError, match="nothing to fit"):
        fit_host_cost.fit_through_origin([(0.0, 1.0)])


def test_probe_model_adds_bytes_times_sending_hosts():
    exp = from_dict(
        {
            "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 4, "host_bw_mbps": 1000},
            "workload": {"scheme": "allreduce", "model": "resnet50", "compute": {"mode": "emulated"}},
            "scale": 4,
        }
    )
    hosts, procs = plan_point(exp)
    model = CostModel.load()
    e0 = estimate(exp, hosts, procs, model=fit_host_cost.with_key(model, 0.0))
    e1 = estimate(exp, hosts, procs, model=fit_host_cost.with_key(model, fit_host_cost.PROBE))
    # 8 hosts sending 1 Gbit/s each at scale 1: 1e9 B/s, times 8 hosts
    d = (e1.network_cores_at_scale_1 - e0.network_cores_at_scale_1) / fit_host_cost.PROBE
    assert d == pytest.approx(8 * 1.25e8 * 8, rel=1e-6)


def test_no_runs_prints_and_fails(tmp_path, capsys):
    assert fit_host_cost.main([str(tmp_path)]) == 1
    assert "no finished emulated-compute run" in capsys.readouterr().out
