"""A run directory -> one :class:`Run` of pandas frames and dicts (no live network needed).

Every file is optional: a run that failed early still loads, with empty frames (with their
columns) and empty dicts for what it did not write.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis import traces as tr
from common.provenance import PROVENANCE_FILE
from common.validation import load_yaml
from traffic.rundir import SWEEP_RENAMED
from traffic.summary import SUMMARY_FILE, RunSummary

log = logging.getLogger(__name__)

EVENT_COLUMNS = ["proc", "role", "rank", "thread", "kind", "ts", "dur", "iteration", "layer", "bytes", "peer"]
ITERATION_COLUMNS = ["iteration", "worker", "start", "end", "duration_s", "samples"]
PORT_COLUMNS = [
    "iface",
    "switch",
    "switch_role",
    "peer",
    "peer_is_host",
    "link_class",
    "rack",
    "bw_mbps",
    "host",
    "tor_side",
]


@dataclass
class Run:
    """Everything recorded in one run directory.

    Frames (all times are unix seconds; ``t0`` converts them to "seconds from run start"; a
    run with time dilation ``scale`` != 1 is converted to the emulated network's time, see
    :func:`to_emulated_time`):

    ``traces``
        bwm-ng samples, one row per (sample, switch port): ``time``, ``iface``, ``bytes_in``,
        ``bytes_out``, ``packets_in``, ``packets_out``, ``errors_in``, ``errors_out``
        (per-sample deltas, from the port's point of view: ``out`` leaves the switch).
    ``rates``
        from ``traces`` (see :func:`analysis.traces.rates`): ``time``, ``iface``, ``dt_s``,
        ``tx_bytes``, ``rx_bytes``, ``tx_bps``, ``rx_bps`` (bits/s).
    ``qdisc``
        ``time``, ``iface``, ``qdisc``, ``backlog_bytes``, ``backlog_packets``, ``drops``,
        ``overlimits``, ``sent_bytes``, ``sent_packets`` (see :mod:`testbed.capture`).
    ``cpu``
        ``time``, ``kind`` (``core``/``proc``), ``id`` (str: core index or process name),
        ``busy_pct``.
    ``memory``
        ``time``, ``kind`` (``machine``/``proc``), ``id`` (str: ``used`` or a process name;
        ``<machine>:`` before it in a cluster run), ``bytes`` (see
        :mod:`testbed.capture.memory`). Its times are unix seconds as written, never
        converted under dilation (memory is a wall-clock matter), and do not count in
        :attr:`t0`: the first sample precedes the network's build.
    ``events``
        every line of ``events/*.jsonl``, sorted by ``ts``: at least the columns
        ``proc, role, rank, thread, kind, ts, dur, iteration, layer, bytes, peer`` plus any
        extra fields (``samples``, ``accuracy``, ...); missing values are NaN.
    ``iterations``
        ``iterations.csv`` (or, if absent, derived from the events): ``iteration``,
        ``worker`` (process name), ``start``, ``end`` (unix s), ``duration_s``, ``samples``.

    Dicts: ``spec`` (resolved spec.yaml), ``topology``, ``processes``, ``results`` (``{proc:
    results/<proc>.json}``).

    ``summary``
        ``summary.json`` (:class:`~traffic.summary.RunSummary`); None when the run has none
        or it cannot be read.

    ``schedule``
        the scheduled events as the harness recorded them (``schedule.jsonl``,
        :mod:`testbed.event_applier`), in the order applied, each with ``time``: its ``ts`` on the
        frames' clock (emulated under dilation; None for an event never reached).

    What the harness recorded of the effects the spec asked for (formats in
    :mod:`traffic.rundir`; empty when the run did not write the file): ``background``
    (``traces/background/flows.json``), ``pcap`` (``traces/pcap/ports.json``, one entry per
    port), ``exits`` (``logs/exits.json``: each process's exit status) and ``shaping``
    (``shaping.json``: the build's read-back verdict).

    ``provenance``
        ``provenance.json`` as written when the run started (the mapping of
        :class:`common.provenance.Provenance`); {} for a run without one.
    """

    path: Path
    spec: dict = field(default_factory=dict)
    topology: dict = field(default_factory=dict)
    processes: dict = field(default_factory=dict)
    summary: RunSummary | None = None
    results: dict = field(default_factory=dict)
    traces: pd.DataFrame = field(default_factory=pd.DataFrame)
    rates: pd.DataFrame = field(default_factory=pd.DataFrame)
    qdisc: pd.DataFrame = field(default_factory=pd.DataFrame)
    cpu: pd.DataFrame = field(default_factory=pd.DataFrame)
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    iterations: pd.DataFrame = field(default_factory=pd.DataFrame)
    schedule: list = field(default_factory=list)
    background: dict = field(default_factory=dict)
    pcap: list = field(default_factory=list)
    exits: dict = field(default_factory=dict)
    shaping: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The run id (directory name)."""
        return self.path.name

    @property
    def scheme(self) -> str | None:
        """``workload.scheme`` of the spec, or the summary's ``scheme``."""
        return (self.spec.get("workload") or {}).get("scheme") or (self.summary.scheme if self.summary else None)

    @property
    def t0(self) -> float | None:
        """Run start, unix s: the earliest timestamp recorded (capture starts before the
        processes, so normally bwm-ng's first sample). None if nothing was recorded."""
        cands = []
        for df, col in ((self.traces, "time"), (self.events, "ts"), (self.cpu, "time"), (self.qdisc, "time")):
            if not df.empty and col in df:
                v = pd.to_numeric(df[col], errors="coerce").min()
                if pd.notna(v):
                    cands.append(float(v))
        return min(cands) if cands else None

    @property
    def scale(self) -> float:
        """Time dilation of the run: ``spec.scale`` (1 without one)."""
        return float(self.spec.get("scale") or 1.0)

    @property
    def measured_span(self) -> tuple[int, int | None]:
        """The iteration numbers measured: :func:`measured_span` of its spec and summary."""
        return measured_span(self.spec, self.summary)

    def on_clock(self, ts) -> float | None:
        """A unix timestamp the harness wrote (``time.time()``) on the frames' clock:
        :func:`to_emulated_time`'s ``t0 + (ts - t0) / scale``, t0 being :attr:`t0` (which the
        conversion keeps where it was); ``ts`` itself without any frame; None when ``ts`` is
        not a number."""
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            return None
        t0 = self.t0
        return float(ts) if t0 is None else t0 + (float(ts) - t0) / self.scale

    def worker_hosts(self) -> list[str]:
        """Hosts of the worker processes, in rank order (from processes.json)."""
        out = []
        for p in self.processes.get("processes", []):
            if p.get("role") == "worker" and p.get("host") not in out:
                out.append(p.get("host"))
        return out

    def ports(self) -> pd.DataFrame:
        """The sampled switch ports with their links (see :func:`port_table`)."""
        return port_table(self.topology)

    def shaped_rate(self, iface: str) -> pd.Series:
        """The rate the kernel was read back to shape ``iface`` at, over the run.

        The build's read-back (``topology.json``: the link's ``shaping[iface].rate_mbps``), then
        each applied ``link_rate`` event's read-back of that interface (``schedule.jsonl``:
        ``readback_mbps``), both rates of this machine converted to the emulated network's by the
        dilation (``topology.json`` ``scale``, else :attr:`scale`).

        Returns:
            Mbit/s (emulated), indexed by the time from which it held (unix s on the frames'
            clock; the build's read-back at :attr:`t0`), in time order; empty when nothing of
            ``iface`` was read back (e.g. a loopback or archived run).
        """
        scale, t0 = float(self.topology.get("scale") or self.scale), self.t0
        points = []
        for link in self.topology.get("links", []):
            got = ((link.get("shaping") or {}).get(iface) or {}).get("rate_mbps")
            if isinstance(got, (int, float)) and t0 is not None:
                points.append((t0, float(got) * scale))
        for rec in self.schedule:
            got = (rec.get("readback_mbps") or {}).get(iface) if rec.get("applied") else None
            if isinstance(got, (int, float)) and rec.get("time") is not None:
                points.append((float(rec["time"]), float(got) * scale))
        points.sort(key=lambda p: p[0])
        return pd.Series([v for _, v in points], index=[t for t, _ in points], dtype="float64")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        if path.exists():
            log.warning("cannot read %s: %s", path, e)
        return {}


def _read_object(path: Path) -> dict:
    """:func:`_read_json` of a file holding a JSON object ({} for anything else)."""
    doc = _read_json(path)
    return doc if isinstance(doc, dict) else {}


def measured_span(spec: dict, summary: RunSummary | None = None) -> tuple[int, int | None]:
    """Which iteration numbers of a run were measured: ``(first, stop)``, iterations
    ``first <= i < stop`` (``stop`` None: all from ``first`` on), iterations numbered from 0.

    ``first`` is the warm-up: ``summary.warmup_iterations`` when the spec asks for a warm-up
    until steady (``workload.max_warmup_iterations``; the summary records the one chosen, else
    the most), else ``workload.warmup_iterations``; ``stop`` is ``first + iterations -
    max_warmup_iterations`` then.

    Args:
        spec: the run's resolved ``spec.yaml`` (a dict).
        summary: its :class:`traffic.summary.RunSummary`, or None.
    """
    wl = (spec or {}).get("workload") or {}
    most = wl.get("max_warmup_iterations")
    if most is None:
        return int(wl.get("warmup_iterations") or 0), None
    first = summary.warmup_iterations if summary is not None and summary.warmup_iterations is not None else most
    return int(first), int(first) + int(wl.get("iterations") or 0) - int(most)


def in_span(iteration: pd.Series, span: tuple[int, int | None]) -> pd.Series:
    """Which of the iteration numbers ``iteration`` lie in ``span`` (:func:`measured_span`)."""
    first, stop = span
    inside = iteration >= first
    return inside if stop is None else inside & (iteration < stop)


def _read_summary(run_dir: Path) -> RunSummary | None:
    try:
        return RunSummary.load(run_dir / SUMMARY_FILE)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("cannot read %s: %s", run_dir / SUMMARY_FILE, e)
        return None


def _read_yaml(path: Path) -> dict:
    try:
        return load_yaml(path.read_text(), source=str(path)) or {}
    except (OSError, yaml.YAMLError) as e:
        if path.exists():
            log.warning("cannot read %s: %s", path, e)
        return {}


def read_events(run_dir: str | Path) -> pd.DataFrame:
    """All ``events/*.jsonl`` of a run as one frame sorted by ``ts`` (see :class:`Run`).

    Lines that are not JSON objects (a process killed mid-line) are skipped.
    """
    rows = []
    for f in sorted(Path(run_dir, "events").glob("*.jsonl")):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                obj.setdefault("proc", f.stem)
                rows.append(obj)
    df = pd.DataFrame(rows)
    for c in EVENT_COLUMNS:
        if c not in df:
            df[c] = pd.Series(dtype=object if c in ("proc", "role", "thread", "kind") else "float64")
    if not df.empty:
        for c in ("ts", "dur"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        df["dur"] = df["dur"].fillna(0.0)
        df = df.sort_values("ts", kind="stable").reset_index(drop=True)
    return df


def read_schedule(run_dir: str | Path) -> list[dict]:
    """The records of ``schedule.jsonl`` (one JSON object per line; lines that are not
    JSON objects, e.g. cut by a crash, are skipped); empty without the file."""
    try:
        text = Path(run_dir, "schedule.jsonl").read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def port_table(topology: dict) -> pd.DataFrame:
    """One row per switch-side interface of ``topology.json`` (what bwm-ng samples).

    Columns: ``iface``, ``switch`` (its node), ``switch_role`` (``tor``/``core``/...),
    ``peer`` (node at the other end), ``peer_is_host``, ``link_class`` (``host``/``uplink``),
    ``rack``, ``bw_mbps`` (configured), ``host`` (the host of a host link, else None),
    ``tor_side`` (True for the ToR end of an uplink). For a host link, the port's ``out``
    is the host's rx and its ``in`` the host's tx.
    """
    switches = {s.get("name"): s for s in topology.get("switches", [])}
    hosts = {h.get("name") for h in topology.get("hosts", [])}
    rows = []
    for link in topology.get("links", []):
        ends = [
            (link.get("node1"), link.get("intf1"), link.get("node2")),
            (link.get("node2"), link.get("intf2"), link.get("node1")),
        ]
        sw_ends = [e for e in ends if e[0] in switches]
        tor_end = None
        if link.get("class") == "uplink" and sw_ends:
            tors = [e for e in sw_ends if (switches[e[0]].get("role") or "") == "tor"]
            tor_end = (tors or sw_ends)[0]
        for node, intf, peer in sw_ends:
            rows.append(
                {
                    "iface": intf,
                    "switch": node,
                    "switch_role": switches[node].get("role"),
                    "peer": peer,
                    "peer_is_host": peer in hosts,
                    "link_class": link.get("class"),
                    "rack": link.get("rack"),
                    "bw_mbps": link.get("bw_mbps"),
                    "host": peer if peer in hosts else None,
                    "tor_side": tor_end is not None and tor_end[1] == intf,
                }
            )
    return pd.DataFrame(rows, columns=PORT_COLUMNS)


def to_emulated_time(scale: float, traces, qdisc, cpu, events):
    """Convert a dilated run's clocks to the emulated network's time.

    With time dilation s (``spec.scale``) the run happened s times slower than the emulated
    network; every timestamp t becomes ``t0 + (t - t0) / s`` (t0: the earliest timestamp of
    the run) and every duration d becomes ``d / s``. Rates computed afterwards from byte
    counts are then in the emulated network's units (s times the rates shaped here).
    """
    starts = [
        pd.to_numeric(df[c], errors="coerce").min()
        for df, c in ((traces, "time"), (qdisc, "time"), (cpu, "time"), (events, "ts"))
        if not df.empty and c in df
    ]
    starts = [v for v in starts if pd.notna(v)]
    if not starts:
        return traces, qdisc, cpu, events
    t0 = float(min(starts))
    out = []
    for df, col in ((traces, "time"), (qdisc, "time"), (cpu, "time"), (events, "ts")):
        if not df.empty and col in df:
            df = df.copy()
            df[col] = t0 + (pd.to_numeric(df[col], errors="coerce") - t0) / scale
            if col == "ts":
                for c in ("dur", "requested_s"):
                    if c in df:
                        df[c] = pd.to_numeric(df[c], errors="coerce") / scale
        out.append(df)
    return tuple(out)


def load(run_dir: str | Path) -> Run:
    """Load a run directory (see :mod:`traffic.rundir` for the layout).

    Args:
        run_dir: the directory of one run.

    Returns:
        :class:`Run`; missing files give empty frames/dicts, never an exception.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
    """
    p = Path(run_dir)
    if not p.is_dir():
        raise FileNotFoundError(f"{p} is not a run directory")
    traces = tr.parse_bwm_ng(p / "traces" / "bwm-ng.csv")
    qdisc = tr.read_table(p / "traces" / "qdisc.csv", tr.QDISC_COLUMNS)
    cpu = tr.read_table(p / "traces" / "cpu.csv", tr.CPU_COLUMNS)
    if not cpu.empty:
        cpu["id"] = cpu["id"].astype(str)
        cpu["busy_pct"] = pd.to_numeric(cpu["busy_pct"], errors="coerce")
    memory = tr.read_table(p / "traces" / "memory.csv", tr.MEMORY_COLUMNS)
    if not memory.empty:
        memory["id"] = memory["id"].astype(str)
        memory["bytes"] = pd.to_numeric(memory["bytes"], errors="coerce")
    events = read_events(p)
    spec = _read_yaml(p / "spec.yaml")
    scale = float(spec.get("scale") or 1.0)
    if scale != 1.0:
        traces, qdisc, cpu, events = to_emulated_time(scale, traces, qdisc, cpu, events)
    results = {f.stem: _read_json(f) for f in sorted((p / "results").glob("*.json"))}
    processes = _read_json(p / "processes.json")
    if (p / "iterations.csv").is_file():
        iterations = tr.read_table(p / "iterations.csv", ITERATION_COLUMNS)
    else:
        iterations = iteration_table(events)
    run = Run(
        path=p,
        spec=spec,
        topology=_read_json(p / "topology.json"),
        processes=processes,
        summary=_read_summary(p),
        results=results,
        traces=traces,
        rates=tr.rates(traces),
        qdisc=qdisc,
        cpu=cpu,
        memory=memory,
        events=events,
        iterations=iterations,
    )
    run.schedule = read_schedule(p)
    for rec in run.schedule:
        rec["time"] = run.on_clock(rec.get("ts"))
    run.background, run.exits, run.shaping, run.provenance = (
        _read_object(p / f)
        for f in (
            Path("traces", "background", "flows.json"),
            Path("logs", "exits.json"),
            Path("shaping.json"),
            Path(PROVENANCE_FILE),
        )
    )
    pcap = _read_json(p / "traces" / "pcap" / "ports.json")
    run.pcap = [e for e in pcap if isinstance(e, dict)] if isinstance(pcap, list) else []
    return run


def read_sweep_csv(path: str | Path, **read_csv) -> pd.DataFrame:
    """A sweep's ``sweep.csv`` (:func:`pandas.read_csv` with the options ``read_csv``), its
    columns under their names in :data:`traffic.rundir.SWEEP_FIGURES`: a column of an older
    file (:data:`traffic.rundir.SWEEP_RENAMED`) is renamed when the file lacks the new one.

    Raises:
        OSError: the file cannot be read; pandas' errors: it is not CSV.
    """
    df = pd.read_csv(path, **read_csv)
    return df.rename(
        columns={old: new for old, new in SWEEP_RENAMED.items() if old in df.columns and new not in df.columns}
    )


def iteration_table(events: pd.DataFrame) -> pd.DataFrame:
    """Per-worker iterations from the "iteration" events of role ``worker``.

    Returns:
        DataFrame sorted by (iteration, worker): ``iteration`` (int), ``worker`` (process
        name), ``start``, ``end`` (unix s), ``duration_s``, ``samples`` (the worker's batch).
    """
    if events.empty or "kind" not in events:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "worker" else "float64") for c in ITERATION_COLUMNS})
    ev = events[(events["kind"] == "iteration") & (events["role"] == "worker") & events["iteration"].notna()]
    samples = ev["samples"] if "samples" in ev else pd.Series(np.nan, index=ev.index)
    df = pd.DataFrame(
        {
            "iteration": ev["iteration"].astype(int),
            "worker": ev["proc"].astype(str),
            "start": ev["ts"],
            "end": ev["ts"] + ev["dur"],
            "duration_s": ev["dur"],
            "samples": pd.to_numeric(samples, errors="coerce"),
        }
    )
    return df.sort_values(["iteration", "worker"], kind="stable").reset_index(drop=True)
