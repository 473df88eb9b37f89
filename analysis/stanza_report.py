"""Stanza against the parameter server, from run directories: Figures 6 a-c, 7 and Table 6.

    testbed report stanza RUN_OR_SWEEP_DIR [...] [--plots DIR]
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
  iteration started) for real-compute runs;
* ``flags``: the run's fidelity flags (:func:`analysis.report.fidelity_flags`).

:func:`pair` puts each Stanza run next to the PS run of the same model and worker count
(the last one if there are several) and gives the speedup ``t_ps / t_stanza`` (equal global
batches, so equal work per iteration), flagged with both runs' fidelity flags. Both tables
are printed as markdown, their ``flags`` explained under a table that has a flagged row.
``--plot`` draws accuracy against wall time of every real-compute run into
``stanza_accuracy.png`` in the first directory given (``--plots DIR``: into ``DIR``).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from analysis import report as skeleton
from analysis.load import Run, load
from analysis.metrics import global_iterations
from analysis.models import stanza as sm
from traffic.data import load_dataset
from traffic.models import model_info
from traffic.profiles import load_profile
from traffic.rundir import find_runs

__all__ = ["IMAGENET_TRAIN", "REPORT", "run_figures", "pair", "report", "table", "plots", "main"]

IMAGENET_TRAIN = 1_281_167
"""Training images of ImageNet-12 (ILSVRC 2012), the data set of Stanza §6.3."""

_STANZA_FC_KINDS = {"activation", "activation_grad", "label"}


def _measured_iterations(run: Run, warmup: int) -> list[int]:
    it = run.events[(run.events["kind"] == "iteration") & (run.events["role"] == "worker")]["iteration"]
    its = sorted(set(int(i) for i in it.dropna()))
    return its[warmup:]


def _iteration_time(run: Run, measured: list[int]) -> float | None:
    s = (run.summary or {}).get("iteration_time_s") or {}
    if s.get("mean") is not None:
        return float(s["mean"])
    g = global_iterations(run.iterations)
    g = g[g["iteration"].isin(measured)]
    return float(g["time_s"].mean()) if len(g) else None


def run_figures(run_dir: str | Path) -> dict:
    """The figures of one run (see the module docstring).

    Returns a dict: ``run``, ``scheme``, ``model``, ``workers`` (CONV workers / PS
    workers), ``fc_workers`` / ``servers``, ``batch_size``, ``measured_s``, ``predicted_s``,
    ``model_error`` (``(predicted - measured) / measured``), ``fc_bytes_per_iter``,
    ``bytes_per_iter``, ``wire_bytes_per_iter``, ``iters_per_epoch``, ``bytes_per_epoch``,
    ``final_accuracy``, ``accuracy_curve`` (list of ``(seconds, accuracy)``), ``flags``
    (:func:`analysis.report.fidelity_flags`).

    Raises:
        FileNotFoundError: not a run directory.
    """
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
    compute = w.get("compute") or {}
    out = {"run": run.path.name, "scheme": scheme, "model": model, "workers": n,
           "profile": _profile_name(compute),
           "fc_workers" if scheme == "stanza" else "servers": other, "batch_size": K,
           "measured_s": _iteration_time(run, measured), "predicted_s": None, "model_error": None,
           "flags": skeleton.fidelity_flags(run_dir)}
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
    if compute.get("mode") == "emulated":
        samples = IMAGENET_TRAIN
    else:
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


def _profile_name(compute: dict) -> str:
    """The compute profile of a run as a short name: ``real``, a device (``v100``), or a
    profile file's stem (``alexnet-v100table1-b128``)."""
    if compute.get("mode") != "emulated":
        return "real"
    ref = str(compute.get("profile", "zero"))
    return Path(ref).stem if ref.endswith(".json") else ref


def _predict(run: Run, scheme: str, model: str, K: int, n: int, other: int, profile: str) -> float:
    c = sm.Constants.from_profile(model, load_profile(profile, model, K))
    bw = float((run.spec.get("topology") or {}).get("host_bw_mbps") or 0) * 1e6
    if scheme == "stanza":
        return sm.stanza_iteration_time(c, n, other, bw)
    return sm.ps_iteration_time(c, n, other, bw)


#: What identifies a Stanza run's PS baseline: the same model, worker count and compute
#: profile (a sweep over profiles gives the band of issue 14: PHub-derived against Table 1).
POINT = ["model", "workers", "profile"]

#: ``pair``'s ratios, PS over Stanza: name -> the per-run figure compared.
RATIOS = {"speedup": "measured_s", "speedup_predicted": "predicted_s", "fc_data_ratio": "fc_bytes_per_iter",
          "epoch_data_ratio": "bytes_per_epoch"}


def pair(rows) -> pd.DataFrame:
    """Stanza and PS rows of the same model, worker count and compute profile side by side (columns
    ``<figure>_stanza`` and ``<figure>_ps``), with ``speedup`` (measured ``t_ps /
    t_stanza``), ``speedup_predicted`` (eq. 6 / eq. 3), ``fc_data_ratio`` and
    ``epoch_data_ratio`` (PS bytes over Stanza bytes), and ``flags``: the union of both runs'
    fidelity flags (:func:`analysis.report.union_flags`). One row per Stanza run that has a PS
    run at its point (the last one if several).

    Args:
        rows: :func:`run_figures` dicts (or a frame of them).
    """
    df = pd.DataFrame(rows).reset_index(drop=True)
    if df.empty:
        return df
    partner = skeleton.baseline_rows(df, "ps", POINT, variant="scheme")
    ratios = {k: skeleton.per_point(df, v, "ps", POINT, variant="scheme", inverse=True) for k, v in RATIOS.items()}
    keep = [i for i in df.index if df.at[i, "scheme"] == "stanza" and partner[i] is not None]
    rest = [c for c in df.columns if c not in POINT]
    j = pd.concat([df.loc[keep, POINT].reset_index(drop=True),
                   df.loc[keep, rest].add_suffix("_stanza").reset_index(drop=True),
                   df.loc[[partner[i] for i in keep], rest].add_suffix("_ps").reset_index(drop=True)], axis=1)
    for k, v in ratios.items():
        j[k] = [v[i] for i in keep]
    j["flags"] = [skeleton.union_flags(a, b) for a, b in zip(j["flags_stanza"], j["flags_ps"])]
    return j


def _mb(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 1e6:,.1f}"


def _s(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _run_table(rows: list[dict]) -> pd.DataFrame:
    """The run figures as the report prints them (strings)."""
    return pd.DataFrame([{
        "scheme": r["scheme"], "model": r["model"], "n": r["workers"], "K": r["batch_size"], "profile": r["profile"],
        "measured": _s(r["measured_s"]), "predicted": _s(r["predicted_s"]),
        "err": "-" if r["model_error"] is None else f"{100 * r['model_error']:+.0f}%",
        "FC MB/it": _mb(r["fc_bytes_per_iter"]), "MB/it": _mb(r["bytes_per_iter"]),
        "wire MB/it": _mb(r["wire_bytes_per_iter"]), "MB/epoch": _mb(r["bytes_per_epoch"]),
        "acc": "-" if r["final_accuracy"] is None else f"{100 * r['final_accuracy']:.1f}", "flags": r["flags"]}
        for r in rows],
        columns=["scheme", "model", "n", "K", "profile", "measured", "predicted", "err", "FC MB/it", "MB/it", "wire MB/it",
                 "MB/epoch", "acc", "flags"])


def _pair_table(j: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([{"model": r.model, "n": r.workers, "profile": r.profile, "speedup": f"{r.speedup:.2f}",
                          "predicted": f"{r.speedup_predicted:.2f}", "FC-data ps/stanza": f"{r.fc_data_ratio:.1f}",
                          "epoch-data ps/stanza": f"{r.epoch_data_ratio:.1f}", "flags": r.flags}
                         for r in j.itertuples()])


def _text(rows: list[dict]) -> str:
    """The text report of :func:`run_figures` rows."""
    right = ["left", "left"] + ["right"] * 10
    lines = ["run figures (times in s of the emulated network; bytes in MB of payload):",
             skeleton.flagged_markdown(_run_table(rows), preformatted=True, colalign=right + ["left"])]
    j = pair(rows)
    if not j.empty:
        lines += ["", "stanza vs ps (same model, workers, global batch):",
                  skeleton.flagged_markdown(_pair_table(j), preformatted=True, colalign=right[1:7] + ["left"])]
    curves = [r for r in rows if r["accuracy_curve"]]
    if curves:
        lines += ["", "accuracy against wall time (worker 0's eval events; s since the first iteration):"]
        for r in curves:
            pts = ", ".join(f"{t:.1f}s {100 * a:.1f}%" for t, a in r["accuracy_curve"])
            lines.append(f"{r['scheme']}: {pts}")
    return "\n".join(lines)


def _rows(paths) -> list[dict]:
    return skeleton.load_rows(find_runs(paths), run_figures)[0]


def report(paths, plot: bool = False) -> str:
    """The text report of every run under ``paths`` (see the module docstring); with
    ``plot``, also the accuracy plot in the first directory given (the parent of a run)."""
    rows = _rows(paths)
    curves = [r for r in rows if r["accuracy_curve"]]
    if plot and curves:
        first = Path(paths[0])
        _plot(curves, first.parent if (first / "spec.yaml").is_file() else first)
    return _text(rows)


def table(paths) -> str:
    """:func:`report` without the plot."""
    return _text(_rows(paths))


def plots(paths, out_dir) -> list[Path]:
    """``stanza_accuracy.png`` in ``out_dir`` when a run has an accuracy curve."""
    curves = [r for r in _rows(paths) if r["accuracy_curve"]]
    return [_plot(curves, Path(out_dir))] if curves else []


def _plot(curves: list[dict], out_dir: Path) -> Path:
    # lazy: analysis.plots loads matplotlib, which the tables do not need
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


REPORT = skeleton.Report("stanza", __doc__.split("\n")[0], table, plots)


def main(argv: list[str] | None = None) -> int:
    """Command line: print :func:`report` of the given run or sweep directories."""
    ap = argparse.ArgumentParser(prog="python -m analysis.stanza_report", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--plot", action="store_true", help="accuracy against wall time -> stanza_accuracy.png")
    a = ap.parse_args(argv)
    print(report(a.dirs, plot=a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
