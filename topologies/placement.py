"""Which machine each node of a topology lives on, when racks are spread over machines
(Mininet's cluster support places nodes the same way, ``mininet/examples/cluster.py``
``placeNodes``, but its placers know nothing of racks).

    from topologies.placement import place_racks
    where = place_racks(topo, ["10.0.0.1", "10.0.0.2"])     # node name -> machine
    crossing = links_between_machines(topo, where)          # the links that cross machines

``place_racks`` keeps every rack whole on one machine, so that only the links to the core
switch (the uplinks) cross machines: under dilation an uplink carries ``bw / scale`` of real
traffic, the least of any link of the rack. Racks go to machines in contiguous blocks, as
evenly as their count allows (``R`` racks on ``M`` machines: rack ``r`` on machine
``floor(r * M / R)``); nodes without a rack (the core switch) go on the first machine.
"""

from __future__ import annotations

__all__ = ["PlacementError", "links_between_machines", "place_racks"]


class PlacementError(ValueError):
    """The topology cannot be placed on the machines given (the message says why and what would do)."""


def place_racks(topo, machines: list[str]) -> dict[str, str]:
    """Every node of ``topo`` (a Mininet ``Topo`` whose nodes carry ``rack``: an index, or
    ``None`` for the core) -> the machine it runs on.

    Args:
        topo: built by :func:`topologies.build_topo`.
        machines: machine addresses, at least one, no repeats; the first also holds the core.

    Raises:
        PlacementError: no machines, a repeated machine, more machines than racks (a machine
            would hold no rack), or a topology without a core switch spread over more than
            one machine (its racks would not be connected).
    """
    if not machines:
        raise PlacementError("no machines: give at least one address")
    repeated = sorted({m for m in machines if machines.count(m) > 1})
    if repeated:
        raise PlacementError(f"machines repeated: {', '.join(repeated)} (each machine once)")
    racks = sorted({topo.nodeInfo(n).get("rack") for n in topo.nodes()} - {None})
    if len(machines) > len(racks):
        raise PlacementError(
            f"{len(machines)} machines for {len(racks)} racks: placement 'rack' keeps each rack "
            f"whole on one machine, so give at most {len(racks)} machines or more racks"
        )
    has_core = any(topo.nodeInfo(n).get("rack") is None for n in topo.nodes())
    if len(machines) > 1 and not has_core:
        raise PlacementError(
            "a topology without a core switch (kind 'rack') cannot span machines: its racks "
            "are not connected to each other; use kind 'rack_core'"
        )
    index = {r: i for i, r in enumerate(racks)}
    out = {}
    for n in topo.nodes():
        rack = topo.nodeInfo(n).get("rack")
        out[n] = machines[0] if rack is None else machines[index[rack] * len(machines) // len(racks)]
    return out


def links_between_machines(topo, where: dict[str, str]) -> list[tuple[str, str]]:
    """The links of ``topo`` whose two ends are on different machines (``where`` from
    :func:`place_racks`), as ``(node, node)`` pairs in the topology's order."""
    return [(a, b) for a, b in topo.links() if where[a] != where[b]]
