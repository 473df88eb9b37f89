"""Link utilization of one host over time, and its idle fraction (P3 Figures 8 and 9).

P3 (Jayarajan et al., SysML 2019, Sec. 5.3) plots the traffic one worker host sends and
receives, sampled with bwm-ng every 10 ms, and argues from the *idle* stretches of that
plot: the baseline's traffic is bursty with regular crests, P3's fills the gaps. This module
gives both as numbers, from a run directory's bwm-ng trace:

* :func:`host_utilization`: the host's send (tx) and receive (rx) rates in windows of
  ``window_s`` (default 10 ms of the *emulated* network's time: a dilated run's trace is
  already converted by :func:`analysis.load.load`, so its 10 ms windows hold ``scale`` real
  bwm-ng samples -- the resolution P3 had), as fractions of the link's capacity;
* :func:`idle_fraction`: the share of those windows whose rate is below ``threshold``
  (default 10 %) of capacity.

Both are restricted to the measured iterations (:attr:`analysis.load.Run.measured_span`) so that
start-up and the last iteration's drain do not count. A host with several links to its ToR
counts them together (rates summed, capacities summed).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load import Run, in_span, load
from analysis.metrics import global_iterations

__all__ = ["measured_window", "host_utilization", "idle_fraction", "utilization_summary"]


def _as_run(run) -> Run:
    return run if isinstance(run, Run) else load(run)


def measured_window(run: Run) -> tuple[float, float] | None:
    """``(start, end)`` (the run's time base, s) of the measured iterations
    (:attr:`analysis.load.Run.measured_span`), the window of the summary's bytes per
    iteration: from the completion of the iteration before the first (its ``period_start``,
    :func:`analysis.metrics.global_iterations`) to the completion of the last (every
    iteration when none is measured). ``None`` if the run has no iterations."""
    it = run.iterations
    if it.empty:
        return None
    g = global_iterations(it)
    m = g[in_span(g["iteration"], run.measured_span)]
    if m.empty:
        m = g
    return float(m["period_start"].min()), float(m["end"].max())


def host_utilization(run, host: str | None = None, window_s: float = 0.01, measured_only: bool = True) -> pd.DataFrame:
    """Per-window send and receive rate of ``host``'s link(s), as fractions of capacity.

    Args:
        run: a :class:`~analysis.load.Run` or a run directory.
        host: host name (default: the host of worker 0).
        window_s: window length in seconds of the emulated network's time (P3: 10 ms).
        measured_only: keep only windows inside :func:`measured_window`.

    Returns:
        DataFrame with ``t_s`` (end of the window, s from the run's start), ``tx_mbps``
        (what the host sent), ``rx_mbps`` (what it received), ``capacity_mbps``,
        ``tx_frac`` and ``rx_frac`` (rate / capacity). Empty if the run has no trace of the
        host's link.

    Raises:
        ValueError: ``window_s`` <= 0, or ``host`` has no link in the topology.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    run = _as_run(run)
    ports = run.ports()
    if host is None:
        hosts = run.worker_hosts()
        host = hosts[0] if hosts else None
    mine = ports[(ports["host"] == host) & (ports["link_class"] == "host")] if not ports.empty else ports
    if mine.empty:
        raise ValueError(f"host {host!r} has no link in {run.name}'s topology")
    capacity = float(mine["bw_mbps"].astype(float).sum())
    cols = ["t_s", "tx_mbps", "rx_mbps", "capacity_mbps", "tx_frac", "rx_frac"]
    rates = run.rates[run.rates["iface"].isin(set(mine["iface"]))] if not run.rates.empty else run.rates
    if rates.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    # one grid for all of the host's links; a sample counts in the window its end falls in;
    # per window and link the rate is bytes / covered time (the exact mean over its samples),
    # the host's rate the sum over its links; a window without a sample is left out (not
    # idle), and so are the partial first and last windows
    start = float((rates["time"] - rates["dt_s"]).min())
    b = np.floor((rates["time"].to_numpy() - start) / window_s).astype(np.int64)
    per = (
        rates.assign(w=b)
        .groupby(["w", "iface"])
        .agg(
            tx_bytes=("rx_bytes", "sum"),  # switch rx = host tx
            rx_bytes=("tx_bytes", "sum"),
            dt_s=("dt_s", "sum"),
        )
    )
    per["tx_bps"] = 8.0 * per["tx_bytes"] / per["dt_s"]
    per["rx_bps"] = 8.0 * per["rx_bytes"] / per["dt_s"]
    g = per.groupby(level="w")[["tx_bps", "rx_bps"]].sum()
    g = g[(g.index > b.min()) & (g.index < b.max())]
    g["time"] = start + (g.index.to_numpy() + 1) * window_s
    if measured_only:
        span = measured_window(run)
        if span is not None:
            g = g[(g["time"] - window_s >= span[0]) & (g["time"] <= span[1])]
    t0 = run.t0 or 0.0
    out = pd.DataFrame({"t_s": g["time"] - t0, "tx_mbps": g["tx_bps"] / 1e6, "rx_mbps": g["rx_bps"] / 1e6})
    out["capacity_mbps"] = capacity
    out["tx_frac"] = out["tx_mbps"] / capacity
    out["rx_frac"] = out["rx_mbps"] / capacity
    return out[cols].reset_index(drop=True)


def idle_fraction(util: pd.DataFrame, threshold: float = 0.1, direction: str = "tx") -> float | None:
    """Share of windows in which the host's ``direction`` rate is below ``threshold`` x capacity.

    Args:
        util: a frame of :func:`host_utilization`.
        threshold: fraction of capacity under which a window counts as idle (P3-style: 0.1).
        direction: ``tx`` (what the host sent), ``rx`` (what it received) or ``both``
            (idle only if both directions are).

    Returns:
        A fraction in [0, 1], or ``None`` for an empty frame.

    Raises:
        ValueError: unknown ``direction``.
    """
    if direction not in ("tx", "rx", "both"):
        raise ValueError(f"direction must be tx, rx or both, got {direction!r}")
    if util.empty:
        return None
    if direction == "both":
        idle = (util["tx_frac"] < threshold) & (util["rx_frac"] < threshold)
    else:
        idle = util[f"{direction}_frac"] < threshold
    return float(idle.mean())


def utilization_summary(run, host: str | None = None, window_s: float = 0.01, threshold: float = 0.1) -> dict:
    """Mean utilization and idle fractions of ``host``'s link over the measured iterations.

    Returns:
        ``{"host", "window_s", "threshold", "windows", "tx_mean", "rx_mean", "tx_idle",
        "rx_idle", "both_idle"}`` (fractions of capacity / of windows; ``None`` where the
        run has no trace).
    """
    run = _as_run(run)
    if host is None:
        hosts = run.worker_hosts()
        host = hosts[0] if hosts else None
    if host is None or run.ports().empty:  # no plan or no topology kept (an archived run's small files)
        return {
            "host": host,
            "window_s": window_s,
            "threshold": threshold,
            "windows": 0,
            "tx_mean": None,
            "rx_mean": None,
            "tx_idle": None,
            "rx_idle": None,
            "both_idle": None,
        }
    u = host_utilization(run, host, window_s)
    empty = u.empty
    return {
        "host": host,
        "window_s": window_s,
        "threshold": threshold,
        "windows": int(len(u)),
        "tx_mean": None if empty else float(u["tx_frac"].mean()),
        "rx_mean": None if empty else float(u["rx_frac"].mean()),
        "tx_idle": idle_fraction(u, threshold, "tx"),
        "rx_idle": idle_fraction(u, threshold, "rx"),
        "both_idle": idle_fraction(u, threshold, "both"),
    }
