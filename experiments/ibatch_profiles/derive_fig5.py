"""Derive a BigDL CPU node's GoogLeNet compute time from iBatch's Fig. 5 default-PS speedup.

iBatch's nodes are BigDL on CPUs (Evaluation Setup: "a CPU cluster in a private cloud ... 8 HP
BL460c G6 blade servers"), and the paper prints none of their compute times. It states the
speedups on 30 nodes (Scalability, Fig. 5): "the default PS only achieves 26x ... on 30 nodes"
for GoogLeNet, with iBatch 29x and layer-by-layer 25x.

The default PS overlaps nothing (it pulls every layer, then computes forward and backward, then
pushes), so its iteration on N nodes is the compute time T_c plus a communication time that
does not depend on T_c. With the 1-node iteration T_c + a and the 30-node one T_c + b, the
speedup is 30 (T_c + a) / (T_c + b); setting it to the paper's 26 gives

    T_c = (26 b - 30 a) / (30 - 26)

a and b are the time beyond compute of the 1-node and the 30-node default run of a recorded
reference measurement on the same emulated blades with GTX 1080 Ti compute (``REFERENCE``:
iteration time from samples/s, less that profile's 0.100 s). The profile written is the GTX 1080
Ti GoogLeNet profile with every layer's time x T_c / 0.100 (its per-layer shape kept, an
assumption: a CPU's split over layers differs from a GPU's). It rests on the emulated network
taking as long to communicate as the paper's blades did; the paper's iBatch and layer-by-layer
speedups are not used, so they are what a run on this profile tests.

Usage (from the repository root; never overwrites)::

    .venv/bin/python experiments/ibatch_profiles/derive_fig5.py            # print and write
    .venv/bin/python experiments/ibatch_profiles/derive_fig5.py --print    # print only
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.load import read_sweep_csv
from traffic.compute_profiles.profile import Profile, load_profile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

MODEL, BATCH, BASE_DEVICE, DEVICE = "googlenet", 32, "gtx1080ti", "bigdlfig5"
NODES, PAPER_SPEEDUP = 30, 26.0
"""iBatch, Evaluation, Scalability, Fig. 5: "the default PS only achieves 26x ... speedup on 30
nodes" (GoogLeNet, the first of the four networks)."""
QUOTE = "the default PS only achieves 26x, 25x, 23x, and 22x speedup on 30 nodes for the four networks"
REFERENCE = ROOT / "reproduction/runs/ibatch_blades_googlenet-20261127-154252"
"""experiments/ibatch_blades_googlenet.yaml, one run of every point at dilation 108, no run
flagged: its ``1node`` and ``default`` rows (30 nodes on 8 blades) give a and b."""


def iteration_s(run: Path, variant: str, workers: int) -> float:
    """Seconds per iteration of ``variant`` (``workers`` workers) in ``run``'s sweep.csv: the
    batch times the workers over its samples/s.

    Raises:
        SystemExit: the row is missing or not ok."""
    rows = read_sweep_csv(run / "sweep.csv")
    rows = rows[rows["variant"] == variant]
    if len(rows) != 1 or rows["status"].iloc[0] != "ok":
        raise SystemExit(f"{run}/sweep.csv: expected one ok row of variant {variant!r}")
    return BATCH * workers / float(rows["samples_per_s"].iloc[0])


def derive(reference: Path = REFERENCE) -> tuple[Profile, str]:
    """The derived profile and the derivation's arithmetic as text."""
    base = load_profile(BASE_DEVICE, MODEL, BATCH)
    compute = base.total_s()
    t1 = iteration_s(reference, "1node", 1)
    tn = iteration_s(reference, "default", NODES)
    a, b = t1 - compute, tn - compute
    t_c = (PAPER_SPEEDUP * b - NODES * a) / (NODES - PAPER_SPEEDUP)
    factor = t_c / compute
    rel = reference.relative_to(ROOT)
    text = (
        f"reference {rel}: 1 node {t1:.4f} s, {NODES} nodes (default) {tn:.4f} s an iteration; "
        f"{BASE_DEVICE} compute {compute:.4f} s, so a = {a:.4f} s and b = {b:.4f} s\n"
        f"T_c = ({PAPER_SPEEDUP:g} x {b:.4f} - {NODES} x {a:.4f}) / ({NODES} - {PAPER_SPEEDUP:g})"
        f" = {t_c:.4f} s per batch of {BATCH}: {BASE_DEVICE} x {factor:.4f}"
    )
    method = (
        f"derived: {MODEL}-{BASE_DEVICE}-b{BATCH} x {factor:.4f}, the compute time at which the "
        f"default PS's communication on 30 nodes on the emulated blades ({rel}: a = {a:.4f} s, "
        f"b = {b:.4f} s beyond compute on 1 and 30 nodes) gives the paper's 26x: T_c = (26 b - 30 a) / 4 "
        f"= {t_c:.4f} s; the per-layer shape of the {BASE_DEVICE} profile kept; "
        "experiments/ibatch_profiles/derive_fig5.py"
    )
    source = f'iBatch (Evaluation, Scalability, Fig. 5): "{QUOTE}"; the paper\'s nodes are BigDL on CPUs'
    return base.scaled(factor, DEVICE, method, source), text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--print", action="store_true", help="print the derivation only, write no profile")
    args = ap.parse_args(argv)
    profile, text = derive()
    print(text)
    if not args.print:
        target = HERE / f"{MODEL}-{DEVICE}-b{BATCH}.json"
        kept = profile.save_new(target) is None
        print(f"{target}: " + ("exists, kept" if kept else f"total {profile.total_s():.4f} s per batch"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
