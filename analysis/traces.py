"""Parsers for the trace files of a run directory (``traces/``) and rates from counters.

bwm-ng 0.6.3 CSV (``bwm-ng -o csv -T rate``), verified on veth pairs (see
:mod:`testbed.capture` for the evidence): one line per interface per sample plus a ``total``
line, ``;``-separated, 21 fields::

    time;iface;bytes_out/s;bytes_in/s;bytes_total/s;bytes_in;bytes_out;
    packets_out/s;packets_in/s;packets_total/s;packets_in;packets_out;
    errors_out/s;errors_in/s;errors_in;errors_out;
    bits_out/s;bits_in/s;bits_total/s;bits_in;bits_out

``bytes_in``/``bytes_out`` (and the packets/errors/bits counters) are **per-sample deltas**:
what the interface received/sent since bwm-ng's previous read of it, not cumulative
counters. The first line of an interface covers the time since bwm-ng's start-up read.
The ``.../s`` columns are those deltas times ``1000 / (elapsed ms, truncated to an
integer)``, so at 10 ms they are off by up to ~10 %; :func:`rates` recomputes rates from the
deltas and the microsecond timestamps instead. ``in`` and ``out`` are from the interface's
point of view: on a switch port, ``out`` is what the switch sends on that link.
Older bwm-ng (0.6.1/0.6.2) lacks the five ``bits`` fields; such files parse too.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

BWM_NG_COLUMNS = [
    "time",
    "iface",
    "bytes_out_s",
    "bytes_in_s",
    "bytes_total_s",
    "bytes_in",
    "bytes_out",
    "packets_out_s",
    "packets_in_s",
    "packets_total_s",
    "packets_in",
    "packets_out",
    "errors_out_s",
    "errors_in_s",
    "errors_in",
    "errors_out",
    "bits_out_s",
    "bits_in_s",
    "bits_total_s",
    "bits_in",
    "bits_out",
]
"""Column names given to bwm-ng 0.6.3's 21 CSV fields (``/s`` written ``_s``)."""

COUNTER_COLUMNS = ["bytes_in", "bytes_out", "packets_in", "packets_out", "errors_in", "errors_out"]
"""The per-sample delta counters :func:`parse_bwm_ng` keeps (int64)."""

TRACE_COLUMNS = ["time", "iface", *COUNTER_COLUMNS]
RATE_COLUMNS = ["time", "iface", "dt_s", "tx_bytes", "rx_bytes", "tx_bps", "rx_bps"]
QDISC_COLUMNS = [
    "time",
    "iface",
    "qdisc",
    "backlog_bytes",
    "backlog_packets",
    "drops",
    "overlimits",
    "sent_bytes",
    "sent_packets",
]
CPU_COLUMNS = ["time", "kind", "id", "busy_pct"]
MEMORY_COLUMNS = ["time", "kind", "id", "bytes"]


def _complete_text(path: Path) -> str:
    """The file's text without a trailing partial line (a writer killed mid-line)."""
    text = path.read_text(errors="replace")
    if text and not text.endswith("\n"):
        cut = text.rfind("\n")
        text = text[: cut + 1] if cut >= 0 else ""
    return text


def parse_bwm_ng(path: str | Path, keep_rates: bool = False) -> pd.DataFrame:
    """Parse a bwm-ng CSV file (``-o csv -T rate``) into per-sample counters.

    The ``total`` lines are dropped, as are malformed lines and a truncated last line.

    Args:
        path: the CSV file (missing or empty gives an empty frame).
        keep_rates: also keep bwm-ng's own ``.../s`` columns (quantized, see module doc).

    Returns:
        DataFrame, one row per (sample, interface), sorted by time: ``time`` (unix s, float),
        ``iface`` (str), ``bytes_in``, ``bytes_out``, ``packets_in``, ``packets_out``,
        ``errors_in``, ``errors_out`` (int64, per-sample deltas, interface's point of view).
    """
    path = Path(path)
    cols = TRACE_COLUMNS + ([c for c in BWM_NG_COLUMNS if c.endswith("_s")] if keep_rates else [])
    if not path.is_file():
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in cols})
    text = _complete_text(path)
    if not text.strip():
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in cols})
    idx = [BWM_NG_COLUMNS.index(c) for c in cols]  # all within the first 16 fields
    try:  # fast path: well-formed numbers everywhere
        df = pd.read_csv(
            io.StringIO(text),
            sep=";",
            header=None,
            usecols=idx,
            on_bad_lines="skip",
            engine="c",
            dtype={i: (str if i == 1 else "float64") for i in idx},
        )
        df.columns = [BWM_NG_COLUMNS[i] for i in sorted(idx)]
    except (ValueError, pd.errors.ParserError):
        # garbage somewhere: everything as text, then coerce. The field count comes from the
        # first line (21 in 0.6.3, 16 before); longer lines are skipped, shorter get NaN.
        df = pd.read_csv(
            io.StringIO(text), sep=";", header=None, dtype=str, on_bad_lines="skip", engine="c", skip_blank_lines=True
        )
        df = df.iloc[:, : len(BWM_NG_COLUMNS)]
        df.columns = BWM_NG_COLUMNS[: df.shape[1]]
        for c in BWM_NG_COLUMNS[df.shape[1] :]:
            df[c] = np.nan
        for c in cols:
            if c != "iface":
                df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df[df["iface"].notna() & (df["iface"] != "total")]
    df = df.dropna(subset=TRACE_COLUMNS)
    for c in COUNTER_COLUMNS:
        df[c] = df[c].astype("int64")
    df = df[cols].sort_values(["time", "iface"], kind="stable").reset_index(drop=True)
    df["iface"] = df["iface"].astype(str)
    return df


def _dtype(col: str):
    if col == "iface":
        return object
    if col in COUNTER_COLUMNS:
        return "int64"
    return "float64"


def rates(traces: pd.DataFrame) -> pd.DataFrame:
    """Per-interface tx/rx rates from the per-sample byte deltas and their timestamps.

    For the sample of interface *i* at time ``t_k``, ``tx_bps = 8 * bytes_out_k / (t_k -
    t_{k-1})`` (and ``rx_bps`` from ``bytes_in``), where ``t_{k-1}`` is the previous sample of
    the same interface. bwm-ng's own rate columns are not used: they divide by the elapsed time
    truncated to whole milliseconds. The first sample of each interface has no previous
    timestamp and gives no rate.

    Args:
        traces: the frame of :func:`parse_bwm_ng`.

    Returns:
        DataFrame with ``time`` (unix s, end of the interval), ``iface``, ``dt_s`` (interval,
        s), ``tx_bytes``, ``rx_bytes`` (bytes in the interval), ``tx_bps``, ``rx_bps``
        (bits/s). Intervals of zero length are dropped.
    """
    if traces.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "iface" else "float64") for c in RATE_COLUMNS})
    df = traces.sort_values(["iface", "time"], kind="stable")
    dt = df.groupby("iface", sort=False)["time"].diff()
    out = pd.DataFrame(
        {"time": df["time"], "iface": df["iface"], "dt_s": dt, "tx_bytes": df["bytes_out"], "rx_bytes": df["bytes_in"]}
    )
    out = out[out["dt_s"] > 0].copy()
    out["tx_bps"] = 8.0 * out["tx_bytes"] / out["dt_s"]
    out["rx_bps"] = 8.0 * out["rx_bytes"] / out["dt_s"]
    return out.sort_values(["time", "iface"], kind="stable").reset_index(drop=True)


def windowed_rates(rate_df: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """Rates averaged over consecutive windows of about ``window_s`` seconds per interface.

    Bytes and interval lengths of the samples whose end time falls in each window are summed,
    so the result is the exact mean rate over those samples (not a mean of rates).

    Returns:
        Same columns as :func:`rates`; ``time`` is the end of the last sample in the window.
    """
    if rate_df.empty or window_s <= 0:
        return rate_df.copy()
    parts = []
    for iface, g in rate_df.groupby("iface", sort=False):
        g = g.sort_values("time")
        t_start = g["time"].iloc[0] - g["dt_s"].iloc[0]
        b = np.floor((g["time"].to_numpy() - t_start) / window_s).astype(np.int64)
        agg = g.groupby(b).agg(
            time=("time", "max"), dt_s=("dt_s", "sum"), tx_bytes=("tx_bytes", "sum"), rx_bytes=("rx_bytes", "sum")
        )
        agg["iface"] = iface
        parts.append(agg)
    out = pd.concat(parts, ignore_index=True)
    out["tx_bps"] = 8.0 * out["tx_bytes"] / out["dt_s"]
    out["rx_bps"] = 8.0 * out["rx_bytes"] / out["dt_s"]
    return out[RATE_COLUMNS].sort_values(["time", "iface"], kind="stable").reset_index(drop=True)


def smoothed_rates(rate_df: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """Rates as a rolling mean over a centred time window, per interface.

    For every sample, the samples of its interface whose ``time`` lies within ``window_s / 2``
    either side of its own (pandas ``rolling`` on a time index, ``center=True``): their bytes
    over their intervals, ``8 * sum(bytes) / sum(dt_s)``, which is the mean of their rates
    weighted by their intervals (their plain mean when the intervals are equal). Weighted,
    because at 10 ms samples the jitter of bwm-ng's timestamps is in the intervals: a short
    one puts a single sample well above the shaped rate, and its neighbour's longer one below;
    over the window the bytes and the time add up.

    Args:
        rate_df: the frame of :func:`rates`.
        window_s: the window, s (0 or less leaves the rates as they are).

    Returns:
        Same rows and columns as ``rate_df`` (sorted by ``time`` and ``iface``), ``tx_bps`` and
        ``rx_bps`` smoothed.
    """
    if rate_df.empty or window_s <= 0:
        return rate_df.copy()
    window = pd.Timedelta(seconds=window_s)
    parts = []
    for _, g in rate_df.groupby("iface", sort=False):
        g = g.sort_values("time", kind="stable").copy()
        index = pd.to_timedelta(g["time"] - g["time"].iloc[0], unit="s")
        sums = g[["dt_s", "tx_bytes", "rx_bytes"]].set_axis(index).rolling(window, center=True).sum()
        g["tx_bps"] = 8.0 * sums["tx_bytes"].to_numpy() / sums["dt_s"].to_numpy()
        g["rx_bps"] = 8.0 * sums["rx_bytes"].to_numpy() / sums["dt_s"].to_numpy()
        parts.append(g)
    return pd.concat(parts).sort_values(["time", "iface"], kind="stable").reset_index(drop=True)


def read_table(path: str | Path, columns: list[str]) -> pd.DataFrame:
    """Read a CSV written by the harness (``qdisc.csv``, ``cpu.csv``, ``memory.csv``), tolerating a missing
    file, an empty file and a truncated last line. Missing columns are added empty."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
    text = _complete_text(path)
    if not text.strip():
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
    df = pd.read_csv(io.StringIO(text), on_bad_lines="skip")
    for c in columns:
        if c not in df.columns:
            df[c] = np.nan
    return df
