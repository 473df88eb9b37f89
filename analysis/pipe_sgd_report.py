"""Pipe-SGD report (Fig. 4): per variant final accuracy, accuracy against train
time, throughput, the timing breakdown, speed-ups, and the timing model against measurement.

Usage::

    testbed report pipe_sgd RUN_OR_SWEEP_DIR [...] [--alpha-us 0] [--plots DIR]
    .venv/bin/python -m analysis.pipe_sgd_report RUN_OR_SWEEP_DIR [...] [--alpha-us 0] [--plot acc.png]
        [--breakdown breakdown.png]

The tables are printed as markdown, floats with 4 significant digits. ``--plots DIR``
writes ``breakdown.png`` there, and ``accuracy.png`` when a run has an accuracy curve.

Every run directory given (or the runs of a sweep directory) is one variant,
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
* ``model_s``: :func:`analysis.paper_models.pipe_sgd.iteration_model` -- eq. (2) for PS-Sync and
  D-Sync, eq. (4) with eq. (5)'s ring term for Pipe-SGD -- from the link bandwidth
  (``beta``), ``--alpha-us`` (``alpha``; no delay is emulated, default 0), the measured
  reduction rate (``gamma``, from ``reduce`` spans), the measured codec rates (``compress`` /
  ``decompress`` spans), and the measured ``compute_s`` and ``update_s``.
* ``final_accuracy``: worker 0's final evaluation; the accuracy curve uses worker 0's
  ``eval`` events against train time (wall time from the first iteration's start, minus the
  time spent evaluating).
* ``flags``: the run's fidelity flags (:func:`analysis.report.fidelity_flags`); in the
  speed-up table, those of the variant's run and of the baselines it is divided by. A table
  with a flagged row says what the flags mean under it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import report as skeleton
from analysis.load import Run, in_span, load
from analysis.metrics import global_iterations
from analysis.paper_models.pipe_sgd import Network, beta_from_mbps, iteration_model
from traffic import rundir
from traffic.data import load_dataset
from traffic.models import build_model, model_info

__all__ = [
    "REPORT",
    "variant_label",
    "find_runs",
    "analyze_run",
    "accuracy_curve",
    "report",
    "speedups",
    "table",
    "plots",
    "main",
]

PAPER = {  # Pipe-SGD Section 4 ("Results and Analysis") and Fig. 4 labels
    "speedup_vs_dsync": "2.0-3.2x",
    "speedup_vs_ps": "4.0-5.4x",
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
    """Run directories among ``paths`` (:func:`traffic.rundir.find_runs`: a run directory, or
    the runs of a sweep directory in the sweep's order)."""
    return rundir.find_runs(paths)


def _per_iteration(ev: pd.DataFrame, kinds: tuple[str, ...], iters) -> float:
    """Mean over workers and measured iterations of the summed durations of ``kinds``."""
    e = ev[ev["kind"].isin(kinds) & ev["iteration"].isin(iters)]
    if e.empty:
        return 0.0
    return float(
        e.groupby(["proc", "iteration"])["dur"].sum().groupby("proc").sum().sum() / (e["proc"].nunique() * len(iters))
    )


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
    return pd.DataFrame(
        {"train_s": (evals["ts"] - t0 - spent).to_numpy(), "accuracy": pd.to_numeric(evals["accuracy"]).to_numpy()}
    )


def analyze_run(run_dir: str | Path, alpha_s: float = 0.0) -> dict:
    """The figures of one run (module docstring); keys: ``variant``, ``model``, ``workers``,
    ``period_s``, ``samples_per_s``, ``compute_s``, ``update_s``, ``compress_s``, ``comm_s``,
    ``exposed_s``, ``wire_bytes``, ``model_s``, ``model_comm_s``, ``model_codec_s``,
    ``final_accuracy``, ``run``, ``flags`` (:func:`analysis.report.fidelity_flags`).

    Raises:
        FileNotFoundError: not a run directory.
        ValueError: the run has no measured iteration.
    """
    run = load(run_dir)
    spec, w = run.spec, run.spec.get("workload") or {}
    ev = run.events
    ev = ev[ev["role"] == "worker"] if not ev.empty else ev
    its = run.iterations
    measured = its[in_span(its["iteration"], run.measured_span)]
    iters = sorted(measured["iteration"].unique())
    if not iters:
        raise ValueError(f"{run_dir}: no measured iteration")
    p = int(its["worker"].nunique())
    g = global_iterations(its)
    period = float(g[in_span(g["iteration"], run.measured_span)]["time_s"].mean())  # the summary's iteration time
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
    n_bytes = model_info(w.get("model"))["param_bytes"] if w.get("compute", {}).get("mode") == "emulated" else None
    if n_bytes is None:  # real compute: the model's size for the dataset's input shape
        d = load_dataset(w.get("dataset", "digits"), int(w.get("seed", 0)))
        n_bytes = 4 * build_model(w["model"], 0, d.input_shape, d.num_classes, device="meta").num_params()
    topo = spec.get("topology") or {}
    net = Network(
        alpha_s=alpha_s,
        beta_s_per_byte=beta_from_mbps(float(topo.get("host_bw_mbps", 100))),
        gamma_s_per_byte=_rate(ev, "reduce"),
    )
    codec = opts.get("compression", "none") if scheme == "pipe_sgd" else "none"
    ratio = {"none": 1.0, "truncation": 0.5, "quantization": 0.25 + 4 / max(n_bytes / p, 1)}[codec]
    m = iteration_model(
        label,
        K=int(opts.get("K", 2)) if scheme == "pipe_sgd" else 1,
        n_bytes=n_bytes,
        p=p,
        net=net,
        l_comp=compute,
        l_up=update,
        wire_ratio=ratio,
        encode_s_per_byte=_rate(ev, "compress"),
        decode_s_per_byte=_rate(ev, "decompress"),
        ps=scheme == "ps",
    )
    acc = (run.results.get("worker0") or {}).get("final_accuracy")
    return {
        "variant": label,
        "model": w.get("model"),
        "workers": p,
        "period_s": period,
        "samples_per_s": int(w.get("batch_size", 0)) * p / period,
        "compute_s": compute,
        "update_s": update,
        "compress_s": compress,
        "comm_s": comm,
        "exposed_s": period - compute - update,
        "wire_bytes": float(wire),
        "model_s": m.iteration_s,
        "model_comm_s": m.l_comm,
        "model_codec_s": m.l_codec,
        "final_accuracy": acc,
        "run": str(run_dir),
        "flags": skeleton.fidelity_flags(run_dir),
    }


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and variant (the last run of each): ``vs_dsync`` = D-Sync's period / the
    variant's, ``vs_ps`` = PS-Sync's period / the variant's (NaN where the baseline run is
    missing), and ``flags``: the fidelity flags of the variant's run and of the baseline runs
    it is compared with (:func:`analysis.report.union_flags`). Models in the order they first
    appear.

    Args:
        df: :func:`analyze_run` rows (``model``, ``variant``, ``period_s``, ``flags``).
    """
    parts = []
    for _, g in df.groupby("model", sort=False):
        last = g.drop_duplicates("variant", keep="last").set_index("variant", drop=False)
        parts.append(last.loc[list(dict.fromkeys(g["variant"]))])
    if not parts:
        return pd.DataFrame(columns=["model", "variant", "vs_dsync", "vs_ps", "flags"])
    runs = pd.concat(parts).reset_index(drop=True)
    bases = [skeleton.baseline_rows(runs, b, ["model"]) for b in ("D-Sync", "PS-Sync")]
    flags = [
        skeleton.union_flags(runs.at[i, "flags"], *(runs.at[b[i], "flags"] for b in bases if b[i] is not None))
        for i in runs.index
    ]
    return pd.DataFrame(
        {
            "model": runs["model"],
            "variant": runs["variant"],
            "vs_dsync": skeleton.per_point(runs, "period_s", "D-Sync", ["model"], inverse=True),
            "vs_ps": skeleton.per_point(runs, "period_s", "PS-Sync", ["model"], inverse=True),
            "flags": flags,
        }
    ).reset_index(drop=True)


_MS = [
    "period_s",
    "compute_s",
    "update_s",
    "compress_s",
    "comm_s",
    "exposed_s",
    "model_s",
    "model_comm_s",
    "model_codec_s",
]


def _rows(paths, alpha_s: float) -> tuple[list[Path], list[dict], list[str]]:
    """The runs under ``paths``, the :func:`analyze_run` row of those that could be analysed,
    and a note for each that could not."""
    runs = find_runs(paths)
    rows, notes = skeleton.load_rows(
        runs, lambda r: analyze_run(r, alpha_s), skip=(ValueError, KeyError, FileNotFoundError)
    )
    return runs, rows, notes


def _text(df: pd.DataFrame, alpha_s: float, notes: list[str]) -> str:
    """The tables and notes of the module docstring for :func:`analyze_run` rows ``df``."""
    if df.empty:
        return "\n".join(notes + ["no runs"])
    show = df[["model", "variant", "final_accuracy", "samples_per_s", *_MS, "flags"]].copy()
    for c in _MS:
        show[c] = show[c] * 1e3
    show.columns = [c.replace("_s", "_ms") if c in _MS else c for c in show.columns]
    lines = notes + [
        "per variant (times in ms per iteration, emulated time):",
        skeleton.flagged_markdown(show, floatfmt=".4g"),
        "",
        "speed-up (period of baseline / period of variant); paper: Pipe-SGD "
        f"{PAPER['speedup_vs_dsync']} vs D-Sync, {PAPER['speedup_vs_ps']} vs PS-Sync:",
        skeleton.flagged_markdown(speedups(df), floatfmt=".4g"),
    ]
    for _, r in df[df["variant"] == "D-Sync"].iterrows():  # the alpha that would make eq. (5)'s ring term match D-Sync
        fit = (r["comm_s"] - r["model_comm_s"]) / (2 * (r["workers"] - 1)) + alpha_s
        lines.append(
            f"{r['model']}: measured D-Sync allreduce {r['comm_s'] * 1e3:.4g} ms vs eq. (5) term "
            f"{r['model_comm_s'] * 1e3:.4g} ms -> alpha fitted per step {fit * 1e6:.4g} us"
        )
    err = (df["model_s"] - df["period_s"]) / df["period_s"]
    lines += [
        "",
        f"timing model vs measured period: relative error mean {np.nanmean(err):+.1%}, "
        f"max |{np.nanmax(np.abs(err)):.1%}|",
    ]
    return "\n".join(lines)


def report(
    paths: list[str | Path], alpha_s: float = 0.0, plot: str | None = None, out=sys.stdout, breakdown: str | None = None
) -> pd.DataFrame:
    """Print the tables for the runs under ``paths``; optionally plot accuracy vs train time
    (``plot``) and the timing breakdown (``breakdown``), each a PNG path.

    Returns:
        One row per run (the :func:`analyze_run` dicts).
    """
    runs, rows, notes = _rows(paths, alpha_s)
    df = pd.DataFrame(rows)
    print(_text(df, alpha_s, notes), file=out)
    if df.empty:
        return df
    if plot:
        plot_accuracy(runs, rows, plot)
        print(f"\nwrote {plot}", file=out)
    if breakdown:
        plot_breakdown(df, breakdown, sweeps=paths)
        print(f"wrote {breakdown}", file=out)
    return df


def table(paths, alpha_us: float = 0.0) -> str:
    """The report's text for the runs under ``paths``; ``alpha_us``: the model's latency per
    message, microseconds."""
    _, rows, notes = _rows(paths, alpha_us * 1e-6)
    return _text(pd.DataFrame(rows), alpha_us * 1e-6, notes)


def plots(paths, out_dir, alpha_us: float = 0.0) -> list[Path]:
    """``accuracy.png`` (accuracy against train time; only when a run has ``eval`` events)
    and ``breakdown.png`` (the timing breakdown) in ``out_dir``; returns the paths written."""
    runs, rows, _ = _rows(paths, alpha_us * 1e-6)
    if not rows:
        return []
    out = Path(out_dir)
    written = []
    curves = _curves(runs, rows)
    if curves:  # a timing sweep evaluates nothing: no empty accuracy plot
        _plot_curves(curves, out / "accuracy.png")
        written.append(out / "accuracy.png")
    plot_breakdown(pd.DataFrame(rows), out / "breakdown.png", sweeps=paths)
    return written + [out / "breakdown.png"]


def _curves(runs: list[Path], rows: list[dict]) -> list[tuple[str, pd.DataFrame]]:
    """(label, accuracy curve) of every run of ``rows`` with ``eval`` events, in run order."""
    by_run = {row["run"]: row for row in rows}
    out = []
    for r in runs:
        row = by_run.get(str(r))
        c = accuracy_curve(load(r)) if row else pd.DataFrame()
        if not c.empty:
            out.append((f"{row['variant']} ({row['model']})", c))
    return out


def plot_accuracy(runs: list[Path], rows: list[dict], path) -> None:
    """Accuracy against train time of every run with ``eval`` events (Pipe-SGD Fig. 4 left);
    with none, the axes say so."""
    _plot_curves(_curves(runs, rows), path)


def _plot_curves(curves: list[tuple[str, pd.DataFrame]], path) -> None:
    """The accuracy plot of :func:`_curves`' curves."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import plt, save_figure

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, c in curves:
        ax.plot(c["train_s"], c["accuracy"], marker=".", label=label)
    ax.set_xlabel("train time (s)")
    ax.set_ylabel("top-1 test accuracy")
    if curves:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no run has eval events", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def plot_breakdown(df: pd.DataFrame, path: str, sweeps=()) -> None:
    """Stacked bars per model and variant, like Fig. 4's right column: computation (forward +
    backward + update), compression, and the communication left on the critical path
    (``exposed_s`` minus compression, floored at 0), ms per iteration; the measured period
    and the model's prediction as markers; on the numerator's bar, the period the paper's
    value of the catalogue's headline ratios for ``sweeps`` implies
    (:func:`analysis.plots.mark_paper`, a time: lower is faster)."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import mark_paper, plt, save_figure

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
        mark_paper(
            ax,
            sweeps,
            dict(zip(g["run"], g["period_s"] * 1e3)),
            {r: (i - 0.4, i + 0.4) for r, i in zip(g["run"], x)},
            inverse=True,
        )
        ax.set_xticks(x, g["variant"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per iteration")
        ax.set_title(model)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--alpha-us", type=float, default=0.0, help="latency per message for the model, microseconds")


REPORT = skeleton.Report("pipe_sgd", __doc__.split("\n")[0], table, plots, _options)


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m analysis.pipe_sgd_report", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="run directories or sweep directories")
    _options(ap)
    ap.add_argument("--plot", help="write accuracy vs train time to this PNG")
    ap.add_argument("--breakdown", help="write the timing breakdown bars to this PNG")
    a = ap.parse_args(argv)
    report(a.paths, a.alpha_us * 1e-6, a.plot, breakdown=a.breakdown)
    return 0


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
