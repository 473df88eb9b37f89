"""PHub's numbers from the sweeps of ``experiments/phub_*.yaml``.

    python -m analysis.phub_report SWEEP_DIR [--baseline mxnet-cs]

One row per point: variant, model, racks, oversubscription, whether background traffic ran,
throughput (samples/s, emulated time) and its 1.96-sigma band, the speedup over the
``--baseline`` variant for the same model (PHub Fig. 12), bytes that crossed the core in
total and per iteration (PHub Sec. 3.4 / Fig. 19: hierarchical reduction should move 1/N
of the flat scheme's, N workers per rack; with background flows ``bytes.core`` includes
theirs), and the per-job throughput of a multi-tenant run (``results/worker*.json``
``job``/``job_samples_per_s``; PHub Fig. 18).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

__all__ = ["sweep_table"]


def sweep_table(sweep_dir: str | Path, baseline: str | None = None) -> pd.DataFrame:
    """The table of the module docstring for one sweep directory.

    Raises:
        FileNotFoundError: no ``sweep.csv`` in ``sweep_dir``.
    """
    sweep_dir = Path(sweep_dir)
    df = pd.read_csv(sweep_dir / "sweep.csv")
    rows = []
    for _, r in df.iterrows():
        rd = Path(r["run_dir"])
        per_job: dict = {}
        for f in sorted((rd / "results").glob("worker*.json")):
            d = json.loads(f.read_text())
            if d.get("job_samples_per_s") is not None:
                per_job.setdefault(d["job"], []).append(d["job_samples_per_s"])
        s = json.loads((rd / "summary.json").read_text()) if (rd / "summary.json").exists() else {}
        rows.append({"variant": r.get("variant", r.get("scheme")), "model": r.get("workload.model", s.get("model")),
                     "racks": r.get("topology.racks"), "oversub": r.get("topology.oversubscription"),
                     "background": r.get("background"), "status": r["status"],
                     "samples_per_s": r["samples_per_s"], "ci95": r["samples_per_s_ci95"],
                     "iter_s": r["iter_mean_s"], "core_GB": (r["core_bytes"] or 0) / 1e9,
                     "core_MB_per_iteration": ((s.get("bytes_per_iteration") or {}).get("core") or 0) / 1e6,
                     "cpu_starved": r["cpu_starved"],
                     "per_job_samples_per_s": {j: round(sum(v) / len(v), 1) for j, v in per_job.items()} or None})
    out = pd.DataFrame(rows)
    if baseline is not None and (out["variant"] == baseline).any():
        b = out[out["variant"] == baseline].groupby("model")["samples_per_s"].first()
        out["speedup"] = [row.samples_per_s / b.get(row.model, float("nan")) for row in out.itertuples()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.phub_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep directories of experiments/phub_*.yaml")
    ap.add_argument("--baseline", default="mxnet-cs", help="variant the speedups are over")
    args = ap.parse_args(argv)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    for d in args.sweeps:
        print(f"## {Path(d).name}\n")
        print(sweep_table(d, args.baseline).to_string(index=False))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
