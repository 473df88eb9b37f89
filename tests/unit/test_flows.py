"""analysis.flows on pcaps written with scapy into hand-made run directories (no root, no network).

Every expected figure is computed from the packets as they were built (scapy's own byte
strings and header fields), not from the code under test.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scapy.layers.inet import IP, TCP, UDP, IPOption_NOP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.layers.l2 import ARP, Dot1Q, Ether  # noqa: E402
from scapy.packet import Raw  # noqa: E402
from scapy.utils import PcapReader, RawPcapWriter  # noqa: E402

import analysis  # noqa: E402
from analysis import plots  # noqa: E402
from analysis.flows import (  # noqa: E402
    CaptureError,
    PcapWarning,
    check_against_counters,
    flow_labels,
    flow_rates,
    flows,
    ports_behind,
    retransmissions,
)
from analysis.traces import parse_bwm_ng  # noqa: E402

FLOWS_MOD = importlib.import_module("analysis.flows")  # the package (analysis.flows is the function)
DECODE_MOD = importlib.import_module("analysis.flows.decode")  # where CHUNK_PACKETS is read

HOSTS = {"h1": ("10.0.0.1", 0), "h2": ("10.0.0.2", 0), "h3": ("10.0.0.3", 1), "h4": ("10.0.0.4", 1)}
PROCS = [
    ("worker0", "worker", 0, "h1"),
    ("worker1", "worker", 1, "h2"),
    ("worker2", "worker", 2, "h3"),
    ("server0", "server", 3, "h4"),
    ("server1", "server", 4, "h1"),
]
IP_OF = {h: ip for h, (ip, _) in HOSTS.items()}
UPLINK = "tor1-eth3"  # tor1's end of its uplink: h1, h2 in front, h3, h4 behind
T0 = 1_000.0  # earliest timestamp of the run's traces (its t0)


def eth() -> Ether:
    """An Ethernet header with both addresses given: scapy would otherwise look the destination
    up (ARP, IPv6 neighbour discovery) on this machine's network."""
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def topology() -> dict:
    links = []
    for i, (h, (_ip, rack)) in enumerate(HOSTS.items()):
        tor = f"tor{rack + 1}"
        links.append(
            {
                "class": "host",
                "node1": h,
                "intf1": f"{h}-eth0",
                "node2": tor,
                "intf2": f"{tor}-eth{1 + i % 2}",
                "rack": rack,
                "bw_mbps": 100.0,
            }
        )
    for rack in (0, 1):
        links.append(
            {
                "class": "uplink",
                "node1": f"tor{rack + 1}",
                "intf1": f"tor{rack + 1}-eth3",
                "node2": "core1",
                "intf2": f"core1-eth{rack + 1}",
                "rack": rack,
                "bw_mbps": 200.0,
            }
        )
    return {
        "kind": "rack_core",
        "hosts": [
            {"name": h, "rack": r, "ip": ip, "intfs": [{"name": f"{h}-eth0", "ip": ip}]} for h, (ip, r) in HOSTS.items()
        ],
        "switches": [
            {"name": "tor1", "role": "tor", "rack": 0},
            {"name": "tor2", "role": "tor", "rack": 1},
            {"name": "core1", "role": "core", "rack": None},
        ],
        "links": links,
    }


class Capture:
    """Packets of one port with their capture times (unix s), written as tcpdump -s SNAPLEN would."""

    def __init__(self):
        self.items: list[tuple[float, object]] = []

    def add(self, t: float, pkt) -> None:
        self.items.append((t, pkt))

    def write(self, path: Path, snaplen: int = 128) -> None:
        w = RawPcapWriter(str(path), linktype=1, snaplen=snaplen)
        w.write_header(None)
        for t, p in sorted(self.items, key=lambda x: x[0]):
            raw = bytes(p)
            us = int(round(t * 1e6))
            w.write_packet(
                raw[:snaplen], sec=us // 1_000_000, usec=us % 1_000_000, caplen=min(snaplen, len(raw)), wirelen=len(raw)
            )
        w.close()


class Conn:
    """One TCP connection between (ip, port) ends a and b, building its packets into a Capture.
    ``nxt[end]`` is the next sequence number that end sends."""

    def __init__(self, cap: Capture, a: tuple, b: tuple, isn_a: int = 1000, isn_b: int = 50_000):
        self.cap, self.ends = cap, {"a": a, "b": b}
        self.nxt = {"a": isn_a, "b": isn_b}
        self.pkts = {"a": [], "b": []}

    def _pkt(self, frm, flags, seq, ack=0, payload=b""):
        (sip, sp), (dip, dp) = self.ends[frm], self.ends["b" if frm == "a" else "a"]
        p = eth() / IP(src=sip, dst=dip) / TCP(sport=sp, dport=dp, flags=flags, seq=seq % 2**32, ack=ack % 2**32)
        if payload:
            p = p / Raw(payload)
        return Ether(bytes(p))  # built: lengths filled in

    def send(self, t, frm, flags, seq, ack=0, payload=b""):
        p = self._pkt(frm, flags, seq, ack, payload)
        self.cap.add(t, p)
        self.pkts[frm].append(p)
        return p

    def handshake(self, t, gap=0.0005):
        self.send(t, "a", "S", self.nxt["a"])
        self.nxt["a"] += 1
        self.send(t + gap, "b", "SA", self.nxt["b"], self.nxt["a"])
        self.nxt["b"] += 1
        self.send(t + 2 * gap, "a", "A", self.nxt["a"], self.nxt["b"])

    def data(self, t, frm, n, seq=None, advance=True):
        """A data segment of n bytes (at ``seq``, default the next); returns (seq, end)."""
        other = "b" if frm == "a" else "a"
        s = self.nxt[frm] if seq is None else seq
        self.send(t, frm, "PA", s, self.nxt[other], bytes(n))
        if advance and seq is None:
            self.nxt[frm] += n
        return s, s + n

    def ack(self, t, frm, ackno=None):
        other = "b" if frm == "a" else "a"
        self.send(t, frm, "A", self.nxt[frm], self.nxt[other] if ackno is None else ackno)

    def ip_bytes(self, frm) -> int:
        return sum(p[IP].len for p in self.pkts[frm])

    def payload_bytes(self, frm) -> int:
        return sum(len(p[Raw].load) if Raw in p else 0 for p in self.pkts[frm])


def make_run(
    root: Path,
    captures: dict[str, Capture],
    endpoints: list[tuple] = (),
    scale: float = 1.0,
    started: float = T0,
    stopped: float | None = T0 + 100,
    snaplen: int = 128,
    bpf="tcp",
) -> Path:
    """A run directory holding the captures (port -> Capture), endpoints.csv rows ``(time, proc,
    local_ip, local_port, remote_ip, remote_port, state)`` and an event at T0 (the run's t0)."""
    d = root / "run"
    for sub in ("events", "traces/pcap", "logs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "spec.yaml").write_text(yaml.safe_dump({"name": "flows", "scale": scale, "workload": {"scheme": "ps"}}))
    (d / "topology.json").write_text(json.dumps(topology()))
    (d / "processes.json").write_text(
        json.dumps(
            {
                "processes": [
                    {"name": n, "role": r, "rank": k, "index": k, "host": h, "ip": IP_OF[h]} for n, r, k, h in PROCS
                ]
            }
        )
    )
    event = {"proc": "worker0", "role": "worker", "rank": 0, "thread": "main", "kind": "init", "ts": T0, "dur": 0.0}
    (d / "events" / "worker0.jsonl").write_text(json.dumps(event) + "\n")
    info = {n: (r, k, h) for n, r, k, h in PROCS}
    rows = ["time,proc,role,rank,host,pid,local_ip,local_port,remote_ip,remote_port,state"]
    for t, proc, lip, lport, rip, rport, state in endpoints:
        r, k, h = info[proc]
        rows.append(f"{t},{proc},{r},{k},{h},{1000 + k},{lip},{lport},{rip},{rport},{state}")
    (d / "traces" / "endpoints.csv").write_text("\n".join(rows) + "\n")
    index = []
    for port, cap in captures.items():
        cap.write(d / "traces" / "pcap" / f"{port}.pcap", snaplen=snaplen)
        index.append(
            {
                "port": port,
                "file": f"{port}.pcap",
                "snaplen_bytes": snaplen,
                "filter": bpf,
                "started": started,
                "stopped": stopped,
                "packets_captured": None,
                "packets_dropped": None,
            }
        )
    (d / "traces" / "pcap" / "ports.json").write_text(json.dumps(index))
    return d


def one(df: pd.DataFrame, **match) -> pd.Series:
    sel = df
    for k, v in match.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, f"{len(sel)} rows match {match}:\n{df}"
    return sel.iloc[0]


@pytest.fixture(params=[None, 3], ids=["one-chunk", "chunks-of-3"])
def chunking(request, monkeypatch):
    """Every analysis once in one chunk and once in chunks of 3 records (state carried across)."""
    if request.param:
        monkeypatch.setattr(DECODE_MOD, "CHUNK_PACKETS", request.param)
    return request.param


# --------------------------------------------------------------------------- bytes and ends


def test_bytes_packets_ends_and_attribution(tmp_path, chunking):
    cap = Capture()
    w0, s0 = ("10.0.0.1", 41000), ("10.0.0.4", 5000)
    c1 = Conn(cap, w0, s0)  # worker0 -> server0, handshake captured
    c1.handshake(T0 + 1.0)
    t = T0 + 1.01
    for _ in range(5):
        c1.data(t, "a", 1000)
        c1.ack(t + 0.002, "b")
        t += 0.01
    for _ in range(2):
        c1.data(t, "b", 300)
        c1.ack(t + 0.001, "a")
        t += 0.01
    # server0 connects to worker1's listener on a port above its own: only the listener tells
    c2 = Conn(cap, ("10.0.0.4", 45000), ("10.0.0.2", 50000), isn_a=7, isn_b=9)
    for k in range(3):
        c2.data(T0 + 2.0 + 0.01 * k, "a", 200)
        c2.ack(T0 + 2.005 + 0.01 * k, "b")
    # no handshake, no process known: the higher port is the client
    c3 = Conn(cap, ("10.0.0.1", 33000), ("10.0.0.3", 7000))
    c3.data(T0 + 3.0, "b", 100)
    c3.data(T0 + 3.001, "a", 100)
    # worker2 connects to server1, which shares worker0's host (told apart by its port); the SYN
    # decides, though the initiator has the higher address and the lower port
    c4 = Conn(cap, ("10.0.0.3", 29500), ("10.0.0.1", 60000))
    c4.handshake(T0 + 4.0)
    c4.data(T0 + 4.01, "a", 1448)
    c4.ack(T0 + 4.02, "b")
    eps = [
        (T0 + 1.2, "worker0", "10.0.0.1", 41000, "10.0.0.4", 5000, "ESTABLISHED"),
        (T0 + 0.5, "server0", "0.0.0.0", 5000, "0.0.0.0", 0, "LISTEN"),
        (T0 + 0.5, "worker1", "0.0.0.0", 50000, "0.0.0.0", 0, "LISTEN"),
        (T0 + 2.1, "server0", "10.0.0.4", 45000, "10.0.0.2", 50000, "ESTABLISHED"),
        (T0 + 4.1, "server1", "10.0.0.1", 60000, "10.0.0.3", 29500, "ESTABLISHED"),
        (T0 + 4.1, "worker2", "::ffff:10.0.0.3", 29500, "::ffff:10.0.0.1", 60000, "ESTABLISHED"),
    ]
    d = make_run(tmp_path, {UPLINK: cap}, eps)
    df = analysis.flows(d)
    assert len(df) == 4 and set(df["port"]) == {UPLINK}

    r = one(df, src_port=41000)
    assert (r.src_ip, r.dst_ip, r.dst_port, r.initiator) == ("10.0.0.1", "10.0.0.4", 5000, "syn")
    assert (r.src_host, r.dst_host, r.src_proc, r.dst_proc) == ("h1", "h4", "worker0", "server0")
    assert (r.src_role, r.src_rank, r.dst_role, r.dst_rank) == ("worker", 0, "server", 3)
    assert r.fwd_on_port == "out"  # h1 -> h4 leaves tor1 through its uplink
    assert (r.packets_fwd, r.packets_rev) == (len(c1.pkts["a"]), len(c1.pkts["b"])) == (9, 8)
    assert (r.bytes_fwd, r.bytes_rev) == (c1.ip_bytes("a"), c1.ip_bytes("b"))
    assert (r.payload_bytes_fwd, r.payload_bytes_rev) == (5000, 600) == (c1.payload_bytes("a"), c1.payload_bytes("b"))
    assert r.first_ts == pytest.approx(T0 + 1.0, abs=1e-6) and r.last_ts == pytest.approx(T0 + 1.071, abs=1e-6)
    assert (r.retransmits_fwd, r.retransmits_rev) == (0, 0)

    r = one(df, src_port=45000)
    assert (r.initiator, r.src_proc, r.dst_proc, r.dst_port) == ("listener", "server0", "worker1", 50000)
    assert (r.src_role, r.src_rank, r.dst_role, r.dst_rank) == ("server", 3, "worker", 1)
    assert r.fwd_on_port == "in" and (r.bytes_fwd, r.bytes_rev) == (c2.ip_bytes("a"), c2.ip_bytes("b"))

    r = one(df, dst_port=7000)
    assert (r.initiator, r.src_ip, r.src_port, r.src_host, r.dst_host) == ("port", "10.0.0.1", 33000, "h1", "h3")
    assert r.src_proc is None and r.dst_proc is None and pd.isna(r.src_rank) and pd.isna(r.dst_rank)
    assert (r.packets_fwd, r.packets_rev, r.payload_bytes_fwd, r.payload_bytes_rev) == (1, 1, 100, 100)

    r = one(df, src_port=29500)
    assert (r.initiator, r.src_ip, r.dst_ip, r.dst_port) == ("syn", "10.0.0.3", "10.0.0.1", 60000)
    assert (r.src_proc, r.src_rank, r.dst_proc, r.dst_rank, r.dst_host) == ("worker2", 2, "server1", 4, "h1")
    assert (r.packets_fwd, r.payload_bytes_fwd, r.packets_rev, r.fwd_on_port) == (3, 1448, 2, "in")
    assert flow_labels(df[df["src_port"] == 29500]) == ["worker2->server1"]
    assert flow_labels(df[df["dst_port"] == 7000]) == ["10.0.0.1:33000->10.0.0.3:7000"]
    assert analysis.flows(d, port=UPLINK).equals(df)


def test_reused_four_tuple_is_two_connections_each_with_its_owner(tmp_path):
    cap = Capture()
    a, b = ("10.0.0.1", 41000), ("10.0.0.4", 5000)
    c1 = Conn(cap, a, b, isn_a=100)
    c1.handshake(T0 + 1.0)
    c1.data(T0 + 1.01, "a", 500)
    c1.send(T0 + 1.02, "a", "FA", c1.nxt["a"], c1.nxt["b"])
    c2 = Conn(cap, a, b, isn_a=900_000)  # a later process got the same port
    c2.handshake(T0 + 50.0)
    c2.data(T0 + 50.01, "a", 700)
    eps = [
        (T0 + 1.1, "worker0", "10.0.0.1", 41000, "10.0.0.4", 5000, "ESTABLISHED"),
        (T0 + 50.1, "server1", "10.0.0.1", 41000, "10.0.0.4", 5000, "ESTABLISHED"),
    ]
    df = flows(make_run(tmp_path, {UPLINK: cap}, eps))
    assert len(df) == 2
    first, second = df.iloc[0], df.iloc[1]
    assert (first.src_proc, first.payload_bytes_fwd, first.packets_fwd) == ("worker0", 500, 4)
    assert (second.src_proc, second.payload_bytes_fwd, second.packets_fwd) == ("server1", 700, 3)
    assert first.flow_id != second.flow_id


def test_ipv6_vlan_and_ip_options_against_scapy_dissection(tmp_path, chunking):
    """Per-flow packets, IP bytes and payload equal those scapy's own dissector reads from the
    same (truncated) pcap, over random traffic with IPv4 options, 802.1Q tags and IPv6."""
    rng = random.Random(5)
    cap = Capture()
    ends = [(("10.0.0.1", 40000 + i), ("10.0.0.3", 6000 + i)) for i in range(4)]
    v6 = [(("fd00::1", 41000 + i), ("fd00::3", 7000 + i)) for i in range(2)]
    t = T0 + 1.0
    for _k in range(400):
        t += 0.001
        if rng.random() < 0.3:
            (si, sp), (di, dp) = rng.choice(v6)
            if rng.random() < 0.5:
                (si, sp), (di, dp) = (di, dp), (si, sp)
            l3 = IPv6(src=si, dst=di)
        else:
            (si, sp), (di, dp) = rng.choice(ends)
            if rng.random() < 0.5:
                (si, sp), (di, dp) = (di, dp), (si, sp)
            l3 = IP(src=si, dst=di, options=[IPOption_NOP()] * 4 * rng.randrange(0, 10) if rng.random() < 0.3 else [])
        l2 = eth() / Dot1Q(vlan=7) if rng.random() < 0.2 else eth()
        seg = TCP(
            sport=sp,
            dport=dp,
            flags="PA",
            seq=rng.getrandbits(32),
            ack=rng.getrandbits(32),
            options=[("NOP", None)] * rng.randrange(0, 8),
        )
        cap.add(t, Ether(bytes(l2 / l3 / seg / Raw(bytes(rng.randrange(0, 3000))))))
    cap.add(t + 0.001, Ether(bytes(eth() / IP(src="10.0.0.1", dst="10.0.0.3") / UDP(sport=1, dport=2) / Raw(b"u"))))
    d = make_run(tmp_path, {UPLINK: cap}, bpf=None)
    ref: dict[tuple, list] = {}
    with PcapReader(str(d / "traces" / "pcap" / f"{UPLINK}.pcap")) as rd:
        for p in rd:
            if TCP not in p:
                continue
            l3 = p[IP] if IP in p else p[IPv6]
            iplen = l3.len if IP in p else 40 + l3.plen
            hdr = (l3.ihl * 4 if IP in p else 40) + p[TCP].dataofs * 4
            key = (l3.src, p[TCP].sport, l3.dst, p[TCP].dport)
            r = ref.setdefault(key, [0, 0, 0])
            r[0], r[1], r[2] = r[0] + 1, r[1] + iplen, r[2] + iplen - hdr
    df = flows(d)
    assert len(df) == len(ends) + len(v6)
    for row in df.itertuples():
        fwd = ref.get((row.src_ip, row.src_port, row.dst_ip, row.dst_port), [0, 0, 0])
        rev = ref.get((row.dst_ip, row.dst_port, row.src_ip, row.src_port), [0, 0, 0])
        assert (row.packets_fwd, row.bytes_fwd, row.payload_bytes_fwd) == tuple(fwd)
        assert (row.packets_rev, row.bytes_rev, row.payload_bytes_rev) == tuple(rev)
    assert df["packets_fwd"].sum() + df["packets_rev"].sum() == sum(v[0] for v in ref.values()) == 400


# ------------------------------------------------------------------------- retransmissions


def test_retransmissions_counted_exactly(tmp_path, chunking):
    cap = Capture()
    c = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))
    c.handshake(T0 + 1.0)
    t = T0 + 1.01
    segs = []
    for _ in range(10):
        segs.append(c.data(t, "a", 1000, advance=True))
        t += 0.001
    # S8 was lost before this port: remove its only copy, it comes later and fills the gap
    lost = segs[8]
    cap.items = [(tt, p) for tt, p in cap.items if not (Raw in p and p[TCP].seq == lost[0] and p[IP].src == "10.0.0.1")]
    c.pkts["a"] = [p for p in c.pkts["a"] if not (Raw in p and p[TCP].seq == lost[0])]
    c.data(t + 0.01, "a", 1000, seq=segs[3][0])  # S3 again: 1
    c.data(t + 0.02, "a", 1500, seq=segs[5][0] + 500)  # second half of S5 and S6, coalesced: 1
    c.data(t + 0.03, "a", 1000, seq=lost[0])  # fills the gap: 0
    c.send(t + 0.04, "a", "A", c.nxt["a"] - 1, c.nxt["b"])  # keep-alive probe, no data: 0
    c.ack(t + 0.05, "b")
    c.ack(t + 0.051, "b")  # duplicate ACK: 0
    s, _ = c.data(t + 0.06, "b", 400)
    c.ack(t + 0.07, "a")
    c.data(t + 0.08, "b", 400, seq=s)  # the other way: 1
    c.data(t + 0.09, "b", 100)  # new data after it: 0
    run = make_run(tmp_path, {UPLINK: cap})
    r = one(flows(run), src_port=41000)
    assert (r.retransmits_fwd, r.retransmits_rev) == (2, 1)
    times = retransmissions(run)  # when each one passed the port, and who sent it
    assert list(times["time"]) == pytest.approx([t + 0.01, t + 0.02, t + 0.08])
    assert list(times["sender_port"]) == [41000, 41000, 5000] and set(times["flow_id"]) == {r.flow_id}
    assert r.payload_bytes_fwd == c.payload_bytes("a") == 9 * 1000 + 1000 + 1500 + 1000
    assert r.packets_fwd == len(c.pkts["a"])


def test_retransmissions_across_sequence_wraparound(tmp_path, chunking):
    cap = Capture()
    isn = 2**32 - 2500  # the data crosses 2**32 in its third segment
    c = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000), isn_a=isn, isn_b=2**32 - 10)
    c.handshake(T0 + 1.0)
    t = T0 + 1.01
    segs = []
    for _ in range(8):
        segs.append(c.data(t, "a", 1000))
        c.ack(t + 0.003, "b")
        t += 0.01
    assert segs[2][0] < 2**32 < segs[2][1] and all(s % 2**32 < 2**31 for s, _ in segs[3:])
    c.data(t, "a", 1000, seq=segs[2][0])  # straddles the wrap: 1
    c.data(t + 0.01, "a", 1000, seq=segs[5][0])  # after it: 1
    c.ack(t + 0.02, "b")
    for _ in range(3):  # ACKs in the other space cross 2**32 too
        c.data(t + 0.03, "b", 20)
        c.ack(t + 0.031, "a")
        t += 0.01
    r = one(flows(make_run(tmp_path, {UPLINK: cap})), src_port=41000)
    assert (r.retransmits_fwd, r.retransmits_rev) == (2, 0)
    assert r.payload_bytes_fwd == 10_000 and r.payload_bytes_rev == 60
    assert r.rtt_samples_fwd == 8 and r.rtt_ms_fwd == pytest.approx(3.0, abs=1e-9)
    assert r.rtt_samples_rev == 3 and r.rtt_ms_rev == pytest.approx(1.0, abs=1e-9)


# --------------------------------------------------------------------------------------- RTT


def test_rtt_is_the_constructed_delay_and_follows_karn(tmp_path, chunking):
    cap = Capture()
    c = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))
    c.handshake(T0 + 1.0)
    t = T0 + 1.01
    for _ in range(4):  # port -> receiver (server0) -> port: 3 ms
        c.data(t, "a", 1000)
        c.ack(t + 0.003, "b")
        t += 0.01
    for _ in range(2):  # the other way, port -> worker0 -> port: 1.25 ms
        c.data(t, "b", 500)
        c.ack(t + 0.00125, "a")
        t += 0.01
    # three segments seen here, their ACKs long delayed: resent 200 ms later and ACKed 3 ms after
    # that. Without Karn's rule the originals would give 203 ms samples and the median 203 ms.
    lost = [c.data(t + 0.0001 * k, "a", 1000) for k in range(3)]
    for k, (s, _) in enumerate(lost):
        c.data(t + 0.2 + 0.0001 * k, "a", 1000, seq=s)
    c.ack(t + 0.2 + 0.0003 + 0.003, "b")
    r = one(flows(make_run(tmp_path, {UPLINK: cap})), src_port=41000)
    assert r.retransmits_fwd == 3
    assert r.rtt_samples_fwd == 4 and r.rtt_ms_fwd == pytest.approx(3.0, abs=1e-9)
    assert r.rtt_samples_rev == 2 and r.rtt_ms_rev == pytest.approx(1.25, abs=1e-9)
    assert r.rtt_ms == r.rtt_ms_fwd  # more samples that way


def test_no_rtt_without_acks(tmp_path):
    cap = Capture()
    c = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))
    c.data(T0 + 1.0, "a", 100)
    r = one(flows(make_run(tmp_path, {UPLINK: cap})), src_port=41000)
    assert np.isnan(r.rtt_ms) and np.isnan(r.rtt_ms_fwd) and r.rtt_samples_fwd == 0


# ---------------------------------------------------------------------------- bad input, time


@pytest.mark.parametrize("cut", ["mid-data", "mid-header"])
def test_truncated_pcap_gives_the_whole_packets_before_the_cut_and_a_warning(tmp_path, cut):
    cap = Capture()
    c = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))
    for k in range(20):
        c.data(T0 + 1.0 + 0.001 * k, "a", 1000)
    d = make_run(tmp_path, {UPLINK: cap})
    f = d / "traces" / "pcap" / f"{UPLINK}.pcap"
    raw = f.read_bytes()
    last_record = 16 + 128  # every record holds 128 captured bytes
    f.write_bytes(raw[:-30] if cut == "mid-data" else raw[:-last_record] + raw[-last_record:][:8])
    with pytest.warns(PcapWarning, match="truncated|after the last whole packet"):
        r = one(flows(d), src_port=41000)
    assert r.packets_fwd == 19 and r.payload_bytes_fwd == 19_000
    assert r.last_ts == pytest.approx(T0 + 1.018, abs=1e-6)


def test_empty_or_missing_pcap_warns_and_gives_no_flows(tmp_path):
    cap = Capture()
    Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000)).data(T0 + 1.0, "a", 10)
    d = make_run(tmp_path, {UPLINK: cap, "tor2-eth3": Capture()})
    (d / "traces" / "pcap" / f"{UPLINK}.pcap").write_bytes(b"")  # killed before its header
    (d / "traces" / "pcap" / "tor2-eth3.pcap").unlink()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        df = flows(d)
    assert df.empty and list(df.columns) == FLOWS_MOD.FLOW_COLUMNS
    msgs = [str(w.message) for w in got if issubclass(w.category, PcapWarning)]
    assert any("not readable" in m for m in msgs) and any("missing" in m for m in msgs)


def test_unknown_port_and_missing_capture_are_errors(tmp_path):
    d = make_run(tmp_path, {UPLINK: Capture()})
    with pytest.raises(CaptureError, match="tor9-eth1.*captured: tor1-eth3"):
        flows(d, port="tor9-eth1")
    (d / "traces" / "pcap" / "ports.json").unlink()
    with pytest.raises(CaptureError, match="no packet capture"):
        flows(d)


def test_time_dilation_divides_times_and_durations_by_scale(tmp_path, chunking):
    scale = 4.0
    cap = Capture()
    c = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))
    c.handshake(T0 + 2.0)
    c.data(T0 + 4.0, "a", 1000)
    c.ack(T0 + 4.008, "b")  # 8 ms of wall clock: 2 emulated ms
    c.data(T0 + 10.0, "a", 1000)
    c.ack(T0 + 10.008, "b")
    d = make_run(tmp_path, {UPLINK: cap}, scale=scale)
    assert analysis.load(d).t0 == T0  # the instant the conversion keeps fixed
    r = one(flows(d), src_port=41000)
    assert r.first_ts == pytest.approx(T0 + 2.0 / scale, abs=1e-6)
    assert r.last_ts == pytest.approx(T0 + 10.008 / scale, abs=1e-6)
    assert r.duration_s == pytest.approx(8.008 / scale, abs=1e-6)
    assert r.rtt_ms_fwd == pytest.approx(8.0 / scale, abs=1e-6)
    rates = flow_rates(d, UPLINK, bin_s=0.5)
    per_bin = rates.iloc[:, 0] * 0.5
    total = c.ip_bytes("a") + c.ip_bytes("b")
    assert per_bin.sum() == pytest.approx(total)
    # emulated: the handshake at 0.5 s, the two data segments at 1.0 s and 2.5 s after t0
    hs = sum(p[IP].len for p in c.pkts["a"][:2] + c.pkts["b"][:1])
    assert per_bin.loc[0.5] == hs and per_bin.loc[1.0] == 1040 + 40 and per_bin.loc[2.5] == 1040 + 40
    assert per_bin.loc[1.5] == 0 and rates.index[0] == 0.5 and rates.index[-1] == 2.5


def test_flow_rates_per_direction_of_the_port(tmp_path):
    cap = Capture()
    up = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))  # h1 -> h4: out of tor1's uplink port
    down = Conn(cap, ("10.0.0.3", 42000), ("10.0.0.2", 6000))  # h3 -> h2: into it
    for k in range(10):
        up.data(T0 + 1.0 + 0.01 * k, "a", 960)
        down.data(T0 + 1.005 + 0.01 * k, "a", 460)
    down.ack(T0 + 1.2, "b")
    d = make_run(tmp_path, {UPLINK: cap})
    fl = flows(d)
    fid_up, fid_down = one(fl, src_port=41000).flow_id, one(fl, src_port=42000).flow_id
    out, inn, both = (flow_rates(d, UPLINK, bin_s=0.1, direction=x) for x in ("out", "in", "both"))
    assert sorted(out.columns) == sorted([fid_up, fid_down]) and list(inn.columns) == [fid_down]
    assert out.attrs["unit"] == "bytes/s (emulated)" and out.attrs["bin_s"] == 0.1
    assert out[fid_up].loc[1.0] == pytest.approx(10 * 1000 / 0.1)  # 960 + 40 header bytes a packet
    assert inn[fid_down].loc[1.0] == pytest.approx(10 * 500 / 0.1)
    assert out[fid_down].loc[1.0] == 0 and out[fid_down].loc[1.2] == pytest.approx(40 / 0.1)  # h2's ACK leaves
    assert both[fid_down].loc[1.2] == out[fid_down].loc[1.2] and inn[fid_down].loc[1.2] == 0
    assert (both * 0.1).to_numpy().sum() == pytest.approx(up.ip_bytes("a") + down.ip_bytes("a") + down.ip_bytes("b"))
    assert fl.set_index("flow_id").loc[fid_down, "fwd_on_port"] == "in"
    with pytest.raises(ValueError, match="direction"):
        flow_rates(d, UPLINK, direction="up")


def test_ports_behind_splits_the_hosts_at_a_port():
    topo = topology()
    assert ports_behind(topo, "tor1-eth3") == ({"10.0.0.3", "10.0.0.4"}, {"10.0.0.1", "10.0.0.2"})
    assert ports_behind(topo, "tor1-eth1") == ({"10.0.0.1"}, {"10.0.0.2", "10.0.0.3", "10.0.0.4"})
    assert ports_behind(topo, "core1-eth2") == ({"10.0.0.3", "10.0.0.4"}, {"10.0.0.1", "10.0.0.2"})
    assert ports_behind(topo, "h1-eth0") == (set(), set())  # a host's side, not a switch port


# ----------------------------------------------------------------------------- bwm-ng check


def bwm_line(t, iface, bytes_in, bytes_out, pk_in, pk_out):
    """One bwm-ng 0.6.3 CSV line (-o csv -T rate), as tests/data/bwm-ng-veth.csv."""
    return (
        f"{t:.6f};{iface};{bytes_out * 100:.2f};{bytes_in * 100:.2f};{(bytes_in + bytes_out) * 100:.2f};"
        f"{bytes_in};{bytes_out};{pk_out * 100:.2f};{pk_in * 100:.2f};{(pk_in + pk_out) * 100:.2f};{pk_in};"
        f"{pk_out};0.00;0.00;0;0;{bytes_out * 800:.2f};{bytes_in * 800:.2f};{(bytes_in + bytes_out) * 800:.2f};"
        f"{bytes_in * 8};{bytes_out * 8}\n"
    )


def test_check_against_counters_compares_frames_over_the_same_interval(tmp_path):
    cap = Capture()
    up = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.4", 5000))
    start, dt = T0 + 1.0, 0.01  # bwm-ng samples at start + k dt, k = 0..10
    frames = {k: [0, 0, 0, 0] for k in range(1, 11)}  # interval k: bytes in, out, packets in, out
    up.data(start - 0.005, "a", 1000)  # before the first interval: not counted
    for k in range(1, 11):
        t = start + (k - 1) * dt + 0.004
        p = up.send(t, "a", "PA", up.nxt["a"], up.nxt["b"], bytes(100 * k))
        up.nxt["a"] += 100 * k
        frames[k][1] += len(p)  # h1 -> h4 leaves tor1 by the uplink: out
        frames[k][3] += 1
        q = up.send(t + 0.002, "b", "A", up.nxt["b"], up.nxt["a"])
        frames[k][0] += len(q)
        frames[k][2] += 1
    arp = Ether(
        bytes(
            Ether(src="00:00:00:00:00:03", dst="ff:ff:ff:ff:ff:ff")
            / ARP(hwsrc="00:00:00:00:00:03", psrc="10.0.0.3", hwdst="00:00:00:00:00:00", pdst="10.0.0.1")
        )
    )
    cap.add(start + 0.0055, arp)
    frames[1][0] += len(arp)
    frames[1][2] += 1
    up.data(start + 10 * dt + 0.003, "a", 1000)  # after the last interval: not counted
    lines = []
    for k in range(0, 11):
        b_in, b_out, p_in, p_out = frames.get(k, [0, 0, 0, 0])
        lines.append(bwm_line(start + k * dt, UPLINK, b_in, b_out, p_in, p_out))
        lines.append(bwm_line(start + k * dt, "core1-eth1", 5, 5, 1, 1))
        lines.append(bwm_line(start + k * dt + 1e-5, "total", b_in + 5, b_out + 5, p_in + 1, p_out + 1))
    d = make_run(tmp_path, {UPLINK: cap}, started=start - 0.01, stopped=start + 10 * dt + 0.005, bpf=None)
    (d / "traces" / "bwm-ng.csv").write_text("".join(lines))
    chk = check_against_counters(d)
    assert list(chk.columns) == FLOWS_MOD.CHECK_COLUMNS and len(chk) == 1
    r = chk.iloc[0]
    tcp = [p for t, p in cap.items if TCP in p and start < t <= start + 10 * dt]
    n_tcp, ip_bytes = len(tcp), sum(p[IP].len for p in tcp)
    assert (r.samples, r.flow_packets, r.flow_bytes) == (10, n_tcp, ip_bytes) == (10, 20, ip_bytes)
    assert r.flow_frame_bytes == ip_bytes + 14 * n_tcp
    assert (r.other_frames, r.other_frame_bytes) == (1, len(arp))
    counter = sum(v[0] + v[1] for v in frames.values())
    assert r.counter_bytes == counter and r.counter_packets == 21
    assert r.ratio == pytest.approx((counter - len(arp)) / counter)
    assert r.ratio_all == pytest.approx(1.0) and r.ratio_ip == pytest.approx(ip_bytes / counter)
    assert r.ratio_out == pytest.approx(1.0) and r.flow_frame_bytes_out == sum(v[1] for v in frames.values())
    assert r.ratio_in == pytest.approx((r.counter_bytes_in - len(arp)) / r.counter_bytes_in)
    assert r.start == pytest.approx(start) and r.end == pytest.approx(start + 10 * dt)


def test_check_against_the_real_bwm_ng_fixture_replayed_as_tcp(tmp_path):
    """tests/data/bwm-ng-veth.csv (real bwm-ng output) counted 1042-byte frames one way and
    542-byte frames the other on port tbx0a; the same frames, as TCP (14 + 20 + 20 + payload),
    placed inside the intervals where bwm-ng counted them, give a ratio of exactly 1."""
    fixture = Path(__file__).parents[1] / "data" / "bwm-ng-veth.csv"
    g = parse_bwm_ng(fixture)
    g = g[g["iface"] == "tbx0a"].reset_index(drop=True)
    cap = Capture()
    a = Conn(cap, ("10.0.0.1", 41000), ("10.0.0.2", 5000))
    n_in = n_out = 0
    for k in range(1, len(g)):
        mid = (g["time"][k - 1] + g["time"][k]) / 2
        for j in range(int(g["packets_in"][k])):
            a.data(mid + 1e-5 * j, "a", 1042 - 54)
            n_in += 1
        for j in range(int(g["packets_out"][k])):
            a.data(mid + 1e-5 * (j + 50), "b", 542 - 54)
            n_out += 1
    assert (n_in, n_out) == (200, 50)
    d = make_run(tmp_path, {"tbx0a": cap}, started=float(g["time"].min()) - 1, stopped=float(g["time"].max()) + 1)
    (d / "traces" / "bwm-ng.csv").write_text(fixture.read_text())
    r = check_against_counters(d).iloc[0]
    assert r.port == "tbx0a" and r.samples == len(g) - 1
    assert (r.flow_packets, r.counter_packets, r.counter_bytes) == (250, 250, 200 * 1042 + 50 * 542)
    assert r.flow_frame_bytes == r.counter_bytes and r.ratio == 1.0
    assert r.ratio_ip == pytest.approx((200 * 1028 + 50 * 528) / (200 * 1042 + 50 * 542))
    assert np.isnan(r.ratio_out) and r.flow_frame_bytes_out == 0  # tbx0a is in no topology: no direction


def test_plot_flow_rates_writes_a_png_under_plots(tmp_path):
    cap = Capture()
    for i in range(12):  # more flows than bands: the rest is "other"
        c = Conn(cap, ("10.0.0.1", 41000 + i), ("10.0.0.4", 5000))
        for k in range(5):
            c.data(T0 + 1.0 + 0.01 * k + 0.001 * i, "a", 100 * (i + 1))
            c.ack(T0 + 1.002 + 0.01 * k + 0.001 * i, "b")
    d = make_run(tmp_path, {UPLINK: cap}, [(T0, "worker0", "10.0.0.1", 41000, "10.0.0.4", 5000, "ESTABLISHED")])
    p = plots.plot_flow_rates(d, UPLINK, top=4)
    assert p == d / "plots" / f"flows-{UPLINK}.png"
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
