"""The harness side of PHub on real networks: PBox hosts with k shaped interfaces, servers on
their own interface, background iperf3 traffic across the core.
"""

from __future__ import annotations

import json
import time

import pytest

from common.errors import SpecError
from testbed.network import bind_to_interface
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root
from topologies.hosts import HostRequest
from topologies.spec import TopologySpec

root_only = pytest.mark.skipif(needs_root, reason="needs root")


def servers(**kw):
    return from_dict({"workload": {"scheme": "ps", "servers": kw}}).workload.servers


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
