"""Topology builders: Mininet ``Topo`` subclasses for the testbed's datacenters.

``build_topo(spec, extra_hosts)`` turns a :class:`topologies.spec.TopologySpec` and the
hosts a scheme asks for (:class:`topologies.hosts.HostRequest`) into a Topo, a plain graph
that needs no root: the network builds it, and the loopback runner reads its hosts.
"""
from __future__ import annotations

from topologies.hosts import HostInfo, HostRequest, hosts_of, uplink_mbps
from topologies.rack import RackTopo
from topologies.rack_core import RackCoreTopo
from topologies.spec import TopologySpec

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
    kw = dict(racks=spec.racks, hosts_per_rack=spec.hosts_per_rack, host_bw_mbps=spec.host_bw_mbps,
              extra_hosts=tuple(extra_hosts), interfaces_per_host=spec.interfaces_per_host,
              background_hosts_per_rack=spec.background_hosts_per_rack, link_opts=link_options(spec))
    if spec.kind == "rack_core":
        return RackCoreTopo(uplink_bw_mbps=spec.uplink_mbps(), **kw)
    return RackTopo(**kw)


__all__ = ["RackTopo", "RackCoreTopo", "TopologySpec", "HostInfo", "HostRequest", "build_topo", "hosts_of",
           "uplink_mbps", "link_options", "TOPOLOGIES"]
