"""``rack_core``: R racks of H hosts, each ToR with one uplink to a core switch."""
from __future__ import annotations

from topologies.rack import RackTopo


def uplink_mbps(hosts_per_rack: int, host_bw_mbps: float, oversubscription: float) -> float:
    """ToR->core uplink rate that gives the oversubscription ratio, Mbit/s.

    oversubscription = (H * host_bw) / uplink_bw, so uplink_bw = H * host_bw / oversubscription.

    Raises:
        ValueError: oversubscription < 1 or a non-positive rate.
    """
    if oversubscription < 1 or hosts_per_rack < 1 or host_bw_mbps <= 0:
        raise ValueError("need hosts_per_rack >= 1, host_bw_mbps > 0, oversubscription >= 1")
    return hosts_per_rack * host_bw_mbps / oversubscription


class RackCoreTopo(RackTopo):
    """Racks as in :class:`RackTopo` plus a core switch ``core1``; each ToR has one uplink
    of ``uplink_bw_mbps`` to it (all cross-rack traffic crosses two uplinks).
    """

    def build(self, uplink_bw_mbps: float = 200.0, **kw):
        super().build(**kw)
        core = self.addSwitch("core1", role="core", rack=None)
        for r, tor in enumerate(self.tors):
            self.addLink(tor, core, bw=uplink_bw_mbps, link_class="uplink", rack=r,
                         bw_mbps=uplink_bw_mbps, **self.link_opts)
