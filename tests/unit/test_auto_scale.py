"""``scale: auto`` (the default): resolved at planning from this machine's cost model
(testbed.capacity.auto_scale), recorded as a number, checked again at that number. No root,
no network: points are planned on the topology graph."""

from __future__ import annotations

import math

import pytest
import yaml

from common.errors import SpecError
from testbed.capacity import CostModel, Machine, auto_scale, estimate
from testbed.loopback import run_local
from testbed.runner import check_capacity, plan_experiment, plan_point
from testbed.spec import AUTO, dump_spec, from_dict

GIB = 2**30
MACHINE = Machine(cores=2, total_bytes=24 * GIB, available_bytes=23 * GIB)
BUSY = {"kind": "rack_core", "racks": 2, "hosts_per_rack": 4, "host_bw_mbps": 1000}  # more than 2 cores carry


def spec(topology: dict, **extra) -> dict:
    return {
        "topology": topology,
        "workload": {"scheme": "allreduce", "model": "digits_mlp", "compute": {"mode": "emulated", "profile": "zero"}},
        **extra,
    }


def test_the_default_scale_is_auto_and_a_number_stays_a_number():
    assert from_dict({}).scale == AUTO
    assert from_dict({"scale": 3, "workload": {"compute": {"mode": "emulated"}}}).scale == 3.0


@pytest.mark.parametrize("bad", ["fast", 0, -2, [2]])
def test_a_bad_scale_names_both_forms_allowed(bad):
    with pytest.raises(SpecError) as err:
        from_dict({"scale": bad, "workload": {"compute": {"mode": "emulated"}}})
    (e,) = err.value.errors
    assert e.field == "scale" and "'auto'" in e.allowed and "number" in e.allowed


def test_auto_is_the_smallest_whole_dilation_that_keeps_35_percent_idle():
    model = CostModel.load()
    exp = from_dict(spec(BUSY))
    hosts, procs = plan_point(exp)
    est = estimate(exp, hosts, procs, model=model, machine=MACHINE)
    assert est.min_scale > 1  # 8 hosts at 1 Gbit/s: more than this machine carries undilated
    s = auto_scale(exp, hosts, procs, model=model, machine=MACHINE)
    assert s == math.ceil(est.min_scale) and est.scale == s
    assert est.cpu_at(s) <= 0.65 * MACHINE.cores and (s == 1 or est.cpu_at(s - 1) > 0.65 * MACHINE.cores)
    small = from_dict(spec({"kind": "rack", "hosts_per_rack": 2, "host_bw_mbps": 10}))
    assert auto_scale(small, *plan_point(small), model=model, machine=MACHINE) == 1.0  # never below 1


def test_real_compute_resolves_to_1_even_when_the_cpu_rule_is_broken():
    exp = from_dict({"topology": BUSY, "workload": {"model": "digits_mlp"}})
    assert auto_scale(exp, *plan_point(exp), model=CostModel.load(), machine=MACHINE) == 1.0


def test_planning_records_the_resolved_number_and_says_it_was_auto(tmp_path):
    exp = from_dict(spec(BUSY, sweep={"topology.host_bw_mbps": [10, 1000]}))
    planned = plan_experiment(exp)
    assert [p.scale_auto for p in planned] == [True, True]
    low, high = (p.exp.scale for p in planned)
    assert low == 1.0 and high > 1 and float(high).is_integer()
    assert yaml.safe_load(dump_spec(planned[1].exp))["scale"] == high  # spec.yaml holds the number
    lines = check_capacity(planned)
    assert any(l.startswith(f"scale auto: 1 (1 of 2 points), {high:g} (1 of 2 points)") for l in lines)
    assert not any(l.startswith("warning:") and "CPU estimate" in l for l in lines)  # auto keeps the rule
    fixed = plan_experiment(from_dict(spec(BUSY, scale=1)))
    assert fixed[0].exp.scale == 1.0 and not fixed[0].scale_auto
    assert any("CPU estimate" in l for l in check_capacity(fixed))  # a number is kept, and warned about


def test_auto_gives_background_flows_whole_dilated_seconds():
    flow = {"src": "h1", "dst": "h5", "rate_mbps": 10, "duration_s": 1.5}
    exp = from_dict(spec(BUSY, background=[flow]))
    (pr,) = plan_experiment(exp)
    dilated = 1.5 * pr.exp.scale
    assert dilated == round(dilated) and pr.exp.scale % 2 == 0
    assert pr.exp.scale >= estimate(exp, pr.hosts, pr.processes).min_scale


def test_a_number_that_breaks_whole_seconds_is_still_refused():
    flow = {"src": "h1", "dst": "h5", "rate_mbps": 10, "duration_s": 1.5}
    with pytest.raises(SpecError, match="whole number"):
        from_dict(spec(BUSY, background=[flow], scale=3))


def test_the_local_runner_runs_auto_at_1(tmp_path):
    exp = from_dict(
        {
            "workload": {
                "scheme": "allreduce",
                "model": "digits_mlp",
                "iterations": 2,
                "workers": 2,
                "warmup_iterations": 0,
                "compute": {"mode": "emulated", "profile": "zero"},
            },
            "topology": {"kind": "rack", "hosts_per_rack": 2},
        }
    )
    run_dir = run_local(exp, tmp_path / "run")
    assert yaml.safe_load((run_dir / "spec.yaml").read_text())["scale"] == 1.0


def test_a_programs_processes_are_counted_as_execd():
    prog = {"command": ["python", "-c", "pass"]}
    topo = {"kind": "rack", "hosts_per_rack": 4}
    model = CostModel.load()
    run = from_dict({"topology": topo, "workload": {"program": prog}})
    forked = from_dict({"topology": topo, "workload": {"scheme": "allreduce"}})
    execd = from_dict({"topology": topo, "workload": {"scheme": "allreduce"}, "run": {"launcher": "exec"}})
    e_prog, e_fork, e_exec = (estimate(x, *plan_point(x), model=model, machine=MACHINE) for x in (run, forked, execd))
    assert e_prog.memory_breakdown["processes"] > e_fork.memory_breakdown["processes"]
    assert e_prog.memory_breakdown["shared pages"] == e_exec.memory_breakdown["shared pages"]
