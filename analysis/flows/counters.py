"""Each captured port's bytes checked against its bwm-ng byte counters over the same interval
(:func:`check_against_counters`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import traces as tr
from analysis.flows.decode import _port_dirs
from analysis.flows.table import _context, _emu, _scan

__all__ = ["check_against_counters", "CHECK_COLUMNS"]

CHECK_COLUMNS = [
    "port",
    "start",
    "end",
    "samples",
    "flow_packets",
    "flow_bytes",
    "flow_frame_bytes",
    "other_frames",
    "other_frame_bytes",
    "counter_packets",
    "counter_bytes",
    "ratio",
    "ratio_ip",
    "ratio_all",
    "flow_frame_bytes_out",
    "counter_bytes_out",
    "ratio_out",
    "flow_frame_bytes_in",
    "counter_bytes_in",
    "ratio_in",
]
"""Columns of :func:`check_against_counters` (see there)."""


def check_against_counters(run_dir) -> pd.DataFrame:
    """Each captured port's flow bytes against its bwm-ng byte counters over the same interval.

    bwm-ng (``traces/bwm-ng.csv``, :func:`analysis.traces.parse_bwm_ng`) gives per-sample byte
    deltas ``bytes_in``/``bytes_out`` of each port, counting whole Ethernet frames without
    FCS (``tests/data/README.md``: a UDP datagram of 1000 bytes counts 1042). A flow's bytes
    are IP lengths, so each captured packet is 14 bytes short of the frame (18 with a VLAN
    tag): the comparison adds each packet's own link header, ``flow_frame_bytes = flow_bytes
    + 14 x flow_packets`` for untagged frames, and compares that (``ratio``); ``ratio_ip``
    compares the bare IP lengths (lower by about 14 / mean packet size).

    The interval: the bwm-ng samples of the port whose whole interval (previous sample,
    this sample] lies inside the capture window (``started``..``stopped`` of ``ports.json``,
    else the first and last packet), from the first such interval's start to the last one's
    end; packets are counted by timestamp inside it (both clocks are this machine's).

    Returns:
        DataFrame with columns :data:`CHECK_COLUMNS`, one row per captured port with a pcap:
        ``start, end`` (emulated unix s), ``samples`` (bwm-ng intervals used),
        ``flow_packets, flow_bytes`` (TCP packets and IP bytes of the flows in the interval),
        ``flow_frame_bytes``, ``other_frames, other_frame_bytes`` (captured frames that are
        not TCP, wire lengths: 0 under the usual ``tcp`` filter), ``counter_packets,
        counter_bytes`` (bwm-ng in + out), ``ratio`` = flow_frame_bytes / counter_bytes,
        ``ratio_ip`` = flow_bytes / counter_bytes, ``ratio_all`` = (flow_frame_bytes +
        other_frame_bytes) / counter_bytes; per direction (port's point of view, only the
        flows whose direction is known, see :func:`analysis.flows.owners.ports_behind`):
        ``flow_frame_bytes_out, counter_bytes_out, ratio_out``, and the same for ``in`` (the
        two ratios are NaN when some flow's direction is unknown). A ratio is NaN when the counters are 0 or the port
        has no bwm-ng samples in the window.

    Raises:
        CaptureError: the run has no packet capture.
    """
    ctx = _context(run_dir)
    bwm = tr.parse_bwm_ng(ctx.run.path / "traces" / "bwm-ng.csv")  # unix time, like the packets
    out = []
    for e in ctx.ports:
        port = e["port"]
        g = bwm[bwm["iface"] == port].sort_values("time", kind="stable").reset_index(drop=True)
        t = g["time"].to_numpy(float)
        # per bwm-ng interval k (t[k-1], t[k]]: bin k; bin 0 and bin len(t) lie outside them all
        names = ("fp", "fb", "ffb", "of", "ob", "out", "in")
        bins = {q: np.zeros(len(t) + 1, dtype=np.int64) for q in names}
        span = [math.inf, -math.inf]

        def sink(chunk, scan, bins=bins, t=t, span=span):
            ts = chunk["ts_ns"] / 1e9
            span[0], span[1] = min(span[0], float(ts.min())), max(span[1], float(ts.max()))
            k = np.searchsorted(t, ts, "left")
            fid = chunk["fid"]
            f, o = fid >= 0, fid < 0
            L = len(t) + 1

            def add(q, sel, w=None):
                bins[q] += np.bincount(k[sel], weights=None if w is None else w[sel], minlength=L).astype(np.int64)

            add("fp", f)
            add("fb", f, chunk["iplen"])
            add("ffb", f, chunk["frame"])
            add("of", o)
            add("ob", o, chunk["wire"])
            pdir = _port_dirs(scan, fid, chunk["dir"])
            add("out", pdir == 2, chunk["frame"])
            add("in", pdir == 1, chunk["frame"])

        if _scan(ctx, e, sink) is None:
            continue
        lo = float(e["started"]) if isinstance(e.get("started"), (int, float)) else span[0]
        hi = float(e["stopped"]) if isinstance(e.get("stopped"), (int, float)) else span[1]
        i, j = _window(t, lo, hi)
        n = max(j - i, 0)
        tot = {q: int(bins[q][i + 1 : j + 1].sum()) if n else 0 for q in names}
        sel = g.iloc[i + 1 : j + 1] if n else g.iloc[0:0]
        cin, cout = int(sel["bytes_in"].sum()), int(sel["bytes_out"].sum())
        cpk = int(sel["packets_in"].sum() + sel["packets_out"].sum())

        split = tot["out"] + tot["in"] == tot["ffb"]  # every flow's direction on the port known

        def ratio(x, y):
            return x / y if y else math.nan

        out.append(
            {
                "port": port,
                "start": _emu(ctx, float(t[i])) if n else math.nan,
                "end": _emu(ctx, float(t[j])) if n else math.nan,
                "samples": n,
                "flow_packets": tot["fp"],
                "flow_bytes": tot["fb"],
                "flow_frame_bytes": tot["ffb"],
                "other_frames": tot["of"],
                "other_frame_bytes": tot["ob"],
                "counter_packets": cpk,
                "counter_bytes": cin + cout,
                "ratio": ratio(tot["ffb"], cin + cout),
                "ratio_ip": ratio(tot["fb"], cin + cout),
                "ratio_all": ratio(tot["ffb"] + tot["ob"], cin + cout),
                "flow_frame_bytes_out": tot["out"],
                "counter_bytes_out": cout,
                "ratio_out": ratio(tot["out"], cout) if split else math.nan,
                "flow_frame_bytes_in": tot["in"],
                "counter_bytes_in": cin,
                "ratio_in": ratio(tot["in"], cin) if split else math.nan,
            }
        )
    return pd.DataFrame(out, columns=CHECK_COLUMNS)


def _window(t: np.ndarray, lo: float, hi: float) -> tuple[int, int]:
    """Indices (i, j) of the bwm-ng samples bounding the intervals (t[k-1], t[k]] that lie
    inside [lo, hi]: intervals i+1 .. j (none when j <= i)."""
    if len(t) < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return 0, 0
    i = int(np.searchsorted(t, lo, "left"))  # first sample at or after lo: an interval starts there
    j = int(np.searchsorted(t, hi, "right")) - 1  # last sample at or before hi: an interval ends there
    return (i, j) if j > i else (0, 0)
