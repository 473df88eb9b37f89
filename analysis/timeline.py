"""Per-process, per-thread timeline of a run as a Chrome trace-event file (Perfetto, chrome://tracing).

Format (Trace Event Format, JSON object form): ``{"traceEvents": [...], "displayTimeUnit":
"ms", "otherData": {...}}``. Each event of ``events/*.jsonl`` becomes one complete event
``{"ph": "X", "name", "cat": kind, "ts", "dur", "pid", "tid", "args"}`` with ``ts``/``dur``
in microseconds from the run start (:attr:`analysis.load.Run.t0`). ``pid`` is 1 + the
process's rank (its position in processes.json), ``tid`` numbers the threads of a process
(``main`` first); ``M`` metadata events name them (``process_name``, ``thread_name``,
``process_sort_index``). Optionally, ``C`` counter events add each switch port's rates.

A charged host cost (event ``host_<kind>``, :mod:`traffic.runtime.hostcost`; ``kind`` one of
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
from traffic.runtime.hostcost import KINDS as HOST_COST_KINDS

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


def trace_events(run, include_rates: bool = False, rate_window_s: float = 0.1) -> list[dict]:
    """The trace events of a loaded run (see module doc).

    Args:
        run: :class:`analysis.load.Run`.
        include_rates: add one counter track per switch port (tx/rx Mbit/s).
        rate_window_s: averaging window of those counters (s).

    Returns:
        list of event dicts: metadata first, then one ``X`` event per recorded event.
    """
    t0 = run.t0 or 0.0
    ev = run.events
    order = {p["name"]: i for i, p in enumerate(run.processes.get("processes", []))}
    info = {p["name"]: p for p in run.processes.get("processes", [])}
    procs = sorted(set(ev["proc"].dropna().astype(str)) if not ev.empty else set(),
                   key=lambda n: (order.get(n, len(order)), n))
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
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid_of[n], "tid": 0,
                    "args": {"sort_index": pid_of[n]}})
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
        x = {"ph": "X", "name": name, "cat": kind, "pid": pid_of[n], "tid": tid_of[(n, th)],
             "ts": round((r["ts"] - t0) * 1e6, 3), "dur": round(max(0.0, _clean(r["dur"]) or 0.0) * 1e6, 3),
             "args": args}
        if kind.startswith("host_") and kind[len("host_"):] in HOST_COST_KINDS:
            over = bool(args.get("overrun"))
            x.update(cat=HOST_COST_CATEGORY, cname=OVERRUN_CNAME if over else HOST_COST_CNAME,
                     name=f"{name} OVERRUN" if over else name)
        out.append(x)
    if include_rates and not run.rates.empty:
        cpid = next_free
        out.append({"ph": "M", "name": "process_name", "pid": cpid, "tid": 0, "args": {"name": "switch ports (Mbit/s)"}})
        w = tr.windowed_rates(run.rates, rate_window_s)
        for row in w.itertuples(index=False):
            out.append({"ph": "C", "name": row.iface, "pid": cpid, "tid": 0, "ts": round((row.time - t0) * 1e6, 3),
                        "args": {"tx": round(row.tx_bps / 1e6, 3), "rx": round(row.rx_bps / 1e6, 3)}})
    return out


def write_timeline(run_dir, path=None, include_rates: bool = False) -> Path:
    """Write the run's timeline as Chrome trace-event JSON (open it in https://ui.perfetto.dev).

    Args:
        run_dir: the run directory.
        path: output file (default ``<run_dir>/timeline.json``).
        include_rates: also add switch-port rate counters.

    Returns:
        The path written.
    """
    run = load(run_dir)
    path = Path(path) if path is not None else run.path / "timeline.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"traceEvents": trace_events(run, include_rates), "displayTimeUnit": "ms",
           "otherData": {"run": run.name, "scheme": run.scheme, "t0_unix_s": run.t0}}
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path
