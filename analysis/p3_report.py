"""P3's figures and numbers from the sweeps of ``experiments/p3_*.yaml``.

    python -m analysis.p3_report runs/p3_resnet50-<ts> [runs/p3_vgg19-<ts> runs/p3_slices-<ts> ...]

For each sweep directory: a table (markdown, on stdout) with every point's throughput, the
speedup of each variant over the layer-wise baseline at the same swept value, and the idle
fraction and mean utilization of worker 0's link (:mod:`analysis.utilization`; P3 Sec. 5.3);
plots in ``<sweep>/plots/``: throughput against the swept value (P3 Fig. 7, or Fig. 12 for a
slice-size sweep) and, for every swept value that has both, the baseline's and P3's link
utilization over time (Figs. 8 and 9). The paper's numbers (P3 Sec. 5.2) are printed next to
the table for comparison.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import plots
from analysis.utilization import utilization_summary

__all__ = ["PAPER", "sweep_report"]

PAPER = {
    "resnet50": "P3 Fig. 7a: +26% over the baseline at 4 Gbit/s; similar throughput when bandwidth suffices "
                "(baseline drops below 6 Gbit/s, P3 below 4 Gbit/s); no gain from slicing alone",
    "vgg19": "P3 Fig. 7c: slicing alone +49% at 30 Gbit/s; P3 up to +66% at 15 Gbit/s",
    "sockeye_lstm": "P3 Fig. 7d: up to +38%",
    "slices": "P3 Fig. 12: throughput peaks at 50,000 parameters per slice",
}


def _swept(df: pd.DataFrame, sweep_yaml: dict) -> str | None:
    keys = list((sweep_yaml.get("sweep") or {}).keys())
    return keys[0] if keys and keys[0] in df.columns else None


def sweep_report(sweep_dir: str | Path, baseline: str = "baseline") -> tuple[pd.DataFrame, list[Path]]:
    """The table and plots of one sweep directory (see the module docstring).

    Returns:
        ``(table, plot paths)``; the table has ``variant``, the swept column, ``samples_per_s``,
        ``ci95``, ``speedup`` (over ``baseline`` at the same swept value; NaN without one),
        ``tx_idle``, ``rx_idle``, ``tx_mean``, ``rx_mean`` (worker 0's link), ``cpu_starved``.

    Raises:
        FileNotFoundError: no ``sweep.csv`` in ``sweep_dir``.
    """
    import yaml

    sweep_dir = Path(sweep_dir)
    df = pd.read_csv(sweep_dir / "sweep.csv")
    spec = yaml.safe_load((sweep_dir / "sweep.yaml").read_text()) if (sweep_dir / "sweep.yaml").exists() else {}
    x = _swept(df, spec)
    if "variant" not in df.columns:
        df["variant"] = df["scheme"]
    rows = []
    for _, r in df.iterrows():
        u = utilization_summary(r["run_dir"]) if r["status"] == "ok" else {}
        rows.append({"variant": r["variant"], **({x: r[x]} if x else {}), "samples_per_s": r["samples_per_s"],
                     "ci95": r["samples_per_s_ci95"], "tx_idle": u.get("tx_idle"), "rx_idle": u.get("rx_idle"),
                     "tx_mean": u.get("tx_mean"), "rx_mean": u.get("rx_mean"), "cpu_starved": r["cpu_starved"],
                     "status": r["status"]})
    table = pd.DataFrame(rows)
    if x and (table["variant"] == baseline).any():
        base = table[table["variant"] == baseline].set_index(x)["samples_per_s"]
        table["speedup"] = [s / base[v] if v in base.index else float("nan")
                            for v, s in zip(table[x], table["samples_per_s"])]
    else:
        table["speedup"] = float("nan")
    out = []
    if x:
        out.append(plots.plot_sweep(sweep_dir, x, speedup_over=baseline if (table["variant"] == baseline).any() else None,
                                    xscale="log" if "slice" in x else "linear"))
        if (table["variant"] == baseline).any() and (table["variant"] == "p3").any():
            for v in sorted(table[x].unique()):
                runs = [df[(df["variant"] == n) & (df[x] == v) & (df["status"] == "ok")]["run_dir"] for n in (baseline, "p3")]
                if all(len(r) for r in runs):
                    out.append(plots.plot_utilization([runs[0].iloc[0], runs[1].iloc[0]],
                                                      sweep_dir / "plots" / f"utilization-{v}.png",
                                                      labels=[f"{baseline} at {v}", f"p3 at {v}"]))
    return table, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.p3_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep directories of experiments/p3_*.yaml")
    ap.add_argument("--baseline", default="baseline", help="variant the speedups are over")
    args = ap.parse_args(argv)
    for d in args.sweeps:
        table, written = sweep_report(d, args.baseline)
        import yaml
        spec = yaml.safe_load((Path(d) / "sweep.yaml").read_text())
        model = (spec.get("workload") or {}).get("model")
        key = "slices" if "slice" in " ".join((spec.get("sweep") or {}).keys()) else model
        print(f"## {Path(d).name} ({model}, scale {spec.get('scale')})\n")
        print(table.to_markdown(index=False, floatfmt=".3g"))
        print(f"\npaper: {PAPER.get(key, '-')}")
        for p in written:
            print(f"plot: {p}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
