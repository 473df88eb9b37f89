"""Mininet nodes and links on other machines, through Mininet's own cluster
support (``mininet/examples/cluster.py``: ``RemoteMixin``, ``RemoteLink``).

    host = RemoteHost("h5", machine=m)          # a Mininet Host whose shell runs on m, over SSH
    tor = RemoteBridge("tor2", machine=m)       # a Linux-bridge switch on m
    ClusterLink(tor, core, bw=...)              # veth on one machine, a tunnel between two

What is ours and why, on top of Mininet's classes:

* :class:`OnMachine` logs in with the cluster spec's SSH options (port, key, known-hosts
  file; ``BatchMode``) as ``root`` directly: Mininet wraps every command in ``sudo``, which a
  fresh machine may lack and root does not need.
* :class:`RemoteBridge`: Mininet ships remote Open vSwitch only; the testbed's switches are
  Linux bridges (``mininet.nodelib.LinuxBridge``), so this is that class through
  ``RemoteMixin``.
* :class:`ClusterLink`: within a machine a veth pair, as Mininet's ``RemoteLink`` makes it;
  between machines a tunnel of the kind the spec asks: ``gre`` (``gretap``, exactly what
  Mininet's ``RemoteGRELink`` creates) or ``vxlan`` (the same commands with a VXLAN device,
  for kernels built without GRE, such as this project's CI machine). Both ends carry
  :class:`testbed.shaping.ShapedIntf` (htb), like every other link. Either tunnel costs
  50 bytes or less of each frame, so every interface of a cluster run gets
  :data:`TUNNEL_MTU` (1,450 bytes, Mininet's choice for GRE).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

from mininet.examples.cluster import RemoteLink, RemoteMixin
from mininet.link import Link
from mininet.net import Mininet
from mininet.node import Host
from mininet.nodelib import LinuxBridge

from common.errors import TestbedError
from testbed.interrupts import deferred_signals
from testbed.network import Network
from testbed.shaping import SERVE, RemoteLinkShaper, ShapedIntf
from topologies.placement import place_racks
from traffic.rundir import write_json

__all__ = [
    "TUNNEL_MTU",
    "VXLAN_PORT",
    "ClusterLink",
    "ClusterNetwork",
    "OnMachine",
    "RemoteBridge",
    "RemoteHost",
    "tunnel_command",
]

#: the MTU of every interface of a cluster run: a GRE tunnel adds 38 bytes to a frame (outer
#: IPv4 20, GRE with key 8, inner Ethernet 14 - 4), VXLAN 50 (IPv4 20, UDP 8, VXLAN 8, inner
#: Ethernet 14); 1,450 fits both in a 1,500-byte path (Mininet's RemoteGRELink uses 1,450)
TUNNEL_MTU = 1450
#: how long teardown waits for the node shells of a machine to end before it kills them, s
SHELL_EXIT_S = 3.0
#: the UDP port of VXLAN tunnels (IANA's, RFC 7348)
VXLAN_PORT = 4789


class OnMachine(RemoteMixin):
    """Mininet's ``RemoteMixin`` with the cluster's SSH options and without ``sudo``.

    Args:
        name: the node's name.
        machine: a :class:`testbed.cluster.Machine` (address, user, port, key files).
        **params: the node class's parameters.
    """

    def __init__(self, name, machine=None, **params):
        if machine is None:
            raise TestbedError(f"node {name}: a remote node needs its machine")
        self.machine = machine
        super().__init__(name, server=machine.addr, user=machine.user, serverIP=machine.addr, **params)

    def startShell(self, *args, **kwargs):
        # RemoteMixin set sshcmd to 'sudo -E -u <user> ssh ...'; log in directly instead
        self.sshcmd = self.machine.ssh_options() + ["-q", "-tt", self.machine.dest]
        super().startShell(*args, **kwargs)

    def _popen(self, cmd, sudo=True, tt=True, **params):
        return super()._popen(cmd, sudo=False, tt=tt, **params)

    @staticmethod
    def _ignoreSignal():
        """In the SSH client before it runs: a process group of its own (Mininet's, so that a
        Ctrl-C to the harness does not reach it), and SIGHUP at its default. Mininet stops a
        node by sending its shell SIGHUP and waiting for it; ssh keeps ignoring SIGHUP when it
        inherits it ignored, as under ``nohup``, and the wait would never end."""
        os.setpgrp()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    def rcmd(self, *cmd, **opts) -> str:
        """Run a shell command on the node's machine in its root namespace; its output."""
        r = self.machine.run(" ".join(str(c) for c in cmd))
        return (r.stdout or "") + (r.stderr or "")


class RemoteHost(OnMachine, Host):
    """A Mininet host (its own network namespace) on another machine."""

    def popen(self, *args, **kwargs):
        """``Node.popen`` over SSH, attached to the host's namespace with ``mnexec -a`` but
        without ``-d``: as the session's leader ``mnexec -d`` forks and its parent exits 0 at
        once, so SSH would report 0 whatever the command's exit status (there is no terminal
        to detach from)."""
        kwargs.setdefault("mncmd", ["mnexec", "-a", str(self.pid)])
        return super().popen(*args, **kwargs)


class RemoteBridge(OnMachine, LinuxBridge):
    """A Linux-bridge switch (``mininet.nodelib.LinuxBridge``, no controller) on another machine."""


def tunnel_command(kind: str, name: str, local: str, remote: str, key: int) -> str:
    """The ``ip link`` command that creates one end of a tunnel carrying Ethernet frames.

    Args:
        kind: ``gre`` (a ``gretap`` device, as Mininet's ``RemoteGRELink``) or ``vxlan``.
        name: the interface's name (the link end's Mininet name, e.g. ``core1-eth2``).
        local, remote: this machine's and the other machine's IPv4 addresses.
        key: the tunnel's key (GRE key or VXLAN id), the same at both ends, one per tunnel.

    Raises:
        TestbedError: an unknown kind.
    """
    if kind == "gre":
        return f"ip link add name {name} type gretap local {local} remote {remote} ttl 64 key {key}"
    if kind == "vxlan":
        return f"ip link add name {name} type vxlan id {key} local {local} remote {remote} dstport {VXLAN_PORT}"
    raise TestbedError(f"tunnel kind {kind!r}: 'gre' or 'vxlan'")


class ClusterLink(RemoteLink):
    """A link shaped on both ends (:class:`~testbed.shaping.ShapedIntf`): a veth pair when
    both nodes are on one machine, else a tunnel of kind ``tunnel`` between their machines.

    Args:
        node1, node2: Mininet nodes (:class:`OnMachine` ones, or local ones).
        tunnel: ``gre`` or ``vxlan`` (see :func:`tunnel_command`).
        key: the tunnel's key, unique among the run's tunnels.
        **params: the shaping parameters (bw, max_queue_size ...), both ends alike.

    Raises:
        TestbedError: the tunnel could not be made (the machine's message is included).
    """

    def __init__(
        self,
        node1,
        node2,
        port1=None,
        port2=None,
        intfName1=None,
        intfName2=None,
        addr1=None,
        addr2=None,
        tunnel: str = "gre",
        key: int = 1,
        **params,
    ):
        self.tunnel_kind, self.key = tunnel, key
        RemoteLink.__init__(
            self,
            node1,
            node2,
            port1=port1,
            port2=port2,
            intfName1=intfName1,
            intfName2=intfName2,
            cls1=ShapedIntf,
            cls2=ShapedIntf,
            addr1=addr1,
            addr2=addr2,
            params1=dict(params),
            params2=dict(params),
        )

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None, deleteIntfs=True):
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        if _machine(node1) == _machine(node2):
            return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2, deleteIntfs=deleteIntfs)
        ends = ((node1, intfname1, addr1, node2), (node2, intfname2, addr2, node1))
        for node, name, addr, other in ends:
            if not _IFNAME.fullmatch(name):
                raise TestbedError(f"interface name {name!r} is not a valid Linux interface name")
            cmd = tunnel_command(self.tunnel_kind, name, node.serverIP, other.serverIP, self.key)
            cmd += f" && ip link set dev {name} mtu {TUNNEL_MTU}"
            if addr:
                cmd += f" && ip link set dev {name} address {shlex.quote(addr)}"
            cmd += f" && ip link set dev {name} up"
            if node.inNamespace:  # a host: its end goes into the host's namespace
                cmd += f" && ip link set dev {name} netns {int(node.pid)}"
            out = node.rcmd(cmd).strip()
            if out:
                raise TestbedError(f"cannot make the {self.tunnel_kind} tunnel end {name} on {node.server}: {out}")
        self.tunnel = 1  # RemoteLink.stop then deletes both ends, each on its machine
        return None

    def stop(self):
        # each end is deleted on its own machine (Intf.delete runs in the node's shell)
        for intf in (self.intf1, self.intf2):
            if intf is not None:
                try:
                    intf.delete()
                except Exception:  # noqa: BLE001 -- the ledger sweep removes what is left
                    pass
        self.intf1 = self.intf2 = None
        self.tunnel = None


_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")


def _machine(node) -> str:
    return getattr(node, "server", "localhost")


class _ClusterMininet(Mininet):
    """Mininet whose nodes live on other machines: each node shell is recorded in the ledger
    twice, its SSH client here and its shell's pid on its machine."""

    def __init__(self, *a, ledger, **kw):
        self._ledger = ledger
        super().__init__(*a, **kw)

    def _record(self, node) -> None:
        self._ledger.add_pid(f"ssh:{node.name}", node.shell.pid)
        self._ledger.add_remote_pid(node.server, f"shell:{node.name}", node.pid)

    def addHost(self, name, cls=None, **params):
        with deferred_signals():
            host = super().addHost(name, cls=cls, **params)
            self._record(host)
        return host

    def addSwitch(self, name, cls=None, **params):
        with deferred_signals():
            switch = super().addSwitch(name, cls=cls, **params)
            self._record(switch)
        return switch


class ClusterNetwork(Network):
    """:class:`testbed.network.Network` with its racks spread over machines.

    Every node runs on the machine :func:`topologies.placement.place_racks` gives it (whole
    racks per machine, the core on the first), reached over SSH as Mininet's cluster support
    does; the uplinks between machines are tunnels (:class:`ClusterLink`); every interface
    has the MTU min(``topology.mtu_bytes``, :data:`TUNNEL_MTU`). Shaping is read back on each
    machine with the same netlink code (:class:`testbed.shaping.RemoteLinkShaper`, run by
    the project's Python there). The ledger records, per machine, the bridges, interfaces and
    node shells made there and the directory its processes write (``staging``), so that a
    failure anywhere removes everything on every machine.

    Args:
        machines: the cluster's machines (:class:`testbed.cluster.Machine`), the first holds
            the core switch.
        tunnel: ``gre`` or ``vxlan``.
        staging: machine address -> the directory processes there write.
        project_dir: where this project is on the machines.
        (the rest as :class:`~testbed.network.Network`)

    Raises:
        topologies.placement.PlacementError: the racks cannot be placed on the machines.
    """

    def __init__(
        self,
        topology_spec,
        extra_hosts,
        run_dir,
        ledger,
        scale=1.0,
        *,
        machines,
        tunnel="gre",
        staging: dict[str, str] | None = None,
        project_dir: str | None = None,
    ):
        super().__init__(topology_spec, extra_hosts, run_dir, ledger, scale=scale)
        self.spec = self.spec.model_copy(update={"mtu_bytes": min(self.spec.mtu_bytes, TUNNEL_MTU)})
        self.machines = {m.addr: m for m in machines}
        self.where = place_racks(self.topo, [m.addr for m in machines])
        self.tunnel = tunnel
        self.staging = staging or {}
        self.project_dir = project_dir or str(Path(__file__).resolve().parents[1])
        self._keys = itertools.count(1)

    def _prepare(self) -> None:
        by_machine = {a: ([], []) for a in self.machines}
        for n in self.topo.switches():
            by_machine[self.where[n]][0].append(n)
        for n1, n2, info in self.topo.links(withInfo=True):
            by_machine[self.where[n1]][1].append(f"{n1}-eth{info['port1']}")
            by_machine[self.where[n2]][1].append(f"{n2}-eth{info['port2']}")
        for addr, m in self.machines.items():
            self.ledger.add_machine(
                addr,
                m.ssh_options(),
                m.dest,
                self.staging.get(addr, ""),
                bridges=by_machine[addr][0],
                interfaces=by_machine[addr][1],
            )

    def _mininet(self) -> Mininet:
        def host(name, **params):
            return RemoteHost(name, machine=self.machines[self.where[name]], **params)

        def switch(name, **params):
            return RemoteBridge(name, machine=self.machines[self.where[name]], **params)

        def link(node1, node2, intf=None, **params):
            return ClusterLink(node1, node2, tunnel=self.tunnel, key=next(self._keys), **params)

        return _ClusterMininet(
            topo=self.topo,
            host=host,
            switch=switch,
            controller=None,
            link=link,
            autoSetMacs=True,
            build=False,
            waitConnected=False,
            ledger=self.ledger,
        )

    def start(self) -> ClusterNetwork:
        super().start()
        self.topology["cluster"] = {
            "machines": list(self.machines),
            "tunnel": self.tunnel,
            "mtu_bytes": self.spec.mtu_bytes,
            "placement": {n: self.where[n] for n in self.topo.nodes()},
        }
        write_json(self.run_dir / "topology.json", self.topology)
        return self

    def _stopped(self) -> None:
        """Wait up to :data:`SHELL_EXIT_S` for the node shells of each machine to end (Mininet
        hung up their SSH sessions; a shell takes a moment to see its terminal close), so that
        the ledger sweep kills only what would not end."""
        for addr, entry in self.ledger.machines.items():
            pids = " ".join(str(int(p)) for p in entry.get("pids", {}).values())
            if not pids:
                continue
            try:
                self.machines[addr].run(
                    f"for i in $(seq {int(SHELL_EXIT_S * 20)}); do alive=0; for p in {pids}; "
                    f"do kill -0 $p 2>/dev/null && alive=1; done; [ $alive = 0 ] && break; "
                    f"sleep 0.05; done",
                    timeout_s=SHELL_EXIT_S + 10,
                )
            except subprocess.TimeoutExpired:
                pass

    @property
    def shaper(self) -> RemoteLinkShaper:
        """Each link end read and changed on its machine, by the same code run there."""
        return RemoteLinkShaper({h.name: h.pid for h in self.net.hosts}, self.where, self.shaping_call)

    def shaping_call(self, addr: str, query: dict):
        """:func:`testbed.shaping.serve` run on machine ``addr`` by the project's Python there."""
        return self.machines[addr].python(self.project_dir, SERVE, query, timeout_s=60)
