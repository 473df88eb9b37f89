"""Every effect a run's spec asked of the emulation, judged from the files the run wrote.

**The rule** (:data:`EFFECTS_RULE`): a run is ``ok`` only when every effect its spec asked for
was verified to have happened. :func:`check` lists the effects, each a
:class:`traffic.summary.Effect` whose ``verified`` is True (done as asked), False (not done;
``reason`` says why) or None (it could not be judged: nothing was asked, or the file that
would tell was not written by the version of the harness that made the run; ``reason`` says
which). :func:`apply_rule` makes a run the harness ended ``ok`` that has an effect not done
``failed``, with the error ``asked for but not done:`` followed by one line per such effect
(``fidelity.unverified``, ``<kind> <name>: <reason>``); every figure of the summary is kept.
An effect that could not be judged does not fail the run; a run that already did not end
``ok`` keeps its status and error. :func:`analysis.metrics.compute_summary` calls both.

The effects, and what each is judged from (formats in :mod:`traffic.rundir`):

``background``: one per flow of the spec's ``background``
    (``traces/background/flows.json``, :mod:`testbed.background`: the plan, when the harness
    stopped the flows still running, iperf3's own report of each). Done when the flow ran:
    iperf3 reported a result without an error of its own (a flow still running when training
    ended is stopped by the harness with SIGTERM and iperf3 then reports ``interrupt - the
    client has terminated``, or ``the server has terminated`` when its server got the signal
    first: that is no failure; ``unable to connect``, ``the server is busy``, a refused ``-t``
    are); it moved bytes; it ran for its asked duration, or until the harness stopped it when
    training ended first (less :data:`FLOW_START_SLACK_S` or ``tolerance`` of that time,
    whichever is more: the shell's exec and iperf3's control connection come first); a UDP flow
    sent within ``tolerance`` of its asked rate, a TCP flow not more than ``tolerance`` above it
    (below it, as under congestion, is recorded, not failed), either beyond one iperf3 block
    (:data:`IPERF3_BLOCK_BYTES`, written whatever the pace); and where the link counters cover
    the flow (it ran inside the bwm-ng capture), its source host's link carried at least the
    payload its server received (less ``tolerance``). A flow that never started before training
    ended (the last event any process recorded; without any, when the harness stopped the
    flows) is not done. Rates are compared as emulated Mbit/s (iperf3's payload over
    the seconds it ran, x scale), durations as emulated seconds.
``capture``: one per port of ``capture.pcap`` (``traces/pcap/ports.json``,
    :mod:`testbed.capture.pcap`). Done when tcpdump started, was still running when the harness
    stopped it (at its window's end or the run's), exited 0 on that SIGTERM, reported its counts,
    and captured at least one packet.
``event``: one per scheduled event of ``events`` (``schedule.jsonl``,
    :mod:`testbed.event_applier`). Done when it was applied without ``error`` and, for a
    ``link_rate``, every end read back within the ``rate_tolerance`` the applier recorded
    (:data:`testbed.shaping.RATE_TOLERANCE`). An event never reached is not done; the reason
    gives the global iteration count the run ended at and, when it can be told, the emulated
    second (counted as ``at_s`` counts).
``process``: one per planned process (``processes.json``). Done when it exited 0, or exited
    otherwise because the run killed it on purpose (a scheduled ``kill``), from
    ``logs/exits.json`` (:func:`testbed.launch.watch`).
``shaping``: one per run built. Done when the build's read-back of every link end matched what
    was asked (``shaping.json``, :meth:`testbed.network.Network._verify_shaping`; a mismatch
    also fails the build). The rates measured while the run trained are judged apart
    (``fidelity.rates``, ``fidelity.shaping_failed``).
``netem``: one per run built. The delay and loss asked of every link (``topology.delay_ms``,
    ``topology.loss_pct``), done when every end's netem qdisc read back as asked
    (``shaping.json``). When the spec asks for neither it is None, and records whether this
    machine's kernel has netem at all (a spec that asks for delay or loss on a kernel without
    netem is refused before anything is built).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from analysis.load import Run
from traffic.summary import Effect, RunSummary

__all__ = [
    "EFFECTS_RULE",
    "UNDONE",
    "FLOW_START_SLACK_S",
    "IPERF3_BLOCK_BYTES",
    "HARNESS_STOPS",
    "check",
    "background_effects",
    "capture_effects",
    "event_effects",
    "process_effects",
    "shaping_effects",
    "unverified_lines",
    "apply_rule",
]

#: The rule, in words (``fidelity.effects_rule``).
EFFECTS_RULE = (
    "a run is ok only when every effect its spec asked for (background flows, packet captures, "
    "scheduled events, processes, shaping, delay and loss) was verified to have happened: a run the "
    "harness ended ok with an effect not done (verified false) is failed, its error 'asked for but "
    "not done: ' and one line per such effect; an effect that could not be judged (verified null) "
    "does not fail it"
)
#: The start of the error of a run failed by the rule.
UNDONE = "asked for but not done: "
#: Real seconds a background flow may lose at its start: the shell's exec of iperf3 and
#: iperf3's control connection come before its clock starts.
FLOW_START_SLACK_S = 0.5
#: Bytes of iperf3's default TCP block (128 KiB, more than any UDP datagram): its first write
#: goes out whatever the pace, so a flow cut short at once may be above its rate by that much.
IPERF3_BLOCK_BYTES = 128 * 1024
#: How iperf3's error ends when the harness stopped it with SIGTERM (the client's own
#: ``interrupt - the client has terminated``, or its server's, reported by the client).
HARNESS_STOPS = ("the client has terminated", "the server has terminated")


def _num(x) -> float | None:
    """``x`` as a finite float, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _line(text: Any) -> str:
    """``text`` on one line."""
    return " ".join(str(text).split())


def _verdict(
    kind: str, name: str, asked: dict, achieved: dict, problems: list[str], unknown: Iterable[str] = ()
) -> Effect:
    """The effect: not done when there is a problem (the reasons joined), else not judged when
    something could not be (the first such reason), else done."""
    unknown = list(unknown)
    if problems:
        verified, reason = False, "; ".join(_line(p) for p in problems)
    elif unknown:
        verified, reason = None, _line(unknown[0])
    else:
        verified, reason = True, None
    return Effect(kind=kind, name=name, asked=asked, achieved=achieved, verified=verified, reason=reason)


# ----------------------------------------------------------------------------- background flows


def _log_line(run: Run, name: str) -> str | None:
    """The last line of ``logs/<name>`` (None without one)."""
    try:
        lines = [l for l in (run.path / "logs" / name).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return None
    return lines[-1].strip() if lines else None


def _capture_span(run: Run) -> tuple[float, float] | None:
    """First and last bwm-ng sample, on the frames' clock (None without samples)."""
    if run.traces.empty:
        return None
    t = run.traces["time"]
    return float(t.min()), float(t.max())


def _last_event_end(run: Run) -> float | None:
    """When the last event any process recorded ended, on the frames' clock (None without one)."""
    if run.events.empty:
        return None
    end = (run.events["ts"] + run.events["dur"]).max()
    return None if end != end else float(end)  # NaN: no timestamp


def _flow(
    run: Run, f: dict, scale: float, stopped: float | None, ended: float | None, link_tx: dict, tolerance: float
) -> Effect:
    """The effect of one ``flows.json`` flow (see the module doc); ``stopped``: unix s when the
    harness stopped the flows; ``ended``: when training ended, on the frames' clock."""
    name = str(f.get("name"))
    asked = {k: f.get(k) for k in ("src", "dst", "protocol", "rate_mbps", "start_s", "duration_s")}
    achieved: dict[str, Any] = {
        "rate_mbps": None,
        "duration_s": None,
        "bytes_sent": None,
        "bytes_received": None,
        "error": None,
        "stopped_by_harness": None,
        "src_link_tx_bytes": link_tx.get(f.get("src")),
    }
    problems: list[str] = []
    unknown: list[str] = []
    start = _num(f.get("client_start"))
    res = f.get("result")
    if start is None:
        return _verdict("background", name, asked, achieved, ["never launched: flows.json has no client start"])
    if ended is not None and run.on_clock(start) >= ended:
        launch = run.on_clock(start - (_num(f.get("delay_s")) or 0.0))
        return _verdict(
            "background",
            name,
            asked,
            achieved,
            [
                f"never started during training: it ended {ended - launch:.3g} emulated s after the launch, before "
                f"the flow's start at {f.get('start_s')} s"
            ],
        )
    if not isinstance(res, dict):
        return _verdict("background", name, asked, achieved, ["no iperf3 result was recorded in flows.json"])
    sent, received = _num(res.get("bytes_sent")), _num(res.get("bytes_received"))
    secs, err = _num(res.get("seconds")), res.get("error")
    by_harness = bool(err) and str(err).rstrip().endswith(HARNESS_STOPS)
    achieved.update(
        bytes_sent=res.get("bytes_sent"),
        bytes_received=res.get("bytes_received"),
        error=err,
        stopped_by_harness=by_harness,
    )
    if err and not by_harness:
        if sent is None and str(err).startswith("no iperf3 result"):
            last = _log_line(run, f"background-{name}-client.log")
            problems.append("iperf3 wrote no result" + (f": {last}" if last else ""))
        else:
            problems.append(f"iperf3: {err}")
        return _verdict("background", name, asked, achieved, problems)
    if not sent:
        problems.append("moved no bytes" + (" before the harness stopped it" if by_harness else ""))
    if secs is None or secs <= 0:
        problems.append("iperf3 reported no duration")
        return _verdict("background", name, asked, achieved, problems)
    achieved["duration_s"] = secs / scale
    want = (_num(f.get("duration_s")) or 0.0) * scale  # real seconds asked
    if by_harness:
        if stopped is None:
            unknown.append(
                "stopped by the harness, but flows.json records no stop time (an older version): "
                "its duration cannot be judged"
            )
        else:
            want = min(want, stopped - start)
    if not unknown and secs < want - max(FLOW_START_SLACK_S, tolerance * want):
        problems.append(
            f"ran {secs / scale:.3g} of {want / scale:.3g} emulated s"
            + (" (until the harness stopped it)" if by_harness else "")
        )
    rate = _num(f.get("rate_mbps"))
    if sent:
        achieved["rate_mbps"] = sent * 8 / secs / 1e6 * scale
        if rate:
            off = sent - rate * 1e6 / scale / 8 * secs  # payload bytes beyond the asked rate's
            slack = max(tolerance * rate * 1e6 / scale / 8 * secs, IPERF3_BLOCK_BYTES)
            got = f"{achieved['rate_mbps']:.4g} Mbit/s"
            if f.get("protocol") == "udp" and abs(off) > slack:
                problems.append(f"UDP sent at {got}, asked {rate:g} Mbit/s (within {tolerance:.0%})")
            elif f.get("protocol") != "udp" and off > slack:
                problems.append(f"TCP sent at {got}, above its {rate:g} Mbit/s by more than {tolerance:.0%}")
    tx, span = link_tx.get(f.get("src")), _capture_span(run)
    if tx is not None and received and span is not None:
        a, b = run.on_clock(start), run.on_clock(start + secs)
        if span[0] <= a and b <= span[1] and received > tx * (1 + tolerance):
            problems.append(
                f"its server received {received:.0f} payload bytes but {f.get('src')}'s link carried "
                f"{tx} bytes during the capture"
            )
    return _verdict("background", name, asked, achieved, problems, unknown)


def background_effects(run: Run, link_tx: dict[str, int | None] | None = None, tolerance: float = 0.10) -> list[Effect]:
    """One effect per background flow of the spec (see the module doc).

    Args:
        run: the loaded run (``spec``, ``background``: flows.json, ``traces``).
        link_tx: host -> bytes it sent over its link(s) during the capture
            (``bytes.per_host[...].tx``); None or a missing host: not checked.
        tolerance: fraction a UDP flow's rate may be off, a TCP flow's above, and by which a
            flow's received payload may exceed its source link's bytes.
    """
    flows = (run.spec or {}).get("background") or []
    if not flows:
        return []
    link_tx = link_tx or {}
    doc = run.background
    if not doc.get("flows"):
        return [
            _verdict(
                "background",
                str(f.get("name") or f"bg{i}"),
                {k: f.get(k) for k in ("src", "dst", "protocol", "rate_mbps", "start_s", "duration_s")},
                {},
                ["no traces/background/flows.json: the flow was never started"],
            )
            for i, f in enumerate(flows)
        ]
    scale = _num(doc.get("scale")) or run.scale
    stopped = _num(doc.get("stopped"))
    ended = _last_event_end(run)
    if ended is None and stopped is not None:
        ended = run.on_clock(stopped)
    return [_flow(run, f, scale, stopped, ended, link_tx, tolerance) for f in doc["flows"] if isinstance(f, dict)]


# ----------------------------------------------------------------------------- packet captures


def capture_effects(run: Run) -> list[Effect]:
    """One effect per tcpdump port of ``capture.pcap`` (see the module doc)."""
    pc = ((run.spec or {}).get("capture") or {}).get("pcap")
    if not pc:
        return []
    base = {k: pc.get(k) for k in ("filter", "snaplen_bytes", "start_s", "duration_s")}
    if not run.pcap:
        return [
            _verdict(
                "capture",
                ", ".join(map(str, pc.get("ports") or [])),
                base,
                {},
                ["no traces/pcap/ports.json: tcpdump was never started"],
            )
        ]
    out = []
    for e in run.pcap:
        port = str(e.get("port"))
        started, stopped, code = _num(e.get("started")), _num(e.get("stopped")), e.get("exit_code")
        achieved = {
            "seconds": None if started is None or stopped is None else (stopped - started) / run.scale,
            "packets_captured": e.get("packets_captured"),
            "packets_dropped": e.get("packets_dropped"),
            "exit_code": code,
        }
        asked = {"port": port, **base}
        problems, unknown = [], []
        if started is None:
            problems.append(
                e.get("error") or f"never started: the run ended before its start at {pc.get('start_s')} emulated s"
            )
        else:
            if "exit_code" not in e:
                unknown.append("ports.json records no exit status (an older version)")
            elif e.get("terminated") is False:
                problems.append(
                    f"tcpdump exited on its own (code {code}) before the harness stopped it; see "
                    f"logs/tcpdump-{port}.log"
                )
            elif code is None or code < 0:
                problems.append(
                    f"tcpdump did not exit on SIGTERM (killed by signal {-code})"
                    if code is not None
                    else "tcpdump's exit status is unknown"
                )
            elif code != 0:
                problems.append(f"tcpdump exited with code {code}; see logs/tcpdump-{port}.log")
            if e.get("packets_captured") is None:
                problems.append("tcpdump reported no counts (it was killed before its closing report)")
            elif e.get("packets_captured") == 0:
                problems.append(f"captured no packet (filter {e.get('filter')!r})")
        out.append(_verdict("capture", port, asked, achieved, problems, unknown))
    return out


# ----------------------------------------------------------------------------- scheduled events


def _event_name(i: int, ev: dict, rec: dict | None) -> str:
    """``#<index> <kind> <target>``: from the harness's record, or from the spec's event."""
    if rec is not None:
        return f"#{i} {rec.get('kind')} {rec.get('target')}"
    from traffic.event_spec import ScheduledEvent  # lazy: only for an event without a record

    try:
        e = ScheduledEvent.model_validate({k: v for k, v in ev.items() if v is not None})
        return f"#{i} {e.kind} {e.target}"
    except ValueError:
        return f"#{i}"


def _run_end_s(run: Run) -> float | None:
    """When the run's last event ended, in emulated seconds since ``at_s`` counts: the first
    measured iteration's start (for a program, its first event); None when unknown."""
    ev, end = run.events, _last_event_end(run)
    if end is None:
        return None
    wl = (run.spec or {}).get("workload") or {}
    it = run.iterations
    first = it[it["iteration"] == int(wl.get("warmup_iterations") or 0)] if not it.empty else it
    if not first.empty:
        origin = float(first["start"].min())
    elif wl.get("program"):
        origin = float(ev["ts"].min())
    else:
        return None
    return end - origin


def event_effects(run: Run) -> list[Effect]:
    """One effect per scheduled event of the spec (see the module doc)."""
    events = (run.spec or {}).get("events") or []
    if not events:
        return []
    recs = {r.get("index"): r for r in run.schedule}
    end_s = None
    out = []
    for i, ev in enumerate(events):
        ev = ev if isinstance(ev, dict) else {}
        rec = recs.get(i)
        name, asked = _event_name(i, ev, rec), {k: v for k, v in ev.items() if v is not None}
        if rec is None:
            out.append(_verdict("event", name, asked, {}, ["no record in schedule.jsonl"]))
            continue
        back = rec.get("readback_mbps")
        achieved = {
            "applied": rec.get("applied"),
            "iteration": rec.get("iteration"),
            "emulated_s": rec.get("emulated_s"),
            "error": rec.get("error"),
        }
        if isinstance(back, dict):
            achieved["readback_mbps"] = {k: None if _num(v) is None else v * run.scale for k, v in back.items()}
        problems = []
        if not rec.get("applied"):
            end_s = _run_end_s(run) if end_s is None else end_s
            problems.append(
                f"never reached: the run ended at iteration {rec.get('iteration')}"
                + (f", emulated second {end_s:.3g}" if end_s is not None else "")
            )
        elif rec.get("error"):
            problems.append(str(rec["error"]))
        elif rec.get("kind") == "link_rate" and isinstance(back, dict):
            want, tol = _num(rec.get("shaped_mbps")), _num(rec.get("rate_tolerance"))
            off = [
                f"{k} {v * run.scale:g}" if _num(v) is not None else f"{k} none"
                for k, v in back.items()
                if want and tol is not None and (_num(v) is None or abs(v - want) > tol * want)
            ]
            if off or not back:
                problems.append(f"asked {rec.get('bw_mbps')} Mbit/s, read back " + (", ".join(off) or "nothing"))
        out.append(_verdict("event", name, asked, achieved, problems))
    return out


# ----------------------------------------------------------------------------- processes


def _how(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def process_effects(run: Run) -> list[Effect]:
    """One effect per planned process (see the module doc)."""
    planned = [p for p in (run.processes.get("processes") or []) if isinstance(p, dict)]
    out = []
    for p in planned:
        name = str(p.get("name"))
        asked = {"role": p.get("role"), "host": p.get("host")}
        if not run.exits:
            out.append(
                _verdict(
                    "process",
                    name,
                    asked,
                    {},
                    [],
                    ["no logs/exits.json (an older version): its exit status was not recorded"],
                )
            )
            continue
        e = run.exits.get(name)
        if not isinstance(e, dict):
            out.append(_verdict("process", name, asked, {}, ["never started: no exit status recorded"]))
            continue
        code, killed = e.get("exit_code"), e.get("killed")
        achieved = {"exit_code": code, "killed": killed}
        problems = []
        if not isinstance(code, int) or isinstance(code, bool):
            problems.append("still running when the harness stopped watching it")
        elif code != 0 and not killed:
            problems.append(_how(code))
        out.append(_verdict("process", name, asked, achieved, problems))
    return out


# ----------------------------------------------------------------------------- shaping, delay and loss


def _span(values: list) -> list[float] | None:
    vals = [v for v in (_num(x) for x in values) if v is not None]
    return [min(vals), max(vals)] if vals else None


def shaping_effects(run: Run) -> list[Effect]:
    """The ``shaping`` and ``netem`` effects of a run whose network was built (none without
    ``topology.json``; see the module doc)."""
    links = [l for l in ((run.topology or {}).get("links") or []) if isinstance(l, dict)]
    if not links:
        return []
    doc = run.shaping
    missing = ["no shaping.json (an older version): the build's read-back verdict was not recorded"]
    asked = {
        "links": len(links),
        "bw_mbps": sorted({v for v in (_num(l.get("bw_mbps")) for l in links) if v is not None}),
    }
    if doc:
        errors = list(doc.get("errors") or [])
        shaping = _verdict(
            "shaping",
            "links",
            asked,
            {"ends": doc.get("ends"), "errors": errors},
            [f"{len(errors)} link end(s) not shaped as asked, first {errors[0]}"] if errors else [],
        )
    else:
        shaping = _verdict("shaping", "links", asked, {}, [], missing)
    topo = (run.spec or {}).get("topology") or (run.topology or {}).get("spec") or {}
    delay, loss = _num(topo.get("delay_ms")) or 0.0, _num(topo.get("loss_pct")) or 0.0
    netem = doc.get("netem") or {}
    ends = [v for l in links for v in (l.get("shaping") or {}).values() if isinstance(v, dict)]
    achieved = {
        "available": netem.get("available"),
        "ends": netem.get("ends"),
        "delay_ms": (lambda s: None if s is None else [v / run.scale for v in s])(
            _span([e.get("delay_ms") for e in ends])
        ),
        "loss_pct": _span([e.get("loss_pct") for e in ends]),
        "errors": list(netem.get("errors") or []),
    }
    asked = {"delay_ms": delay, "loss_pct": loss}
    if not delay and not loss:
        why = "the spec asks for no delay or loss" + (
            "; this machine's kernel has no netem" if netem.get("available") is False else ""
        )
        effect = _verdict("netem", "delay/loss", asked, achieved, [], [why])
    elif not doc:
        effect = _verdict("netem", "delay/loss", asked, achieved, [], missing)
    else:
        errs = achieved["errors"]
        effect = _verdict(
            "netem",
            "delay/loss",
            asked,
            achieved,
            [f"{len(errs)} link end(s) without the delay or loss asked, first {errs[0]}"] if errs else [],
        )
    return [shaping, effect]


# ----------------------------------------------------------------------------- the rule


def check(run: Run, link_tx: dict[str, int | None] | None = None, tolerance: float = 0.10) -> list[Effect]:
    """Every effect the run's spec asked for, judged (see the module doc): background flows,
    captures, scheduled events, processes, then shaping and netem.

    Args:
        run: the loaded run (:func:`analysis.load.load`).
        link_tx: host -> bytes it sent over its link(s) during the capture (the summary's
            ``bytes.per_host[...].tx``); None: the flows' link counters are not checked.
        tolerance: the fraction a background flow's rate may be off (see
            :func:`background_effects`); :func:`analysis.metrics.compute_summary` gives
            :data:`analysis.metrics.RATE_TOLERANCE`, the links' own.
    """
    return (
        background_effects(run, link_tx, tolerance)
        + capture_effects(run)
        + event_effects(run)
        + process_effects(run)
        + shaping_effects(run)
    )


def unverified_lines(effects: list[Effect]) -> list[str]:
    """``<kind> <name>: <reason>`` of every effect not done (``verified`` False), in order."""
    return [f"{e.kind} {e.name}: {e.reason}" for e in effects if e.verified is False]


def apply_rule(s: RunSummary) -> None:
    """:data:`EFFECTS_RULE` on a summary whose ``fidelity.unverified`` is filled: an ``ok``
    run with a line there becomes ``failed``, its ``error`` :data:`UNDONE` followed by the
    lines, one per line. Any other status and error are kept."""
    if s.status == "ok" and s.fidelity is not None and s.fidelity.unverified:
        s.status = "failed"
        s.error = UNDONE + "\n".join(s.fidelity.unverified)
