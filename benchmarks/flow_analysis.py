"""Benchmark: how fast does :func:`analysis.flows` read a packet capture?

Builds a synthetic capture in a temporary run directory: ``--flows`` TCP connections between
8 hosts (handshake, then bulk data of 1448-byte segments one way, an ACK every second
segment the other way, a fraction ``--retx`` of segments sent twice), ``--packets`` records in
all, interleaved, truncated to ``--snaplen`` bytes as ``tcpdump -s`` would. Every packet
template is built with scapy's layer classes (Ether/IP/TCP/Raw) and written with scapy's
``RawPcapWriter``; sequence and ACK numbers are patched into the templates' bytes
(checksums are left stale: nothing reads them), which is what makes a million packets take
seconds to write instead of a minute.

Prints the time of ``flows()`` on it, packets/s, and the capture it would read within one
minute at that rate (packets and MB of pcap file); also the rate of scapy's own per-packet
dissection (``PcapReader``, layer classes) on the first packets, which the reader avoids.
Figures only, no assertions. ``--pcap FILE`` times a real capture instead (one port, no
attribution: a run directory with an empty topology is made around it).

    .venv/bin/python benchmarks/flow_analysis.py [--packets 1000000] [--flows 64] [--retx 0.001]
    .venv/bin/python benchmarks/flow_analysis.py --pcap runs/<run>/traces/pcap/tor1-eth3.pcap
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scapy.layers.inet import IP, TCP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.packet import Raw  # noqa: E402
from scapy.utils import PcapReader, RawPcapWriter  # noqa: E402

from analysis.flows import flows  # noqa: E402

MSS = 1448
MAC_A, MAC_B = "02:00:00:00:00:01", "02:00:00:00:00:02"  # given: scapy would look an unset one up on the network
PORT = "s1-eth9"


def _run_dir(root: Path, hosts: int) -> Path:
    d = root / "run"
    (d / "traces" / "pcap").mkdir(parents=True)
    (d / "spec.yaml").write_text("scale: 1\n")
    topo = {
        "hosts": [
            {"name": f"h{i}", "rack": 0, "ip": f"10.0.0.{i}", "intfs": [{"name": f"h{i}-eth0", "ip": f"10.0.0.{i}"}]}
            for i in range(1, hosts + 1)
        ],
        "switches": [],
        "links": [],
    }
    (d / "topology.json").write_text(json.dumps(topo))
    (d / "processes.json").write_text(json.dumps({"processes": []}))
    return d


def _ports_json(d: Path, file: str, snaplen: int) -> None:
    (d / "traces" / "pcap" / "ports.json").write_text(
        json.dumps(
            [{"port": PORT, "file": file, "snaplen_bytes": snaplen, "filter": "tcp", "started": None, "stopped": None}]
        )
    )


def synthetic(path: Path, n_packets: int, n_flows: int, retx: float, snaplen: int, seed: int = 1) -> dict:
    """Write the capture; returns {packets, retransmitted, bytes} as written."""
    rng = random.Random(seed)
    fl = []
    for f in range(n_flows):
        a, b = f"10.0.0.{1 + f % 8}", f"10.0.0.{1 + (f + 3) % 8}"
        sport, dport = 40000 + f, 29500 + f % 4
        data = bytes(
            Ether(src=MAC_A, dst=MAC_B)
            / IP(src=a, dst=b)
            / TCP(sport=sport, dport=dport, flags="PA")
            / Raw(b"\0" * MSS)
        )
        ackp = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=b, dst=a) / TCP(sport=dport, dport=sport, flags="A"))
        syn = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=a, dst=b) / TCP(sport=sport, dport=dport, flags="S"))
        synack = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=b, dst=a) / TCP(sport=dport, dport=sport, flags="SA"))
        isn, isn2 = rng.getrandbits(32), rng.getrandbits(32)
        fl.append(
            {
                "data": data,
                "ack": ackp,
                "syn": syn,
                "synack": synack,
                "isn": isn,
                "isn2": isn2,
                "next": 0,
                "sent": 0,
                "hand": 0,
            }
        )
    w = RawPcapWriter(str(path), linktype=1, snaplen=snaplen)
    w.write_header(None)
    t_us, written, retransmitted, nbytes = 1_800_000_000 * 1_000_000, 0, 0, 0
    pack = struct.Struct("!II").pack_into

    def put(tmpl: bytes, seq: int, ack: int):
        nonlocal t_us, written, nbytes
        buf = bytearray(tmpl[:snaplen])
        pack(buf, 38, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF)
        w.write_packet(bytes(buf), sec=t_us // 1_000_000, usec=t_us % 1_000_000, caplen=len(buf), wirelen=len(tmpl))
        t_us += 7
        written += 1
        nbytes += len(tmpl) - 14

    while written < n_packets:
        f = fl[rng.randrange(n_flows)]
        if f["hand"] == 0:
            put(f["syn"], f["isn"], 0)
            f["hand"] = 1
            continue
        if f["hand"] == 1:
            put(f["synack"], f["isn2"], f["isn"] + 1)
            f["hand"] = 2
            continue
        seq = f["isn"] + 1 + f["next"] * MSS
        put(f["data"], seq, f["isn2"] + 1)
        if rng.random() < retx and written < n_packets:
            put(f["data"], seq, f["isn2"] + 1)  # the same segment again
            retransmitted += 1
        f["next"] += 1
        if f["next"] % 2 == 0 and written < n_packets:
            put(f["ack"], f["isn2"] + 1, f["isn"] + 1 + f["next"] * MSS)
    w.close()
    return {"packets": written, "retransmitted": retransmitted, "bytes": nbytes}


def time_flows(d: Path) -> tuple[float, object]:
    t = time.perf_counter()
    df = flows(d)
    return time.perf_counter() - t, df


def scapy_layers_rate(path: Path, n: int = 20000) -> float:
    """Packets/s of scapy's own dissection (PcapReader: Ether/IP/TCP objects) on the first n."""
    t, k = time.perf_counter(), 0
    with PcapReader(str(path)) as rd:
        for p in rd:
            if TCP in p:
                _ = (p[IP].src, p[TCP].seq, p[IP].len)
            k += 1
            if k >= n:
                break
    return k / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--flows", type=int, default=64)
    ap.add_argument("--retx", type=float, default=0.001, help="fraction of data segments sent twice")
    ap.add_argument("--snaplen", type=int, default=128)
    ap.add_argument("--pcap", help="time this capture instead of a synthetic one")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flow-bench-") as tmp:
        d = _run_dir(Path(tmp), hosts=8)
        if args.pcap:
            src = Path(args.pcap).resolve()
            os.symlink(src, d / "traces" / "pcap" / src.name)
            _ports_json(d, src.name, args.snaplen)
            pcap, info = src, None
        else:
            pcap = d / "traces" / "pcap" / f"{PORT}.pcap"
            _ports_json(d, pcap.name, args.snaplen)
            t = time.perf_counter()
            info = synthetic(pcap, args.packets, args.flows, args.retx, args.snaplen)
            print(
                f"wrote {info['packets']} packets ({args.flows} flows, snaplen {args.snaplen}, "
                f"{info['retransmitted']} retransmitted segments) in {time.perf_counter() - t:.1f} s"
            )
        size = pcap.stat().st_size
        secs, df = time_flows(d)
        n = int(df["packets_fwd"].sum() + df["packets_rev"].sum())
        rate = n / secs if secs > 0 else float("nan")
        per_packet = size / n if n else float("nan")
        print(
            f"capture: {n} TCP packets, {size / 1e6:.1f} MB ({per_packet:.0f} bytes of file a packet), {len(df)} flows"
        )
        print(f"flows(): {secs:.2f} s, {rate:,.0f} packets/s")
        print(
            f"within one minute: {rate * 60:,.0f} packets, {rate * 60 * per_packet / 1e6:,.0f} MB of pcap "
            f"at this snaplen"
        )
        if info is not None:
            print(
                f"retransmissions found: {int(df['retransmits_fwd'].sum() + df['retransmits_rev'].sum())} "
                f"(written: {info['retransmitted']}); RTT samples: "
                f"{int(df['rtt_samples_fwd'].sum() + df['rtt_samples_rev'].sum())}"
            )
        print(f"for comparison, scapy layer classes (PcapReader): {scapy_layers_rate(pcap):,.0f} packets/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
