"""The harness side of PHub: PS configurations, PBox hosts with k interfaces,
processes bound to an interface, background iperf3 traffic on the core.

Fast cases check specs, plans and commands; cases marked ``slow`` build Mininet networks
(run them under ``flock /tmp/tb-heavy.lock``).
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import yaml

from common.errors import SpecError
from testbed.background import BASE_PORT, client_command, plan_flows, read_result, server_command
from testbed.loopback import local_entries, local_hosts
from testbed.network import IFACE_UID_BASE, bind_to_interface
from testbed.spec import dump_spec, expand_sweep, from_dict, load_spec
from tests.leftovers import leftovers, needs_root
from topologies import build_topo
from topologies.hosts import HostRequest
from topologies.spec import TopologySpec
from traffic import schemes

root_only = pytest.mark.skipif(needs_root, reason="needs root")


def servers(**kw):
    return from_dict({"workload": {"scheme": "ps", "servers": kw}}).workload.servers


# ----------------------------------------------------------------------------- PS configurations


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


# ----------------------------------------------------------------------------- background traffic


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


# ----------------------------------------------------------------------------- Mininet (slow)


def _link(topo, host, intf):
    return next(l for l in topo["links"] if l["node1"] == host and l["intf1"] == intf)


@pytest.mark.slow
@root_only
def test_pbox_host_has_k_shaped_interfaces_and_binds_processes(tmp_path):
    from testbed.ledger import Ledger, NetworkLock
    from testbed.network import Network
    from traffic import rundir

    assert leftovers() == []
    d = rundir.create(tmp_path, "pbox")
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, host_bw_mbps=40)
    with NetworkLock():
        with Network(spec, [HostRequest("server", 0, 2)], d, Ledger.create("t", d)) as net:
            topo = json.loads((d / "topology.json").read_text())
            (ps1,) = [h for h in topo["hosts"] if h["name"] == "ps1"]
            assert [i["name"] for i in ps1["intfs"]] == ["ps1-eth0", "ps1-eth1"]
            ip0, ip1 = (i["ip"] for i in ps1["intfs"])
            assert ip0 != ip1 and ip1.startswith("10.1.")
            for intf in ("ps1-eth0", "ps1-eth1"):  # each shaped like a host link, both ends
                link = _link(topo, "ps1", intf)
                assert link["bw_mbps"] == 40 and len(link["shaping"]) == 2
                for got in link["shaping"].values():
                    assert got["qdisc"] == "htb" and got["rate_mbps"] == pytest.approx(40, rel=0.01)
            tor_port = {intf: _link(topo, "ps1", intf)["intf2"] for intf in ("ps1-eth0", "ps1-eth1")}

            def port_bytes():
                return {
                    i: sum(int(open(f"/sys/class/net/{p}/statistics/{k}_bytes").read()) for k in ("rx", "tx"))
                    for i, p in tor_port.items()
                }

            # two workers push to the two interfaces at once: each gets a full host link
            h1, h2, pbox = net.hosts["h1"], net.hosts["h2"], net.hosts["ps1"]
            srv = [pbox.popen(["iperf3", "-s", "-1", "-p", str(5301 + i)]) for i in range(2)]
            time.sleep(0.5)
            cli = [
                h.popen(["iperf3", "-c", ip, "-p", str(5301 + i), "-t", "2", "-J"])
                for i, (h, ip) in enumerate(((h1, ip0), (h2, ip1)))
            ]
            mbps = [
                json.loads(c.communicate(timeout=30)[0])["end"]["sum_received"]["bits_per_second"] / 1e6 for c in cli
            ]
            for s in srv:
                s.wait(timeout=10)
            assert all(0.85 * 40 <= m <= 1.02 * 40 for m in mbps), mbps

            # a process bound to interface 1 opens its connections from it (as gloo's
            # connecting side does), and its bytes cross ps1-eth1's link only
            srv = h1.popen(["iperf3", "-s", "-1", "-p", "5303"])
            time.sleep(0.5)
            before = port_bytes()
            c = pbox.popen(bind_to_interface(["iperf3", "-c", h1.IP(), "-p", "5303", "-n", "2M", "-J"], 1))
            out = json.loads(c.communicate(timeout=30)[0])
            srv.wait(timeout=10)
            time.sleep(0.3)
            after = port_bytes()
            assert out["start"]["connected"][0]["local_host"] == ip1
            received = out["end"]["sum_received"]["bytes"]
            moved = {i: after[i] - before[i] for i in after}
            assert received > 500_000 and moved["ps1-eth1"] >= received and moved["ps1-eth0"] < 20_000, moved
    assert leftovers() == []


def _small(tmp_path, **extra):
    spec = {
        "name": "phub-harness",
        "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 50, "oversubscription": 1},
        "workload": {"scheme": "ps", "iterations": 6, "warmup_iterations": 1, "batch_size": 16},
        "run": {"runs_dir": str(tmp_path), "timeout_s": 240},
    }
    for path, value in extra.items():
        node = spec
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return from_dict(spec)


@pytest.mark.slow
@root_only
def test_pbox_servers_each_use_their_own_interface(tmp_path):
    """`ps` on a 2-interface PBox: server i is bound to ps1-eth<i>, and its bytes cross that link."""
    from testbed.runner import run_experiment

    assert leftovers() == []
    (res,) = run_experiment(
        _small(tmp_path, **{"workload.servers": {"config": "NCC", "interfaces": 2}}), progress=False
    )
    assert res.ok, res.summary.error
    topo = json.loads((res.run_dir / "topology.json").read_text())
    procs = json.loads((res.run_dir / "processes.json").read_text())["processes"]
    servers = sorted((p for p in procs if p["role"] == "server"), key=lambda p: p["index"])
    (ps1,) = [h for h in topo["hosts"] if h["name"] == "ps1"]
    assert [(p["host"], p["iface"], p["iface_index"], p["ip"]) for p in servers] == [
        ("ps1", f"ps1-eth{i}", i, ps1["intfs"][i]["ip"]) for i in (0, 1)
    ]
    per_port = res.summary.bytes.per_port
    for i in (0, 1):
        port = per_port[_link(topo, "ps1", f"ps1-eth{i}")["intf2"]]
        moved = port.tx + port.rx
        r = json.loads((res.run_dir / "results" / f"server{i}.json").read_text())
        payload = r["bytes_received"] + r["bytes_sent"]
        # a server whose sockets left by the other interface would leave this link near empty
        assert r["bytes_received"] > 0 and payload <= moved <= 1.2 * payload, (i, moved, payload)
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_background_flow_crosses_the_core_and_leaves_nothing(tmp_path):
    from testbed.runner import run_experiment
    from traffic.compute_profiles import LayerProfile, Profile, load_profile

    assert leftovers() == []
    zero = load_profile("zero", "digits_mlp", 16)
    prof = Profile(
        "digits_mlp",
        "test",
        16,
        "tests: 20 ms per layer",
        "test",
        True,
        [LayerProfile(l.index, l.name, 0.01, 0.01) for l in zero.layers],
    ).save(tmp_path / "p.json")
    scale = 2
    exp = _small(
        tmp_path,
        scale=scale,
        **{
            "topology.background_hosts_per_rack": 1,
            "topology.host_bw_mbps": 100,
            "workload.scheme": "allreduce",
            "workload.workers": 2,
            "workload.iterations": 40,
            "workload.compute": {"mode": "emulated", "profile": str(prof)},
            "background": [
                {"src": "bg2", "dst": "bg1", "rate_mbps": 20, "start_s": 0.5, "duration_s": 2, "name": "core"},
                {"src": "bg1", "dst": "bg2", "rate_mbps": 10, "duration_s": 600, "protocol": "udp"},  # cut short
                {"src": "bg1", "dst": "bg2", "rate_mbps": 10, "start_s": 100, "duration_s": 1},
            ],
        },
    )  # never starts
    (res,) = run_experiment(exp, progress=False)
    # the flow that never starts was asked for but not done: the run fails, every figure kept;
    # the one cut short when training ended ran as asked
    (undone,) = res.summary.fidelity.unverified
    assert undone.startswith("background bg2: never started during training"), res.summary.error
    assert res.summary.status == "failed" and res.summary.error == f"asked for but not done: {undone}"
    assert [e.verified for e in res.summary.fidelity.effects if e.kind == "background"] == [True, True, False]
    flows = json.loads((res.run_dir / "traces" / "background" / "flows.json").read_text())["flows"]
    core, cut, late = flows
    assert (core["shaped_bps"], core["seconds"], core["delay_s"]) == (10_000_000, 4, 1.0)
    emulated_bytes = 20e6 / 8 * 2  # rate x duration, emulated = shaped rate x dilated seconds
    assert core["result"]["error"] is None
    assert core["result"]["bytes_sent"] == pytest.approx(emulated_bytes, rel=0.05)
    # bwm-ng at rack 1's uplink: what crossed the core from bg2 (training stays in rack 0)
    topo = json.loads((res.run_dir / "topology.json").read_text())
    up = next(l for l in topo["links"] if l["class"] == "uplink" and l["node1"] == "tor2")
    crossed = res.summary.bytes.per_port[up["intf1"]].tx
    assert core["result"]["bytes_sent"] <= crossed <= 1.1 * core["result"]["bytes_sent"], (crossed, core["result"])
    # training stayed in rack 0: what crossed the core is the flows' (ARP and the like aside)
    b = res.summary.bytes
    assert b.core_background >= core["result"]["bytes_sent"] and 0 <= b.core_training < 0.01 * b.core, b
    assert cut["result"]["error"] and late["result"]["bytes_sent"] is None
    assert (res.run_dir / "traces" / "background" / "core.server.json").is_file()
    assert leftovers() == []


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


@root_only
def test_background_flow_to_a_missing_host_is_refused_before_anything_is_built(tmp_path):
    from testbed.runner import run_experiment

    assert leftovers() == []
    with pytest.raises(SpecError) as e:
        run_experiment(
            _small(tmp_path / "runs", background=[{"src": "h1", "dst": "bg1", "rate_mbps": 5, "duration_s": 1}]),
            progress=False,
        )
    assert "background[0].dst" in str(e.value) and "h1, h2, h3, h4" in str(e.value)
    assert not (tmp_path / "runs").exists()  # planned on the topology graph: no run directory written
    assert leftovers() == []
