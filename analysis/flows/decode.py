"""Reading one port's pcap file: a vectorised Ethernet/IP/TCP decoder that sorts its packets into TCP flows.

:class:`_PortScan` makes one pass over one file and keeps, per flow (a 4-tuple, split where a
new connection reuses it) and direction, packets, bytes and payload, the first and last
packet, the handshake, and the sequence space: retransmitted segments and ACK-clocked RTT
samples (the rules are those of :func:`analysis.flows.table.flows`); each decoded chunk can
also be handed to a sink.

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
"""

from __future__ import annotations

import ipaddress
import warnings
from array import array
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["CHUNK_PACKETS", "HEADER_BYTES", "PcapWarning"]

CHUNK_PACKETS = 1 << 17
"""pcap records decoded together (about 12 MB of header buffer)."""
HEADER_BYTES = 96
"""Bytes of each record decoded: Ethernet + one VLAN tag (18) + IPv4 with options (60) + the
TCP fields up to the flags (14) = 92."""

_NEG = -(1 << 62)  # below every unwrapped sequence number
_TWO31, _TWO32 = 1 << 31, 1 << 32
_FIN, _SYN, _RST, _ACK = 0x01, 0x02, 0x04, 0x10


class PcapWarning(UserWarning):
    """A pcap file could be read only in part (truncated, unreadable or of another link type)."""


@dataclass
class _Space:
    """One direction's sequence space of one flow (its data, and the ACKs of it)."""

    ref: int | None = None  # last unwrapped value seen (seq or ack)
    max_end: int = _NEG  # highest unwrapped end of data seen
    holes: list = field(default_factory=list)  # [lo, hi) below max_end never seen, sorted
    retransmits: int = 0
    retransmit_ns: list = field(default_factory=list)  # capture time of each retransmitted segment
    pend: tuple | None = None  # (start, end, ts_ns, pos) awaiting their first ACK
    rtt_ns: list = field(default_factory=list)


@dataclass
class _Flow:
    ends: tuple  # ((ip, port) of end 0, (ip, port) of end 1): dir d is sent by end d
    key: int
    port_dir0: str | None  # "in"/"out": direction 0 on the port (None: unknown)
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
    return (
        (b[rows, off].astype(np.int64) << 24)
        | (b[rows, off + 1].astype(np.int64) << 16)
        | (b[rows, off + 2].astype(np.int64) << 8)
        | b[rows, off + 3]
    )


def _port_dirs(scan: _PortScan, fid: np.ndarray, d: np.ndarray) -> np.ndarray:
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
        self._keys: dict[tuple, int] = {}  # canonical ends -> key id
        self._current: list[int] = []  # key id -> its current flow
        self.packets = 0
        self.other_frames = 0
        self.warnings: list[str] = []

    # -- reading
    def run(self) -> _PortScan:
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
                self._warn(
                    f"{self.path}: a pcapng file, not pcap: skipped (convert it with "
                    f"'tcpdump -r {self.path.name} -w out.pcap')"
                )
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
                    self._warn(
                        f"{self.path}: truncated in the middle of a record (packet {pos0 + n} holds "
                        f"{len(data)} of {meta[3]} captured bytes): read the {pos0 + n - 1} whole "
                        f"packets before it"
                    )
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
                self._warn(
                    f"{self.path}: {size - consumed} bytes after the last whole packet (a record "
                    f"header cut short, tcpdump stopped mid-write): ignored; read {pos0} packets"
                )
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
                pd0 = (
                    "in"
                    if ip0 in self.behind and ip1 in self.front
                    else "out"
                    if ip0 in self.front and ip1 in self.behind
                    else None
                )
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
        u0 = np.array(
            [V[a] if sp.ref is None else sp.ref + int(_signed32(V[a] - sp.ref)) for sp, a in zip(spaces, starts)],
            dtype=np.int64,
        )
        grp = np.repeat(np.arange(len(starts)), ends - starts)
        U = cs - cs[starts][grp] + u0[grp]
        for sp, a, e in zip(spaces, starts, ends):
            sp.ref = int(U[e - 1])
            self._space(sp, U[a:e], KIND[a:e], PL[a:e], TS[a:e], P[a:e])

    @staticmethod
    def _space(sp: _Space, U, KIND, PL, TS, P) -> None:
        """Retransmissions and RTT samples of one space's events in one chunk (see
        :func:`analysis.flows.table.flows`)."""
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
