"""Light memory end to end through the harness (a real Mininet network; marked ``slow``, root):
a light run moves the same payload bytes over every link as a full run, and a 64-host light run of
ResNet-50 ring allreduce stays within a memory bound."""

from __future__ import annotations

import threading

import psutil
import pytest

from testbed.runner import run_experiment
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root
from tests.link_payload import port_payload

root_only = pytest.mark.skipif(needs_root, reason="needs root")

GIB = 2**30


def _spec(tmp_path, name: str, memory: str, scheme: str, racks: int, per_rack: int, scale: float = 10, **workload):
    return from_dict(
        {
            "name": name,
            "scale": scale,
            "topology": {"kind": "rack_core", "racks": racks, "hosts_per_rack": per_rack, "host_bw_mbps": 1000},
            "workload": {
                "scheme": scheme,
                "model": "resnet18",
                "batch_size": 32,
                "iterations": 2,
                "warmup_iterations": 1,
                "compute": {"mode": "emulated", "profile": "gtx1080ti", "memory": memory},
                **workload,
            },
            "run": {"runs_dir": str(tmp_path / memory), "timeout_s": 900},
        }
    )


@pytest.mark.slow
@root_only
@pytest.mark.parametrize(
    "scheme,workload",
    [
        ("allreduce", {}),
        ("ps", {"servers": {"count": 2}}),
        ("pipe_sgd", {}),
        ("p3", {"servers": {"count": 2}}),
        ("ibatch", {"servers": {"count": 2}, "options": {"profile_iterations": 1}}),
    ],
)
def test_a_light_run_moves_the_same_payload_bytes_over_every_link_as_a_full_run(tmp_path, scheme, workload):
    assert leftovers() == []
    runs = {}
    for memory in ("full", "light"):
        # 4 hosts: dilation 5 keeps 1 Gbit/s links well within two cores (the bytes do not depend on it)
        (res,) = run_experiment(
            _spec(tmp_path, f"light-bytes-{scheme}", memory, scheme, 2, 2, scale=5, **workload), progress=False
        )
        assert res.ok, res.summary.error
        runs[memory] = res.run_dir
    full, light = port_payload(runs["full"]), port_payload(runs["light"])
    assert set(full) == set(light) and full
    for port, b in full.items():
        assert b > 0 and abs(light[port] - b) <= 0.01 * b, (port, b, light[port])
    assert leftovers() == []


#: what the machine's memory may grow by during a 64-host light ResNet-50 ring allreduce run
#: (64 forked workers of a few tens of MB each, the shared scratch of one bucket once, the
#: zygote, 64 hosts' network and the harness; measured 3.5 GiB for VGG-19 at 64 hosts). In
#: full memory the same run needs more than this machine has: 64 x (4 x 98 MB of parameters,
#: gradients, momentum and buckets + the worker's runtime) > 30 GiB
LIGHT_64_BOUND_BYTES = 8 * GIB


@pytest.mark.slow
@root_only
def test_a_64_host_light_ring_allreduce_stays_under_its_memory_bound(tmp_path):
    """Used memory (total - available: it counts the shared scratch, which is shmem) sampled
    every 0.5 s during the run, growth over the level before it."""
    assert leftovers() == []
    spec = _spec(tmp_path, "light-64", "light", "allreduce", 4, 16, model="resnet50", iterations=2, warmup_iterations=1)

    def used() -> int:
        vm = psutil.virtual_memory()
        return vm.total - vm.available

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
    assert res.ok, res.summary.error
    growth = peak[0] - before
    print(f"64 light workers: used memory grew by {growth / GIB:.2f} GiB")
    assert growth < LIGHT_64_BOUND_BYTES, f"grew by {growth / GIB:.2f} GiB"
    assert leftovers() == []
