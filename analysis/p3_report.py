"""P3's figures and numbers from the sweeps of ``experiments/p3_*.yaml``.

    testbed report p3 SWEEP... [--baseline baseline] [--plots DIR]
    python -m analysis.p3_report runs/p3_resnet50-<ts> [runs/p3_vgg19-<ts> runs/p3_slices-<ts> ...]

For each sweep directory: a table (markdown, on stdout) with every point's throughput (the
mean, ``spread95``: 1.96 sd of the iterations, the 95 % confidence interval of the mean), the
speedup of each variant over the layer-wise baseline at the same swept value, and the idle
fraction and mean utilization of worker 0's link (:mod:`analysis.utilization`; P3 Sec. 5.3)
and the run's fidelity flags (``flags``, explained under a table that has any);
plots (in ``<sweep>/plots/`` with ``python -m analysis.p3_report``, in ``DIR/<sweep>/`` with
``--plots DIR``): throughput against the swept value (P3 Fig. 7, or Fig. 12 for a slice-size
sweep) and, for every swept value that has both, the baseline's and P3's link utilization
over time (Figs. 8 and 9). The paper's numbers are printed next to the table for comparison:
those of Fig. 7 for a bandwidth sweep (Sec. 5.2), of Fig. 10 for a sweep over the cluster's
size (Sec. 5.4), of Fig. 12 for a slice-size sweep (Sec. 5.6). Under a bandwidth sweep with a
server on every worker host and emulated compute, a line gives at each bandwidth what the bytes
and the compute alone allow (:mod:`analysis.paper_models.p3`): the period of a baseline that keeps
its link busy, P3's least period, and so the most P3 can gain over such a baseline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import report as skeleton
from analysis.paper_models import p3 as p3_model
from analysis.utilization import utilization_summary
from common.errors import TestbedError
from traffic.rundir import read_sweep_spec

__all__ = ["PAPER", "REPORT", "bounds_line", "sweep_table", "sweep_plots", "sweep_report", "table", "plots", "main"]

#: the paper's values a sweep is read against: by model for a bandwidth sweep (Fig. 7), by
#: ``<model>/hosts`` for a sweep over the cluster's size (Fig. 10), ``slices`` for the slice size (Fig. 12)
PAPER = {
    "resnet50": "P3 Fig. 7a: +26% over the baseline at 4 Gbit/s; similar throughput when bandwidth suffices "
    "(baseline drops below 6 Gbit/s, P3 below 4 Gbit/s); no gain from slicing alone",
    "vgg19": "P3 Fig. 7c: slicing alone +49% at 30 Gbit/s; P3 up to +66% at 15 Gbit/s",
    "sockeye_lstm": "P3 Fig. 7d: up to +38%",
    "resnet50/hosts": "P3 Fig. 10a: no gain on 2 to 16 hosts at 10 Gbit/s (baseline and P3 alike)",
    "vgg19/hosts": "P3 Fig. 10b: +61% on 8 hosts at 10 Gbit/s",
    "sockeye_lstm/hosts": "P3 Fig. 10c: +18% on 8 hosts at 10 Gbit/s",
    "slices": "P3 Fig. 12: throughput peaks at 50,000 parameters per slice",
}
#: swept fields that change the cluster's size
_SIZE_FIELDS = ("topology.hosts_per_rack", "topology.racks", "workload.workers")


def _swept(columns, sweep_spec: dict) -> str | None:
    """The first swept field of the sweep, if ``sweep.csv`` has it as a column."""
    keys = list((sweep_spec.get("sweep") or {}).keys())
    return keys[0] if keys and keys[0] in columns else None


def _points(sweep_dir: Path) -> tuple[pd.DataFrame, str | None]:
    """The sweep's rows (``sweep.csv``, with ``variant`` and ``run``: the run directory) and
    its swept column."""
    rows = skeleton.sweep_rows(sweep_dir)
    if not rows:
        raise skeleton.ReportError(f"{sweep_dir}: no run directory of the sweep has a row in sweep.csv")
    df = pd.DataFrame([r for _, r in rows]).reset_index(drop=True).infer_objects()
    df["run"] = [run for run, _ in rows]
    if "variant" not in df.columns:
        df["variant"] = df["scheme"]
    return df, _swept(df.columns, read_sweep_spec(sweep_dir))


def sweep_table(sweep_dir: str | Path, baseline: str = "baseline") -> pd.DataFrame:
    """The table of one sweep directory (see the module docstring).

    Returns:
        ``variant``, the swept column, ``samples_per_s``, ``spread95``, ``mean_ci95_low``,
        ``mean_ci95_high`` (:func:`analysis.report.throughput_cells`), ``tx_idle``,
        ``rx_idle``, ``tx_mean``, ``rx_mean`` (worker 0's link), ``flags`` (the run's fidelity
        flags from ``sweep.csv``, :func:`analysis.report.row_flags`), ``status``, ``speedup``
        (over ``baseline`` at the same swept value; NaN without one).

    Raises:
        TestbedError: not a sweep directory, or no ``sweep.csv`` in it.
    """
    df, x = _points(Path(sweep_dir))
    rows = []
    for _, r in df.iterrows():
        u = utilization_summary(r["run"]) if r["status"] == "ok" else {}
        rows.append(
            {
                "variant": r["variant"],
                **({x: r[x]} if x else {}),
                **skeleton.throughput_cells(r),
                "tx_idle": u.get("tx_idle"),
                "rx_idle": u.get("rx_idle"),
                "tx_mean": u.get("tx_mean"),
                "rx_mean": u.get("rx_mean"),
                "flags": skeleton.row_flags(r),
                "status": r["status"],
            }
        )
    table = pd.DataFrame(rows)
    table["speedup"] = skeleton.per_point(table, "samples_per_s", baseline, [x]) if x else float("nan")
    return table


def sweep_plots(sweep_dir: str | Path, out_dir: str | Path, baseline: str = "baseline") -> list[Path]:
    """The figures of one sweep directory, written into ``out_dir``: ``sweep-<field>.png``
    (throughput against the swept field, speedups over ``baseline`` annotated) and, for every
    swept value with an ``ok`` run of both ``baseline`` and ``p3``, ``utilization-<value>.png``.

    Returns:
        The PNGs written (none when the sweep has no swept field).
    """
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis import plots as figures

    sweep_dir, out_dir = Path(sweep_dir), Path(out_dir)
    df, x = _points(sweep_dir)
    if not x:
        return []
    has_base = (df["variant"] == baseline).any()
    out = [
        figures.plot_sweep(
            sweep_dir,
            x,
            out_dir / f"sweep-{x.split('.')[-1]}.png",
            speedup_over=baseline if has_base else None,
            xscale="log" if "slice" in x else "linear",
        )
    ]
    if has_base and (df["variant"] == "p3").any():
        for v in sorted(df[x].unique()):
            runs = [df[(df["variant"] == n) & (df[x] == v) & (df["status"] == "ok")]["run"] for n in (baseline, "p3")]
            # (an archived run keeps no topology or traces: nothing to draw)
            if all(len(r) and (Path(r.iloc[0]) / "topology.json").is_file() for r in runs):
                out.append(
                    figures.plot_utilization(
                        [runs[0].iloc[0], runs[1].iloc[0]],
                        out_dir / f"utilization-{v}.png",
                        labels=[f"{baseline} at {v}", f"p3 at {v}"],
                    )
                )
    return out


def sweep_report(sweep_dir: str | Path, baseline: str = "baseline") -> tuple[pd.DataFrame, list[Path]]:
    """``(sweep_table, sweep_plots)`` of one sweep directory, the plots in ``<sweep>/plots/``."""
    return sweep_table(sweep_dir, baseline), sweep_plots(sweep_dir, Path(sweep_dir) / "plots", baseline)


def _paper_key(sweep_spec: dict) -> str | None:
    """The key of :data:`PAPER` a sweep is read against, from what it varies."""
    swept = set((sweep_spec.get("sweep") or {}).keys())
    model = (sweep_spec.get("workload") or {}).get("model")
    if any("slice" in field for field in swept):
        return "slices"
    return f"{model}/hosts" if swept & set(_SIZE_FIELDS) else model


BW_FIELD = "topology.host_bw_mbps"


def bounds_line(sweep_spec: dict, bws_mbps) -> str | None:
    """What the bytes and the compute allow at each bandwidth of ``bws_mbps`` (Mbit/s, emulated)
    for the sweep's model, compute profile, batch and cluster (:func:`analysis.paper_models.p3.zoo_bounds`),
    or None where those bounds do not describe the sweep: not emulated compute, not a server
    colocated on every worker host, or a model or profile the zoo does not have."""
    w, topo = sweep_spec.get("workload") or {}, sweep_spec.get("topology") or {}
    compute, servers = w.get("compute") or {}, w.get("servers") or {}
    hosts = int(topo.get("racks") or 1) * int(topo.get("hosts_per_rack") or 0)
    workers = int(w.get("workers") or 0) or hosts
    if compute.get("mode") != "emulated" or servers.get("placement") != "colocated" or workers != hosts:
        return None
    parts = []
    for bw in sorted(set(float(b) for b in bws_mbps)):
        try:
            b = p3_model.zoo_bounds(
                w.get("model"), str(compute.get("profile")), int(w.get("batch_size")), bw * 1e6, workers
            )
        except (KeyError, TestbedError, TypeError, ValueError):
            return None
        parts.append(
            f"{bw / 1000:g} Gbit/s: link-busy baseline {b.baseline_s * 1000:.0f} ms, "
            f"P3 at least {b.p3_s * 1000:.0f} ms an iteration: P3 over that baseline at most {b.gain:.2f}x"
        )
    return (
        (
            f"bytes and compute alone (analysis.paper_models.p3; at any bandwidth at most "
            f"{b.max_gain:.2f}x over a baseline at its lower end): " + "; ".join(parts)
        )
        if parts
        else None
    )


def _section(sweep_dir: Path, t: pd.DataFrame, written=()) -> str:
    """One sweep's part of the report: title, table, the paper's number, the bounds of a
    bandwidth sweep (:func:`bounds_line`), the plots."""
    spec = read_sweep_spec(sweep_dir)
    model = (spec.get("workload") or {}).get("model")
    line = bounds_line(spec, t[BW_FIELD]) if BW_FIELD in t.columns else None
    return (
        f"## {sweep_dir.name} ({model}, scale {spec.get('scale')})\n\n"
        f"{skeleton.flagged_markdown(t, floatfmt='.3g')}\n\npaper: {PAPER.get(_paper_key(spec), '-')}\n"
        + (f"{line}\n" if line else "")
        + "".join(f"plot: {p}\n" for p in written)
    )


def table(paths, baseline: str = "baseline") -> str:
    """The report's text for the sweep directories ``paths`` (one section per sweep)."""
    return "\n".join(_section(d, sweep_table(d, baseline)) for d in skeleton.sweep_dirs(paths))


def plots(paths, out_dir, baseline: str = "baseline") -> list[Path]:
    """:func:`sweep_plots` of every sweep, into ``out_dir/<sweep>/``."""
    return [p for d in skeleton.sweep_dirs(paths) for p in sweep_plots(d, Path(out_dir) / d.name, baseline)]


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--baseline", default="baseline", help="variant the speedups are over")


REPORT = skeleton.Report("p3", __doc__.split("\n\n")[0], table, plots, _options, inputs="SWEEP")


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.p3_report SWEEP... [--baseline B]``: every sweep's table, its plots
    drawn into ``<sweep>/plots/``."""
    ap = argparse.ArgumentParser(prog="python -m analysis.p3_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep directories of experiments/p3_*.yaml")
    _options(ap)
    args = ap.parse_args(argv)
    for d in skeleton.sweep_dirs(args.sweeps):
        t, written = sweep_report(d, args.baseline)
        print(_section(d, t, written))
    return 0


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
