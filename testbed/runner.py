"""Run experiments: one run, or every point of a sweep, each in its own run directory.

Before anything is built or written, every point of the spec is validated and planned
(:func:`plan_experiment`: the hosts of its topology and the scheme's processes on them,
computed on the topology graph), so that a spec that cannot run fails at once with a
:class:`SpecError`; ``testbed run --dry-run`` stops there.

One run (docs/architecture.md, "The flow of one run")::

    run dir created (never reused, always inside the runs directory) -> provenance.json (with the
    machine cost model used), spec.yaml
    -> lock + ledger -> site (this machine, or the machines of a cluster: testbed.site)
    -> site.start_memory() -> site.build() -> scheme.plan() -> processes.json -> site.start_capture()
    -> background iperf3 servers -> background clients (each waits its start) + launch.start() -> watch()
    -> teardown (always: processes, background flows, capture, network, ledger sweep)
    -> summary.json

A failure anywhere is recorded in ``summary.json`` (status ``failed``, the error) and the
run directory keeps every log; a sweep goes on with its next point. Ctrl-C and SIGTERM tear
down the same way and stop the sweep.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mininet.log import StreamHandlerNoNewline

from analysis.metrics import summarize
from common.errors import FieldError, MissingRequirement, SpecError, TestbedError
from testbed import capacity, event_applier, launch, machine_costs
from testbed.background import Background
from testbed.capture import find_bwm_ng
from testbed.capture.pcap import find_tcpdump, resolve_ports, topo_links
from testbed.clean import sweep_dead_runs
from testbed.ledger import Ledger, NetworkLock
from testbed.lifetime import MISSING_HIERARCHY, process_hierarchy
from testbed.network import preflight as network_preflight
from testbed.progress import RunProgress, SweepProgress
from testbed.site import log_leftovers, open_site
from testbed.site.local import forks
from testbed.spec import AUTO, Experiment, expand_sweep, with_scale, write_spec
from topologies import bridge_port_errors, build_topo, hosts_of
from topologies.hosts import HostInfo
from traffic import rundir, schemes
from traffic.schemes import ProcessPlan
from traffic.summary import Bytes, Fidelity, IterationTime, RunSummary, Throughput

log = logging.getLogger("testbed")


@dataclass
class RunResult:
    """Where a run went, its summary (``summary.json``; a mapping given is validated into a
    :class:`~traffic.summary.RunSummary`) and, in a sweep, its point (the swept paths and
    their values, and the variant's name)."""

    run_dir: Path
    summary: RunSummary
    point: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.summary, RunSummary):
            self.summary = RunSummary.model_validate(self.summary)

    @property
    def ok(self) -> bool:
        return self.summary.status == "ok"


class _HarnessLog(logging.FileHandler):
    """logs/harness.log. A line that cannot be written (a full disk) is dropped silently:
    the run's failure and its summary say why, and logging's own traceback on stderr would
    bury that message."""

    def handleError(self, record):
        pass


def _harness_log(run_dir: Path) -> logging.Handler:
    rundir.open_private(run_dir / "logs" / "harness.log").close()  # created owner-only, then appended to
    h = _HarnessLog(run_dir / "logs" / "harness.log")
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    # Mininet makes every logger created after its import a MininetLogger with its own stderr
    # handler: the testbed's loggers write to the harness log only
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if (name == "testbed" or name.startswith("testbed.")) and isinstance(lg, logging.Logger):
            for other in [x for x in lg.handlers if isinstance(x, StreamHandlerNoNewline)]:
                lg.removeHandler(other)
    log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False  # the harness log holds the details (tracebacks); the CLI prints the outcome
    return h


class _Terminated(BaseException):
    """SIGTERM, turned into an exception so that teardown runs."""


_HARNESS_PID = os.getpid()


def _on_sigterm(signum, frame):
    # Libraries fork helpers that inherit this handler (pyroute2's NetNS does, and
    # terminates them with SIGTERM): in such a child, just exit, never run the teardown.
    if os.getpid() != _HARNESS_PID:
        os._exit(128 + signum)
    raise _Terminated()


def run_one(
    exp: Experiment,
    parent: Path,
    run_id: str,
    exclusive_id: bool = True,
    progress: RunProgress | None = None,
    zygote: launch.Zygote | None = None,
) -> RunResult:
    """Run one experiment (its sweep must be empty) in ``parent/run_id``; ``progress`` shows
    its phase and iterations while it runs (:mod:`testbed.progress`). ``zygote``: a running
    zygote the caller owns (a sweep's, shared by its points); this run forks from it if it
    is alive and ``run.launcher`` is ``zygote``, records its pid in the ledger and leaves it
    running; without one, a zygote of this run's own is started and ended.

    ``scale: auto`` is resolved as :func:`plan_experiment` does. Never raises for a failed
    run: the failure is in the returned summary. Raises only for problems that precede the
    run directory (it exists already, a bad point) and for Ctrl-C/SIGTERM,
    after teardown. Teardown is an ExitStack: whatever was started is stopped, last started
    first (processes, background flows, capture, network, then a sweep of the ledger).
    """
    if exp.scale == AUTO:  # called directly, not through run_experiment's planning
        exp = plan_experiment(exp)[0].exp
    run_dir = rundir.create(parent, run_id, exclusive_id=exclusive_id)
    write_spec(run_dir / "spec.yaml", exp, rundir.write_provenance(run_dir, cost_model=machine_costs.in_use()))
    progress = progress or RunProgress(False, run_dir.name, exp.workload.iterations)
    handler = _harness_log(run_dir)
    status, error = "ok", None
    interrupted = None
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    old_int = signal.getsignal(signal.SIGINT)
    t0 = time.time()
    ledger = summary = None
    try:
        with NetworkLock(run_dir=run_dir):
            ledger = Ledger.create(run_dir.name, run_dir)
            with ExitStack() as teardown:
                teardown.callback(lambda: log_leftovers(ledger.sweep(keep_file=True)))  # kept until summarized
                teardown.callback(progress.phase, "tearing down")  # shown first: callbacks run last-in first-out
                try:
                    _run(exp, run_dir, ledger, teardown, t0, progress, zygote)
                except TestbedError as e:
                    status, error = "failed", str(e)
                    log.error("run failed: %s", e)
                except (KeyboardInterrupt, _Terminated) as e:
                    # a second Ctrl-C or SIGTERM must not cut the teardown short
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    status, error = "interrupted", "interrupted by the user (Ctrl-C or SIGTERM)"
                    log.warning("interrupted", exc_info=True)
                    interrupted = e
                except Exception as e:  # a bug, not user input: keep the traceback, still tear down
                    status, error = "failed", f"internal error: {type(e).__name__}: {e} (traceback in logs/harness.log)"
                    log.exception("internal error")
                t_down = time.time()
            log.info("torn down in %.1f s", time.time() - t_down)
    except TestbedError as e:  # the lock is held by another run
        status, error = "failed", str(e)
    finally:
        progress.phase("analysing")
        try:
            t_sum = time.time()
            summary = _summarize(run_dir, status, error)  # Ctrl-C here: summary.json says interrupted
            log.info("summarized in %.2f s", time.time() - t_sum)
        except _Terminated:
            raise KeyboardInterrupt() from None  # reported as an interruption, like Ctrl-C
        finally:
            if ledger is not None and (summary is not None or (run_dir / "summary.json").is_file()):
                ledger.path.unlink(missing_ok=True)  # else the next run or 'testbed clean' writes it
            progress.close()
            log.removeHandler(handler)
            handler.close()
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)
    if interrupted is not None:
        raise KeyboardInterrupt()
    return RunResult(run_dir, summary)


def _summarize(run_dir: Path, status: str, error: str | None) -> RunSummary:
    """:func:`analysis.metrics.summarize`, with a full file system named as the cause: the
    run's error says so, and when ``summary.json`` itself cannot be written the summary is
    returned (status ``failed``) without it."""
    full = _disk_full(run_dir)
    if full and status == "failed":  # the cause first: the other errors follow from it
        status = "failed"
        error = f"{full}{'; ' + error if error else ''}"
    try:
        return summarize(run_dir, status=status, error=error)
    except OSError as e:
        return RunSummary(
            status="failed",
            run_id=run_dir.name,
            error=f"summary.json could not be written ({e.strerror or e}){'; ' + error if error else ''}",
        )


_MIN_FREE_BYTES = 64 << 10


def _disk_full(run_dir: Path) -> str | None:
    """A message if the file system holding ``run_dir`` has less than 64 KiB free, else None."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= _MIN_FREE_BYTES:
        return None
    return (
        f"the file system of {run_dir} is full ({free} bytes free): what the run wrote until then is kept; "
        f"free space there or point run.runs_dir (--runs-dir) at a larger file system"
    )


def _run(
    exp: Experiment,
    run_dir: Path,
    ledger: Ledger,
    teardown: ExitStack,
    t0: float,
    progress: RunProgress,
    zygote: launch.Zygote | None = None,
) -> None:
    """Build, launch and watch one run on its site (:func:`testbed.site.open_site`); every
    start registers its stop on ``teardown``. ``zygote``: a live shared zygote
    (:func:`run_one`), used and left running."""
    scheme = schemes.get(exp.workload.scheme)
    site = open_site(exp, run_dir, ledger, teardown, zygote)
    procs: list[launch.Launched] = []
    site.start_memory(procs)  # the machines' memory from before the build
    log.info("building network")
    progress.phase("building network")
    topo = site.build()
    log.info("network up in %.1f s", time.time() - t0)
    hosts = [HostInfo(h["name"], h["rack"], h["kind"], len(h["intfs"])) for h in topo["hosts"]]
    plan = scheme.plan(exp.workload, hosts)
    background = Background(
        exp.background, topo, site, run_dir, scale=exp.scale, on_pid=ledger.add_pid
    )  # refuses hosts the network lacks
    teardown.callback(background.stop)
    entries = launch.process_entries(plan, topo, exp.workload.program)
    doc = launch.write_processes(run_dir, entries, entries[0]["ip"], exp.run.master_port, exp.run.timeout_s)
    site.share(["processes.json"])
    site.follow_events(entries)
    site.start_capture(procs)
    log.info("capture started")
    background.start_servers()
    log.info("launching %d processes", len(entries))
    t_launch = time.time()
    progress.phase(f"starting {len(entries)} processes")
    background.start_clients()
    teardown.callback(launch.kill_all, procs)  # no-op when all exited

    def started(batch: list[launch.Launched]) -> None:
        procs.extend(batch)  # known at once: an interrupted start still kills what it started
        ledger.add_pids({l.info["name"]: l.popen.pid for l in batch})  # one write per batch

    program = exp.workload.program
    launch.start(
        run_dir,
        doc,
        site.popen,
        on_start=started,
        fork=site.fork,
        env_for=(lambda info: launch.program_env(info, doc, run_dir, program)) if program else None,
    )
    killed: dict[str, str] = {}

    def kill(name: str, why: str = "was killed by a scheduled event") -> None:
        for l in procs:
            if l.info["name"] == name and l.popen.poll() is None:
                killed[name] = why
                site.kill(l)

    if exp.events:  # after the launch: its triggers count iterations and emulated seconds
        sched = event_applier.Schedule(
            exp.events,
            topo,
            run_dir,
            exp.scale,
            exp.workload.warmup_iterations,
            site.netns_pids,
            kill,
            on_cgroup=ledger.add_cgroup,
            compute_mode=exp.workload.compute.mode,
            shaper=site.shaper,
            origin=t_launch if program else None,
        ).start()  # a program may mark no iterations
        teardown.callback(sched.stop)  # before the processes, the capture and the network stop
    progress.training(run_dir, [e["name"] for e in entries if e["role"] == "worker"], topo)
    site.record("launch", time.time() - t_launch)
    launch.watch(procs, exp.run.timeout_s, on_poll=progress.poll, killed=lambda: dict(killed))
    log.info("all processes done after %.1f s", time.time() - t0)


@dataclass
class PlannedRun:
    """One point of a spec as it will run: its sweep point (swept paths and their values,
    ``variant``: the variant's name), the experiment, the hosts of its network (worker,
    requested and background hosts, as :func:`topologies.hosts_of` reads the topology
    graph) and the scheme's processes on them. ``scale_auto``: the spec said ``scale: auto``
    and ``exp.scale`` is what it resolved to."""

    point: dict
    exp: Experiment
    hosts: list[HostInfo]
    processes: list[ProcessPlan]
    scale_auto: bool = False

    @property
    def label(self) -> str:
        """``scheme=ps_host_bw_mbps=50``-style name of the point ('' for a spec without sweep)."""
        return point_label(self.point)


def point_label(point: dict) -> str:
    """The point's settings as ``<last path part>=<value>`` (the variant by its name) joined by ``_``."""
    return "_".join(f"{k.split('.')[-1]}={v}" if k != "variant" else str(v) for k, v in point.items())


def plan_point(exp: Experiment) -> tuple[list[HostInfo], list[ProcessPlan]]:
    """The hosts the network of ``exp`` (no sweep) will have and the scheme's process plan on
    them, from the topology graph (no root needed, nothing built or written): the checks the
    run would otherwise make only once the network is up.

    Raises:
        SpecError: the plan does not fit the topology (more workers or servers than hosts, an
            interface a host lacks, a scheme's host outside the racks), a switch would have
            more ports than a Linux bridge takes (:func:`topologies.bridge_port_errors`), a
            background flow names a host the topology will not have, or
            ``capture.pcap.ports`` names a port it will not have.
    """
    scheme = schemes.get(exp.workload.scheme)
    try:
        topo = build_topo(exp.topology, scheme.hosts(exp.workload, exp.topology))
    except ValueError as e:  # a requested host in a rack the topology lacks
        raise SpecError(
            "workload.servers", exp.workload.servers.model_dump(), f"hosts the topology can hold ({e})"
        ) from None
    if errors := bridge_port_errors(exp.topology, topo):
        raise SpecError.of(errors)
    hosts = hosts_of(topo)
    if exp.capture.pcap:
        resolve_ports(exp.capture.pcap.ports, topo_links(topo), set(topo.switches()))
    plan = scheme.plan(exp.workload, hosts)
    if exp.events:
        event_applier.check(
            exp.events,
            topo_links(topo),
            set(topo.switches()),
            hosts,
            plan,
            compute_mode=exp.workload.compute.mode,
            scale=exp.scale,
        )
    by_name = {h.name: h for h in hosts}
    for p in plan:
        if p.host not in by_name or not 0 <= p.iface < by_name[p.host].interfaces:
            raise SpecError(
                f"plan of {p.name}",
                f"{p.host} interface {p.iface}",
                f"a host of the topology and one of its interfaces (scheme {exp.workload.scheme!r})",
            )
    for i, f in enumerate(exp.background):
        for end in ("src", "dst"):
            if getattr(f, end) not in by_name:
                raise SpecError(
                    f"background[{i}].{end}",
                    getattr(f, end),
                    "a host of the topology: "
                    + ", ".join(by_name)
                    + " (topology.background_hosts_per_rack adds hosts bg1.. for background flows)",
                )
    return hosts, plan


def plan_experiment(exp: Experiment) -> list[PlannedRun]:
    """Every point of ``exp`` (variants x sweep, :func:`testbed.spec.expand_sweep`) planned
    (:func:`plan_point`), in the order they run, with ``scale: auto`` resolved
    (:func:`testbed.capacity.auto_scale`, from this machine's cost model). Nothing is built
    or written.

    Raises:
        SpecError: a point is invalid or its plan does not fit its topology (or is invalid
            at the scale ``auto`` resolved to), or its links cannot carry its training within
            ``run.timeout_s`` (:func:`time_errors`); the message names the point.
        CapacityError: ``scale: auto`` and the cost model is missing or malformed.
    """
    out = []
    model = None
    for point, e in expand_sweep(exp):
        auto = e.scale == AUTO
        try:
            hosts, plan = plan_point(e)
            if auto:
                model = model or capacity.CostModel.load()  # read once for every point
                e = with_scale(e, capacity.auto_scale(e, hosts, plan, model=model))
            if errors := time_errors(e, hosts, plan):
                raise SpecError.of(errors)
        except SpecError as err:
            if not point:
                raise
            raise SpecError.of(
                [FieldError(x.field, x.value, f"{x.allowed} (in the point {point_label(point)})") for x in err.errors]
            ) from None
        out.append(PlannedRun(point, e, hosts, plan, scale_auto=auto))
    return out


def time_errors(exp: Experiment, hosts: list[HostInfo], processes: list[ProcessPlan]) -> list[FieldError]:
    """A run whose links cannot carry its training within ``run.timeout_s`` (``exp`` at a
    number ``scale``: one point, ``auto`` resolved), by a lower bound of its wall-clock time:

        iterations x S x 8 / (L x R x 1e6 / scale)  seconds

    ``S``: the least bytes the hosts of the ``worker`` processes send together per iteration
    (:meth:`traffic.schemes.Scheme.min_sent_bytes`: for data-parallel schemes the gradient as
    sent x (hosts - 1)); ``L``: those hosts' links to their ToR; ``R``: the fastest rate any
    of them has, Mbit/s (``topology.host_bw_mbps``, or a scheduled ``bw_mbps`` above it),
    shaped at ``R / scale``. Each link carries at most ``R x 1e6 / scale`` bit/s one way, and
    ``iterations`` counts the warm-up ones too (the runtime runs ``workload.iterations`` in
    all), so the bound leaves out start-up, compute, latency, every byte beyond ``S`` and
    every slower link: the run takes at least this long. Schemes that state no bound
    (``workload.program``, a scheme of one's own) are not checked.

    Returns:
        one error naming ``topology.host_bw_mbps`` with the estimate and the least rate
        that would fit, or none.
    """
    sent = schemes.get(exp.workload.scheme).min_sent_bytes(exp.workload, processes)
    if not sent:
        return []
    workers = {p.host for p in processes if p.role == "worker"}
    links = sum(h.interfaces for h in hosts if h.name in workers)
    t, w, timeout = exp.topology, exp.workload, exp.run.timeout_s
    fastest = max([t.host_bw_mbps] + [e.bw_mbps for e in exp.events if e.kind == "link_rate"])
    need_s = w.iterations * sent * 8 / (links * fastest * 1e6 / exp.scale)
    if need_s <= timeout:
        return []
    return [
        FieldError(
            "topology.host_bw_mbps",
            t.host_bw_mbps,
            f"a rate at which the run can finish within run.timeout_s ({timeout:g} s): at least "
            f"{fastest * need_s / timeout:.4g} Mbit/s. At {fastest:g} Mbit/s its workers' links need at least "
            f"{need_s:.4g} s of wall clock: {w.iterations} iterations x {sent:.4g} bytes (the least the "
            f"{len(workers)} worker hosts of scheme {w.scheme!r} send per iteration) x 8 / ({links} links x "
            f"{fastest:g} Mbit/s / scale {exp.scale:g}); or lower workload.iterations or raise "
            f"run.timeout_s",
        )
    ]


def describe_plan(planned: list[PlannedRun]) -> str:
    """What ``testbed run --dry-run`` prints: per point its label, hosts by kind and processes
    (``name@host``, with ``:iface`` when not 0)."""
    lines = []
    for i, pr in enumerate(planned):
        kinds: dict[str, int] = {}
        for h in pr.hosts:
            kinds[h.kind] = kinds.get(h.kind, 0) + 1
        procs = " ".join(f"{p.name}@{p.host}" + (f":{p.iface}" if p.iface else "") for p in pr.processes)
        head = f"point {i:03d} {pr.label}" if pr.point else "run"
        scale = f"scale {pr.exp.scale:g}{' (auto)' if pr.scale_auto else ''}"
        lines.append(
            f"{head}: {pr.exp.workload.scheme}, {pr.exp.topology.kind} x{pr.exp.topology.racks}, {scale}, "
            "hosts " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f"; {len(pr.processes)} processes: {procs}"
        )
    lines.append(f"{len(planned)} run(s) valid and planned; nothing was built or written (--dry-run)")
    return "\n".join(lines)


def check_capacity(planned: list[PlannedRun]) -> list[str]:
    """The capacity check of every planned point (:func:`testbed.capacity.check`), before
    anything is built, and the estimate of the most demanding point.

    Returns:
        lines to show the user: ``capacity: <estimate>`` (the point with the largest memory
        estimate, or the run's own), then one warning line per point whose ``scale`` is below
        the dilation that keeps 35 % of the CPU idle, or whose memory refusal ``run.force``
        overrode.

    Raises:
        CapacityError: a point's memory estimate exceeds what the machine has available and
            ``run.force`` is false (the message names each such point and what to change).
    """
    if not planned:
        return []
    model = capacity.CostModel.load()  # read once for every point
    warnings = capacity.check(
        [(pr.label, pr.exp, pr.hosts, pr.processes) for pr in planned],
        force=any(pr.exp.run.force for pr in planned),
        model=model,
    )
    ests = [(capacity.estimate(pr.exp, pr.hosts, pr.processes, model=model), pr) for pr in planned]
    est, pr = max(ests, key=lambda e: e[0].memory_bytes)
    head = f"capacity{' (' + pr.label + ')' if pr.label and len(planned) > 1 else ''}: {capacity.describe(est)}"
    auto: dict[float, int] = {}
    for p in planned:
        if p.scale_auto and p.exp.workload.compute.mode == "emulated":  # real compute: always 1
            auto[p.exp.scale] = auto.get(p.exp.scale, 0) + 1
    lines = [head]
    if auto:
        counts = ", ".join(
            f"{s:g}" + (f" ({n} of {len(planned)} points)" if len(planned) > 1 else "") for s, n in sorted(auto.items())
        )
        lines.append(
            f"scale auto: {counts} (real compute runs at 1; emulated compute at the smallest whole "
            f"dilation >= 1 that keeps {capacity.MIN_IDLE_PCT:g}% of the cores idle by this machine's cost "
            f"model; set scale to choose)"
        )
    return lines + [f"warning: {w}" for w in warnings]


def preflight(exp: Experiment) -> None:
    """Everything a run needs from the machine, checked before anything is created.

    Raises:
        MissingRequirement: not root, or mnexec / brctl / tc / bwm-ng / a needed qdisc (or
            tcpdump, with ``capture.pcap``) missing, or no cgroup hierarchy to hold a run's
            processes (:mod:`testbed.lifetime`); the message names the remedy.
    """
    network_preflight(exp.topology)
    if process_hierarchy() is None:
        raise MissingRequirement(f"every run needs {MISSING_HIERARCHY}")
    find_bwm_ng()
    if exp.capture.pcap:
        find_tcpdump()


def run_experiment(exp: Experiment, progress: bool = True, say: Callable[[str], None] | None = None) -> list[RunResult]:
    """Run ``exp``: one run directory, or for a sweep one per point under a sweep directory.

    The sweep directory gets ``sweep.csv`` (one row per point: the swept values, status,
    run directory and headline figures), rewritten after every point. ``say`` gets the
    capacity estimate and its warnings before anything is built (:func:`check_capacity`).

    Raises:
        SpecError: a point is invalid or does not fit its topology (:func:`plan_experiment`),
            before anything is built or written.
        CapacityError: a point will not fit this machine's memory (:func:`check_capacity`).
        MissingRequirement: the machine lacks what the run needs (:func:`preflight`).
        TestbedError: another run holds the network (the message names it), checked before
            any directory is created; or a run or sweep directory cannot be created.
    """
    planned = plan_experiment(exp)
    for line in check_capacity(planned):  # before anything is built
        (say or log.info)(line)
    points = [(pr.point, pr.exp) for pr in planned]
    preflight(exp)
    with NetworkLock():  # a second run is refused before it creates anything
        for line in sweep_dead_runs():  # a killed run's leftovers never poison this one
            (say or log.warning)(line)
        return _run_points(exp, points, progress)


def _run_points(exp: Experiment, points: list[tuple[dict, Experiment]], progress: bool) -> list[RunResult]:
    parent = Path(exp.run.runs_dir)
    base_id = exp.run.id or rundir.new_run_id(exp.name)
    if not exp.sweep and not exp.variants:
        ((_, point_exp),) = points  # as planned: scale: auto resolved
        return [
            run_one(
                point_exp,
                parent,
                base_id,
                exclusive_id=bool(exp.run.id),
                progress=RunProgress(progress, base_id, exp.workload.iterations, point_exp.scale),
            )
        ]
    sweep_dir = rundir.create(parent, base_id, exclusive_id=bool(exp.run.id), subdirs=())
    with NetworkLock(run_dir=sweep_dir):
        pass  # names the sweep as the lock's holder until its first run names itself
    try:
        write_spec(sweep_dir / "sweep.yaml", exp)
    except OSError as e:
        raise TestbedError(f"cannot write {sweep_dir / 'sweep.yaml'}: {e.strerror or e}") from None
    results, rows = [], []
    shown = SweepProgress(progress, sweep_dir.name, len(points))
    # One zygote for the whole sweep: torch's import and the warm-up are paid once, not at
    # every point (their time: docs/scaling.md). Its stdin is this process's pipe: if the harness dies, it exits.
    zygote = launch.Zygote().start() if any(forks(e) for _, e in points) else None
    try:
        for i, (point, e) in enumerate(points):
            label = point_label(point)
            shown.start(i, label)
            run_id = f"{i:03d}_{_safe(label)}"
            res = run_one(
                e,
                sweep_dir,
                run_id,
                zygote=zygote,
                progress=RunProgress(progress, run_id, e.workload.iterations, e.scale, position=1),
            )
            res.point = point
            results.append(res)
            rows.append(headline(res))
            try:
                pd.DataFrame(rows).to_csv(sweep_dir / "sweep.csv", index=False)
            except OSError as e:  # e.g. a full disk: the runs' own directories say the rest
                log.warning("could not write %s: %s", sweep_dir / "sweep.csv", e)
            shown.end(one_line(res))
    finally:
        shown.close()
        if zygote is not None:
            zygote.close()
    return results


_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789=._-")


def _safe(text: str) -> str:
    """``text`` as part of a directory name: ASCII letters, digits and ``=._-`` kept, anything
    else ``-``, at most 80 characters (a point's directory is ``NNN_<this>``)."""
    return "".join(c if c in _ID_CHARS else "-" for c in text)[:80]


def headline(res: RunResult) -> dict:
    """The figures of a run's table row and of its ``sweep.csv`` row: the point, then
    :data:`traffic.rundir.SWEEP_FIGURES` (scheme, samples/s with its spread and the
    confidence interval of its mean, iteration times, core bytes, accuracy, flags)."""
    s = res.summary
    tp, it, b, f = (
        s.throughput or Throughput(),
        s.iteration_time_s or IterationTime(),
        s.bytes or Bytes(),
        s.fidelity or Fidelity(),
    )
    figures = {
        "scheme": s.scheme,
        "status": s.status,
        "samples_per_s": tp.mean,
        "samples_per_s_spread95": tp.spread,
        "samples_per_s_mean_ci95_low": tp.mean_ci95_low,
        "samples_per_s_mean_ci95_high": tp.mean_ci95_high,
        "iter_mean_s": it.mean,
        "iter_p95_s": it.p95,
        "core_bytes": b.core,
        "accuracy": s.final_accuracy,
        "cpu_starved": f.cpu_starved,
        "host_cost_overrun": f.host_cost_overrun,
        "run_dir": str(res.run_dir),
    }
    return {**res.point, **{k: figures[k] for k in rundir.SWEEP_FIGURES}}


def one_line(res: RunResult) -> str:
    """``<run dir>: <status>, <scheme>, <samples/s>, <iteration time>, <core bytes>, <accuracy>``."""
    h = headline(res)
    if h["status"] != "ok":
        err = (res.summary.error or "").splitlines()
        return f"{res.run_dir}: {h['status']}: {err[0] if err else ''}"

    def f(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    flag = "  [CPU-starved: figures unreliable]" if h["cpu_starved"] else ""
    if h["host_cost_overrun"]:
        flag += "  [host-cost overrun: the real work took longer than the host model's budget]"
    ci = (
        f"[{f(h['samples_per_s_mean_ci95_low'], '.1f')}, {f(h['samples_per_s_mean_ci95_high'], '.1f')}]"
        if h["samples_per_s_mean_ci95_low"] is not None
        else "n/a"
    )
    return (
        f"{res.run_dir}: ok, {h['scheme']}, {f(h['samples_per_s'], '.1f')} samples/s (95 % CI of the mean {ci}, "
        f"1.96 sd {f(h['samples_per_s_spread95'], '.1f')}), "
        f"iteration {f(h['iter_mean_s'] and h['iter_mean_s'] * 1e3, '.1f')} ms "
        f"(p95 {f(h['iter_p95_s'] and h['iter_p95_s'] * 1e3, '.1f')} ms), "
        f"core {f(h['core_bytes'] and h['core_bytes'] / 1e6, '.2f')} MB, "
        f"accuracy {f(h['accuracy'], '.3f')}{flag}"
    )
