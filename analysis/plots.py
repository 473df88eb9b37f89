"""Figures from run directories (matplotlib, Agg backend: no display needed).

Every function takes loaded runs (:class:`analysis.load.Run`) or run directories, writes one
PNG and returns its path. Times are seconds from the run start (:attr:`Run.t0`), rates Mbit/s.
The figures of one run over time (interface rates, iteration times) mark each scheduled
event the run applied (spec ``events``, :attr:`Run.schedule`) with a dotted vertical line and
a label (:func:`mark_events`).

Runs side by side are labelled by what differs between them (:func:`run_labels`: the variant
and the swept values, never the directory name) and coloured by variant; a sweep's metric
against a swept parameter is :func:`plot_sweep`, its error bars the ``sweep.csv`` column
:func:`error_bars` picks (named on the figure). Every figure that shows a quantity a
catalogued paper states draws the paper's value with :func:`mark_paper`, the one helper the
reports share.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import traces as tr  # noqa: E402
from analysis.flows import flow_labels, flows_and_rates  # noqa: E402
from analysis.load import Run, load, port_table, read_sweep_csv  # noqa: E402
from analysis.metrics import compute_summary, global_iterations  # noqa: E402
from analysis.paper_reference import paper_ratios  # noqa: E402
from analysis.timeline import event_name  # noqa: E402
from analysis.utilization import host_utilization, idle_fraction  # noqa: E402
from common.errors import TestbedError  # noqa: E402
from traffic.summary import Throughput  # noqa: E402


def _as_run(r) -> Run:
    return r if isinstance(r, Run) else load(r)


def _out(path, run: Run | None, default: str) -> Path:
    if path is None:
        if run is None:
            raise ValueError("a path is required")
        path = run.path / "plots" / default
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig, path) -> Path:
    """Write ``fig`` to the PNG ``path`` (parent directories created) and close it.

    Every figure of :mod:`analysis` goes through here, so they share size and resolution.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def mark_events(ax, run: Run, axis: str = "time") -> int:
    """Draw each applied scheduled event of ``run`` on ``ax`` as a dotted vertical line with
    its label (:func:`analysis.timeline.event_name`) at the top.

    Args:
        ax: a matplotlib axes.
        run: the run (its :attr:`~analysis.load.Run.schedule`).
        axis: ``time`` (x is seconds since :attr:`Run.t0`, the line at the moment it was
            applied) or ``iteration`` (x is the iteration; the line just before the first
            iteration that started after it: the global iteration count then, minus 0.5).

    Returns:
        the number of events drawn.
    """
    t0 = run.t0 or 0.0
    n = 0
    for rec in run.schedule:
        if not rec.get("applied"):
            continue
        if axis == "time":
            if rec.get("time") is None:
                continue
            x = float(rec["time"]) - t0
        else:
            if rec.get("iteration") is None:
                continue
            x = float(rec["iteration"]) - 0.5
        color = "tab:red" if rec.get("error") else "tab:purple"
        ax.axvline(x, color=color, ls=":", lw=1.0)
        ax.text(
            x,
            0.98,
            " " + event_name(rec),
            transform=ax.get_xaxis_transform(),
            rotation=90,
            va="top",
            ha="right",
            fontsize=6,
            color=color,
            clip_on=True,
        )  # clipped: off a zoomed axis, not drawn
        n += 1
    return n


#: the default window of the rolling mean drawn over a rate trace's samples, s
SMOOTH_S = 0.1


def _raw_interval_ms(run: Run, g: pd.DataFrame) -> float:
    """The interval between one interface's samples, ms (of the emulated network's time): the
    median of its ``dt_s`` (the spec's ``capture.interval_ms`` when the interface has no sample)."""
    if not g.empty:
        return float(g["dt_s"].median()) * 1e3
    return float((run.spec.get("capture") or {}).get("interval_ms") or 10) / run.scale


def _shaped_line(ax, run: Run, iface: str, bw, t0: float, t_end: float) -> float:
    """The rate ``iface`` was shaped at as a dashed line: the kernel's read-back over the run
    (a step at each rate change, :meth:`Run.shaped_rate`), else the configured rate ``bw``.
    Returns the highest rate drawn (0 for none)."""
    shaped = run.shaped_rate(iface)
    if not shaped.empty:
        times = [t - t0 for t in shaped.index] + [t_end]
        values = list(shaped.to_numpy()) + [float(shaped.iloc[-1])]
        steady = shaped.nunique() == 1
        ax.step(
            times,
            values,
            where="post",
            color="black",
            ls="--",
            lw=0.9,
            label=f"shaped {values[0]:g} Mbit/s (read back)" if steady else "shaped rate (read back)",
        )
        return float(max(values))
    if bw is not None and pd.notna(bw):
        ax.axhline(float(bw), color="black", ls="--", lw=0.9, label=f"configured {float(bw):g} Mbit/s")
        return float(bw)
    return 0.0


def plot_interface_rates(
    run,
    host: str | None = None,
    path=None,
    smooth_s: float | None = SMOOTH_S,
    span: tuple[float | None, float | None] | None = None,
) -> Path:
    """Tx/rx rate over time of one host's link and of every ToR-core uplink (P3 Figure 8 style).

    One subplot per interface: for the host link, the host's tx (to the network) and rx; for an
    uplink, ToR->core and core->ToR. Each direction is drawn twice: bwm-ng's own samples (about
    every 10 ms) faint, and their rolling mean over ``smooth_s`` (:func:`analysis.traces.smoothed_rates`)
    as a solid line: a single 10 ms sample may read well above the shaped rate by the jitter of
    its timestamps alone. The rate the link was shaped at is a dashed line: the kernel's read-back
    (:meth:`Run.shaped_rate`, a step where a scheduled ``link_rate`` event changed it), else
    the configured rate. The y axis fits the smoothed lines and the shaped rate; a raw sample
    above that leaves the axes.

    Args:
        run: a :class:`Run` or a run directory.
        host: the host whose link to show (default: the host of worker 0, else the first host).
        path: PNG to write (default ``<run>/plots/rates-<host>.png``).
        smooth_s: the rolling mean's window, s (None or 0: the samples alone, drawn solid).
        span: ``(start, end)`` in seconds since the run start to show (either may be None: the
            trace's own end); None: the whole trace.

    Returns:
        The PNG path. A run without traces gives a figure that says so; rates are Mbit/s of the
        emulated network, time seconds since :attr:`Run.t0`.
    """
    run = _as_run(run)
    ports = run.ports()
    hosts = [h for h in ports["host"].dropna().unique()]
    if host is None:
        wh = [h for h in run.worker_hosts() if h in hosts]
        host = wh[0] if wh else (hosts[0] if hosts else None)
    path = _out(path, run, f"rates-{host or 'all'}.png")
    rates = run.rates
    smooth = tr.smoothed_rates(rates, smooth_s) if smooth_s else None
    panels = []  # (iface, title, [(column, label)], bw_mbps)
    if not ports.empty:
        for _, p in ports[(ports["host"] == host) & (ports["link_class"] == "host")].iterrows():
            panels.append(
                (
                    p["iface"],
                    f"{host} link (switch port {p['iface']})",
                    [("rx_bps", f"{host} tx"), ("tx_bps", f"{host} rx")],
                    p["bw_mbps"],
                )
            )
        for _, p in ports[ports["tor_side"]].iterrows():
            panels.append(
                (
                    p["iface"],
                    f"uplink {p['switch']} - {p['peer']} ({p['iface']})",
                    [("tx_bps", f"{p['switch']} -> {p['peer']}"), ("rx_bps", f"{p['peer']} -> {p['switch']}")],
                    p["bw_mbps"],
                )
            )
    elif not rates.empty:  # no topology: every sampled interface, from its own point of view
        for iface in sorted(rates["iface"].unique()):
            panels.append((iface, iface, [("tx_bps", "tx"), ("rx_bps", "rx")], None))
    t0 = run.t0 or 0.0
    if not panels or rates.empty:
        fig, ax = plt.subplots(figsize=(8, 2.5))
        ax.text(0.5, 0.5, f"no interface traces in {run.name}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return save_figure(fig, path)
    t_all = rates["time"] - t0
    lo = min(0.0, float(t_all.min())) if span is None or span[0] is None else float(span[0])
    hi = float(t_all.max()) if span is None or span[1] is None else float(span[1])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.4 * len(panels) + 0.8), sharex=True, squeeze=False)
    axes[-1, 0].set_xlim(lo, hi)  # before the events are marked: those outside are clipped
    for ax, (iface, title, series, bw) in zip(axes[:, 0], panels):
        g = rates[rates["iface"] == iface]
        interval_ms = _raw_interval_ms(run, g)
        shown = g[(g["time"] - t0 >= lo) & (g["time"] - t0 <= hi)]
        top = _shaped_line(ax, run, iface, bw, t0, float(t_all.max()))
        for k, (col, label) in enumerate(series):
            color = colors[k % len(colors)]
            if smooth is None:
                ax.plot(g["time"] - t0, g[col] / 1e6, lw=0.8, color=color, label=label)
                top = max([top] + ([float(shown[col].max()) / 1e6] if not shown.empty else []))
                continue
            sm = smooth[smooth["iface"] == iface]
            ax.plot(g["time"] - t0, g[col] / 1e6, lw=0.5, color=color, alpha=0.25)
            ax.plot(sm["time"] - t0, sm[col] / 1e6, lw=1.3, color=color, label=f"{label} ({smooth_s * 1e3:g} ms mean)")
            sm_shown = sm[(sm["time"] - t0 >= lo) & (sm["time"] - t0 <= hi)]
            top = max([top] + ([float(sm_shown[col].max()) / 1e6] if not sm_shown.empty else []))
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("rate (Mbit/s)")
        ax.set_ylim(0, 1.3 * top if top > 0 else 1.0)  # headroom for the legend
        mark_events(ax, run)
        handles, labels = ax.get_legend_handles_labels()
        if smooth is not None:  # the faint samples, once
            handles.append(plt.Line2D([], [], color="gray", alpha=0.4, lw=2))
            labels.append(f"{interval_ms:.2g} ms samples")
        ax.legend(handles, labels, loc="upper right", fontsize=7, ncol=4)
        ax.grid(alpha=0.3)
    emulated = ", emulated" if run.scale != 1 else ""
    axes[-1, 0].set_xlabel(f"time since run start (s{emulated})")
    fig.suptitle(f"{run.name}: interface rates ({run.scheme or '?'})", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- runs side by side

#: ``sweep.csv`` columns that are neither a swept parameter nor a metric
SWEEP_BOOKKEEPING = ("variant", "scheme", "status", "run_dir", "cpu_starved", "host_cost_overrun")
#: axis labels of the metrics of ``sweep.csv`` (others are labelled by their column name)
METRIC_LABELS = {
    "samples_per_s": "throughput (samples/s)",
    "iter_mean_s": "mean iteration time (s)",
    "iter_p95_s": "95th percentile iteration time (s)",
    "core_bytes": "bytes through the core",
    "accuracy": "final test accuracy",
}


class PlotError(TestbedError):
    """A plot asked of something its input lacks (a column of ``sweep.csv``, a sweep directory);
    the message names what is allowed."""


def _sweep_frame(sweep_dir: Path) -> pd.DataFrame:
    csv = Path(sweep_dir) / "sweep.csv"
    if not csv.is_file():
        raise PlotError(
            f"{sweep_dir} has no sweep.csv: give a sweep directory (testbed run writes sweep.csv "
            f"there after each point)"
        )
    return read_sweep_csv(csv)


def sweep_parameters(df: pd.DataFrame) -> list[str]:
    """The swept parameters of a ``sweep.csv`` frame: its dotted spec paths (``topology.host_bw_mbps``, ...)."""
    return [c for c in df.columns if "." in c]


def sweep_metrics(df: pd.DataFrame) -> list[str]:
    """The metrics of a ``sweep.csv`` frame: its numeric columns that are not a swept
    parameter, bookkeeping (:data:`SWEEP_BOOKKEEPING`) or another metric's error column
    (``<metric>_<suffix>``)."""
    cands = [
        c
        for c in df.columns
        if c not in SWEEP_BOOKKEEPING
        and "." not in c
        and pd.api.types.is_numeric_dtype(df[c])
        and not pd.api.types.is_bool_dtype(df[c])
    ]
    return [c for c in cands if not any(c != m and c.startswith(m + "_") for m in cands)]


def resolve_column(name: str, allowed: list[str], what: str, where) -> str:
    """``name`` as one of ``allowed``: itself, or the one allowed dotted path it ends (``host_bw_mbps``
    for ``topology.host_bw_mbps``).

    Raises:
        PlotError: no allowed column, or several, is ``name``; the message lists them.
    """
    if name in allowed:
        return name
    hits = [c for c in allowed if c.endswith("." + name)]
    if len(hits) == 1:
        return hits[0]
    listed = ", ".join(allowed) if allowed else "none"
    why = f"matches several ({', '.join(hits)})" if hits else f"is not {what} of {where}"
    raise PlotError(f"{name!r} {why}; allowed: {listed}")


def error_bars(df: pd.DataFrame, metric: str) -> tuple[np.ndarray, str] | None:
    """Error bars of ``metric`` for the rows of a ``sweep.csv`` frame (:func:`analysis.load.read_sweep_csv`),
    and what they are, in words naming their columns.

    Preferred: the 95 % confidence interval of the mean, ``<metric>_mean_ci95_low`` and
    ``_high`` (bounds, so the bars may be uneven); else the spread of the measured iterations,
    ``<metric>_spread95`` (1.96 sd, even bars; a file written before version 0.2.0 names it
    ``<metric>_ci95``, which the reader renames). A row without a value gets no bar.

    Returns:
        ``(yerr, words)``: ``yerr`` of shape ``(2, rows)``, how far below and above the value each
        bar reaches; None when the frame has neither, or no value in them.
    """
    mean = pd.to_numeric(df[metric], errors="coerce")
    low, high = f"{metric}_mean_ci95_low", f"{metric}_mean_ci95_high"
    if low in df.columns and high in df.columns and (df[low].notna() & df[high].notna()).any():
        below = (mean - pd.to_numeric(df[low], errors="coerce")).clip(lower=0.0).fillna(0.0)
        above = (pd.to_numeric(df[high], errors="coerce") - mean).clip(lower=0.0).fillna(0.0)
        return np.vstack(
            [below.to_numpy(float), above.to_numpy(float)]
        ), f"95 % confidence interval of the mean ({low}, {high})"
    spread = f"{metric}_spread95"
    if spread in df.columns and df[spread].notna().any():
        half = pd.to_numeric(df[spread], errors="coerce").fillna(0.0).to_numpy(float)
        return np.vstack([half, half]), f"+-1.96 sd of the measured iterations ({spread})"
    return None


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v if v is None or isinstance(v, (str, int, float, bool)) else str(v)
    return out


def _value_text(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    text = str(v)
    if text.endswith((".json", ".yaml")):
        return Path(text).stem  # a profile or spec file: its name
    return text if len(text) <= 24 else text[:23] + "~"


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted path by its last component, or as many as make it unique among ``keys``."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            short = ".".join(parts[-n:])
            if sum(1 for o in keys if o == short or o.endswith("." + short)) == 1:
                break
        out[k] = short
    return out


def _sweep_rows(runs: list[Run]) -> list[dict | None]:
    """Each run's row of its sweep's ``sweep.csv`` (matched by directory name), or None for a run
    outside a sweep (or not in its table yet)."""
    tables: dict[Path, dict] = {}
    out = []
    for r in runs:
        parent = r.path.parent
        if parent not in tables:
            df = read_sweep_csv(parent / "sweep.csv") if (parent / "sweep.csv").is_file() else pd.DataFrame()
            tables[parent] = (
                {Path(str(p)).name: row for p, row in zip(df["run_dir"], df.to_dict("records"))}
                if "run_dir" in df.columns
                else {}
            )
        out.append(tables[parent].get(r.name))
    return out


def run_labels(runs) -> tuple[list[str], list[str], str]:
    """Short labels of runs shown side by side, and the group (colour) of each.

    A run's parameters are its resolved spec's fields (dotted paths) and, in a sweep, its
    variant (its ``sweep.csv`` row's ``variant``); with runs of several directories also the
    directory they are in (``sweep``). A label names only what differs between the runs: with
    variants, the variant's name and the parameters that differ within a variant (the swept
    ones); without, every parameter that differs, ``name=value`` (a dotted path by its last
    component, a file by its name). Runs that differ in nothing are labelled by their
    directory name.

    Args:
        runs: :class:`Run` objects or run directories.

    Returns:
        ``(labels, groups, kind)``: a label and a group (colour) per run, and what the groups
        are: ``variant`` when the runs are of several variants, else ``scheme`` (each run's).
    """
    runs = [_as_run(r) for r in runs]
    rows = []
    for r, row in zip(runs, _sweep_rows(runs)):
        variant = (row or {}).get("variant")
        params = {k: v for k, v in _flatten(r.spec).items() if k not in ("name", "variants", "sweep")}
        rows.append({"variant": None if variant is None or pd.isna(variant) else str(variant), **params})
    if len({r.path.parent for r in runs}) > 1:
        for row, r in zip(rows, runs):
            row["sweep"] = r.path.parent.name
    df = pd.DataFrame(rows).astype(object).map(lambda v: None if v is None or pd.isna(v) else _value_text(v))
    has_variants = df["variant"].notna().any() and df["variant"].nunique(dropna=False) > 1
    keys = [c for c in df.columns if c != "variant" and df[c].nunique(dropna=False) > 1]
    if has_variants:
        keys = [c for c in keys if (df.groupby("variant", dropna=False)[c].nunique(dropna=False) > 1).any()]
    short = _short_keys(keys)
    groups = [
        str(df.at[i, "variant"]) if has_variants and pd.notna(df.at[i, "variant"]) else (r.scheme or "?")
        for i, r in enumerate(runs)
    ]
    labels = []
    for i, r in enumerate(runs):
        parts = ([groups[i]] if has_variants else []) + [
            f"{short[k]}={df.at[i, k]}" for k in keys if pd.notna(df.at[i, k])
        ]
        labels.append(", ".join(parts) or r.name)
    return labels, groups, "variant" if has_variants else "scheme"


def _group_colors(groups: list[str]) -> dict[str, str]:
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {g: palette[i % len(palette)] for i, g in enumerate(dict.fromkeys(groups))}


def plot_throughput(runs, path, labels: list[str] | None = None) -> Path:
    """Samples/s of several runs side by side: one bar each with error bars, coloured by
    variant (else scheme), with a legend.

    Args:
        runs: :class:`Run` objects or run directories.
        path: PNG to write.
        labels: one label per run (default :func:`run_labels`: only what differs between the runs).

    Returns:
        The PNG path. Values come from the run's row of its sweep's ``sweep.csv`` when it has
        one, else its summary's throughput (:func:`_throughput`); the error bars are
        :func:`error_bars`' (the 95 % confidence interval of the mean where known), named in
        the title.
    """
    runs = [_as_run(r) for r in runs]
    rows = []
    for r, row in zip(runs, _sweep_rows(runs)):
        if row is None:  # a run outside a sweep: its summary's figures, as the runner writes sweep.csv
            tp = _throughput(r)
            row = {
                "samples_per_s": tp.mean,
                "samples_per_s_spread95": tp.spread,
                "samples_per_s_mean_ci95_low": tp.mean_ci95_low,
                "samples_per_s_mean_ci95_high": tp.mean_ci95_high,
                "status": r.summary.status if r.summary else "ok",
            }
        rows.append(row)
    df = pd.DataFrame(rows)
    err = error_bars(df, "samples_per_s")
    means = pd.to_numeric(df["samples_per_s"], errors="coerce").fillna(0.0).to_numpy()
    errs = err[0] if err else None
    auto, groups, kind = run_labels(runs)
    names = [n.replace(", ", "\n") for n in (labels or auto)]  # one parameter a line
    colors = _group_colors(groups)
    path = _out(path, None, "")
    longest = max(len(line) for n in names for line in n.splitlines())
    slot = max(0.8, 0.055 * longest + 0.25)  # inches a bar's label needs at 7 pt
    rotate = len(runs) * slot + 3.0 > 16  # too wide even at the widest figure: labels slanted
    fig, ax = plt.subplots(figsize=(min(max(5.0, len(runs) * slot + 3.0), 16), 4.4))
    x = np.arange(len(runs))
    ax.bar(x, means, yerr=errs, capsize=4, color=[colors[g] for g in groups], alpha=0.85, error_kw={"elinewidth": 1.0})
    status = df["status"] if "status" in df.columns else pd.Series("ok", index=df.index)
    tops = means + (errs[1] if errs is not None else 0.0)
    for xi, m, top, st in zip(x, means, tops, status.fillna("ok")):
        ax.text(xi, top, f"{m:.0f}" if st == "ok" else str(st), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(
        x,
        names,
        fontsize=7,
        rotation=35 if rotate else 0,
        ha="right" if rotate else "center",
        rotation_mode="anchor" if rotate else "default",
    )
    ax.set_ylabel("throughput (samples/s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.85) for c in colors.values()]
    ax.legend(
        handles, list(colors), fontsize=7, title=kind, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0)
    )
    ax.set_title(
        "training throughput: mean over the measured iterations" + (f"\nerror bars: {err[1]}" if err else ""),
        fontsize=8,
    )
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def _throughput(run: Run) -> Throughput:
    """The run's ``throughput`` from its summary, or computed from its files when the summary
    has no mean or no confidence interval of it and the files give them."""
    tp = run.summary.throughput if run.summary else None
    if tp is None or tp.mean is None or tp.mean_ci95_low is None:
        computed = compute_summary(run).throughput
        if computed is not None and computed.mean is not None:
            return computed
    return tp or Throughput()


def plot_iteration_times(run, path=None) -> Path:
    """Iteration time per iteration (the job's, :func:`analysis.metrics.global_iterations`:
    completion to completion; each worker's own iteration event), the warm-up (and
    the iterations after the measured ones, :attr:`analysis.load.Run.measured_span`) shaded,
    scheduled events marked where they fell (:func:`mark_events`).

    Returns:
        The PNG path (default ``<run>/plots/iteration-times.png``).
    """

    run = _as_run(run)
    path = _out(path, run, "iteration-times.png")
    it = run.iterations
    fig, ax = plt.subplots(figsize=(9, 3.4))
    if it.empty:
        ax.text(0.5, 0.5, f"no iterations in {run.name}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return save_figure(fig, path)
    for w, g in it.groupby("worker"):
        ax.plot(g["iteration"], g["duration_s"], lw=0.6, alpha=0.5, label=str(w))
    glob = global_iterations(it)
    ax.plot(glob["iteration"], glob["time_s"], color="black", lw=1.4, label="the job (completion to completion)")
    warm, stop = run.measured_span
    order = sorted(glob["iteration"])
    for left, label in (
        (order[:warm], "warm-up"),
        (order[stop:] if stop is not None else [], "after the measured iterations"),
    ):
        if left:
            ax.axvspan(min(left) - 0.5, max(left) + 0.5, color="gray", alpha=0.15, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    mark_events(ax, run, axis="iteration")
    ax.set_title(f"{run.name}: iteration times ({run.scheme or '?'})", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_utilization(
    runs,
    path,
    labels: list[str] | None = None,
    host: str | None = None,
    window_s: float = 0.01,
    span_s: float | None = 2.0,
) -> Path:
    """Send and receive rate of one host's link over time, one panel per run (P3 Figs. 8, 9).

    Args:
        runs: :class:`Run` objects or run directories (e.g. baseline and P3 at one bandwidth).
        path: PNG to write.
        labels: one panel title per run (default: the run id).
        host: the host (default: each run's worker 0 host).
        window_s: averaging window, s of emulated time (P3 sampled every 10 ms).
        span_s: show only the first ``span_s`` seconds of the measured iterations (None: all).

    Returns:
        The PNG path. Each panel's title gives the idle fraction (windows below 10 % of
        capacity, see :func:`analysis.utilization.idle_fraction`).
    """

    runs = [_as_run(r) for r in runs]
    path = _out(path, None, "")
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.4 * len(runs) + 0.5), squeeze=False)
    for i, (ax, r) in enumerate(zip(axes[:, 0], runs)):
        u = host_utilization(r, host, window_s)
        name = labels[i] if labels else r.name
        if u.empty:
            ax.text(
                0.5, 0.5, f"no trace of the host's link in {r.name}", ha="center", va="center", transform=ax.transAxes
            )
            continue
        t = u["t_s"] - u["t_s"].iloc[0]
        keep = t <= span_s if span_s else slice(None)
        cap = float(u["capacity_mbps"].iloc[0]) / 1e3
        ax.plot(t[keep], u["tx_mbps"][keep] / 1e3, lw=0.8, label="sent")
        ax.plot(t[keep], u["rx_mbps"][keep] / 1e3, lw=0.8, label="received")
        ax.axhline(cap, color="gray", ls="--", lw=0.8, label=f"capacity {cap:g} Gbit/s")
        ax.set_ylim(0, 1.3 * cap)
        ax.set_ylabel("Gbit/s")
        ax.set_title(
            f"{name}: idle (<10% of capacity) sent {idle_fraction(u, 0.1, 'tx'):.0%}, "
            f"received {idle_fraction(u, 0.1, 'rx'):.0%} of {window_s * 1e3:g} ms windows; "
            f"mean {u['tx_frac'].mean():.0%} / {u['rx_frac'].mean():.0%} of capacity",
            fontsize=9,
        )
        ax.legend(loc="upper right", fontsize=7, ncol=3)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since the first measured iteration (s, emulated)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_sweep(
    sweep_dir,
    x: str,
    path=None,
    y: str = "samples_per_s",
    speedup_over: str | None = None,
    xscale: str = "linear",
    xlabel: str | None = None,
    paper: bool = True,
) -> Path:
    """A metric against a swept parameter, one line per variant, with error bars (P3 Fig. 7 /
    Fig. 12 style).

    Args:
        sweep_dir: a sweep directory (with ``sweep.csv``).
        x: the swept parameter on the x axis: a dotted column of ``sweep.csv``
            (:func:`sweep_parameters`, e.g. ``topology.host_bw_mbps``) or the one it ends with
            (``host_bw_mbps``).
        path: PNG to write (default ``<sweep_dir>/plots/sweep-<x>.png``, ``sweep-<x>-<y>.png``
            for a metric other than samples/s).
        y: the metric (:func:`sweep_metrics`: ``samples_per_s``, ``iter_mean_s``, ...).
        speedup_over: a variant name; each point of the other variants is annotated with its
            ratio of ``y`` to that variant's at the same x.
        xscale: ``linear`` or ``log``.
        xlabel: axis label (default: ``x``).
        paper: for samples/s, draw the paper's value of each headline ratio of the catalogue
            that applies to the sweep (:func:`mark_paper`).

    Returns:
        The PNG path. Failed points are left out; CPU-starved points are drawn hollow; the
        error bars are :func:`error_bars`' (the 95 % confidence interval of the mean where the
        file has it), named in the title; variants at the same x are set a little apart.

    Raises:
        PlotError: no ``sweep.csv``, or ``x`` or ``y`` is not one of its parameters or metrics
            (the message lists them).
    """
    sweep_dir = Path(sweep_dir)
    csv = sweep_dir / "sweep.csv"
    df = _sweep_frame(sweep_dir)
    x = resolve_column(x, sweep_parameters(df), "a swept parameter", csv)
    y = resolve_column(y, sweep_metrics(df), "a metric", csv)
    df = df[df["status"] == "ok"]
    if "variant" not in df.columns:
        df = df.assign(variant=df.get("scheme", "run"))
    starved_col = df["cpu_starved"].astype(str) == "True" if "cpu_starved" in df.columns else df["status"] != "ok"
    df = df.assign(_starved=starved_col)
    name = x.split(".")[-1] + ("" if y == "samples_per_s" else f"-{y}")
    path = _out(path or sweep_dir / "plots" / f"sweep-{name}.png", None, "")
    err = error_bars(df, y)
    df = df.assign(_below=err[0][0] if err else 0.0, _above=err[0][1] if err else 0.0)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    base = df[df["variant"] == speedup_over].set_index(x)[y] if speedup_over else None
    shift = _dodge(df[x], df["variant"].nunique(), xscale)
    for i, (variant, g) in enumerate(df.groupby("variant", sort=False)):
        g = g.sort_values(x)
        xs = shift(g[x], i)
        line = ax.errorbar(
            xs,
            g[y],
            yerr=g[["_below", "_above"]].to_numpy().T if err else None,
            marker="o",
            capsize=3,
            label=str(variant),
        )
        starved = g["_starved"].to_numpy()
        ax.scatter(
            np.asarray(xs)[starved], g[y][starved], s=90, facecolors="white", edgecolors=line[0].get_color(), zorder=3
        )
        if base is not None and variant != speedup_over:
            for xv, xd, yv in zip(g[x], xs, g[y]):
                if xv in base.index and base[xv]:
                    ax.annotate(
                        f"{yv / base[xv]:.2f}x",
                        (xd, yv),
                        textcoords="offset points",
                        xytext=(5, 0),
                        ha="left",
                        va="center",
                        fontsize=7,
                        zorder=5,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
                    )
    if paper and y == "samples_per_s":
        runs = [sweep_dir / Path(str(p)).name for p in df["run_dir"]]
        mark_paper(ax, [sweep_dir], dict(zip(runs, df[y])), x_spans(runs, list(df[x]), xscale))
    ax.set_xscale(xscale)
    values = pd.to_numeric(df[x], errors="coerce")
    if values.notna().all() and 0 < values.nunique() <= 8:  # few swept values: a tick at each
        ax.set_xticks(sorted(values.unique()), [_value_text(float(v)) for v in sorted(values.unique())])
        ax.minorticks_off()
        if values.nunique() == 1 and xscale == "linear":  # one value: the variants close around it
            v = float(values.iloc[0])
            half = 0.1 * (abs(v) or 1.0)
            ax.set_xlim(v - half, v + half)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(METRIC_LABELS.get(y, y))
    ax.set_ylim(bottom=0)
    notes = ([f"error bars: {err[1]}"] if err else []) + (["hollow: a CPU-starved run"] if df["_starved"].any() else [])
    ax.set_title("\n".join([sweep_dir.name] + notes), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return save_figure(fig, path)


def _dodge(xs: pd.Series, n: int, xscale: str):
    """``shift(values, i)``: the x values of the i-th of ``n`` variants moved a little sideways,
    so that variants at the same x stay apart (a quarter of the narrowest gap between swept
    values, shared among the variants; values that are not numbers stay as they are)."""
    values = pd.to_numeric(xs, errors="coerce")
    distinct = sorted(set(values.dropna()))
    if n < 2 or values.isna().any() or not distinct:
        return lambda v, i: v

    def k(i):
        return i - (n - 1) / 2

    if xscale == "log" and distinct[0] > 0:
        ratio = min([b / a for a, b in zip(distinct, distinct[1:])] or [2.0])
        return lambda v, i: pd.to_numeric(v) * ratio ** (0.25 * k(i) / n)
    gap = min([b - a for a, b in zip(distinct, distinct[1:])] or [0.2 * (abs(distinct[0]) or 1.0)])
    return lambda v, i: pd.to_numeric(v) + 0.25 * gap * k(i) / n


def x_spans(runs, xs, xscale: str = "linear") -> dict | None:
    """Each run's x as a short span of the axis for :func:`mark_paper`, or None (draw across
    the axes) when the x values are not numbers or only one."""
    values = pd.to_numeric(pd.Series(xs), errors="coerce")
    distinct = sorted(set(values.dropna()))
    if values.isna().any() or len(distinct) < 2:
        return None
    if xscale == "log" and distinct[0] > 0:
        f = min(b / a for a, b in zip(distinct, distinct[1:])) ** 0.3
        return {r: (v / f, v * f) for r, v in zip(runs, values)}
    d = 0.3 * min(b - a for a, b in zip(distinct, distinct[1:]))
    return {r: (v - d, v + d) for r, v in zip(runs, values)}


#: how the paper's values are drawn, one style per ratio on an axes (line style, band colour)
PAPER_STYLES = (("--", "0.55"), (":", "tab:olive"), ("-.", "tab:cyan"))


def mark_paper(ax, sweeps, y, x=None, inverse: bool = False) -> int:
    """Draw the paper's value of every catalogue headline ratio that applies to ``sweeps``
    (:func:`analysis.paper_reference.paper_ratios`) on ``ax``, labelled ``paper: ...``: a black
    horizontal line for one number, a shaded band for a range the paper gives, at the value the
    ratio's numerator run would have in the figure's units if its ratio to the denominator were
    the paper's (:meth:`~analysis.paper_reference.PaperRatio.reference`). The one way every
    report draws the paper's values.

    Args:
        ax: a matplotlib axes.
        sweeps: the run or sweep directories the figure is drawn from (those without a
            catalogue entry, and ratios whose runs are not in the figure, draw nothing).
        y: run directory -> that run's value on the axes (samples/s, a speedup, a time ...).
        x: run directory -> ``(x0, x1)``, the span of the axis over which to draw the
            numerator's reference (its bar, or around its point); None: across the axes.
        inverse: the axes' quantity falls as throughput rises (a time per iteration).

    Returns:
        the number of references drawn. The y axis is raised to leave room above the highest.
    """
    ys = {Path(k).resolve(): v for k, v in y.items()}
    xs = {Path(k).resolve(): v for k, v in x.items()} if x is not None else None
    n, styles = 0, {}  # one style per paper value (the same ratio at several points: one legend entry)
    for ratio in paper_ratios(sweeps):
        run = ratio.numerator_run.resolve()
        v = pd.to_numeric(pd.Series([ys.get(run)]), errors="coerce").iloc[0]
        if pd.isna(v) or (xs is not None and run not in xs):
            continue
        lo, hi = ratio.reference(float(v), inverse)
        label = ratio.label if ratio.label not in styles else "_" + ratio.label
        ls, color = styles.setdefault(ratio.label, PAPER_STYLES[len(styles) % len(PAPER_STYLES)])
        span = xs[run] if xs is not None else None
        # lines and rectangles (not collections): a legend placed at "best" keeps clear of them
        if lo == hi and span is None:
            ax.axhline(lo, color="black", ls=ls, lw=1.2, label=label)
        elif lo == hi:
            ax.plot(list(span), [lo, lo], color="black", ls=ls, lw=1.6, label=label, zorder=4)
        elif span is None:
            ax.axhspan(lo, hi, facecolor=color, alpha=0.25, edgecolor="black", ls=ls, lw=0.8, label=label)
        else:
            ax.add_patch(
                plt.Rectangle(
                    (span[0], lo),
                    span[1] - span[0],
                    hi - lo,
                    facecolor=color,
                    alpha=0.35,
                    edgecolor="black",
                    ls=ls,
                    lw=0.8,
                    label=label,
                    zorder=4,
                )
            )
        bottom, top = ax.get_ylim()
        if hi > bottom + 0.85 * (top - bottom):  # room above it for a legend
            ax.set_ylim(bottom, bottom + (hi - bottom) / 0.75)
        n += 1
    return n


def plot_flow_rates(run, port: str, path=None, top: int = 8, bin_s: float | None = None) -> Path:
    """Per-flow rates on one captured switch port, stacked (which flows share a link, and when).

    One panel per direction of the port when the topology tells the directions apart (``out``:
    leaving the switch through the port, toward its peer; ``in``: entering it), else one panel
    of both. Each panel stacks the ``top`` labels with the most bytes in it, the rest as
    ``other``; a label is ``src_proc->dst_proc`` (:func:`analysis.flows.flow_labels`), and
    several connections between the same two processes are one band. The port's configured
    rate is a dashed line (named in the panel's title instead when it is over twice the peak).

    Args:
        run: a :class:`Run` or a run directory with a packet capture (``capture.pcap``).
        port: a captured port (``traces/pcap/ports.json``).
        path: PNG to write (default ``<run>/plots/flows-<port>.png``).
        top: bands per panel before ``other``.
        bin_s: rate bins in emulated seconds (default: see :func:`analysis.flows.flow_rates`).

    Returns:
        The PNG path. Rates in Mbit/s of the emulated network, time in seconds since the run's
        start (:attr:`Run.t0`).

    Raises:
        analysis.flows.CaptureError: no capture, or ``port`` was not captured.
    """
    run = _as_run(run)
    path = _out(path, run, f"flows-{port}.png")
    fl, rates = flows_and_rates(run, port, bin_s=bin_s)
    label = dict(zip(fl["flow_id"], flow_labels(fl))) if not fl.empty else {}
    ports = port_table(run.topology)
    row = ports[ports["iface"] == port]
    bw = float(row["bw_mbps"].iloc[0]) if not row.empty and pd.notna(row["bw_mbps"].iloc[0]) else None
    peer = str(row["peer"].iloc[0]) if not row.empty else "peer"
    switch = str(row["switch"].iloc[0]) if not row.empty else "switch"
    directed = not fl.empty and fl["fwd_on_port"].notna().any()
    panels = (
        [("out", f"{switch} -> {peer} (out of {port})"), ("in", f"{peer} -> {switch} (into {port})")]
        if directed
        else [("both", f"{port}, both directions")]
    )
    if rates["both"].empty:
        fig, ax = plt.subplots(figsize=(8, 2.5))
        ax.text(
            0.5,
            0.5,
            f"no TCP packets captured on {port} in {run.name}",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
        return save_figure(fig, path)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.8 * len(panels) + 0.6), sharex=True, squeeze=False)
    for ax, (direction, title) in zip(axes[:, 0], panels):
        r = rates[direction]
        if r.empty or r.shape[1] == 0:
            ax.text(0.5, 0.5, "no packets this way", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(title, fontsize=9)
            continue
        by_label = r.T.groupby([label.get(c, str(c)) for c in r.columns]).sum().T  # bytes/s per label
        order = by_label.sum().sort_values(ascending=False).index
        keep = list(order[:top])
        series = [by_label[c] for c in keep]
        names = keep
        if len(order) > top:
            series.append(by_label[list(order[top:])].sum(axis=1))
            names = keep + [f"other ({len(order) - top})"]
        x = np.r_[r.index.to_numpy(float), float(r.index[-1]) + r.attrs["bin_s"]]  # bin edges
        ys = np.vstack([np.r_[s.to_numpy(float), float(s.iloc[-1])] * 8 / 1e6 for s in series])
        ax.stackplot(x, ys, labels=names, step="post", alpha=0.85)  # each bin's mean rate, flat over it
        peak = float(ys.sum(axis=0).max())
        if bw is not None and bw <= 2 * peak:  # else the line would flatten the bands: named in the title
            ax.axhline(bw, color="gray", ls="--", lw=0.8, label=f"configured {bw:g} Mbit/s")
        elif bw is not None:
            title += f"; configured {bw:g} Mbit/s, off the scale"
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("Mbit/s")
        ax.set_ylim(0, 1.3 * max(peak, bw if bw is not None and bw <= 2 * peak else 0.0) or 1.0)
        ax.legend(loc="upper right", fontsize=7, ncol=3)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(f"time since run start (s), bins of {rates['both'].attrs['bin_s']:g} s")
    fig.suptitle(f"{run.name}: TCP flows on {port} ({run.scheme or '?'})", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
