"""Benchmark: does the emulated network deliver the rates it is configured for?

Builds the quickstart topology (2 racks x 4 hosts, 100 Mbit/s host links, 2:1 core) and
prints, measured inside the emulated network:

1. host link:  iperf3 h1 -> h2 (same rack), receiver rate / configured host rate;
2. uplink:     iperf3 h1..h4 -> h5..h8 at once (4 flows share tor1's uplink), aggregate
               receiver rate / configured uplink rate;
3. allreduce:  torch.distributed (gloo) all_reduce of a 25 MB float32 tensor over all 8
               hosts, best and median of several repetitions, over the ring bound
               2 (p-1)/p * n / B (B = host link rate; the ring crosses each uplink once per
               direction, so the uplinks do not bind).

Each figure is measured with standard 1500-byte frames and with 9000-byte jumbo frames
(``topology.mtu_bytes``), side by side: at 1500 bytes TCP/IP/Ethernet headers alone take
4.4% of a link (1448 payload bytes per 1514-byte frame), and per-packet costs on a 2-core
machine add more.

Targets: rate ratios >= 0.95; allreduce ratio <= 1.10.

    sudo .venv/bin/python benchmarks/link_fidelity.py [--seconds 5] [--reps 4] [--mbytes 25] [--mtus 1500,9000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed import launch
from testbed.ledger import Ledger, NetworkLock  # noqa: E402
from testbed.network import Network  # noqa: E402
from topologies import TopologySpec  # noqa: E402
from traffic import rundir  # noqa: E402

ALLREDUCE = r"""
import os, sys, time, json, torch, torch.distributed as dist
rank, world, master, nbytes, reps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{master}:29511", rank=rank, world_size=world)
t = torch.ones(nbytes // 4)
times = []
for _ in range(reps):
    dist.barrier()
    t0 = time.perf_counter(); dist.all_reduce(t); times.append(time.perf_counter() - t0)
assert abs(t[0].item() - world ** reps) < 1e-3 * world ** reps
if rank == 0: print(json.dumps(times))
dist.destroy_process_group()
"""


def iperf(net, pairs, seconds):
    """Run iperf3 flows client->server at once; return receiver bits/s of each flow."""
    servers = []
    for i, (_, dst) in enumerate(pairs):
        servers.append(
            net.hosts[dst].popen(
                ["iperf3", "-s", "-1", "-p", str(5201 + i)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    time.sleep(0.5)
    clients = [
        net.hosts[src].popen(
            ["iperf3", "-c", net.hosts[dst].IP(), "-p", str(5201 + i), "-t", str(seconds), "-J"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i, (src, dst) in enumerate(pairs)
    ]
    rates = []
    for c in clients:
        out, err = c.communicate(timeout=seconds + 30)
        rates.append(json.loads(out)["end"]["sum_received"]["bits_per_second"])
    for s in servers:
        s.wait(timeout=10)
    return rates


def allreduce(net, hosts, nbytes, reps):
    script = Path(tempfile.mkdtemp(dir=".")) / "allreduce_probe.py"
    script.write_text(ALLREDUCE)
    master = net.hosts[hosts[0]].IP()
    procs = []
    for r, h in enumerate(hosts):
        env = launch.process_env({"iface": f"{h}-eth0"})
        procs.append(
            net.hosts[h].popen(
                [sys.executable, str(script), str(r), str(len(hosts)), master, str(nbytes), str(reps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    outs = [p.communicate(timeout=600) for p in procs]
    script.unlink()
    script.parent.rmdir()
    for p, (_o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"allreduce probe failed: {e.decode()[-2000:]}")
    return json.loads(outs[0][0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--mbytes", type=float, default=25)
    ap.add_argument("--mtus", default="1500,9000", help="comma-separated MTUs to measure, bytes")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-", dir="."))
    try:
        for mtu in (int(m) for m in args.mtus.split(",")):
            print(f"--- MTU {mtu} bytes")
            measure(args, mtu, rundir.create(workdir, f"link_fidelity-{mtu}"))
    finally:
        subprocess.run(["rm", "-rf", str(workdir)])


def measure(args, mtu, run_dir):
    spec = TopologySpec(
        kind="rack_core", racks=2, hosts_per_rack=4, host_bw_mbps=100, oversubscription=2, mtu_bytes=mtu
    )
    with NetworkLock():
        ledger = Ledger.create("bench", run_dir)
        with Network(spec, [], run_dir, ledger) as net:
            host_bw, up_bw = spec.host_bw_mbps * 1e6, spec.uplink_mbps() * 1e6
            (r,) = iperf(net, [("h1", "h2")], args.seconds)
            print(f"host link  h1->h2            {r / 1e6:7.2f} Mbit/s of {host_bw / 1e6:.0f}: ratio {r / host_bw:.3f}")
            rs = iperf(net, [("h1", "h5"), ("h2", "h6"), ("h3", "h7"), ("h4", "h8")], args.seconds)
            print(
                f"uplink     4 flows rack1->2  {sum(rs) / 1e6:7.2f} Mbit/s of {up_bw / 1e6:.0f}: "
                f"ratio {sum(rs) / up_bw:.3f}"
                f"  (flows {', '.join(f'{x / 1e6:.1f}' for x in rs)})"
            )
            hosts = [f"h{i}" for i in range(1, 9)]
            n = int(args.mbytes * 1e6)
            times = allreduce(net, hosts, n, args.reps)
            p = len(hosts)
            bound = 2 * (p - 1) / p * n * 8 / host_bw
            best, med = min(times), statistics.median(times)
            print(
                f"allreduce  {args.mbytes:.0f} MB, {p} hosts      best {best:.3f} s, median {med:.3f} s; "
                f"ring bound {bound:.3f} s: ratio best {best / bound:.3f}, median {med / bound:.3f}"
            )
            print(f"           all repetitions: {', '.join(f'{t:.3f}' for t in times)}")


if __name__ == "__main__":
    main()
