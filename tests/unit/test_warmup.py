"""Warm-up until steady (``workload.max_warmup_iterations``): the spec's checks, the window the
analysis chooses, and every figure that reads the measured iterations reading that window."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from analysis.load import Run, in_span, measured_span
from analysis.metrics import compute_summary, global_iterations, measured_iterations, settled_warmup
from analysis.scoreboard import steadiness
from testbed.spec import from_dict
from traffic.summary import RunSummary

BATCH = 32


def _iterations(times: list[float], workers: int = 2) -> pd.DataFrame:
    """An iteration table of ``workers`` workers whose iteration ``i`` takes ``times[i]`` s, back to back."""
    rows, t = [], 100.0
    for i, d in enumerate(times):
        rows += [
            {"iteration": i, "worker": w, "start": t, "end": t + d, "duration_s": d, "samples": BATCH}
            for w in range(workers)
        ]
        t += d
    return pd.DataFrame(rows)


#: a run that settles from 2.0 to 1.0 s an iteration at its 6th iteration, and slows at its 12th
SETTLING = [3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.5]


def test_the_warm_up_is_the_fewest_iterations_after_which_the_window_had_settled():
    glob = global_iterations(_iterations(SETTLING))
    # windows of 6 iterations: after 2 and 3 warm-up ones the median moved -50 %, beyond the
    # noise; after 4 (2.0 then five of 1.0) it did not move
    assert settled_warmup(glob, 2, 6, 6) == 4
    assert list(measured_iterations(glob, 4, 6)["iteration"]) == [4, 5, 6, 7, 8, 9]  # 10 and 11 left out
    assert settled_warmup(glob, 5, 6, 6) == 5  # never fewer than the least
    assert settled_warmup(glob, 2, 3, 6) == 3  # no window settled: the most
    assert list(measured_iterations(glob, 2)["iteration"]) == list(range(2, 12))  # no count: all the rest


def test_the_summary_measures_the_settled_window_and_says_which(tmp_path):
    spec = {
        "workload": {
            "scheme": "ps",
            "batch_size": BATCH,
            "iterations": 12,
            "warmup_iterations": 2,
            "max_warmup_iterations": 6,
        }
    }
    run = Run(
        path=tmp_path,
        spec=spec,
        iterations=_iterations(SETTLING),
        processes={"processes": [{"role": "worker"}, {"role": "worker"}]},
    )
    s = compute_summary(run)
    assert (s.warmup_iterations, s.max_warmup_iterations, s.measured_iterations) == (4, 6, 6)
    assert s.throughput.mean == pytest.approx((2 * BATCH / 2.0 + 5 * 2 * BATCH / 1.0) / 6)
    assert measured_span(spec, s) == (4, 10)
    # a fixed warm-up measures every iteration after it
    fixed = {"workload": {**spec["workload"], "max_warmup_iterations": None}}
    s = compute_summary(Run(path=tmp_path, spec=fixed, iterations=_iterations(SETTLING), processes=run.processes))
    assert (s.warmup_iterations, s.max_warmup_iterations, s.measured_iterations) == (2, None, 10)
    assert measured_span(fixed, s) == (2, None) and measured_span(fixed) == (2, None)
    assert measured_span(spec) == (6, 12)  # no summary yet: the most warm-up
    assert list(in_span(pd.Series(range(12)), (4, 10))) == [False] * 4 + [True] * 6 + [False] * 2


def test_the_scoreboard_tests_the_steadiness_of_the_window_the_summary_chose(tmp_path):
    spec = {
        "workload": {
            "scheme": "ps",
            "batch_size": BATCH,
            "iterations": 12,
            "warmup_iterations": 2,
            "max_warmup_iterations": 6,
        }
    }
    it = _iterations(SETTLING)
    run = Run(path=tmp_path, spec=spec, iterations=it, processes={"processes": [{"role": "worker"}] * 2})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "summary.json").write_text(compute_summary(run).model_dump_json())
    it.to_csv(tmp_path / "iterations.csv", index=False)
    assert RunSummary.load(tmp_path / "summary.json").warmup_iterations == 4
    assert steadiness(tmp_path)[0] == 0.0
    # the same iterations with the fixed warm-up of 2 had not settled
    spec["workload"]["max_warmup_iterations"] = None
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    s = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps({**s, "warmup_iterations": 2, "max_warmup_iterations": None}))
    moved, _ = steadiness(tmp_path)
    assert moved == pytest.approx(-0.5)


def _spec(**workload) -> dict:
    return {
        "name": "warm",
        "topology": {"kind": "rack", "hosts_per_rack": 2},
        "workload": {"scheme": "allreduce", "iterations": 12, "warmup_iterations": 2, **workload},
    }


@pytest.mark.parametrize("most", [1, 9, 20])
def test_a_max_warm_up_outside_its_range_is_refused_naming_the_field(most):
    from common.errors import SpecError

    with pytest.raises(SpecError) as e:
        from_dict(_spec(max_warmup_iterations=most))
    assert "workload.max_warmup_iterations" in str(e.value) and "from workload.warmup_iterations (2)" in str(e.value)


def test_a_warm_up_until_steady_is_refused_with_scheduled_events():
    from common.errors import SpecError

    assert from_dict(_spec(max_warmup_iterations=8)).workload.max_warmup_iterations == 8
    assert from_dict({**_spec(), "events": [{"at_iteration": 9, "kill": "worker1"}]}).events
    with pytest.raises(SpecError) as e:
        from_dict({**_spec(max_warmup_iterations=8), "events": [{"at_iteration": 9, "kill": "worker1"}]})
    assert "events" in str(e.value) and "max_warmup_iterations" in str(e.value)
