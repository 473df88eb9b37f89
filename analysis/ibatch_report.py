"""iBatch report: speedup of the pull strategies (Fig. 5), per-layer profile (Fig. 3), and
the model of eqs. (1)-(4) against the measured pull-plus-forward phase.

Input: run directories of the ``ibatch`` scheme (a sweep directory is searched for them).
Everything is in the emulated network's time: event times are converted by
:func:`analysis.load.load`, and ``ibatch.json`` (wall-clock seconds) is divided by ``scale``.

* :func:`run_row` -- one run: model, pull strategy, nodes (workers), samples/s
  (``summary.json``'s ``throughput.mean``, or computed from the events for a loopback run),
  the batches used, the model's phase (eq. (4) ``model_exe_s`` and the two-thread timeline
  ``model_pipeline_s``, from the run's measured profile), the measured phase and the run's
  fidelity flags (``flags``, :func:`analysis.report.fidelity_flags`; both tables show them
  and explain them under a table with a flagged row).
* :func:`measured_phase` -- the pull-plus-forward phase of every (worker, iteration) after
  the profiling: from the end of the iteration's ``sync`` (every server has updated; the
  pulls start) to the end of the last layer's ``forward`` event.
* :func:`speedup_table` -- speedup = samples/s / samples/s of the same model's 1-node
  ``default`` run (the single-node baseline; the mean of the model's 1-node runs if there
  is no ``default`` one), as the paper's "speedup on throughput compared with single node".
* :func:`plot_speedup` (Fig. 5), :func:`plot_layer_profile` (Fig. 3: per layer ``T_s +
  T_t^i`` and ``C^i`` with the chosen batches).

Command line: ``testbed report ibatch RUN_OR_SWEEP_DIR... [--plots DIR]`` (or ``python -m
analysis.ibatch_report`` with the same arguments) prints both tables (markdown) and writes
``speedup.png`` and ``profile-<model>.png`` (the profile of the largest cluster's run, its
``ibatch`` run if any) into ``--plots``. The first table's figures are rounded to 6
decimals, the second's to 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import report as skeleton
from analysis.load import load
from analysis.metrics import global_iterations, iteration_table, measured_iterations, throughput_stats
from traffic import rundir

__all__ = ["REPORT", "find_runs", "measured_phase", "run_row", "report", "speedup_table", "plot_speedup",
           "plot_layer_profile", "table", "plots", "main"]

PROFILE_FILE = "ibatch.json"


def find_runs(paths) -> list[Path]:
    """Run directories of scheme ``ibatch`` (those with ``ibatch.json``) among
    :func:`traffic.rundir.find_runs` of ``paths`` (each a run or a sweep directory)."""
    return [r for r in rundir.find_runs(paths) if (r / PROFILE_FILE).is_file()]


def measured_phase(events: pd.DataFrame, profile_iterations: int, layers: int) -> pd.DataFrame:
    """Pull-plus-forward phase per (worker, iteration) after the profiling iterations.

    Args:
        events: a run's events (emulated time, :func:`analysis.load.load`).
        profile_iterations: ``P``; iterations ``> P`` are measured.
        layers: ``L``; the phase ends with layer ``L-1``'s ``forward`` event.

    Returns:
        DataFrame ``worker, iteration, phase_s`` (seconds).
    """
    ev = events[(events["role"] == "worker") & (events["iteration"] > profile_iterations)]
    sync = ev[ev["kind"] == "sync"].assign(end=lambda d: d["ts"] + d["dur"])
    last = ev[(ev["kind"] == "forward") & (ev["layer"] == layers - 1)].assign(end=lambda d: d["ts"] + d["dur"])
    m = sync[["proc", "iteration", "end"]].merge(last[["proc", "iteration", "end"]], on=["proc", "iteration"],
                                                 suffixes=("_sync", "_fwd"))
    return pd.DataFrame({"worker": m["proc"], "iteration": m["iteration"].astype(int),
                         "phase_s": m["end_fwd"] - m["end_sync"]})


def _throughput(run) -> float | None:
    tp = (run.summary or {}).get("throughput") or {}
    if tp.get("mean") is not None:
        return float(tp["mean"])
    w = run.spec.get("workload", {})
    glob = global_iterations(iteration_table(run.events))
    return throughput_stats(measured_iterations(glob, int(w.get("warmup_iterations", 0))))["throughput"]["mean"]


def run_row(run_dir) -> dict:
    """One run's figures (see the module docstring); times in emulated seconds."""
    run = load(run_dir)
    doc = json.loads((Path(run_dir) / PROFILE_FILE).read_text())
    scale = float(doc.get("scale") or 1.0)
    w = run.spec["workload"]
    used = doc["used"]
    phase = measured_phase(run.events, int(doc["profile_iterations"]), int(doc["layers"]))
    workers = len([p for p in (run.processes or {}).get("processes", []) if p["role"] == "worker"]) or doc["workers"]
    return {"run": str(run_dir), "model": w["model"], "pull": doc["strategy"], "nodes": workers,
            "overlap": bool(w.get("options", {}).get("overlap", False)),
            "samples_per_s": _throughput(run), "batches": len(used["ends"]), "ends": used["ends"],
            "chosen": doc["chosen"], "T_s_ms": 1e3 * doc["profile"]["startup_s"] / scale,
            "model_exe_s": used["exe_s"] / scale, "model_pipeline_s": used["pipeline_s"] / scale,
            "meets_5": used["meets_constraint"],
            "measured_phase_s": float(phase["phase_s"].median()) if len(phase) else np.nan,
            "optimal_exe_s": doc["optimal"]["exe_s"] / scale, "flags": skeleton.fidelity_flags(run_dir)}


def speedup_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Add ``speedup`` (over the same model's 1-node ``default`` runs, else over all its
    1-node runs, their mean samples/s; NaN without either). Sorted by model, strategy, nodes."""
    rows = rows.copy()
    one = rows["nodes"] == 1
    has_default = set(rows.loc[one & (rows["pull"] == "default"), "model"])
    base = one & ((rows["pull"] == "default") | ~rows["model"].isin(has_default))
    rows["speedup"] = skeleton.per_point(rows, "samples_per_s", base.to_numpy(), ["model"], reduce="mean")
    return rows.sort_values(["model", "pull", "nodes"]).reset_index(drop=True)


def report(paths) -> pd.DataFrame:
    """:func:`run_row` of every ibatch run under ``paths``, with :func:`speedup_table`'s speedup.

    Raises:
        ReportError: no ibatch run under ``paths``.
        NotARunError: a path that is neither a run nor a sweep directory.
    """
    runs = find_runs(paths)
    if not runs:
        raise skeleton.ReportError(f"no ibatch run (a run directory with {PROFILE_FILE}) under {list(map(str, paths))}")
    rows, _ = skeleton.load_rows(runs, run_row)
    return speedup_table(pd.DataFrame(rows))


def table(paths) -> str:
    """Both tables of the module docstring for the runs under ``paths``, as text."""
    rows = report(paths)
    t = rows.assign(eq4_ms=1e3 * rows["model_exe_s"], timeline_ms=1e3 * rows["model_pipeline_s"],
                    measured_ms=1e3 * rows["measured_phase_s"], optimum_eq4_ms=1e3 * rows["optimal_exe_s"])
    # pandas' display precision (6 decimals) and the 2 decimals of before, printed as rounded
    first = rows[["model", "pull", "nodes", "samples_per_s", "speedup", "batches", "ends", "flags"]].round(6)
    second = t[["model", "pull", "nodes", "T_s_ms", "meets_5", "eq4_ms", "timeline_ms", "measured_ms",
                "optimum_eq4_ms", "flags"]].round(2)
    return ("Throughput and speedup over one node (iBatch Fig. 5):\n"
            f"{skeleton.flagged_markdown(first, floatfmt='')}\n"
            "\nPull-plus-forward phase, model (eq. (4) / two-thread timeline) against measured (median), ms:\n"
            f"{skeleton.flagged_markdown(second, floatfmt='')}")


def plots(paths, out_dir) -> list[Path]:
    """``speedup.png`` (Fig. 5) and, per model, ``profile-<model>.png`` (Fig. 3) of its
    largest cluster's run (its ``ibatch`` run if any), into ``out_dir``."""
    rows, out = report(paths), Path(out_dir)
    written = [plot_speedup(rows, out / "speedup.png")]
    for model, g in rows.groupby("model"):
        pick = g.sort_values(["nodes", "pull"], key=lambda c: c if c.name == "nodes" else c.eq("ibatch")).iloc[-1]
        written.append(plot_layer_profile(pick["run"], out / f"profile-{model}.png"))
    return written


def plot_speedup(rows: pd.DataFrame, path) -> Path:
    """Fig. 5: speedup against nodes, one panel per model, one line per pull strategy, and
    the ideal linear speedup."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import plt, save_figure
    models = sorted(rows["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        g = rows[rows["model"] == model]
        n = sorted(g["nodes"].unique())
        ax.plot(n, n, "k:", label="ideal")
        for pull, gg in g.groupby("pull"):
            gg = gg.sort_values("nodes")
            ax.plot(gg["nodes"], gg["speedup"], marker="o", label=pull)
        ax.set_title(model)
        ax.set_xlabel("nodes")
        ax.set_ylabel("speedup over 1 node")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_layer_profile(run_dir, path) -> Path:
    """Fig. 3: per layer, the pull time ``T_s + T_t^i`` and the forward time ``C^i`` measured
    in the run (ms, emulated time), with the batches iBatch chose marked."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import plt, save_figure
    doc = json.loads((Path(run_dir) / PROFILE_FILE).read_text())
    scale = float(doc.get("scale") or 1.0)
    p = doc["profile"]
    L = int(doc["layers"])
    x = np.arange(1, L + 1)
    pull = 1e3 * (np.array(p["transfer_s"]) + p["startup_s"]) / scale
    fwd = 1e3 * np.array(p["forward_s"]) / scale
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * L), 3.4))
    ax.bar(x - 0.2, pull, 0.4, label="pull (T_s + T_t^i)")
    ax.bar(x + 0.2, fwd, 0.4, label="forward (C^i)")
    chosen = doc["candidates"][doc["chosen"]]["ends"]
    for e in chosen[:-1]:
        ax.axvline(e + 0.5, color="k", ls="--", lw=0.8)
    ax.set_xticks(x)
    ax.set_xlabel(f"layer (batches of {doc['chosen']}: ends {chosen})")
    ax.set_ylabel("ms")
    ax.set_title(f"{doc.get('workers')} workers, {doc.get('servers')} servers")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


REPORT = skeleton.Report("ibatch", __doc__.split("\n")[0], table, plots)


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); exit 1 when no ibatch run is found."""
    try:
        return REPORT.main(sys.argv[1:] if argv is None else argv, prog="python -m analysis.ibatch_report")
    except skeleton.ReportError as e:
        print(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
