"""Topology construction: link counts, rates, oversubscription arithmetic (no network built)."""

import pytest

from topologies import HostRequest, TopologySpec, build_topo, hosts_of, uplink_mbps
from topologies.hosts import BRIDGE_RE, INTF_RE, NODE_RE


def _links(topo, cls):
    return [info for _, _, info in topo.links(withInfo=True) if info["link_class"] == cls]


def test_uplink_rate_from_oversubscription():
    assert uplink_mbps(4, 100, 2) == 200
    assert uplink_mbps(8, 1000, 4) == 2000
    assert TopologySpec(hosts_per_rack=4, host_bw_mbps=100, oversubscription=1).uplink_mbps() == 400
    assert TopologySpec(uplink_bw_mbps=123).uplink_mbps() == 123
    with pytest.raises(ValueError):
        uplink_mbps(4, 100, 0.5)


def test_rack_core_counts_rates_and_racks():
    topo = build_topo(TopologySpec(kind="rack_core", racks=3, hosts_per_rack=4, host_bw_mbps=100, oversubscription=2))
    assert len(topo.hosts()) == 12
    assert sorted(topo.switches()) == ["core1", "tor1", "tor2", "tor3"]
    host_links, uplinks = _links(topo, "host"), _links(topo, "uplink")
    assert len(host_links) == 12 and len(uplinks) == 3
    assert all(l["bw"] == 100 for l in host_links)
    assert all(l["bw"] == 200 for l in uplinks)
    racks = [topo.nodeInfo(h)["rack"] for h in topo.hosts(sort=True)]
    assert sorted(racks) == [0] * 4 + [1] * 4 + [2] * 4
    # every host link goes to its own rack's ToR
    for l in host_links:
        assert l["node2"] == f"tor{topo.nodeInfo(l['node1'])['rack'] + 1}"


def test_rack_has_no_core_and_dedicated_servers_are_extra_hosts():
    topo = build_topo(
        TopologySpec(kind="rack", racks=1, hosts_per_rack=3), [HostRequest("server", 0), HostRequest("server", 0)]
    )
    assert sorted(topo.switches()) == ["tor1"]
    kinds = {h: topo.nodeInfo(h)["kind"] for h in topo.hosts()}
    assert kinds == {"h1": "worker", "h2": "worker", "h3": "worker", "ps1": "server", "ps2": "server"}
    assert _links(topo, "uplink") == []


def test_several_interfaces_per_host():
    topo = build_topo(TopologySpec(kind="rack", racks=1, hosts_per_rack=2, interfaces_per_host=3))
    assert len(_links(topo, "host")) == 6


def test_delay_and_queue_options_reach_every_link():
    topo = build_topo(TopologySpec(delay_ms=2, max_queue_packets=50))
    for _, _, info in topo.links(withInfo=True):
        assert info["delay"] == "2ms" and info["max_queue_size"] == 50


def test_the_least_retransmission_timeout_is_dilated_like_a_delay():
    spec = TopologySpec(tcp_rto_min_ms=200, delay_ms=0.5)
    shaped = spec.dilated(80)
    assert (shaped.tcp_rto_min_ms, shaped.delay_ms) == (16_000, 40)
    assert TopologySpec().dilated(80).tcp_rto_min_ms == 16_000  # Linux's 200 ms by default, emulated
    assert TopologySpec(tcp_rto_min_ms=None).dilated(80).tcp_rto_min_ms is None  # the kernel's, undilated
    for bad in (0, -1, 60_001):
        with pytest.raises(ValueError, match="tcp_rto_min_ms"):
            TopologySpec(tcp_rto_min_ms=bad)


def test_hosts_of_reads_names_racks_kinds_and_interfaces_from_the_graph():
    topo = build_topo(
        TopologySpec(racks=2, hosts_per_rack=2, background_hosts_per_rack=1), [HostRequest("server", 1, interfaces=3)]
    )
    got = [(h.name, h.rack, h.kind, h.interfaces) for h in hosts_of(topo)]
    assert got == [
        ("bg1", 0, "background", 1),
        ("bg2", 1, "background", 1),
        ("h1", 0, "worker", 1),
        ("h2", 0, "worker", 1),
        ("h3", 1, "worker", 1),
        ("h4", 1, "worker", 1),
        ("ps1", 1, "server", 3),
    ]
    # the names clean removes are exactly the names a topology has
    assert all(NODE_RE.match(n) for n in topo.nodes())
    assert all(BRIDGE_RE.match(n) for n in topo.switches()) and not any(BRIDGE_RE.match(h) for h in topo.hosts())
    for a, b, info in topo.links(withInfo=True):
        assert INTF_RE.match(f"{a}-eth{info['port1']}") and INTF_RE.match(f"{b}-eth{info['port2']}")


def test_a_host_request_outside_the_topology_is_refused():
    with pytest.raises(ValueError):
        HostRequest("gpu", 0)
    with pytest.raises(ValueError, match="racks 0..1"):
        build_topo(TopologySpec(racks=2), [HostRequest("server", 2)])
