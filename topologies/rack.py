"""``rack``: N hosts behind one top-of-rack (ToR) switch (Mininet Topo)."""
from __future__ import annotations

from mininet.topo import Topo


class RackTopo(Topo):
    """One or more racks of hosts on ToR switches; ``rack_core`` adds the core.

    Node names: hosts ``h1..hN`` numbered across racks (rack 0 first), dedicated server
    hosts ``ps1..psM``, background hosts ``bg1..bgB`` (rack 0 first), switches
    ``tor1..torR`` (Mininet gives addresses 10.0.0.1.. in natural name order: bg, h, ps).
    Every host carries ``rack`` (from 0) and ``kind`` (``worker``, ``server`` or
    ``background``: runs no training process); every link carries ``link_class`` (``host``
    or ``uplink``), ``rack`` and ``bw_mbps``.

    Args:
        racks: number of racks R (>= 1).
        hosts_per_rack: worker hosts per rack H (>= 1).
        host_bw_mbps: rate of every host link, Mbit/s (after dilation, the real rate).
        server_racks: one entry per dedicated server host, giving its rack.
        interfaces_per_host: links from each host to its ToR (>= 1).
        server_interfaces: links from each dedicated server host to its ToR (a PBox has
            k > 1); at least ``interfaces_per_host``.
        background_hosts_per_rack: hosts per rack that only source/sink background traffic.
        link_opts: extra link parameters for every link (delay, loss, max_queue_size).
    """

    def build(self, racks: int = 1, hosts_per_rack: int = 4, host_bw_mbps: float = 100.0,
              server_racks: tuple[int, ...] = (), interfaces_per_host: int = 1,
              server_interfaces: int = 1, background_hosts_per_rack: int = 0,
              link_opts: dict | None = None, **_):
        self.link_opts = dict(link_opts or {})
        self.tors = []
        n = 0
        for r in range(racks):
            tor = self.addSwitch(f"tor{r + 1}", role="tor", rack=r)
            self.tors.append(tor)
            for _h in range(hosts_per_rack):
                n += 1
                self._add_host(f"h{n}", r, "worker", tor, host_bw_mbps, interfaces_per_host)
        for i, r in enumerate(server_racks):
            self._add_host(f"ps{i + 1}", r, "server", self.tors[r], host_bw_mbps,
                           max(interfaces_per_host, server_interfaces))
        n = 0
        for r in range(racks):
            for _b in range(background_hosts_per_rack):
                n += 1
                self._add_host(f"bg{n}", r, "background", self.tors[r], host_bw_mbps, interfaces_per_host)

    def _add_host(self, name, rack, kind, tor, bw, k):
        self.addHost(name, rack=rack, kind=kind)
        for _ in range(k):
            self.addLink(name, tor, bw=bw, link_class="host", rack=rack, bw_mbps=bw, **self.link_opts)
