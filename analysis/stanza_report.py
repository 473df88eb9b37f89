"""Stanza against the parameter server, from run directories: Figures 6 a-c, 7 and Table 6.

    python -m analysis.stanza_report RUN_OR_SWEEP_DIR [...] [--plot]

For every run (a run directory, or every run of a sweep directory) of scheme ``stanza`` or
``ps`` it computes (:func:`run_figures`):

* ``measured_s``: mean iteration time over the measured iterations (``summary.json``,
  emulated-network time; recomputed from the events when there is no summary);
* ``predicted_s``: Stanza eq. (3) with the run's ``n_c``, ``n_f``, or PS eq. (6) with its
  workers and servers (:mod:`analysis.models.stanza`), from the run's compute profile and
  ``topology.host_bw_mbps`` (real-compute runs have no profile: no prediction);
* ``fc_bytes_per_iter`` (Stanza §6.3 "FC-Data"): payload bytes sent per iteration to
  update the FC layers -- Stanza: activations, their gradients, the labels and, with
  several FC workers, the FC allreduce; PS: pushes and pulls of keys in layers at or after
  the model's ``split_index``;
* ``bytes_per_iter``: payload bytes sent by all processes per iteration (every ``tx``
  event of a measured iteration), and ``wire_bytes_per_iter`` from the switch-port
  captures (``summary.json`` ``bytes_per_iteration.host_links`` / 2: each byte crosses two
  host links);
* ``bytes_per_epoch`` ("Total-Data"): ``bytes_per_iter`` times the iterations of one epoch,
  ``floor(samples / global batch)`` (remainder dropped, Stanza footnote 5) with the
  ImageNet-12 training set (1,281,167 images) for emulated runs and the dataset's training
  set for real-compute runs;
* ``final_accuracy`` and the ``eval`` curve (accuracy against seconds since the first
  iteration started) for real-compute runs.

:func:`pair` puts each Stanza run next to the PS run of the same model and worker count
and gives the speedup ``t_ps / t_stanza`` (equal global batches, so equal work per
iteration). ``--plot`` draws accuracy against wall time of every real-compute run into
``stanza_accuracy.png`` in the first directory given.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from analysis.load import Run, load

__all__ = ["IMAGENET_TRAIN", "run_figures", "pair", "report", "main"]

IMAGENET_TRAIN = 1_281_167
"""Training images of ImageNet-12 (ILSVRC 2012), the data set of Stanza §6.3."""

_STANZA_FC_KINDS = {"activation", "activation_grad", "label"}


def _run_dirs(paths) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if (p / "spec.yaml").is_file():
            out.append(p)
        else:
            out += sorted(d for d in p.iterdir() if (d / "spec.yaml").is_file())
    return out


def _measured_iterations(run: Run, warmup: int) -> list[int]:
    it = run.events[(run.events["kind"] == "iteration") & (run.events["role"] == "worker")]["iteration"]
    its = sorted(set(int(i) for i in it.dropna()))
    return its[warmup:]


def _iteration_time(run: Run, measured: list[int]) -> float | None:
    s = (run.summary or {}).get("iteration_time_s") or {}
    if s.get("mean") is not None:
        return float(s["mean"])
    from analysis.metrics import global_iterations
    g = global_iterations(run.iterations)
    g = g[g["iteration"].isin(measured)]
    return float(g["time_s"].mean()) if len(g) else None


def run_figures(run_dir: str | Path) -> dict:
    """The figures of one run (see the module docstring).

    Returns a dict: ``run``, ``scheme``, ``model``, ``workers`` (CONV workers / PS
    workers), ``fc_workers`` / ``servers``, ``batch_size``, ``measured_s``, ``predicted_s``,
    ``model_error`` (``(predicted - measured) / measured``), ``fc_bytes_per_iter``,
    ``bytes_per_iter``, ``wire_bytes_per_iter``, ``iters_per_epoch``, ``bytes_per_epoch``,
    ``final_accuracy``, ``accuracy_curve`` (list of ``(seconds, accuracy)``).

    Raises:
        FileNotFoundError: not a run directory.
    """
    from traffic.models import model_info
    run = load(run_dir)
    w = run.spec.get("workload") or {}
    scheme, model = w.get("scheme"), w.get("model")
    procs = run.processes.get("processes", [])
    n = sum(p["role"] == "worker" for p in procs)
    other = sum(p["role"] in ("fc", "server") for p in procs)
    K = int(w.get("batch_size") or 0)
    warmup = int(w.get("warmup_iterations") or 0)
    ev = run.events
    measured = _measured_iterations(run, warmup) if not ev.empty else []
    out = {"run": run.path.name, "scheme": scheme, "model": model, "workers": n,
           "fc_workers" if scheme == "stanza" else "servers": other, "batch_size": K,
           "measured_s": _iteration_time(run, measured), "predicted_s": None, "model_error": None}
    split = model_info(model)["split_index"]
    tx = ev[(ev.get("dir") == "tx") & ev["iteration"].isin(measured)] if not ev.empty and "dir" in ev else ev.iloc[0:0]
    m = max(len(measured), 1)
    out["bytes_per_iter"] = float(tx["bytes"].sum()) / m
    if scheme == "stanza":
        fc = tx[tx["kind"].isin(_STANZA_FC_KINDS) | ((tx["kind"] == "allreduce") & (tx.get("members") == "fc"))]
    else:
        fc = tx[tx["kind"].isin({"push", "pull"}) & (pd.to_numeric(tx["layer"], errors="coerce") >= split)]
    out["fc_bytes_per_iter"] = float(fc["bytes"].sum()) / m
    hl = ((run.summary or {}).get("bytes_per_iteration") or {}).get("host_links")
    out["wire_bytes_per_iter"] = None if hl is None else hl / 2
    compute = w.get("compute") or {}
    if compute.get("mode") == "emulated":
        samples = IMAGENET_TRAIN
    else:
        from traffic.data import load_dataset
        samples = load_dataset(w.get("dataset", "digits"), int(w.get("seed") or 0)).n_train
    out["iters_per_epoch"] = samples // max(n * K, 1)
    out["bytes_per_epoch"] = out["bytes_per_iter"] * out["iters_per_epoch"]
    if compute.get("mode") == "emulated" and scheme in ("stanza", "ps"):
        out["predicted_s"] = _predict(run, scheme, model, K, n, other, compute.get("profile", "zero"))
        if out["measured_s"]:
            out["model_error"] = (out["predicted_s"] - out["measured_s"]) / out["measured_s"]
    evals = ev[(ev["kind"] == "eval") & (ev["proc"] == "worker0")] if not ev.empty else ev
    if len(evals) and "accuracy" in evals:
        start = ev[(ev["kind"] == "iteration") & (ev["role"] == "worker")]["ts"].min()
        out["accuracy_curve"] = [(float(r.ts + r.dur - start), float(r.accuracy)) for r in evals.itertuples()]
        out["final_accuracy"] = float(evals["accuracy"].iloc[-1])
    else:
        out["accuracy_curve"], out["final_accuracy"] = [], None
    return out


def _predict(run: Run, scheme: str, model: str, K: int, n: int, other: int, profile: str) -> float:
    from analysis.models import stanza as sm
    from traffic.profiles import load_profile
    c = sm.Constants.from_profile(model, load_profile(profile, model, K))
    bw = float((run.spec.get("topology") or {}).get("host_bw_mbps") or 0) * 1e6
    if scheme == "stanza":
        return sm.stanza_iteration_time(c, n, other, bw)
    return sm.ps_iteration_time(c, n, other, bw)


def pair(rows: list[dict]) -> pd.DataFrame:
    """Stanza and PS rows of the same model and worker count side by side, with
    ``speedup`` (measured ``t_ps / t_stanza``) and ``speedup_predicted`` (eq. 6 / eq. 3)."""
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    j = pd.merge(df[df["scheme"] == "stanza"], df[df["scheme"] == "ps"], on=["model", "workers"],
                 suffixes=("_stanza", "_ps"))
    j["speedup"] = j["measured_s_ps"] / j["measured_s_stanza"]
    j["speedup_predicted"] = j["predicted_s_ps"] / j["predicted_s_stanza"]
    j["fc_data_ratio"] = j["fc_bytes_per_iter_ps"] / j["fc_bytes_per_iter_stanza"]
    j["epoch_data_ratio"] = j["bytes_per_epoch_ps"] / j["bytes_per_epoch_stanza"]
    return j


def _mb(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 1e6:,.1f}"


def _s(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def report(paths, plot: bool = False) -> str:
    """The text report of every run under ``paths`` (see the module docstring)."""
    rows = [run_figures(d) for d in _run_dirs(paths)]
    lines = ["run figures (times in s of the emulated network; bytes in MB of payload):",
             f"{'scheme':7} {'model':11} {'n':>2} {'K':>4} {'measured':>9} {'predicted':>9} {'err':>7} "
             f"{'FC MB/it':>9} {'MB/it':>9} {'wire MB/it':>10} {'MB/epoch':>12} {'acc':>6}"]
    for r in rows:
        err = "-" if r["model_error"] is None else f"{100 * r['model_error']:+.0f}%"
        acc = "-" if r["final_accuracy"] is None else f"{100 * r['final_accuracy']:.1f}"
        lines.append(f"{r['scheme']:7} {r['model']:11} {r['workers']:>2} {r['batch_size']:>4} {_s(r['measured_s']):>9} "
                     f"{_s(r['predicted_s']):>9} {err:>7} {_mb(r['fc_bytes_per_iter']):>9} {_mb(r['bytes_per_iter']):>9} "
                     f"{_mb(r['wire_bytes_per_iter']):>10} {_mb(r['bytes_per_epoch']):>12} {acc:>6}")
    j = pair(rows)
    if not j.empty:
        lines += ["", "stanza vs ps (same model, workers, global batch):",
                  f"{'model':11} {'n':>2} {'speedup':>8} {'predicted':>9} {'FC-data ps/stanza':>18} {'epoch-data ps/stanza':>21}"]
        for r in j.itertuples():
            lines.append(f"{r.model:11} {r.workers:>2} {r.speedup:>8.2f} {r.speedup_predicted:>9.2f} "
                         f"{r.fc_data_ratio:>18.1f} {r.epoch_data_ratio:>21.1f}")
    curves = [r for r in rows if r["accuracy_curve"]]
    if curves:
        lines += ["", "accuracy against wall time (worker 0's eval events; s since the first iteration):"]
        for r in curves:
            pts = ", ".join(f"{t:.1f}s {100 * a:.1f}%" for t, a in r["accuracy_curve"])
            lines.append(f"{r['scheme']}: {pts}")
        if plot:
            _plot(curves, _run_dirs(paths)[0].parent if (Path(paths[0]) / "spec.yaml").is_file() else Path(paths[0]))
    return "\n".join(lines)


def _plot(curves: list[dict], out_dir: Path) -> Path:
    from analysis.plots import plt, save_figure
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in curves:
        t, a = zip(*r["accuracy_curve"])
        ax.plot(t, [100 * x for x in a], marker="o", label=f"{r['scheme']} ({r['workers']} workers)")
    ax.set_xlabel("wall time since the first iteration (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{curves[0]['model']}: accuracy against wall time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, out_dir / "stanza_accuracy.png")


def main(argv: list[str] | None = None) -> int:
    """Command line: print :func:`report` of the given run or sweep directories."""
    ap = argparse.ArgumentParser(prog="python -m analysis.stanza_report", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--plot", action="store_true", help="accuracy against wall time -> stanza_accuracy.png")
    a = ap.parse_args(argv)
    print(report(a.dirs, plot=a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
