"""Per-process, per-thread timeline of a run as a Chrome trace-event file (Perfetto, chrome://tracing).

Format (Trace Event Format, JSON object form): ``{"traceEvents": [...], "displayTimeUnit":
"ms", "otherData": {...}}``. Each event of ``events/*.jsonl`` becomes one complete event
``{"ph": "X", "name", "cat": kind, "ts", "dur", "pid", "tid", "args"}`` with ``ts``/``dur``
in microseconds from the run start (:attr:`analysis.load.Run.t0`). ``pid`` is 1 + the
process's rank (its position in processes.json), ``tid`` numbers the threads of a process
(``main`` first); ``M`` metadata events name them (``process_name``, ``thread_name``,
``process_sort_index``).

Link rates (on by default): one process ``link rates (Mbit/s)`` whose ``C`` counter tracks
are each host link (``<host> link``: ``tx`` what the host sent, ``rx`` what it received; a
host with several links has ``<host> link <port>``) and each uplink (``uplink <tor>``: ``up``
ToR to core, ``down`` core to ToR), measured from the bwm-ng traces over windows of
``rate_window_s`` (emulated Mbit/s), so that spans, or their absence, line up with what the
links carried.

Scheduled events (spec ``events``, ``schedule.jsonl``): one process ``scheduled events``
with an instant event (``ph: i``) per event applied, named by :func:`event_name` (``#0
uplink:tor1 50 Mbit/s``), ``args`` its record.

A charged host cost (event ``host_<kind>``, :mod:`traffic.hostmodel.costs`; ``kind`` one of
its ``KINDS``) is a span of category ``host_cost`` on the thread that charged it, named
``host_<kind>``, with ``cname`` :data:`HOST_COST_CNAME`; one whose real work overran its
dilated budget (``overrun`` true) is named ``host_<kind> OVERRUN`` and coloured
:data:`OVERRUN_CNAME`. ``args`` keep the event's fields (``emulated_s``, ``real_s``,
``overrun``, ``bytes``, ``iteration`` ...).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from analysis import traces as tr
from analysis.load import load
from common.errors import TestbedError
from traffic.hostmodel.costs import KINDS as HOST_COST_KINDS


class NoEvents(TestbedError):
    """A run without any recorded event: it has no timeline."""


_BASE_FIELDS = {"proc", "role", "rank", "thread", "kind", "ts", "dur"}

#: category of the host-cost spans
HOST_COST_CATEGORY = "host_cost"
#: trace-viewer colour (a name of its fixed palette) of a host-cost span within its budget
HOST_COST_CNAME = "generic_work"
#: ... and of one whose real work overran its budget (red)
OVERRUN_CNAME = "terrible"


def _clean(v):
    """JSON-safe scalar (NaN -> None, numpy -> python)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def event_name(rec: dict) -> str:
    """``#<index> <what>`` of a scheduled event's record (e.g. ``#0 uplink:tor1 50 Mbit/s``)."""
    kind, target = rec.get("kind"), rec.get("target")
    what = {
        "link_rate": f"{target} {rec.get('bw_mbps', 0):g} Mbit/s",
        "link_down": f"{target} down",
        "link_up": f"{target} up",
        "compute_slowdown": f"{target} x{rec.get('slowdown', 0):g} compute",
        "kill": f"kill {target}",
    }.get(kind, f"{kind} {target}")
    return f"#{rec.get('index')} {what}" + (" FAILED" if rec.get("error") else "")


def link_tracks(ports) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """The counter tracks of the links: ``(track name, switch port, [(counter, rate column of
    the port)])`` per host link and per uplink (at its ToR end), from
    :func:`analysis.load.port_table`."""
    out = []
    if ports.empty:
        return out
    host_ports = ports[ports["link_class"] == "host"]
    several = host_ports["host"].value_counts()
    for _, p in host_ports.iterrows():
        name = f"{p['host']} link" + (f" {p['iface']}" if several.get(p["host"], 0) > 1 else "")
        out.append((name, p["iface"], [("tx", "rx_bps"), ("rx", "tx_bps")]))  # the host's tx is the port's rx
    for _, p in ports[ports["tor_side"]].iterrows():
        out.append((f"uplink {p['switch']}", p["iface"], [("up", "tx_bps"), ("down", "rx_bps")]))
    return out


def trace_events(run, include_rates: bool = True, rate_window_s: float = 0.1) -> list[dict]:
    """The trace events of a loaded run (see module doc).

    Args:
        run: :class:`analysis.load.Run`.
        include_rates: add the counter tracks of every host link and uplink (Mbit/s; a run
            without a topology gets one per sampled switch port, ``tx``/``rx`` as the port sees
            them).
        rate_window_s: averaging window of those counters (s).

    Returns:
        list of event dicts: metadata first, then one ``X`` event per recorded event, then
        the scheduled events' ``i`` events and the ``C`` counters.
    """
    t0 = run.t0 or 0.0
    ev = run.events
    order = {p["name"]: i for i, p in enumerate(run.processes.get("processes", []))}
    info = {p["name"]: p for p in run.processes.get("processes", [])}
    procs = sorted(
        set(ev["proc"].dropna().astype(str)) if not ev.empty else set(), key=lambda n: (order.get(n, len(order)), n)
    )
    pid_of = {}
    next_free = len(order) + 1
    for n in procs:
        if n in order:
            pid_of[n] = order[n] + 1
        else:
            pid_of[n] = next_free
            next_free += 1
    out: list[dict] = []
    tid_of: dict[tuple[str, str], int] = {}
    for n in procs:
        p = info.get(n, {})
        label = n + (f" ({p.get('role')} on {p.get('host')})" if p else "")
        out.append({"ph": "M", "name": "process_name", "pid": pid_of[n], "tid": 0, "args": {"name": label}})
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid_of[n], "tid": 0, "args": {"sort_index": pid_of[n]}}
        )
        threads = ev.loc[ev["proc"] == n, "thread"].fillna("main").astype(str).unique()
        for i, t in enumerate(sorted(threads, key=lambda t: (t != "main", t))):
            tid_of[(n, t)] = i + 1
            out.append({"ph": "M", "name": "thread_name", "pid": pid_of[n], "tid": i + 1, "args": {"name": t}})
    extra = [c for c in ev.columns if c not in _BASE_FIELDS]
    for r in ev.to_dict("records"):
        if r["proc"] is None or (isinstance(r["ts"], float) and math.isnan(r["ts"])):
            continue
        n, th = str(r["proc"]), str(r["thread"]) if isinstance(r["thread"], str) else "main"
        kind = str(r["kind"])
        layer = _clean(r.get("layer"))
        name = kind if layer is None else f"{kind} L{int(layer)}"
        args = {k: _clean(r[k]) for k in extra}
        args = {k: v for k, v in args.items() if v is not None}
        x = {
            "ph": "X",
            "name": name,
            "cat": kind,
            "pid": pid_of[n],
            "tid": tid_of[(n, th)],
            "ts": round((r["ts"] - t0) * 1e6, 3),
            "dur": round(max(0.0, _clean(r["dur"]) or 0.0) * 1e6, 3),
            "args": args,
        }
        if kind.startswith("host_") and kind[len("host_") :] in HOST_COST_KINDS:
            over = bool(args.get("overrun"))
            x.update(
                cat=HOST_COST_CATEGORY,
                cname=OVERRUN_CNAME if over else HOST_COST_CNAME,
                name=f"{name} OVERRUN" if over else name,
            )
        out.append(x)
    applied = [r for r in getattr(run, "schedule", []) if r.get("applied") and r.get("time") is not None]
    if applied:
        spid = next_free
        next_free += 1
        out.append({"ph": "M", "name": "process_name", "pid": spid, "tid": 0, "args": {"name": "scheduled events"}})
        out.append({"ph": "M", "name": "thread_name", "pid": spid, "tid": 1, "args": {"name": "events"}})
        for r in applied:
            out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": event_name(r),
                    "cat": "scheduled_event",
                    "pid": spid,
                    "tid": 1,
                    "ts": round((float(r["time"]) - t0) * 1e6, 3),
                    "args": {k: _clean(v) for k, v in r.items() if k != "time"},
                }
            )
    if include_rates and not run.rates.empty:
        cpid = next_free
        w = tr.windowed_rates(run.rates, rate_window_s)
        tracks = link_tracks(run.ports())
        if not tracks:  # no topology: every sampled port as it sees itself
            tracks = [(i, i, [("tx", "tx_bps"), ("rx", "rx_bps")]) for i in sorted(w["iface"].unique())]
        out.append({"ph": "M", "name": "process_name", "pid": cpid, "tid": 0, "args": {"name": "link rates (Mbit/s)"}})
        by_port = {i: g for i, g in w.groupby("iface")}
        for name, iface, counters in tracks:
            g = by_port.get(iface)
            if g is None:
                continue
            for row in g.to_dict("records"):
                out.append(
                    {
                        "ph": "C",
                        "name": name,
                        "pid": cpid,
                        "tid": 0,
                        "ts": round((row["time"] - t0) * 1e6, 3),
                        "args": {c: round(row[col] / 1e6, 3) for c, col in counters},
                    }
                )
    return out


def write_timeline(run_dir, path=None, include_rates: bool = True) -> Path:
    """Write the run's timeline as Chrome trace-event JSON (open it in https://ui.perfetto.dev).

    Args:
        run_dir: the run directory.
        path: output file (default ``<run_dir>/timeline.json``).
        include_rates: add the host links' and uplinks' rate counters (see the module doc).

    Returns:
        The path written.

    Raises:
        NoEvents: the run recorded no event (``events/*.jsonl`` empty or absent: its processes
            never started, or a program marked nothing); nothing is written.
    """
    run = load(run_dir)
    if run.events.empty:
        raise NoEvents(
            f"{run.path} has no events (events/*.jsonl is empty or absent: its processes never started "
            f"or recorded nothing), so there is no timeline to draw; see 'testbed show {run.path}'"
        )
    path = Path(path) if path is not None else run.path / "timeline.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "traceEvents": trace_events(run, include_rates),
        "displayTimeUnit": "ms",
        "otherData": {"run": run.name, "scheme": run.scheme, "t0_unix_s": run.t0},
    }
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path
