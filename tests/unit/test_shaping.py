"""Link shaping in one module: the htb handles written once, the rate limit shared by the
spec's validation and the build, the remote shaper asking each machine for its own ends, a
netem leaf's delay and loss read from its netlink message (this machine's kernel has no netem,
so the message is built here), and the build's verdict in shaping.json.
(Building and reading back real links: tests/e2e/test_network.py; changing them while a run
trains: tests/e2e/test_schedule_e2e.py and tests/e2e/test_cluster_e2e.py.)"""

import io
import json

import pytest
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import percent2u32, time2tick

from common.errors import SpecError, TestbedError
from testbed.shaping import (
    HTB_CLASS,
    HTB_ROOT,
    MAX_RATE_MBPS,
    RemoteLinkShaper,
    ShapedIntf,
    link_ends,
    netem_errors,
    netem_options,
    read_shaping,
    serve,
    shaping_errors,
    switch_ends,
    tc_handle,
)
from testbed.spec import from_dict
from topologies import spec as topology_spec

LINKS = [
    {"node1": "h1", "intf1": "h1-eth0", "node2": "tor1", "intf2": "tor1-eth1"},
    {"node1": "tor1", "intf1": "tor1-eth2", "node2": "core1", "intf2": "core1-eth1"},
]


def test_the_htb_handles_are_written_once_and_read_as_tc_writes_them():
    assert (HTB_ROOT, HTB_CLASS) == (0x50000, 0x50001)
    assert (tc_handle(HTB_ROOT), tc_handle(HTB_CLASS)) == ("5:0", "5:1")
    cmds, parent = ShapedIntf.bwCmds(None, bw=100.0)
    assert "root handle 5:0 htb default 1" in cmds[0]
    assert "parent 5:0 classid 5:1 htb rate 100.0Mbit" in cmds[1]
    assert parent == " parent 5:1 "


def test_the_build_and_the_spec_refuse_the_same_rate():
    assert topology_spec.MAX_RATE_MBPS == MAX_RATE_MBPS == ShapedIntf.bwParamMax
    with pytest.raises(TestbedError, match="outside"):
        ShapedIntf.bwCmds(None, bw=MAX_RATE_MBPS * 1.01)
    base = {"workload": {"scheme": "allreduce", "compute": {"mode": "emulated"}}}
    with pytest.raises(SpecError) as err:
        from_dict({**base, "scale": 1, "topology": {"host_bw_mbps": 50_000, "oversubscription": 8}})
    assert [e.field for e in err.value.errors] == ["topology.host_bw_mbps"]
    assert "at most 40000 Mbit/s" in str(err.value)
    # the derived uplink (4 x 20,000 / 1) is a link too
    with pytest.raises(SpecError) as err:
        from_dict({**base, "scale": 1, "topology": {"host_bw_mbps": 20_000}})
    assert [e.field for e in err.value.errors] == ["topology.uplink_bw_mbps"]
    # dilated below the limit: accepted
    from_dict({**base, "scale": 2, "topology": {"host_bw_mbps": 50_000, "oversubscription": 8}})


def test_link_and_switch_ends():
    assert link_ends(LINKS) == [
        ("h1", "h1-eth0"),
        ("tor1", "tor1-eth1"),
        ("tor1", "tor1-eth2"),
        ("core1", "core1-eth1"),
    ]
    assert switch_ends(LINKS[:1], {"h1": 7}) == [("tor1", "tor1-eth1")]


def test_shaping_errors_name_each_end_that_differs():
    link = {"intf1": "a", "intf2": "b", "shaped_mbps": 100.0, "mtu_bytes": [1500, 1500]}
    good = {"qdisc": "htb", "rate_mbps": 100.4, "leaf": None}
    assert shaping_errors(link, {"a": good, "b": good}, 1500, None) == []
    bad = shaping_errors(link, {"a": good, "b": {**good, "rate_mbps": 90.0}}, 1500, None)
    assert len(bad) == 1 and bad[0].startswith("b: asked 100.0 Mbit/s htb")
    assert shaping_errors(link, {"a": good, "b": good}, 1500, 50)[0].startswith("a: asked a 50-packet queue")


def qdisc_message(kind: str, parent: int, options: dict | None = None) -> tcmsg:
    """A qdisc as the kernel reports it over netlink: encoded, then decoded by pyroute2."""
    m = tcmsg()
    m["index"], m["handle"], m["parent"] = 3, 0x100000, parent
    m["attrs"] = [["TCA_KIND", kind]] + ([["TCA_OPTIONS", options]] if options is not None else [])
    m.encode()
    got = tcmsg(m.data)
    got.decode()
    return got


def netem_message(delay_us: float, loss_pct: float) -> tcmsg:
    """A netem leaf under the htb class, as tc (``netem delay <us>us loss <pct>``) leaves it."""
    return qdisc_message(
        "netem",
        HTB_CLASS,
        {
            "delay": time2tick(delay_us),
            "limit": 1000,
            "loss": percent2u32(loss_pct),
            "gap": 0,
            "duplicate": 0,
            "jitter": 0,
            "attrs": [],
        },
    )


def test_netem_options_give_the_delay_in_ms_and_the_loss_in_percent():
    got = netem_options(netem_message(5000, 1.5))
    assert got["delay_ms"] == pytest.approx(5.0) and got["loss_pct"] == pytest.approx(1.5, abs=1e-6)
    assert netem_options(qdisc_message("netem", HTB_CLASS)) == {"delay_ms": None, "loss_pct": None}


class FakeIpr:
    """The part of pyroute2's IPRoute that read_shaping uses: one interface, its qdiscs."""

    def __init__(self, qdiscs):
        self.qdiscs = qdiscs

    def link_lookup(self, ifname):
        return [3] if ifname == "eth0" else []

    def get_qdiscs(self, index):
        return self.qdiscs

    def get_classes(self, index):
        return []


def test_read_shaping_reads_a_netem_leafs_delay_and_loss():
    got = read_shaping(FakeIpr([qdisc_message("pfifo_fast", 0xFFFFFFFF), netem_message(2500, 0.1)]), "eth0")
    # 2.5 ms is 39062.5 ticks of 64 ns: the kernel keeps 39062, 2.499968 ms
    assert got["leaf"] == "netem" and got["delay_ms"] == pytest.approx(2.5, abs=1e-4)
    assert got["loss_pct"] == pytest.approx(0.1)
    assert (
        netem_errors({"intf1": "eth0", "intf2": "eth0", "shaped_delay_ms": 2.5, "loss_pct": 0.1}, {"eth0": got}) == []
    )
    plain = read_shaping(FakeIpr([qdisc_message("pfifo", HTB_CLASS, {"limit": 8})]), "eth0")
    assert plain["leaf"] == "pfifo" and plain["delay_ms"] is None and plain["loss_pct"] is None
    assert read_shaping(FakeIpr([]), "eth9")["error"] == "no such interface"


def test_netem_errors_name_each_end_whose_delay_or_loss_differs():
    link = {
        "intf1": "a",
        "intf2": "b",
        "shaped_mbps": 100.0,
        "mtu_bytes": [1500, 1500],
        "shaped_delay_ms": 4.0,
        "loss_pct": 0.5,
    }
    good = {"qdisc": "htb", "rate_mbps": 100.0, "leaf": "netem", "delay_ms": 4.0, "loss_pct": 0.50000001}
    assert netem_errors(link, {"a": good, "b": good}) == [] == shaping_errors(link, {"a": good, "b": good}, 1500, None)
    slow = {**good, "delay_ms": 8.0}
    no_netem = {**good, "leaf": "pfifo", "delay_ms": None, "loss_pct": None}
    bad = netem_errors(link, {"a": slow, "b": no_netem})
    assert [b.split(":")[0] for b in bad] == ["a", "b"] and "asked netem delay 4 ms loss 0.5 %" in bad[0]
    assert shaping_errors(link, {"a": slow, "b": good}, 1500, None) == bad[:1]
    # nothing asked: no netem needed
    assert netem_errors({**link, "shaped_delay_ms": 0.0, "loss_pct": 0.0}, {"a": no_netem, "b": no_netem}) == []


def test_the_remote_shaper_asks_each_machine_for_its_own_ends():
    asked = []

    def call(addr, query):
        asked.append((addr, query))
        if query["op"] == "state":
            return [i for _, i in query["ends"]]
        return {i: 1.0 for _, i in query["ends"]}

    placement = {"h1": "m1", "tor1": "m1", "core1": "m2"}
    shaper = RemoteLinkShaper({"h1": 11}, placement, call)
    assert shaper.set_rate(link_ends(LINKS), 5.0) == {
        "h1-eth0": 1.0,
        "tor1-eth1": 1.0,
        "tor1-eth2": 1.0,
        "core1-eth1": 1.0,
    }
    assert [(a, q["ends"], q["pids"]) for a, q in asked] == [
        ("m1", [["h1", "h1-eth0"], ["tor1", "tor1-eth1"], ["tor1", "tor1-eth2"]], {"h1": 11}),
        ("m2", [["core1", "core1-eth1"]], {}),
    ]
    assert asked[0][1]["mbps"] == 5.0
    assert shaper.set_state([("core1", "core1-eth1")], up=False) == ["core1-eth1"]

    def broken(addr, query):
        raise RuntimeError("no route to host")

    with pytest.raises(TestbedError, match="shaping on m1 failed: no route to host"):
        RemoteLinkShaper({}, placement, broken).read([("tor1", "tor1-eth1")])


def test_serve_answers_a_query_with_the_local_shaper():
    out = io.StringIO()
    serve(io.StringIO(json.dumps({"op": "read", "ends": [["sw", "lo"]], "pids": {}})), out)
    got = json.loads(out.getvalue())
    assert set(got) == {"lo"} and got["lo"]["qdisc"] != "htb" and got["lo"]["rate_mbps"] is None


class ReadBack:
    """A shaper whose read-back is given: interface -> read_shaping's dict."""

    def __init__(self, got):
        self.got = got

    def read(self, ends):
        return {i: self.got[i] for _, i in ends}


def test_the_build_records_its_read_back_verdict_in_shaping_json_before_failing(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from testbed import network

    monkeypatch.setattr(network, "kernel_qdiscs", lambda: {"htb": True, "netem": False})
    link = {**LINKS[0], "shaped_mbps": 50.0, "mtu_bytes": [1500, 1500], "shaped_delay_ms": 0.0, "loss_pct": 0.0}
    good = {"qdisc": "htb", "rate_mbps": 50.0, "leaf": None, "delay_ms": None, "loss_pct": None}

    def built(got):
        net = network.Network.__new__(type("Built", (network.Network,), {"shaper": ReadBack(got)}))
        net.run_dir, net.topology = tmp_path, {"links": [dict(link)]}
        net.spec = SimpleNamespace(mtu_bytes=1500, max_queue_packets=None, delay_ms=0.0, loss_pct=0.0)
        return net

    built({"h1-eth0": good, "tor1-eth1": good})._verify_shaping()
    doc = json.loads((tmp_path / "shaping.json").read_text())
    assert doc == {
        "ends": 2,
        "rate_tolerance": 0.01,
        "errors": [],
        "netem": {"available": False, "delay_ms": 0.0, "loss_pct": 0.0, "ends": 0, "errors": []},
    }
    with pytest.raises(TestbedError, match="not shaped as asked"):
        built({"h1-eth0": good, "tor1-eth1": {**good, "rate_mbps": 25.0}})._verify_shaping()
    doc = json.loads((tmp_path / "shaping.json").read_text())
    assert len(doc["errors"]) == 1 and doc["errors"][0].startswith("tor1-eth1: asked 50.0 Mbit/s htb")
