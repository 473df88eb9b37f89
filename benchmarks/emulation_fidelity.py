"""Benchmark: how faithful is emulated compute, and how many hosts does this machine emulate?

Prints:

1. sleep accuracy of emulated compute: requested vs achieved per-layer time over a few
   iterations of a profile (default VGG-19, GTX 1080 Ti, batch 32) times a dilation scale:
   median and p99 of (achieved - requested), and the iteration total;
2. CPU used by an emulated worker while it sleeps through those iterations (% of one core);
3. for the quickstart topology (2 racks, 2:1 core) at host links of an emulated 1 Gbit/s:
   the ring-allreduce time of VGG-19's gradients (its parameter count x 4 bytes) over the
   ring bound 2 (p-1)/p * n / B, for growing host counts and dilation scales, i.e. how many
   hosts this machine emulates with the ratio bound/achieved still >= 0.9.

    sudo .venv/bin/python benchmarks/emulation_fidelity.py [--hosts 4,8] [--scales 1,2,4] [--reps 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from link_fidelity import allreduce  # noqa: E402

from testbed.ledger import Ledger, NetworkLock  # noqa: E402
from testbed.network import Network  # noqa: E402
from topologies import TopologySpec  # noqa: E402
from traffic import rundir  # noqa: E402
from traffic.compute_profiles import load_profile  # noqa: E402
from traffic.models import build_model  # noqa: E402
from traffic.runtime.emulation import EmulatedCompute  # noqa: E402


def sleep_accuracy(model_name, device, batch, scale, iterations):
    model = build_model(model_name, 0, device="meta")
    prof = load_profile(device, model_name, batch, n_layers=len(model.layers))
    fwd = [t * scale for t in prof.forward_s()]
    bwd = [t * scale for t in prof.backward_s()]

    class _M:  # EmulatedCompute needs only layers and parameters; skip allocating the gradients
        layers = model.layers

        @staticmethod
        def parameters():
            return []

    em = EmulatedCompute(_M, fwd, bwd, seed=0)
    errs, totals = [], []
    proc = psutil.Process()
    c0, w0 = proc.cpu_times(), time.perf_counter()
    for _ in range(iterations):
        t_it = time.perf_counter()
        for l in range(len(fwd)):
            t = time.perf_counter()
            em.forward(l)
            errs.append(time.perf_counter() - t - fwd[l])
        for l in reversed(range(len(bwd))):
            t = time.perf_counter()
            em.backward(l, [])
            errs.append(time.perf_counter() - t - bwd[l])
        totals.append(time.perf_counter() - t_it)
    c1, wall = proc.cpu_times(), time.perf_counter() - w0
    cpu_pct = 100 * ((c1.user + c1.system) - (c0.user + c0.system)) / wall
    errs_us = sorted(e * 1e6 for e in errs)
    p99 = errs_us[min(len(errs_us) - 1, int(0.99 * len(errs_us)))]
    want = sum(fwd) + sum(bwd)
    print(
        f"sleep accuracy  {model_name} {device} b{batch} x scale {scale}: {len(fwd)} layers, "
        f"{iterations} iterations; per-layer achieved-requested median {statistics.median(errs_us):.0f} us, "
        f"p99 {p99:.0f} us; iteration {statistics.median(totals) * 1e3:.1f} ms vs requested {want * 1e3:.1f} ms "
        f"(ratio {statistics.median(totals) / want:.4f})"
    )
    print(f"emulated worker CPU while sleeping: {cpu_pct:.2f}% of one core")
    return sum(p.numel() for p in model.parameters())


def hosts_at_1g(n_params, hosts_list, scales, reps):
    nbytes = n_params * 4
    for scale in scales:
        for n in hosts_list:
            per_rack = n // 2
            spec = TopologySpec(
                kind="rack_core", racks=2, hosts_per_rack=per_rack, host_bw_mbps=1000, oversubscription=2
            )
            work = Path(tempfile.mkdtemp(prefix="bench-", dir="."))
            try:
                d = rundir.create(work, "x")
                with NetworkLock(), Network(spec, [], d, Ledger.create("bench", d), scale=scale) as net:
                    times = allreduce(net, [f"h{i}" for i in range(1, n + 1)], nbytes, reps)
            finally:
                import shutil

                shutil.rmtree(work, ignore_errors=True)
            bound = 2 * (n - 1) / n * nbytes * 8 / (1000e6 / scale)
            best = min(times)
            print(
                f"allreduce {nbytes / 1e6:.0f} MB  {n:2d} hosts at emulated 1 Gbit/s, scale {scale:g} "
                f"(shaped {1000 / scale:.0f} Mbit/s): best {best:.2f} s (real), bound {bound:.2f} s: "
                f"bound/achieved {bound / best:.3f}{'  >= 0.9' if bound / best >= 0.9 else ''}",
                flush=True,
            )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="vgg19")
    ap.add_argument("--device", default="gtx1080ti")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sleep-scale", type=float, default=1.0)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--hosts", default="4,8")
    ap.add_argument("--scales", default="1,2")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    n_params = sleep_accuracy(args.model, args.device, args.batch, args.sleep_scale, args.iterations)
    if not args.hosts:
        return
    hosts_at_1g(
        n_params, [int(h) for h in args.hosts.split(",")], [float(s) for s in args.scales.split(",")], args.reps
    )


if __name__ == "__main__":
    main()
