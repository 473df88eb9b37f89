"""``rack``: N hosts behind one top-of-rack (ToR) switch (Mininet Topo)."""

from __future__ import annotations

from mininet.topo import Topo

from topologies.hosts import HostRequest, host_name, tor_name


class RackTopo(Topo):
    """One or more racks of hosts on ToR switches; ``rack_core`` adds the core.

    Node names come from :mod:`topologies.hosts`: worker hosts ``h1..hN`` numbered across
    racks (rack 0 first), requested hosts (``ps1..``, ``fc1..``) in request order, background
    hosts ``bg1..bgB`` (rack 0 first), switches ``tor1..torR`` (Mininet gives addresses
    10.0.0.1.. in natural name order). Every host carries ``rack`` (from 0) and ``kind``;
    every link carries ``link_class`` (``host`` or ``uplink``), ``rack`` and ``bw_mbps``.

    Args:
        racks: number of racks R (>= 1).
        hosts_per_rack: worker hosts per rack H (>= 1).
        host_bw_mbps: rate of every host link, Mbit/s (after dilation, the real rate).
        extra_hosts: the hosts a scheme asked for (:class:`HostRequest`), each with
            ``max(interfaces_per_host, request.interfaces)`` links to its ToR.
        interfaces_per_host: links from each host to its ToR (>= 1).
        background_hosts_per_rack: hosts per rack that only source/sink background traffic.
        link_opts: extra link parameters for every link (delay, loss, max_queue_size).
    """

    def build(
        self,
        racks: int = 1,
        hosts_per_rack: int = 4,
        host_bw_mbps: float = 100.0,
        extra_hosts: tuple[HostRequest, ...] = (),
        interfaces_per_host: int = 1,
        background_hosts_per_rack: int = 0,
        link_opts: dict | None = None,
        **_,
    ):
        self.link_opts = dict(link_opts or {})
        self.tors = []
        n = 0
        for r in range(racks):
            tor = self.addSwitch(tor_name(r), role="tor", rack=r)
            self.tors.append(tor)
            for _h in range(hosts_per_rack):
                n += 1
                self._add_host(host_name("worker", n), r, "worker", tor, host_bw_mbps, interfaces_per_host)
        numbers: dict[str, int] = {}
        for req in extra_hosts:
            numbers[req.kind] = numbers.get(req.kind, 0) + 1
            self._add_host(
                host_name(req.kind, numbers[req.kind]),
                req.rack,
                req.kind,
                self.tors[req.rack],
                host_bw_mbps,
                max(interfaces_per_host, req.interfaces),
            )
        n = 0
        for r in range(racks):
            for _b in range(background_hosts_per_rack):
                n += 1
                self._add_host(
                    host_name("background", n), r, "background", self.tors[r], host_bw_mbps, interfaces_per_host
                )

    def _add_host(self, name, rack, kind, tor, bw, k):
        self.addHost(name, rack=rack, kind=kind)
        for _ in range(k):
            self.addLink(name, tor, bw=bw, link_class="host", rack=rack, bw_mbps=bw, **self.link_opts)
