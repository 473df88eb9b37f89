"""Who is where in a captured run: the captured ports (``traces/pcap/ports.json``), the
training process owning each TCP endpoint (``traces/endpoints.csv``), and from
``topology.json`` the host owning each address and the hosts on either side of a switch port.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pandas as pd

from analysis import traces as tr
from common.errors import TestbedError

__all__ = ["CaptureError", "read_ports", "read_endpoints", "ports_behind"]


class CaptureError(TestbedError, ValueError):
    """A run has no packet capture, or a port asked for was not captured."""


def read_ports(run_dir: str | Path) -> list[dict]:
    """``traces/pcap/ports.json`` of a run: one dict per captured port (``port, file,
    snaplen_bytes, filter, started, stopped`` ...), in the order written.

    Raises:
        CaptureError: the run has no ``ports.json`` or it is not a JSON list of objects.
    """
    p = Path(run_dir) / "traces" / "pcap" / "ports.json"
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise CaptureError(
            f"{Path(run_dir)} has no packet capture ({p} is missing): run with capture.pcap, "
            f"e.g. --set 'capture.pcap={{ports: [uplinks]}}'"
        ) from None
    except (OSError, ValueError) as e:
        raise CaptureError(f"cannot read {p}: {e}") from None
    if not isinstance(doc, list) or not all(isinstance(e, dict) and e.get("port") for e in doc):
        raise CaptureError(f"{p} is not a list of {{port, file, ...}} objects")
    return doc


def read_endpoints(run_dir: str | Path) -> pd.DataFrame:
    """``traces/endpoints.csv`` (``time, proc, role, rank, host, pid, local_ip, local_port,
    remote_ip, remote_port, state``); an empty frame with these columns if it is missing.
    Ports are ints, addresses strings; a truncated last line is dropped."""
    cols = [
        "time",
        "proc",
        "role",
        "rank",
        "host",
        "pid",
        "local_ip",
        "local_port",
        "remote_ip",
        "remote_port",
        "state",
    ]
    df = tr.read_table(Path(run_dir) / "traces" / "endpoints.csv", cols)
    df = df[cols].copy()
    for c in ("local_port", "remote_port", "time"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.dropna(subset=["local_port", "time", "local_ip", "proc"])
    df["local_port"] = df["local_port"].astype("int64")
    df["remote_port"] = df["remote_port"].fillna(0).astype("int64")
    for c in ("local_ip", "remote_ip", "proc", "state"):
        df[c] = df[c].astype(str)
    return df.reset_index(drop=True)


def _norm_ip(ip: str) -> str:
    """An address as the flows name it: IPv4 dotted, IPv4-mapped IPv6 as IPv4, IPv6 compressed."""
    try:
        a = ipaddress.ip_address(str(ip).strip())
    except ValueError:
        return str(ip)
    if a.version == 6 and a.ipv4_mapped:
        return str(a.ipv4_mapped)
    return str(a)


class _Owners:
    """(address, port) -> training process, from ``endpoints.csv``.

    Lookup order for one end X of a connection X <-> Y first seen at unix time t: a socket
    with local X and remote Y; else any socket with local X; else a listener on X's port at
    X's address or the wildcard (an accepted connection shares its listener's port). Among
    several rows (a port reused by another process later), the one sampled nearest t."""

    def __init__(self, eps: pd.DataFrame):
        self.conn, self.local, self.listen = {}, {}, {}
        for r in eps.itertuples(index=False):
            lip, rip = _norm_ip(r.local_ip), _norm_ip(r.remote_ip)
            item = (float(r.time), r.proc)
            self.local.setdefault((lip, r.local_port), []).append(item)
            if r.state == "LISTEN" or (r.remote_port == 0 and rip in ("0.0.0.0", "::")):
                wild = lip in ("0.0.0.0", "::")
                self.listen.setdefault(("*" if wild else lip, r.local_port), []).append(item)
            else:
                self.conn.setdefault((lip, r.local_port, rip, r.remote_port), []).append(item)

    @staticmethod
    def _nearest(items, t):
        return min(items, key=lambda it: abs(it[0] - t))[1] if items else None

    def owner(self, ip, port, peer_ip, peer_port, t) -> str | None:
        for items in (
            self.conn.get((ip, port, peer_ip, peer_port)),
            self.local.get((ip, port)),
            (self.listen.get((ip, port)) or []) + (self.listen.get(("*", port)) or []),
        ):
            if items:
                return self._nearest(items, t)
        return None

    def is_listener(self, ip, port) -> bool:
        return (ip, port) in self.listen or ("*", port) in self.listen


def _host_of_ip(topology: dict) -> dict[str, str]:
    out = {}
    for h in topology.get("hosts", []):
        if h.get("ip"):
            out[_norm_ip(h["ip"])] = h.get("name")
        for i in h.get("intfs") or []:
            if i.get("ip"):
                out[_norm_ip(i["ip"])] = h.get("name")
    return out


def ports_behind(topology: dict, port: str) -> tuple[set[str], set[str]]:
    """The host addresses on each side of a switch port, from ``topology.json``.

    The network is taken as a graph of switches and host interfaces (a host's interfaces are
    separate leaves: hosts do not forward). Removing the port's link splits it, in a tree,
    into the side of the port's peer ("behind": packets from there enter the switch through
    the port, bwm-ng's ``in``) and the switch's side (packets to "behind" leave through it,
    ``out``). An address reachable from both sides (a cycle) is in neither set.

    Returns:
        ``(behind, front)``: sets of IP addresses; both empty if ``port`` is no switch-side
        interface of the topology.
    """
    switches = {s.get("name") for s in topology.get("switches", [])}
    intf_ip = {}
    for h in topology.get("hosts", []):
        for i in h.get("intfs") or []:
            if i.get("name") and i.get("ip"):
                intf_ip[i["name"]] = _norm_ip(i["ip"])
        if h.get("ip") and not h.get("intfs"):
            intf_ip[f"{h.get('name')}-eth0"] = _norm_ip(h["ip"])

    def node(name, intf):
        return name if name in switches else f"if:{intf}"

    adj: dict[str, list[tuple[str, int]]] = {}
    cut, sw_node, peer_node = None, None, None
    for k, link in enumerate(topology.get("links", [])):
        a, b = node(link.get("node1"), link.get("intf1")), node(link.get("node2"), link.get("intf2"))
        adj.setdefault(a, []).append((b, k))
        adj.setdefault(b, []).append((a, k))
        for mine, other, intf in ((a, b, link.get("intf1")), (b, a, link.get("intf2"))):
            if intf == port and mine in switches:
                cut, sw_node, peer_node = k, mine, other
    if cut is None:
        return set(), set()

    def reach(start):
        seen, todo = {start}, [start]
        while todo:
            n = todo.pop()
            for m, k in adj.get(n, []):
                if k != cut and m not in seen:
                    seen.add(m)
                    todo.append(m)
        return {intf_ip[n[3:]] for n in seen if n.startswith("if:") and n[3:] in intf_ip}

    behind, front = reach(peer_node), reach(sw_node)
    return behind - front, front - behind
