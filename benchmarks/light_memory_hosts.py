"""Benchmark: the machine's memory during a 64-host light run of ResNet-50 ring allreduce.

Builds the run through the harness (a real Mininet network: 4 racks of 16 hosts at 1 Gbit/s,
dilation 10, emulated compute, ``compute.memory: light``), samples used memory (total -
available: it counts the shared scratch, which is shmem) every 0.5 s, and prints its growth
over the level before the run against :data:`LIGHT_64_BOUND_BYTES`; exits 1 when the run
fails or the growth exceeds the bound. Run it alone on an idle machine, as root::

    sudo .venv/bin/python benchmarks/light_memory_hosts.py [--hosts-per-rack 16] [--racks 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.runner import run_experiment  # noqa: E402
from testbed.spec import from_dict  # noqa: E402

GIB = 2**30
#: what the machine's memory may grow by during a 64-host light ResNet-50 ring allreduce run
#: (64 forked workers of a few tens of MB each, the shared scratch of one bucket once, the
#: zygote, 64 hosts' network and the harness). In full memory the same run needs more than
#: this machine has: 64 x (4 x 98 MB of parameters, gradients, momentum and buckets + the
#: worker's runtime) > 30 GiB
LIGHT_64_BOUND_BYTES = 8 * GIB


def used() -> int:
    vm = psutil.virtual_memory()
    return vm.total - vm.available


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--racks", type=int, default=4)
    ap.add_argument("--hosts-per-rack", type=int, default=16)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="light-hosts-") as runs:
        spec = from_dict(
            {
                "name": "light-64",
                "scale": 10,
                "topology": {
                    "kind": "rack_core",
                    "racks": a.racks,
                    "hosts_per_rack": a.hosts_per_rack,
                    "host_bw_mbps": 1000,
                },
                "workload": {
                    "scheme": "allreduce",
                    "model": "resnet50",
                    "batch_size": 32,
                    "iterations": 2,
                    "warmup_iterations": 1,
                    "compute": {"mode": "emulated", "profile": "gtx1080ti", "memory": "light"},
                },
                "run": {"runs_dir": runs, "timeout_s": 900},
            }
        )
        before, peak, stop = used(), [0], threading.Event()

        def sample():
            while not stop.wait(0.5):
                peak[0] = max(peak[0], used())

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            (res,) = run_experiment(spec, progress=False)
        finally:
            stop.set()
            t.join()
    hosts = a.racks * a.hosts_per_rack
    growth = peak[0] - before
    print(
        f"{hosts} light workers: run {res.summary.status}, used memory grew by {growth / GIB:.2f} GiB "
        f"(bound {LIGHT_64_BOUND_BYTES / GIB:.0f} GiB)"
    )
    sys.exit(0 if res.ok and growth < LIGHT_64_BOUND_BYTES else 1)


if __name__ == "__main__":
    main()
