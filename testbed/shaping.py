"""Link shaping: how every link end is shaped, built, read back and changed in place, on
this machine or on another machine of a cluster.

Every end of every link (a veth pair, or a tunnel between machines) carries the same
shaping, set by :class:`ShapedIntf` when Mininet builds the link:

* an htb root qdisc :data:`HTB_ROOT` (``5:``) whose default class is :data:`HTB_CLASS`
  (``5:1``), with rate = ceil = the link's shaped rate (its emulated rate / ``scale``),
  burst = cburst = :func:`htb_burst_bytes` and quantum :data:`HTB_QUANTUM_BYTES`;
* under the class, optionally a leaf: ``pfifo`` (``topology.max_queue_packets``) or
  ``netem`` (delay or loss, on kernels that have it).

The rates a link may have are [:data:`topologies.spec.MIN_RATE_MBPS`,
:data:`topologies.spec.MAX_RATE_MBPS`] (the minimum's measured basis is given there), the one
definition that the spec's validation and the build both use.

After the build every end is read back over netlink (:meth:`LinkShaper.read`, pyroute2:
the htb rate, and the delay and loss of a netem leaf) and compared with what was asked
(:func:`shaping_errors`, :func:`netem_errors`); a scheduled event changes an
end's class in place (:meth:`LinkShaper.set_rate`) or sets a switch port down or up
(:meth:`LinkShaper.set_state`) and reads it back. On a cluster, :class:`RemoteLinkShaper`
runs the very same methods on the machine that holds each end (``python -m
testbed.shaping``, a JSON query on its standard input, one SSH command per machine).

A link end is named ``(node, interface)``: the interface is in the network namespace of
``node`` when ``node`` is a host (a key of ``netns_pids``), else in the root namespace (a
switch port).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mininet.link import Link, TCIntf
from pyroute2 import IPRoute
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec
from pyroute2.netns import popns, pushns

from common.errors import TestbedError
from topologies.spec import MAX_RATE_MBPS, MIN_RATE_MBPS

__all__ = [
    "MAX_RATE_MBPS",
    "MIN_RATE_MBPS",
    "RATE_TOLERANCE",
    "HTB_QUANTUM_BYTES",
    "HTB_ROOT",
    "HTB_CLASS",
    "htb_burst_bytes",
    "htb_class_options",
    "netns_route",
    "ShapedIntf",
    "ShapedLink",
    "LinkShaper",
    "RemoteLinkShaper",
    "read_shaping",
    "netem_options",
    "shaping_errors",
    "netem_errors",
    "link_ends",
    "switch_ends",
]

#: Rate read back must be within this fraction of the rate asked for (tc rounds rates); so
#: must a netem delay and loss, or within :data:`NETEM_DELAY_FLOOR_MS` / :data:`NETEM_LOSS_FLOOR_PCT`.
RATE_TOLERANCE = 0.01
#: A netem delay read back may differ by this much, ms, whatever the delay (tc takes whole µs).
NETEM_DELAY_FLOOR_MS = 0.001
#: A netem loss read back may differ by this much, % (Mininet writes it with 5 decimals).
NETEM_LOSS_FLOOR_PCT = 1e-5
#: htb class quantum, bytes (>= one MTU-sized frame, below htb's 200 kB warning limit).
HTB_QUANTUM_BYTES = 60_000
#: htb handles: the root qdisc 5: and its one class 5:1 (major << 16 | minor)
HTB_ROOT = 0x5 << 16
HTB_CLASS = HTB_ROOT | 0x1
#: the parent id of a root qdisc in netlink (TC_H_ROOT)
_TC_H_ROOT = 0xFFFFFFFF


def tc_handle(handle: int) -> str:
    """``handle`` as ``tc`` writes it: 0x50000 -> ``5:0``, 0x50001 -> ``5:1`` (hexadecimal)."""
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def htb_burst_bytes(bw_mbps: float) -> int:
    """htb burst (and cburst) for a rate: max(15 kB, 1 ms worth of bytes at the rate).

    Mininet fixes burst at 15 kB, which at 10 Gbit/s is 12 us of tokens: htb's timer cannot
    refill that often, so the link runs well below its rate. One millisecond of tokens keeps
    htb on rate at any speed while bounding the burst to what one timer tick sends.
    """
    return max(15_000, int(bw_mbps * 1e6 / 8 * 1e-3))


def htb_class_options(bw_mbps: float) -> dict:
    """pyroute2 ``tc`` keywords of the htb class :data:`HTB_CLASS` at ``bw_mbps`` (Mbit/s):
    rate = ceil (bytes/s), burst = cburst = :func:`htb_burst_bytes`, quantum
    :data:`HTB_QUANTUM_BYTES`: what :meth:`ShapedIntf.bwCmds` asks of ``tc``."""
    rate = int(round(bw_mbps * 1e6 / 8))
    burst = htb_burst_bytes(bw_mbps)
    return {"rate": rate, "ceil": rate, "burst": burst, "cburst": burst, "quantum": HTB_QUANTUM_BYTES}


@contextmanager
def netns_route(pid: int | None) -> Iterator[IPRoute]:
    """A pyroute2 ``IPRoute`` in the network namespace of process ``pid`` (None: this
    process's), closed on exit.

    Its socket is made by this thread entering the namespace for that moment (pyroute2's
    ``pushns``/``popns``), not in a forked helper process as pyroute2's ``NetNS`` does
    (a fork of the harness per host). Raises OSError when there is no such process.
    """
    if pid is None:
        with IPRoute() as ipr:
            yield ipr
        return
    fd = os.open(f"/proc/{int(pid)}/ns/net", os.O_RDONLY)
    try:
        pushns(fd)
        try:
            ipr = IPRoute()
        finally:
            popns()
    finally:
        os.close(fd)
    with ipr:
        yield ipr


# ---------------------------------------------------------------------------- build


class ShapedIntf(TCIntf):
    """Mininet ``TCIntf`` that shapes every rate it is given, or refuses it.

    Differences from ``TCIntf``: rates in [:data:`MIN_RATE_MBPS`, :data:`MAX_RATE_MBPS`] are
    accepted (stock ``TCIntf`` silently leaves a link unshaped above ``bwParamMax`` = 1000
    Mbit/s); burst is :func:`htb_burst_bytes`; a queue limit without delay or loss uses a
    ``pfifo`` leaf (``netem`` is not available on every kernel); a rate out of range raises
    instead of logging.
    """

    bwParamMax = MAX_RATE_MBPS

    def bwCmds(self, bw=None, **_):
        if bw is None:
            return [], " root "
        if not MIN_RATE_MBPS <= bw <= MAX_RATE_MBPS:
            raise TestbedError(f"link rate {bw} Mbit/s is outside [{MIN_RATE_MBPS:g}, {MAX_RATE_MBPS:.0f}] Mbit/s")
        burst = htb_burst_bytes(bw)
        # an explicit quantum: htb's default (rate / r2q) exceeds its 200 kB limit above
        # 16 Mbit/s and the kernel warns; with one class the quantum has no other effect
        root, cls = tc_handle(HTB_ROOT), tc_handle(HTB_CLASS)
        return [
            f"%s qdisc add dev %s root handle {root} htb default {HTB_CLASS & 0xFFFF:x}",
            f"%s class add dev %s parent {root} classid {cls} htb "
            + f"rate {bw}Mbit burst {burst} cburst {burst} quantum {HTB_QUANTUM_BYTES}",
        ], f" parent {cls} "

    @staticmethod
    def delayCmds(parent, delay=None, jitter=None, loss=None, max_queue_size=None):
        if delay or jitter or loss:
            return TCIntf.delayCmds(parent, delay=delay, jitter=jitter, loss=loss, max_queue_size=max_queue_size)
        if max_queue_size:
            return ["%s qdisc add dev %s " + parent + f" handle 10: pfifo limit {int(max_queue_size)}"], " parent 10:1 "
        return [], parent


class ShapedLink(Link):
    """A veth pair shaped identically on both ends with :attr:`intf_class` (:class:`ShapedIntf`)."""

    intf_class: type = ShapedIntf

    def __init__(
        self, node1, node2, port1=None, port2=None, intfName1=None, intfName2=None, addr1=None, addr2=None, **params
    ):
        Link.__init__(
            self,
            node1,
            node2,
            port1=port1,
            port2=port2,
            intfName1=intfName1,
            intfName2=intfName2,
            cls1=self.intf_class,
            cls2=self.intf_class,
            addr1=addr1,
            addr2=addr2,
            params1=params,
            params2=params,
        )


# ---------------------------------------------------------------------------- read back


def netem_options(qdisc) -> dict:
    """Delay and loss of a netem qdisc, from its netlink message (a pyroute2 ``tcmsg`` whose
    ``TCA_OPTIONS`` is netem's ``tc_netem_qopt``).

    Returns:
        ``{"delay_ms": one-way delay, ms (the latency, in the packet scheduler's ticks, over
        ``tick_in_usec`` ticks per µs as ``/proc/net/psched`` gives them), "loss_pct": loss
        probability, % (the 32-bit fraction over 2**32 - 1)}``; None for what the message
        lacks.
    """
    opts = qdisc.get_attr("TCA_OPTIONS")
    ticks = opts.get("delay") if opts is not None else None
    loss = opts.get("loss") if opts is not None else None
    return {
        "delay_ms": None if ticks is None else ticks / tick_in_usec / 1000.0,
        "loss_pct": None if loss is None else loss / 0xFFFFFFFF * 100.0,
    }


def read_shaping(ipr, ifname: str, qdiscs: list | None = None) -> dict:
    """Root qdisc kind and htb class :data:`HTB_CLASS` rate (Mbit/s) of an interface, and
    its leaf qdisc (with its delay and loss when it is netem, :func:`netem_options`).

    ``ipr``: a pyroute2 ``IPRoute`` for the interface's namespace. ``qdiscs``: the
    namespace's qdiscs from one dump (``ipr.get_qdiscs()``), for reading many interfaces:
    the kernel dumps every interface's qdiscs whatever interface is asked for, so one dump per
    namespace replaces one per interface (the times: ``docs/scaling.md``); None: dumped here.
    Returns ``{"qdisc": kind or None, "rate_mbps": float or None, "leaf": kind or None,
    "delay_ms": ms or None, "loss_pct": % or None}`` (delay and loss None without a netem
    leaf; with ``"error"`` when there is no such interface).
    """
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return {
            "qdisc": None,
            "rate_mbps": None,
            "leaf": None,
            "delay_ms": None,
            "loss_pct": None,
            "error": "no such interface",
        }
    idx = idx[0]
    kind = leaf = None
    netem = {"delay_ms": None, "loss_pct": None}
    for q in ipr.get_qdiscs(index=idx) if qdiscs is None else qdiscs:
        if q["index"] != idx:
            continue
        if q["parent"] == _TC_H_ROOT:
            kind = q.get_attr("TCA_KIND")
        elif q["parent"] == HTB_CLASS:  # the leaf: pfifo queue limit or netem
            leaf = q.get_attr("TCA_KIND")
            if leaf == "netem":
                netem = netem_options(q)
    rate = None
    if kind == "htb":
        for c in ipr.get_classes(index=idx):
            if c["handle"] == HTB_CLASS:
                parms = c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
                rate64 = c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_RATE64")
                bps = rate64 if rate64 else parms["rate"]
                rate = bps * 8 / 1e6
    return {"qdisc": kind, "rate_mbps": rate, "leaf": leaf, **netem}


def _netem_problem(link: dict, have: dict) -> str | None:
    """What differs between the delay and loss asked of ``link`` (``shaped_delay_ms``, ms as
    built, and ``loss_pct``, %) and one end's :func:`read_shaping`; None when they agree or
    neither is asked."""
    delay, loss = float(link.get("shaped_delay_ms") or 0.0), float(link.get("loss_pct") or 0.0)
    if not delay and not loss:
        return None
    d, l = have.get("delay_ms"), have.get("loss_pct")
    if (
        have.get("leaf") != "netem"
        or d is None
        or l is None
        or abs(d - delay) > max(RATE_TOLERANCE * delay, NETEM_DELAY_FLOOR_MS)
        or abs(l - loss) > max(RATE_TOLERANCE * loss, NETEM_LOSS_FLOOR_PCT)
    ):
        return f"asked netem delay {delay:g} ms loss {loss:g} %, kernel has {have}"
    return None


def netem_errors(link: dict, got: dict[str, dict]) -> list[str]:
    """What differs between the delay and loss asked of ``link`` (a ``topology.json`` link:
    ``shaped_delay_ms``, ms as built, ``loss_pct``, %) and what the kernel has (``got``:
    interface -> :func:`read_shaping`), one line per end that differs; empty when the link
    asks for neither."""
    return [
        f"{link[f'intf{e}']}: {p}" for e in ("1", "2") if (p := _netem_problem(link, got[link[f"intf{e}"]])) is not None
    ]


def shaping_errors(link: dict, got: dict[str, dict], mtu_bytes: int, max_queue_packets: int | None) -> list[str]:
    """What differs between the shaping asked of ``link`` (a ``topology.json`` link:
    ``shaped_mbps``, ``mtu_bytes`` of both ends, ``shaped_delay_ms`` and ``loss_pct``) and
    what the kernel has (``got``: interface -> :func:`read_shaping`), one line per end that
    differs: the htb rate, the MTU, netem's delay and loss (:func:`netem_errors`), the queue."""
    bad = []
    want = link["shaped_mbps"]
    for end in ("1", "2"):
        intf = link[f"intf{end}"]
        have = got[intf]
        rate = have.get("rate_mbps")
        if have.get("qdisc") != "htb" or rate is None or abs(rate - want) > RATE_TOLERANCE * want:
            bad.append(f"{intf}: asked {want} Mbit/s htb, kernel has {have}")
        elif link["mtu_bytes"] != [mtu_bytes] * 2:
            bad.append(f"{intf}: asked MTU {mtu_bytes}, kernel has {link['mtu_bytes']}")
        elif (netem := _netem_problem(link, have)) is not None:
            bad.append(f"{intf}: {netem}")
        elif max_queue_packets and have.get("leaf") not in ("pfifo", "netem"):
            bad.append(f"{intf}: asked a {max_queue_packets}-packet queue, kernel has {have}")
    return bad


def link_ends(links: list[dict]) -> list[tuple[str, str]]:
    """``(node, interface)`` of both ends of every ``topology.json`` link."""
    return [(l[f"node{e}"], l[f"intf{e}"]) for l in links for e in ("1", "2")]


def switch_ends(links: list[dict], hosts) -> list[tuple[str, str]]:
    """The ends of ``links`` on switches (nodes not in ``hosts``): what a link down or up acts on."""
    return [(n, i) for n, i in link_ends(links) if n not in hosts]


# ---------------------------------------------------------------------------- change in place


class LinkShaper:
    """Reads and changes the shaping of link ends on this machine over netlink (pyroute2).

    Args:
        netns_pids: host name -> the pid of a process in its network namespace (its
            Mininet shell); an end on a node not in it is a switch port (root namespace).
    """

    def __init__(self, netns_pids: dict[str, int]):
        self.netns_pids = dict(netns_pids)

    def _each(self, ends: list[tuple[str, str]], fn) -> dict:
        """``fn(ipr, iface)`` for every ``(node, iface)`` end, in its namespace; iface -> result."""
        out = {}
        root = [i for n, i in ends if n not in self.netns_pids]
        if root:
            with IPRoute() as ipr:
                for iface in root:
                    out[iface] = fn(ipr, iface)
        for host in dict.fromkeys(n for n, _ in ends if n in self.netns_pids):
            with netns_route(self.netns_pids[host]) as ns:
                for iface in (i for n, i in ends if n == host):
                    out[iface] = fn(ns, iface)
        return out

    def read(self, ends: list[tuple[str, str]]) -> dict[str, dict]:
        """:func:`read_shaping` of every ``(node, interface)`` end; interface -> its shaping
        (the qdiscs of each namespace dumped once)."""
        dumps: dict[int, tuple] = {}  # id of a namespace's IPRoute -> (it, its qdiscs); kept alive: ids unique

        def one(ipr, iface):
            if id(ipr) not in dumps:
                dumps[id(ipr)] = (ipr, list(ipr.get_qdiscs()))
            return read_shaping(ipr, iface, dumps[id(ipr)][1])

        return self._each(ends, one)

    def set_rate(self, ends: list[tuple[str, str]], shaped_mbps: float) -> dict[str, float | None]:
        """Set the htb class :data:`HTB_CLASS` of every end to ``shaped_mbps`` (rate and ceil;
        burst and cburst :func:`htb_burst_bytes`; quantum :data:`HTB_QUANTUM_BYTES`, as at
        build) and read it back.

        Returns:
            iface -> the rate read back, Mbit/s (None if the kernel shows no htb class).

        Raises:
            TestbedError: an interface is missing; NetlinkError: the kernel refused the change.
        """
        options = htb_class_options(shaped_mbps)

        def change(ipr, iface):
            idx = ipr.link_lookup(ifname=iface)
            if not idx:
                raise TestbedError(f"interface {iface} is gone")
            ipr.tc("change-class", "htb", idx[0], HTB_CLASS, parent=HTB_ROOT, **options)
            return read_shaping(ipr, iface).get("rate_mbps")

        return self._each(ends, change)

    def set_state(self, ends: list[tuple[str, str]], up: bool) -> list[str]:
        """Set every end up or down; the interfaces changed.

        Raises:
            TestbedError: an interface is missing.
        """

        def flip(ipr, iface):
            idx = ipr.link_lookup(ifname=iface)
            if not idx:
                raise TestbedError(f"interface {iface} is gone")
            ipr.link("set", index=idx[0], state="up" if up else "down")
            return True

        return list(self._each(ends, flip))


class RemoteLinkShaper(LinkShaper):
    """:class:`LinkShaper` for a network spread over machines: each end is read or changed
    by a :class:`LinkShaper` on the machine that holds it (:func:`serve`, one command per
    machine and call).

    Args:
        netns_pids: host name -> the pid of its shell on its machine.
        placement: node -> the address of its machine.
        call: ``call(addr, query)`` runs :func:`serve` on machine ``addr`` with ``query`` on
            its standard input and returns what it prints, read as JSON (raises
            ``RuntimeError`` or ``subprocess.TimeoutExpired`` when it fails).
    """

    def __init__(self, netns_pids: dict[str, int], placement: dict[str, str], call: Callable[[str, dict], object]):
        super().__init__(netns_pids)
        self.placement, self.call = dict(placement), call

    def _on_machines(self, ends: list[tuple[str, str]], query: dict):
        by_machine: dict[str, list] = {}
        for node, iface in ends:
            by_machine.setdefault(self.placement[node], []).append([node, iface])
        for addr, mine in by_machine.items():
            pids = {n: p for n, p in self.netns_pids.items() if self.placement.get(n) == addr}
            try:
                yield self.call(addr, {**query, "ends": mine, "pids": pids})
            except (RuntimeError, OSError) as e:
                raise TestbedError(f"shaping on {addr} failed: {e}") from None
            except Exception as e:  # noqa: BLE001 -- subprocess.TimeoutExpired, named in the message
                raise TestbedError(f"shaping on {addr} failed: {type(e).__name__}: {e}") from None

    def read(self, ends):
        out = {}
        for got in self._on_machines(ends, {"op": "read"}):
            out.update(got)
        return out

    def set_rate(self, ends, shaped_mbps):
        out = {}
        for got in self._on_machines(ends, {"op": "rate", "mbps": shaped_mbps}):
            out.update(got)
        return out

    def set_state(self, ends, up):
        out = []
        for got in self._on_machines(ends, {"op": "state", "up": up}):
            out += got
        return out


#: what a machine runs for :class:`RemoteLinkShaper` (the project's Python, in its directory)
SERVE = "from testbed.shaping import serve; serve()"


def serve(stdin=None, stdout=None) -> None:
    """Answer one :class:`RemoteLinkShaper` query read as JSON from ``stdin`` (``{"op":
    "read" | "rate" | "state", "ends": [[node, iface], ...], "pids": {host: pid}, "mbps",
    "up"}``) with a local :class:`LinkShaper`; print the result as one JSON line."""
    q = json.load(stdin or sys.stdin)
    shaper = LinkShaper(q["pids"])
    ends = [tuple(e) for e in q["ends"]]
    if q["op"] == "read":
        out = shaper.read(ends)
    elif q["op"] == "rate":
        out = shaper.set_rate(ends, q["mbps"])
    else:
        out = shaper.set_state(ends, q["up"])
    print(json.dumps(out), file=stdout or sys.stdout)
