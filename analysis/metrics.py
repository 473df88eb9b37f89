"""Headline figures of a run: throughput, iteration times, bytes per link class, accuracy,
CPU headroom and fidelity flags, as a :class:`traffic.summary.RunSummary` built section by
section (:func:`compute_summary`). :func:`summarize` is what the harness calls after every run.

Definitions (all documented again in ``summary.json``'s ``*method`` fields):

* **Iteration time** of iteration *i*: from the completion of iteration *i - 1* to that of
  *i*, an iteration's completion being the latest ``end`` (``ts + dur``) of any worker's
  "iteration" event of it (the first iteration: from its earliest worker start). This is how
  often the whole job advances one global step: a straggler counts, and so do the gaps
  between iterations. It is not the span of an iteration (earliest worker start to latest
  end, ``span_s``): when workers run out of step, or a scheme overlaps one iteration with the
  next (Pipe-SGD, P3, a parameter server with overlap), consecutive spans overlap and a span
  is longer than the job's period (measured: MXNet CS on 8 PHub workers, spans 0.78-0.87 s
  where each worker's iterations took 0.52-0.79 s, its workers starting up to 0.28 s apart).
* **Throughput** of iteration *i*: the samples of all workers in *i* (the global batch)
  divided by its iteration time. The summary gives the mean over post-warm-up iterations,
  ``spread95`` = 1.96 x the standard deviation (numpy's ``std``, ddof=0), as Horovod's
  synthetic benchmark prints ``img/sec per X: mean +- 1.96 * std`` (a spread of the
  iterations, not an uncertainty of the mean), and the 95 % confidence interval of the mean
  ``[mean_ci95_low, mean_ci95_high]`` (:func:`mean_interval`: Student's t over the
  per-iteration throughputs). Only iterations reported by every worker count.
  ``throughput.overall`` is all measured samples over the sum of their iteration times (the
  completion of the iteration before the first measured to that of the last measured, when
  no iteration is missing).
* **Provenance**: ``provenance`` is the run's ``provenance.json`` (the code, software and
  machine, written when the run started: :mod:`common.provenance`), None without one.
* **Warm-up**: the ``workload.warmup_iterations`` smallest iteration numbers are skipped.
  With ``workload.max_warmup_iterations`` (warm up until steady), the fewest from
  ``warmup_iterations`` to that many after which the next ``iterations -
  max_warmup_iterations`` had settled (:func:`settled_warmup`), and only those are measured.
* **Bytes** come from the bwm-ng samples of the switch ports (see :mod:`traffic.rundir`): a host's tx is
  the rx of the switch port of its host link, its rx that port's tx; host links total = both
  directions of all host links; uplinks total = both directions of all ToR-core uplinks
  (measured at the ToR end); core = sum of tx of the ToR uplink ports (each byte that crossed
  the core counted once). Totals are over the whole capture; ``bytes_per_iteration`` divides
  the bytes of the measured window by the number of measured iterations. With background
  flows (spec ``background``) the core also carries theirs: ``core_background`` is the
  host-link tx of the background hosts (data and ACKs alike cross the core when every flow
  runs between background hosts of different racks) and ``core_training`` = core -
  core_background; both None when a flow touches a training host or stays in one rack.
  Background packets dropped at a ToR's uplink queue count as background bytes, so
  ``core_training`` is low by that much (iperf3's retransmits in flows.json bound it).
  ``bytes_per_iteration.worker_link``: tx + rx of the link(s) of a host running a worker,
  mean over those hosts (PHub Sec. 4.4: what each worker's interface moves).
* **CPU**: idle % = 100 - busy % per core; averaged over the measured window (post-warm-up
  iterations, or the whole capture if there are none). ``min_idle_pct`` is the lowest 1-s
  mean of the all-core idle %. ``cpu_starved`` when the mean idle % < 35 (Mininet-HiFi keeps
  at least 35 % idle so that emulated links keep their rates). A run spread over several
  machines (``cluster.json``) is judged per machine: ``cpu_starved`` when some machine's mean
  idle % < 35 (None when none is and a machine has no samples); the top-level figures are
  the worst machine's.
* **Memory** (``traces/memory.csv``, :mod:`testbed.capture.memory`): a machine's used memory
  (``total - available``) at its first sample, taken just before the network is built, its
  peak over every sample until the teardown, and the growth (peak - start); each training
  process's peak USS, and over processes their median, max and sum. A run spread over several
  machines has them per machine (its start read over SSH before the build); the top-level
  machine figures are those of the machine that grew most, the USS figures over every process.
* **Shaping check**: the highest rate of each link direction over windows of
  ``max(0.1 s, 5 samples)``, against the configured ``bw_mbps``; more than 10 % above means
  the shaping failed. (A link whose rate a scheduled event raised is checked against its
  build-time rate.)
* **Scheduled events** (spec ``events``, ``schedule.jsonl``): ``events`` lists the records
  of the events applied (``events_not_reached`` those whose trigger never came);
  ``segments`` splits the measured iterations at each event applied without error: an event
  applied when the global iteration count was N (every worker had finished N - 1) opens a
  segment of the iterations from N on; per segment, its measured iterations' throughput
  (mean per iteration and overall, as above) and iteration time (mean, p95), and when its
  events were applied (``start_s``/``end_s``, emulated seconds since the measured window
  began, at the completion of the last warm-up iteration; null: open-ended).
* **No iterations**: a run whose workers recorded no ``iteration`` event (a program that
  marks none) says so in ``iterations_note``; its iteration figures are null.
* **Effects asked for** (:mod:`analysis.effects`, which states the rule and each check):
  ``fidelity.effects`` judges every effect the spec asked for (background flows, packet
  captures, scheduled events, processes, shaping, delay and loss) from the run's files;
  ``fidelity.unverified`` lists those not done, and a run the harness ended ``ok`` with one
  is ``failed`` (``error``: ``asked for but not done:`` and those lines), every figure kept.
"""

from __future__ import annotations

import json
import math
import signal
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis import effects
from analysis import traces as tr
from analysis.load import ITERATION_COLUMNS, Run, iteration_table, load, port_table  # noqa: F401 (iteration_table: re-exported)
from common.provenance import Provenance
from traffic.hostmodel.costs import OVERRUN_THRESHOLD
from traffic.rundir import read_spec
from traffic.summary import (
    Bytes,
    BytesPerIteration,
    Cpu,
    Fidelity,
    HostCost,
    IterationTime,
    Memory,
    RateCheck,
    RunSummary,
    Segment,
    Throughput,
)

CPU_IDLE_RULE = "Mininet-HiFi: keep >= 35% CPU idle"
#: ``fidelity.rule`` of a run spread over several machines
CPU_IDLE_RULE_CLUSTER = "Mininet-HiFi: keep >= 35% CPU idle on every machine"
MIN_IDLE_PCT = 35.0
#: the machine of the unprefixed core rows of a cluster run's ``cpu.csv``
CONTROLLER = "controller"
#: the process rows each machine's capture writes about itself (testbed.capture.merge.MACHINE_PROCS)
_MACHINE_PROCS = ("bwm-ng", "harness")
RATE_TOLERANCE = 0.10


def _f(x):
    """JSON-friendly float (None for NaN/None)."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def _i(x):
    return None if _f(x) is None else int(x)


# ----------------------------------------------------------------------------- iterations


def global_iterations(iters: pd.DataFrame, workers: int | None = None) -> pd.DataFrame:
    """One row per iteration across workers (see the module doc: *Iteration time*).

    Args:
        iters: :func:`iteration_table`.
        workers: expected number of workers; iterations with fewer are marked incomplete
            (default: the most workers seen in any iteration).

    Returns:
        DataFrame, in iteration order: ``iteration``, ``start`` (earliest worker start),
        ``end`` (latest worker end: the iteration's completion), ``span_s`` (end - start, s),
        ``period_start`` (the previous iteration's completion; the first iteration's own
        start), ``time_s`` (the iteration time: end - period_start, s), ``samples`` (sum over
        workers), ``workers`` (count), ``complete`` (bool), ``samples_per_s`` (samples / time_s).
    """
    cols = [
        "iteration",
        "start",
        "end",
        "span_s",
        "period_start",
        "time_s",
        "samples",
        "workers",
        "complete",
        "samples_per_s",
    ]
    if iters.empty:
        return pd.DataFrame(columns=cols)
    g = iters.groupby("iteration").agg(
        start=("start", "min"), end=("end", "max"), samples=("samples", "sum"), workers=("worker", "nunique")
    )
    g = g.reset_index().sort_values("iteration", ignore_index=True)
    g["span_s"] = g["end"] - g["start"]
    g["period_start"] = g["end"].shift().fillna(g["start"])
    g["time_s"] = g["end"] - g["period_start"]
    want = workers or int(g["workers"].max())
    g["complete"] = g["workers"] >= want
    g["samples_per_s"] = np.where(g["time_s"] > 0, g["samples"] / g["time_s"].where(g["time_s"] > 0), np.nan)
    return g[cols]


def measured_iterations(glob: pd.DataFrame, warmup: int, count: int | None = None) -> pd.DataFrame:
    """Complete iterations after skipping the ``warmup`` smallest iteration numbers, of the
    next ``count`` iteration numbers (None: of all the rest)."""
    if glob.empty:
        return glob
    order = sorted(glob["iteration"])
    w = max(0, int(warmup))
    keep = set(order[w:] if count is None else order[w : w + max(0, int(count))])
    return glob[glob["iteration"].isin(keep) & glob["complete"]]


def settled_warmup(glob: pd.DataFrame, least: int, most: int, count: int) -> int:
    """Warm up until steady (``workload.max_warmup_iterations``): the fewest warm-up
    iterations ``w``, from ``least`` to ``most``, after which the next ``count`` iterations
    had settled: :func:`iteration_drift` of ``measured_iterations(glob, w, count)`` passes
    :func:`steady`. It is the window a run would measure had it stopped as soon as its last
    ``count`` iterations were steady (at least ``least`` warm-up first).

    Args:
        glob: :func:`global_iterations`.
        least, most: the fewest and the most warm-up iterations, ``0 <= least <= most``.
        count: measured iterations, at least 4 for the rule to be tested.

    Returns:
        ``w``; ``most`` when no window settled (the scoreboard then finds the run not steady).
    """
    for w in range(int(least), int(most) + 1):
        moved = iteration_drift(measured_iterations(glob, w, count))
        if moved is not None and steady(*moved):
            return w
    return int(most)


#: the confidence level of ``throughput.mean_ci95_low``/``mean_ci95_high``
CONFIDENCE = 0.95
#: how far the iteration time may move within a run's measured iterations, beyond its own
#: noise, for the run to be steady (:func:`steady`)
STEADY_TOLERANCE = 0.05


def mean_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """The confidence interval of the mean of ``values``: Student's t interval
    ``mean -+ t((1 + confidence) / 2, n - 1) x s / sqrt(n)``, ``s`` the sample standard
    deviation (ddof=1), the t quantile from ``scipy.stats.t``.

    It takes the values as independent draws of one distribution; iterations of a run that
    drift or come in bursts are correlated, and the interval is then too narrow.

    Args:
        values: shape ``(n,)``, in any unit (the interval is in the same).
        confidence: in (0, 1).

    Returns:
        ``(low, high)``; ``(None, None)`` with fewer than two values (no spread to estimate).
    """
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return None, None
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return _f(x.mean() - half), _f(x.mean() + half)


def iteration_drift(measured: pd.DataFrame) -> tuple[float, float] | None:
    """How far the iteration time moved within a run's measured iterations, and the run's
    noise.

    Args:
        measured: :func:`measured_iterations` (``iteration``, ``time_s``).

    Returns:
        ``(drift, noise)``: the median ``time_s`` of the later half of the iterations (in
        iteration order; the middle one of an odd count left out) over that of the earlier
        half, less 1; and the half-width of the 95 % confidence interval of the mean ``time_s``
        (:func:`mean_interval`) over the mean. None with fewer than 4 iterations.
    """
    t = measured.sort_values("iteration")["time_s"].to_numpy(dtype=float)
    if len(t) < 4:
        return None
    half = len(t) // 2
    low, high = mean_interval(t)
    return float(np.median(t[-half:]) / np.median(t[:half]) - 1), float((high - low) / 2 / t.mean())


def steady(drift: float, noise: float, tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether a run whose measured iterations moved by ``drift`` (:func:`iteration_drift`)
    had settled: the move is within ``tolerance`` or within the run's own ``noise``."""
    return abs(drift) <= max(tolerance, noise)


def throughput_stats(measured: pd.DataFrame) -> tuple[Throughput, IterationTime]:
    """Throughput and iteration-time statistics of measured iterations (see module doc).

    Returns:
        The ``throughput`` and ``iteration_time_s`` sections, every key set (None values if no data).
    """
    m = measured[measured["time_s"] > 0] if not measured.empty else measured
    tp = {
        "mean": None,
        "spread95": None,
        "mean_ci95_low": None,
        "mean_ci95_high": None,
        "std": None,
        "min": None,
        "max": None,
        "overall": None,
        "n": int(len(m)),
        "unit": "samples/s",
        "method": "per iteration: global batch / iteration time (latest worker end of the iteration - "
        "latest worker end of the one before); over post-warm-up iterations: mean, spread95 = "
        "1.96*std (ddof=0) as Horovod's benchmark, mean_ci95 = Student's t 95% interval of the mean "
        "(sd ddof=1, n-1 degrees of freedom); overall = measured samples / sum of their iteration times",
    }
    it = {"mean": None, "p50": None, "p95": None, "std": None, "min": None, "max": None, "n": int(len(m))}
    if len(m):
        s = m["samples_per_s"].to_numpy(dtype=float)
        t = m["time_s"].to_numpy(dtype=float)
        low, high = mean_interval(s)
        tp.update(
            mean=_f(s.mean()),
            std=_f(s.std()),
            spread95=_f(1.96 * s.std()),
            mean_ci95_low=low,
            mean_ci95_high=high,
            min=_f(s.min()),
            max=_f(s.max()),
        )
        tp["overall"] = _f(m["samples"].sum() / t.sum())
        it.update(
            mean=_f(t.mean()),
            p50=_f(np.percentile(t, 50)),
            p95=_f(np.percentile(t, 95)),
            std=_f(t.std()),
            min=_f(t.min()),
            max=_f(t.max()),
        )
    return Throughput.model_validate(tp), IterationTime.model_validate(it)


# ----------------------------------------------------------------------------- scheduled events


#: ``iterations_note`` of a run of a researcher's program that marked no iteration
NO_MARKS_NOTE = "the program marked no iterations: iteration figures are absent"
#: ... and of a scheme's run without any iteration event (it failed before one ended)
NO_ITERATIONS_NOTE = "no worker recorded an iteration: iteration figures are absent"


def segments(measured: pd.DataFrame, schedule: list[dict], t_measured: float | None) -> list[Segment]:
    """Throughput and iteration time between consecutive scheduled events (see module doc).

    An event recorded at global iteration count ``N`` (``iteration`` of its record: every
    worker had finished iteration ``N - 1``) opens a segment that holds the iterations from
    ``N`` on, until the next event's. Events applied at the same iteration count (e.g. both
    uplinks changed at the same ``at_s``) open one segment together.

    Args:
        measured: :func:`measured_iterations` (times on the run's clock, emulated).
        schedule: :attr:`analysis.load.Run.schedule` (records with ``time`` on the same clock).
        t_measured: start of the measured window (``start_s``/``end_s`` count from it); None:
            the earliest ``period_start`` in ``measured``.

    Returns:
        One :class:`~traffic.summary.Segment` per segment, in the order the events were
        applied (``start_s``/``end_s`` in emulated seconds since ``t_measured``); empty when
        no event was applied.
    """
    cuts = sorted(
        (
            r
            for r in schedule
            if r.get("applied") and not r.get("error") and r.get("time") is not None and r.get("iteration") is not None
        ),
        key=lambda r: (r["time"], r.get("index", 0)),
    )
    if not cuts:
        return []
    if t_measured is None and not measured.empty:
        t_measured = float(measured["period_start"].min())

    def rel(t):
        return None if t is None or t_measured is None else _f(t - t_measured)

    groups: list[list[dict]] = []  # records applied at the same iteration count cut once
    for r in cuts:
        if groups and int(groups[-1][0]["iteration"]) == int(r["iteration"]):
            groups[-1].append(r)
        else:
            groups.append([r])
    openers = [None] + [g[0] for g in groups]
    together = [[]] + [[r.get("index") for r in g] for g in groups]
    out = []
    for k, opener in enumerate(openers):
        first = 0 if opener is None else int(opener["iteration"])
        nxt = openers[k + 1] if k + 1 < len(openers) else None
        last = None if nxt is None else int(nxt["iteration"]) - 1
        m = measured
        if not m.empty:
            keep = m["iteration"] >= first
            if last is not None:
                keep &= m["iteration"] <= last
            m = m[keep]
        tp, it = throughput_stats(m)
        out.append(
            Segment(
                from_event=None if opener is None else opener.get("index"),
                events=together[k],
                kind=None if opener is None else opener.get("kind"),
                target=None if opener is None else opener.get("target"),
                iterations=[first, last],
                start_s=None if opener is None else rel(float(opener["time"])),
                end_s=None if nxt is None else rel(float(nxt["time"])),
                n=tp.n,
                throughput=Throughput(mean=tp.mean, overall=tp.overall, unit="samples/s"),
                iteration_time_s=IterationTime(mean=it.mean, p95=it.p95),
            )
        )
    return out


# ----------------------------------------------------------------------------- bytes


def link_bytes(traces: pd.DataFrame, topology: dict, window: tuple[float, float] | None = None) -> dict:
    """Bytes per link class and per host from the switch-port samples (see module doc).

    Args:
        traces: :func:`analysis.traces.parse_bwm_ng` frame.
        topology: topology.json.
        window: only samples with ``start < time <= end`` (unix s), else all.

    Returns:
        ``{"host_links": int, "uplinks": int, "core": int, "per_host": {host: {"tx": int,
        "rx": int}}, "per_port": {iface: {"tx": int, "rx": int}}}``; a value is None when
        one of its ports has no samples.
    """
    ports = port_table(topology)
    if window is not None and not traces.empty:
        traces = traces[(traces["time"] > window[0]) & (traces["time"] <= window[1])]
    sums = traces.groupby("iface")[["bytes_out", "bytes_in"]].sum() if not traces.empty else None
    sampled = set(sums.index) if sums is not None else set()

    def port(iface):
        if iface not in sampled:
            return None
        return int(sums.loc[iface, "bytes_out"]), int(sums.loc[iface, "bytes_in"])  # tx, rx

    def total(values):
        return None if not values or any(v is None for v in values) else int(sum(values))

    per_port = {}
    for iface in ports["iface"]:
        v = port(iface)
        per_port[iface] = None if v is None else {"tx": v[0], "rx": v[1]}
    host_ports = ports[ports["link_class"] == "host"]
    tor_up = ports[(ports["link_class"] == "uplink") & ports["tor_side"]]
    host_links = [None if port(i) is None else sum(port(i)) for i in host_ports["iface"]]
    uplinks = [None if port(i) is None else sum(port(i)) for i in tor_up["iface"]]
    core = [None if port(i) is None else port(i)[0] for i in tor_up["iface"]]
    per_host: dict = {}
    for h, g in host_ports.groupby("host", sort=False):
        vals = [port(i) for i in g["iface"]]
        if any(v is None for v in vals):
            per_host[h] = {"tx": None, "rx": None}
        else:  # host tx = switch port rx; host rx = switch port tx
            per_host[h] = {"tx": int(sum(v[1] for v in vals)), "rx": int(sum(v[0] for v in vals))}
    return {
        "host_links": total(host_links),
        "uplinks": total(uplinks) if len(tor_up) else 0 if sampled else None,
        "core": total(core) if len(tor_up) else 0 if sampled else None,
        "per_host": per_host,
        "per_port": per_port,
    }


def background_core_bytes(per_host: dict, topology: dict, flows: list[dict] | None) -> int | None:
    """Bytes the background flows put on the core (see module doc).

    Args:
        per_host: ``link_bytes(...)["per_host"]`` of the same window.
        topology: topology.json (host ``kind`` ``background`` marks the background hosts).
        flows: the spec's ``background`` list (``src``, ``dst`` host names).

    Returns:
        0 without flows; the summed tx of the background hosts when every flow runs between
        background hosts of different racks; None otherwise, or when a host's tx is missing.
    """
    if not flows:
        return 0
    hosts = {h["name"]: h for h in topology.get("hosts", [])}
    for f in flows:
        ends = [hosts.get(f.get("src")), hosts.get(f.get("dst"))]
        if any(e is None or e.get("kind") != "background" for e in ends) or ends[0]["rack"] == ends[1]["rack"]:
            return None
    tx = [(per_host.get(h) or {}).get("tx") for h, d in hosts.items() if d.get("kind") == "background"]
    return None if any(v is None for v in tx) else int(sum(tx))


def rate_check(
    rates: pd.DataFrame, topology: dict, tolerance: float = RATE_TOLERANCE, schedule: list[dict] | None = None
) -> dict:
    """Highest achieved rate of each link direction against its configured rate: the highest
    it had during the run (its build rate, or a scheduled ``link_rate`` event's ``bw_mbps``
    applied to it, from ``schedule``: the run's ``schedule.jsonl`` records).

    Each host link is checked at its switch port and each uplink at its ToR end, both
    directions, over windows of ``max(0.1 s, 5 x median sample interval)``.

    Returns:
        ``{"shaping_failed": bool or None, "window_s": float, "rule": str, "links":
        [{"iface", "class", "bw_mbps", "max_tx_mbps", "max_rx_mbps", "max_ratio"}]}``.
    """
    out = {
        "shaping_failed": None,
        "window_s": None,
        "rule": f"max rate over the window > (1 + {tolerance:g}) x configured bw_mbps means shaping failed",
        "links": [],
    }
    ports = port_table(topology)
    if rates.empty or ports.empty:
        return out
    window = max(0.1, 5 * float(rates["dt_s"].median()))
    w = tr.windowed_rates(rates, window)
    w = w[w["dt_s"] >= 0.5 * window]
    checked = ports[(ports["link_class"] == "host") | ports["tor_side"]]
    failed = False
    for _, p in checked.iterrows():
        g = w[w["iface"] == p["iface"]]
        bw = _f(
            max(
                [p["bw_mbps"]]
                + [
                    r["bw_mbps"]
                    for r in schedule or []
                    if r.get("kind") == "link_rate" and r.get("applied") and p["iface"] in (r.get("ifaces") or [])
                ]
            )
        )
        if g.empty:
            continue
        tx, rx = g["tx_bps"].max() / 1e6, g["rx_bps"].max() / 1e6
        ratio = max(tx, rx) / bw if bw else None
        failed |= bool(ratio is not None and ratio > 1 + tolerance)
        out["links"].append(
            {
                "iface": p["iface"],
                "class": p["link_class"],
                "bw_mbps": bw,
                "max_tx_mbps": _f(tx),
                "max_rx_mbps": _f(rx),
                "max_ratio": _f(ratio),
            }
        )
    out.update(shaping_failed=failed if out["links"] else None, window_s=window)
    return out


# ----------------------------------------------------------------------------- cpu


def cpu_stats(cpu: pd.DataFrame, window: tuple[float, float] | None = None, machines: list[str] | None = None) -> dict:
    """Idle % of the run's cores (see module doc), per machine for a run spread over several.

    A cluster run's ``cpu.csv`` (:mod:`testbed.capture.merge`) has its remote machines'
    ``core`` rows, ``bwm-ng`` and ``harness`` rows with ids ``"<machine>:<id>"``; rows
    without a prefix are the controller's. When some core id carries a prefix, or
    ``machines`` is given, the figures are computed per machine (each on its own samples
    and clock ticks) and the top-level ones are the worst machine's.

    Args:
        cpu: :attr:`analysis.load.Run.cpu` (``time`` s, ``kind``, ``id`` str, ``busy_pct``).
        window: ``(start, end)`` s to average over; a machine without a core sample in it
            uses its whole capture. None: the whole capture.
        machines: the machines a cluster run should have samples of (``cluster.json``'s
            ``machines``); each one without any core row is reported with None figures.

    Returns:
        ``{"idle_pct_mean": float, "idle_pct_per_core": {core: float}, "min_idle_pct":
        float, "window": "measured iterations" | "capture", "procs_busy_pct_mean": {name:
        float}}`` (None values without samples). For a cluster run also ``"machines":
        {machine: {the same five keys, core ids and process names without the prefix;
        procs: that machine's bwm-ng and harness}}`` (``"controller"`` for unprefixed core
        rows) and ``"worst_machine"``; then ``idle_pct_mean`` and ``idle_pct_per_core``
        (ids with their prefix) are those of the machine of lowest mean idle,
        ``min_idle_pct`` the lowest over machines, ``window`` "capture" if any machine fell
        back to it, and ``procs_busy_pct_mean`` covers every process row (prefixed ids).
    """
    if cpu.empty and not machines:
        return _machine_cpu(cpu, window)
    ids = cpu["id"].astype(str)
    parts = [i.rpartition(":") for i in ids]
    machine = pd.Series([p[0] for p in parts], index=cpu.index, dtype=object)  # "" without a prefix
    bare = pd.Series([p[2] for p in parts], index=cpu.index, dtype=object)
    prefixed = machine != ""
    is_core = cpu["kind"] == "core"
    if not machines and not (is_core & prefixed).any():
        return _machine_cpu(cpu, window)  # one machine
    names = list(dict.fromkeys(list(machines or []) + sorted(set(machine[is_core & prefixed]))))
    if (is_core & ~prefixed).any():
        names.insert(0, CONTROLLER)
    per = {}
    for m in names:
        if m == CONTROLLER:
            own = ~prefixed & (is_core | ((cpu["kind"] == "proc") & ids.isin(_MACHINE_PROCS)))
        else:
            own = machine == m
        per[m] = _machine_cpu(cpu[own].assign(id=bare[own]), window)
    c, label = _window_rows(cpu, window)
    procs = c[c["kind"] == "proc"]
    out = {
        "idle_pct_mean": None,
        "idle_pct_per_core": {},
        "min_idle_pct": None,
        "window": label,
        "procs_busy_pct_mean": {str(k): _f(v) for k, v in procs.groupby("id")["busy_pct"].mean().items()},
        "machines": per,
        "worst_machine": None,
    }
    known = {m: r for m, r in per.items() if r["idle_pct_mean"] is not None}
    if known:
        worst = min(known, key=lambda m: known[m]["idle_pct_mean"])
        prefix = "" if worst == CONTROLLER else f"{worst}:"
        out.update(
            idle_pct_mean=known[worst]["idle_pct_mean"],
            worst_machine=worst,
            idle_pct_per_core={prefix + k: v for k, v in known[worst]["idle_pct_per_core"].items()},
            min_idle_pct=min(
                (r["min_idle_pct"] for r in known.values() if r["min_idle_pct"] is not None), default=None
            ),
            window="capture" if any(r["window"] == "capture" for r in known.values()) else label,
        )
    return out


def _window_rows(cpu: pd.DataFrame, window: tuple[float, float] | None) -> tuple[pd.DataFrame, str]:
    """The rows of ``window`` and its label; all rows ("capture") when no core row is in it."""
    if window is None:
        return cpu, "capture"
    c = cpu[(cpu["time"] >= window[0]) & (cpu["time"] <= window[1])]
    if c[c["kind"] == "core"].empty:  # window shorter than one sample: use everything
        return cpu, "capture"
    return c, "measured iterations"


def _machine_cpu(cpu: pd.DataFrame, window: tuple[float, float] | None) -> dict:
    """:func:`cpu_stats` of the rows of one machine (core ids not prefixed)."""
    out = {
        "idle_pct_mean": None,
        "idle_pct_per_core": {},
        "min_idle_pct": None,
        "window": "measured iterations" if window else "capture",
        "procs_busy_pct_mean": {},
    }
    if cpu.empty:
        return out
    c, out["window"] = _window_rows(cpu, window)
    cores = c[c["kind"] == "core"]
    if cores.empty:
        return out
    idle = 100.0 - cores["busy_pct"]
    out["idle_pct_per_core"] = {str(k): _f(v) for k, v in idle.groupby(cores["id"]).mean().items()}
    per_sample = (100.0 - cores.groupby("time")["busy_pct"].mean()).sort_index()
    out["idle_pct_mean"] = _f(per_sample.mean())
    dt = float(np.median(np.diff(per_sample.index))) if len(per_sample) > 1 else 1.0
    n = max(1, int(round(1.0 / dt))) if dt > 0 else 1
    rolled = per_sample.rolling(n).mean().dropna() if len(per_sample) >= n else per_sample.expanding().mean().tail(1)
    out["min_idle_pct"] = _f(rolled.min())
    procs = c[c["kind"] == "proc"]
    out["procs_busy_pct_mean"] = {str(k): _f(v) for k, v in procs.groupby("id")["busy_pct"].mean().items()}
    return out


# ----------------------------------------------------------------------------- memory


def memory_stats(memory: pd.DataFrame, machines: list[str] | None = None) -> dict | None:
    """The ``memory`` section (:class:`traffic.summary.Memory`) of a run's ``memory.csv``.

    Args:
        memory: :attr:`analysis.load.Run.memory` (``time`` unix s, ``kind`` ``machine`` or
            ``proc``, ``id`` str, ``bytes``), in the file's order.
        machines: the machines of a cluster run (``cluster.json``'s ``machines``); each one
            without rows is reported with None figures.

    Returns:
        ``{"machine_used_start_bytes", "machine_used_peak_bytes", "machine_growth_bytes":
        int, "process_uss_peak_bytes": {"median", "max", "sum": int, "processes": int},
        "period_s", "uss_period_s": float}`` (None where there are no samples); for a cluster
        run (ids ``"<machine>:..."``, or ``machines`` given) also ``"machines": {machine: the
        same keys, over its own rows}`` and ``"worst_machine"``, the machine of largest
        growth, whose machine figures are the top-level ones (the USS figures are over every
        process). None when ``memory`` is empty (a run without ``memory.csv``).
    """
    if memory.empty:
        return None
    machine = pd.Series([str(i).rpartition(":")[0] for i in memory["id"]], index=memory.index, dtype=object)
    if not machines and not (machine != "").any():
        return _machine_memory(memory)
    names = dict.fromkeys(list(machines or []) + sorted(set(machine[machine != ""])))
    per = {m: _machine_memory(memory[machine == m]) for m in names}
    every = _machine_memory(memory)["process_uss_peak_bytes"]
    out = {**dict.fromkeys(_MACHINE_FIGURES), "process_uss_peak_bytes": every, "machines": per, "worst_machine": None}
    grown = {m: r["machine_growth_bytes"] for m, r in per.items() if r["machine_growth_bytes"] is not None}
    if grown:
        worst = max(grown, key=grown.get)
        out.update({k: per[worst][k] for k in _MACHINE_FIGURES}, worst_machine=worst)
    return out


#: the figures of :func:`memory_stats` that describe a machine and its sampling (not its processes)
_MACHINE_FIGURES = (
    "machine_used_start_bytes",
    "machine_used_peak_bytes",
    "machine_growth_bytes",
    "period_s",
    "uss_period_s",
)


def _median_interval(times: pd.Series) -> float | None:
    """Median interval between distinct sample times, s (None with fewer than two)."""
    t = np.unique(pd.to_numeric(times, errors="coerce").dropna().to_numpy())
    return _f(np.median(np.diff(t))) if len(t) > 1 else None


def _median_uss_interval(procs: pd.DataFrame) -> float | None:
    """The median over processes of the median interval between two USS reads of one, s
    (None when no process was read twice)."""
    each = [v for v in (_median_interval(g) for _, g in procs.groupby("id")["time"]) if v is not None]
    return _f(np.median(each)) if each else None


def _machine_memory(memory: pd.DataFrame) -> dict:
    """:func:`memory_stats` of the rows of one machine (the first ``machine`` row is its start)."""
    rows = memory[memory["kind"] == "machine"].dropna(subset=["bytes"])
    used = rows["bytes"]
    procs = memory[memory["kind"] == "proc"].dropna(subset=["bytes"])
    peaks = procs.groupby("id")["bytes"].max()
    some = len(peaks) > 0
    return {
        "machine_used_start_bytes": _i(used.iloc[0]) if len(used) else None,
        "machine_used_peak_bytes": _i(used.max()) if len(used) else None,
        "machine_growth_bytes": _i(used.max() - used.iloc[0]) if len(used) else None,
        "process_uss_peak_bytes": {
            "median": _i(round(float(peaks.median()))) if some else None,
            "max": _i(peaks.max()) if some else None,
            "sum": _i(peaks.sum()) if some else None,
            "processes": int(len(peaks)),
        },
        "period_s": _median_interval(rows["time"]),
        "uss_period_s": _median_uss_interval(procs),
    }


def cluster_machines(run_dir: str | Path) -> list[str] | None:
    """``machines`` of the run's ``cluster.json`` (a run spread over several machines), or
    None without that file (a one-machine run) or when it is unreadable or has no list."""
    try:
        doc = json.loads(Path(run_dir, "cluster.json").read_text())
    except (OSError, ValueError):
        return None
    ms = doc.get("machines") if isinstance(doc, dict) else None
    return [str(m) for m in ms] if isinstance(ms, list) else None


# ----------------------------------------------------------------------------- accuracy


def final_accuracy(run: Run) -> dict:
    """``{"final_accuracy", "final_loss", "accuracy_source"}`` from the last "eval" event, or
    else ``results/worker0.json`` (or the first worker result that has one)."""
    ev = run.events
    if not ev.empty and "accuracy" in ev:
        e = ev[(ev["kind"] == "eval") & ev["accuracy"].notna()]
        if not e.empty:
            last = e.iloc[-1]
            return {
                "final_accuracy": _f(last["accuracy"]),
                "final_loss": _f(last.get("loss")),
                "accuracy_source": f"eval event of {last['proc']} (iteration {_i(last.get('iteration'))})",
            }
    names = sorted(run.results, key=lambda n: (n != "worker0", n))
    for n in names:
        r = run.results[n]
        if r.get("final_accuracy") is not None:
            return {
                "final_accuracy": _f(r["final_accuracy"]),
                "final_loss": _f(r.get("final_loss")),
                "accuracy_source": f"results/{n}.json",
            }
    return {"final_accuracy": None, "final_loss": None, "accuracy_source": None}


# ----------------------------------------------------------------------------- summary


def host_cost_totals(results: dict[str, dict]) -> dict[str, HostCost] | None:
    """Every process's host costs (``results/<proc>.json`` ``host_costs``, see
    :mod:`traffic.hostmodel.costs`) added up per kind (:class:`~traffic.summary.HostCost`).
    None when no process reported any."""
    out: dict[str, dict] = {}
    for r in results.values():
        for kind, v in (r.get("host_costs") or {}).items():
            t = out.setdefault(
                kind,
                {
                    "count": 0,
                    "modelled": True,
                    "emulated_s": 0.0,
                    "budget_s": 0.0,
                    "real_s": 0.0,
                    "overruns": 0,
                    "overrun_s": 0.0,
                },
            )
            for k in ("count", "emulated_s", "budget_s", "real_s", "overruns", "overrun_s"):
                t[k] += v.get(k, 0)
            t["modelled"] = t["modelled"] and bool(v.get("modelled"))
            if "queued_s" in v:  # charged on a host's shared clock
                t["queued_s"] = t.get("queued_s", 0.0) + v["queued_s"]
    for t in out.values():
        t["overrun_fraction"] = t["overrun_s"] / t["budget_s"] if t["budget_s"] > 0 else 0.0
    return {kind: HostCost.model_validate(t) for kind, t in out.items()} or None


def host_cost_overrun(results: dict[str, dict]) -> bool | None:
    """True when some process's overruns added more than
    :data:`~traffic.hostmodel.costs.OVERRUN_THRESHOLD` (5 %) of its wall time.

    A process's overrun is the real seconds its modelled host costs took beyond their dilated
    budgets, summed over the kinds (``results/<proc>.json`` ``host_costs``), against its
    ``wall_s``: the share of its time that the real work set instead of the host model, an
    upper bound on what the overruns moved its iterations. A small operation can overrun its
    budget many times over (a 16 KB aggregation of a few microseconds of budget pays tens of
    microseconds of Python) and still add nothing measurable to a run of seconds; an
    operation whose budget is the bottleneck adds its whole overrun. A process without
    ``wall_s`` (a results file written before it was recorded) is judged by its overrun against
    its budgets, the same fraction. None when no process reported host costs."""
    judged = False
    for r in results.values():
        kinds = [v for v in (r.get("host_costs") or {}).values() if v.get("modelled")]
        if not (r.get("host_costs") or {}):
            continue
        judged = True
        over = sum(v.get("overrun_s", 0.0) for v in kinds)
        wall = r.get("wall_s")
        base = wall if isinstance(wall, (int, float)) and wall > 0 else sum(v.get("budget_s", 0.0) for v in kinds)
        if base > 0 and over > OVERRUN_THRESHOLD * base:
            return True
    return False if judged else None


def _skeleton(run: Run, wl: dict, n_workers: int | None, status: str, error: str | None) -> RunSummary:
    """The run's identity and every figure at its value before analysis (None, 0, empty):
    every key is set, so it is written even when no section fills it in."""
    spec = run.spec or {}
    s = RunSummary(
        status=status,
        error=error,
        run_id=run.name,
        name=spec.get("name"),
        scheme=wl.get("scheme") or (run.summary.scheme if run.summary else None),
        model=wl.get("model"),
        dataset=wl.get("dataset"),
        compute=wl.get("compute"),
        topology=(spec.get("topology") or {}).get("kind"),
        tcp_congestion_control=sorted(
            {h["tcp_congestion_control"] for h in run.topology.get("hosts", []) if h.get("tcp_congestion_control")}
        )
        or None,
        scale=float(spec.get("scale") or 1.0),
        workers=n_workers,
        batch_size=wl.get("batch_size"),
        global_batch=(wl["batch_size"] * n_workers) if wl.get("batch_size") and n_workers else None,
        provenance=None,
        iterations=wl.get("iterations"),
        iterations_completed=None,
        warmup_iterations=int(wl.get("warmup_iterations") or 0),
        max_warmup_iterations=None if wl.get("max_warmup_iterations") is None else int(wl["max_warmup_iterations"]),
        measured_iterations=0,
        throughput=None,
        iteration_time_s=None,
        bytes=None,
        bytes_per_iteration=None,
        final_accuracy=None,
        final_loss=None,
        accuracy_source=None,
        cpu=None,
        memory=None,
        fidelity=Fidelity(
            cpu_starved=None,
            min_idle_pct=None,
            idle_pct_mean=None,
            rule=CPU_IDLE_RULE,
            shaping_failed=None,
            rates=None,
            host_cost_overrun=None,
            effects=[],
            unverified=[],
            effects_rule=effects.EFFECTS_RULE,
        ),
        host_costs=None,
        iterations_note=None,
        events=[],
        events_not_reached=[],
        segments=[],
        capture_s=None,
        analysis_errors=[],
        capture_errors=[],
    )
    if wl.get("program"):  # a researcher's program: the workload's model, data and batch are not its
        s.program = (wl["program"] or {}).get("command")
        s.model = s.dataset = s.batch_size = s.global_batch = None
    return s


def _capture_errors(run_dir: Path) -> list[str]:
    """The lines of ``logs/capture.log`` (none without the file)."""
    try:
        text = (run_dir / "logs" / "capture.log").read_text(errors="replace")
    except OSError:
        return []
    return [l for l in text.splitlines() if l.strip()]


def _provenance_section(s: RunSummary, run: Run) -> None:
    """``provenance``: the run's ``provenance.json`` (None without one)."""
    s.provenance = Provenance.model_validate(run.provenance) if run.provenance else None


def _event_section(s: RunSummary, schedule: list[dict]) -> None:
    """``events`` and ``events_not_reached``: the schedule's records as the harness wrote them
    (without the ``time`` :func:`analysis.load.load` adds)."""
    s.events = [{k: v for k, v in r.items() if k != "time"} for r in schedule if r.get("applied")]
    s.events_not_reached = [{k: v for k, v in r.items() if k != "time"} for r in schedule if not r.get("applied")]


def iteration_figures(s: RunSummary, iters: pd.DataFrame, n_workers: int | None = None) -> pd.DataFrame:
    """Set ``s``'s ``iterations_completed``, ``warmup_iterations`` (the one chosen, when ``s``
    warms up until steady: ``max_warmup_iterations`` set, ``warmup_iterations`` the least),
    ``measured_iterations``, ``throughput`` and ``iteration_time_s`` from ``iters``
    (:func:`iteration_table`; see the module doc), and return the measured iterations
    (:func:`measured_iterations` of :func:`global_iterations`).

    Args:
        s: a summary with ``iterations``, ``warmup_iterations`` and ``max_warmup_iterations``
            as the spec gives them.
        iters: one row per (iteration, worker), times in emulated seconds.
        n_workers: as :func:`global_iterations`'s ``workers``.
    """
    glob = global_iterations(iters, n_workers)
    s.iterations_completed = int(glob["complete"].sum()) if not glob.empty else 0
    count = None
    if s.max_warmup_iterations is not None:  # warm up until steady
        count = int(s.iterations or 0) - s.max_warmup_iterations
        s.warmup_iterations = settled_warmup(glob, s.warmup_iterations, s.max_warmup_iterations, count)
    measured = measured_iterations(glob, s.warmup_iterations, count)
    s.measured_iterations = int(len(measured))
    s.throughput, s.iteration_time_s = throughput_stats(measured)
    return measured


def refigured_summary(run_dir: str | Path) -> RunSummary | None:
    """A finished run's ``summary.json`` with its iteration figures computed again
    (:func:`iteration_figures`) from the files the reproduction archive keeps
    (``spec.yaml``, ``summary.json``, ``iterations.csv``), so that a run summarized under an
    earlier definition is read by the current one; the summary as written when the run has
    no ``iterations.csv``, None without a ``summary.json``.

    Raises:
        TestbedError: ``spec.yaml`` unreadable.
        OSError, ValueError: another file unreadable or malformed.
    """
    p = Path(run_dir)
    if not (p / "summary.json").is_file():
        return None
    s = RunSummary.load(p / "summary.json")
    f = p / "iterations.csv"
    if not f.is_file():
        return s
    wl = read_spec(p).get("workload") or {}
    s.warmup_iterations = int(wl.get("warmup_iterations") or 0)
    s.max_warmup_iterations = wl.get("max_warmup_iterations")
    s.iterations = wl.get("iterations", s.iterations)
    iters = tr.read_table(f, ITERATION_COLUMNS)
    iteration_figures(s, iters, s.workers)
    return s


def _iteration_section(
    s: RunSummary, run: Run, iters: pd.DataFrame, n_workers: int | None, program: bool
) -> tuple[float, float] | None:
    """Iteration counts, ``throughput``, ``iteration_time_s``, ``iterations_note`` and
    ``segments``; ``global_batch`` from the samples when the spec does not give it.

    Returns:
        The measured window on the run's clock, the sum of the measured iterations' times when
        none is missing: ``(period_start of the first measured iteration, completion of the
        last)`` (:func:`global_iterations`), or None without measured iterations.
    """
    measured = iteration_figures(s, iters, n_workers)
    if s.global_batch is None and not measured.empty:
        s.global_batch = _i(measured["samples"].median())
    window = None if measured.empty else (float(measured["period_start"].min()), float(measured["end"].max()))
    if iters.empty:
        s.iterations_note = NO_MARKS_NOTE if program else NO_ITERATIONS_NOTE
    s.segments = segments(measured, run.schedule, window[0] if window else None)
    return window


def _with_background(b: dict, topology: dict, flows: list[dict]) -> dict:
    """:func:`link_bytes` with ``core_background`` and ``core_training`` added."""
    bg = None if b["core"] is None else background_core_bytes(b["per_host"], topology, flows)
    return {**b, "core_background": bg, "core_training": None if bg is None else b["core"] - bg}


def _bytes_section(s: RunSummary, run: Run, window: tuple[float, float] | None) -> None:
    """``capture_s``, ``bytes`` (the whole capture) and ``bytes_per_iteration`` (the measured window)."""
    if run.traces.empty:
        return
    s.capture_s = _f(run.traces["time"].max() - run.traces["time"].min())
    if not run.topology:
        return
    flows = (run.spec or {}).get("background") or []
    s.bytes = Bytes.model_validate(_with_background(link_bytes(run.traces, run.topology), run.topology, flows))
    if window is None or not s.measured_iterations:
        return
    b = _with_background(link_bytes(run.traces, run.topology, window), run.topology, flows)
    n = s.measured_iterations
    per = {
        k: (None if b[k] is None else b[k] / n)
        for k in ("host_links", "uplinks", "core", "core_background", "core_training")
    }
    hosts = {p.get("host") for p in run.processes.get("processes", []) if p.get("role") == "worker"}
    moved = [v["tx"] + v["rx"] for h, v in b["per_host"].items() if h in hosts and v["tx"] is not None]
    per["worker_link"] = sum(moved) / len(moved) / n if moved else None
    s.bytes_per_iteration = BytesPerIteration.model_validate(per)


def _accuracy_section(s: RunSummary, run: Run) -> None:
    """``final_accuracy``, ``final_loss``, ``accuracy_source`` (:func:`final_accuracy`)."""
    acc = final_accuracy(run)
    s.final_accuracy, s.final_loss, s.accuracy_source = (
        acc["final_accuracy"],
        acc["final_loss"],
        acc["accuracy_source"],
    )


def _cpu_section(s: RunSummary, run: Run, window: tuple[float, float] | None) -> None:
    """``cpu`` and the CPU flags of ``fidelity`` (judged per machine in a run over several)."""
    s.cpu = cpu = Cpu.model_validate(cpu_stats(run.cpu, window, cluster_machines(run.path)))
    f = s.fidelity
    f.min_idle_pct, f.idle_pct_mean = cpu.min_idle_pct, cpu.idle_pct_mean
    f.cpu_starved = None if cpu.idle_pct_mean is None else bool(cpu.idle_pct_mean < MIN_IDLE_PCT)
    if cpu.machines is not None:
        f.rule = CPU_IDLE_RULE_CLUSTER
        if f.cpu_starved is False and any(m.idle_pct_mean is None for m in cpu.machines.values()):
            f.cpu_starved = None  # a machine without samples may have starved


def _memory_section(s: RunSummary, run: Run) -> None:
    """``memory`` (:func:`memory_stats`, per machine in a run over several)."""
    stats = memory_stats(run.memory, cluster_machines(run.path))
    s.memory = None if stats is None else Memory.model_validate(stats)


def _rate_section(s: RunSummary, run: Run) -> None:
    """``fidelity.rates`` and ``fidelity.shaping_failed`` (:func:`rate_check`)."""
    rc = RateCheck.model_validate(rate_check(run.rates, run.topology, schedule=run.schedule))
    s.fidelity.shaping_failed, s.fidelity.rates = rc.shaping_failed, rc


def _host_cost_section(s: RunSummary, run: Run) -> None:
    """``host_costs`` and ``fidelity.host_cost_overrun``."""
    s.host_costs = host_cost_totals(run.results)
    s.fidelity.host_cost_overrun = host_cost_overrun(run.results)


def _effects_section(s: RunSummary, run: Run) -> None:
    """``fidelity.effects`` and ``fidelity.unverified`` (:func:`analysis.effects.check`, the
    flows' rates judged with :data:`RATE_TOLERANCE`), then the rule
    (:func:`analysis.effects.apply_rule`): an ``ok`` run with an effect not done is ``failed``."""
    per_host = (s.bytes.per_host or {}) if s.bytes is not None else {}
    f = s.fidelity
    f.effects = effects.check(run, {h: v.tx for h, v in per_host.items()}, RATE_TOLERANCE)
    f.unverified = effects.unverified_lines(f.effects)
    effects.apply_rule(s)


def _guarded(s: RunSummary, name: str, section, *args):
    """``section(s, *args)``; an exception is recorded in ``analysis_errors`` (a summary is
    always written) and gives None."""
    try:
        return section(s, *args)
    except Exception as e:  # noqa: BLE001 -- a summary must always be written
        s.analysis_errors.append(f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
        return None


def compute_summary(run: Run, status: str = "ok", error: str | None = None) -> RunSummary:
    """The summary of a loaded run (what :func:`summarize` writes), without writing anything.

    Sections that cannot be computed are None; an unexpected failure of one section is
    recorded under ``analysis_errors`` instead of raising. ``status`` and ``error`` are the
    harness's, except that an ``ok`` run with an effect its spec asked for not done is
    ``failed`` (:mod:`analysis.effects`).
    """
    wl = (run.spec or {}).get("workload") or {}
    n_workers = sum(1 for p in run.processes.get("processes", []) if p.get("role") == "worker") or None
    iters = run.iterations
    if not iters.empty and iters["samples"].isna().any() and wl.get("batch_size") and not wl.get("program"):
        iters = iters.assign(samples=iters["samples"].fillna(wl["batch_size"]))  # a worker that did not say
    if n_workers is None and not iters.empty:
        n_workers = int(iters["worker"].nunique())
    s = _skeleton(run, wl, n_workers, status, error)
    try:
        s.capture_errors = _capture_errors(run.path)
        _guarded(s, "provenance", _provenance_section, run)
        _guarded(s, "events", _event_section, run.schedule)
        window = _guarded(s, "iterations", _iteration_section, run, iters, n_workers, bool(wl.get("program")))
        _guarded(s, "bytes", _bytes_section, run, window)
        _guarded(s, "accuracy", _accuracy_section, run)
        _guarded(s, "cpu", _cpu_section, run, window)
        _guarded(s, "memory", _memory_section, run)
        _guarded(s, "rates", _rate_section, run)
        _guarded(s, "host_costs", _host_cost_section, run)
        _guarded(s, "effects", _effects_section, run)  # last: it may fail the run, keeping every figure
    except Exception:
        raise
    except BaseException as e:  # Ctrl-C, or the harness's SIGTERM exception: what was computed is kept
        raise AnalysisInterrupted(_interrupted(s, status, error), e) from e
    return s


class AnalysisInterrupted(Exception):
    """Ctrl-C or SIGTERM (``cause``) during the analysis; ``summary`` holds the sections
    computed until then, with status ``interrupted``."""

    def __init__(self, summary: RunSummary, cause: BaseException):
        super().__init__("the analysis was interrupted")
        self.summary, self.cause = summary, cause


def _interrupted(s: RunSummary, status: str, error: str | None) -> RunSummary:
    """``s`` marked ``interrupted``: the error says so and keeps the run's own outcome."""
    s.status = "interrupted"
    s.error = (
        f"the analysis was interrupted (Ctrl-C or SIGTERM) before it ended: sections not reached are empty, "
        f"the run's files are complete (analysis.metrics.summarize(RUN) recomputes this summary); the run "
        f"itself ended {status}{': ' + error if error else ''}"
    )
    return s


def summarize(run_dir: str | Path, status: str = "ok", error: str | None = None) -> RunSummary:
    """Write ``iterations.csv`` and ``summary.json`` of a finished (or failed) run.

    Works on whatever the run left: missing files give None fields, never an exception
    (an analysis failure is recorded in ``analysis_errors``).

    Args:
        run_dir: the run directory.
        status: ``"ok"``, ``"failed"``, ``"interrupted"`` (Ctrl-C or SIGTERM) or ``"killed"`` (the
            runner died; written by ``testbed clean``), as decided by the harness.
        error: the error message of a failed run.

    Returns:
        The summary (see the module doc for every definition); a run whose files cannot be
        loaded gets only ``status``, ``error``, ``run_id`` and ``analysis_errors``.

    Raises:
        OSError: ``iterations.csv`` or ``summary.json`` cannot be written (e.g. a full disk);
            ``summary.json`` is then absent or its earlier content, never a torn file.
        KeyboardInterrupt (or the harness's SIGTERM exception): re-raised after
            ``summary.json`` is written with status ``interrupted`` and the sections computed
            until then.
    """

    p = Path(run_dir)
    try:
        try:
            run = load(p)
        except Exception as e:  # noqa: BLE001
            summary = RunSummary(
                status=status, error=error, run_id=p.name, analysis_errors=[f"load: {type(e).__name__}: {e}"]
            )
            if p.is_dir():
                summary.write(p)
            return summary
        if not (p / "iterations.csv").is_file() or not run.events.empty:
            run.iterations = iteration_table(run.events)
            run.iterations.to_csv(p / "iterations.csv", index=False)
        summary = compute_summary(run, status, error)
    except AnalysisInterrupted as e:
        _write_blocking_signals(e.summary, p)
        raise e.cause from None
    except Exception:
        raise
    except BaseException:  # Ctrl-C or SIGTERM while loading: the run's identity and outcome are kept
        _write_blocking_signals(_interrupted(RunSummary(run_id=p.name), status, error), p)
        raise
    summary.write(p)
    return summary


def _write_blocking_signals(summary: RunSummary, run_dir: Path) -> None:
    """Write ``summary`` with SIGINT and SIGTERM held until it is written (never raises OSError:
    the interruption is what the caller reports)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        summary.write(run_dir)
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
