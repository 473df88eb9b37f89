"""Pipe-SGD report (pipe-sgd.txt Fig. 4): per variant final accuracy, accuracy against train
time, throughput, the timing breakdown, speed-ups, and the timing model against measurement.

Usage::

    .venv/bin/python -m analysis.pipe_sgd_report RUN_OR_SWEEP_DIR [...] [--alpha-us 0] [--plot acc.png]
        [--breakdown breakdown.png]

Every run directory given (or found one level below a sweep directory) is one variant,
labelled from its spec: ``ps`` -> ``PS-Sync``; ``pipe_sgd`` with ``K = 1`` -> ``D-Sync``,
``K = 2`` -> ``Pipe-SGD`` (``Pipe-SGD(K=k)`` otherwise); ``+T`` / ``+Q`` for truncation /
quantization; other schemes by their name. Times are the emulated network's (a dilated run's
clocks divided by ``scale``, :func:`analysis.load.load`).

Definitions (means over the post-warm-up iterations and over workers):

* ``period_s``: (last end - first start of the measured iterations over all workers) /
  their number -- the steady-state time per iteration (pipelined iterations included);
  ``samples_per_s`` = global batch / ``period_s``.
* ``compute_s``: forward + backward event durations of an iteration (computation thread);
  ``update_s``: ``pack`` + ``update`` (the local gradient copied for the communication
  thread, and the optimizer step).
* ``compress_s``: ``compress`` + ``decompress`` spans of the iteration's ring allreduce.
* ``comm_s``: ``pipe_sgd``: the ``allreduce`` spans minus ``compress_s``; ``ps``: the iteration
  minus compute (the worker is blocked in push and pull).
* ``exposed_s``: ``period_s - compute_s - update_s``: what communication (and compression)
  still costs on the critical path; Pipe-SGD's point is to bring it to about zero.
* ``model_s``: :func:`analysis.models.pipe_sgd.iteration_model` -- eq. (2) for PS-Sync and
  D-Sync, eq. (4) with eq. (5)'s ring term for Pipe-SGD -- from the link bandwidth
  (``beta``), ``--alpha-us`` (``alpha``; no delay is emulated, default 0), the measured
  reduction rate (``gamma``, from ``reduce`` spans), the measured codec rates (``compress`` /
  ``decompress`` spans), and the measured ``compute_s`` and ``update_s``.
* ``final_accuracy``: worker 0's final evaluation; the accuracy curve uses worker 0's
  ``eval`` events against train time (wall time from the first iteration's start, minus the
  time spent evaluating).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import Run, load
from analysis.models.pipe_sgd import Network, beta_from_mbps, iteration_model

__all__ = ["variant_label", "find_runs", "analyze_run", "accuracy_curve", "report", "speedups", "main"]

PAPER = {  # pipe-sgd.txt Section 4 ("Results and Analysis") and Fig. 4 labels
    "speedup_vs_dsync": "2.0-3.2x", "speedup_vs_ps": "4.0-5.4x",
}


def variant_label(spec: dict) -> str:
    """``PS-Sync``, ``D-Sync``, ``Pipe-SGD`` (+``T``/+``Q``) or the scheme name, from a run's spec."""
    w = spec.get("workload") or {}
    scheme, opts = w.get("scheme"), w.get("options") or {}
    if scheme == "ps":
        return "PS-Sync"
    if scheme != "pipe_sgd":
        return str(scheme)
    K = int(opts.get("K", 2))
    base = "D-Sync" if K == 1 else ("Pipe-SGD" if K == 2 else f"Pipe-SGD(K={K})")
    return base + {"truncation": "+T", "quantization": "+Q"}.get(opts.get("compression", "none"), "")


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories among ``paths``: a directory with ``spec.yaml`` and ``events/`` is a run,
    otherwise its subdirectories that are runs (a sweep), sorted by name."""
    out = []
    for p in map(Path, paths):
        if (p / "events").is_dir():
            out.append(p)
        else:
            out += sorted(d for d in p.iterdir() if d.is_dir() and (d / "events").is_dir())
    return out


def _per_iteration(ev: pd.DataFrame, kinds: tuple[str, ...], iters) -> float:
    """Mean over workers and measured iterations of the summed durations of ``kinds``."""
    e = ev[ev["kind"].isin(kinds) & ev["iteration"].isin(iters)]
    if e.empty:
        return 0.0
    return float(e.groupby(["proc", "iteration"])["dur"].sum().groupby("proc").sum().sum()
                 / (e["proc"].nunique() * len(iters)))


def _rate(ev: pd.DataFrame, kind: str) -> float:
    """Seconds per byte of the spans of ``kind`` (0 if none)."""
    e = ev[ev["kind"] == kind]
    b = pd.to_numeric(e.get("bytes"), errors="coerce").sum() if not e.empty else 0
    return float(e["dur"].sum() / b) if b else 0.0


def accuracy_curve(run: Run) -> pd.DataFrame:
    """``train_s``, ``accuracy`` of worker 0's ``eval`` events (train time excludes eval time)."""
    ev = run.events
    if ev.empty or "accuracy" not in ev:
        return pd.DataFrame(columns=["train_s", "accuracy"])
    it = ev[(ev["kind"] == "iteration") & (ev["proc"] == "worker0")]
    evals = ev[(ev["kind"] == "eval") & (ev["proc"] == "worker0")].sort_values("ts")
    if it.empty or evals.empty:
        return pd.DataFrame(columns=["train_s", "accuracy"])
    t0 = float(it["ts"].min())
    spent = evals["dur"].cumsum() - evals["dur"]
    return pd.DataFrame({"train_s": (evals["ts"] - t0 - spent).to_numpy(),
                         "accuracy": pd.to_numeric(evals["accuracy"]).to_numpy()})


def analyze_run(run_dir: str | Path, alpha_s: float = 0.0) -> dict:
    """The figures of one run (module docstring); keys: ``variant``, ``model``, ``workers``,
    ``period_s``, ``samples_per_s``, ``compute_s``, ``update_s``, ``compress_s``, ``comm_s``,
    ``exposed_s``, ``wire_bytes``, ``model_s``, ``model_comm_s``, ``model_codec_s``,
    ``final_accuracy``, ``run``.

    Raises:
        FileNotFoundError: not a run directory.
        ValueError: the run has no measured iteration.
    """
    run = load(run_dir)
    spec, w = run.spec, run.spec.get("workload") or {}
    ev = run.events
    ev = ev[ev["role"] == "worker"] if not ev.empty else ev
    its = run.iterations
    warm = int(w.get("warmup_iterations", 0))
    measured = its[its["iteration"] >= warm]
    iters = sorted(measured["iteration"].unique())
    if not iters:
        raise ValueError(f"{run_dir}: no measured iteration")
    p = int(its["worker"].nunique())
    period = float(measured["end"].max() - measured["start"].min()) / len(iters)
    compute = _per_iteration(ev, ("forward", "backward"), iters)
    update = _per_iteration(ev, ("pack", "update"), iters)
    compress = _per_iteration(ev, ("compress", "decompress"), iters)
    label = variant_label(spec)
    scheme, opts = w.get("scheme"), w.get("options") or {}
    if scheme == "ps":
        comm = float(measured["duration_s"].mean()) - compute
    else:
        comm = _per_iteration(ev, ("allreduce",), iters) - compress
    wire = ev[ev["kind"] == "allreduce"]["wire_bytes"].mean() if "wire_bytes" in ev else math.nan
    from traffic.models import model_info
    n_bytes = model_info(w.get("model"))["param_bytes"] if w.get("compute", {}).get("mode") == "emulated" else None
    if n_bytes is None:  # real compute: the model's size for the dataset's input shape
        from traffic.data import load_dataset
        from traffic.models import build_model
        d = load_dataset(w.get("dataset", "digits"), int(w.get("seed", 0)))
        n_bytes = 4 * build_model(w["model"], 0, d.input_shape, d.num_classes, device="meta").num_params()
    topo = spec.get("topology") or {}
    net = Network(alpha_s=alpha_s, beta_s_per_byte=beta_from_mbps(float(topo.get("host_bw_mbps", 100))),
                  gamma_s_per_byte=_rate(ev, "reduce"))
    codec = opts.get("compression", "none") if scheme == "pipe_sgd" else "none"
    ratio = {"none": 1.0, "truncation": 0.5, "quantization": 0.25 + 4 / max(n_bytes / p, 1)}[codec]
    m = iteration_model(label, K=int(opts.get("K", 2)) if scheme == "pipe_sgd" else 1, n_bytes=n_bytes, p=p,
                        net=net, l_comp=compute, l_up=update, wire_ratio=ratio,
                        encode_s_per_byte=_rate(ev, "compress"), decode_s_per_byte=_rate(ev, "decompress"),
                        ps=scheme == "ps")
    acc = (run.results.get("worker0") or {}).get("final_accuracy")
    return {"variant": label, "model": w.get("model"), "workers": p, "period_s": period,
            "samples_per_s": int(w.get("batch_size", 0)) * p / period, "compute_s": compute, "update_s": update,
            "compress_s": compress, "comm_s": comm, "exposed_s": period - compute - update,
            "wire_bytes": float(wire), "model_s": m.iteration_s, "model_comm_s": m.l_comm,
            "model_codec_s": m.l_codec, "final_accuracy": acc, "run": str(run_dir)}


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and variant: ``vs_dsync`` = D-Sync's period / the variant's, ``vs_ps`` =
    PS-Sync's period / the variant's (NaN where the baseline run is missing)."""
    rows = []
    for model, g in df.groupby("model", sort=False):
        per = dict(zip(g["variant"], g["period_s"]))
        for v, t in per.items():
            rows.append({"model": model, "variant": v, "vs_dsync": per.get("D-Sync", math.nan) / t,
                         "vs_ps": per.get("PS-Sync", math.nan) / t})
    return pd.DataFrame(rows)


def report(paths: list[str | Path], alpha_s: float = 0.0, plot: str | None = None, out=sys.stdout,
           breakdown: str | None = None) -> pd.DataFrame:
    """Print the tables for the runs under ``paths``; optionally plot accuracy vs train time
    (``plot``) and the timing breakdown (``breakdown``), each a PNG path.

    Returns:
        One row per run (the :func:`analyze_run` dicts).
    """
    runs = find_runs(paths)
    rows = []
    for r in runs:
        try:
            rows.append(analyze_run(r, alpha_s))
        except (ValueError, KeyError, FileNotFoundError) as e:
            print(f"skipped {r}: {e}", file=out)
    df = pd.DataFrame(rows)
    if df.empty:
        print("no runs", file=out)
        return df
    ms = ["period_s", "compute_s", "update_s", "compress_s", "comm_s", "exposed_s", "model_s",
          "model_comm_s", "model_codec_s"]
    show = df[["model", "variant", "final_accuracy", "samples_per_s", *ms]].copy()
    for c in ms:
        show[c] = show[c] * 1e3
    show.columns = [c.replace("_s", "_ms") if c in ms else c for c in show.columns]
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print("per variant (times in ms per iteration, emulated time):", file=out)
        print(show.to_string(index=False), file=out)
        sp = speedups(df)
        print("\nspeed-up (period of baseline / period of variant); paper: Pipe-SGD "
              f"{PAPER['speedup_vs_dsync']} vs D-Sync, {PAPER['speedup_vs_ps']} vs PS-Sync:", file=out)
        print(sp.to_string(index=False), file=out)
        ds = df[df["variant"] == "D-Sync"]
        for _, r in ds.iterrows():  # the alpha that would make eq. (5)'s ring term match D-Sync
            fit = (r["comm_s"] - r["model_comm_s"]) / (2 * (r["workers"] - 1)) + alpha_s
            print(f"{r['model']}: measured D-Sync allreduce {r['comm_s'] * 1e3:.4g} ms vs eq. (5) term "
                  f"{r['model_comm_s'] * 1e3:.4g} ms -> alpha fitted per step {fit * 1e6:.4g} us", file=out)
        err = (df["model_s"] - df["period_s"]) / df["period_s"]
        print(f"\ntiming model vs measured period: relative error mean {np.nanmean(err):+.1%}, "
              f"max |{np.nanmax(np.abs(err)):.1%}|", file=out)
    if plot:
        from analysis.plots import plt, save_figure
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r, row in zip(runs, rows):
            c = accuracy_curve(load(r))
            if not c.empty:
                ax.plot(c["train_s"], c["accuracy"], marker=".", label=f"{row['variant']} ({row['model']})")
        ax.set_xlabel("train time (s)")
        ax.set_ylabel("top-1 test accuracy")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        save_figure(fig, plot)
        print(f"\nwrote {plot}", file=out)
    if breakdown:
        plot_breakdown(df, breakdown)
        print(f"wrote {breakdown}", file=out)
    return df


def plot_breakdown(df: pd.DataFrame, path: str) -> None:
    """Stacked bars per model and variant, like Fig. 4's right column: computation (forward +
    backward + update), compression, and the communication left on the critical path
    (``exposed_s`` minus compression, floored at 0), ms per iteration; the measured period
    and the model's prediction as markers."""
    from analysis.plots import plt, save_figure
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        g = df[df["model"] == model]
        x = np.arange(len(g))
        comp = (g["compute_s"] + g["update_s"]) * 1e3
        codec = g["compress_s"] * 1e3
        exposed = (g["exposed_s"] - g["compress_s"]).clip(lower=0) * 1e3
        ax.bar(x, comp, label="computation")
        ax.bar(x, codec, bottom=comp, label="truncation/quantization")
        ax.bar(x, exposed, bottom=comp + codec, label="allreduce/communication (exposed)")
        ax.plot(x, g["period_s"] * 1e3, "k_", markersize=18, label="measured period")
        ax.plot(x, g["model_s"] * 1e3, "rx", label="timing model")
        ax.set_xticks(x, g["variant"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per iteration")
        ax.set_title(model)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m analysis.pipe_sgd_report", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="run directories or sweep directories")
    ap.add_argument("--alpha-us", type=float, default=0.0, help="latency per message for the model, microseconds")
    ap.add_argument("--plot", help="write accuracy vs train time to this PNG")
    ap.add_argument("--breakdown", help="write the timing breakdown bars to this PNG")
    a = ap.parse_args(argv)
    report(a.paths, a.alpha_us * 1e-6, a.plot, breakdown=a.breakdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
