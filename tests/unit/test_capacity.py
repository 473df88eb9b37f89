"""The capacity check (testbed.capacity): memory and CPU estimates from a measured cost model,
the refusal of what cannot fit, the fidelity warning and the smallest dilation that keeps 35 %
of the cores idle. No root, no network: points are planned on the topology graph."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from common.errors import CapacityError, TestbedError
from testbed import capacity, machine_costs
from testbed.capacity import (
    COST_KEYS,
    OPTIONAL_KEYS,
    SCHEME_MESSAGE_UNIT,
    Cost,
    CostModel,
    Machine,
    check,
    describe,
    estimate,
    scheme_message_key,
)
from testbed.runner import plan_point
from testbed.spec import from_dict
from topologies.spec import MAX_HOSTS
from traffic.models import model_info

MIB = 2**20
GIB = 2**30

#: a cost model with round values, so that estimates can be computed by hand
VALUES = {
    "process_uss_bytes": 200 * MIB,
    "process_pss_bytes": 250 * MIB,
    "process_shared_bytes": 300 * MIB,
    "zygote_bytes": 400 * MIB,
    "worker_base_uss_bytes": 40 * MIB,
    "worker_exec_base_uss_bytes": 210 * MIB,
    "worker_bytes_per_param_byte": 3.0,
    "ps_worker_base_uss_bytes": 30 * MIB,
    "ps_worker_exec_base_uss_bytes": 160 * MIB,
    "ps_worker_bytes_per_param_byte": 2.0,
    "allreduce_worker_base_uss_bytes": 40 * MIB,
    "allreduce_worker_exec_base_uss_bytes": 210 * MIB,
    "allreduce_worker_bytes_per_param_byte": 3.0,
    "server_base_uss_bytes": 130 * MIB,
    "server_exec_base_uss_bytes": 220 * MIB,
    "server_bytes_per_param_byte": 4.0,
    "real_compute_worker_bytes": 20 * MIB,
    "harness_uss_bytes": 150 * MIB,
    "bwm_ng_uss_bytes": 1 * MIB,
    "network_host_bytes": 2 * MIB,
    "network_link_bytes": 0.5 * MIB,
    "process_idle_cores": 0.01,
    "runtime_user_cpu_s_per_byte": 1e-9,
    "runtime_message_cpu_s": 1e-4,
    "path_cpu_s_per_byte": 5e-9,
    "extra_bridge_cpu_s_per_byte": 2e-9,
    "bwm_ng_cpu_s_per_sample": 1e-5,
    "bwm_ng_cpu_s_per_sample_port": 1e-6,
    "qdisc_cpu_s_per_sample": 2e-4,
    "qdisc_cpu_s_per_sample_port": 5e-5,
    "cpu_sampler_cpu_s_per_sample": 2e-3,
}
MACHINE = Machine(cores=2, total_bytes=24 * GIB, available_bytes=23 * GIB)


def synthetic(**changes) -> CostModel:
    """The :data:`VALUES` model with ``changes`` (keys outside COST_KEYS: a scheme's own
    ``<scheme>_message_cpu_s``)."""
    vals = {**VALUES, **changes}
    unit = {**{k: u for k, (u, _) in COST_KEYS.items()}, **{k: u for k, (u, _) in OPTIONAL_KEYS.items()}}
    return CostModel(
        {k: Cost(float(v), unit.get(k, SCHEME_MESSAGE_UNIT), "test") for k, v in vals.items()},
        {"cores": 2, "memory_total_bytes": 24 * GIB, "kernel": "test"},
    )


def point(topology: dict, run: dict | None = None, **workload):
    exp = from_dict({"topology": topology, "workload": {"scheme": "ps", **workload}, "run": run or {}})
    hosts, procs = plan_point(exp)
    return exp, hosts, procs


def test_memory_estimate_is_the_sum_of_its_parts():
    exp, hosts, procs = point({"kind": "rack", "hosts_per_rack": 4}, model="digits_mlp")
    assert [p.role for p in procs].count("worker") == 4 and [p.role for p in procs].count("server") == 1
    p = model_info("digits_mlp")["param_bytes"]
    est = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    v = VALUES
    procs_bytes = (
        4 * (v["ps_worker_base_uss_bytes"] + 2.0 * p)
        + v["server_base_uss_bytes"]
        + 4.0 * p
        + 4 * v["real_compute_worker_bytes"]
    )  # compute real (the default)
    assert est.memory_breakdown == {
        "processes": round(procs_bytes),
        "shared pages": 400 * MIB,  # the zygote
        "network": 4 * 2 * MIB,
        "harness": 151 * MIB,
    }
    assert est.memory_bytes == sum(est.memory_breakdown.values())
    assert (est.cores, est.available_bytes, est.total_bytes, est.param_bytes) == (2, 23 * GIB, 24 * GIB, p)


def test_a_scheme_without_its_own_figures_takes_the_larger_ones():
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 4},
            "workload": {"scheme": "pipe_sgd", "model": "digits_mlp", "compute": {"mode": "emulated"}},
        }
    )
    hosts, procs = plan_point(exp)
    assert [p.role for p in procs] == ["worker"] * 4
    est = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    p = model_info("digits_mlp")["param_bytes"]
    assert est.memory_breakdown["processes"] == round(4 * (VALUES["worker_base_uss_bytes"] + 3.0 * p))


def test_exec_launcher_counts_each_process_imports_and_the_libraries_once():
    exp, hosts, procs = point(
        {"kind": "rack", "hosts_per_rack": 2}, run={"launcher": "exec"}, model="alexnet", compute={"mode": "emulated"}
    )
    est = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    p = model_info("alexnet")["param_bytes"]
    assert est.memory_breakdown["processes"] == round(2 * (160 * MIB + 2.0 * p) + 220 * MIB + 4.0 * p)
    assert est.memory_breakdown["shared pages"] == 300 * MIB  # no zygote: the libraries, once


def test_a_process_on_a_second_interface_is_execd_beside_the_zygote():
    # a PBox of 2 interfaces runs 2 servers, the one on interface 1 started with exec
    exp, hosts, procs = point(
        {"kind": "rack", "hosts_per_rack": 2},
        model="alexnet",
        compute={"mode": "emulated"},
        servers={"placement": "dedicated", "interfaces": 2},
    )
    assert [(p.role, p.iface) for p in procs if p.role == "server"] == [("server", 0), ("server", 1)]
    est = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    p = model_info("alexnet")["param_bytes"]
    assert est.memory_breakdown["processes"] == round(2 * (30 * MIB + 2.0 * p) + 130 * MIB + 220 * MIB + 4.0 * p)
    assert est.memory_breakdown["shared pages"] == 400 * MIB
    assert est.memory_breakdown["network"] == round(3 * 2 * MIB + 0.5 * MIB)  # ps1's second link


def test_servers_share_the_model_and_extra_links_cost_memory():
    one, h1, p1 = point({"kind": "rack", "hosts_per_rack": 4}, model="alexnet", compute={"mode": "emulated"})
    two, h2, p2 = point(
        {"kind": "rack", "hosts_per_rack": 4, "interfaces_per_host": 2},
        model="alexnet",
        compute={"mode": "emulated"},
        servers={"count": 2},
    )
    m = synthetic()
    e1, e2 = estimate(one, h1, p1, model=m, machine=MACHINE), estimate(two, h2, p2, model=m, machine=MACHINE)
    p = model_info("alexnet")["param_bytes"]
    # one more server process; the servers' parameter bytes are the same model split in two
    assert e2.memory_breakdown["processes"] - e1.memory_breakdown["processes"] == round(VALUES["server_base_uss_bytes"])
    assert e2.memory_breakdown["network"] - e1.memory_breakdown["network"] == 4 * VALUES["network_link_bytes"]
    assert e1.param_bytes == p


def test_cpu_estimate_matches_the_model_by_hand():
    exp, hosts, procs = point(
        {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 100, "oversubscription": 2},
        model="digits_mlp",
    )
    est = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    v = VALUES
    sent = 4 * 100e6 / 8  # 4 hosts carry processes (the server is colocated)
    crossing = min(sent, 2 * 100e6 / 8)  # two uplinks of 2 x 100 / 2 Mbit/s
    network = sent * 5e-9 + 2 * crossing * 2e-9 + sent * 1e-9
    # ps, one server: a message per key of digits_mlp (64x512, 512, 512x512, 512, 512x10, 10)
    keys = [64 * 512, 512, 512 * 512, 512, 512 * 10, 10]
    assert est.message_bytes == pytest.approx(4 * sum(keys) / 6)
    messages = sent / (4 * sum(keys) / 6) * 1e-4
    ports = 4 + 2 * 2
    capture = (1e-5 + 1e-6 * ports) * 100 + (2e-4 + 5e-5 * ports) * 20 + 2e-3 * 10
    assert est.cpu_breakdown == pytest.approx(
        {"processes": 5 * v["process_idle_cores"], "capture": capture, "network": network, "messages": messages}
    )
    assert est.cpu_cores == pytest.approx(5 * 0.01 + capture + network + messages)
    assert est.min_scale == pytest.approx((network + messages) / (0.65 * 2 - 5 * 0.01 - capture))


def test_message_term_is_the_sending_rate_over_the_scheme_message_bytes(monkeypatch):
    exp = from_dict(
        {
            "scale": 1,
            "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 800},
            "workload": {
                "scheme": "ps",
                "model": "digits_mlp",
                "compute": {"mode": "emulated"},
                "servers": {"placement": "dedicated"},
            },
        }
    )
    hosts, procs = plan_point(exp)
    seen = []

    def scheme_sending(nbytes):
        class Fixed:
            @classmethod
            def message_bytes(cls, workload, processes):
                seen.append((workload.scheme, [p.role for p in processes]))
                return nbytes

        return Fixed

    m = synthetic(runtime_message_cpu_s=3e-5)
    est = {}
    for nbytes in (1e3, 1e6, math.inf):
        monkeypatch.setattr(capacity, "get_scheme", lambda name, n=nbytes: scheme_sending(n))
        est[nbytes] = estimate(exp, hosts, procs, model=m, machine=MACHINE)
    assert seen[0] == ("ps", ["worker"] * 4 + ["server"])
    sent = 5 * 800e6 / 8  # 4 worker hosts and the server's host, each at line rate
    assert est[1e3].cpu_breakdown["messages"] == pytest.approx(sent / 1e3 * 3e-5)
    assert est[1e6].cpu_breakdown["messages"] == pytest.approx(sent / 1e6 * 3e-5)
    assert est[math.inf].cpu_breakdown["messages"] == 0.0  # a scheme that sends no message
    # everything else is the same; the message term moves min_scale
    for e in est.values():
        assert {k: v for k, v in e.cpu_breakdown.items() if k != "messages"} == pytest.approx(
            {k: v for k, v in est[math.inf].cpu_breakdown.items() if k != "messages"}
        )
        assert e.cpu_at(e.min_scale) == pytest.approx(0.65 * MACHINE.cores)
    assert est[1e3].min_scale > est[1e6].min_scale > est[math.inf].min_scale
    assert est[1e3].fixed_cores == pytest.approx(est[math.inf].fixed_cores)


def _p3_and_ps(bw_mbps: float = 800):
    """A p3 and a ps point of the same network (4 hosts, a server colocated with each worker)."""
    out = {}
    for scheme in ("p3", "ps"):
        exp = from_dict(
            {
                "scale": 1,
                "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": bw_mbps},
                "workload": {
                    "scheme": scheme,
                    "model": "resnet50",
                    "compute": {"mode": "emulated"},
                    "servers": {"count": 0, "placement": "colocated"},
                },
            }
        )
        out[scheme] = (exp, *plan_point(exp))
    return out


def test_a_scheme_own_message_cost_applies_to_its_scheme_only_and_adds_to_the_runtime_term():
    points = _p3_and_ps()
    sent = 4 * 800e6 / 8  # 4 hosts carry processes, each at line rate
    base = synthetic(runtime_message_cpu_s=1e-4)
    own = synthetic(runtime_message_cpu_s=1e-4, p3_message_cpu_s=7e-4)
    runtime_only = synthetic(runtime_message_cpu_s=0.0, p3_message_cpu_s=7e-4)
    for scheme, (exp, hosts, procs) in points.items():
        eb, eo, er = (estimate(exp, hosts, procs, model=m, machine=MACHINE) for m in (base, own, runtime_only))
        msgs_per_s = sent / eb.message_bytes
        assert eb.cpu_breakdown["messages"] == pytest.approx(msgs_per_s * 1e-4)
        if scheme == "p3":
            # the runtime's 100 us plus P3's own 700 us per message; without the runtime's, P3's alone
            assert eo.cpu_breakdown["messages"] == pytest.approx(msgs_per_s * 8e-4)
            assert er.cpu_breakdown["messages"] == pytest.approx(msgs_per_s * 7e-4)
            assert eo.min_scale > eb.min_scale
        else:  # ps: the p3 figure is not its own
            assert eo.cpu_breakdown["messages"] == pytest.approx(msgs_per_s * 1e-4)
            assert er.cpu_breakdown["messages"] == 0.0
            assert eo.min_scale == pytest.approx(eb.min_scale)
        # nothing else moves
        for e in (eo, er):
            assert {k: v for k, v in e.cpu_breakdown.items() if k != "messages"} == pytest.approx(
                {k: v for k, v in eb.cpu_breakdown.items() if k != "messages"}
            )


def test_a_scheme_without_its_own_message_cost_adds_nothing(monkeypatch):
    from traffic import schemes

    monkeypatch.setattr(schemes, "_REGISTRY", dict(schemes._REGISTRY))  # the registration below is undone

    @schemes.register("capacity_test_scheme")
    class Mine(schemes.get("ps")):  # a scheme a researcher adds: no cost-model key has its name
        pass

    exp = from_dict(
        {
            "scale": 1,
            "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 800},
            "workload": {
                "scheme": "capacity_test_scheme",
                "model": "resnet50",
                "compute": {"mode": "emulated"},
                "servers": {"count": 0, "placement": "colocated"},
            },
        }
    )
    hosts, procs = plan_point(exp)
    m = synthetic(runtime_message_cpu_s=1e-4, p3_message_cpu_s=7e-4, ps_message_cpu_s=5e-4)
    assert m.scheme_message_cpu_s("capacity_test_scheme") == 0.0
    assert scheme_message_key("capacity_test_scheme") not in m.costs
    assert (m.scheme_message_cpu_s("p3"), m.scheme_message_cpu_s("ps")) == (7e-4, 5e-4)
    est = estimate(exp, hosts, procs, model=m, machine=MACHINE)
    assert est.message_bytes == pytest.approx(schemes.get("ps").message_bytes(exp.workload, procs))
    # the runtime's 100 us only: not ps's 500 us although the class is ps's
    assert est.cpu_breakdown["messages"] == pytest.approx(4 * 800e6 / 8 / est.message_bytes * 1e-4)


def test_per_host_cost_charges_each_byte_once_per_sending_host():
    exp, hosts, procs = point(
        {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 800},
        scheme="allreduce",
        model="resnet50",
        compute={"mode": "emulated"},
    )
    base = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    k = 3e-11
    est = estimate(exp, hosts, procs, model=synthetic(path_cpu_s_per_byte_per_host=k), machine=MACHINE)
    # 4 hosts each send at 800 Mbit/s: 4 x 1e8 B/s, each byte costing k more per sending host (4)
    assert est.network_cores_at_scale_1 - base.network_cores_at_scale_1 == pytest.approx(4 * 1e8 * 4 * k)
    assert est.fixed_cores == pytest.approx(base.fixed_cores)
    assert est.min_scale > base.min_scale
    assert synthetic().optional("path_cpu_s_per_byte_per_host") == 0.0  # absent: 0
    with pytest.raises(KeyError, match="not an optional cost key"):
        synthetic().optional("path_cpu_s_per_byte")


def test_optional_cost_loads_when_present_and_is_checked(tmp_path):
    doc = yaml.safe_load(capacity.COSTS_PATH.read_text())
    del doc["values"]["path_cpu_s_per_byte_per_host"]
    path = tmp_path / "costs.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert CostModel.load(path).optional("path_cpu_s_per_byte_per_host") == 0.0
    doc["values"]["path_cpu_s_per_byte_per_host"] = {"value": 2e-12, "unit": "cpu-s/byte", "source": "x"}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(
        CapacityError, match="path_cpu_s_per_byte_per_host: unit 'cpu-s/byte', expected 'cpu-s/byte/host'"
    ):
        CostModel.load(path)
    doc["values"]["path_cpu_s_per_byte_per_host"] = {"value": -2e-12, "unit": "cpu-s/byte/host", "source": "x"}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CapacityError, match="path_cpu_s_per_byte_per_host: value -2e-12 is negative"):
        CostModel.load(path)


def test_scheme_message_costs_load_when_present_and_are_checked(tmp_path):
    doc = yaml.safe_load(capacity.COSTS_PATH.read_text())
    for k in [k for k in doc["values"] if k not in COST_KEYS]:
        del doc["values"][k]
    path = tmp_path / "costs.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert set(CostModel.load(path).costs) == set(COST_KEYS)  # optional: a model without any loads
    doc["values"]["p3_message_cpu_s"] = {"value": 6e-4, "unit": "cpu-s/message", "source": "measured"}
    path.write_text(yaml.safe_dump(doc))
    m = CostModel.load(path)
    assert m.scheme_message_cpu_s("p3") == 6e-4 and m.costs["p3_message_cpu_s"].source == "measured"
    for bad, match in (
        ({"value": 6e-4, "unit": "cpu-s/byte", "source": "x"}, "unit 'cpu-s/byte'"),
        ({"value": -1e-6, "unit": "cpu-s/message", "source": "x"}, "value -1e-06 is negative"),
        ({"value": 6e-4, "unit": "cpu-s/message"}, "no source"),
        (6e-4, "not a mapping"),
    ):
        doc["values"]["p3_message_cpu_s"] = bad
        path.write_text(yaml.safe_dump(doc))
        with pytest.raises(CapacityError, match=f"p3_message_cpu_s: {match}"):
            CostModel.load(path)


def test_smaller_p3_slices_give_a_larger_cpu_estimate():
    m = CostModel.load()
    topo = {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 10000}
    big, small = (
        from_dict(
            {
                "scale": 4,
                "topology": topo,
                "workload": {"scheme": "p3", "model": "vgg19", "compute": {"mode": "emulated"}, "options": o},
            }
        )
        for o in ({}, {"slice_params": 5000})
    )
    eb, es = (estimate(e, *plan_point(e), model=m, machine=MACHINE) for e in (big, small))
    # VGG-19's 143,667,240 parameters in 2,902 slices of at most 50,000 (id included: +2 bytes per message)
    assert eb.message_bytes == pytest.approx(4 * 143_667_240 / 2902 + 2)
    assert es.message_bytes < eb.message_bytes / 9
    assert es.cpu_breakdown["messages"] / eb.cpu_breakdown["messages"] == pytest.approx(
        eb.message_bytes / es.message_bytes
    )
    assert es.cpu_cores > eb.cpu_cores and es.min_scale > eb.min_scale
    assert es.cpu_breakdown["network"] == pytest.approx(eb.cpu_breakdown["network"])


def test_cost_model_without_the_message_cost_is_refused(tmp_path):
    doc = yaml.safe_load(capacity.COSTS_PATH.read_text())
    assert doc["values"]["runtime_message_cpu_s"]["unit"] == "cpu-s/message"
    del doc["values"]["runtime_message_cpu_s"]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CapacityError, match=r"incomplete \(runtime_message_cpu_s: missing\).*profile --machine"):
        CostModel.load(path)


def test_background_flows_add_their_rate_up_to_the_link():
    base = {
        "topology": {"kind": "rack", "hosts_per_rack": 2, "background_hosts_per_rack": 2, "host_bw_mbps": 100},
        "workload": {"scheme": "ps", "model": "digits_mlp"},
    }
    flows = [
        {"src": "bg1", "dst": "bg2", "rate_mbps": 40, "duration_s": 1},
        {"src": "bg1", "dst": "bg2", "rate_mbps": 80, "duration_s": 1},
    ]  # 120 > the 100 Mbit/s link
    a, b = from_dict(base), from_dict({**base, "background": flows})
    ea = estimate(a, *plan_point(a), model=synthetic(), machine=MACHINE)
    eb = estimate(b, *plan_point(b), model=synthetic(), machine=MACHINE)
    assert eb.cpu_breakdown["network"] - ea.cpu_breakdown["network"] == pytest.approx(100e6 / 8 * 5e-9)


def test_estimate_grows_with_hosts_and_model_size():
    m = CostModel.load()
    small = point({"kind": "rack_core", "racks": 2, "hosts_per_rack": 2}, model="digits_mlp")
    more_hosts = point({"kind": "rack_core", "racks": 2, "hosts_per_rack": 8}, model="digits_mlp")
    bigger_model = point(
        {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2}, model="alexnet", compute={"mode": "emulated"}
    )
    e0, e1, e2 = (estimate(e, h, p, model=m, machine=MACHINE) for e, h, p in (small, more_hosts, bigger_model))
    assert e1.memory_bytes > e0.memory_bytes and e1.cpu_cores > e0.cpu_cores and e1.min_scale > e0.min_scale
    assert e2.memory_bytes - e0.memory_bytes >= 4 * (
        model_info("alexnet")["param_bytes"] - model_info("digits_mlp")["param_bytes"]
    )


def test_min_scale_keeps_35_percent_idle():
    exp, hosts, procs = point(
        {"kind": "rack_core", "racks": 2, "hosts_per_rack": 4, "host_bw_mbps": 1000}, model="digits_mlp"
    )
    for m in (synthetic(), CostModel.load()):
        est = estimate(exp, hosts, procs, model=m, machine=MACHINE)
        assert est.min_scale > 1  # 8 hosts at 1 Gbit/s do not fit 2 cores undilated
        assert est.cpu_at(est.min_scale) <= 0.65 * MACHINE.cores * (1 + 1e-9)
        assert est.cpu_at(est.min_scale * 0.99) > 0.65 * MACHINE.cores  # and it is the smallest
        assert est.cpu_at(1.0) == pytest.approx(est.cpu_cores)  # the spec's scale is 1


def test_min_scale_is_infinite_when_waiting_processes_alone_break_the_rule():
    exp, hosts, procs = point({"kind": "rack", "hosts_per_rack": 8}, model="digits_mlp")
    est = estimate(exp, hosts, procs, model=synthetic(process_idle_cores=0.2), machine=MACHINE)  # 9 x 0.2 > 1.3
    assert math.isinf(est.min_scale)
    (line,) = check([("p", exp, hosts, procs)], model=synthetic(process_idle_cores=0.2), machine=MACHINE)
    assert "no dilation suffices" in line and "point 'p'" in line


def test_scale_below_min_scale_warns_with_the_scale_to_use():
    exp, hosts, procs = point(
        {"kind": "rack_core", "racks": 2, "hosts_per_rack": 4, "host_bw_mbps": 1000}, model="digits_mlp"
    )
    m = synthetic()
    est = estimate(exp, hosts, procs, model=m, machine=MACHINE)
    (line,) = check([("host_bw_mbps=1000", exp, hosts, procs)], model=m, machine=MACHINE)
    assert "point 'host_bw_mbps=1000'" in line
    assert f"{est.cpu_cores:.2f} cores busy of 2 at scale 1" in line
    assert f"use scale >= {math.ceil(est.min_scale * 100) / 100:g}" in line
    assert "compute.mode: emulated" in line  # the spec computes for real: dilation needs emulated compute
    dilated = from_dict(
        {
            "topology": exp.topology.model_dump(),
            "scale": math.ceil(est.min_scale * 100) / 100,
            "workload": {"scheme": "ps", "model": "digits_mlp", "compute": {"mode": "emulated"}},
        }
    )
    assert check([("", dilated, *plan_point(dilated))], model=m, machine=MACHINE) == []


def test_memory_beyond_available_is_refused_and_force_makes_it_a_warning():
    exp, hosts, procs = point({"kind": "rack", "hosts_per_rack": 4}, model="alexnet", compute={"mode": "emulated"})
    m = synthetic()
    est = estimate(exp, hosts, procs, model=m, machine=MACHINE)
    small = Machine(cores=2, total_bytes=24 * GIB, available_bytes=est.memory_bytes - 1)
    with pytest.raises(CapacityError) as err:
        check([("model=alexnet", exp, hosts, procs)], model=m, machine=small)
    msg = str(err.value)
    assert isinstance(err.value, TestbedError)
    assert "point 'model=alexnet'" in msg
    assert f"estimated memory {est.memory_bytes / GIB:.2f} GiB" in msg
    assert f"the {(est.memory_bytes - 1) / GIB:.2f} GiB this machine has available" in msg
    assert "fewer hosts or workers" in msg and "smaller model" in msg and "run.force: true" in msg
    lines = check([("model=alexnet", exp, hosts, procs)], force=True, model=m, machine=small)
    assert len(lines) == 1 and "point 'model=alexnet'" in lines[0] and "running anyway" in lines[0]
    fits = Machine(cores=2, total_bytes=24 * GIB, available_bytes=est.memory_bytes)
    assert check([("model=alexnet", exp, hosts, procs)], model=m, machine=fits) == []


def test_refusal_reads_available_memory_from_psutil(monkeypatch):
    exp, hosts, procs = point({"kind": "rack", "hosts_per_rack": 2}, model="digits_mlp")

    class VM:
        total, available = 24 * GIB, 64 * MIB

    monkeypatch.setattr(machine_costs.psutil, "virtual_memory", lambda: VM)
    with pytest.raises(CapacityError, match=r"run 'experiment'.*0\.06 GiB this machine has available"):
        check([("", exp, hosts, procs)], model=synthetic())


def test_max_hosts_rack_core_is_refused_on_this_machine():
    racks = 64
    exp = from_dict(
        {
            "topology": {"kind": "rack_core", "racks": racks, "hosts_per_rack": MAX_HOSTS // racks},
            "workload": {"scheme": "ps"},
        }
    )
    hosts, procs = plan_point(exp)
    assert len(hosts) == MAX_HOSTS and len(procs) == MAX_HOSTS + 1
    machine = Machine.current()
    assert machine.total_bytes < 32 * GIB  # this 24 GiB machine
    with pytest.raises(CapacityError) as err:
        check([("", exp, hosts, procs)])
    assert f"{MAX_HOSTS + 1} processes, {MAX_HOSTS} hosts" in str(err.value)


def test_shipped_cost_model_loads_with_a_source_for_every_value():
    m = CostModel.load()
    schemes_measured = {
        scheme_message_key(s) for s in ("ps", "allreduce", "p3", "phub", "pipe_sgd", "stanza", "ibatch")
    }
    assert set(m.costs) == set(COST_KEYS) | schemes_measured | set(OPTIONAL_KEYS)
    for key, c in m.costs.items():
        unit, bench = (
            (COST_KEYS[key][0], "benchmarks/machine_costs.py")
            if key in COST_KEYS
            else (OPTIONAL_KEYS[key][0], "benchmarks/fit_host_cost.py")
            if key in OPTIONAL_KEYS
            else (SCHEME_MESSAGE_UNIT, "benchmarks/machine_costs.py")
        )
        assert c.unit == unit, key
        assert bench in c.source and "cores" in c.source and "GiB RAM" in c.source and "kernel" in c.source, key
        assert c.value >= 0, key
    assert m["process_uss_bytes"] > 10 * MIB and m["path_cpu_s_per_byte"] > 0
    assert {"cores", "memory_total_bytes", "kernel", "date"} <= set(m.machine)


def test_malformed_cost_model_names_the_key(tmp_path):
    path = tmp_path / "costs.yaml"
    path.write_text("values:\n  process_uss_bytes: {value: 1, unit: MB, source: x}\n")
    with pytest.raises(CapacityError, match="process_uss_bytes: unit 'MB', expected 'bytes'.*profile --machine"):
        CostModel.load(path)
    with pytest.raises(CapacityError, match="cannot read"):
        CostModel.load(tmp_path / "missing.yaml")


def test_cost_model_of_another_machine_is_flagged():
    exp, hosts, procs = point({"kind": "rack", "hosts_per_rack": 2}, model="digits_mlp")
    other = Machine(cores=16, total_bytes=128 * GIB, available_bytes=120 * GIB)
    (line,) = check([("", exp, hosts, procs)], model=synthetic(), machine=other)
    assert line.startswith(
        "capacity: the cost model <memory> was measured on another machine (2 cores there, 16 here; "
        "24.0 GiB there, 128.0 GiB here)"
    ) and line.endswith("`testbed profile --machine` (as root)")
    assert check([("", exp, hosts, procs)], model=synthetic(), machine=MACHINE) == []


def test_describe_is_one_line():
    exp, hosts, procs = point({"kind": "rack", "hosts_per_rack": 4}, model="digits_mlp")
    est = estimate(exp, hosts, procs, model=synthetic(), machine=MACHINE)
    assert describe(est) == (
        f"estimated memory {est.memory_bytes / GIB:.2f} GiB of 23.00 GiB available; "
        f"CPU {est.cpu_cores:.2f} cores busy of 2 at scale 1 (keeps 35% idle from scale "
        f"{est.min_scale:.3g})"
    )


def test_run_force_defaults_to_false():
    assert from_dict({}).run.force is False
    assert from_dict({"run": {"force": True}}).run.force is True


def test_the_cli_refuses_a_run_that_cannot_fit_before_anything_is_built(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    args = [
        sys.executable,
        "-m",
        "testbed.cli",
        "run",
        "experiments/quickstart.yaml",
        "--set",
        "sweep={}",
        "--set",
        "topology.racks=100",
        "--set",
        "topology.hosts_per_rack=20",
        "--runs-dir",
        str(tmp_path / "r"),
    ]
    out = subprocess.run(args, capture_output=True, text=True, cwd=root)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot hold the run" in out.stderr and "GiB" in out.stderr and "run.force" in out.stderr
    assert not (tmp_path / "r").exists()
    out = subprocess.run(args + ["--set", "run.force=true", "--dry-run"], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    assert "running anyway" in out.stdout and "capacity:" in out.stdout
