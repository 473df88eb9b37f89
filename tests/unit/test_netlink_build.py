"""The network's batched build (testbed/netlink_build.py) without a network: what an
interface records while Mininet builds and what it then asks of netlink, every node's shell
command sent before any is waited for, node files read back by path, a failed node command
named. (Real networks: tests/e2e/test_network.py.)"""

import os

import pytest

from common.errors import TestbedError
from testbed import netlink_build
from testbed.netlink_build import PFIFO_HANDLE, NetlinkHost, NetlinkIntf, configure, run_on_nodes
from testbed.network import read_files, sysctl_path
from testbed.shaping import HTB_CLASS, HTB_ROOT, MAX_RATE_MBPS, htb_burst_bytes, htb_class_options, netns_route


class Shell:
    """A node's shell: records what it is sent and when it is waited for."""

    def __init__(self, name, calls, reply=""):
        self.name, self.calls, self.reply = name, calls, reply

    def sendCmd(self, cmd):
        self.calls.append(("send", self.name, cmd))

    def waitOutput(self):
        self.calls.append(("wait", self.name))
        return self.reply(self) if callable(self.reply) else self.reply


def intf(name="h1-eth0", **params) -> NetlinkIntf:
    i = NetlinkIntf.__new__(NetlinkIntf)  # no node: only what config records
    i.name = name
    i.config(**params)
    return i


class Netlink:
    """An IPRoute that records requests; interface ``h1-eth0`` has index 7, ``lo`` 1."""

    def __init__(self):
        self.calls = []

    def link_lookup(self, ifname):
        return {"h1-eth0": [7], "lo": [1]}.get(ifname, [])

    def link(self, *a, **kw):
        self.calls.append(("link", a, kw))

    def addr(self, *a, **kw):
        self.calls.append(("addr", a, kw))

    def tc(self, *a, **kw):
        self.calls.append(("tc", a, kw))


def test_every_nodes_command_is_sent_before_any_is_waited_for():
    calls = []
    a, b, c = Shell("a", calls, "x\r\n"), Shell("b", calls), Shell("c", calls)
    out = run_on_nodes({a: "echo x", b: "true", c: ""})
    assert calls == [("send", "a", "echo x"), ("send", "b", "true"), ("wait", "a"), ("wait", "b")]
    assert out == {a: "x\r\n", b: ""}


def test_node_files_are_read_by_path_and_unreadable_ones_left_out():
    lowat, mtu = sysctl_path("net.ipv4.tcp_notsent_lowat"), "/sys/class/net/h1-eth0/mtu"
    assert lowat == "/proc/sys/net/ipv4/tcp_notsent_lowat"
    calls = []
    h = Shell("h1", calls, f"{lowat}:131072\r\ngrep: nope\r\n{mtu}:9000\r\n")
    s = Shell("tor1", calls, "")
    got = read_files({h: [lowat, mtu, "/sys/class/net/gone/mtu"], s: ["/sys/class/net/tor1-eth1/mtu"]})
    assert got == {h: {lowat: "131072", mtu: "9000"}, s: {}}
    assert calls[0] == ("send", "h1", f"grep -H . {lowat} {mtu} /sys/class/net/gone/mtu 2>/dev/null")


def test_an_interface_records_its_settings_and_refuses_a_rate_out_of_range():
    i = intf(bw=100.0, max_queue_size=20, link_class="host", rack=0, bw_mbps=100.0)
    assert i.pending == {
        "bw": 100.0,
        "delay": None,
        "jitter": None,
        "loss": None,
        "max_queue_size": 20,
        "ethtool": "ethtool -K h1-eth0 gro off tx on rx on",
        "up": True,
        "mac": None,
        "ip": None,
    }
    assert i.netem_command() == ""
    assert i.setMAC("00:00:00:00:00:01") == "" and i.mac == "00:00:00:00:00:01"
    assert i.setIP("10.0.0.1/8") == "" and (i.ip, i.prefixLen) == ("10.0.0.1", "8")
    assert i.pending["ip"] == ("10.0.0.1", 8)
    with pytest.raises(TestbedError, match="no prefix length"):
        i.setIP("10.0.0.2")
    with pytest.raises(TestbedError, match="outside"):
        intf(bw=MAX_RATE_MBPS * 1.01)


def test_a_netem_leaf_is_the_tc_command_of_shapedintf_under_the_htb_class():
    cmd = intf(bw=100.0, delay="1ms", loss=0.5, max_queue_size=20).netem_command()
    assert cmd.startswith("tc qdisc add dev h1-eth0  parent 5:1  handle 10: netem")
    assert "delay 1ms" in cmd and "loss 0.50000" in cmd and "limit 20" in cmd


def test_apply_sets_mac_address_htb_class_and_pfifo_then_the_link_up():
    i = intf(bw=100.0, max_queue_size=20)
    i.setMAC("00:00:00:00:00:01")
    i.setIP("10.0.0.1/8")
    nl = Netlink()
    i.apply(nl)
    assert nl.calls == [
        ("link", ("set",), {"index": 7, "address": "00:00:00:00:00:01"}),
        ("addr", ("add",), {"index": 7, "address": "10.0.0.1", "prefixlen": 8, "broadcast": "10.255.255.255"}),
        ("tc", ("add", "htb", 7, HTB_ROOT), {"default": 1}),
        ("tc", ("add-class", "htb", 7, HTB_CLASS), {"parent": HTB_ROOT, **htb_class_options(100.0)}),
        ("tc", ("add", "pfifo", 7, PFIFO_HANDLE), {"parent": HTB_CLASS, "limit": 20}),
        ("link", ("set",), {"index": 7, "state": "up"}),
    ]
    with pytest.raises(TestbedError, match="h1-eth9 was not created"):
        intf("h1-eth9", bw=100.0).apply(nl)


def test_the_htb_class_over_netlink_is_the_one_tc_is_asked_for():
    cmds, _ = NetlinkIntf.bwCmds(None, bw=100.0)
    burst = htb_burst_bytes(100.0)
    assert f"rate 100.0Mbit burst {burst} cburst {burst} quantum 60000" in cmds[1]
    assert htb_class_options(100.0) == {
        "rate": 12_500_000,
        "ceil": 12_500_000,
        "burst": burst,
        "cburst": burst,
        "quantum": 60_000,
    }


class Node(Shell):
    inNamespace, pid = True, 4242

    def __init__(self, name, calls, intfs, reply=""):
        super().__init__(name, calls, reply)
        self._intfs = intfs

    def intfList(self):
        return self._intfs


class HostNode(Node, NetlinkHost):
    lo_up = True


def test_configure_applies_each_namespace_then_names_a_node_whose_command_failed(monkeypatch):
    opened = []

    class Opened:
        def __init__(self, pid):
            self.nl = Netlink()
            opened.append((pid, self.nl))

        def __enter__(self):
            return self.nl

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(netlink_build, "netns_route", Opened)
    calls = []
    i = intf(bw=100.0, delay="1ms")
    h = HostNode("h1", calls, [i], reply="Error: netem not found\r\n")
    with pytest.raises(TestbedError, match="h1: Error: netem not found"):
        configure([h])
    assert opened[0][0] == 4242 and opened[0][1].calls[0] == ("link", ("set",), {"index": 1, "state": "up"})
    assert i.pending is None  # applied: setMAC and setIP are Mininet's from now on
    sent = calls[0][2]
    assert sent.startswith("ethtool -K h1-eth0 gro off tx on rx on >/dev/null 2>&1; tc qdisc add dev h1-eth0")


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a namespace needs root")
def test_netns_route_opens_in_the_namespace_and_leaves_this_thread_where_it_was():
    before = os.readlink("/proc/thread-self/ns/net")
    with netns_route(os.getpid()) as ipr:
        assert ipr.link_lookup(ifname="lo")
    with netns_route(None) as ipr:
        assert ipr.link_lookup(ifname="lo")
    assert os.readlink("/proc/thread-self/ns/net") == before
    with pytest.raises(OSError):
        with netns_route(2**22 + 17):
            pass
