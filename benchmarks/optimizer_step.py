"""Benchmark: the real time of one optimizer step on a small key, ``torch.optim.SGD.step``
against :class:`traffic.runtime.trainer.TensorSGD` (torch's own functional SGD).

A server steps each key, shard or slice it owns once per iteration (P3 steps ResNet-50's
25.6 M parameters as about 512 slices of 50,000), and every step's real time must fit its
dilated budget (:mod:`traffic.hostmodel.costs`). This prints, per tensor size, the median
over ``--repeats`` of the mean real microseconds per step of each, single-threaded, with
momentum 0.9 and weight decay 1e-4, and the ratio. Benchmarks print, they do not assert.

    .venv/bin/python benchmarks/optimizer_step.py [--sizes 1000,50000,1000000] [--steps 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from traffic.runtime.trainer import TensorSGD, make_optimizer
from traffic.spec import OptimizerSpec


def _per_step_us(step, steps: int) -> float:
    for _ in range(min(steps, 100)):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,50000,1000000", help="tensor sizes (elements), comma-separated")
    ap.add_argument("--steps", type=int, default=2000, help="steps per measurement")
    ap.add_argument("--repeats", type=int, default=5, help="measurements per size (median reported)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    spec = OptimizerSpec(lr=0.05, momentum=0.9, weight_decay=1e-4)
    print(f"torch {torch.__version__}, 1 thread, {a.steps} steps x {a.repeats} repeats")
    print(f"{'elements':>10} {'SGD.step us':>12} {'TensorSGD us':>13} {'ratio':>6}")
    for n in (int(x) for x in a.sizes.split(",")):
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n)
        opt = make_optimizer([p], spec)
        q = torch.randn(n)
        g = torch.randn(n)
        light = TensorSGD(q, spec)
        full = [_per_step_us(opt.step, a.steps) for _ in range(a.repeats)]
        fast = [_per_step_us(lambda: light.step(g), a.steps) for _ in range(a.repeats)]
        f, l = statistics.median(full), statistics.median(fast)
        print(f"{n:>10} {f:>12.1f} {l:>13.1f} {f / l:>6.2f}")


if __name__ == "__main__":
    main()
