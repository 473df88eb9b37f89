"""The harness side of PHub: PS configurations, PBox hosts with k interfaces, processes bound
to an interface, background iperf3 traffic on the core: specs, plans and commands. The
cases that build networks are tests/e2e/test_phub_harness_e2e.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from common.errors import SpecError
from testbed.background import BASE_PORT, client_command, plan_flows, read_result, server_command
from testbed.loopback import local_entries, local_hosts
from testbed.network import IFACE_UID_BASE, bind_to_interface
from testbed.spec import dump_spec, expand_sweep, from_dict, load_spec
from topologies import build_topo
from topologies.hosts import HostRequest
from topologies.spec import TopologySpec
from traffic import schemes


def servers(**kw):
    return from_dict({"workload": {"scheme": "ps", "servers": kw}}).workload.servers


@pytest.mark.parametrize(
    "config, placement, count",
    [("CC", "colocated", 1), ("CS", "colocated", 0), ("NCC", "dedicated", 1), ("NCS", "dedicated", 0)],
)
def test_config_sets_placement_and_count(config, placement, count):
    s = servers(config=config)
    assert (s.placement, s.count) == (placement, count)
    # agreeing explicit values are accepted; sharded configs take any count but 1
    assert servers(config=config, placement=placement, count=count).count == count
    if count == 0:
        assert servers(config=config, count=3).count == 3


@pytest.mark.parametrize(
    "given, field, fragment",
    [
        ({"config": "CC", "placement": "dedicated"}, "workload.servers.placement", "'colocated' for servers.config CC"),
        (
            {"config": "NCS", "placement": "colocated"},
            "workload.servers.placement",
            "'dedicated' for servers.config NCS",
        ),
        ({"config": "NCC", "count": 2}, "workload.servers.count", "1 for servers.config NCC"),
        ({"config": "CC", "count": 0}, "workload.servers.count", "1 for servers.config CC"),
        ({"config": "CS", "count": 1}, "workload.servers.count", ">= 2 for servers.config CS"),
        ({"config": "NC"}, "workload.servers.config", "'NCC'"),
        ({"interfaces": 2}, "workload.servers.interfaces", "placement is 'dedicated'"),
        ({"config": "CS", "interfaces": 4}, "workload.servers.interfaces", "placement is 'dedicated'"),
        ({"config": "NCC", "interfaces": 0}, "workload.servers.interfaces", "> 0"),
    ],
)
def test_contradicting_servers_fields_are_named(given, field, fragment):
    with pytest.raises(SpecError) as e:
        servers(**given)
    assert e.value.field == field
    assert fragment in str(e.value)


def test_defaults_unchanged_and_config_survives_sweeps_variants_and_spec_yaml(tmp_path):
    s = servers()
    assert (s.count, s.placement, s.scope, s.interfaces, s.config) == (1, "colocated", "global", 1, None)
    # a sweep over the four configurations of Figure 4 on a spec that sets none
    pts = expand_sweep(
        from_dict(
            {
                "workload": {"servers": {"interfaces": 1}},
                "sweep": {"workload.servers.config": ["CC", "CS", "NCC", "NCS"]},
            }
        )
    )
    assert [(e.workload.servers.placement, e.workload.servers.count) for _, e in pts] == [
        ("colocated", 1),
        ("colocated", 0),
        ("dedicated", 1),
        ("dedicated", 0),
    ]
    # variants may switch the config of a base that has one
    exp = from_dict(
        {
            "workload": {"servers": {"config": "NCC"}},
            "variants": [
                {"name": "pbox", "workload.servers.interfaces": 4},
                {"name": "cs", "workload.servers.config": "CS"},
            ],
        }
    )
    assert [(p["variant"], e.workload.servers.config, e.workload.servers.placement) for p, e in expand_sweep(exp)] == [
        ("pbox", "NCC", "dedicated"),
        ("cs", "CS", "colocated"),
    ]
    # a run's spec.yaml (every value resolved) loads back to the same servers
    path = tmp_path / "spec.yaml"
    path.write_text(dump_spec(from_dict({"workload": {"servers": {"config": "NCS"}}})))
    assert yaml.safe_load(path.read_text())["workload"]["servers"]["count"] == 0
    assert load_spec(path).workload.servers == servers(config="NCS")


def test_dedicated_hosts_for_each_config():
    ps = schemes.get("ps")

    def hosts(racks=2, per_rack=4, **kw):
        exp = from_dict({"topology": {"racks": racks, "hosts_per_rack": per_rack}, "workload": {"scheme": "ps", **kw}})
        requests = ps.hosts(exp.workload, TopologySpec(racks=racks, hosts_per_rack=per_rack))
        assert all((r.kind, r.interfaces) == ("server", exp.workload.servers.interfaces) for r in requests)
        return [r.rack for r in requests], exp

    assert hosts(servers={"config": "CC"})[0] == [] and hosts(servers={"config": "CS"})[0] == []
    assert hosts(servers={"config": "NCC"})[0] == [0]
    assert hosts(
        servers={"config": "NCC", "scope": "per_rack"},
    )[0] == [0, 1]  # a PBox per rack (Sec. 3.4)
    # NCS: one server host per worker, in the worker's rack
    assert hosts(servers={"config": "NCS"})[0] == [0] * 4 + [1] * 4
    assert hosts(racks=3, per_rack=2, workers=3, servers={"config": "NCS"})[0] == [0, 0, 1]
    racks, exp = hosts(servers={"config": "NCS"})
    entries = local_entries(exp)
    assert [e["host"] for e in entries if e["role"] == "server"] == [f"ps{i}" for i in range(1, 9)]
    assert [e["host"] for e in entries if e["role"] == "worker"] == [f"h{i}" for i in range(1, 9)]
    # CS: a server on every worker host; CC: one, on a worker host
    _, exp = hosts(servers={"config": "CS"})
    assert sorted(e["host"] for e in local_entries(exp) if e["role"] == "server") == sorted(
        f"h{i}" for i in range(1, 9)
    )
    _, exp = hosts(servers={"config": "CC"})
    assert [e["host"] for e in local_entries(exp) if e["role"] == "server"] == ["h1"]
    # NCS with workload.workers 0: one server host per worker host of the topology
    ncs = exp.workload.__class__(servers=servers(config="NCS"))
    assert [r.rack for r in ps.hosts(ncs, TopologySpec(racks=2, hosts_per_rack=3))] == [0] * 3 + [1] * 3
    # a PBox: one host of k interfaces
    assert ps.hosts(exp.workload.__class__(servers=servers(config="NCC", interfaces=4)), TopologySpec()) == [
        HostRequest("server", 0, 4)
    ]


def test_pbox_host_in_topology_and_local_plan(monkeypatch):
    topo = build_topo(
        TopologySpec(kind="rack_core", racks=2, hosts_per_rack=2, interfaces_per_host=1, background_hosts_per_rack=1),
        [HostRequest("server", 0, 3)],
    )
    links = {}
    for n1, _, _info in topo.links(withInfo=True):
        links[n1] = links.get(n1, 0) + 1
    assert links["ps1"] == 3 and links["h1"] == 1 and links["bg1"] == 1 and links["bg2"] == 1
    assert {h: (topo.nodeInfo(h)["kind"], topo.nodeInfo(h)["rack"]) for h in ("bg1", "bg2", "ps1")} == {
        "bg1": ("background", 0),
        "bg2": ("background", 1),
        "ps1": ("server", 0),
    }

    exp = from_dict(
        {
            "topology": {"racks": 2, "hosts_per_rack": 2},
            "workload": {"scheme": "ps", "servers": {"config": "NCC", "interfaces": 3}},
        }
    )
    pbox = [h for h in local_hosts(exp) if h.kind == "server"]
    assert [(h.name, h.interfaces) for h in pbox] == [("ps1", 3)]
    # a plan may bind a server to any interface of its host; loopback runs put it on lo
    ps = schemes.get("ps")
    original = ps.plan.__func__

    def on_iface(iface):
        def plan(cls, workload, hosts):
            return [
                dataclasses.replace(p, iface=iface) if p.role == "server" else p for p in original(cls, workload, hosts)
            ]

        return classmethod(plan)

    # every PS scheme runs one server per interface of the PBox
    assert [e["iface_index"] for e in local_entries(exp) if e["role"] == "server"] == [0, 1, 2]
    monkeypatch.setattr(ps, "plan", on_iface(2))
    servers = [e for e in local_entries(exp) if e["role"] == "server"]
    assert {(e["ip"], e["iface"], e["iface_index"]) for e in servers} == {("127.0.0.1", "lo", 2)}
    monkeypatch.setattr(ps, "plan", on_iface(3))
    with pytest.raises(SpecError, match="interfaces 0..2 of host ps1"):
        local_entries(exp)


def test_bind_to_interface_runs_iface_processes_as_their_uid():
    cmd = ["python", "-m", "traffic.runtime", "run", "server0"]
    assert bind_to_interface(cmd, 0) == cmd
    wrapped = bind_to_interface(cmd, 2)
    assert wrapped[0] == "setpriv" and wrapped[-len(cmd) :] == cmd
    assert f"--reuid={IFACE_UID_BASE + 2}" in wrapped and "--clear-groups" in wrapped


FLOW = {"src": "bg2", "dst": "bg1", "rate_mbps": 20, "start_s": 0.5, "duration_s": 2}


@pytest.mark.parametrize(
    "flows, scale, field, fragment",
    [
        ([{"src": "h1", "dst": "h5", "rate_mbps": 5}], 1, "background[0].duration_s", "required"),
        ([{"src": "h1", "dst": "h5", "duration_s": 5}], 1, "background[0].rate_mbps", "required"),
        ([{"src": "h1", "dst": "h1", "rate_mbps": 5, "duration_s": 5}], 1, "background[0].dst", "other than src"),
        ([{"src": "h1", "dst": "h5", "rate_mbps": 0, "duration_s": 5}], 1, "background[0].rate_mbps", "> 0"),
        (
            [{"src": "h1", "dst": "h5", "rate_mbps": 5, "duration_s": 2.5}],
            1,
            "background[0].duration_s",
            "whole number",
        ),
        ([{"src": "h1", "dst": "h5", "rate_mbps": 5, "duration_s": 0.3}], 2, "background[0].duration_s", "= 0.6"),
        (
            [{"src": "h1", "dst": "h5", "rate_mbps": 5, "duration_s": 1, "start_s": -1}],
            1,
            "background[0].start_s",
            ">= 0",
        ),
        (
            [{"src": "h1", "dst": "h5", "rate_mbps": 5, "duration_s": 1, "protocol": "sctp"}],
            1,
            "background[0].protocol",
            "'udp'",
        ),
        ([FLOW, {**FLOW, "name": "bg0"}], 1, "background[1].name", "taken"),
        ([{**FLOW, "name": "../x"}], 1, "background[0].name", "a file name"),
        ([{**FLOW, "port": 1}], 1, "background[0].port", "a known field"),
        ("h1 h5", 1, "background", "a list of mappings"),
    ],
)
def test_bad_background_flows_are_named(flows, scale, field, fragment):
    spec = {"background": flows, "scale": scale}
    if scale != 1:
        spec["workload"] = {"compute": {"mode": "emulated"}}
    with pytest.raises(SpecError) as e:
        from_dict(spec)
    assert e.value.field == field
    assert fragment in str(e.value)


def _topology(*names):
    return {"hosts": [{"name": n, "ip": f"10.0.0.{i + 1}", "intfs": []} for i, n in enumerate(names)]}


def test_background_commands_are_dilated(tmp_path):
    exp = from_dict(
        {
            "scale": 4,
            "workload": {"compute": {"mode": "emulated"}},
            "background": [{**FLOW, "duration_s": 2.5}, {**FLOW, "start_s": 0, "protocol": "udp", "name": "cross"}],
        }
    )
    a, b = plan_flows(exp.background, _topology("h1", "bg1", "bg2"), exp.scale)
    # rates are divided by the scale like links; start and duration multiplied
    assert (a.name, a.dst_ip, a.port, a.shaped_bps, a.delay_s, a.seconds) == (
        "bg0",
        "10.0.0.2",
        BASE_PORT,
        5_000_000,
        2.0,
        10,
    )
    assert (b.name, b.port, b.delay_s) == ("cross", BASE_PORT + 1, 0)
    assert server_command(a, tmp_path) == [
        "iperf3",
        "-s",
        "-1",
        "-p",
        str(BASE_PORT),
        "--json",
        "--logfile",
        str(tmp_path / "bg0.server.json"),
    ]
    sh = client_command(a, tmp_path)
    assert sh[:2] == ["sh", "-c"] and sh[2].startswith("sleep 2.000; exec iperf3 -c 10.0.0.2 ")
    assert "-b 5000000 -t 10 --json --logfile" in sh[2]
    udp = client_command(b, tmp_path)
    assert udp[0] == "iperf3" and "-u" in udp and udp[-1] == str(tmp_path / "cross.json")
    with pytest.raises(SpecError) as e:
        plan_flows(exp.background, _topology("h1", "bg1"), exp.scale)
    assert e.value.field == "background[0].src" and "h1, bg1" in str(e.value)


def test_result_of_a_flow_that_never_ran(tmp_path):
    r = read_result(tmp_path / "bg0.json")
    assert r["bytes_sent"] is None and "did not run to its end" in r["error"]


def test_oversubscription_experiment_spec():
    exp = load_spec("experiments/phub_oversub.yaml")
    pts = expand_sweep(exp)
    assert len(pts) == 3 * 3 * 2 * len(exp.variants)
    got = {(e.topology.racks, e.topology.uplink_mbps(), len(e.background)) for _, e in pts}
    assert got == {(r, 40_000 / o, b) for r in (2, 3, 4) for o in (1, 2, 3) for b in (0, 2)}
    busy = next(e for _, e in pts if e.background)
    # the flows run between background hosts of racks 1 and 2, at the shaped rate
    assert busy.topology.background_hosts_per_rack == 1 and {(f.src, f.dst) for f in busy.background} == {
        ("bg1", "bg2"),
        ("bg2", "bg1"),
    }
    (flow, _) = plan_flows(busy.background, _topology("bg1", "bg2"), busy.scale)
    assert flow.shaped_bps == 5000e6 / busy.scale
