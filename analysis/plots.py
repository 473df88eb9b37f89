"""Figures from run directories (matplotlib, Agg backend: no display needed).

Every function takes loaded runs (:class:`analysis.load.Run`) or run directories, writes one
PNG and returns its path. Times are seconds from the run start (:attr:`Run.t0`), rates Mbit/s.
The figures of one run over time (interface rates, iteration times) mark each scheduled
event the run applied (spec ``events``, :attr:`Run.schedule`) with a dotted vertical line and
a label (:func:`mark_events`).
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
from analysis.timeline import event_name  # noqa: E402
from analysis.utilization import host_utilization, idle_fraction  # noqa: E402
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
        ax.text(x, 0.98, " " + event_name(rec), transform=ax.get_xaxis_transform(), rotation=90, va="top",
                ha="right", fontsize=6, color=color)
        n += 1
    return n


def plot_interface_rates(run, host: str | None = None, path=None, window_s: float | None = None) -> Path:
    """Tx/rx rate over time of one host's link and of every ToR-core uplink (P3 Figure 8 style).

    One subplot per interface: for the host link, the host's tx (to the network) and rx; for an
    uplink, ToR->core and core->ToR; the configured rate as a dashed line.

    Args:
        run: a :class:`Run` or a run directory.
        host: the host whose link to show (default: the host of worker 0, else the first host).
        path: PNG to write (default ``<run>/plots/rates-<host>.png``).
        window_s: average over windows of this many seconds (default: bwm-ng's own samples).

    Returns:
        The PNG path. A run without traces gives a figure that says so.
    """
    run = _as_run(run)
    ports = run.ports()
    hosts = [h for h in ports["host"].dropna().unique()]
    if host is None:
        wh = [h for h in run.worker_hosts() if h in hosts]
        host = wh[0] if wh else (hosts[0] if hosts else None)
    path = _out(path, run, f"rates-{host or 'all'}.png")
    rates = run.rates
    if window_s:
        rates = tr.windowed_rates(rates, window_s)
    panels = []  # (iface, title, [(column, label)], bw_mbps)
    if not ports.empty:
        for _, p in ports[(ports["host"] == host) & (ports["link_class"] == "host")].iterrows():
            panels.append((p["iface"], f"{host} link (switch port {p['iface']})",
                           [("rx_bps", f"{host} tx"), ("tx_bps", f"{host} rx")], p["bw_mbps"]))
        for _, p in ports[ports["tor_side"]].iterrows():
            panels.append((p["iface"], f"uplink {p['switch']} - {p['peer']} ({p['iface']})",
                           [("tx_bps", f"{p['switch']} -> {p['peer']}"), ("rx_bps", f"{p['peer']} -> {p['switch']}")],
                           p["bw_mbps"]))
    elif not rates.empty:  # no topology: every sampled interface, from its own point of view
        for iface in sorted(rates["iface"].unique()):
            panels.append((iface, iface, [("tx_bps", "tx"), ("rx_bps", "rx")], None))
    t0 = run.t0 or 0.0
    if not panels or rates.empty:
        fig, ax = plt.subplots(figsize=(8, 2.5))
        ax.text(0.5, 0.5, f"no interface traces in {run.name}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return save_figure(fig, path)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.3 * len(panels) + 0.6), sharex=True, squeeze=False)
    for ax, (iface, title, series, bw) in zip(axes[:, 0], panels):
        g = rates[rates["iface"] == iface]
        for col, label in series:
            ax.plot(g["time"] - t0, g[col] / 1e6, lw=0.8, label=label)
        if bw is not None and pd.notna(bw):
            ax.axhline(float(bw), color="gray", ls="--", lw=0.8, label=f"configured {float(bw):g} Mbit/s")
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("Mbit/s")
        top = max([float(bw) if bw is not None and pd.notna(bw) else 0.0] +
                  [float(g[c].max()) / 1e6 for c, _ in series if not g.empty])
        ax.set_ylim(0, 1.3 * top if top > 0 else 1.0)  # headroom for the legend
        mark_events(ax, run)
        ax.legend(loc="upper right", fontsize=7, ncol=3)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since run start (s)")
    fig.suptitle(f"{run.name}: interface rates ({run.scheme or '?'})", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_throughput(runs, path, labels: list[str] | None = None) -> Path:
    """Samples/s of several runs side by side: bars of the mean over the post-warm-up
    iterations, error bars its 95 % confidence interval (``throughput.mean_ci95_low`` and
    ``_high``: Student's t, :func:`analysis.metrics.mean_interval`).

    Args:
        runs: :class:`Run` objects or run directories.
        path: PNG to write.
        labels: one label per run (default ``"<scheme>\\n<run id>"``).

    Returns:
        The PNG path. Values come from ``summary.json``, computed from the run's files when
        it has none or lacks the interval; a run whose interval cannot be had (fewer than two
        iterations, or only a summary without it) is drawn without an error bar.
    """

    runs = [_as_run(r) for r in runs]
    means, errs, names = [], [[], []], []
    for i, r in enumerate(runs):
        tp = _throughput(r)
        means.append(tp.mean or 0.0)
        known = tp.mean is not None and tp.mean_ci95_low is not None and tp.mean_ci95_high is not None
        errs[0].append(tp.mean - tp.mean_ci95_low if known else 0.0)
        errs[1].append(tp.mean_ci95_high - tp.mean if known else 0.0)
        names.append(labels[i] if labels else f"{r.scheme or '?'}\n{r.name}")
    path = _out(path, None, "")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(runs) + 1.5), 3.6))
    x = np.arange(len(runs))
    ax.bar(x, means, yerr=errs, capsize=4, color="tab:blue", alpha=0.8)
    for xi, m in zip(x, means):
        ax.text(xi, m, f"{m:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title("training throughput: mean over post-warm-up iterations, 95 % confidence interval (t)", fontsize=9)
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
    """Iteration time per iteration (global span and each worker's own), warm-up shaded,
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
    ax.plot(glob["iteration"], glob["time_s"], color="black", lw=1.4, label="all workers (span)")
    warm = int(((run.spec.get("workload") or {}).get("warmup_iterations")) or 0)
    if warm:
        first = sorted(glob["iteration"])[: warm]
        if first:
            ax.axvspan(min(first) - 0.5, max(first) + 0.5, color="gray", alpha=0.15, label="warm-up")
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    mark_events(ax, run, axis="iteration")
    ax.set_title(f"{run.name}: iteration times ({run.scheme or '?'})", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_utilization(runs, path, labels: list[str] | None = None, host: str | None = None,
                     window_s: float = 0.01, span_s: float | None = 2.0) -> Path:
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
            ax.text(0.5, 0.5, f"no trace of the host's link in {r.name}", ha="center", va="center",
                    transform=ax.transAxes)
            continue
        t = u["t_s"] - u["t_s"].iloc[0]
        keep = t <= span_s if span_s else slice(None)
        cap = float(u["capacity_mbps"].iloc[0]) / 1e3
        ax.plot(t[keep], u["tx_mbps"][keep] / 1e3, lw=0.8, label="sent")
        ax.plot(t[keep], u["rx_mbps"][keep] / 1e3, lw=0.8, label="received")
        ax.axhline(cap, color="gray", ls="--", lw=0.8, label=f"capacity {cap:g} Gbit/s")
        ax.set_ylim(0, 1.3 * cap)
        ax.set_ylabel("Gbit/s")
        ax.set_title(f"{name}: idle (<10% of capacity) sent {idle_fraction(u, 0.1, 'tx'):.0%}, "
                     f"received {idle_fraction(u, 0.1, 'rx'):.0%} of {window_s * 1e3:g} ms windows; "
                     f"mean {u['tx_frac'].mean():.0%} / {u['rx_frac'].mean():.0%} of capacity", fontsize=9)
        ax.legend(loc="upper right", fontsize=7, ncol=3)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since the first measured iteration (s, emulated)")
    fig.tight_layout()
    return save_figure(fig, path)


def _mean_interval_errors(rows: pd.DataFrame) -> np.ndarray | None:
    """``yerr`` of ``sweep.csv`` rows: shape ``(2, n)``, how far below and above
    ``samples_per_s`` its 95 % confidence interval reaches (0 for a row without one); None
    when the file has no interval columns."""
    lo, hi = "samples_per_s_mean_ci95_low", "samples_per_s_mean_ci95_high"
    if lo not in rows.columns or hi not in rows.columns:
        return None
    mean = pd.to_numeric(rows["samples_per_s"], errors="coerce")
    below = (mean - pd.to_numeric(rows[lo], errors="coerce")).fillna(0.0).clip(lower=0.0)
    above = (pd.to_numeric(rows[hi], errors="coerce") - mean).fillna(0.0).clip(lower=0.0)
    return np.vstack([below.to_numpy(dtype=float), above.to_numpy(dtype=float)])


def plot_sweep(sweep_dir, x: str, path=None, speedup_over: str | None = None, xscale: str = "linear",
               xlabel: str | None = None) -> Path:
    """Throughput against a swept field, one line per variant (P3 Fig. 7 / Fig. 12 style):
    each point's mean samples/s, its error bar the 95 % confidence interval of that mean
    (``sweep.csv``'s ``samples_per_s_mean_ci95_low``/``_high``; none in a file without them).

    Args:
        sweep_dir: a sweep directory (with ``sweep.csv``).
        x: the swept column of ``sweep.csv`` to put on the x axis (e.g.
            ``topology.host_bw_mbps``).
        path: PNG to write (default ``<sweep_dir>/plots/sweep-<x>.png``).
        speedup_over: a variant name; each point of the other variants is annotated with its
            speedup over that variant at the same x.
        xscale: ``linear`` or ``log``.
        xlabel: axis label (default: ``x``).

    Returns:
        The PNG path. Failed points are left out; CPU-starved points are drawn hollow.

    Raises:
        ValueError: ``x`` is not a column of ``sweep.csv``.
    """
    sweep_dir = Path(sweep_dir)
    df = read_sweep_csv(sweep_dir / "sweep.csv")
    if x not in df.columns:
        raise ValueError(f"{x!r} is not a column of {sweep_dir / 'sweep.csv'}: {', '.join(df.columns)}")
    df = df[df["status"] == "ok"]
    if "variant" not in df.columns:
        df = df.assign(variant=df.get("scheme", "run"))
    path = _out(path or sweep_dir / "plots" / f"sweep-{x.split('.')[-1]}.png", None, "")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    base = df[df["variant"] == speedup_over].set_index(x)["samples_per_s"] if speedup_over else None
    for name, g in df.groupby("variant", sort=False):
        g = g.sort_values(x)
        line = ax.errorbar(g[x], g["samples_per_s"], yerr=_mean_interval_errors(g), marker="o", capsize=3,
                           label=str(name))
        starved = g[g["cpu_starved"].astype(str) == "True"]
        ax.scatter(starved[x], starved["samples_per_s"], s=90, facecolors="white",
                   edgecolors=line[0].get_color(), zorder=3)
        if base is not None and name != speedup_over:
            for xv, yv in zip(g[x], g["samples_per_s"]):
                if xv in base.index:
                    ax.annotate(f"{yv / base[xv]:.2f}x", (xv, yv), textcoords="offset points", xytext=(0, 6),
                                ha="center", fontsize=7)
    ax.set_xscale(xscale)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{sweep_dir.name}" + (" (hollow: CPU-starved run)" if (df["cpu_starved"].astype(str) == "True").any() else ""),
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


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
    panels = ([("out", f"{switch} -> {peer} (out of {port})"), ("in", f"{peer} -> {switch} (into {port})")]
              if directed else [("both", f"{port}, both directions")])
    if rates["both"].empty:
        fig, ax = plt.subplots(figsize=(8, 2.5))
        ax.text(0.5, 0.5, f"no TCP packets captured on {port} in {run.name}", ha="center", va="center",
                transform=ax.transAxes)
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
