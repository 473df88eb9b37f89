"""``rack_core``: R racks of H hosts, each ToR with one uplink to a core switch."""

from __future__ import annotations

from topologies.hosts import CORE
from topologies.rack import RackTopo


class RackCoreTopo(RackTopo):
    """Racks as in :class:`RackTopo` plus a core switch ``core1``; each ToR has one uplink
    of ``uplink_bw_mbps`` to it (all cross-rack traffic crosses two uplinks).
    """

    def build(self, uplink_bw_mbps: float = 200.0, **kw):
        super().build(**kw)
        core = self.addSwitch(CORE, role="core", rack=None)
        for r, tor in enumerate(self.tors):
            self.addLink(
                tor, core, bw=uplink_bw_mbps, link_class="uplink", rack=r, bw_mbps=uplink_bw_mbps, **self.link_opts
            )
