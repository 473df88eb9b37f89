"""Mininet's classes for this machine's network, made over netlink (pyroute2) in batches.

Mininet configures every interface through its node's shell, one process per setting
(``ip link add``, ``ifconfig`` down / hw ether / up / address, ``ethtool -K``, ``tc qdisc
show``, ``tc qdisc add``, ``tc class add``, ``brctl addif`` ...), one after the other,
thousands of processes at a hundred hosts (measured: ``docs/scaling.md``). The same network is made here with the
same settings:

* :class:`NetlinkLink`: a veth pair is one netlink request from this namespace that creates
  each end in its node's namespace, with its MAC; deleting it is one request on the end in
  this namespace (the kernel removes the peer).
* :class:`NetlinkIntf`: what Mininet's ``TCIntf`` would run for an interface (up, its
  offloads, the htb root and class of :class:`testbed.shaping.ShapedIntf`, a pfifo or netem
  leaf) and the MAC and address its host gives it are recorded while Mininet builds, then
  :func:`configure` applies them: one ``IPRoute`` per namespace for the links, addresses and
  qdiscs, and one shell command line per node for ``ethtool`` and a netem leaf (whose ``tc``
  command is :meth:`ShapedIntf.delayCmds`'s), every node's at once (:func:`run_on_nodes`).
* :class:`NetlinkHost`: Mininet's ``Host`` whose default interface's MAC and address, and
  ``lo`` up, are left to :func:`configure`.
* :class:`NetlinkBridge`: Mininet's ``LinuxBridge`` (no STP) made and deleted over netlink.

The shaping is read back and verified afterwards exactly as before
(:meth:`testbed.network.Network._verify_shaping`). Nodes on other machines
(:mod:`testbed.remote`) keep Mininet's shell commands.
"""

from __future__ import annotations

import ipaddress

from mininet.node import Host, Switch
from mininet.nodelib import LinuxBridge
from pyroute2 import IPRoute

from common.errors import TestbedError
from testbed.ledger import delete_link
from testbed.shaping import HTB_CLASS, HTB_ROOT, ShapedIntf, ShapedLink, htb_class_options, netns_route, tc_handle

__all__ = ["NetlinkIntf", "NetlinkLink", "NetlinkHost", "NetlinkBridge", "configure", "run_on_nodes", "PFIFO_HANDLE"]

#: handle of a pfifo leaf under the htb class (``tc ... handle 10:``, as ShapedIntf.delayCmds)
PFIFO_HANDLE = 0x10 << 16


def run_on_nodes(commands: dict) -> dict:
    """Run one command line in each node's shell, every node's at once (Mininet's
    ``sendCmd``, then ``waitOutput`` of each); node -> what it printed (a terminal's ``\\r\\n``
    line ends). A node whose line is empty is left out."""
    commands = {n: c for n, c in commands.items() if c}
    for node, cmd in commands.items():
        node.sendCmd(cmd)
    return {node: node.waitOutput() for node in commands}


def _on(flag: bool) -> str:
    return "on" if flag else "off"


class NetlinkIntf(ShapedIntf):
    """:class:`ShapedIntf` whose settings :func:`configure` applies (module docstring).

    Until then (``pending`` is not None) ``setMAC`` and ``setIP`` record the MAC and address;
    afterwards they are Mininet's. The rate is checked at once (:meth:`ShapedIntf.bwCmds`).
    """

    pending: dict | None = None

    def config(
        self,
        bw=None,
        delay=None,
        jitter=None,
        loss=None,
        max_queue_size=None,
        gro=False,
        txo=True,
        rxo=True,
        up=True,
        **_params,
    ):
        self.bwCmds(bw=bw)  # refuses a rate out of range, as the build through tc does
        self.pending = {
            "bw": bw,
            "delay": delay,
            "jitter": jitter,
            "loss": loss,
            "max_queue_size": max_queue_size,
            "ethtool": f"ethtool -K {self.name} gro {_on(gro)} tx {_on(txo)} rx {_on(rxo)}",
            "up": up,
            "mac": None,
            "ip": None,
        }
        return {}

    def setMAC(self, macstr):
        if self.pending is None:
            return super().setMAC(macstr)
        self.mac = self.pending["mac"] = macstr
        return ""

    def setIP(self, ipstr, prefixLen=None):
        if self.pending is None:
            return super().setIP(ipstr, prefixLen)
        ip, _, plen = ipstr.partition("/")
        plen = plen or prefixLen
        if not plen:
            raise TestbedError(f"no prefix length for address {ipstr} of {self.name}")
        self.ip, self.prefixLen = ip, plen
        self.pending["ip"] = (ip, int(plen))
        return ""

    def netem_command(self) -> str:
        """The ``tc`` command of a netem leaf under the htb class (empty without delay, jitter or
        loss): :meth:`ShapedIntf.delayCmds`'s, run in the node's shell."""
        p = self.pending
        if not (p["delay"] or p["jitter"] or p["loss"]):
            return ""
        cmds, _ = self.delayCmds(
            f" parent {tc_handle(HTB_CLASS)} ",
            delay=p["delay"],
            jitter=p["jitter"],
            loss=p["loss"],
            max_queue_size=p["max_queue_size"],
        )
        return "; ".join(c % ("tc", self.name) for c in cmds)

    def apply(self, ipr) -> None:
        """Set, through ``ipr`` (an ``IPRoute`` in this interface's namespace), the recorded MAC
        and address, the htb root and class and a pfifo leaf, then the link up. The netem leaf
        and the offloads are the node's shell's (:func:`configure`).

        Raises:
            TestbedError: the interface is not there; NetlinkError: the kernel refused.
        """
        p = self.pending
        idx = ipr.link_lookup(ifname=self.name)
        if not idx:
            raise TestbedError(f"interface {self.name} was not created")
        idx = idx[0]
        if p["mac"]:
            ipr.link("set", index=idx, address=p["mac"])
        if p["ip"]:
            ip, plen = p["ip"]
            brd = str(ipaddress.ip_network(f"{ip}/{plen}", strict=False).broadcast_address)
            ipr.addr("add", index=idx, address=ip, prefixlen=plen, broadcast=brd)
        if p["bw"] is not None:
            ipr.tc("add", "htb", idx, HTB_ROOT, default=HTB_CLASS & 0xFFFF)
            ipr.tc("add-class", "htb", idx, HTB_CLASS, parent=HTB_ROOT, **htb_class_options(p["bw"]))
            if p["max_queue_size"] and not (p["delay"] or p["jitter"] or p["loss"]):
                ipr.tc("add", "pfifo", idx, PFIFO_HANDLE, parent=HTB_CLASS, limit=int(p["max_queue_size"]))
        if p["up"]:
            ipr.link("set", index=idx, state="up")


class NetlinkLink(ShapedLink):
    """:class:`ShapedLink` of :class:`NetlinkIntf` ends whose veth pair is made and deleted
    over netlink (module docstring)."""

    intf_class = NetlinkIntf

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None, deleteIntfs=True):
        peer = {"ifname": intfname2, "net_ns_pid": int(node2.pid)}
        if addr2:
            peer["address"] = addr2
        extra = {"address": addr1} if addr1 else {}
        with IPRoute() as ipr:
            ipr.link("add", ifname=intfname1, kind="veth", net_ns_pid=int(node1.pid), peer=peer, **extra)

    def delete(self, ipr=None):
        """Delete the pair from its end in this namespace through ``ipr`` (an ``IPRoute``
        here; None: one of its own), else from its first end in that node's namespace;
        idempotent."""
        if self.intf1 is None:
            return
        ends = [self.intf1, self.intf2]
        here = [i for i in ends if not i.node.inNamespace]
        try:
            if here:
                if ipr is None:
                    with IPRoute() as own:
                        delete_link(own, here[0].name)
                else:
                    delete_link(ipr, here[0].name)
            else:
                with netns_route(self.intf1.node.pid) as ns:
                    delete_link(ns, self.intf1.name)
        except OSError:  # the node is gone, and its end with it
            pass
        for intf in ends:
            intf.node.delIntf(intf)
            intf.link = None
        self.intf1 = self.intf2 = None


class NetlinkHost(Host):
    """Mininet's ``Host`` whose MAC, address and ``lo`` are set by :func:`configure`."""

    lo_up = True

    def config(self, mac=None, ip=None, defaultRoute=None, lo="up", **_params):
        r = {}
        self.setParam(r, "setMAC", mac=mac)
        self.setParam(r, "setIP", ip=ip)
        self.setParam(r, "setDefaultRoute", defaultRoute=defaultRoute)
        self.lo_up = lo == "up"
        return r


class NetlinkBridge(LinuxBridge):
    """Mininet's ``LinuxBridge`` made over netlink (same kernel defaults as ``brctl addbr``:
    no STP); with ``stp`` it is Mininet's."""

    def start(self, _controllers):
        if self.stp:
            return super().start(_controllers)
        with IPRoute() as ipr:
            delete_link(ipr, self.name, bridge=True)  # as Mininet's 'brctl delbr' of a stale one
            ipr.link("add", ifname=self.name, kind="bridge")
            idx = ipr.link_lookup(ifname=self.name)[0]
            for intf in self.intfList():
                if self.name in intf.name:
                    port = ipr.link_lookup(ifname=intf.name)
                    if not port:
                        raise TestbedError(f"bridge {self.name}: no port {intf.name}")
                    ipr.link("set", index=port[0], master=idx)
            ipr.link("set", index=idx, state="up")
        return None

    def stop(self, deleteIntfs=True):
        if self.stp:
            return super().stop(deleteIntfs)
        with IPRoute() as ipr:
            delete_link(ipr, self.name, bridge=True)
        return Switch.stop(self, deleteIntfs)


def configure(nodes) -> None:
    """Apply what Mininet recorded on the :class:`NetlinkIntf` interfaces of ``nodes`` (and
    ``lo`` of each :class:`NetlinkHost`): one ``IPRoute`` per node's namespace (this one for a
    node outside any), then each node's ``ethtool`` and netem commands as one command line
    per node, every node's at once.

    Raises:
        TestbedError: an interface is missing, or a node's command printed an error (its
            output is in the message); NetlinkError: the kernel refused a setting.
    """
    shell = {}
    for node in nodes:
        intfs = [i for i in node.intfList() if isinstance(i, NetlinkIntf) and i.pending is not None]
        if not intfs and not isinstance(node, NetlinkHost):
            continue
        with netns_route(node.pid if node.inNamespace else None) as ipr:
            if isinstance(node, NetlinkHost) and node.lo_up:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            for intf in intfs:
                intf.apply(ipr)
        shell[node] = "; ".join(
            c for i in intfs for c in (i.pending["ethtool"] + " >/dev/null 2>&1", i.netem_command()) if c
        )
        for intf in intfs:
            intf.pending = None
    bad = {n: out.strip() for n, out in run_on_nodes(shell).items() if out.strip()}
    if bad:
        raise TestbedError(
            "configuring the interfaces failed: " + "; ".join(f"{n.name}: {out}" for n, out in bad.items())
        )
