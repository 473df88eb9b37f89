"""PHub's numbers from the sweeps of ``experiments/phub_*.yaml``.

    testbed report phub SWEEP_DIR... [--baseline mxnet-cs] [--flat phub_flat] [--table2] [--plots DIR]
    python -m analysis.phub_report SWEEP_DIR... [--baseline mxnet-cs] [--flat phub_flat] [--table2] [--plots DIR]

One row per point of each sweep (markdown on stdout):

* throughput (samples/s, emulated time), its spread (``spread95``: 1.96 sd of the
  iterations) and the 95 % confidence interval of its mean (``mean_ci95_low``/``_high``), and
  the speedup over the ``--baseline`` variant *at the same point* (same model, racks,
  oversubscription and background; PHub Fig. 12), and with the same number of workers when the
  sweep runs the baseline at several (PHub Fig. 15's 1-8 workers; a row whose worker count the
  baseline lacks then has none). With one baseline worker count every row of a point is over
  it (Fig. 12's PBox with 7 workers over CS with 8);
* bytes moved by a worker host's link per measured iteration (``worker_link``, mean over
  worker hosts; Sec. 4.4: a PBox halves it against colocated servers), and what they and the
  compute allow: ``wire_ms``, half of them (one direction) at the host link's emulated rate,
  ``compute_ms``, the compute profile's forward and backward (emulated compute only), the least
  iteration ``link_bound_ms = max(compute_ms, wire_ms)``, and on every row but the baseline's
  ``speedup_bound``, the most the row can gain over a baseline that keeps its link busy but
  overlaps nothing with its compute: the baseline's ``compute_ms + wire_ms`` over the row's
  ``link_bound_ms`` (a measured speedup above it comes from more than the bytes);
* bytes that crossed the core per measured iteration, training only
  (``bytes_per_iteration.core_training``: the background flows' bytes taken out, see
  :mod:`analysis.metrics`), and for every variant other than ``--flat`` its ratio to the
  ``--flat`` variant at the same point, next to the 1/N that PHub Sec. 3.4 gives for
  hierarchical reduction (N workers per rack; :func:`analysis.paper_models.phub.cross_rack_bytes`),
  and the throughput ratio to ``--flat`` next to what Sec. 3.4's inequality predicts from
  the spec's bandwidths (``sec34_hier_pays``: B_PBox = interfaces x host link, B_Core = the
  rack's uplink, B_Wkr = host link, R racks, N workers per rack; from the run's resolved
  ``spec.yaml``, left out when a field it needs is not there);
* for a multi-tenant run (scheme option ``jobs``), every job's throughput over the run's
  measured iterations, by the run's own throughput method (``iterations.csv``) and the drop
  of the mean per-job throughput against the single-job variant of the same model
  (PHub Fig. 18);
* the run's fidelity flags (``flags``: CPU-starved, host-cost overrun, from ``sweep.csv``;
  :func:`analysis.report.row_flags`), explained under a table that has a flagged row.

``--plots DIR`` draws each sweep's table as grouped bars (:func:`plot_table`).
``--table2`` also prints Table 2 recomputed (:func:`analysis.paper_models.phub.table2`) from
Table 3's and from the zoo's model sizes and compute times. The paper's figures are printed
last for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import report as skeleton
from analysis.load import ITERATION_COLUMNS, in_span, measured_span
from analysis.metrics import global_iterations, throughput_stats
from analysis.paper_models.phub import hierarchical_pays, table2
from analysis.traces import read_table
from common.errors import TestbedError
from traffic.compute_profiles import load_profile
from traffic.rundir import read_spec
from traffic.schemes.phub.tenancy import job_groups
from traffic.summary import SUMMARY_FILE, BytesPerIteration, RunSummary

__all__ = ["PAPER", "REPORT", "plot_table", "sweep_table", "table", "plots", "main"]

PAPER = [
    "Fig. 12 (10 Gbit/s, 8 workers, normalised to sharded MXNet IB): PBox up to 2.7x for "
    "communication-heavy models (AlexNet, VGG); the 7-worker PBox still above the baseline",
    "Sec. 4.4 / Fig. 15: each PBox interface moves about half the data of a colocated server",
    "Sec. 3.4: hierarchical reduction cuts cross-rack traffic to 1/N with N-worker racks",
    "Fig. 19: hierarchical reduction costs AlexNet some throughput (extra rounds), ResNet-50 virtually none",
    "Fig. 18: 8 jobs on one PBox: AlexNet -5% per job, ResNet-50 less",
]

#: Columns of ``sweep.csv`` that identify a point apart from the variant.
POINT = ["model", "racks", "oversub", "background"]


def _point(table: pd.DataFrame, baseline: str) -> list[str]:
    """The columns of a point for ratios over ``baseline``: :data:`POINT`, and ``workers`` when
    the sweep runs the baseline with more than one number of workers."""
    return POINT + ["workers"] if table.loc[table["variant"] == baseline, "workers"].nunique() > 1 else POINT


def _per_job(run_dir: Path, spec: dict, summary: RunSummary) -> dict[int, float]:
    """Each job's samples/s (PHub Sec. 3.1's multi-tenancy, Fig. 18) by the run's own
    throughput method (:func:`analysis.metrics.throughput_stats`: per measured iteration, the
    job's samples over its iteration time, from the job's completion of the iteration before to
    its completion of this one; the mean over the run's measured iterations,
    :func:`analysis.load.measured_span`), from ``iterations.csv``
    restricted to each job's workers (:func:`traffic.schemes.phub.tenancy.job_groups` of the
    spec's ``workers``, ``options.jobs`` and ``options.bad_token_worker``; the intruder is in
    no job). {} for a run of another scheme or without ``iterations.csv``.

    Raises:
        TestbedError: ``workers``, ``jobs`` or ``bad_token_worker`` do not split into jobs.
    """
    wl = spec.get("workload") or {}
    f = run_dir / "iterations.csv"
    if wl.get("scheme") != "phub" or not f.is_file():
        return {}
    opts = wl.get("options") or {}
    workers = wl.get("workers") or summary.workers
    if not workers:
        return {}
    try:
        groups = job_groups(int(workers), int(opts.get("jobs") or 1), opts.get("bad_token_worker"))
    except ValueError as e:
        raise TestbedError(f"{run_dir}: {e}") from None
    iters = read_table(f, ITERATION_COLUMNS)
    span = measured_span(spec, summary)
    out = {}
    for g, members in enumerate(groups):
        # every iteration first: a measured iteration's time runs from the one before it
        job = global_iterations(iters[iters["worker"].isin([f"worker{w}" for w in members])], workers=len(members))
        rate = throughput_stats(job[in_span(job["iteration"], span) & job["complete"]])[0].mean
        if rate is not None:
            out[g] = rate
    return out


def _uplink_mbps(t: dict) -> float | None:
    """The ToR->core uplink rate of a topology section, Mbit/s: ``uplink_bw_mbps``, else
    ``hosts_per_rack * host_bw_mbps / oversubscription`` (the spec's definition)."""
    if t.get("uplink_bw_mbps") is not None:
        return float(t["uplink_bw_mbps"])
    if None in (t.get("hosts_per_rack"), t.get("host_bw_mbps"), t.get("oversubscription")):
        return None
    return t["hosts_per_rack"] * t["host_bw_mbps"] / t["oversubscription"]


def _sec34(spec: dict, workers) -> bool | None:
    """PHub Sec. 3.4's prediction for a multi-rack run (:func:`hierarchical_pays`), from the
    run's resolved spec; None for one rack, fewer workers than racks (no rack holds a whole
    share of them: a 1-node run), or when a field it needs is missing."""
    t = spec.get("topology") or {}
    if not (t.get("kind") == "rack_core" and (t.get("racks") or 0) > 1 and workers and workers >= t["racks"]):
        return None
    interfaces = ((spec.get("workload") or {}).get("servers") or {}).get("interfaces")
    b_core = _uplink_mbps(t)
    if interfaces is None or t.get("host_bw_mbps") is None or b_core is None:
        return None
    return hierarchical_pays(
        b_pbox=interfaces * t["host_bw_mbps"],
        b_core=b_core,
        b_wkr=t["host_bw_mbps"],
        racks=t["racks"],
        n=workers // t["racks"],
    )


def _compute_ms(spec: dict) -> float | None:
    """Forward and backward of one batch on the run's emulated compute profile (ms), or None
    (real compute, or a profile this machine does not have)."""
    w = spec.get("workload") or {}
    c = w.get("compute") or {}
    if c.get("mode") != "emulated":
        return None
    try:
        p = load_profile(str(c.get("profile")), w.get("model"), int(w.get("batch_size")))
    except (KeyError, TestbedError, TypeError, ValueError):
        return None
    return 1e3 * (sum(p.forward_s()) + sum(p.backward_s()))


def sweep_table(
    sweep_dir: str | Path, baseline: str | None = "mxnet-cs", flat: str | None = "phub_flat"
) -> pd.DataFrame:
    """The table of the module docstring for one sweep directory.

    Args:
        sweep_dir: a sweep directory (``sweep.csv`` and the run directories it lists).
        baseline: variant the ``speedup`` column is over (no column when absent).
        flat: variant the ``core_vs_flat`` column is over (no column when absent).

    Raises:
        TestbedError: not a sweep directory, or no ``sweep.csv`` in it.
    """
    rows = []
    for rd, r in skeleton.sweep_rows(sweep_dir):
        s = RunSummary.load(rd) if (rd / SUMMARY_FILE).exists() else RunSummary()
        spec = read_spec(rd)
        t = spec.get("topology") or {}
        bpi = s.bytes_per_iteration or BytesPerIteration()
        # a summary written before background flows were told apart has no core_training: all of core is training's
        core = bpi.core_training if "core_training" in bpi.model_fields_set else bpi.core
        per_job = _per_job(rd, spec, s)
        compute = _compute_ms(spec)
        wire = (
            None
            if bpi.worker_link is None or not t.get("host_bw_mbps")
            else 1e3 * 8 * bpi.worker_link / 2 / (float(t["host_bw_mbps"]) * 1e6)
        )
        rows.append(
            {
                "variant": r.get("variant", r.get("scheme")),
                "model": (spec.get("workload") or {}).get("model"),
                "racks": t.get("racks"),
                "oversub": t.get("oversubscription"),
                "background": bool(spec.get("background")),
                "workers": s.workers,
                "status": r["status"],
                **skeleton.throughput_cells(r),
                "iter_ms": None if pd.isna(r["iter_mean_s"]) else 1e3 * r["iter_mean_s"],
                "core_MB_per_iter": None if core is None else core / 1e6,
                "worker_link_MB_per_iter": None if bpi.worker_link is None else bpi.worker_link / 1e6,
                "compute_ms": compute,
                "wire_ms": wire,
                "link_bound_ms": None if compute is None or wire is None else max(compute, wire),
                "link_busy_ms": None if compute is None or wire is None else compute + wire,
                "flags": skeleton.row_flags(r),
                "sec34_hier_pays": _sec34(spec, s.workers),
                "jobs": len(per_job) or None,
                "per_job_samples_per_s": ", ".join(f"{v:.1f}" for v in per_job.values()) or None,
                "per_job_mean": sum(per_job.values()) / len(per_job) if per_job else None,
            }
        )
    if not rows:
        raise skeleton.ReportError(f"{sweep_dir}: no run directory of the sweep has a row in sweep.csv")
    out = pd.DataFrame(rows)
    if baseline is not None and (out["variant"] == baseline).any():
        out["speedup"] = skeleton.per_point(out, "samples_per_s", baseline, _point(out, baseline))
        # per_point: the baseline's link-busy time over the row's; times the row's, over the row's least
        over = pd.Series(
            skeleton.per_point(out, "link_busy_ms", baseline, _point(out, baseline), inverse=True), index=out.index
        )
        bound = over * pd.to_numeric(out["link_busy_ms"]) / pd.to_numeric(out["link_bound_ms"])
        out["speedup_bound"] = bound.where(out["variant"] != baseline)
    out = out.drop(columns=["link_busy_ms"])
    if flat is not None and (out["variant"] == flat).any() and out["core_MB_per_iter"].notna().any():
        out["core_vs_flat"] = skeleton.per_point(out, "core_MB_per_iter", flat, _point(out, flat))
        out["one_over_N"] = [(r.racks / r.workers) if r.workers else None for r in out.itertuples()]
        out["throughput_vs_flat"] = skeleton.per_point(out, "samples_per_s", flat, _point(out, flat))
    if (out["jobs"].fillna(1) > 1).any():
        single = {m: v for m, j, v in zip(out["model"], out["jobs"], out["per_job_mean"]) if j == 1}
        out["per_job_drop_pct"] = [
            100 * (1 - v / single[m]) if v is not None and m in single else None
            for m, v in zip(out["model"], out["per_job_mean"])
        ]
    else:
        out = out.drop(columns=["jobs", "per_job_samples_per_s", "per_job_mean"])
    return out.dropna(axis=1, how="all")


def plot_table(table: pd.DataFrame, path: str | Path, title: str = "", runs=None, sweeps=()) -> Path:
    """Grouped bars of one sweep's table: one group per point (model, or racks / oversub /
    background), one bar per variant; the mean per-job throughput of a multi-tenant sweep
    (Fig. 18), else the speedup over the baseline when the table has it (Fig. 12), else
    samples/s; a second panel with the training bytes that crossed the core
    per iteration when any point has a core (Sec. 3.4, Fig. 19). With ``runs`` (each row's run
    directory) the speedup or samples/s panel shows the paper's value of the catalogue's
    headline ratios for ``sweeps`` on the numerator's bar (:func:`analysis.plots.mark_paper`).

    Returns:
        the PNG written.
    """
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import mark_paper, plt, save_figure

    t = table.copy()
    multi_rack = (t["racks"] > 1).any()
    t["point"] = [
        f"{r.racks} racks {r.oversub:g}:1" + (" +bg" if r.background else "") if multi_rack else r.model
        for r in t.itertuples()
    ]
    # several rows of one variant at one point (a sweep of another field): numbered, never merged
    t["point"] += t.groupby(["variant", "point"]).cumcount().map(lambda k: f" ({k + 1})" if k else "")
    y = (
        "per_job_mean"
        if "per_job_mean" in t.columns
        else "speedup"
        if "speedup" in t.columns and t["speedup"].notna().any()
        else "samples_per_s"
    )
    panels = [y] + (["core_MB_per_iter"] if multi_rack else [])
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(max(6.0, 0.9 * t["point"].nunique() * t["variant"].nunique() / 2), 3.2 * len(panels)),
        squeeze=False,
    )
    points, variants = list(dict.fromkeys(t["point"])), list(dict.fromkeys(t["variant"]))
    width = 0.8 / len(variants)
    for ax, col in zip(axes[:, 0], panels):
        for i, v in enumerate(variants):
            sub = t[t["variant"] == v].set_index("point")[col].reindex(points)
            ax.bar([j + i * width for j in range(len(points))], sub.to_numpy(dtype=float), width, label=v)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(points))], points, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(
            {
                "speedup": "speedup over baseline",
                "samples_per_s": "samples/s (emulated)",
                "per_job_mean": "samples/s per job (emulated)",
                "core_MB_per_iter": "core MB / iteration",
            }[col]
        )
        if col == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8)
        if runs is not None and col in ("speedup", "samples_per_s"):
            at = [points.index(p) + variants.index(v) * width for p, v in zip(t["point"], t["variant"])]
            mark_paper(
                ax, sweeps, dict(zip(runs, t[col])), {r: (c - width / 2, c + width / 2) for r, c in zip(runs, at)}
            )
        ax.legend(fontsize=8)
    axes[0, 0].set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


def _sweep_section(d: Path, t: pd.DataFrame) -> str:
    return f"## {d.name}\n\n{skeleton.flagged_markdown(t, floatfmt='.4g')}\n"


def _closing(with_table2: bool) -> str:
    """Table 2 recomputed (with ``--table2``) and the paper's figures."""
    out = ""
    if with_table2:
        for source in ("paper", "zoo"):
            out += (
                f"## Table 2 recomputed (Gbit/s, 8 workers; M and T from {source})\n\n"
                f"{skeleton.markdown(pd.DataFrame(table2(8, source)), floatfmt='.4g')}\n\n"
            )
    return out + "## The paper\n\n" + "".join(f"- {line}\n" for line in PAPER)


def table(paths, baseline: str | None = "mxnet-cs", flat: str | None = "phub_flat", table2: bool = False) -> str:
    """The report's text for the sweep directories ``paths`` (see the module docstring)."""
    sections = [_sweep_section(d, sweep_table(d, baseline, flat)) + "\n" for d in skeleton.sweep_dirs(paths)]
    return ("".join(sections) + _closing(table2)).rstrip("\n")


def plots(paths, out_dir, baseline: str | None = "mxnet-cs", flat: str | None = "phub_flat") -> list[Path]:
    """:func:`plot_table` of every sweep, as ``out_dir/<sweep>.png``."""
    return [
        plot_table(
            sweep_table(d, baseline, flat),
            Path(out_dir) / f"{d.name}.png",
            d.name,
            runs=[rd for rd, _ in skeleton.sweep_rows(d)],
            sweeps=[d],
        )
        for d in skeleton.sweep_dirs(paths)
    ]


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--baseline", default="mxnet-cs", help="variant the speedups are over (default mxnet-cs)")
    ap.add_argument("--flat", default="phub_flat", help="variant the core-byte ratios are over (default phub_flat)")
    ap.add_argument("--table2", action="store_true", help="also print Table 2 recomputed")


REPORT = skeleton.Report("phub", __doc__.split("\n\n")[0], table, plots, _options, inputs="SWEEP")


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.phub_report``: each sweep's table, followed by its plot with ``--plots``."""
    ap = argparse.ArgumentParser(prog="python -m analysis.phub_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep directories of experiments/phub_*.yaml")
    _options(ap)
    ap.add_argument("--plots", help="directory for <sweep>.png (grouped bars of each sweep)")
    args = ap.parse_args(argv)
    for d in skeleton.sweep_dirs(args.sweeps):
        t = sweep_table(d, args.baseline, args.flat)
        print(_sweep_section(d, t), end="")
        if args.plots:
            png = plot_table(
                t, Path(args.plots) / f"{d.name}.png", d.name, runs=[rd for rd, _ in skeleton.sweep_rows(d)], sweeps=[d]
            )
            print(f"\nplot: {png}")
        print()
    print(_closing(args.table2), end="")
    return 0


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
