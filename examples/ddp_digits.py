"""A plain PyTorch DistributedDataParallel training script, run unmodified by the testbed.

    testbed run --program "python examples/ddp_digits.py --epochs 2" --topology experiments/quickstart.yaml

Outside the testbed it runs the same way under torchrun (``torchrun --nproc-per-node 4
examples/ddp_digits.py``). The only testbed-specific lines are the optional iteration marks.
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits  # a real dataset that ships inside scikit-learn
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # optional: iteration-level figures in the testbed's summary
    from traffic.marks import iteration
except ImportError:

    def iteration(step, samples=None):
        return contextlib.nullcontext()


ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
mine = torch.arange(rank, len(y), world)  # this worker's shard of the data
step = 0
for epoch in range(args.epochs):
    order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
    for i in range(0, len(order) - args.batch + 1, args.batch):
        idx = order[i : i + args.batch]
        with iteration(step, samples=len(idx)):
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()  # DDP allreduces the gradients here
            opt.step()
        step += 1
acc = (model(x).argmax(1) == y).float().mean().item()
print(f"rank {rank}: {step} steps, loss {loss.item():.3f}, accuracy {acc:.3f}", flush=True)
dist.destroy_process_group()
