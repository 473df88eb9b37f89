"""Link shaping in one module: the htb handles written once, the rate limit shared by the
spec's validation and the build, and the remote shaper asking each machine for its own ends.
(Building and reading back real links: tests/test_network.py; changing them while a run
trains: tests/test_schedule_e2e.py and tests/test_cluster_e2e.py.)"""
import io
import json

import pytest

from common.errors import SpecError, TestbedError
from testbed.shaping import (HTB_CLASS, HTB_ROOT, MAX_RATE_MBPS, RemoteLinkShaper, ShapedIntf, link_ends,
                             serve, shaping_errors, switch_ends, tc_handle)
from testbed.spec import from_dict
from topologies import spec as topology_spec

LINKS = [{"node1": "h1", "intf1": "h1-eth0", "node2": "tor1", "intf2": "tor1-eth1"},
         {"node1": "tor1", "intf1": "tor1-eth2", "node2": "core1", "intf2": "core1-eth1"}]


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
    assert link_ends(LINKS) == [("h1", "h1-eth0"), ("tor1", "tor1-eth1"), ("tor1", "tor1-eth2"),
                                ("core1", "core1-eth1")]
    assert switch_ends(LINKS[:1], {"h1": 7}) == [("tor1", "tor1-eth1")]


def test_shaping_errors_name_each_end_that_differs():
    link = {"intf1": "a", "intf2": "b", "shaped_mbps": 100.0, "mtu_bytes": [1500, 1500]}
    good = {"qdisc": "htb", "rate_mbps": 100.4, "leaf": None}
    assert shaping_errors(link, {"a": good, "b": good}, 1500, None) == []
    bad = shaping_errors(link, {"a": good, "b": {**good, "rate_mbps": 90.0}}, 1500, None)
    assert len(bad) == 1 and bad[0].startswith("b: asked 100.0 Mbit/s htb")
    assert shaping_errors(link, {"a": good, "b": good}, 1500, 50)[0].startswith("a: asked a 50-packet queue")


def test_the_remote_shaper_asks_each_machine_for_its_own_ends():
    asked = []

    def call(addr, query):
        asked.append((addr, query))
        if query["op"] == "state":
            return [i for _, i in query["ends"]]
        return {i: 1.0 for _, i in query["ends"]}

    placement = {"h1": "m1", "tor1": "m1", "core1": "m2"}
    shaper = RemoteLinkShaper({"h1": 11}, placement, call)
    assert shaper.set_rate(link_ends(LINKS), 5.0) == {"h1-eth0": 1.0, "tor1-eth1": 1.0, "tor1-eth2": 1.0,
                                                      "core1-eth1": 1.0}
    assert [(a, q["ends"], q["pids"]) for a, q in asked] == [
        ("m1", [["h1", "h1-eth0"], ["tor1", "tor1-eth1"], ["tor1", "tor1-eth2"]], {"h1": 11}),
        ("m2", [["core1", "core1-eth1"]], {})]
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
