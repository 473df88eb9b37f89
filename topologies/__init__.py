"""Topology builders: Mininet ``Topo`` subclasses for the testbed's datacenters.

``build_topo(spec, server_racks)`` turns a :class:`testbed.spec.TopologySpec` into a Topo.
"""
from __future__ import annotations

from topologies.rack import RackTopo
from topologies.rack_core import RackCoreTopo, uplink_mbps

TOPOLOGIES = {"rack": RackTopo, "rack_core": RackCoreTopo}


def link_options(spec) -> dict:
    """Per-link emulation options beyond bandwidth (delay, loss, queue limit) from a spec."""
    opts = {}
    if spec.delay_ms:
        opts["delay"] = f"{float(spec.delay_ms):g}ms"
    if spec.loss_pct:
        opts["loss"] = spec.loss_pct
    if spec.max_queue_packets:
        opts["max_queue_size"] = spec.max_queue_packets
    return opts


def build_topo(spec, server_racks: list[int] | tuple = (), server_interfaces: int = 1):
    """A Topo for ``spec`` (a TopologySpec) with dedicated server hosts in ``server_racks``,
    each with ``server_interfaces`` links to its ToR (``workload.servers.interfaces``)."""
    kw = dict(racks=spec.racks, hosts_per_rack=spec.hosts_per_rack, host_bw_mbps=spec.host_bw_mbps,
              server_racks=tuple(server_racks), interfaces_per_host=spec.interfaces_per_host,
              server_interfaces=server_interfaces,
              background_hosts_per_rack=getattr(spec, "background_hosts_per_rack", 0),
              link_opts=link_options(spec))
    if spec.kind == "rack_core":
        return RackCoreTopo(uplink_bw_mbps=spec.uplink_mbps(), **kw)
    return RackTopo(**kw)


__all__ = ["RackTopo", "RackCoreTopo", "build_topo", "uplink_mbps", "link_options", "TOPOLOGIES"]
