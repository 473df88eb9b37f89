"""Scheduled events of a run (the spec's ``events:`` list): network changes and stragglers.

Each event has exactly one trigger and exactly one action::

    events:
      - {at_s: 10, link: uplink:tor1, bw_mbps: 50}            # emulated s from the first measured iteration
      - {at_s: 20, link: host:h3, down: true}
      - {at_s: 22, link: host:h3, up: true}
      - {at_iteration: 30, host: h4, compute_slowdown: 2.0}   # a straggler from iteration 30 on
      - {at_iteration: 40, kill: worker3}                     # a failure

Triggers: ``at_s``, emulated seconds (>= 0) counted from the start of the first measured
iteration (global iteration ``workload.warmup_iterations``; for a ``workload.program``, which
may mark no iterations, from the launch of its processes), so ``at_s * scale`` real seconds
under time dilation; ``at_iteration``, a global iteration index (from 0, below
``workload.iterations``). Actions (kinds): ``link_rate`` (``link`` + ``bw_mbps``, emulated
Mbit/s, shaped at ``bw_mbps / scale``), ``link_down`` / ``link_up`` (``link`` + ``down: true``
/ ``up: true``), ``compute_slowdown`` (``host`` + ``compute_slowdown``, a factor > 0 on the
host's emulated compute; 1 restores it) and ``kill`` (a process name). Link tokens:
``uplink:<tor>`` (the ToR-core link of that ToR; ``rack_core`` only) and ``host:<host>``
(every access link of that host).

This package owns the section because the runtime reads it (:class:`ComputeSlowdown`, the
straggler of emulated compute); the harness applies the rest (:mod:`testbed.event_applier`) and
checks what needs the built topology (unknown links, hosts, processes) before anything is
built. :func:`event_errors` holds the checks that need only the spec.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import field_validator

from common.errors import FieldError, SpecError
from common.validation import SpecModel, validate
from topologies.spec import rate_error

__all__ = [
    "ScheduledEvent",
    "KINDS",
    "TRIGGERS",
    "LINK_PREFIXES",
    "COMPUTE_ROLES",
    "MAX_SLOWDOWN",
    "event_errors",
    "parse_events",
    "ComputeSlowdown",
]

#: the kinds of action, as recorded in ``schedule.jsonl``
KINDS = ("link_rate", "link_down", "link_up", "compute_slowdown", "kill")
#: the trigger fields
TRIGGERS = ("at_s", "at_iteration")
#: the link tokens' prefixes: ``uplink:<tor>``, ``host:<host>``
LINK_PREFIXES = ("uplink:", "host:")
#: roles whose processes compute (a ``compute_slowdown`` host must run one): workers, and
#: Stanza's FC workers (Stanza Sec. 3.2)
COMPUTE_ROLES = ("worker", "fc")
#: the largest slowdown factor (with real compute it becomes a cgroup quota of 1/factor of a
#: core; cgroup v1 takes at least 1 ms of quota per period of at most 1 s)
MAX_SLOWDOWN = 1000.0

_ACTIONS = (
    "one action: {link, bw_mbps} (a link's rate), {link, down: true}, {link, up: true}, "
    "{host, compute_slowdown} (a straggler) or {kill: <process name>}"
)
_TRIGGER = (
    "one trigger: at_s (emulated seconds >= 0 from the start of the first measured iteration) or "
    "at_iteration (a global iteration index >= 0)"
)
_LINK = (
    "uplink:<tor> (the ToR-core link of that ToR, e.g. uplink:tor1) or host:<host> (that host's access "
    "link, e.g. host:h3)"
)


class ScheduledEvent(SpecModel):
    """One scheduled event: one trigger (``at_s`` or ``at_iteration``) and one action (see
    the module doc). Which fields go together is checked by :func:`event_errors`."""

    at_s: float | None = None
    """Trigger: emulated seconds from the start of the first measured iteration (global
    iteration ``workload.warmup_iterations``), a number >= 0 with ``at_s x scale`` below
    ``run.timeout_s`` (the run is stopped before a later one comes)."""
    at_iteration: int | None = None
    """Trigger: a global iteration index (from 0), below ``workload.iterations``."""
    link: str | None = None
    """The link of a ``bw_mbps``, ``down`` or ``up`` action: ``uplink:<tor>`` or ``host:<host>``."""
    bw_mbps: float | None = None
    """The link's new rate, emulated Mbit/s > 0 (shaped at ``bw_mbps / scale`` on both ends)."""
    down: bool | None = None
    """``true``: take the link down (its switch-side ends), until an ``up`` event."""
    up: bool | None = None
    """``true``: bring the link back up."""
    host: str | None = None
    """The host of a ``compute_slowdown``."""
    compute_slowdown: float | None = None
    """Factor on the host's compute from the trigger on (2: twice as slow; 1: back to
    normal), in (0, 1000]. Emulated compute: each process on the host multiplies its
    per-layer times by it; real compute: the harness throttles the host's processes to
    1/factor of a core with the cpu cgroup controller."""
    kill: str | None = None
    """Action: kill this process (a name of ``processes.json``, e.g. ``worker3``)."""

    @field_validator("at_s")
    @classmethod
    def _at_s(cls, v):
        if v is not None and v < 0:
            raise ValueError(
                "a time >= 0: emulated seconds from the start of the first measured iteration "
                "(a time in the past is not possible)"
            )
        return v

    @field_validator("at_iteration")
    @classmethod
    def _at_iteration(cls, v):
        if v is not None and v < 0:
            raise ValueError("an iteration index >= 0 (iterations are numbered from 0)")
        return v

    @field_validator("bw_mbps")
    @classmethod
    def _bw(cls, v):
        if v is not None and not v > 0:
            raise ValueError("a rate > 0, emulated Mbit/s (to stop a link, use down: true)")
        return v

    @field_validator("compute_slowdown")
    @classmethod
    def _slowdown(cls, v):
        if v is not None and not 0 < v <= MAX_SLOWDOWN:
            raise ValueError(f"a factor in (0, {MAX_SLOWDOWN:g}] (2: compute twice as slow; 1: normal)")
        return v

    @field_validator("link")
    @classmethod
    def _link(cls, v):
        if v is not None and not (v.startswith(LINK_PREFIXES) and v.split(":", 1)[1]):
            raise ValueError(_LINK)
        return v

    # ------------------------------------------------------------------ what it is

    @property
    def trigger(self) -> tuple[str, float | int]:
        """``("at_s", seconds)`` or ``("at_iteration", index)`` (a valid event has one)."""
        return ("at_s", self.at_s) if self.at_s is not None else ("at_iteration", self.at_iteration)

    @property
    def kind(self) -> str | None:
        """The action's kind (one of :data:`KINDS`), None if it has none."""
        if self.bw_mbps is not None:
            return "link_rate"
        if self.down:
            return "link_down"
        if self.up:
            return "link_up"
        if self.compute_slowdown is not None:
            return "compute_slowdown"
        if self.kill is not None:
            return "kill"
        return None

    @property
    def target(self) -> str | None:
        """What the action acts on: the link token, the host, or the process name."""
        kind = self.kind
        if kind in ("link_rate", "link_down", "link_up"):
            return self.link
        if kind == "compute_slowdown":
            return self.host
        return self.kill

    def given(self) -> dict:
        """The fields written (no nulls): what ``spec.yaml`` and error messages show."""
        return self.model_dump(exclude_none=True)


def _shape_errors(e: ScheduledEvent, path: str) -> list[FieldError]:
    """One trigger, one action, and the fields each action needs."""
    out = []
    triggers = [t for t in TRIGGERS if getattr(e, t) is not None]
    if not triggers:
        out.append(FieldError(path, e.given(), _TRIGGER))
    elif len(triggers) > 1:
        out.append(FieldError(f"{path}.at_iteration", e.at_iteration, f"left out when at_s is given ({_TRIGGER})"))
    for flag in ("down", "up"):
        if getattr(e, flag) is False:
            out.append(FieldError(f"{path}.{flag}", False, f"true, or leave it out ({_ACTIONS})"))
    actions = [
        f
        for f in ("bw_mbps", "down", "up", "compute_slowdown", "kill")
        if getattr(e, f) is not None and getattr(e, f) is not False
    ]
    if not actions:
        if any(getattr(e, f) is False for f in ("down", "up")):
            pass  # reported above
        elif e.link is not None:
            out.append(FieldError(path, e.given(), f"an action on link {e.link}: bw_mbps, down: true or up: true"))
        elif e.host is not None:
            out.append(
                FieldError(
                    f"{path}.compute_slowdown",
                    None,
                    f"the factor on host {e.host}'s compute "
                    f"(> 0, e.g. 2.0: twice as slow), the one action that acts on a host",
                )
            )
        else:
            out.append(FieldError(path, e.given(), _ACTIONS))
        return out
    elif len(actions) > 1:
        out.append(
            FieldError(
                f"{path}.{actions[1]}",
                getattr(e, actions[1]),
                f"left out: {actions[0]} is this event's action ({_ACTIONS}; several actions need several events)",
            )
        )
    link_action = bool(set(actions) & {"bw_mbps", "down", "up"})
    if link_action and e.link is None:
        out.append(FieldError(f"{path}.link", None, f"the link to act on: {_LINK}"))
    if e.link is not None and not link_action and actions:
        out.append(
            FieldError(f"{path}.link", e.link, f"left out: only bw_mbps, down and up act on a link ({_ACTIONS})")
        )
    if "compute_slowdown" in actions and e.host is None:
        out.append(FieldError(f"{path}.host", None, "the host whose compute slows down, e.g. h4"))
    if e.host is not None and "compute_slowdown" not in actions:
        out.append(FieldError(f"{path}.host", e.host, f"left out: only compute_slowdown acts on a host ({_ACTIONS})"))
    if e.kill is not None and not e.kill:
        out.append(FieldError(f"{path}.kill", e.kill, "a process name, e.g. worker3"))
    return out


#: which part of its target an action changes: two events changing the same part of the
#: same target at the same trigger conflict (their order would be undefined)
_ASPECT = {
    "link_rate": "rate",
    "link_down": "state (up or down)",
    "link_up": "state (up or down)",
    "compute_slowdown": "compute",
    "kill": "life",
}


def event_errors(
    events: list[ScheduledEvent],
    *,
    iterations: int,
    topology_kind: str,
    scale: float | str = 1.0,
    timeout_s: float = math.inf,
    prefix: str = "events",
) -> list[FieldError]:
    """The checks of ``events`` that need only the spec (each event's fields being valid).

    Args:
        events: the spec's events.
        iterations: ``workload.iterations`` (an ``at_iteration`` must be below it).
        topology_kind: ``topology.kind`` (``uplink:`` links exist only in ``rack_core``).
        scale: the time dilation (``auto``: checked at 1, the least it resolves to, and again
            once resolved).
        timeout_s: ``run.timeout_s`` (an ``at_s`` must fall inside the run).
        prefix: the dotted path of the list.

    Returns:
        one :class:`FieldError` per problem: no trigger or two, no action or two, an action
        without its link or host (or with one it does not use), ``down``/``up`` false, an
        ``at_iteration`` at or beyond ``iterations``, an ``uplink:`` link in a ``rack``
        topology, a dilated time ``at_s x scale`` not below ``timeout_s`` (the run is stopped
        before it comes; the time also waits in a thread, which takes at most
        ``threading.TIMEOUT_MAX``), a shaped rate ``bw_mbps / scale`` outside the shaper's
        range (:func:`topologies.spec.rate_error`; under ``auto`` only its minimum, at 1),
        and two events that change the same part of the same target at the same trigger.
    """
    out: list[FieldError] = []
    auto = isinstance(scale, str)
    s = 1.0 if auto else float(scale)
    seen: dict[tuple, int] = {}
    for i, e in enumerate(events):
        path = f"{prefix}[{i}]"
        shape = _shape_errors(e, path)
        out += shape
        if e.at_iteration is not None and e.at_iteration >= iterations:
            out.append(
                FieldError(
                    f"{path}.at_iteration",
                    e.at_iteration,
                    f"an iteration index below workload.iterations ({iterations}): iterations are "
                    f"numbered from 0, and a later one never comes",
                )
            )
        if e.at_s is not None and not e.at_s * s < timeout_s:
            out.append(
                FieldError(
                    f"{path}.at_s",
                    e.at_s,
                    f"a time whose dilated value (at_s x scale {s:g} = "
                    f"{e.at_s * s:g} s) is below run.timeout_s ({timeout_s:g} s): the run is stopped "
                    f"before it comes",
                )
            )
        if e.bw_mbps is not None and (err := rate_error(f"{path}.bw_mbps", e.bw_mbps, s, upper=not auto)):
            out.append(err)
        if e.link is not None and e.link.startswith("uplink:") and topology_kind != "rack_core":
            out.append(
                FieldError(
                    f"{path}.link",
                    e.link,
                    f"host:<host>: uplinks exist only with topology.kind "
                    f"'rack_core' (this topology is {topology_kind!r})",
                )
            )
        if shape:
            continue
        key = (e.trigger, e.target, _ASPECT[e.kind])
        if key in seen:
            j = seen[key]
            out.append(
                FieldError(
                    path,
                    e.given(),
                    f"an event that does not change the {_ASPECT[e.kind]} of "
                    f"{e.target} at the same trigger as {prefix}[{j}] ({events[j].given()}): "
                    f"their order would be undefined",
                )
            )
        else:
            seen[key] = i
    return out


def parse_events(data: Any, prefix: str = "events") -> list[ScheduledEvent]:
    """The ``events`` list of a spec (e.g. a run's ``spec.yaml``) as models.

    Raises:
        SpecError: not a list, or an event whose fields are malformed.
    """
    if data is None:
        return []
    if not isinstance(data, list):
        raise SpecError(prefix, data, "a list of events (mappings)")
    return [validate(ScheduledEvent, d, f"{prefix}[{i}]") for i, d in enumerate(data)]


# ---------------------------------------------------------------------------- runtime side


class ComputeSlowdown:
    """The straggler factor of one process's emulated compute (a host's ``compute_slowdown``
    events), as the runtime applies it.

    The process tells it when each of its iterations starts (:meth:`iteration_started`,
    from :meth:`traffic.runtime.context.Context.maybe_crash`, which every loop calls once per
    iteration); :meth:`factor` is the multiplier of the emulated compute time at this moment
    (:class:`traffic.runtime.emulation.EmulatedCompute` applies it to every per-layer sleep).
    An ``at_iteration`` event takes effect at the start of that iteration of this process; an
    ``at_s`` event once ``at_s x scale`` real seconds have passed since this process started
    iteration ``warmup_iterations`` (its own clock: the harness's record of the same event, in
    ``schedule.jsonl``, uses the earliest worker's). Several events: the latest to take
    effect wins. Each taking effect is recorded as an instant event ``compute_slowdown``
    (``slowdown``, ``iteration``, ``event``: its index in the spec, and its trigger).

    Args:
        events: ``(index in the spec, event)`` pairs, the ``compute_slowdown`` events of
            this process's host.
        scale: the time dilation factor.
        warmup_iterations: ``workload.warmup_iterations``.
        log: the process's :class:`~traffic.runtime.events.EventLog` (or None).
        clock: seconds of a monotonic clock (for tests).
    """

    def __init__(
        self,
        events: list[tuple[int, ScheduledEvent]],
        scale: float,
        warmup_iterations: int,
        log=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pending = list(events)
        self.scale, self.warmup, self.log, self.clock = float(scale), int(warmup_iterations), log, clock
        self.current = 1.0
        self.iteration: int | None = None
        self.t_measured: float | None = None
        self.applied: list[dict] = []
        self._lock = threading.Lock()

    @classmethod
    def for_host(
        cls, events: list[ScheduledEvent], host: str | None, scale: float, warmup_iterations: int, log=None
    ) -> ComputeSlowdown | None:
        """The slowdown of ``host``'s processes, or None when no event slows it."""
        mine = [(i, e) for i, e in enumerate(events) if e.kind == "compute_slowdown" and e.host == host]
        return cls(mine, scale, warmup_iterations, log) if mine and host is not None else None

    def iteration_started(self, it: int) -> None:
        """This process starts iteration ``it`` now (takes effect what is due)."""
        with self._lock:
            self.iteration = it
            if self.t_measured is None and it >= self.warmup:
                self.t_measured = self.clock()
        self.factor()

    def factor(self) -> float:
        """The compute multiplier now (1 until an event takes effect)."""
        if not self.pending:
            return self.current
        with self._lock:
            now = self.clock()
            due = []  # (when it fell due, index, event): applied in that order, the latest wins
            for i, e in self.pending:
                what, v = e.trigger
                if what == "at_iteration":
                    if self.iteration is not None and self.iteration >= v:
                        due.append((now, i, e))
                elif self.t_measured is not None and now >= self.t_measured + v * self.scale:
                    due.append((self.t_measured + v * self.scale, i, e))
            for _, i, e in sorted(due, key=lambda d: (d[0], d[1])):
                self.pending.remove((i, e))
                self.current = float(e.compute_slowdown)
                what, v = e.trigger
                rec = {"event": i, "slowdown": self.current, what: v, "iteration": self.iteration}
                self.applied.append(rec)
                if self.log is not None:
                    self.log.instant("compute_slowdown", **rec)
            return self.current
