"""iBatch report: pull strategies' speedup (Fig. 5), layer profile (Fig. 3), eq. (4), time breakdown (Fig. 7).

The speedup of the pull strategies (Fig. 5), the per-layer profile (Fig. 3), the model of eqs.
(1)-(4) against the measured pull-plus-forward phase and, with ``--fig7``, the execution-time
breakdown (Fig. 7).

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
* with ``--fig7``, :func:`breakdown_table` (Fig. 7) -- per run, the mean worker iteration
  (:func:`iteration_breakdown`) split into sync, the paper's ExeTime parts from the
  ``pull_batch`` and ``forward`` spans (communication only, overlap, computation only, and
  idle) and the time after the forward pass, in ms and normalized to the default pull's
  ExeTime at the same point (:data:`BREAKDOWN_NOTE`); :func:`plot_breakdown` draws them as
  stacked bars.

Command line: ``testbed report ibatch RUN_OR_SWEEP_DIR... [--fig7] [--plots DIR]`` (or ``python -m
analysis.ibatch_report`` with the same arguments) prints both tables (markdown), with ``--fig7``
the two breakdown tables after them, and writes ``speedup.png`` and ``profile-<model>.png`` (the
profile of the largest cluster's run, its ``ibatch`` run if any), with ``--fig7`` also
``breakdown.png``, into ``--plots``. The first table's figures are rounded to 6 decimals, the
second's and the breakdown in ms to 2, the normalized breakdown to 3.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import report as skeleton
from analysis.load import load
from analysis.metrics import global_iterations, iteration_table, measured_iterations, throughput_stats
from traffic import rundir

__all__ = [
    "REPORT",
    "PARTS",
    "EXE_PARTS",
    "BREAKDOWN_NOTE",
    "find_runs",
    "measured_phase",
    "run_row",
    "report",
    "speedup_table",
    "plot_speedup",
    "plot_layer_profile",
    "iteration_breakdown",
    "breakdown_row",
    "breakdown_table",
    "breakdown_text",
    "plot_breakdown",
    "table",
    "plots",
    "main",
]

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
    m = sync[["proc", "iteration", "end"]].merge(
        last[["proc", "iteration", "end"]], on=["proc", "iteration"], suffixes=("_sync", "_fwd")
    )
    return pd.DataFrame(
        {"worker": m["proc"], "iteration": m["iteration"].astype(int), "phase_s": m["end_fwd"] - m["end_sync"]}
    )


def _throughput(run) -> float | None:
    tp = run.summary.throughput if run.summary else None
    if tp is not None and tp.mean is not None:
        return float(tp.mean)
    glob = global_iterations(iteration_table(run.events))
    first, stop = run.measured_span
    return throughput_stats(measured_iterations(glob, first, None if stop is None else stop - first))[0].mean


def run_row(run_dir) -> dict:
    """One run's figures (see the module docstring); times in emulated seconds."""
    run = load(run_dir)
    doc = json.loads((Path(run_dir) / PROFILE_FILE).read_text())
    scale = float(doc.get("scale") or 1.0)
    w = run.spec["workload"]
    used = doc["used"]
    phase = measured_phase(run.events, int(doc["profile_iterations"]), int(doc["layers"]))
    workers = len([p for p in (run.processes or {}).get("processes", []) if p["role"] == "worker"]) or doc["workers"]
    return {
        "run": str(run_dir),
        "model": w["model"],
        "pull": doc["strategy"],
        "nodes": workers,
        "overlap": bool(w.get("options", {}).get("overlap", False)),
        "samples_per_s": _throughput(run),
        "batches": len(used["ends"]),
        "ends": used["ends"],
        "chosen": doc["chosen"],
        "T_s_ms": 1e3 * doc["profile"]["startup_s"] / scale,
        "model_exe_s": used["exe_s"] / scale,
        "model_pipeline_s": used["pipeline_s"] / scale,
        "meets_5": used["meets_constraint"],
        "measured_phase_s": float(phase["phase_s"].median()) if len(phase) else np.nan,
        "optimal_exe_s": doc["optimal"]["exe_s"] / scale,
        "flags": skeleton.fidelity_flags(run_dir),
    }


def speedup_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Add ``speedup`` (over the same model's 1-node ``default`` runs, else over all its
    1-node runs, their mean samples/s; NaN without either). Sorted by model, strategy, nodes."""
    rows = rows.copy()
    one = rows["nodes"] == 1
    has_default = set(rows.loc[one & (rows["pull"] == "default"), "model"])
    base = one & ((rows["pull"] == "default") | ~rows["model"].isin(has_default))
    rows["speedup"] = skeleton.per_point(rows, "samples_per_s", base.to_numpy(), ["model"], reduce="mean")
    return rows.sort_values(["model", "pull", "nodes"]).reset_index(drop=True)


def _ibatch_runs(paths) -> list:
    """The run directories under ``paths``.

    Raises:
        ReportError: none.
    """
    runs = find_runs(paths)
    if not runs:
        raise skeleton.ReportError(f"no ibatch run (a run directory with {PROFILE_FILE}) under {list(map(str, paths))}")
    return runs


def report(paths) -> pd.DataFrame:
    """:func:`run_row` of every ibatch run under ``paths``, with :func:`speedup_table`'s speedup.

    Raises:
        ReportError: no ibatch run under ``paths``.
        NotARunError: a path that is neither a run nor a sweep directory.
    """
    runs = _ibatch_runs(paths)
    rows, _ = skeleton.load_rows(runs, run_row)
    return speedup_table(pd.DataFrame(rows))


# ----------------------------------------------------------------------------- Fig. 7: execution-time breakdown

#: The parts of a worker's iteration of :func:`iteration_breakdown`, in time order; the ExeTime
#: parts (comm_only .. idle) sum to ``exe_s`` and all of them to ``iteration_s``.
PARTS = ("sync_s", "comm_only_s", "overlap_s", "comp_only_s", "idle_s", "after_s")
EXE_PARTS = ("comm_only_s", "overlap_s", "comp_only_s", "idle_s")

BREAKDOWN_NOTE = (
    "ExeTime (iBatch eq. (4), Fig. 7) = a worker's pull-plus-forward phase: from the end of the iteration's sync "
    "(every server has updated) to the end of its last forward. comm = the union of its pull_batch spans (pull "
    "thread: start-up and transfer), comp = the union of its forward spans (compute thread); overlap = both at "
    "once, comm only = pulling while not computing, comp only = computing while not pulling (the paper's three "
    "parts), idle = neither (thread hand-off; not in the paper, whose three parts sum to ExeTime by eq. (4)). "
    "Outside ExeTime: sync = iteration start to the end of the sync (the barrier), after forward = backward, push "
    "and the rest of the iteration. Means over workers and the iterations after profiling and warm-up, emulated "
    "time. None of Fig. 7's three parts is missing from the events; what they cannot give is the paper's "
    "normalization base (not stated; here the default pull's ExeTime at the same model, nodes and setting) and "
    "its 72 nodes (Fig. 7's cluster)."
)


def _merged(spans) -> list[tuple[float, float]]:
    """``(start, end)`` pairs as disjoint sorted intervals (overlapping or touching ones merged)."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _clipped(spans, lo: float, hi: float) -> list[tuple[float, float]]:
    """Disjoint intervals (:func:`_merged`) cut to ``[lo, hi]``, empty ones dropped."""
    return [(max(a, lo), min(b, hi)) for a, b in _merged(spans) if min(b, hi) > max(a, lo)]


def _length(spans) -> float:
    return float(sum(b - a for a, b in spans))


def _common(x, y) -> float:
    """Length of the intersection of two lists of disjoint sorted intervals."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _spans(g: pd.DataFrame, kind: str) -> list[tuple[float, float]]:
    e = g[g["kind"] == kind]
    return list(zip(e["ts"].astype(float), (e["ts"] + e["dur"]).astype(float)))


def iteration_breakdown(events: pd.DataFrame, first_iteration: int) -> pd.DataFrame:
    """Each worker iteration's time split into the parts of iBatch Fig. 7 (:data:`BREAKDOWN_NOTE`).

    A worker iteration counts when it has its ``iteration``, ``sync`` and ``forward`` events.
    With ``t0``/``t1`` the ``iteration`` span and ``s`` = the ``sync`` span's end, ``e`` = the
    last ``forward`` end (both clipped to ``[t0, t1]``): ``exe_s = e - s``; ``comm`` = union
    of the ``pull_batch`` spans and ``comp`` = union of the ``forward`` spans, both cut to
    ``[s, e]``; ``overlap_s = |comm ∩ comp|``, ``comm_only_s = |comm| - overlap_s``,
    ``comp_only_s = |comp| - overlap_s``, ``idle_s = exe_s - |comm ∪ comp|``;
    ``sync_s = s - t0``, ``after_s = t1 - e``.

    Args:
        events: a run's events (emulated time, :func:`analysis.load.load`).
        first_iteration: the first iteration counted (after the profiling and the warm-up).

    Returns:
        DataFrame ``worker, iteration, iteration_s, exe_s`` and :data:`PARTS` (seconds), one row
        per counted worker iteration, sorted by iteration and worker.
    """
    cols = ["worker", "iteration", "iteration_s", "exe_s", *PARTS]
    if events.empty:
        return pd.DataFrame(columns=cols)
    ev = events[
        (events["role"] == "worker")
        & (events["iteration"] >= first_iteration)
        & events["kind"].isin(["iteration", "sync", "forward", "pull_batch"])
    ]
    rows = []
    for (proc, it), g in ev.groupby(["proc", "iteration"], sort=True):
        itr, sync, fwd = _spans(g, "iteration"), _spans(g, "sync"), _spans(g, "forward")
        if not (itr and sync and fwd):
            continue
        t0, t1 = itr[0]
        start = min(max(max(b for _, b in sync), t0), t1)
        end = min(max(max(b for _, b in fwd), start), t1)
        comm, comp = _clipped(_spans(g, "pull_batch"), start, end), _clipped(fwd, start, end)
        both = _common(comm, comp)
        c, f = _length(comm), _length(comp)
        # max(0, .): a difference of equal sums may come out a rounding error below zero
        rows.append(
            {
                "worker": proc,
                "iteration": int(it),
                "iteration_s": t1 - t0,
                "exe_s": end - start,
                "sync_s": start - t0,
                "comm_only_s": max(0.0, c - both),
                "overlap_s": both,
                "comp_only_s": max(0.0, f - both),
                "idle_s": max(0.0, (end - start) - (c + f - both)),
                "after_s": t1 - end,
            }
        )
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["iteration", "worker"], kind="stable").reset_index(drop=True)


def _flat(d, prefix: str = "") -> dict[str, str]:
    """A nested mapping as ``{dotted.key: JSON of the value}`` (lists kept whole)."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = json.dumps(v, sort_keys=True)
    return out


#: Spec keys never part of a run's ``setting``: the pull strategy (the compared variants) and
#: the model (a column of its own).
_NOT_SETTING = {"workload.options.pull", "workload.model"}


def breakdown_row(run_dir) -> dict:
    """One run's mean :func:`iteration_breakdown` (the measured iterations,
    :attr:`analysis.load.Run.measured_span`, after the profiling iterations: from
    ``max(P + 1, warm-up)``).

    Returns:
        dict: ``run`` (directory), ``model``, ``pull``, ``nodes`` (workers), ``spec`` (the
        flattened resolved spec, :func:`_flat`), ``worker_iterations`` (how many were averaged),
        ``iteration_s``, ``exe_s`` and :data:`PARTS` (means, emulated seconds; NaN without a
        counted iteration), ``flags``.
    """
    run = load(run_dir)
    doc = json.loads((Path(run_dir) / PROFILE_FILE).read_text())
    w = run.spec.get("workload", {})
    warm, stop = run.measured_span
    b = iteration_breakdown(run.events, max(int(doc["profile_iterations"]) + 1, warm))
    if stop is not None:
        b = b[b["iteration"] < stop]
    workers = len([p for p in (run.processes or {}).get("processes", []) if p["role"] == "worker"]) or doc["workers"]
    row = {
        "run": str(run_dir),
        "model": w.get("model"),
        "pull": doc["strategy"],
        "nodes": workers,
        "spec": _flat(run.spec),
        "worker_iterations": len(b),
    }
    for c in ("iteration_s", "exe_s", *PARTS):
        row[c] = float(b[c].mean()) if len(b) else np.nan
    row["flags"] = skeleton.fidelity_flags(run_dir)
    return row


def breakdown_table(paths) -> pd.DataFrame:
    """:func:`breakdown_row` of every ibatch run under ``paths``, with ``setting`` and the
    ExeTime parts normalized to the default pull's ExeTime at the same point.

    ``setting``: the spec values (``key=value``, last key component) in which the runs given
    differ, apart from the pull strategy and the model (e.g. ``request_startup_ms=2.0`` in a
    start-up sweep); a point is (model, nodes, setting). ``norm_<part>`` and ``norm_exe``:
    ``<part>`` and ``exe_s`` over the mean ``exe_s`` of the point's ``default`` runs (NaN
    when the point has none). Sorted by model, nodes, setting (in the order the runs were
    given) and pull (default, layer_by_layer, ibatch).

    Raises:
        ReportError: no ibatch run under ``paths``.
        NotARunError: a path that is neither a run nor a sweep directory.
    """
    runs = _ibatch_runs(paths)
    rows, _ = skeleton.load_rows(runs, breakdown_row)
    df = pd.DataFrame(rows)
    keys = sorted({k for s in df["spec"] for k in s} - _NOT_SETTING)
    varying = [k for k in keys if len({s.get(k) for s in df["spec"]}) > 1]
    df["setting"] = [
        " ".join(f"{k.rsplit('.', 1)[-1]}={json.loads(s[k]) if k in s else None}" for k in varying) for s in df["spec"]
    ]
    point = ["model", "nodes", "setting"]
    base = df[df["pull"] == "default"].groupby(point)["exe_s"].mean()
    ref = [base.get(tuple(k), np.nan) for k in df[point].itertuples(index=False)]
    for c in (*EXE_PARTS, "exe_s"):
        df["norm_" + ("exe" if c == "exe_s" else c[:-2])] = df[c] / ref
    order = {s: i for i, s in enumerate(("default", "layer_by_layer", "ibatch"))}
    df = df.assign(_p=df.groupby(point, sort=False).ngroup(), _o=df["pull"].map(order))
    df = df.sort_values(["model", "nodes", "_p", "_o"], kind="stable")
    return df.drop(columns=["_p", "_o", "spec"]).reset_index(drop=True)


def breakdown_text(df: pd.DataFrame) -> str:
    """The two tables of :func:`breakdown_table` (ms per iteration; normalized ExeTime), and
    :data:`BREAKDOWN_NOTE`."""
    ms = pd.DataFrame(
        {
            "model": df["model"],
            "pull": df["pull"],
            "nodes": df["nodes"],
            "setting": df["setting"],
            "n": df["worker_iterations"],
            "iteration": 1e3 * df["iteration_s"],
            "sync": 1e3 * df["sync_s"],
            "ExeTime": 1e3 * df["exe_s"],
            "comm only": 1e3 * df["comm_only_s"],
            "overlap": 1e3 * df["overlap_s"],
            "comp only": 1e3 * df["comp_only_s"],
            "idle": 1e3 * df["idle_s"],
            "after forward": 1e3 * df["after_s"],
            "flags": df["flags"],
        }
    ).round(2)
    norm = pd.DataFrame(
        {
            "model": df["model"],
            "pull": df["pull"],
            "nodes": df["nodes"],
            "setting": df["setting"],
            "comm only": df["norm_comm_only"],
            "overlap": df["norm_overlap"],
            "comp only": df["norm_comp_only"],
            "idle": df["norm_idle"],
            "ExeTime": df["norm_exe"],
            "flags": df["flags"],
        }
    ).round(3)
    return (
        "Execution time per iteration, ms (iBatch Fig. 7; n = worker iterations averaged):\n"
        f"{skeleton.flagged_markdown(ms, floatfmt='')}\n"
        "\nExeTime normalized to the default pull's ExeTime at the same model, nodes and setting (Fig. 7):\n"
        f"{skeleton.flagged_markdown(norm, floatfmt='')}\n\n" + textwrap.fill(BREAKDOWN_NOTE, width=110)
    )


def plot_breakdown(df: pd.DataFrame, path) -> Path:
    """Fig. 7: per point (model, nodes, setting) one stacked bar per run of the ExeTime parts
    (comm only, overlap, comp only, idle), normalized to the point's default ExeTime when it
    has a default run, else in ms."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import plt, save_figure

    points = list(dict.fromkeys(df[["model", "nodes", "setting"]].itertuples(index=False, name=None)))
    fig, axes = plt.subplots(
        1, len(points), figsize=(max(3.2, 0.9 * len(df) / len(points) + 1.6) * len(points), 3.6), squeeze=False
    )
    labels = {"comm_only": "comm only", "overlap": "overlap", "comp_only": "comp only", "idle": "idle"}
    for ax, (model, nodes, setting) in zip(axes[0], points):
        g = df[(df["model"] == model) & (df["nodes"] == nodes) & (df["setting"] == setting)]
        normed = bool(g["norm_exe"].notna().all())
        bottom = np.zeros(len(g))
        for part, label in labels.items():
            v = (g["norm_" + part] if normed else 1e3 * g[part + "_s"]).to_numpy(dtype=float)
            ax.bar(range(len(g)), v, bottom=bottom, label=label)
            bottom += np.nan_to_num(v)
        ax.set_xticks(range(len(g)))
        ax.set_xticklabels(list(g["pull"]), rotation=20, fontsize=8)
        ax.set_ylabel("ExeTime / default's" if normed else "ms per iteration")
        ax.set_title(f"{model}, {nodes} nodes" + (f"\n{setting}" if setting else ""), fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def table(paths, fig7: bool = False) -> str:
    """Both tables of the module docstring for the runs under ``paths``, as text; with ``fig7``
    also :func:`breakdown_text` of :func:`breakdown_table`."""
    rows = report(paths)
    t = rows.assign(
        eq4_ms=1e3 * rows["model_exe_s"],
        timeline_ms=1e3 * rows["model_pipeline_s"],
        measured_ms=1e3 * rows["measured_phase_s"],
        optimum_eq4_ms=1e3 * rows["optimal_exe_s"],
    )
    # pandas' display precision (6 decimals) and the 2 decimals of before, printed as rounded
    first = rows[["model", "pull", "nodes", "samples_per_s", "speedup", "batches", "ends", "flags"]].round(6)
    second = t[
        [
            "model",
            "pull",
            "nodes",
            "T_s_ms",
            "meets_5",
            "eq4_ms",
            "timeline_ms",
            "measured_ms",
            "optimum_eq4_ms",
            "flags",
        ]
    ].round(2)
    return (
        "Throughput and speedup over one node (iBatch Fig. 5):\n"
        f"{skeleton.flagged_markdown(first, floatfmt='')}\n"
        "\nPull-plus-forward phase, model (eq. (4) / two-thread timeline) against measured (median), ms:\n"
        f"{skeleton.flagged_markdown(second, floatfmt='')}"
        + (f"\n\n{breakdown_text(breakdown_table(paths))}" if fig7 else "")
    )


def plots(paths, out_dir, fig7: bool = False) -> list[Path]:
    """``speedup.png`` (Fig. 5) and, per model, ``profile-<model>.png`` (Fig. 3) of its
    largest cluster's run (its ``ibatch`` run if any), into ``out_dir``; with ``fig7`` also
    ``breakdown.png`` (:func:`plot_breakdown`)."""
    rows, out = report(paths), Path(out_dir)
    written = [plot_speedup(rows, out / "speedup.png", sweeps=paths)]
    for model, g in rows.groupby("model"):
        pick = g.sort_values(["nodes", "pull"], key=lambda c: c if c.name == "nodes" else c.eq("ibatch")).iloc[-1]
        written.append(plot_layer_profile(pick["run"], out / f"profile-{model}.png"))
    if fig7:
        written.append(plot_breakdown(breakdown_table(paths), out / "breakdown.png"))
    return written


def plot_speedup(rows: pd.DataFrame, path, sweeps=()) -> Path:
    """Fig. 5: speedup against nodes, one panel per model, one line per pull strategy, and
    the ideal linear speedup; the paper's value of the catalogue's headline ratios for
    ``sweeps`` (the directories the rows come from) at their numerator's point
    (:func:`analysis.plots.mark_paper`)."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import mark_paper, plt, save_figure, x_spans

    models = sorted(rows["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        g = rows[rows["model"] == model]
        n = sorted(g["nodes"].unique())
        ax.plot(n, n, "k:", label="ideal")
        for pull, gg in g.groupby("pull"):
            gg = gg.sort_values("nodes")
            ax.plot(gg["nodes"], gg["speedup"], marker="o", label=pull)
        mark_paper(ax, sweeps, dict(zip(g["run"], g["speedup"])), x_spans(list(g["run"]), list(g["nodes"])))
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


def _options(ap) -> None:
    ap.add_argument(
        "--fig7",
        action="store_true",
        help="also the execution-time breakdown of Fig. 7 (and breakdown.png with --plots)",
    )


REPORT = skeleton.Report("ibatch", __doc__.split("\n")[0], table, plots, _options)


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); exit 1 when no ibatch run is found."""
    try:
        return REPORT.main(sys.argv[1:] if argv is None else argv, prog="python -m analysis.ibatch_report")
    except skeleton.ReportError as e:
        print(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
