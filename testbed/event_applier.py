"""Scheduled events of a run (the spec's ``events``, :mod:`traffic.event_spec`): checked before
anything is built, applied while the run trains, recorded in ``schedule.jsonl``.

:func:`check` refuses, at planning, what needs the topology and the plan to see: a link, host
or process that will not exist, a slowdown on a host that computes nothing, a shaped rate
outside [:data:`testbed.shaping.MIN_RATE_MBPS`, :data:`testbed.shaping.MAX_RATE_MBPS`], a
real-compute straggler on a machine without the cpu cgroup controller.

:class:`Schedule` runs in a thread of the harness. It follows the runtime's event logs
(``events/*.jsonl``, :class:`testbed.progress.EventTail`) to know the global iteration count
(the fewest iterations any worker has finished; a killed process no longer counts) and the
start of the first measured iteration (the earliest worker's start of iteration
``warmup_iterations``; until one is seen, the earliest end of the iteration before it, or of
``setup`` when there is no warm-up). ``at_iteration: N`` fires when every worker has finished
iteration N-1 (N = 0: at once); ``at_s: S`` fires ``S x scale`` real seconds after the first
measured iteration started. (A researcher's program that marks no iterations,
:mod:`traffic.marks`, reaches neither: its events other than ``at_iteration: 0`` are recorded
as not applied.) Actions:

``link_rate``
    the htb class of both ends of the link(s) changed in place to rate = ceil = ``bw_mbps /
    scale`` and read back (:meth:`testbed.shaping.LinkShaper.set_rate`, over netlink: the
    switch end in the root namespace, the host end in the host's namespace, each on its
    machine); a read-back off by more than :data:`testbed.shaping.RATE_TOLERANCE` is an
    error of the event.
``link_down`` / ``link_up``
    the switch-side interface(s) of the link set down / up (the veth peer loses its carrier).
``compute_slowdown``
    emulated compute: nothing here (every process on the host applies it,
    :class:`traffic.event_spec.ComputeSlowdown`), recorded when the trigger is reached; real
    compute: every process in the host's network namespace moved into a cgroup with a quota of
    1/slowdown of one core (:mod:`testbed.cgroups`; a slowdown of 1 removes it).
``kill``
    the ``kill`` callable of the harness is called with the process's name.

``schedule.jsonl`` holds one JSON object per event, in the order applied: ``index`` (in the
spec), ``kind``, ``target``, its trigger (``at_s`` or ``at_iteration``), ``applied``
(true), ``ts`` (unix s when applied), ``emulated_s`` (emulated s since the first measured
iteration started; null before it), ``iteration`` (the global iteration count then), and as
they apply ``bw_mbps`` (emulated), ``shaped_mbps`` (this machine's), ``readback_mbps`` ({iface:
Mbit/s read back, this machine's}), ``rate_tolerance`` (the fraction a read-back may be off,
:data:`testbed.shaping.RATE_TOLERANCE`), ``ifaces``, ``slowdown``, ``cgroup``, ``cgroup_version``,
``quota_us``, ``period_us``, ``pids``; ``error`` when applying failed. Events never reached
are written at :meth:`Schedule.stop` with ``applied`` false (and ``ts`` null).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from mininet.util import natural

from common.errors import FieldError, SpecError, TestbedError
from common.validation import load_yaml
from testbed.cgroups import MISSING, CpuThrottle, cpu_controller, netns_pids
from testbed.progress import EventTail
from testbed.shaping import RATE_TOLERANCE, LinkShaper, link_ends, switch_ends
from topologies.hosts import CORE
from topologies.spec import rate_error
from traffic.event_spec import COMPUTE_ROLES, ScheduledEvent
from traffic.rundir import read_json

log = logging.getLogger("testbed.event_applier")

__all__ = ["Schedule", "check", "resolve_link", "SCHEDULE_FILE"]

#: the record of a run's scheduled events, in its run directory
SCHEDULE_FILE = "schedule.jsonl"
_LIST_MAX = 16


def _names(items: Iterable[str]) -> str:
    """Sorted names for a message, cut after :data:`_LIST_MAX`."""
    items = sorted(set(items), key=natural)
    more = f", ... ({len(items)} in all)" if len(items) > _LIST_MAX else ""
    return ", ".join(items[:_LIST_MAX]) + more if items else "none"


def link_tokens(links: list[dict], switches: set[str]) -> list[str]:
    """Every link token the topology has: ``uplink:<tor>`` per ToR-core link, ``host:<host>``
    per host with an access link."""
    out = []
    for l in links:
        if l.get("class") == "uplink":
            tor = l["node2"] if l["node1"] == CORE else l["node1"]
            out.append(f"uplink:{tor}")
        elif l.get("class") == "host":
            host = l["node1"] if l["node1"] not in switches else l["node2"]
            out.append(f"host:{host}")
    return list(dict.fromkeys(out))


def resolve_link(token: str, links: list[dict], switches: set[str]) -> list[dict]:
    """The links a token names, as ``topology.json`` (or
    :func:`testbed.capture.pcap.topo_links`) lists them: ``uplink:<tor>`` the ToR-core link
    of that ToR, ``host:<host>`` every access link of that host (a host with several
    interfaces has several).

    Raises:
        LookupError: the token names no link (the message lists the tokens there are).
    """
    kind, _, name = token.partition(":")
    if kind == "uplink":
        found = [
            l
            for l in links
            if l.get("class") == "uplink" and name in (l["node1"], l["node2"]) and name in switches and name != CORE
        ]
    elif kind == "host":
        found = [
            l for l in links if l.get("class") == "host" and name in (l["node1"], l["node2"]) and name not in switches
        ]
    else:
        found = []
    if not found:
        raise LookupError(f"a link of the topology: {_names(link_tokens(links, switches))}")
    return found


def _proc_fields(p) -> tuple[str, str, str]:
    """(name, role, host) of a :class:`traffic.schemes.ProcessPlan` or a processes.json entry."""
    if isinstance(p, dict):
        return p["name"], p["role"], p["host"]
    return p.name, p.role, p.host


def check(
    events: list[ScheduledEvent],
    links: list[dict],
    switches: set[str],
    hosts,
    processes,
    *,
    compute_mode: str | None = None,
    scale: float | str | None = None,
    prefix: str = "events",
) -> None:
    """Refuse scheduled events the planned run cannot apply, before anything is built.

    Args:
        events: the spec's ``events``.
        links: the links (:func:`testbed.capture.pcap.topo_links` of the Topo, or
            ``topology.json``'s).
        switches: the switches' names.
        hosts: the hosts (:class:`topologies.hosts.HostInfo` s, or names).
        processes: the plan (:class:`traffic.schemes.ProcessPlan` s, or processes.json entries).
        compute_mode: ``workload.compute.mode``; ``real`` makes a ``compute_slowdown`` need
            the cpu cgroup controller (:func:`testbed.cgroups.cpu_controller`).
        scale: the time dilation (``auto``/None: checked at 1, the smallest ``auto`` gives).
        prefix: the dotted path of the events list.

    Raises:
        SpecError: every problem, by field: an unknown link (naming those there are), a host
            the topology lacks or one that runs no worker, a process the plan lacks, a shaped
            rate ``bw_mbps / scale`` outside the shaper's range
            (:func:`topologies.spec.rate_error`), a real-compute slowdown without the cpu
            cgroup controller.
    """
    errors: list[FieldError] = []
    host_names = [h if isinstance(h, str) else h.name for h in hosts]
    procs = [_proc_fields(p) for p in processes]
    s = float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) else 1.0
    ctl = None
    for i, e in enumerate(events):
        path = f"{prefix}[{i}]"
        kind = e.kind
        if kind in ("link_rate", "link_down", "link_up"):
            try:
                resolve_link(e.link, links, switches)
            except LookupError as err:
                errors.append(FieldError(f"{path}.link", e.link, str(err)))
            if kind == "link_rate" and (bad := rate_error(f"{path}.bw_mbps", e.bw_mbps, s)):
                errors.append(bad)
        elif kind == "compute_slowdown":
            computing = {h for _, role, h in procs if role in COMPUTE_ROLES}
            if e.host not in host_names:
                errors.append(FieldError(f"{path}.host", e.host, f"a host of the topology: {_names(host_names)}"))
            elif e.host not in computing:
                errors.append(
                    FieldError(
                        f"{path}.host",
                        e.host,
                        f"a host that runs a worker (nothing computes on {e.host}): {_names(computing)}",
                    )
                )
            if compute_mode == "real":
                ctl = ctl or cpu_controller()
                if ctl is None:
                    errors.append(
                        FieldError(
                            f"{path}.compute_slowdown",
                            e.compute_slowdown,
                            f"a slowdown this machine can apply: with workload.compute.mode 'real' "
                            f"it throttles the host's processes, which needs {MISSING}; it has "
                            f"neither (or use compute.mode 'emulated')",
                        )
                    )
        elif kind == "kill":
            if e.kill not in {n for n, _, _ in procs}:
                errors.append(
                    FieldError(f"{path}.kill", e.kill, f"a process of the run: {_names(n for n, _, _ in procs)}")
                )
    if errors:
        raise SpecError.of(errors)


# ---------------------------------------------------------------------------- the schedule


class Schedule:
    """Applies a run's scheduled events while it trains (a thread; see the module doc).

    Args:
        events: the spec's ``events`` (checked by :func:`check`).
        topology: the run's ``topology.json`` document (links, switches).
        run_dir: the run directory (``events/`` is read, ``schedule.jsonl`` written).
        scale: the time dilation factor (``at_s`` and ``bw_mbps`` are emulated).
        warmup_iterations: ``workload.warmup_iterations`` (the first measured iteration).
        netns_pids: host name -> the pid of its Mininet shell (its network namespace).
        kill: kills a process of the run by its name (``kill`` events).
        on_cgroup: called with the path of every cgroup made (the run's ledger:
            :meth:`testbed.ledger.Ledger.add_cgroup`).
        compute_mode: ``workload.compute.mode`` (None: read from ``run_dir/spec.yaml``);
            ``real`` makes ``compute_slowdown`` throttle the host with a cgroup.
        poll_s: how often the event logs are read, seconds (an ``at_s`` deadline is waited
            for exactly).
        shaper: what changes links (default :class:`LinkShaper` over ``netns_pids``).
        origin: unix time ``at_s`` counts from instead of the first measured iteration: the
            launch, for a ``workload.program`` (which may mark no iterations at all).

    Usage::

        sched = Schedule(exp.events, topo, run_dir, exp.scale, exp.workload.warmup_iterations,
                         {h: n.pid for h, n in network.hosts.items()}, kill, on_cgroup=ledger.add_cgroup)
        sched.start()
        ...
        sched.stop()   # idempotent; records the events never reached, removes cgroups
    """

    def __init__(
        self,
        events: list[ScheduledEvent],
        topology: dict,
        run_dir: Path,
        scale: float,
        warmup_iterations: int,
        netns_pids: dict[str, int],
        kill: Callable[[str], None],
        *,
        on_cgroup: Callable[[str], None] | None = None,
        compute_mode: str | None = None,
        poll_s: float = 0.05,
        shaper: LinkShaper | None = None,
        origin: float | None = None,
    ):
        self.events = list(events)
        self.topology = topology
        self.run_dir = Path(run_dir)
        self.scale = float(scale)
        self.warmup = int(warmup_iterations)
        self.netns_pids = dict(netns_pids)
        self.kill = kill
        self.on_cgroup = on_cgroup
        self.compute_mode = compute_mode if compute_mode is not None else self._spec_compute_mode()
        self.poll_s = float(poll_s)
        self.shaper = shaper if shaper is not None else LinkShaper(self.netns_pids)
        self.origin = origin
        self.switches = {s["name"] for s in topology.get("switches", [])}
        self.pending: list[int] = list(range(len(self.events)))
        self.records: list[dict] = []
        self.killed: set[str] = set()
        self._tail = EventTail(self.run_dir / "events", kinds=("iteration", "setup"))
        self._workers: set[str] | None = None
        self._seen_workers: set[str] = set()
        self._done: dict[str, int] = {}  # worker -> iterations finished (highest index + 1)
        self._start_measured: float | None = None  # earliest start of iteration `warmup`
        self._end_before: float | None = None  # earliest end of the iteration (or setup) before it
        self._throttles: dict[str, CpuThrottle] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def _spec_compute_mode(self) -> str:
        try:
            spec = load_yaml((self.run_dir / "spec.yaml").read_text()) or {}
            return ((spec.get("workload") or {}).get("compute") or {}).get("mode") or "emulated"
        except (OSError, ValueError, AttributeError):
            return "emulated"

    # ------------------------------------------------------------------ progress of the run

    @property
    def iteration(self) -> int:
        """The global iteration count: the fewest iterations any (not killed) worker has
        finished (0 before any)."""
        workers = (self._workers if self._workers is not None else self._seen_workers) - self.killed
        return min((self._done.get(w, 0) for w in workers), default=0)

    @property
    def t_measured(self) -> float | None:
        """Unix time ``at_s`` counts from: :attr:`origin` if given, else when the first
        measured iteration started (see the module doc), or None before it."""
        if self.origin is not None:
            return self.origin
        return self._start_measured if self._start_measured is not None else self._end_before

    def _read_workers(self) -> None:
        if self._workers is not None:
            return
        try:
            doc = read_json(self.run_dir / "processes.json")
            self._workers = {p["name"] for p in doc["processes"] if p.get("role") == "worker"}
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def _follow(self) -> None:
        """Take in what the processes wrote since the last call."""
        self._read_workers()
        for ev in self._tail.read():
            kind, proc = ev.get("kind"), ev.get("proc")
            try:
                ts, end = float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur") or 0.0)
            except (KeyError, TypeError, ValueError):
                continue
            if kind == "setup":
                if self.warmup == 0 and ev.get("role") == "worker":
                    self._end_before = end if self._end_before is None else min(self._end_before, end)
                continue
            if ev.get("role") != "worker" or not isinstance(ev.get("iteration"), int):
                continue
            it = ev["iteration"]
            self._seen_workers.add(proc)
            self._done[proc] = max(self._done.get(proc, 0), it + 1)
            if it == self.warmup:
                self._start_measured = ts if self._start_measured is None else min(self._start_measured, ts)
            elif it == self.warmup - 1:
                self._end_before = end if self._end_before is None else min(self._end_before, end)

    def _due(self, i: int, now: float) -> float | None:
        """When event ``i`` is due (unix s; <= now once reached), None if not yet known."""
        what, v = self.events[i].trigger
        if what == "at_iteration":
            return now if self.iteration >= v else None
        t = self.t_measured
        return None if t is None else t + v * self.scale

    # ------------------------------------------------------------------ applying

    def poll(self, now: float | None = None) -> list[dict]:
        """Read the event logs and apply every event that is due, in the order they fell
        due (ties: spec order). Returns the records written. Never raises for an event's
        failure (recorded in its ``error``)."""
        with self._lock:
            if self._stopped:
                return []
            self._follow()
            now = time.time() if now is None else now
            due = []
            for i in self.pending:
                t = self._due(i, now)
                if t is not None and t <= now:
                    due.append((t, i))
            out = []
            for _, i in sorted(due):
                self.pending.remove(i)
                out.append(self._apply(i))
            return out

    def next_deadline(self, now: float) -> float:
        """Seconds until the next poll: :attr:`poll_s`, or less when an ``at_s`` event falls
        due sooner."""
        wait = self.poll_s
        for i in self.pending:
            t = self._due(i, now)
            if t is not None and self.events[i].trigger[0] == "at_s":
                wait = min(wait, max(0.0, t - now))
        return wait

    def _record(self, i: int, applied: bool) -> dict:
        e = self.events[i]
        what, v = e.trigger
        t_m = self.t_measured
        now = time.time() if applied else None
        rec = {
            "index": i,
            "kind": e.kind,
            "target": e.target,
            what: v,
            "applied": applied,
            "ts": now,
            "emulated_s": (now - t_m) / self.scale if applied and t_m is not None else None,
            "iteration": self.iteration,
        }
        if e.kind == "link_rate":
            rec.update(bw_mbps=e.bw_mbps, shaped_mbps=e.bw_mbps / self.scale, rate_tolerance=RATE_TOLERANCE)
        if e.kind == "compute_slowdown":
            rec["slowdown"] = e.compute_slowdown
        return rec

    def _apply(self, i: int) -> dict:
        e = self.events[i]
        rec = self._record(i, True)
        try:
            if e.kind in ("link_rate", "link_down", "link_up"):
                links = resolve_link(e.link, self.topology.get("links", []), self.switches)
                if e.kind == "link_rate":
                    back = self.shaper.set_rate(link_ends(links), rec["shaped_mbps"])
                    rec.update(ifaces=list(back), readback_mbps=back)
                    off = [
                        f"{k}: {v}"
                        for k, v in back.items()
                        if v is None or abs(v - rec["shaped_mbps"]) > RATE_TOLERANCE * rec["shaped_mbps"]
                    ]
                    if off:
                        raise TestbedError(f"asked {rec['shaped_mbps']:g} Mbit/s, the kernel has {', '.join(off)}")
                else:
                    rec["ifaces"] = self.shaper.set_state(switch_ends(links, self.netns_pids), up=e.kind == "link_up")
            elif e.kind == "compute_slowdown":
                if self.compute_mode == "real":
                    rec.update(self._throttle(e.host, e.compute_slowdown))
            elif e.kind == "kill":
                self.killed.add(e.kill)  # no longer counted, even if the kill fails
                self.kill(e.kill)
        except Exception as err:  # noqa: BLE001 - recorded and logged, never fatal to the run
            rec["error"] = f"{type(err).__name__}: {err}"
            log.error("scheduled event %d (%s %s) failed: %s", i, e.kind, e.target, rec["error"])
        else:
            log.info("scheduled event %d applied: %s %s at iteration %d", i, e.kind, e.target, rec["iteration"])
        self._write(rec)
        return rec

    def _throttle(self, host: str, slowdown: float) -> dict:
        """Real compute: hold ``host``'s processes to 1/``slowdown`` of a core (1: release them)."""
        if slowdown == 1:
            t = self._throttles.pop(host, None)
            return {"cgroup": str(t.path) if t else None, "cgroup_removed": t.remove() if t else True}
        t = self._throttles.get(host)
        if t is None:
            ctl = cpu_controller()
            if ctl is None:
                raise TestbedError(f"cannot throttle {host}: this machine lacks {MISSING}")
            t = self._throttles[host] = CpuThrottle(ctl, f"{self.run_dir.name}-{host}", on_cgroup=self.on_cgroup)
        return t.apply(slowdown, netns_pids(self.netns_pids[host]))

    def _write(self, rec: dict) -> None:
        self.records.append(rec)
        try:
            with open(self.run_dir / SCHEDULE_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, separators=(",", ":"), default=str) + "\n")
        except OSError as e:  # a full disk: the harness log still says what happened
            log.error("could not write %s: %s", self.run_dir / SCHEDULE_FILE, e)

    # ------------------------------------------------------------------ thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
                wait = self.next_deadline(time.time())
            except Exception:  # noqa: BLE001 - a bug here must not end the run
                log.exception("scheduled events: poll failed")
                wait = self.poll_s
            if not self.pending:
                return
            self._stop.wait(wait)

    def start(self) -> Schedule:
        """Start following the run in a daemon thread (nothing when there are no events)."""
        if self.events and self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._loop, name="schedule", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, record the events never reached (``applied`` false) and remove
        every cgroup made (processes back where they were). Idempotent; never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                self._follow()
            except Exception:  # noqa: BLE001
                log.exception("scheduled events: reading the event logs failed")
            for i in list(self.pending):
                self.pending.remove(i)
                self._write(self._record(i, False))
            for host, t in list(self._throttles.items()):
                try:
                    t.remove()
                except Exception:  # noqa: BLE001 - the ledger sweep removes it too
                    log.exception("could not remove the cgroup of %s", host)
            self._throttles.clear()
