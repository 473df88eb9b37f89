"""Build the emulated network with Mininet, shape it with htb, verify the shaping, tear down.

    with Network(exp.topology, extra_hosts, run_dir, ledger) as net:
        net.hosts["h1"].popen(...)

Switches are Linux bridges (``mininet.nodelib.LinuxBridge``, no controller: Open vSwitch's
kernel datapath is not needed); links are veth pairs shaped on both ends by
:class:`ShapedIntf` (htb; see its docstring for what differs from Mininet's ``TCIntf``).
After the build, every shaped interface's htb class is read back over netlink (pyroute2) and
compared with the rate asked for; a mismatch fails the build. ``topology.json`` records the
hosts, switches, links, and the read-back shaping.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from mininet.link import Link, TCIntf
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.nodelib import LinuxBridge
from pyroute2 import IPRoute, NetNS

from common.errors import MissingRequirement, TestbedError
from testbed.interrupts import deferred_signals
from testbed.ledger import Ledger
from traffic.rundir import write_json
from testbed.check import kernel_qdiscs
from topologies import HostRequest, TopologySpec, build_topo

#: Highest rate we shape, Mbit/s. Above it a veth pair on one CPU cannot keep up anyway.
MAX_RATE_MBPS = 40_000.0
#: Rate read back must be within this fraction of the rate asked for (tc rounds rates).
RATE_TOLERANCE = 0.01
#: htb class quantum, bytes (>= one MTU-sized frame, below htb's 200 kB warning limit).
HTB_QUANTUM_BYTES = 60_000
#: A process bound to interface i >= 1 of a host with several interfaces runs as uid
#: IFACE_UID_BASE + i; a policy rule routes that uid's sockets out of interface i
#: (see :meth:`Network._configure_extra_interfaces`). Far above any real account.
IFACE_UID_BASE = 4_200_000_000
#: Capabilities such a process keeps: it writes into the root-owned run directory.
IFACE_CAPS = "+dac_override,+dac_read_search,+fowner"


def iface_uid(index: int) -> int:
    """The uid whose sockets a multi-interface host routes out of its interface ``index``
    (>= 1)."""
    return IFACE_UID_BASE + index


def bind_to_interface(cmd: list[str], index: int) -> list[str]:
    """``cmd`` made to send every packet from interface ``index`` of its host.

    Index 0 (the host's main interface, which the main routing table uses): ``cmd``
    unchanged. Index i >= 1: ``cmd`` run by ``setpriv`` as uid :func:`iface_uid` (i), which
    keeps the capabilities :data:`IFACE_CAPS` (so files it creates belong to that uid).
    Binding a listening socket to the interface's address (``GLOO_SOCKET_IFNAME``) is not
    enough: gloo opens a pair's connection from the peer with the greater address without
    binding it, so the kernel would pick the main interface's address and route.
    """
    if index == 0:
        return list(cmd)
    uid = iface_uid(index)
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", f"--inh-caps={IFACE_CAPS}",
            f"--ambient-caps={IFACE_CAPS}", *cmd]


def nameservers(resolv_conf: str = "/etc/resolv.conf") -> list[str]:
    """IPv4 nameservers of this machine, which every emulated host gets an ``unreachable``
    route to.

    The hosts have no DNS, but they share this machine's ``/etc/resolv.conf``. When its
    nameserver falls inside the hosts' 10.0.0.0/8, a host takes it for a neighbour and each
    lookup waits for ARP replies that never come: measured on this machine (nameserver
    10.255.255.53), a reverse lookup of 10.0.0.1 or an AAAA lookup of the machine's name took
    6.1 s, and every process's ``init_process_group`` in a Mininet host took 6.2 s against
    0.5 s on loopback. With the route, a lookup fails at once, as on a machine without DNS.
    """
    try:
        text = Path(resolv_conf).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and parts[1].count(".") == 3:
            out.append(parts[1])
    return out


def htb_burst_bytes(bw_mbps: float) -> int:
    """htb burst (and cburst) for a rate: max(15 kB, 1 ms worth of bytes at the rate).

    Mininet fixes burst at 15 kB, which at 10 Gbit/s is 12 us of tokens: htb's timer cannot
    refill that often, so the link runs well below its rate. One millisecond of tokens keeps
    htb on rate at any speed while bounding the burst to what one timer tick sends.
    """
    return max(15_000, int(bw_mbps * 1e6 / 8 * 1e-3))


class ShapedIntf(TCIntf):
    """Mininet ``TCIntf`` that shapes every rate it is given, or refuses it.

    Differences from ``TCIntf``: rates up to :data:`MAX_RATE_MBPS` are accepted (stock
    ``TCIntf`` silently leaves a link unshaped above ``bwParamMax`` = 1000 Mbit/s); burst is
    :func:`htb_burst_bytes`; a queue limit without delay or loss uses a ``pfifo`` leaf
    (``netem`` is not available on every kernel); a rate out of range raises instead of
    logging.
    """

    bwParamMax = MAX_RATE_MBPS

    def bwCmds(self, bw=None, **_):
        if bw is None:
            return [], " root "
        if not 0 < bw <= MAX_RATE_MBPS:
            raise TestbedError(f"link rate {bw} Mbit/s is outside (0, {MAX_RATE_MBPS:.0f}] Mbit/s")
        burst = htb_burst_bytes(bw)
        # an explicit quantum: htb's default (rate / r2q) exceeds its 200 kB limit above
        # 16 Mbit/s and the kernel warns; with one class the quantum has no other effect
        return ["%s qdisc add dev %s root handle 5:0 htb default 1",
                "%s class add dev %s parent 5:0 classid 5:1 htb " +
                f"rate {bw}Mbit burst {burst} cburst {burst} quantum {HTB_QUANTUM_BYTES}"], " parent 5:1 "

    @staticmethod
    def delayCmds(parent, delay=None, jitter=None, loss=None, max_queue_size=None):
        if delay or jitter or loss:
            return TCIntf.delayCmds(parent, delay=delay, jitter=jitter, loss=loss,
                                    max_queue_size=max_queue_size)
        if max_queue_size:
            return ["%s qdisc add dev %s " + parent + f" handle 10: pfifo limit {int(max_queue_size)}"], " parent 10:1 "
        return [], parent


class ShapedLink(Link):
    """A veth pair shaped identically on both ends with :class:`ShapedIntf`."""

    def __init__(self, node1, node2, port1=None, port2=None, intfName1=None, intfName2=None,
                 addr1=None, addr2=None, **params):
        Link.__init__(self, node1, node2, port1=port1, port2=port2, intfName1=intfName1,
                      intfName2=intfName2, cls1=ShapedIntf, cls2=ShapedIntf, addr1=addr1,
                      addr2=addr2, params1=params, params2=params)


class _LedgeredMininet(Mininet):
    """Mininet that records each host shell's pid in the run's ledger as it starts."""

    def __init__(self, *a, ledger: Ledger, **kw):
        self._ledger = ledger
        super().__init__(*a, **kw)

    def addHost(self, name, cls=None, **params):
        with deferred_signals():  # the shell is recorded before a Ctrl-C can interrupt
            host = super().addHost(name, cls=cls, **params)
            self._ledger.add_pid(f"host:{name}", host.pid)
        return host


def preflight(topology_spec, qdiscs: dict[str, bool] | None = None) -> None:
    """Refuse before anything is built if the machine cannot emulate what the spec asks.

    Raises:
        MissingRequirement: not root, no ``mnexec``/``brctl``/``tc``, or a qdisc the spec
            needs (htb always; netem for delay or loss) is missing from the kernel.
    """
    if os.geteuid() != 0:
        raise MissingRequirement("building a network needs root (network namespaces): run with sudo")
    for tool, pkg in (("mnexec", "mininet"), ("brctl", "bridge-utils"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            raise MissingRequirement(f"'{tool}' not found: install it with 'apt-get install {pkg}' "
                                     f"(or run scripts/setup.sh)")
    qdiscs = qdiscs if qdiscs is not None else kernel_qdiscs()
    if not qdiscs.get("htb"):
        raise MissingRequirement("the kernel has no 'htb' qdisc (sch_htb): links cannot be shaped; "
                                 "use a distribution kernel, e.g. the Vagrant VM (see README)")
    if (topology_spec.delay_ms or topology_spec.loss_pct) and not qdiscs.get("netem"):
        raise MissingRequirement("topology.delay_ms / topology.loss_pct need the 'netem' qdisc, which this "
                                 "kernel lacks (no sch_netem); set them to 0 or run in the Vagrant VM, "
                                 "whose full Debian kernel has netem")


class Network:
    """The emulated network of one run (a context manager; teardown always runs).

    ``topology_spec`` is the emulated network; with time dilation ``scale`` the links are
    shaped at rate / scale (:meth:`TopologySpec.dilated`). ``topology.json`` gives each link's emulated
    rate (``bw_mbps``) and the rate shaped on this machine (``shaped_mbps``). ``extra_hosts``
    are the hosts the scheme asked for (``Scheme.hosts``: parameter-server hosts, PBoxes).

    Attributes after ``start()``:
        net: the ``Mininet`` object; hosts: name -> Mininet host; topology: the
        ``topology.json`` document.
    """

    def __init__(self, topology_spec: TopologySpec, extra_hosts: list[HostRequest], run_dir: Path, ledger: Ledger,
                 scale: float = 1.0):
        self.emulated = topology_spec
        self.scale = scale
        self.spec = topology_spec.dilated(scale)
        self.run_dir = Path(run_dir)
        self.ledger = ledger
        self.net: Mininet | None = None
        self.topo = build_topo(self.spec, extra_hosts)
        self.topology: dict = {}

    # ----------------------------------------------------------------------- build

    def planned_names(self) -> tuple[list[str], list[str]]:
        """(bridges, interfaces) this network will create, derived from the Topo's ports."""
        bridges = list(self.topo.switches())
        intfs = []
        for n1, n2, info in self.topo.links(withInfo=True):
            intfs += [f"{n1}-eth{info['port1']}", f"{n2}-eth{info['port2']}"]
        return bridges, intfs

    def _prepare(self) -> None:
        """Check the machine and record in the ledger what the build will make."""
        preflight(self.spec)
        bridges, intfs = self.planned_names()
        self.ledger.add_bridges(bridges)
        self.ledger.add_interfaces(intfs)

    def _mininet(self) -> Mininet:
        """The (not yet built) Mininet of this network."""
        return _LedgeredMininet(topo=self.topo, switch=LinuxBridge, controller=None, link=ShapedLink,
                                autoSetMacs=True, build=False, waitConnected=False, ledger=self.ledger)

    def start(self) -> "Network":
        self._prepare()
        setLogLevel("error")
        self.net = self._mininet()
        self.net.build()
        self.net.start()
        self.hosts = {h.name: h for h in self.net.hosts}
        unreachable = nameservers()
        for h in self.net.hosts:
            self._configure_extra_interfaces(h)
            for ns in unreachable:
                h.cmd(f"ip route add unreachable {ns}/32")
        if self.spec.mtu_bytes != 1500:
            self._set_mtu(self.spec.mtu_bytes)
        if self.spec.tcp_notsent_lowat_bytes is not None:
            self._set_notsent_lowat(self.spec.tcp_notsent_lowat_bytes)
        self.topology = self._describe()
        self._verify_shaping()
        write_json(self.run_dir / "topology.json", self.topology)
        return self

    def _configure_extra_interfaces(self, host) -> None:
        """Hosts with several interfaces: address each (10.<i>.x.y/8), answer ARP only on
        the interface that owns an address, and route by source so that traffic from an
        interface's address leaves through that interface; sockets of uid
        :func:`iface_uid` (i) (processes started with :func:`bind_to_interface`) are routed
        by interface i whatever their address, so their connections leave from it too."""
        intfs = host.intfList()
        if len(intfs) < 2:
            return
        base = host.IP().split(".")
        host.cmd("sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2")
        for i, intf in enumerate(intfs):
            if i == 0:
                ip = host.IP()
            else:
                ip = f"10.{i}.{base[2]}.{base[3]}"
                intf.setIP(ip, 8)
            table = 100 + i
            host.cmd(f"ip route add 10.0.0.0/8 dev {intf.name} src {ip} table {table}")
            host.cmd(f"ip rule add from {ip} table {table}")
            if i > 0:
                uid = iface_uid(i)
                host.cmd(f"ip rule add uidrange {uid}-{uid} table {table}")

    def _set_notsent_lowat(self, nbytes: int) -> None:
        """Set ``net.ipv4.tcp_notsent_lowat`` in every host's namespace and read it back.

        Raises:
            TestbedError: the kernel did not take the value.
        """
        for h in self.net.hosts:
            h.cmd(f"sysctl -qw net.ipv4.tcp_notsent_lowat={int(nbytes)}")
            got = h.cmd("cat /proc/sys/net/ipv4/tcp_notsent_lowat").strip()
            if got != str(int(nbytes)):
                raise TestbedError(f"cannot set net.ipv4.tcp_notsent_lowat={nbytes} on {h.name} (kernel has {got!r})")

    def _set_mtu(self, mtu: int) -> None:
        """Set ``mtu`` on both ends of every link (bridges follow their ports' MTU)."""
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                out = intf.node.cmd(f"ip link set dev {intf.name} mtu {mtu}")
                if out.strip():
                    raise TestbedError(f"cannot set MTU {mtu} on {intf.name}: {out.strip()}")

    def _describe(self) -> dict:
        hosts = []
        for h in self.net.hosts:
            hosts.append({"name": h.name, "rack": h.params.get("rack"), "kind": h.params.get("kind"),
                          "ip": h.IP(), "pid": h.pid,
                          "tcp_notsent_lowat": int(h.cmd("cat /proc/sys/net/ipv4/tcp_notsent_lowat").strip() or -1),
                          "intfs": [{"name": i.name, "ip": i.IP()} for i in h.intfList()]})
        switches = [{"name": s.name, "role": s.params.get("role"), "rack": s.params.get("rack")}
                    for s in self.net.switches]
        links = []
        for link in self.net.links:
            p = link.intf1.params
            links.append({"class": p.get("link_class"), "rack": p.get("rack"),
                          "bw_mbps": p.get("bw_mbps") * self.scale, "shaped_mbps": p.get("bw_mbps"),
                          "node1": link.intf1.node.name, "intf1": link.intf1.name,
                          "node2": link.intf2.node.name, "intf2": link.intf2.name,
                          "delay_ms": self.emulated.delay_ms, "loss_pct": self.spec.loss_pct,
                          "max_queue_packets": self.spec.max_queue_packets,
                          "mtu_bytes": [int(i.node.cmd(f"cat /sys/class/net/{i.name}/mtu").strip() or 0)
                                        for i in (link.intf1, link.intf2)],
                          "htb_burst_bytes": htb_burst_bytes(p.get("bw_mbps")), "shaping": {}})
        doc = {"kind": self.spec.kind, "spec": self.emulated.model_dump(), "scale": self.scale,
               "uplink_bw_mbps": self.emulated.uplink_mbps() if self.spec.kind == "rack_core" else None,
               "hosts": hosts, "switches": switches, "links": links}
        return doc

    def _verify_shaping(self) -> None:
        """Read back every link end's qdisc and htb rate; record it; fail on a mismatch.

        Raises:
            TestbedError: an interface has no htb root or a rate off by more than 1%.
        """
        ends = [(link[f"node{end}"], link[f"intf{end}"]) for link in self.topology["links"] for end in ("1", "2")]
        shaping = self._read_shaping(ends)
        bad = []
        for link in self.topology["links"]:
            for end in ("1", "2"):
                node, intf = link[f"node{end}"], link[f"intf{end}"]
                got = shaping[(node, intf)]
                link["shaping"][intf] = got
                want = link["shaped_mbps"]
                rate = got.get("rate_mbps")
                if got.get("qdisc") != "htb" or rate is None or abs(rate - want) > RATE_TOLERANCE * want:
                    bad.append(f"{intf}: asked {want} Mbit/s htb, kernel has {got}")
                elif link["mtu_bytes"] != [self.spec.mtu_bytes] * 2:
                    bad.append(f"{intf}: asked MTU {self.spec.mtu_bytes}, kernel has {link['mtu_bytes']}")
                elif self.spec.max_queue_packets and got.get("leaf") not in ("pfifo", "netem"):
                    bad.append(f"{intf}: asked a {self.spec.max_queue_packets}-packet queue, kernel has {got}")
        if bad:
            raise TestbedError("links are not shaped as asked (so results would be wrong):\n  " + "\n  ".join(bad))

    def _read_shaping(self, ends: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        """:func:`read_shaping` of every ``(node, interface)`` end: a host's in its namespace,
        a switch's in the root namespace."""
        by_node = {h.name: h for h in self.net.hosts}
        return dict(zip(ends, read_shaping_many([(by_node[n].pid if n in by_node else None, i) for n, i in ends])))

    # ----------------------------------------------------------------------- teardown

    def stop(self) -> list[str]:
        """Stop Mininet, then remove whatever the ledger lists that is still there.

        Returns:
            what the ledger sweep still had to remove (normally nothing).
        """
        if self.net is not None:
            try:
                self.net.stop()
            except Exception:  # noqa: BLE001 -- the ledger sweep below removes what is left
                pass
            self.net = None
            self._stopped()
        return self.ledger.sweep()

    def _stopped(self) -> None:
        """Called once Mininet has stopped, before the ledger sweep (nothing to do here)."""

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
        return False


def read_shaping_many(ends: list[tuple[int | None, str]]) -> list[dict]:
    """:func:`read_shaping` of each ``(pid, interface)``: the interface in the network
    namespace of process ``pid``, or in this process's namespace when ``pid`` is None."""
    out = []
    with IPRoute() as root_ns:
        for pid, intf in ends:
            if pid is None:
                out.append(read_shaping(root_ns, intf))
            else:
                with NetNS(f"/proc/{int(pid)}/ns/net") as ns:
                    out.append(read_shaping(ns, intf))
    return out


def read_shaping(ipr, ifname: str) -> dict:
    """Root qdisc kind and htb class 5:1 rate (Mbit/s) of an interface, and its leaf qdisc.

    ``ipr``: a pyroute2 ``IPRoute`` or ``NetNS`` for the interface's namespace.
    Returns ``{"qdisc": kind or None, "rate_mbps": float or None, "leaf": kind or None}``.
    """
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return {"qdisc": None, "rate_mbps": None, "leaf": None, "error": "no such interface"}
    idx = idx[0]
    kind = leaf = None
    for q in ipr.get_qdiscs(index=idx):
        if q["parent"] == 0xFFFFFFFF:  # TC_H_ROOT
            kind = q.get_attr("TCA_KIND")
        elif q["parent"] == 0x50001:  # child of class 5:1 (pfifo queue limit or netem)
            leaf = q.get_attr("TCA_KIND")
    rate = None
    if kind == "htb":
        for c in ipr.get_classes(index=idx):
            if c["handle"] == 0x50001:  # class 5:1
                parms = c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
                rate64 = c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_RATE64")
                bps = rate64 if rate64 else parms["rate"]
                rate = bps * 8 / 1e6
    return {"qdisc": kind, "rate_mbps": rate, "leaf": leaf}
