"""TCP flows from the header captures of a run (``traces/pcap/``), each end named by process.

A run with ``capture.pcap`` holds, per captured switch port, tcpdump's file
``traces/pcap/<port>.pcap`` (Ethernet, headers only: ``snaplen_bytes``, e.g. 128), the index
``traces/pcap/ports.json`` (``[{port, file, snaplen_bytes, filter, started, stopped, ...}]``)
and ``traces/endpoints.csv`` (which training process owned which TCP endpoint). This module
reads them without a live network:

* :func:`flows`: one row per TCP connection per captured port (bytes, packets, payload,
  retransmitted segments, an ACK-clocked RTT, and the process, role and rank at each end);
* :func:`flow_rates`: bytes/s of each flow over time on one port (a stacked rate plot,
  :func:`analysis.plots.plot_flow_rates`);
* :func:`check_against_counters`: each port's flow bytes against its bwm-ng counters.

Reading. The pcap files are read with scapy's :class:`scapy.utils.RawPcapReader`, streaming,
in chunks of :data:`CHUNK_PACKETS` records: the first :data:`HEADER_BYTES` bytes of each
record go into one fixed-width numpy buffer and every header field is decoded vectorially
(parsing each packet with scapy's layer classes costs about 100 us a packet; this costs
about 2 us, most of it scapy's record reader; ``benchmarks/flow_analysis.py`` measures it).
Per-flow state (sequence numbers, the segments awaiting an ACK) is carried from one chunk to
the next, so memory grows with the number of flows, not with the file, except for the RTT
samples (8 bytes per sampled segment). Supported: Ethernet
(link type 1) with at most one 802.1Q/802.1ad tag, IPv4 (non-first fragments are not TCP)
and IPv6 without extension headers before TCP. A record cut short at the end of the file
(tcpdump killed mid-write) is dropped with a :class:`PcapWarning`, as are trailing bytes too
short for a record header; every whole packet before it is read.

Bytes. Flow bytes are IP total lengths (IPv6: 40 + payload length), not captured lengths: the
capture keeps only the headers. A "packet" is what the port's tap saw: with segmentation
offload on the veth pair it can be one GSO super-segment of many MSS (its IP length is the
whole of it; an IP length of 0, as for BIG TCP, is taken from the record's wire length).

Time. Packet timestamps are unix seconds of this machine. In a run with time dilation
``scale`` != 1 every time is converted to the emulated network's time as
:func:`analysis.load.to_emulated_time` does: ``t0 + (t - t0) / scale``, with ``t0`` the
run's :attr:`analysis.load.Run.t0` (the earliest timestamp of bwm-ng, qdisc, cpu and events,
the instant ``to_emulated_time`` keeps fixed; the conversion leaves it unchanged, so it is
also the converted run's ``t0``). A run that recorded none of them uses the earliest
``started`` of ``ports.json``, else the earliest captured packet. Durations (RTT, bins) are
divided by ``scale``; rates are then in the emulated network's units.
"""
from __future__ import annotations

import ipaddress
import json
import math
import warnings
from array import array
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import traces as tr
from analysis.load import Run, load
from common.errors import TestbedError

__all__ = ["flows", "retransmissions", "flow_rates", "flows_and_rates", "flow_labels", "check_against_counters", "read_ports",
           "read_endpoints", "ports_behind", "FLOW_COLUMNS", "CHECK_COLUMNS", "CaptureError", "PcapWarning",
           "CHUNK_PACKETS"]

CHUNK_PACKETS = 1 << 17
"""pcap records decoded together (about 12 MB of header buffer)."""
HEADER_BYTES = 96
"""Bytes of each record decoded: Ethernet + one VLAN tag (18) + IPv4 with options (60) + the
TCP fields up to the flags (14) = 92."""

FLOW_COLUMNS = [
    "port", "flow_id", "proto", "src_ip", "src_port", "dst_ip", "dst_port", "initiator",
    "src_host", "dst_host", "src_proc", "dst_proc", "src_role", "src_rank", "dst_role", "dst_rank",
    "fwd_on_port", "bytes_fwd", "bytes_rev", "packets_fwd", "packets_rev", "payload_bytes_fwd", "payload_bytes_rev",
    "first_ts", "last_ts", "duration_s", "retransmits_fwd", "retransmits_rev",
    "rtt_ms", "rtt_ms_fwd", "rtt_ms_rev", "rtt_samples_fwd", "rtt_samples_rev",
]
"""Columns of :func:`flows` (see there)."""

CHECK_COLUMNS = [
    "port", "start", "end", "samples", "flow_packets", "flow_bytes", "flow_frame_bytes", "other_frames",
    "other_frame_bytes", "counter_packets", "counter_bytes", "ratio", "ratio_ip", "ratio_all",
    "flow_frame_bytes_out", "counter_bytes_out", "ratio_out", "flow_frame_bytes_in", "counter_bytes_in", "ratio_in",
]
"""Columns of :func:`check_against_counters` (see there)."""

_NEG = -(1 << 62)  # below every unwrapped sequence number
_TWO31, _TWO32 = 1 << 31, 1 << 32
_FIN, _SYN, _RST, _ACK = 0x01, 0x02, 0x04, 0x10


class CaptureError(TestbedError, ValueError):
    """A run has no packet capture, or a port asked for was not captured."""


class PcapWarning(UserWarning):
    """A pcap file could be read only in part (truncated, unreadable or of another link type)."""


# ------------------------------------------------------------------------------------ run files

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
        raise CaptureError(f"{Path(run_dir)} has no packet capture ({p} is missing): run with capture.pcap, "
                           f"e.g. --set 'capture.pcap={{ports: [uplinks]}}'") from None
    except (OSError, ValueError) as e:
        raise CaptureError(f"cannot read {p}: {e}") from None
    if not isinstance(doc, list) or not all(isinstance(e, dict) and e.get("port") for e in doc):
        raise CaptureError(f"{p} is not a list of {{port, file, ...}} objects")
    return doc


def read_endpoints(run_dir: str | Path) -> pd.DataFrame:
    """``traces/endpoints.csv`` (``time, proc, role, rank, host, pid, local_ip, local_port,
    remote_ip, remote_port, state``); an empty frame with these columns if it is missing.
    Ports are ints, addresses strings; a truncated last line is dropped."""
    cols = ["time", "proc", "role", "rank", "host", "pid", "local_ip", "local_port", "remote_ip", "remote_port",
            "state"]
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
        for items in (self.conn.get((ip, port, peer_ip, peer_port)), self.local.get((ip, port)),
                      (self.listen.get((ip, port)) or []) + (self.listen.get(("*", port)) or [])):
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


# ------------------------------------------------------------------------------- pcap decoding

@dataclass
class _Space:
    """One direction's sequence space of one flow (its data, and the ACKs of it)."""
    ref: int | None = None              # last unwrapped value seen (seq or ack)
    max_end: int = _NEG                 # highest unwrapped end of data seen
    holes: list = field(default_factory=list)  # [lo, hi) below max_end never seen, sorted
    retransmits: int = 0
    retransmit_ns: list = field(default_factory=list)  # capture time of each retransmitted segment
    pend: tuple | None = None           # (start, end, ts_ns, pos) awaiting their first ACK
    rtt_ns: list = field(default_factory=list)


@dataclass
class _Flow:
    ends: tuple                         # ((ip, port) of end 0, (ip, port) of end 1): dir d is sent by end d
    key: int
    port_dir0: str | None               # "in"/"out": direction 0 on the port (None: unknown)
    syn_isn: int | None = None
    syn_dir: int | None = None
    synack_dir: int | None = None
    first_dir: int | None = None
    packets: list = field(default_factory=lambda: [0, 0])
    bytes: list = field(default_factory=lambda: [0, 0])
    payload: list = field(default_factory=lambda: [0, 0])
    first_ns: int | None = None
    last_ns: int | None = None
    spaces: tuple = field(default_factory=lambda: (_Space(), _Space()))


def _be16(b, rows, off):
    return (b[rows, off].astype(np.int64) << 8) | b[rows, off + 1]


def _be32(b, rows, off):
    return ((b[rows, off].astype(np.int64) << 24) | (b[rows, off + 1].astype(np.int64) << 16)
            | (b[rows, off + 2].astype(np.int64) << 8) | b[rows, off + 3])


def _port_dirs(scan: "_PortScan", fid: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Direction on the port of packets (flow ``fid``, flow direction ``d``): 1 in, 2 out,
    0 unknown (or not a flow: ``fid`` < 0)."""
    code0 = np.array([{"in": 1, "out": 2}.get(f.port_dir0, 0) for f in scan.flows] + [0], dtype=np.int64)
    c = code0[np.where(fid >= 0, fid, len(scan.flows))]
    return np.where((d == 1) & (c > 0), 3 - c, c)


def _signed32(d):
    return ((d + _TWO31) % _TWO32) - _TWO31


def _endpoint(raw: bytes) -> tuple[str, int]:
    """18 key bytes (IPv6 or IPv4-mapped address, big-endian port) -> (address, port)."""
    a = ipaddress.IPv6Address(raw[:16])
    return (str(a.ipv4_mapped) if a.ipv4_mapped else str(a)), int.from_bytes(raw[16:18], "big")


class _PortScan:
    """One pass over one port's pcap: the flows, and each chunk handed to ``sink``.

    ``sink(chunk)`` gets a dict of arrays over the chunk's records: ``ts_ns`` (int64 unix ns),
    ``wire`` (record wire length), ``frame`` (l2 header + IP length, TCP only), ``iplen``,
    ``fid`` (index into :attr:`flows`, -1 for what is not TCP), ``dir`` (0/1, the flow's
    direction), and the scan itself (for ``flows[fid].port_dir0``).
    """

    def __init__(self, path: Path, behind: set[str] = frozenset(), front: set[str] = frozenset(), sink=None):
        self.path, self.behind, self.front, self.sink = path, behind, front, sink
        self.flows: list[_Flow] = []
        self._dirkeys: dict[bytes, tuple[int, int]] = {}  # directed 36-byte key -> (key id, dir)
        self._keys: dict[tuple, int] = {}                   # canonical ends -> key id
        self._current: list[int] = []                       # key id -> its current flow
        self.packets = 0
        self.other_frames = 0
        self.warnings: list[str] = []

    # -- reading
    def run(self) -> "_PortScan":
        from scapy.error import Scapy_Exception  # lazy: scapy is needed only when a capture is read
        from scapy.utils import MTU, RawPcapNgReader, RawPcapReader  # lazy: as above
        try:
            size = self.path.stat().st_size
            rd = RawPcapReader(str(self.path))
        except (Scapy_Exception, OSError) as e:
            self._warn(f"{self.path}: not readable as a pcap file ({e}); no packets read")
            return self
        with rd:
            if isinstance(rd, RawPcapNgReader):  # tcpdump -w writes pcap; a pcapng came from elsewhere
                self._warn(f"{self.path}: a pcapng file, not pcap: skipped (convert it with "
                           f"'tcpdump -r {self.path.name} -w out.pcap')")
                return self
            if rd.linktype != 1:
                self._warn(f"{self.path}: link type {rd.linktype}, not Ethernet (1); skipped")
                return self
            scale_ns = 1 if getattr(rd, "nano", False) else 1000
            K, pos0 = HEADER_BYTES, 0
            consumed, cut = 24, False  # bytes of the file's header and whole records read
            while True:
                rows, metas = [], array("q")  # metas: sec, usec, wirelen, caplen of each record
                ra, me = rows.append, metas.extend
                data = meta = None
                for data, meta in islice(rd, CHUNK_PACKETS):
                    ra(data[:K].ljust(K, b"\0"))
                    me(meta)
                n = len(rows)
                if n and len(data) < min(meta[3], MTU):
                    # only the last record of the file can be short: tcpdump stopped mid-write
                    self._warn(f"{self.path}: truncated in the middle of a record (packet {pos0 + n} holds "
                               f"{len(data)} of {meta[3]} captured bytes): read the {pos0 + n - 1} whole "
                               f"packets before it")
                    rows.pop()
                    del metas[-4:]
                    n -= 1
                    last = cut = True
                else:
                    last = n < CHUNK_PACKETS
                if n:
                    buf = np.frombuffer(b"".join(rows), np.uint8).reshape(n, K)
                    m = np.frombuffer(metas, dtype=np.int64).reshape(n, 4).copy()
                    del rows, metas
                    consumed += 16 * n + int(m[:, 3].sum())
                    self._chunk(buf, m, pos0, scale_ns)
                    pos0 += n
                if last:
                    break
            compressed = type(rd.f).__name__ == "GzipFile"  # scapy also reads .pcap.gz: sizes differ
            if not cut and not compressed and 0 < size - consumed < 16:
                self._warn(f"{self.path}: {size - consumed} bytes after the last whole packet (a record "
                           f"header cut short, tcpdump stopped mid-write): ignored; read {pos0} packets")
        self.packets = pos0
        return self

    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        warnings.warn(msg, PcapWarning, stacklevel=3)

    # -- one chunk
    def _chunk(self, b: np.ndarray, m: np.ndarray, pos0: int, scale_ns: int) -> None:
        n = len(b)
        ts = m[:, 0] * 1_000_000_000 + m[:, 1] * scale_ns
        wire, cap = m[:, 2], np.minimum(m[:, 3], HEADER_BYTES)
        rows = np.arange(n)
        et = _be16(b, rows, 12)
        vlan = (et == 0x8100) | (et == 0x88A8)
        l3 = np.where(vlan, 18, 14)
        et = np.where(vlan, _be16(b, rows, 16), et)
        vb = b[rows, l3].astype(np.int64)
        ihl = (vb & 0x0F) * 4
        v4 = (et == 0x0800) & ((vb >> 4) == 4) & (ihl >= 20)
        v6 = (et == 0x86DD) & ((vb >> 4) == 6)
        frag = ((b[rows, l3 + 6].astype(np.int64) & 0x1F) << 8) | b[rows, l3 + 7]  # IPv4 fragment offset
        proto = np.where(v4, b[rows, l3 + 9], b[rows, l3 + 6])  # IPv6: next header
        l4 = l3 + np.where(v4, ihl, 40)
        tcp = ((v4 & (frag == 0)) | v6) & (proto == 6) & (l4 + 14 <= cap)
        ti = np.flatnonzero(tcp)
        fid = np.full(n, -1, dtype=np.int64)
        dirs = np.zeros(n, dtype=np.int64)
        iplen = np.zeros(n, dtype=np.int64)
        if len(ti):
            self._tcp(b, ti, l3[ti], l4[ti], v4[ti], ts[ti], wire[ti], pos0, fid, dirs, iplen)
        self.other_frames += int(n - len(ti))
        if self.sink is not None:
            frame = np.where(fid >= 0, iplen + l3, 0)
            self.sink({"ts_ns": ts, "wire": wire, "frame": frame, "iplen": iplen, "fid": fid, "dir": dirs}, self)

    def _tcp(self, b, ti, l3, l4, v4, ts, wire, pos0, fid_out, dir_out, iplen_out) -> None:
        m = len(ti)
        tot4 = _be16(b, ti, l3 + 2)
        tot6 = 40 + _be16(b, ti, l3 + 4)
        # a length field of 0 (GSO beyond 64 KiB, IPv6 jumbogram): the record's wire length
        iplen = np.where(v4, np.where(tot4 == 0, wire - l3, tot4), np.where(tot6 == 40, wire - l3, tot6))
        doff = (b[ti, l4 + 12].astype(np.int64) >> 4) * 4
        flags = b[ti, l4 + 13].astype(np.int64)
        seq = _be32(b, ti, l4 + 4)
        ack = _be32(b, ti, l4 + 8)
        payload = np.maximum(iplen - (l4 - l3) - doff, 0)
        # directed key: src address (16, IPv4-mapped for IPv4), src port, dst address, dst port, pad
        key = np.zeros((m, 40), dtype=np.uint8)
        r4, r6 = np.flatnonzero(v4), np.flatnonzero(~v4)
        if len(r4):
            key[r4, 10:12] = 0xFF
            key[r4, 28:30] = 0xFF
            base = l3[r4][:, None]
            key[r4, 12:16] = b[ti[r4][:, None], base + 12 + np.arange(4)]
            key[r4, 30:34] = b[ti[r4][:, None], base + 16 + np.arange(4)]
        if len(r6):
            base = l3[r6][:, None]
            key[r6, 0:16] = b[ti[r6][:, None], base + 8 + np.arange(16)]
            key[r6, 18:34] = b[ti[r6][:, None], base + 24 + np.arange(16)]
        base = l4[:, None]
        key[:, 16:18] = b[ti[:, None], base + np.arange(2)]
        key[:, 34:36] = b[ti[:, None], base + 2 + np.arange(2)]
        words = key.view(np.uint64)  # (m, 5)
        h = words[:, 0].copy()
        for j in range(1, 5):
            h = (h * np.uint64(0x9E3779B97F4A7C15)) ^ words[:, j]
        codes, _ = pd.factorize(h)
        _, first = np.unique(codes, return_index=True)
        if not (words == words[first][codes]).all():  # a hash collision: exact (slower) grouping
            _, first, codes = np.unique(key.view(f"V{key.shape[1]}").ravel(), return_index=True, return_inverse=True)
        ukid = np.empty(len(first), dtype=np.int64)
        udir = np.empty(len(first), dtype=np.int64)
        for u, i in enumerate(first):
            ukid[u], udir[u] = self._dirkey(key[i].tobytes())
        kid = ukid[codes]
        d = udir[codes]
        pos = pos0 + np.arange(m)
        # flows: the current flow of each key, split where a new connection (a SYN with another
        # initial sequence number) reuses the 4-tuple
        fid = np.array(self._current, dtype=np.int64)[kid]
        kfirst = {}  # key id -> its first packet in this chunk
        for u, i in enumerate(first):
            kfirst[int(ukid[u])] = min(kfirst.get(int(ukid[u]), m), int(i))
        syn = np.flatnonzero((flags & (_SYN | _ACK)) == _SYN)
        for i in syn:
            k = int(kid[i])
            f = self.flows[self._current[k]]
            isn = int(seq[i])
            if f.syn_isn is None and (sum(f.packets) == 0 and kfirst.get(k, m) >= i):
                f.syn_isn, f.syn_dir = isn, int(d[i])
            elif f.syn_isn != isn and (sum(f.packets) > 0 or kfirst.get(k, m) < i):
                nf = self._new_flow(f.ends, k, f.port_dir0)
                self._current[k] = nf
                self.flows[nf].syn_isn, self.flows[nf].syn_dir = isn, int(d[i])
                kfirst[k] = int(i)
                sel = (kid == k) & (np.arange(m) >= i)
                fid[sel] = nf
        sa = np.flatnonzero((flags & (_SYN | _ACK)) == (_SYN | _ACK))
        for i in sa:
            f = self.flows[fid[i]]
            if f.synack_dir is None:
                f.synack_dir = int(d[i])
        fid_out[ti], dir_out[ti], iplen_out[ti] = fid, d, iplen
        # per flow and direction: counts, bytes, first and last packet
        F = len(self.flows)
        g = fid * 2 + d
        cnt = np.bincount(g, minlength=2 * F)
        byt = np.bincount(g, weights=iplen, minlength=2 * F)
        pay = np.bincount(g, weights=payload, minlength=2 * F)
        tmin = np.full(F, np.iinfo(np.int64).max, dtype=np.int64)
        tmax = np.full(F, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(tmin, fid, ts)
        np.maximum.at(tmax, fid, ts)
        uf, fi = np.unique(fid, return_index=True)
        for f_id, i in zip(uf, fi):
            f = self.flows[f_id]
            for dd in (0, 1):
                j = 2 * f_id + dd
                f.packets[dd] += int(cnt[j])
                f.bytes[dd] += int(byt[j])
                f.payload[dd] += int(pay[j])
            lo, hi = int(tmin[f_id]), int(tmax[f_id])
            f.first_ns = lo if f.first_ns is None else min(f.first_ns, lo)
            f.last_ns = hi if f.last_ns is None else max(f.last_ns, hi)
            if f.first_dir is None:
                f.first_dir = int(d[i])
        self._sequences(g, pos, seq, ack, flags, payload, ts)

    def _dirkey(self, raw: bytes) -> tuple[int, int]:
        hit = self._dirkeys.get(raw)
        if hit is None:
            src, dst = raw[:18], raw[18:36]
            a, bb = (src, dst) if src <= dst else (dst, src)
            ends = (_endpoint(a), _endpoint(bb))
            k = self._keys.get(ends)
            if k is None:
                k = self._keys[ends] = len(self._current)
                ip0, ip1 = ends[0][0], ends[1][0]
                pd0 = ("in" if ip0 in self.behind and ip1 in self.front else
                       "out" if ip0 in self.front and ip1 in self.behind else None)
                self._current.append(-1)
                self._current[k] = self._new_flow(ends, k, pd0)
            hit = self._dirkeys[raw] = (k, 0 if src == a else 1)
        return hit

    def _new_flow(self, ends, k, port_dir0) -> int:
        self.flows.append(_Flow(ends=ends, key=k, port_dir0=port_dir0))
        return len(self.flows) - 1

    # -- sequence numbers: retransmissions and RTT
    def _sequences(self, g, pos, seq, ack, flags, payload, ts) -> None:
        """Events of each sequence space (flow x direction), in capture order: the sequence
        number of every packet sent in that direction and the ACK number of every packet with
        ACK sent the other way. Consecutive values of a space are unwrapped by their signed
        32-bit difference (a connection's window is far below 2**31), so a space crossing
        2**32 keeps increasing."""
        isack = (flags & _ACK) != 0
        ai = np.flatnonzero(isack)
        S = np.concatenate([g, g[ai] ^ 1])
        P = np.concatenate([pos, pos[ai]])
        V = np.concatenate([seq, ack[ai]])
        KIND = np.concatenate([np.zeros(len(g), np.int8), np.ones(len(ai), np.int8)])
        PL = np.concatenate([payload, np.zeros(len(ai), np.int64)])
        TS = np.concatenate([ts, ts[ai]])
        order = np.lexsort((KIND, P, S))
        S, P, V, KIND, PL, TS = S[order], P[order], V[order], KIND[order], PL[order], TS[order]
        n = len(S)
        starts = np.flatnonzero(np.r_[True, S[1:] != S[:-1]])
        ends = np.r_[starts[1:], n]
        dd = np.zeros(n, dtype=np.int64)
        dd[1:] = _signed32(V[1:] - V[:-1])
        dd[starts] = 0
        cs = np.cumsum(dd)
        spaces = [self.flows[s >> 1].spaces[s & 1] for s in S[starts]]
        u0 = np.array([V[a] if sp.ref is None else sp.ref + int(_signed32(V[a] - sp.ref))
                       for sp, a in zip(spaces, starts)], dtype=np.int64)
        grp = np.repeat(np.arange(len(starts)), ends - starts)
        U = cs - cs[starts][grp] + u0[grp]
        for sp, a, e in zip(spaces, starts, ends):
            sp.ref = int(U[e - 1])
            self._space(sp, U[a:e], KIND[a:e], PL[a:e], TS[a:e], P[a:e])

    @staticmethod
    def _space(sp: _Space, U, KIND, PL, TS, P) -> None:
        """Retransmissions and RTT samples of one space's events in one chunk (see :func:`flows`)."""
        isseq = KIND == 0
        data = isseq & (PL > 0)
        st = U[data]
        en = st + PL[data]
        retx = []
        orig = None
        if len(st):
            cm = np.maximum.accumulate(en)
            prev = np.empty_like(en)
            prev[0] = sp.max_end
            prev[1:] = np.maximum(cm[:-1], sp.max_end)
            if sp.max_end == _NEG:
                sp.holes = [[_NEG, int(st[0])]]  # nothing below the first data seen was seen
            cand = st < prev
            gap = (st > prev) & (prev > _NEG)
            ts_d, pos_d = TS[data], P[data]
            if cand.any() or gap.any():
                holes = sp.holes
                for i in np.flatnonzero(cand | gap):
                    s, e, pm = int(st[i]), int(en[i]), int(prev[i])
                    if gap[i]:
                        holes.append([pm, s])
                        continue
                    hi = min(e, pm)
                    unseen = sum(max(0, min(h1, hi) - max(h0, s)) for h0, h1 in holes)
                    if unseen < hi - s:
                        sp.retransmits += 1
                        sp.retransmit_ns.append(int(ts_d[i]))
                        retx.append((s, e, int(pos_d[i])))
                    nh = []
                    for h0, h1 in holes:  # remove [s, e) from the holes
                        if h1 <= s or h0 >= e:
                            nh.append([h0, h1])
                        else:
                            if h0 < s:
                                nh.append([h0, s])
                            if h1 > e:
                                nh.append([e, h1])
                    holes[:] = nh
                # forget holes more than 2**31 below the data: no segment can reach back there
                holes[:] = [h for h in holes if h[1] > max(sp.max_end, int(cm[-1])) - _TWO31]
            sp.max_end = max(sp.max_end, int(cm[-1]))
            keep = ~cand
            orig = (st[keep], en[keep], ts_d[keep], pos_d[keep])
        # RTT: each original segment (neither a retransmission nor a hole filled) to the first
        # later ACK covering its end; Karn: none for a segment whose bytes were sent again
        # before that ACK
        parts = [x for x in (sp.pend, orig) if x is not None and len(x[0])]
        if not parts:
            return
        o_st, o_en, o_ts, o_pos = (np.concatenate(c) for c in zip(*parts)) if len(parts) > 1 else parts[0]
        ack = ~isseq
        ua, ta, pa = U[ack], TS[ack], P[ack]
        if len(ua):
            cma = np.maximum.accumulate(ua)
            j1 = np.searchsorted(cma, o_en, "left")
            j2 = np.searchsorted(pa, o_pos, "right")
            found = j1 < len(ua)
            ok = found & (j1 >= j2)
            ack_pos = np.where(found, pa[np.minimum(j1, len(ua) - 1)], np.iinfo(np.int64).max)
        else:
            found = ok = np.zeros(len(o_en), dtype=bool)
            ack_pos = np.full(len(o_en), np.iinfo(np.int64).max, dtype=np.int64)
            j1 = np.zeros(len(o_en), dtype=np.int64)
        valid = np.ones(len(o_en), dtype=bool)
        for s, e, p in retx:
            valid &= ~((o_st < e) & (o_en > s) & (o_pos < p) & (ack_pos > p))
        take = ok & valid
        if take.any():
            sp.rtt_ns.append(ta[j1[take]] - o_ts[take])
        keep = ~found & valid
        sp.pend = (o_st[keep], o_en[keep], o_ts[keep], o_pos[keep]) if keep.any() else None


# ------------------------------------------------------------------------------------ the API

@dataclass
class _Ctx:
    run: Run
    scale: float
    t0: float | None
    ports: list[dict]


def _context(run_dir) -> _Ctx:
    run = run_dir if isinstance(run_dir, Run) else load(run_dir)
    ports = read_ports(run.path)
    scale = float((run.spec or {}).get("scale") or 1.0)
    t0 = run.t0
    if t0 is None:
        started = [float(p["started"]) for p in ports if isinstance(p.get("started"), (int, float))]
        t0 = min(started) if started else None
    return _Ctx(run=run, scale=scale, t0=t0, ports=ports)


def _select(ctx: _Ctx, port: str | None) -> list[dict]:
    if port is None:
        return ctx.ports
    sel = [p for p in ctx.ports if p["port"] == port]
    if not sel:
        raise CaptureError(f"port {port!r} was not captured in {ctx.run.path}; captured: "
                           + (", ".join(p["port"] for p in ctx.ports) or "none"))
    return sel


def _scan(ctx: _Ctx, entry: dict, sink=None) -> _PortScan | None:
    path = ctx.run.path / "traces" / "pcap" / Path(str(entry.get("file") or f"{entry['port']}.pcap")).name
    if not path.is_file():
        warnings.warn(f"{path}: missing (tcpdump on {entry['port']} wrote nothing)", PcapWarning, stacklevel=3)
        return None
    behind, front = ports_behind(ctx.run.topology, entry["port"])
    return _PortScan(path, behind, front, sink).run()


def _emu(ctx: _Ctx, t_unix):
    """unix s -> emulated unix s (identity when scale is 1)."""
    if ctx.scale == 1.0 or ctx.t0 is None:
        return t_unix
    return ctx.t0 + (t_unix - ctx.t0) / ctx.scale


def _median_ms(chunks, scale) -> tuple[float, int]:
    if not chunks:
        return math.nan, 0
    v = np.concatenate(chunks)
    return float(np.median(v)) / 1e6 / scale, len(v)


def _rows(ctx: _Ctx, port: str, scan: _PortScan, owners: _Owners, host_of: dict, procs: dict) -> list[dict]:
    out = []
    for fid, f in enumerate(scan.flows):
        if sum(f.packets) == 0:
            continue
        (ip0, p0), (ip1, p1) = f.ends
        if f.syn_dir is not None:
            fwd, how = f.syn_dir, "syn"
        elif f.synack_dir is not None:
            fwd, how = 1 - f.synack_dir, "syn-ack"
        elif owners.is_listener(ip0, p0) != owners.is_listener(ip1, p1):
            fwd, how = (1 if owners.is_listener(ip0, p0) else 0), "listener"
        elif p0 != p1:
            fwd, how = (0 if p0 > p1 else 1), "port"
        else:
            fwd, how = f.first_dir or 0, "first-packet"
        rev = 1 - fwd
        (sip, sport), (dip, dport) = f.ends[fwd], f.ends[rev]
        t_raw = f.first_ns / 1e9
        sproc = owners.owner(sip, sport, dip, dport, t_raw)
        dproc = owners.owner(dip, dport, sip, sport, t_raw)
        sp, dp = procs.get(sproc) or {}, procs.get(dproc) or {}
        r_f, n_f = _median_ms(f.spaces[fwd].rtt_ns, ctx.scale)
        r_r, n_r = _median_ms(f.spaces[rev].rtt_ns, ctx.scale)
        pdir = f.port_dir0 if fwd == 0 else {"in": "out", "out": "in"}.get(f.port_dir0)
        first, last = _emu(ctx, f.first_ns / 1e9), _emu(ctx, f.last_ns / 1e9)
        out.append({
            "port": port, "flow_id": fid, "proto": "tcp", "src_ip": sip, "src_port": sport, "dst_ip": dip,
            "dst_port": dport, "initiator": how, "src_host": host_of.get(sip), "dst_host": host_of.get(dip),
            "src_proc": sproc, "dst_proc": dproc, "src_role": sp.get("role"), "src_rank": sp.get("rank"),
            "dst_role": dp.get("role"), "dst_rank": dp.get("rank"), "fwd_on_port": pdir,
            "bytes_fwd": f.bytes[fwd], "bytes_rev": f.bytes[rev], "packets_fwd": f.packets[fwd],
            "packets_rev": f.packets[rev], "payload_bytes_fwd": f.payload[fwd], "payload_bytes_rev": f.payload[rev],
            "first_ts": first, "last_ts": last, "duration_s": last - first,
            "retransmits_fwd": f.spaces[fwd].retransmits, "retransmits_rev": f.spaces[rev].retransmits,
            "rtt_ms": r_f if n_f >= n_r else r_r, "rtt_ms_fwd": r_f, "rtt_ms_rev": r_r,
            "rtt_samples_fwd": n_f, "rtt_samples_rev": n_r, "_fwd": fwd, "_first_raw": t_raw,
        })
    return out


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=FLOW_COLUMNS + ["_fwd", "_first_raw"])
    for c in ("src_port", "dst_port", "bytes_fwd", "bytes_rev", "packets_fwd", "packets_rev", "payload_bytes_fwd",
              "payload_bytes_rev", "retransmits_fwd", "retransmits_rev", "rtt_samples_fwd", "rtt_samples_rev",
              "flow_id"):
        df[c] = df[c].astype("int64")
    for c in ("src_rank", "dst_rank"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    for c in ("first_ts", "last_ts", "duration_s", "rtt_ms", "rtt_ms_fwd", "rtt_ms_rev"):
        df[c] = df[c].astype("float64")
    for c in ("src_host", "dst_host", "src_proc", "dst_proc", "src_role", "dst_role", "fwd_on_port"):
        # object columns holding None for "unknown" (pandas would infer a string dtype with NaN)
        df[c] = pd.Series([v if isinstance(v, str) else None for v in df[c]], index=df.index, dtype=object)
    return df


def _analyse(ctx: _Ctx, entries: list[dict], sink_for=None) -> pd.DataFrame:
    owners = _Owners(read_endpoints(ctx.run.path))
    host_of = _host_of_ip(ctx.run.topology)
    procs = {p.get("name"): p for p in (ctx.run.processes or {}).get("processes", [])}
    rows = []
    for e in entries:
        scan = _scan(ctx, e, sink_for(e) if sink_for else None)
        if scan is not None:
            rows += _rows(ctx, e["port"], scan, owners, host_of, procs)
    df = _frame(rows)
    if ctx.t0 is None and ctx.scale != 1.0 and not df.empty:  # nothing else recorded: the first packet
        t0 = float(df["_first_raw"].min())
        for c in ("first_ts", "last_ts"):
            df[c] = t0 + (df[c] - t0) / ctx.scale
        df["duration_s"] = df["last_ts"] - df["first_ts"]
    return df.sort_values(["port", "first_ts", "flow_id"], kind="stable").reset_index(drop=True)


def flows(run_dir, port: str | None = None) -> pd.DataFrame:
    """One row per TCP connection per captured port of a run.

    Args:
        run_dir: a run directory (or a loaded :class:`analysis.load.Run`) with
            ``traces/pcap/ports.json``.
        port: one captured port (``tor1-eth3``); None for every port of ``ports.json``.

    Returns:
        DataFrame sorted by ``port``, ``first_ts``, with columns :data:`FLOW_COLUMNS`:

        ``port``; ``flow_id`` (int, unique within the port: the key of :func:`flow_rates`);
        ``proto`` (``tcp``); ``src_ip, src_port, dst_ip, dst_port``: the connection oriented
        from its initiator; ``initiator``: how it was told, in this order: ``syn`` (the end
        that sent a SYN without ACK), ``syn-ack`` (the other end of a SYN-ACK), ``listener``
        (the other end of an address:port that ``endpoints.csv`` shows listening), ``port``
        (no handshake captured and no listener known: the end with the higher port is the
        client, as ephemeral ports lie above configured ones; gloo listens on ephemeral ports
        too, so this guess is the weakest), ``first-packet`` (equal ports: the sender of the
        first packet). A 4-tuple reused by a new connection (a SYN with another initial
        sequence number after packets of the old one) starts a new row.

        ``src_host, dst_host``: the host owning the address (``topology.json``), None outside
        it. ``src_proc, dst_proc``: the training process owning the endpoint, from
        ``endpoints.csv`` (the socket local=this end, remote=the other; else any socket of
        that local address and port; else a listener on that port; nearest sample in time if
        several), None if unknown (not a training process's socket, or one the sampler missed:
        the host's process is not guessed). ``src_role, src_rank, dst_role, dst_rank``: from
        ``processes.json`` (ranks nullable ints). ``fwd_on_port``: ``in`` if the initiator's
        packets enter the switch through the port, ``out`` if they leave by it (bwm-ng's
        convention), None when the topology cannot tell (see :func:`ports_behind`).

        ``bytes_fwd, bytes_rev``: sums of IP total lengths (bytes) from the initiator and
        back; ``packets_fwd, packets_rev``; ``payload_bytes_fwd, payload_bytes_rev``: IP
        length minus IP and TCP header lengths. ``first_ts, last_ts``: first and last packet,
        emulated unix s (see the module doc); ``duration_s`` their difference.

        ``retransmits_fwd, retransmits_rev``: data segments (TCP payload > 0) any byte of
        whose sequence range had already passed this port in that direction. Sequence numbers
        are unwrapped across 2**32. A segment filling a gap that was never seen here (its
        first copy was lost before the port) is not counted: it crossed the port once. Data
        sent before the capture began counts as unseen. SYNs, FINs and zero-length probes
        (keep-alive, window probes) carry no data and are never counted. Packets tcpdump itself
        dropped (``packets_dropped`` in ``ports.json``) are missing from every figure; a
        segment whose first copy the capture dropped looks like a gap fill.

        ``rtt_ms_fwd``: median over the initiator's data segments of the time from the
        segment to the first later ACK from the other end covering its last byte, in
        emulated ms. It is taken at the capture point, so it is the round trip from the port
        to the receiver (``dst``) and back, not the sender's RTT. Karn's rule: segments that
        are retransmissions or fill a gap get no sample, nor do segments whose bytes pass
        the port again before that ACK. ``rtt_ms_rev`` the same for the other direction (port
        to ``src`` and back). ``rtt_ms``: the one of the two with more samples (the bulk
        direction). NaN where no sample exists; ``rtt_samples_fwd, rtt_samples_rev``:
        samples taken. Delayed ACKs are part of the estimate (Linux delays at most ~40 ms).

    Warns:
        PcapWarning: a pcap file truncated (read up to its last whole packet), missing or
            unreadable.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
        CaptureError: the run has no ``ports.json``; ``port`` was not captured.
    """
    ctx = _context(run_dir)
    df = _analyse(ctx, _select(ctx, port))
    return df[FLOW_COLUMNS]


def retransmissions(run_dir, port: str | None = None) -> pd.DataFrame:
    """When each retransmitted segment passed a captured port (the rule of :func:`flows`).

    Returns:
        DataFrame with ``port``, ``flow_id`` (as in :func:`flows`), ``sender_ip,
        sender_port`` (the end that retransmitted) and ``time`` (emulated unix s), sorted by
        port and time; one row per retransmitted segment, so that its rows per port and
        flow add up to ``retransmits_fwd + retransmits_rev``.

    Raises:
        CaptureError: ``port`` was not captured.
    """
    ctx = _context(run_dir)
    rows = []
    for e in _select(ctx, port):
        scan = _scan(ctx, e)
        if scan is None:
            continue
        for fid, f in enumerate(scan.flows):
            for d, sp in enumerate(f.spaces):
                ip, sport = f.ends[d]
                rows += [{"port": e["port"], "flow_id": fid, "sender_ip": ip, "sender_port": sport,
                          "time": _emu(ctx, ns / 1e9)} for ns in sp.retransmit_ns]
    df = pd.DataFrame(rows, columns=["port", "flow_id", "sender_ip", "sender_port", "time"])
    return df.sort_values(["port", "time"], kind="stable").reset_index(drop=True)


def flow_labels(df: pd.DataFrame) -> list[str]:
    """``src_proc->dst_proc`` for each row of a :func:`flows` frame; an end whose process is
    unknown is named ``ip:port``."""
    out = []
    for sp, dp, si, so, di, do in zip(df["src_proc"], df["dst_proc"], df["src_ip"], df["src_port"], df["dst_ip"],
                                      df["dst_port"]):
        a = sp if isinstance(sp, str) and sp else f"{si}:{so}"
        b = dp if isinstance(dp, str) and dp else f"{di}:{do}"
        out.append(f"{a}->{b}")
    return out


def _auto_bin_s(ctx: _Ctx, entries: list[dict]) -> float:
    spans = [float(e["stopped"]) - float(e["started"]) for e in entries
             if isinstance(e.get("started"), (int, float)) and isinstance(e.get("stopped"), (int, float))]
    span = max(spans) / ctx.scale if spans and max(spans) > 0 else 20.0
    raw = span / 200.0
    exp = 10.0 ** math.floor(math.log10(raw))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw)


def flows_and_rates(run_dir, port: str, bin_s: float | None = None) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """:func:`flows` of one port and its :func:`flow_rates` in every direction, from one read
    of its pcap.

    Returns:
        ``(flows_frame, {"both": rates, "out": rates, "in": rates})``: the frames of
        :func:`flows` and :func:`flow_rates` (one per ``direction``; all three share the same
        bins, and a direction's frame has a column only for the flows with bytes in it).

    Raises:
        CaptureError, ValueError: as :func:`flow_rates`.
    """
    ctx = _context(run_dir)
    entries = _select(ctx, port)
    if bin_s is None:
        bin_s = _auto_bin_s(ctx, entries)
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    acc = []
    state = {"origin": None}

    def sink(chunk, scan):
        fid = chunk["fid"]
        idx = np.flatnonzero(fid >= 0)
        if not len(idx):
            return
        if state["origin"] is None:
            state["origin"] = ctx.t0 if ctx.t0 is not None else float(chunk["ts_ns"][idx].min()) / 1e9
        f = fid[idx]
        pdir = np.array(["", "in", "out"], dtype=object)[_port_dirs(scan, f, chunk["dir"][idx])]
        t = chunk["ts_ns"][idx] / 1e9
        k = np.floor((t - state["origin"]) / ctx.scale / bin_s).astype(np.int64)
        acc.append(pd.DataFrame({"bin": k, "flow": f, "dir": pdir, "bytes": chunk["iplen"][idx]})
                   .groupby(["bin", "flow", "dir"], sort=False)["bytes"].sum())

    fl = _analyse(ctx, entries, sink_for=lambda e: sink)
    s = pd.concat(acc).groupby(level=[0, 1, 2]).sum() if acc else None
    out = {}
    for direction in ("both", "out", "in"):
        if s is None:
            rates = pd.DataFrame(index=pd.Index([], dtype="float64"))
        else:
            part = s if direction == "both" else s[s.index.get_level_values("dir") == direction]
            wide = part.groupby(level=["bin", "flow"]).sum().unstack("flow", fill_value=0)
            bins = s.index.get_level_values("bin")
            wide = wide.reindex(range(int(bins.min()), int(bins.max()) + 1), fill_value=0)
            rates = wide.astype("float64") / bin_s
            rates.index = np.round(rates.index.to_numpy(np.float64) * bin_s, 9)  # bin starts, to the ns
        rates.index.name = "time_s"
        rates.columns.name = "flow_id"
        rates.attrs.update({"bin_s": bin_s, "direction": direction, "port": port, "t0": state["origin"],
                            "unit": "bytes/s (emulated)"})
        out[direction] = rates
    return fl[FLOW_COLUMNS], out


def flow_rates(run_dir, port: str, bin_s: float | None = None, direction: str = "both") -> pd.DataFrame:
    """Bytes per second of each flow on one port, over time (for a stacked rate plot).

    Args:
        run_dir: a run directory (or :class:`analysis.load.Run`) with a packet capture.
        port: a captured port.
        bin_s: bin width in emulated seconds; None picks 1, 2 or 5 x 10^k giving about 200
            bins over the port's capture (0.1 s when ``ports.json`` has no times).
        direction: ``both`` (every packet), ``out`` (packets leaving the switch through the
            port) or ``in`` (entering it); flows whose direction on the port is unknown
            (``fwd_on_port`` None) count only in ``both``.

    Returns:
        DataFrame indexed by ``time_s`` (start of each bin, emulated seconds from the run's
        ``t0``, see the module doc; every bin from the first to the last packet, empty ones
        0), one column per ``flow_id`` of :func:`flows` for that port, values in bytes/s of the
        emulated network (IP lengths in the bin / ``bin_s``). ``attrs``: ``bin_s``,
        ``direction``, ``port``, ``t0`` (unix s), ``unit``.

    Raises:
        CaptureError: no capture, or ``port`` not captured.
        ValueError: ``bin_s`` <= 0 or an unknown ``direction``.
    """
    if direction not in ("both", "in", "out"):
        raise ValueError(f"direction must be both, in or out, got {direction!r}")
    return flows_and_rates(run_dir, port, bin_s=bin_s)[1][direction]


def check_against_counters(run_dir) -> pd.DataFrame:
    """Each captured port's flow bytes against its bwm-ng byte counters over the same interval.

    bwm-ng (``traces/bwm-ng.csv``, :func:`analysis.traces.parse_bwm_ng`) gives per-sample byte
    deltas ``bytes_in``/``bytes_out`` of each port, counting whole Ethernet frames without
    FCS (``tests/data/README.md``: a UDP datagram of 1000 bytes counts 1042). A flow's bytes
    are IP lengths, so each captured packet is 14 bytes short of the frame (18 with a VLAN
    tag): the comparison adds each packet's own link header, ``flow_frame_bytes = flow_bytes
    + 14 x flow_packets`` for untagged frames, and compares that (``ratio``); ``ratio_ip``
    compares the bare IP lengths (lower by about 14 / mean packet size).

    The interval: the bwm-ng samples of the port whose whole interval (previous sample,
    this sample] lies inside the capture window (``started``..``stopped`` of ``ports.json``,
    else the first and last packet), from the first such interval's start to the last one's
    end; packets are counted by timestamp inside it (both clocks are this machine's).

    Returns:
        DataFrame with columns :data:`CHECK_COLUMNS`, one row per captured port with a pcap:
        ``start, end`` (emulated unix s), ``samples`` (bwm-ng intervals used),
        ``flow_packets, flow_bytes`` (TCP packets and IP bytes of the flows in the interval),
        ``flow_frame_bytes``, ``other_frames, other_frame_bytes`` (captured frames that are
        not TCP, wire lengths: 0 under the usual ``tcp`` filter), ``counter_packets,
        counter_bytes`` (bwm-ng in + out), ``ratio`` = flow_frame_bytes / counter_bytes,
        ``ratio_ip`` = flow_bytes / counter_bytes, ``ratio_all`` = (flow_frame_bytes +
        other_frame_bytes) / counter_bytes; per direction (port's point of view, only the
        flows whose direction is known, see :func:`ports_behind`): ``flow_frame_bytes_out,
        counter_bytes_out, ratio_out``, and the same for ``in`` (the two ratios are NaN when
        some flow's direction is unknown). A ratio is NaN when the counters are 0 or the port
        has no bwm-ng samples in the window.

    Raises:
        CaptureError: the run has no packet capture.
    """
    ctx = _context(run_dir)
    bwm = tr.parse_bwm_ng(ctx.run.path / "traces" / "bwm-ng.csv")  # unix time, like the packets
    out = []
    for e in ctx.ports:
        port = e["port"]
        g = bwm[bwm["iface"] == port].sort_values("time", kind="stable").reset_index(drop=True)
        t = g["time"].to_numpy(float)
        # per bwm-ng interval k (t[k-1], t[k]]: bin k; bin 0 and bin len(t) lie outside them all
        names = ("fp", "fb", "ffb", "of", "ob", "out", "in")
        bins = {q: np.zeros(len(t) + 1, dtype=np.int64) for q in names}
        span = [math.inf, -math.inf]

        def sink(chunk, scan, bins=bins, t=t, span=span):
            ts = chunk["ts_ns"] / 1e9
            span[0], span[1] = min(span[0], float(ts.min())), max(span[1], float(ts.max()))
            k = np.searchsorted(t, ts, "left")
            fid = chunk["fid"]
            f, o = fid >= 0, fid < 0
            L = len(t) + 1

            def add(q, sel, w=None):
                bins[q] += np.bincount(k[sel], weights=None if w is None else w[sel], minlength=L).astype(np.int64)

            add("fp", f)
            add("fb", f, chunk["iplen"])
            add("ffb", f, chunk["frame"])
            add("of", o)
            add("ob", o, chunk["wire"])
            pdir = _port_dirs(scan, fid, chunk["dir"])
            add("out", pdir == 2, chunk["frame"])
            add("in", pdir == 1, chunk["frame"])

        if _scan(ctx, e, sink) is None:
            continue
        lo = float(e["started"]) if isinstance(e.get("started"), (int, float)) else span[0]
        hi = float(e["stopped"]) if isinstance(e.get("stopped"), (int, float)) else span[1]
        i, j = _window(t, lo, hi)
        n = max(j - i, 0)
        tot = {q: int(bins[q][i + 1:j + 1].sum()) if n else 0 for q in names}
        sel = g.iloc[i + 1:j + 1] if n else g.iloc[0:0]
        cin, cout = int(sel["bytes_in"].sum()), int(sel["bytes_out"].sum())
        cpk = int(sel["packets_in"].sum() + sel["packets_out"].sum())

        split = tot["out"] + tot["in"] == tot["ffb"]  # every flow's direction on the port known

        def ratio(x, y):
            return x / y if y else math.nan

        out.append({"port": port, "start": _emu(ctx, float(t[i])) if n else math.nan,
                    "end": _emu(ctx, float(t[j])) if n else math.nan, "samples": n,
                    "flow_packets": tot["fp"], "flow_bytes": tot["fb"], "flow_frame_bytes": tot["ffb"],
                    "other_frames": tot["of"], "other_frame_bytes": tot["ob"], "counter_packets": cpk,
                    "counter_bytes": cin + cout, "ratio": ratio(tot["ffb"], cin + cout),
                    "ratio_ip": ratio(tot["fb"], cin + cout), "ratio_all": ratio(tot["ffb"] + tot["ob"], cin + cout),
                    "flow_frame_bytes_out": tot["out"], "counter_bytes_out": cout,
                    "ratio_out": ratio(tot["out"], cout) if split else math.nan,
                    "flow_frame_bytes_in": tot["in"], "counter_bytes_in": cin,
                    "ratio_in": ratio(tot["in"], cin) if split else math.nan})
    return pd.DataFrame(out, columns=CHECK_COLUMNS)


def _window(t: np.ndarray, lo: float, hi: float) -> tuple[int, int]:
    """Indices (i, j) of the bwm-ng samples bounding the intervals (t[k-1], t[k]] that lie
    inside [lo, hi]: intervals i+1 .. j (none when j <= i)."""
    if len(t) < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return 0, 0
    i = int(np.searchsorted(t, lo, "left"))       # first sample at or after lo: an interval starts there
    j = int(np.searchsorted(t, hi, "right")) - 1  # last sample at or before hi: an interval ends there
    return (i, j) if j > i else (0, 0)
