"""Topology builders: Mininet ``Topo`` subclasses for the testbed's datacenters.

``build_topo(spec, extra_hosts)`` turns a :class:`topologies.spec.TopologySpec` and the
hosts a scheme asks for (:class:`topologies.hosts.HostRequest`) into a Topo, a plain graph
that needs no root: the network builds it, and the loopback runner reads its hosts.
"""

from __future__ import annotations

from common.errors import FieldError
from topologies.hosts import HostInfo, HostRequest, hosts_of, uplink_mbps
from topologies.rack import RackTopo
from topologies.rack_core import RackCoreTopo
from topologies.spec import MAX_BRIDGE_PORTS, TopologySpec

TOPOLOGIES = {"rack": RackTopo, "rack_core": RackCoreTopo}


def link_options(spec: TopologySpec) -> dict:
    """Per-link emulation options beyond bandwidth (delay, loss, queue limit) from a spec."""
    opts = {}
    if spec.delay_ms:
        opts["delay"] = f"{float(spec.delay_ms):g}ms"
    if spec.loss_pct:
        opts["loss"] = spec.loss_pct
    if spec.max_queue_packets:
        opts["max_queue_size"] = spec.max_queue_packets
    return opts


def build_topo(spec: TopologySpec, extra_hosts: list[HostRequest] | tuple = ()):
    """A Topo for ``spec`` with the hosts a scheme asked for (``extra_hosts``) in their racks.

    Raises:
        ValueError: a request names a rack the topology does not have.
    """
    for req in extra_hosts:
        if req.rack >= spec.racks:
            raise ValueError(f"{req} asks for rack {req.rack}; the topology has racks 0..{spec.racks - 1}")
    kw = dict(
        racks=spec.racks,
        hosts_per_rack=spec.hosts_per_rack,
        host_bw_mbps=spec.host_bw_mbps,
        extra_hosts=tuple(extra_hosts),
        interfaces_per_host=spec.interfaces_per_host,
        background_hosts_per_rack=spec.background_hosts_per_rack,
        link_opts=link_options(spec),
    )
    if spec.kind == "rack_core":
        return RackCoreTopo(uplink_bw_mbps=spec.uplink_mbps(), **kw)
    return RackTopo(**kw)


def bridge_port_errors(spec: TopologySpec, topo, prefix: str = "topology") -> list[FieldError]:
    """The switches of ``topo`` (:func:`build_topo` of ``spec``, with the scheme's hosts) that
    would have more ports than a Linux bridge takes, :data:`~topologies.spec.MAX_BRIDGE_PORTS`
    (1,023): one port per link. A ToR's links are its hosts' (``hosts_per_rack`` and
    ``background_hosts_per_rack`` hosts, and the scheme's in that rack, each with
    ``interfaces_per_host`` links or more) and its uplink; the core's, one uplink per rack.
    Each error names the field that sizes the switch (``hosts_per_rack``, ``racks``) and the
    others that add to it."""
    ports: dict[str, int] = dict.fromkeys(topo.switches(), 0)
    for a, b in topo.links():
        for node in (a, b):
            if node in ports:
                ports[node] += 1
    over = {sw: n for sw, n in ports.items() if n > MAX_BRIDGE_PORTS}
    limit = (
        f"at most {MAX_BRIDGE_PORTS} ports per switch (a Linux bridge numbers its ports in 10 bits, port 0 "
        f"reserved: BR_MAX_PORTS in net/bridge/br_private.h)"
    )
    out = []
    tors = {sw: n for sw, n in over.items() if topo.nodeInfo(sw).get("role") == "tor"}
    if tors:
        k = spec.interfaces_per_host
        out.append(
            FieldError(
                f"{prefix}.hosts_per_rack",
                spec.hosts_per_rack,
                f"{limit}: "
                + ", ".join(f"{sw} would have {n}" for sw, n in tors.items())
                + f" (one per link: (hosts_per_rack {spec.hosts_per_rack} + background_hosts_per_rack "
                f"{spec.background_hosts_per_rack}) x interfaces_per_host {k}, the scheme's hosts' links "
                f"and the uplink); lower topology.hosts_per_rack, topology.background_hosts_per_rack or "
                f"topology.interfaces_per_host, or spread the hosts over more racks",
            )
        )
    for sw, n in over.items():
        if sw not in tors:
            out.append(
                FieldError(
                    f"{prefix}.racks", spec.racks, f"{limit}: the core {sw} would have {n} (one uplink per rack)"
                )
            )
    return out


__all__ = [
    "RackTopo",
    "RackCoreTopo",
    "TopologySpec",
    "HostInfo",
    "HostRequest",
    "build_topo",
    "bridge_port_errors",
    "hosts_of",
    "uplink_mbps",
    "link_options",
    "TOPOLOGIES",
]
