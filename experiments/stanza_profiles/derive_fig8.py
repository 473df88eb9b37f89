"""Derive the band of Stanza's AlexNet compute time from the paper's own Fig. 8 ratios.

Stanza §7.2 computes Fig. 8 from its performance models, eqs. (2)-(4) for Stanza and (6)-(7)
for PS, each system on its throughput-maximizing node assignment (eq. (5) and its PS
counterpart), with "empirical data from our EC2 experiments for the model constants T_ps, T_c
and T_f" (Tesla V100, batch 128 per node for AlexNet, Table 5). It does not print the
constants, but it states the ratios they gave for AlexNet:

    "With 80 nodes and 40G bandwidth for example, the throughput improvement is ~1.79x for AlexNet"
    "At 25G bandwidth, training AlexNet ... can be improved by ~2.29x ... using Stanza with 40 nodes"
    "When the bandwidth is 100G, Stanza's benefit decreases to ~1.55x" (no node count: the
    paragraph names 40 and 80 nodes, and both are solved here)

Every other constant of the models is the model's (P, P_c, A from the zoo's AlexNet; K = 128).
One unknown is left once the shape of the compute is fixed: this script keeps the per-layer
shape of ``alexnet-v100-b128.json`` (PHub's GTX 1080 Ti time split by FLOPs; so
T_f / T_c = 0.0927 and T_ps = T_c + T_f, an assumption: the paper measured T_ps, T_c and T_f
separately) and solves for the factor s on every layer at which the models give each stated
ratio. The ratio falls as s grows (more compute dilutes Stanza's communication saving), so
each statement gives one s, found by bisection. The band is the smallest and the largest T_c
over the statements; a profile is written at each end, and Fig. 6a's setting (10 CONV workers
and 1 FC worker against 10 PS workers and 1 server, 10 Gbit/s, Stanza §6.3) is predicted at
both by eqs. (3) and (6). Stanza's 13.9x for Fig. 6a is not used.

Usage (from the repository root; never overwrites)::

    .venv/bin/python experiments/stanza_profiles/derive_fig8.py            # print and write
    .venv/bin/python experiments/stanza_profiles/derive_fig8.py --print    # print only
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analysis.paper_models import stanza as sm  # noqa: E402
from traffic.compute_profiles.profile import Profile, load_profile  # noqa: E402

BASE = "alexnet-v100-b128.json"
"""The profile whose per-layer shape is kept (PHub Table 3's GTX 1080 Ti time x peak FP32 ratio
x 4 for batch 128, split by FLOPs: its ``method``)."""
MODEL, K = "alexnet", 128


@dataclass(frozen=True)
class Statement:
    """A speedup Stanza §7.2 states for AlexNet in Fig. 8: ``ratio`` at ``nodes`` in total and
    ``gbps`` Gbit/s per node, with the paper's words."""

    nodes: int
    gbps: float
    ratio: float
    quote: str


STATEMENTS = (
    Statement(
        80, 40, 1.79, "With 80 nodes and 40G bandwidth for example, the throughput improvement is ~1.79x for AlexNet"
    ),
    Statement(
        40,
        25,
        2.29,
        "At 25G bandwidth, training AlexNet, VGG-16, and VGG-19 can be improved by ~2.29x, "
        "~2.35x, and ~2.33x, respectively using Stanza with 40 nodes",
    ),
    Statement(
        40,
        100,
        1.55,
        "When the bandwidth is 100G, Stanza's benefit decreases to ~1.55x, ~1.72x, and "
        "~1.84x, respectively for the three CNNs (no node count; 40 and 80 are the "
        "paragraph's)",
    ),
    Statement(80, 100, 1.55, "the same 1.55x at 100G, solved at 80 nodes"),
)

FIG6A = {"n_c": 10, "n_f": 1, "n_w": 10, "n_s": 1, "gbps": 10.0}
"""Fig. 6a's headline setting: "With 10 CONV workers and 1 FC worker for example, Stanza
provides 13.9x ... using a 10G network" (§1); "PS also uses 1 server for fairness" (§6.1)."""

SOURCE = (
    'Stanza (Wu et al., "Stanza: Layer Separation for Distributed Training in Deep Learning"), Sec. 7.2, '
    "Fig. 8: the AlexNet speedups the paper computed from its eqs. (2)-(7) with its own measured T_ps, T_c and "
    'T_f: "With 80 nodes and 40G bandwidth for example, the throughput improvement is ~1.79x for AlexNet"; '
    '"At 25G bandwidth, training AlexNet ... can be improved by ~2.29x ... using Stanza with 40 nodes"; '
    '"When the bandwidth is 100G, Stanza\'s benefit decreases to ~1.55x"'
)


def base_profile() -> Profile:
    return load_profile(str(HERE / BASE), MODEL, K)


def scaled_constants(c0: sm.Constants, s: float) -> sm.Constants:
    """``c0`` with every compute time x ``s`` (the profile's shape kept)."""
    return dataclasses.replace(c0, T_c=c0.T_c * s, T_f=c0.T_f * s, T_ps=c0.T_ps * s)


def speedup(c0: sm.Constants, s: float, nodes: int, gbps: float) -> float:
    """Fig. 8's speedup (Stanza's throughput over PS's, each on its best assignment of
    ``nodes``) with the compute of ``c0`` x ``s``."""
    return sm.stanza_vs_ps(scaled_constants(c0, s), nodes, gbps * 1e9).speedup


def solve(c0: sm.Constants, st: Statement, lo: float = 1e-3, hi: float = 1e3) -> float:
    """The factor ``s`` at which :func:`speedup` equals ``st.ratio`` (bisection in log space
    to a relative width of 1e-12).

    Raises:
        ValueError: the ratio is not bracketed by ``lo`` and ``hi`` (the speedup at ``lo``
            must be above it and at ``hi`` below it).
    """
    f_lo, f_hi = speedup(c0, lo, st.nodes, st.gbps), speedup(c0, hi, st.nodes, st.gbps)
    if not f_lo > st.ratio > f_hi:
        raise ValueError(
            f"{st.ratio}x at {st.nodes} nodes, {st.gbps:g} Gbit/s is not between the speedups at "
            f"s={lo:g} ({f_lo:.3f}x) and s={hi:g} ({f_hi:.3f}x)"
        )
    while hi / lo - 1 > 1e-12:
        mid = (lo * hi) ** 0.5
        if speedup(c0, mid, st.nodes, st.gbps) > st.ratio:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


@dataclass(frozen=True)
class Band:
    """The solved factor of each statement and the band's two ends."""

    c0: sm.Constants
    factors: tuple[float, ...]  # one per STATEMENTS entry

    @property
    def low(self) -> tuple[float, Statement]:
        i = min(range(len(self.factors)), key=lambda j: self.factors[j])
        return self.factors[i], STATEMENTS[i]

    @property
    def high(self) -> tuple[float, Statement]:
        i = max(range(len(self.factors)), key=lambda j: self.factors[j])
        return self.factors[i], STATEMENTS[i]


def band(c0: sm.Constants | None = None) -> Band:
    c0 = c0 or sm.Constants.from_profile(MODEL, base_profile())
    return Band(c0, tuple(solve(c0, st) for st in STATEMENTS))


def fig6a(c: sm.Constants) -> dict:
    """Fig. 6a's setting (:data:`FIG6A`) by eqs. (3) and (6): both iteration times, their terms,
    and the speedup (equal batches, so the ratio of the times)."""
    B = FIG6A["gbps"] * 1e9
    st = sm.stanza_iteration_time(c, FIG6A["n_c"], FIG6A["n_f"], B, parts=True)
    ps_comm = sm.transfer_seconds(2 * FIG6A["n_w"] * c.P / FIG6A["n_s"], B)
    t_ps = sm.ps_iteration_time(c, FIG6A["n_w"], FIG6A["n_s"], B)
    return {"stanza": st, "ps_comm": ps_comm, "t_ps": t_ps, "speedup": t_ps / st["total"]}


def end_profile(b: Band, which: str) -> Profile:
    """The profile at the ``low`` or ``high`` end of the band (device ``v100fig8low`` /
    ``v100fig8high``)."""
    s, st = b.low if which == "low" else b.high
    base = base_profile()
    method = (
        f"derived: {BASE} x {s:.4f}, the factor at which Stanza's eqs. (2)-(7), each system on its "
        f"throughput-maximizing node assignment, give Fig. 8's {st.ratio}x at {st.nodes} nodes and "
        f"{st.gbps:g} Gbit/s (T_c {b.c0.T_c * s:.4f} s per batch of {K}): the {which} end of the band of T_c "
        "that Sec. 7.2's three AlexNet ratios give; the per-layer shape of that profile kept (T_f / T_c "
        f"{b.c0.T_f / b.c0.T_c:.4f}, T_ps = T_c + T_f); experiments/stanza_profiles/derive_fig8.py"
    )
    return base.scaled(s, f"v100fig8{which}", method, source=SOURCE)


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def report(b: Band) -> str:
    c0 = b.c0
    out = [
        f"AlexNet, K = {K}: P = {c0.P:,}, P_c = {c0.P_c:,}, A = {c0.A:,} per sample (the zoo's model)",
        f"shape kept from {BASE}: T_c {_ms(c0.T_c)}, T_f {_ms(c0.T_f)} (T_f / T_c {c0.T_f / c0.T_c:.4f}), "
        f"T_ps = T_c + T_f {_ms(c0.T_ps)}",
        "",
    ]
    for st, s in zip(STATEMENTS, b.factors):
        c = scaled_constants(c0, s)
        B = st.gbps * 1e9
        cmp_ = sm.stanza_vs_ps(c, st.nodes, B)
        S, P = cmp_.stanza, cmp_.ps
        parts = sm.stanza_iteration_time(c, S.n_c, S.n_f, B, parts=True)
        ps_comm = sm.transfer_seconds(2 * P.n_c * c.P / P.n_f, B)
        out += [
            f"{st.ratio}x at {st.nodes} nodes, {st.gbps:g} Gbit/s -- {st.quote}",
            f"  s = {s:.4f}: T_c {_ms(c.T_c)}, T_f {_ms(c.T_f)}, T_ps {_ms(c.T_ps)}",
            f"  Stanza n_c {S.n_c} + n_f {S.n_f}: eq. (3) t_s = T_c {_ms(c.T_c)} + (n_c/n_f) T_f "
            f"{_ms(S.n_c / S.n_f * c.T_f)} + 2 n_c A K / (n_f B) {_ms(parts['conv_fc'])} + P_c R(n_c) / B "
            f"{_ms(parts['conv_allreduce'])} (R = {sm.allreduce_rounds(S.n_c)}) = {_ms(S.time_s)}; "
            f"eq. (4) n_c K / t_s = {S.throughput:,.0f} samples/s",
            f"  PS n_w {P.n_c} + n_s {P.n_f}: eq. (6) t_ps = 2 n_w P / (n_s B) {_ms(ps_comm)} + T_ps "
            f"{_ms(c.T_ps)} = {_ms(P.time_s)}; eq. (7) n_w K / t_ps = {P.throughput:,.0f} samples/s",
            f"  {S.throughput:,.0f} / {P.throughput:,.0f} = {cmp_.speedup:.4f}x",
        ]
        lo, hi = (
            solve(c0, dataclasses.replace(st, ratio=st.ratio + 0.005)),
            solve(c0, dataclasses.replace(st, ratio=st.ratio - 0.005)),
        )
        out.append(f"  the stated ratio's last digit (+-0.005): T_c {_ms(c0.T_c * lo)} to {_ms(c0.T_c * hi)}")
    out.append("")
    for which in ("low", "high"):
        s, st = b.low if which == "low" else b.high
        c = scaled_constants(c0, s)
        f = fig6a(c)
        p = f["stanza"]
        out += [
            f"{which} end: T_c {_ms(c.T_c)} per batch of {K} (from {st.ratio}x at {st.nodes} nodes, "
            f"{st.gbps:g} Gbit/s); profile total T_ps {_ms(c.T_ps)}",
            f"  Fig. 6a (10 CONV + 1 FC against 10 workers + 1 server, 10 Gbit/s): eq. (3) t_s = T_c "
            f"{_ms(c.T_c)} + 10 T_f {_ms(10 * c.T_f)} + 2 x 10 A K / B {_ms(p['conv_fc'])} + P_c x "
            f"{sm.allreduce_rounds(FIG6A['n_c'])} / B {_ms(p['conv_allreduce'])} = {_ms(p['total'])}; eq. (6) "
            f"t_ps = 2 x 10 P / B {_ms(f['ps_comm'])} + T_ps {_ms(c.T_ps)} = {_ms(f['t_ps'])}; "
            f"speedup t_ps / t_s = {f['speedup']:.2f}x",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--print", action="store_true", help="print the derivation only, write no profile")
    args = ap.parse_args(argv)
    b = band()
    print(report(b))
    if not args.print:
        for which in ("low", "high"):
            p = end_profile(b, which)
            path = p.save(HERE / f"{MODEL}-{p.device}-b{K}.json")
            print(f"{path}: total {p.total_s():.4f} s per batch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
