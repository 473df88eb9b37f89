"""Light memory end to end through the harness (a real Mininet network; marked ``slow``, root):
a light run moves the same payload bytes over every link as a full run. The memory of a
64-host light run is measured by ``benchmarks/light_memory_hosts.py``."""

from __future__ import annotations

import pytest

from testbed.runner import run_experiment
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root
from tests.link_payload import port_payload

root_only = pytest.mark.skipif(needs_root, reason="needs root")


def _spec(
    tmp_path,
    name: str,
    memory: str,
    scheme: str,
    racks: int,
    per_rack: int,
    scale: float = 10,
    iterations: int = 1,
    **workload,
):
    return from_dict(
        {
            "name": name,
            "scale": scale,
            "topology": {"kind": "rack_core", "racks": racks, "hosts_per_rack": per_rack, "host_bw_mbps": 1000},
            "workload": {
                "scheme": scheme,
                "model": "resnet18",
                "batch_size": 32,
                "iterations": iterations,
                "warmup_iterations": 0,
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
        ("ibatch", {"servers": {"count": 2}, "options": {"profile_iterations": 1}, "iterations": 2}),
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
