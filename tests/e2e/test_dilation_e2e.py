"""Time dilation on a real network: the reported iteration time does not move with the dilation."""

import json

import pytest

from tests.small_runs import write_profile


@pytest.mark.slow
@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root")
def test_time_dilation_reports_the_same_iteration_time(tmp_path):
    """The same emulated experiment at s=1 and s=4 reports iteration times within 10%."""
    from testbed.runner import run_experiment
    from testbed.spec import from_dict

    prof = write_profile(tmp_path / "p.json", [0.010, 0.020, 0.005], [0.020, 0.040, 0.010])
    exp = from_dict(
        {
            "name": "dilation",
            "topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 4, "host_bw_mbps": 100},
            "workload": {
                "scheme": "allreduce",
                "iterations": 12,
                "warmup_iterations": 2,
                "compute": {"mode": "emulated", "profile": prof},
            },
            "run": {"runs_dir": str(tmp_path / "runs")},
            "sweep": {"scale": [1, 4]},
        }
    )
    results = run_experiment(exp, progress=False)
    assert [r.summary.status for r in results] == ["ok", "ok"]
    t1, t4 = (r.summary.iteration_time_s.mean for r in results)
    assert results[1].summary.scale == 4
    assert t4 == pytest.approx(t1, rel=0.10), (t1, t4)
    # the dilated run's links were shaped at 25 Mbit/s and are reported as 100
    topo = json.loads((results[1].run_dir / "topology.json").read_text())
    assert {l["shaped_mbps"] for l in topo["links"]} == {25.0} and {l["bw_mbps"] for l in topo["links"]} == {100.0}
