"""Build the emulated network of one machine with Mininet, verify its shaping, tear it down.

    with Network(exp.topology, extra_hosts, run_dir, ledger) as net:
        net.hosts["h1"].popen(...)

Switches are Linux bridges (``mininet.nodelib.LinuxBridge``, no controller: Open vSwitch's
kernel datapath is not needed); links are veth pairs shaped on both ends as
:class:`testbed.shaping.ShapedIntf` shapes them (htb). Mininet's classes are those of
:mod:`testbed.netlink_build`, which make the links, addresses, qdiscs and bridges over netlink
in one pass per namespace; what is left for the nodes' shells (routes, sysctls, reading
values back) is one command line per node, every node's at once. After the build, every
shaped interface's htb class is read back over netlink (:meth:`testbed.shaping.LinkShaper.read`) and compared with
the rate asked for (:func:`testbed.shaping.shaping_errors`: htb rate, MTU, netem delay and loss,
queue); a mismatch fails the build. ``topology.json`` records the hosts, switches, links, and
the read-back shaping; ``shaping.json`` the verdict (written before a mismatch fails the build).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mininet.log import setLogLevel
from mininet.net import Mininet
from pyroute2 import IPRoute

from common.errors import MissingRequirement, TestbedError
from testbed.check import kernel_qdiscs
from testbed.interrupts import deferred_signals
from testbed.ledger import Ledger
from testbed.netlink_build import NetlinkBridge, NetlinkHost, NetlinkLink, configure, run_on_nodes
from testbed.shaping import RATE_TOLERANCE, LinkShaper, htb_burst_bytes, link_ends, netem_errors, shaping_errors
from topologies import HostRequest, TopologySpec, build_topo
from traffic.rundir import write_json

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
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        f"--inh-caps={IFACE_CAPS}",
        f"--ambient-caps={IFACE_CAPS}",
        *cmd,
    ]


def nameservers(resolv_conf: str = "/etc/resolv.conf") -> list[str]:
    """IPv4 nameservers of this machine, which every emulated host gets an ``unreachable``
    route to.

    The hosts have no DNS, but they share this machine's ``/etc/resolv.conf``. When its
    nameserver falls inside the hosts' 10.0.0.0/8, a host takes it for a neighbour and each
    lookup waits for ARP replies that never come, which delays every process's
    ``init_process_group`` by seconds (measured: ``docs/scaling.md``). With the route, a
    lookup fails at once, as on a machine without DNS.
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


def read_files(paths: dict) -> dict:
    """Read small files (``/proc/sys``, ``/sys/class/net``) in each node's namespace, one
    command per node, every node's at once: ``paths`` node -> list of paths; returns node ->
    {path: its content, stripped} (a file that cannot be read is left out)."""
    cmds = {n: "grep -H . " + " ".join(ps) + " 2>/dev/null" for n, ps in paths.items() if ps}
    out = {n: {} for n in paths}
    for node, text in run_on_nodes(cmds).items():
        for line in text.splitlines():
            path, sep, value = line.strip().partition(":")
            if sep and path in paths[node]:
                out[node][path] = value.strip()
    return out


def sysctl_path(key: str) -> str:
    """``net.ipv4.tcp_notsent_lowat`` -> ``/proc/sys/net/ipv4/tcp_notsent_lowat``."""
    return "/proc/sys/" + key.replace(".", "/")


class _LedgeredMininet(Mininet):
    """Mininet that records each host shell's pid in the run's ledger as it starts, applies
    the interfaces' settings in batches once every link exists
    (:func:`testbed.netlink_build.configure`), and deletes the links in one pass at stop."""

    def __init__(self, *a, ledger: Ledger, cgroup=None, **kw):
        self._ledger, self._cgroup = ledger, cgroup
        super().__init__(*a, **kw)

    def addHost(self, name, cls=None, **params):
        with deferred_signals():  # the shell is recorded before a Ctrl-C can interrupt
            host = super().addHost(name, cls=cls, **params)
            self._ledger.add_pid(f"host:{name}", host.pid)
            if self._cgroup is not None:  # what the shell runs (a command of node.cmd) is the run's too
                self._cgroup.add(host.pid)
        return host

    def build(self):
        super().build()
        configure(self.hosts + self.switches)

    def stop(self):
        try:
            with IPRoute() as ipr:
                for link in self.links:
                    if isinstance(link, NetlinkLink):
                        link.delete(ipr)
        finally:
            super().stop()


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
            raise MissingRequirement(
                f"'{tool}' not found: install it with 'apt-get install {pkg}' (or run scripts/setup.sh)"
            )
    qdiscs = qdiscs if qdiscs is not None else kernel_qdiscs()
    if not qdiscs.get("htb"):
        raise MissingRequirement(
            "the kernel has no 'htb' qdisc (sch_htb): links cannot be shaped; "
            "use a distribution kernel, e.g. the Vagrant VM (see README)"
        )
    if (topology_spec.delay_ms or topology_spec.loss_pct) and not qdiscs.get("netem"):
        raise MissingRequirement(
            "topology.delay_ms / topology.loss_pct need the 'netem' qdisc, which this "
            "kernel lacks (no sch_netem); set them to 0 or run in the Vagrant VM, "
            "whose full Debian kernel has netem"
        )


class Network:
    """The emulated network of one run (a context manager; teardown always runs).

    ``topology_spec`` is the emulated network; with time dilation ``scale`` the links are
    shaped at rate / scale (:meth:`TopologySpec.dilated`). ``topology.json`` gives each link's emulated
    rate (``bw_mbps``) and the rate shaped on this machine (``shaped_mbps``). ``extra_hosts``
    are the hosts the scheme asked for (``Scheme.hosts``: parameter-server hosts, PBoxes).
    ``cgroup``: the run's :class:`testbed.lifetime.RunCgroup`; each host's shell is moved into
    it as it starts (None: left where it is).

    Attributes after ``start()``:
        net: the ``Mininet`` object; hosts: name -> Mininet host; topology: the
        ``topology.json`` document.
    """

    def __init__(
        self,
        topology_spec: TopologySpec,
        extra_hosts: list[HostRequest],
        run_dir: Path,
        ledger: Ledger,
        scale: float = 1.0,
        cgroup=None,
    ):
        self.emulated = topology_spec
        self.cgroup = cgroup
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
        return _LedgeredMininet(
            topo=self.topo,
            host=NetlinkHost,
            switch=NetlinkBridge,
            controller=None,
            link=NetlinkLink,
            autoSetMacs=True,
            build=False,
            waitConnected=False,
            ledger=self.ledger,
            cgroup=self.cgroup,
        )

    def start(self) -> Network:
        self._prepare()
        setLogLevel("error")
        self.net = self._mininet()
        self.net.build()
        self.net.start()
        self.hosts = {h.name: h for h in self.net.hosts}
        for h in self.net.hosts:
            self._configure_extra_interfaces(h)
        if self.spec.mtu_bytes != 1500:
            self._set_mtu(self.spec.mtu_bytes)
        # a host never routes: a new namespace inherits IPv4 forwarding from the machine's own
        # (on where libvirt or Docker runs), and a forwarding host answers a frame for another
        # address with a redirect and forwards it, traffic that no emulated host would send
        sysctls = {
            "net.ipv4.ip_forward": 0,
            "net.ipv4.tcp_slow_start_after_idle": int(self.spec.tcp_slow_start_after_idle),
        }
        if self.spec.tcp_notsent_lowat_bytes is not None:
            sysctls["net.ipv4.tcp_notsent_lowat"] = int(self.spec.tcp_notsent_lowat_bytes)
        if self.spec.tcp_min_tso_segs is not None:
            sysctls["net.ipv4.tcp_min_tso_segs"] = int(self.spec.tcp_min_tso_segs)
        self._configure_hosts(nameservers(), sysctls)
        if self.spec.tcp_congestion_control is not None or self.spec.tcp_rto_min_ms is not None:
            self._set_route_options(self.spec.tcp_congestion_control, self.spec.tcp_rto_min_ms)
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

    def _configure_hosts(self, unreachable: list[str], sysctls: dict[str, int]) -> None:
        """In every host's namespace, one command line each, all at once: an ``unreachable``
        route to each of ``unreachable`` (:func:`nameservers`), and the namespaced sysctls
        ``sysctls`` (key -> value), read back.

        Raises:
            TestbedError: the kernel did not take a value.
        """
        line = "; ".join(
            [f"ip route add unreachable {ns}/32" for ns in unreachable]
            + ["sysctl -qw " + " ".join(f"{k}={v}" for k, v in sysctls.items())]
        )
        run_on_nodes({h: line for h in self.net.hosts})
        got = read_files({h: [sysctl_path(k) for k in sysctls] for h in self.net.hosts})
        for h in self.net.hosts:
            for key, value in sysctls.items():
                have = got[h].get(sysctl_path(key))
                if have != str(value):
                    raise TestbedError(f"cannot set {key}={value} on {h.name} (kernel has {have!r})")

    def _set_route_options(self, cc: str | None, rto_min_ms: float | None) -> None:
        """Select congestion control ``cc`` and the least retransmission timeout ``rto_min_ms``
        (real ms, whole; iproute2 locks it, so that it overrides the kernel's) on every IPv4
        unicast route of every host, in every routing table (``ip route ... congctl ... rto_min``; a
        connection takes both from its route, which a namespace may do even for a congestion
        control its sysctl does not allow), one command line per host, all at once; read back.
        Each route is deleted and appended again with them, in their order, which leaves them
        in that order: ``ip route replace`` would overwrite the first of two routes to one
        prefix (a host with several interfaces has one per interface). None leaves an option
        out.

        Raises:
            TestbedError: a host has a route without them afterwards (the route is named).
        """
        routes = (
            r"ip -4 -o route show table all | grep -Ev '^(unreachable|local|broadcast|multicast|blackhole|"
            r"prohibit|throw) '"
        )
        options = {}  # what ip route is given -> what it shows of it afterwards
        if cc is not None:
            options[f"congctl {cc}"] = f" congctl {cc}"
        if rto_min_ms is not None:
            options[f"rto_min {round(rto_min_ms)}ms"] = " rto_min lock "
        lacking = " || ".join(f'index($0, "{shown}") == 0' for shown in options.values())
        line = (
            f"{routes} | while read -r r; do ip route del $r && ip route append $r {' '.join(options)}; done; "
            f"{routes} | awk '{lacking}'"
        )
        for host, out in run_on_nodes({h: line for h in self.net.hosts}).items():
            if out.strip():
                raise TestbedError(f"cannot set {' '.join(options)} on the routes of {host.name}: {out.strip()}")

    def _set_mtu(self, mtu: int) -> None:
        """Set ``mtu`` on both ends of every link (bridges follow their ports' MTU), one
        command line per node, all at once.

        Raises:
            TestbedError: a node's ``ip`` refused (its message is included).
        """
        cmds: dict = {}
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                cmds.setdefault(intf.node, []).append(f"ip link set dev {intf.name} mtu {mtu}")
        for node, out in run_on_nodes({n: "; ".join(c) for n, c in cmds.items()}).items():
            if out.strip():
                raise TestbedError(f"cannot set MTU {mtu} on the interfaces of {node.name}: {out.strip()}")

    def _describe(self) -> dict:
        tcp = [
            sysctl_path("net.ipv4.tcp_notsent_lowat"),
            sysctl_path("net.ipv4.tcp_slow_start_after_idle"),
            sysctl_path("net.ipv4.tcp_min_tso_segs"),
            sysctl_path("net.ipv4.tcp_congestion_control"),
        ]
        paths: dict = {h: list(tcp) for h in self.net.hosts}
        for link in self.net.links:
            for i in (link.intf1, link.intf2):
                paths.setdefault(i.node, []).append(f"/sys/class/net/{i.name}/mtu")
        got = read_files(paths)

        def number(node, path, missing):
            return int(got[node].get(path) or missing)

        hosts = []
        for h in self.net.hosts:
            hosts.append(
                {
                    "name": h.name,
                    "rack": h.params.get("rack"),
                    "kind": h.params.get("kind"),
                    "ip": h.IP(),
                    "pid": h.pid,
                    "tcp_notsent_lowat": number(h, tcp[0], -1),
                    "tcp_slow_start_after_idle": number(h, tcp[1], -1),
                    "tcp_min_tso_segs": number(h, tcp[2], -1),
                    # its routes' (set_congestion_control) or else the namespace's default
                    "tcp_congestion_control": self.spec.tcp_congestion_control or got[h].get(tcp[3]),
                    "intfs": [{"name": i.name, "ip": i.IP()} for i in h.intfList()],
                }
            )
        switches = [
            {"name": s.name, "role": s.params.get("role"), "rack": s.params.get("rack")} for s in self.net.switches
        ]
        links = []
        for link in self.net.links:
            p = link.intf1.params
            links.append(
                {
                    "class": p.get("link_class"),
                    "rack": p.get("rack"),
                    "bw_mbps": p.get("bw_mbps") * self.scale,
                    "shaped_mbps": p.get("bw_mbps"),
                    "node1": link.intf1.node.name,
                    "intf1": link.intf1.name,
                    "node2": link.intf2.node.name,
                    "intf2": link.intf2.name,
                    "delay_ms": self.emulated.delay_ms,
                    "shaped_delay_ms": self.spec.delay_ms,
                    "loss_pct": self.spec.loss_pct,
                    "max_queue_packets": self.spec.max_queue_packets,
                    "mtu_bytes": [number(i.node, f"/sys/class/net/{i.name}/mtu", 0) for i in (link.intf1, link.intf2)],
                    "htb_burst_bytes": htb_burst_bytes(p.get("bw_mbps")),
                    "shaping": {},
                }
            )
        doc = {
            "kind": self.spec.kind,
            "spec": self.emulated.model_dump(),
            "scale": self.scale,
            "uplink_bw_mbps": self.emulated.uplink_mbps() if self.spec.kind == "rack_core" else None,
            "hosts": hosts,
            "switches": switches,
            "links": links,
        }
        return doc

    @property
    def shaper(self) -> LinkShaper:
        """What reads and changes the shaping of this network's links (:mod:`testbed.shaping`)."""
        return LinkShaper({h.name: h.pid for h in self.net.hosts})

    def _verify_shaping(self) -> None:
        """Read back every link end's qdisc, htb rate and netem delay and loss; record them in
        each link's ``shaping`` and the verdict in ``shaping.json`` (format in
        :mod:`traffic.rundir`); fail on a mismatch.

        Raises:
            TestbedError: an interface has no htb root, a rate off by more than 1%, or a delay
                or loss other than asked.
        """
        links = self.topology["links"]
        shaping = self.shaper.read(link_ends(links))
        bad, netem_bad = [], []
        for link in links:
            link["shaping"] = {link[f"intf{e}"]: shaping[link[f"intf{e}"]] for e in ("1", "2")}
            bad += shaping_errors(link, shaping, self.spec.mtu_bytes, self.spec.max_queue_packets)
            netem_bad += netem_errors(link, shaping)
        write_json(
            self.run_dir / "shaping.json",
            {
                "ends": len(shaping),
                "rate_tolerance": RATE_TOLERANCE,
                "errors": bad,
                "netem": {
                    "available": kernel_qdiscs().get("netem", False),
                    "delay_ms": self.spec.delay_ms,
                    "loss_pct": self.spec.loss_pct,
                    "ends": sum(1 for v in shaping.values() if v.get("leaf") == "netem"),
                    "errors": netem_bad,
                },
            },
        )
        if bad:
            raise TestbedError("links are not shaped as asked (so results would be wrong):\n  " + "\n  ".join(bad))

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
