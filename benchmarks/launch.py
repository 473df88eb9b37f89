"""Benchmark: how long launching a run's processes takes, without building a network.

Runs N processes (default 128) of ring allreduce on digits_mlp (emulated compute, profile
``zero``, ``workload.compute.memory: light``) over loopback with the zygote
(:func:`testbed.loopback.run_local`: no Mininet, no root) and prints, in seconds from the
start of the launch (``testbed.launch.start`` called, the zygote's imports already done as
they are when a real run's network is up):

- ``spawned``: every process started (``launch.start`` returned);
- ``init``: every process past ``init_process_group`` (the last ``init`` event's end);
- ``first_iteration``: every process at its first iteration (the latest first ``iteration``
  event's start).

::

    sudo .venv/bin/python benchmarks/launch.py [--processes 128] [--iterations 3] [--repeat 1]

As root it first moves itself (and so the zygote and every process) into a network namespace
of its own with only ``lo``, where a name lookup fails at once as in a Mininet host
(:func:`testbed.network.nameservers`). On this machine's network, torch's TCPStore client
looks up its socket's address in DNS (a v4-mapped ``::ffff:127.0.0.1``, not in
``/etc/hosts``); 128 of those at once time out (5 s each, sometimes twice) and the
rendezvous then took 13 s instead of 1.9 s (measured: 127 clients of one TCPStore).
Without root it runs where it is and says so.

It measures the code it imports (``testbed`` from ``PYTHONPATH`` if set, else this checkout).

Measured on this 2-core machine (other work running, two runs): spawned 1.7-1.8 s, init
3.5-3.7 s, first iteration 3.9-4.1 s. Before the zygote's huge pages and without the
namespace of its own: spawned 4.1-5.3 s, init 16.8-18.3 s, first iteration 17.2-18.5 s (of
which the rendezvous's DNS lookups took 10-12 s).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pyroute2 import IPRoute

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT))

from testbed import launch  # noqa: E402
from testbed.loopback import run_local  # noqa: E402
from testbed.spec import from_dict  # noqa: E402


def spec(processes: int, iterations: int) -> dict:
    return {
        "name": "launch",
        "topology": {"kind": "rack_core", "racks": max(1, processes // 16), "hosts_per_rack": min(16, processes)},
        "workload": {
            "scheme": "allreduce",
            "model": "digits_mlp",
            "batch_size": 32,
            "workers": processes,
            "iterations": iterations,
            "warmup_iterations": 1,
            "compute": {"mode": "emulated", "profile": "zero", "memory": "light"},
        },
        "run": {"timeout_s": 600},
    }


_MARKS: dict[str, float] = {}
CLONE_NEWNET = 0x40000000


def own_network() -> bool:
    """Move this process into a new network namespace with ``lo`` up (module doc); False if
    not allowed (not root)."""
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
        return False
    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
    return True


def _time_the_launch() -> None:
    """Time ``launch.start`` (into :data:`_MARKS`) and keep the zygote's imports out of it."""
    start, zygote_start = launch.start, launch.Zygote.start

    def timed_start(*a, **kw):
        _MARKS["launch"] = time.time()
        out = start(*a, **kw)
        _MARKS["spawned"] = time.time()
        return out

    def ready_zygote(self):
        zygote_start(self)
        while self.import_s is None and self.alive():
            time.sleep(0.02)
        return self

    launch.start, launch.Zygote.start = timed_start, ready_zygote


def measure(processes: int, iterations: int, work: Path) -> dict[str, float]:
    """One loopback run of ``processes`` processes: seconds from the launch to each mark (module doc)."""
    run_dir = run_local(from_dict(spec(processes, iterations)), work / f"launch-{processes}-{time.time_ns()}")
    ev = [
        json.loads(line)
        for f in glob.glob(str(run_dir / "events" / "*.jsonl"))
        for line in open(f)
        if line.strip().endswith("}")
    ]
    procs = {e["proc"] for e in ev}
    init = max(e["ts"] + e["dur"] for e in ev if e["kind"] == "init")
    first = max(min(e["ts"] for e in ev if e["kind"] == "iteration" and e["proc"] == p) for p in procs)
    t0 = _MARKS["launch"]
    return {"spawned": _MARKS["spawned"] - t0, "init": init - t0, "first_iteration": first - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=128)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    if not own_network():
        print("not root: running in this network namespace (name lookups may reach DNS and slow the rendezvous)")
    _time_the_launch()
    print("processes  spawned_s  init_s  first_iteration_s")
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        for _ in range(a.repeat):
            m = measure(a.processes, a.iterations, Path(tmp))
            print(f"{a.processes:9d}  {m['spawned']:9.1f}  {m['init']:6.1f}  {m['first_iteration']:17.1f}", flush=True)


if __name__ == "__main__":
    main()
