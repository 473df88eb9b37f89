"""The flow table of a run's captures, each end named by process (:func:`flows`,
:func:`retransmissions`, :func:`flow_labels`), and the flows' rates over time
(:func:`flow_rates`, :func:`flows_and_rates`); also the run context both build on (captured
ports, time dilation, ``t0``), shared with :mod:`analysis.flows.counters`.

Time. Packet timestamps are unix seconds of this machine. In a run with time dilation
``scale`` != 1 every time is converted to the emulated network's time as
:func:`analysis.load.to_emulated_time` does: ``t0 + (t - t0) / scale``, with ``t0`` the
run's :attr:`analysis.load.Run.t0` (the earliest timestamp of bwm-ng, qdisc, cpu and events,
the instant ``to_emulated_time`` keeps fixed; the conversion leaves it unchanged, so it is
also the converted run's ``t0``). A run that recorded none of them uses the earliest
``started`` of ``ports.json``, else the earliest captured packet. Durations (RTT, bins) are
divided by ``scale``; rates are then in the emulated network's units.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.flows.decode import PcapWarning, _port_dirs, _PortScan
from analysis.flows.owners import CaptureError, _host_of_ip, _Owners, ports_behind, read_endpoints, read_ports
from analysis.load import Run, load

__all__ = ["flows", "retransmissions", "flow_labels", "flows_and_rates", "flow_rates", "FLOW_COLUMNS"]

FLOW_COLUMNS = [
    "port",
    "flow_id",
    "proto",
    "src_ip",
    "src_port",
    "dst_ip",
    "dst_port",
    "initiator",
    "src_host",
    "dst_host",
    "src_proc",
    "dst_proc",
    "src_role",
    "src_rank",
    "dst_role",
    "dst_rank",
    "fwd_on_port",
    "bytes_fwd",
    "bytes_rev",
    "packets_fwd",
    "packets_rev",
    "payload_bytes_fwd",
    "payload_bytes_rev",
    "first_ts",
    "last_ts",
    "duration_s",
    "retransmits_fwd",
    "retransmits_rev",
    "rtt_ms",
    "rtt_ms_fwd",
    "rtt_ms_rev",
    "rtt_samples_fwd",
    "rtt_samples_rev",
]
"""Columns of :func:`flows` (see there)."""


@dataclass
class _Ctx:
    run: Run
    scale: float
    t0: float | None
    ports: list[dict]


def _context(run_dir) -> _Ctx:
    run = run_dir if isinstance(run_dir, Run) else load(run_dir)
    ports = read_ports(run.path)
    scale = float((run.spec or {}).get("scale") or 1.0)
    t0 = run.t0
    if t0 is None:
        started = [float(p["started"]) for p in ports if isinstance(p.get("started"), (int, float))]
        t0 = min(started) if started else None
    return _Ctx(run=run, scale=scale, t0=t0, ports=ports)


def _select(ctx: _Ctx, port: str | None) -> list[dict]:
    if port is None:
        return ctx.ports
    sel = [p for p in ctx.ports if p["port"] == port]
    if not sel:
        raise CaptureError(
            f"port {port!r} was not captured in {ctx.run.path}; captured: "
            + (", ".join(p["port"] for p in ctx.ports) or "none")
        )
    return sel


def _scan(ctx: _Ctx, entry: dict, sink=None) -> _PortScan | None:
    path = ctx.run.path / "traces" / "pcap" / Path(str(entry.get("file") or f"{entry['port']}.pcap")).name
    if not path.is_file():
        warnings.warn(f"{path}: missing (tcpdump on {entry['port']} wrote nothing)", PcapWarning, stacklevel=3)
        return None
    behind, front = ports_behind(ctx.run.topology, entry["port"])
    return _PortScan(path, behind, front, sink).run()


def _emu(ctx: _Ctx, t_unix):
    """unix s -> emulated unix s (identity when scale is 1)."""
    if ctx.scale == 1.0 or ctx.t0 is None:
        return t_unix
    return ctx.t0 + (t_unix - ctx.t0) / ctx.scale


def _median_ms(chunks, scale) -> tuple[float, int]:
    if not chunks:
        return math.nan, 0
    v = np.concatenate(chunks)
    return float(np.median(v)) / 1e6 / scale, len(v)


def _rows(ctx: _Ctx, port: str, scan: _PortScan, owners: _Owners, host_of: dict, procs: dict) -> list[dict]:
    out = []
    for fid, f in enumerate(scan.flows):
        if sum(f.packets) == 0:
            continue
        (ip0, p0), (ip1, p1) = f.ends
        if f.syn_dir is not None:
            fwd, how = f.syn_dir, "syn"
        elif f.synack_dir is not None:
            fwd, how = 1 - f.synack_dir, "syn-ack"
        elif owners.is_listener(ip0, p0) != owners.is_listener(ip1, p1):
            fwd, how = (1 if owners.is_listener(ip0, p0) else 0), "listener"
        elif p0 != p1:
            fwd, how = (0 if p0 > p1 else 1), "port"
        else:
            fwd, how = f.first_dir or 0, "first-packet"
        rev = 1 - fwd
        (sip, sport), (dip, dport) = f.ends[fwd], f.ends[rev]
        t_raw = f.first_ns / 1e9
        sproc = owners.owner(sip, sport, dip, dport, t_raw)
        dproc = owners.owner(dip, dport, sip, sport, t_raw)
        sp, dp = procs.get(sproc) or {}, procs.get(dproc) or {}
        r_f, n_f = _median_ms(f.spaces[fwd].rtt_ns, ctx.scale)
        r_r, n_r = _median_ms(f.spaces[rev].rtt_ns, ctx.scale)
        pdir = f.port_dir0 if fwd == 0 else {"in": "out", "out": "in"}.get(f.port_dir0)
        first, last = _emu(ctx, f.first_ns / 1e9), _emu(ctx, f.last_ns / 1e9)
        out.append(
            {
                "port": port,
                "flow_id": fid,
                "proto": "tcp",
                "src_ip": sip,
                "src_port": sport,
                "dst_ip": dip,
                "dst_port": dport,
                "initiator": how,
                "src_host": host_of.get(sip),
                "dst_host": host_of.get(dip),
                "src_proc": sproc,
                "dst_proc": dproc,
                "src_role": sp.get("role"),
                "src_rank": sp.get("rank"),
                "dst_role": dp.get("role"),
                "dst_rank": dp.get("rank"),
                "fwd_on_port": pdir,
                "bytes_fwd": f.bytes[fwd],
                "bytes_rev": f.bytes[rev],
                "packets_fwd": f.packets[fwd],
                "packets_rev": f.packets[rev],
                "payload_bytes_fwd": f.payload[fwd],
                "payload_bytes_rev": f.payload[rev],
                "first_ts": first,
                "last_ts": last,
                "duration_s": last - first,
                "retransmits_fwd": f.spaces[fwd].retransmits,
                "retransmits_rev": f.spaces[rev].retransmits,
                "rtt_ms": r_f if n_f >= n_r else r_r,
                "rtt_ms_fwd": r_f,
                "rtt_ms_rev": r_r,
                "rtt_samples_fwd": n_f,
                "rtt_samples_rev": n_r,
                "_fwd": fwd,
                "_first_raw": t_raw,
            }
        )
    return out


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=FLOW_COLUMNS + ["_fwd", "_first_raw"])
    for c in (
        "src_port",
        "dst_port",
        "bytes_fwd",
        "bytes_rev",
        "packets_fwd",
        "packets_rev",
        "payload_bytes_fwd",
        "payload_bytes_rev",
        "retransmits_fwd",
        "retransmits_rev",
        "rtt_samples_fwd",
        "rtt_samples_rev",
        "flow_id",
    ):
        df[c] = df[c].astype("int64")
    for c in ("src_rank", "dst_rank"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    for c in ("first_ts", "last_ts", "duration_s", "rtt_ms", "rtt_ms_fwd", "rtt_ms_rev"):
        df[c] = df[c].astype("float64")
    for c in ("src_host", "dst_host", "src_proc", "dst_proc", "src_role", "dst_role", "fwd_on_port"):
        # object columns holding None for "unknown" (pandas would infer a string dtype with NaN)
        df[c] = pd.Series([v if isinstance(v, str) else None for v in df[c]], index=df.index, dtype=object)
    return df


def _analyse(ctx: _Ctx, entries: list[dict], sink_for=None) -> pd.DataFrame:
    owners = _Owners(read_endpoints(ctx.run.path))
    host_of = _host_of_ip(ctx.run.topology)
    procs = {p.get("name"): p for p in (ctx.run.processes or {}).get("processes", [])}
    rows = []
    for e in entries:
        scan = _scan(ctx, e, sink_for(e) if sink_for else None)
        if scan is not None:
            rows += _rows(ctx, e["port"], scan, owners, host_of, procs)
    df = _frame(rows)
    if ctx.t0 is None and ctx.scale != 1.0 and not df.empty:  # nothing else recorded: the first packet
        t0 = float(df["_first_raw"].min())
        for c in ("first_ts", "last_ts"):
            df[c] = t0 + (df[c] - t0) / ctx.scale
        df["duration_s"] = df["last_ts"] - df["first_ts"]
    return df.sort_values(["port", "first_ts", "flow_id"], kind="stable").reset_index(drop=True)


def flows(run_dir, port: str | None = None) -> pd.DataFrame:
    """One row per TCP connection per captured port of a run.

    Args:
        run_dir: a run directory (or a loaded :class:`analysis.load.Run`) with
            ``traces/pcap/ports.json``.
        port: one captured port (``tor1-eth3``); None for every port of ``ports.json``.

    Returns:
        DataFrame sorted by ``port``, ``first_ts``, with columns :data:`FLOW_COLUMNS`:

        ``port``; ``flow_id`` (int, unique within the port: the key of :func:`flow_rates`);
        ``proto`` (``tcp``); ``src_ip, src_port, dst_ip, dst_port``: the connection oriented
        from its initiator; ``initiator``: how it was told, in this order: ``syn`` (the end
        that sent a SYN without ACK), ``syn-ack`` (the other end of a SYN-ACK), ``listener``
        (the other end of an address:port that ``endpoints.csv`` shows listening), ``port``
        (no handshake captured and no listener known: the end with the higher port is the
        client, as ephemeral ports lie above configured ones; gloo listens on ephemeral ports
        too, so this guess is the weakest), ``first-packet`` (equal ports: the sender of the
        first packet). A 4-tuple reused by a new connection (a SYN with another initial
        sequence number after packets of the old one) starts a new row.

        ``src_host, dst_host``: the host owning the address (``topology.json``), None outside
        it. ``src_proc, dst_proc``: the training process owning the endpoint, from
        ``endpoints.csv`` (the socket local=this end, remote=the other; else any socket of
        that local address and port; else a listener on that port; nearest sample in time if
        several), None if unknown (not a training process's socket, or one the sampler missed:
        the host's process is not guessed). ``src_role, src_rank, dst_role, dst_rank``: from
        ``processes.json`` (ranks nullable ints). ``fwd_on_port``: ``in`` if the initiator's
        packets enter the switch through the port, ``out`` if they leave by it (bwm-ng's
        convention), None when the topology cannot tell (see :func:`ports_behind`).

        ``bytes_fwd, bytes_rev``: sums of IP total lengths (bytes) from the initiator and
        back; ``packets_fwd, packets_rev``; ``payload_bytes_fwd, payload_bytes_rev``: IP
        length minus IP and TCP header lengths. ``first_ts, last_ts``: first and last packet,
        emulated unix s (see the module doc); ``duration_s`` their difference.

        ``retransmits_fwd, retransmits_rev``: data segments (TCP payload > 0) any byte of
        whose sequence range had already passed this port in that direction. Sequence numbers
        are unwrapped across 2**32. A segment filling a gap that was never seen here (its
        first copy was lost before the port) is not counted: it crossed the port once. Data
        sent before the capture began counts as unseen. SYNs, FINs and zero-length probes
        (keep-alive, window probes) carry no data and are never counted. Packets tcpdump itself
        dropped (``packets_dropped`` in ``ports.json``) are missing from every figure; a
        segment whose first copy the capture dropped looks like a gap fill.

        ``rtt_ms_fwd``: median over the initiator's data segments of the time from the
        segment to the first later ACK from the other end covering its last byte, in
        emulated ms. It is taken at the capture point, so it is the round trip from the port
        to the receiver (``dst``) and back, not the sender's RTT. Karn's rule: segments that
        are retransmissions or fill a gap get no sample, nor do segments whose bytes pass
        the port again before that ACK. ``rtt_ms_rev`` the same for the other direction (port
        to ``src`` and back). ``rtt_ms``: the one of the two with more samples (the bulk
        direction). NaN where no sample exists; ``rtt_samples_fwd, rtt_samples_rev``:
        samples taken. Delayed ACKs are part of the estimate (Linux delays at most ~40 ms).

    Warns:
        PcapWarning: a pcap file truncated (read up to its last whole packet), missing or
            unreadable.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
        CaptureError: the run has no ``ports.json``; ``port`` was not captured.
    """
    ctx = _context(run_dir)
    df = _analyse(ctx, _select(ctx, port))
    return df[FLOW_COLUMNS]


def retransmissions(run_dir, port: str | None = None) -> pd.DataFrame:
    """When each retransmitted segment passed a captured port (the rule of :func:`flows`).

    Returns:
        DataFrame with ``port``, ``flow_id`` (as in :func:`flows`), ``sender_ip,
        sender_port`` (the end that retransmitted) and ``time`` (emulated unix s), sorted by
        port and time; one row per retransmitted segment, so that its rows per port and
        flow add up to ``retransmits_fwd + retransmits_rev``.

    Raises:
        CaptureError: ``port`` was not captured.
    """
    ctx = _context(run_dir)
    rows = []
    for e in _select(ctx, port):
        scan = _scan(ctx, e)
        if scan is None:
            continue
        for fid, f in enumerate(scan.flows):
            for d, sp in enumerate(f.spaces):
                ip, sport = f.ends[d]
                rows += [
                    {
                        "port": e["port"],
                        "flow_id": fid,
                        "sender_ip": ip,
                        "sender_port": sport,
                        "time": _emu(ctx, ns / 1e9),
                    }
                    for ns in sp.retransmit_ns
                ]
    df = pd.DataFrame(rows, columns=["port", "flow_id", "sender_ip", "sender_port", "time"])
    return df.sort_values(["port", "time"], kind="stable").reset_index(drop=True)


def flow_labels(df: pd.DataFrame) -> list[str]:
    """``src_proc->dst_proc`` for each row of a :func:`flows` frame; an end whose process is
    unknown is named ``ip:port``."""
    out = []
    for sp, dp, si, so, di, do in zip(
        df["src_proc"], df["dst_proc"], df["src_ip"], df["src_port"], df["dst_ip"], df["dst_port"]
    ):
        a = sp if isinstance(sp, str) and sp else f"{si}:{so}"
        b = dp if isinstance(dp, str) and dp else f"{di}:{do}"
        out.append(f"{a}->{b}")
    return out


def _auto_bin_s(ctx: _Ctx, entries: list[dict]) -> float:
    spans = [
        float(e["stopped"]) - float(e["started"])
        for e in entries
        if isinstance(e.get("started"), (int, float)) and isinstance(e.get("stopped"), (int, float))
    ]
    span = max(spans) / ctx.scale if spans and max(spans) > 0 else 20.0
    raw = span / 200.0
    exp = 10.0 ** math.floor(math.log10(raw))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw)


def flows_and_rates(run_dir, port: str, bin_s: float | None = None) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """:func:`flows` of one port and its :func:`flow_rates` in every direction, from one read
    of its pcap.

    Returns:
        ``(flows_frame, {"both": rates, "out": rates, "in": rates})``: the frames of
        :func:`flows` and :func:`flow_rates` (one per ``direction``; all three share the same
        bins, and a direction's frame has a column only for the flows with bytes in it).

    Raises:
        CaptureError, ValueError: as :func:`flow_rates`.
    """
    ctx = _context(run_dir)
    entries = _select(ctx, port)
    if bin_s is None:
        bin_s = _auto_bin_s(ctx, entries)
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    acc = []
    state = {"origin": None}

    def sink(chunk, scan):
        fid = chunk["fid"]
        idx = np.flatnonzero(fid >= 0)
        if not len(idx):
            return
        if state["origin"] is None:
            state["origin"] = ctx.t0 if ctx.t0 is not None else float(chunk["ts_ns"][idx].min()) / 1e9
        f = fid[idx]
        pdir = np.array(["", "in", "out"], dtype=object)[_port_dirs(scan, f, chunk["dir"][idx])]
        t = chunk["ts_ns"][idx] / 1e9
        k = np.floor((t - state["origin"]) / ctx.scale / bin_s).astype(np.int64)
        acc.append(
            pd.DataFrame({"bin": k, "flow": f, "dir": pdir, "bytes": chunk["iplen"][idx]})
            .groupby(["bin", "flow", "dir"], sort=False)["bytes"]
            .sum()
        )

    fl = _analyse(ctx, entries, sink_for=lambda e: sink)
    s = pd.concat(acc).groupby(level=[0, 1, 2]).sum() if acc else None
    out = {}
    for direction in ("both", "out", "in"):
        if s is None:
            rates = pd.DataFrame(index=pd.Index([], dtype="float64"))
        else:
            part = s if direction == "both" else s[s.index.get_level_values("dir") == direction]
            wide = part.groupby(level=["bin", "flow"]).sum().unstack("flow", fill_value=0)
            bins = s.index.get_level_values("bin")
            wide = wide.reindex(range(int(bins.min()), int(bins.max()) + 1), fill_value=0)
            rates = wide.astype("float64") / bin_s
            rates.index = np.round(rates.index.to_numpy(np.float64) * bin_s, 9)  # bin starts, to the ns
        rates.index.name = "time_s"
        rates.columns.name = "flow_id"
        rates.attrs.update(
            {"bin_s": bin_s, "direction": direction, "port": port, "t0": state["origin"], "unit": "bytes/s (emulated)"}
        )
        out[direction] = rates
    return fl[FLOW_COLUMNS], out


def flow_rates(run_dir, port: str, bin_s: float | None = None, direction: str = "both") -> pd.DataFrame:
    """Bytes per second of each flow on one port, over time (for a stacked rate plot).

    Args:
        run_dir: a run directory (or :class:`analysis.load.Run`) with a packet capture.
        port: a captured port.
        bin_s: bin width in emulated seconds; None picks 1, 2 or 5 x 10^k giving about 200
            bins over the port's capture (0.1 s when ``ports.json`` has no times).
        direction: ``both`` (every packet), ``out`` (packets leaving the switch through the
            port) or ``in`` (entering it); flows whose direction on the port is unknown
            (``fwd_on_port`` None) count only in ``both``.

    Returns:
        DataFrame indexed by ``time_s`` (start of each bin, emulated seconds from the run's
        ``t0``, see the module doc; every bin from the first to the last packet, empty ones
        0), one column per ``flow_id`` of :func:`flows` for that port, values in bytes/s of the
        emulated network (IP lengths in the bin / ``bin_s``). ``attrs``: ``bin_s``,
        ``direction``, ``port``, ``t0`` (unix s), ``unit``.

    Raises:
        CaptureError: no capture, or ``port`` not captured.
        ValueError: ``bin_s`` <= 0 or an unknown ``direction``.
    """
    if direction not in ("both", "in", "out"):
        raise ValueError(f"direction must be both, in or out, got {direction!r}")
    return flows_and_rates(run_dir, port, bin_s=bin_s)[1][direction]
