"""Names, kinds and racks of the emulated hosts and switches: the one source of truth.

Every part of the testbed that names a node asks this module: the Topo builders
(:mod:`topologies.rack`), the network (its ``topology.json``), the loopback runner, the
schemes' plans (through :class:`HostInfo`) and ``testbed clean`` (its name patterns).

Hosts: ``h1..hN`` are worker hosts, numbered rack by rack; hosts a scheme asks for
(:class:`HostRequest`) are ``ps1..`` (kind ``server``) and ``fc1..`` (kind ``fc``), numbered in
request order; ``bg1..`` are background hosts (rack by rack) that carry only background
flows. Switches: ``tor1..torR`` (one per rack) and ``core1``. Interfaces are Mininet's
``<node>-eth<i>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: host kind -> name prefix
HOST_PREFIX = {"worker": "h", "server": "ps", "fc": "fc", "background": "bg"}
#: kinds of host a scheme may ask for beside the worker hosts (:class:`HostRequest`)
REQUESTABLE_KINDS = ("server", "fc")
#: switch role -> name prefix
SWITCH_PREFIX = {"tor": "tor", "core": "core"}

_NODE = "|".join(sorted({*HOST_PREFIX.values(), *SWITCH_PREFIX.values()}, key=len, reverse=True))
#: a node (host or switch) of an emulated network
NODE_RE = re.compile(rf"^({_NODE})\d+$")
#: a switch (a Linux bridge in the root namespace)
BRIDGE_RE = re.compile(rf"^({'|'.join(SWITCH_PREFIX.values())})\d+$")
#: an interface of a node (the veth ends Mininet makes)
INTF_RE = re.compile(rf"^({_NODE})\d+-eth\d+$")


def host_name(kind: str, number: int) -> str:
    """``h3``, ``ps1``, ``bg2`` ...: the name of host ``number`` (from 1) of ``kind``.

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in HOST_PREFIX:
        raise ValueError(f"unknown host kind {kind!r}; known: {', '.join(HOST_PREFIX)}")
    return f"{HOST_PREFIX[kind]}{number}"


def tor_name(rack: int) -> str:
    """The ToR switch of ``rack`` (from 0): ``tor1`` for rack 0."""
    return f"{SWITCH_PREFIX['tor']}{rack + 1}"


CORE = f"{SWITCH_PREFIX['core']}1"


def uplink_mbps(hosts_per_rack: int, host_bw_mbps: float, oversubscription: float) -> float:
    """ToR->core uplink rate that gives the oversubscription ratio, Mbit/s.

    oversubscription = (H * host_bw) / uplink_bw, so uplink_bw = H * host_bw / oversubscription.

    Raises:
        ValueError: oversubscription < 1 or a non-positive rate.
    """
    if oversubscription < 1 or hosts_per_rack < 1 or host_bw_mbps <= 0:
        raise ValueError("need hosts_per_rack >= 1, host_bw_mbps > 0, oversubscription >= 1")
    return hosts_per_rack * host_bw_mbps / oversubscription


@dataclass(frozen=True)
class HostRequest:
    """A host a scheme needs beside the worker hosts (``Scheme.hosts``), built by the harness.

    ``kind``: one of :data:`REQUESTABLE_KINDS` (``server``: runs only parameter servers;
    ``fc``: runs only FC workers). ``rack``: its rack, from 0. ``interfaces``: its links to
    the ToR, each shaped like a host link with its own address (a PBox has k > 1, PHub
    Sec. 3.3); a host has at least ``topology.interfaces_per_host``.
    """

    kind: str
    rack: int
    interfaces: int = 1

    def __post_init__(self):
        if self.kind not in REQUESTABLE_KINDS:
            raise ValueError(f"a scheme may ask for hosts of kind {', '.join(REQUESTABLE_KINDS)}, not {self.kind!r}")
        if self.rack < 0 or self.interfaces < 1:
            raise ValueError(f"bad host request {self}: rack >= 0 and interfaces >= 1")


@dataclass(frozen=True)
class HostInfo:
    """A host of a built topology as a scheme's plan sees it.

    ``kind``: ``worker`` for ordinary hosts, a requested kind (``server``, ``fc``) or
    ``background`` (only background flows: a plan must not use it). ``rack`` counts from 0.
    ``interfaces``: its links to its ToR (``ProcessPlan.iface`` indexes them).
    """

    name: str
    rack: int
    kind: str = "worker"
    interfaces: int = 1


def hosts_of(topo) -> list[HostInfo]:
    """The hosts of a Mininet ``Topo`` (a plain graph: no root needed), in Mininet's order
    (natural sort of the names), with their rack, kind and number of links.

    ``topo``: a Topo built by :mod:`topologies` (hosts carry ``rack`` and ``kind``).
    """
    links: dict[str, int] = {}
    for a, b in topo.links():  # once, not once per host: planning 4096 hosts was quadratic
        links[a] = links.get(a, 0) + 1
        links[b] = links.get(b, 0) + 1
    return [
        HostInfo(name, topo.nodeInfo(name)["rack"], topo.nodeInfo(name)["kind"], links.get(name, 0))
        for name in topo.hosts()
    ]
