"""Private memory of a worker in ``workload.compute.memory: full`` against ``light``.

Runs a scheme over loopback (:func:`testbed.loopback.run_local`: no Mininet, no root;
processes forked from the zygote as in a real run) in both memory modes, samples every
process's USS (psutil ``memory_full_info``) every 0.2 s and prints each worker's peak, with
the machine's shared memory (``Shmem``: light memory's shared scratch) at the end::

    python benchmarks/light_memory.py [--model vgg19] [--scheme allreduce] [--workers 2] [--iterations 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from testbed.machine_costs.measure import _loopback, mib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg19")
    ap.add_argument("--scheme", default="allreduce")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="light-memory-") as tmp:
        for memory in ("full", "light"):
            spec = {
                "name": f"light-{memory}",
                "topology": {"kind": "rack", "hosts_per_rack": a.workers},
                "workload": {
                    "scheme": a.scheme,
                    "model": a.model,
                    "iterations": a.iterations,
                    "warmup_iterations": 1,
                    "servers": {"count": 1},
                    "compute": {"mode": "emulated", "profile": "zero", "memory": memory},
                },
            }
            out = _loopback(spec, memory, Path(tmp))
            for name, pk in sorted(out["peaks"].items()):
                print(f"{memory}: {name} peak USS {mib(pk['uss'])}, PSS {mib(pk['pss'])}, RSS {mib(pk['rss'])}")


if __name__ == "__main__":
    main()
