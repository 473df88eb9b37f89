"""A plain DistributedDataParallel script (no import of this project) run unmodified on the
emulated quickstart network: each worker's link moves the bytes the
gradient allreduce implies, and nothing is left behind. Needs root; slow."""

from __future__ import annotations

import re

import pytest

from analysis import load
from testbed.runner import run_experiment
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root

root_only = pytest.mark.skipif(needs_root, reason="needs root")

ITERATIONS = 20
# Quiet edges: a barrier and a pause before the first and after the last iteration, so that the
# window between the two printed timestamps holds the training allreduces only.
DDP = rf"""
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256), torch.nn.ReLU(),
                          torch.nn.Linear(256, 10))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
print("grad_bytes", sum(p.numel() * p.element_size() for p in net.parameters()), flush=True)
dist.barrier(); time.sleep(0.5)
print("t_start", time.time(), flush=True)
for _ in range({ITERATIONS}):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print("t_end", time.time(), flush=True)
time.sleep(0.5); dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@root_only
def test_a_plain_ddp_script_moves_the_allreduce_bytes_on_each_worker_link(tmp_path):
    (tmp_path / "ddp.py").write_text(DDP)
    exp = from_dict(
        {
            "name": "ddp",
            "topology": {
                "kind": "rack_core",
                "racks": 2,
                "hosts_per_rack": 4,
                "host_bw_mbps": 100,
                "oversubscription": 2,
            },
            "workload": {"program": {"command": ["python", "ddp.py"], "cwd": str(tmp_path)}},
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 180},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    assert res.summary.scheme == "program"
    p = 8
    log0 = (res.run_dir / "logs" / "worker0.log").read_text()
    grad = int(re.search(r"grad_bytes (\d+)", log0).group(1))
    starts, ends = [], []
    for i in range(p):
        log = (res.run_dir / "logs" / f"worker{i}.log").read_text()
        starts.append(float(re.search(r"t_start ([\d.]+)", log).group(1)))
        ends.append(float(re.search(r"t_end ([\d.]+)", log).group(1)))
    run = load(res.run_dir)
    tr = run.traces
    window = tr[(tr["time"] > min(starts)) & (tr["time"] <= max(ends) + 0.2)]  # a sample counts what precedes it
    expected = 2 * (p - 1) / p * grad * ITERATIONS  # ring allreduce, per worker and direction
    topo = run.topology
    for h in [f"h{i}" for i in range(1, p + 1)]:
        port = next(
            l["intf2"] if l["node1"] == h else l["intf1"]
            for l in topo["links"]
            if l["class"] == "host" and h in (l["node1"], l["node2"])
        )
        rows = window[window["iface"] == port]
        to_host, from_host = rows["bytes_out"].sum(), rows["bytes_in"].sum()  # the switch port's view
        for direction, got in (("to", to_host), ("from", from_host)):
            # headers (one per segment; veth's segmentation offload makes segments up to 64 KB)
            # and the ACKs of the other direction's data: measured 1.0084-1.0090 of the payload
            assert 1.0 <= got / expected <= 1.05, (h, direction, got, expected)
    assert leftovers() == []
