"""Benchmark: how often the protocol's steadiness rule calls a run steady or not, on synthetic
iteration times whose truth is known.

The rule (:func:`analysis.metrics.iteration_drift`, :func:`analysis.metrics.steady`): the
median iteration time of the later half of the measured iterations against the earlier
half's, within 5 % or within the 95 % confidence half-width of the mean. Two ways to choose the
measured iterations are compared over the same draws:

* *fixed*: the ``count`` iterations after a warm-up of ``least`` (``workload.warmup_iterations``);
* *until steady*: :func:`analysis.metrics.settled_warmup`, the first window of ``count``
  iterations after ``least`` to ``most`` warm-up iterations that the rule calls steady
  (``workload.max_warmup_iterations``).

Each draw is a run of ``most + count`` iterations, ``1 + slope x i + cv x N(0, 1)`` seconds
for iteration ``i`` (numpy's default generator, seeded): with ``slope`` 0 the run is
stationary, so a *not steady* verdict is a false alarm; with a slope it keeps drifting, so
*not steady* is a detection. Prints the share of runs found not steady. Benchmarks print, they
do not assert.

    .venv/bin/python benchmarks/steadiness_rule.py [--runs 1000] [--count 5] [--least 2] [--most 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.metrics import global_iterations, iteration_drift, measured_iterations, settled_warmup, steady  # noqa: E402

NOISE = (0.02, 0.04, 0.06, 0.10)
SLOPES = (0.0, 0.01, 0.02, 0.03, 0.05)


def _glob(times: np.ndarray) -> pd.DataFrame:
    """A one-worker run whose iteration ``i`` takes ``times[i]`` s, as :func:`global_iterations`."""
    end = np.cumsum(times)
    return global_iterations(
        pd.DataFrame(
            {
                "iteration": np.arange(len(times)),
                "worker": 0,
                "start": end - times,
                "end": end,
                "duration_s": times,
                "samples": 1,
            }
        )
    )


def not_steady(glob: pd.DataFrame, warmup: int, count: int) -> bool:
    """Whether the rule finds the ``count`` iterations after ``warmup`` not steady."""
    moved = iteration_drift(measured_iterations(glob, warmup, count))
    return moved is None or not steady(*moved)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000, help="draws per cell")
    ap.add_argument("--count", type=int, default=5, help="measured iterations")
    ap.add_argument("--least", type=int, default=2, help="warm-up iterations (fixed), the fewest (until steady)")
    ap.add_argument("--most", type=int, default=5, help="the most warm-up iterations (until steady)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    n = a.most + a.count
    print(
        f"share of runs found not steady, {a.runs} runs a cell, {a.count} measured iterations; fixed: after "
        f"{a.least} warm-up; until steady: after {a.least} to {a.most}"
    )
    print(f"{'slope / iteration':>17} {'noise cv':>8} {'fixed':>7} {'until steady':>12}")
    for slope in SLOPES:
        for cv in NOISE:
            fixed = until = 0
            for _ in range(a.runs):
                g = _glob(1 + slope * np.arange(n) + cv * rng.standard_normal(n))
                fixed += not_steady(g, a.least, a.count)
                until += not_steady(g, settled_warmup(g, a.least, a.most, a.count), a.count)
            print(f"{slope:>17.0%} {cv:>8.0%} {fixed / a.runs:>7.1%} {until / a.runs:>12.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
