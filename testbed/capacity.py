"""Capacity checked before anything is built: will a run fit this machine, and at what dilation.

From a point's hosts, processes, model and ``scale`` this module estimates the memory and
the CPU the run needs on this machine, with a cost model *measured on it*
(:mod:`testbed.machine_costs`: written by ``testbed profile --machine``; read from
``$TESTBED_MACHINE_COSTS``, else the user's file, else the one shipped with the package,
``testbed/data/machine_costs.yaml``, measured on the development machine; every value carries
its unit and the command, date and machine that measured it; one measured on another machine
is flagged). :func:`check` refuses
a point whose memory estimate exceeds the memory the machine has available
(:class:`~common.errors.CapacityError`, unless ``run.force: true``) and warns where the
run's fidelity will suffer: when the CPU estimate at the spec's ``scale`` leaves less than
35 % of the cores idle (Mininet-HiFi's rule, :data:`analysis.metrics.CPU_IDLE_RULE`), naming
the smallest dilation that keeps it (:attr:`Estimate.min_scale`).

Memory (bytes), a sum over what the run starts:

* every process: its USS (unique set size) at zero model size, ``<kind>_base_uss_bytes``
  when forked by the zygote (``run.launcher: zygote``, the default), or
  ``<kind>_exec_base_uss_bytes`` when started with exec (``run.launcher: exec``, and always
  a process on a host's second interface and a ``workload.program``'s processes: for those,
  an exec'd worker of the runtime stands in for a program whose memory is not known), plus
  ``<kind>_bytes_per_param_byte`` x the model
  parameter bytes it holds, plus ``real_compute_worker_bytes`` for a non-server process in
  ``compute.mode: real`` (data set, activations, autograd). ``<kind>`` is ``server`` for
  parameter servers, which hold their shards (the model's parameter bytes divided over the
  servers), and for every other role (workers, Stanza's ``fc``, which build the whole
  model) ``<scheme>_worker`` where the scheme was measured on its own (``ps``,
  ``allreduce``), else ``worker`` (the larger of those);
* in ``workload.compute.memory: light`` (:mod:`traffic.runtime.buffers`) a process holds no
  model: its cost is the same base USS plus its scratch (:func:`light_scratch_bytes`: the
  scheme's largest buffer) when it is exec'd; a process forked by the zygote uses the
  zygote's shared scratch instead, counted once with the shared pages below. The parameters
  it sends are zero pages of a read-only mapping and cost nothing;
* once, the pages the processes share: the zygote's RSS (``zygote_bytes``: torch and the
  project, imported once and shared copy-on-write by every process it forks) or, when every
  process is exec'd, the library pages they all map (``process_shared_bytes``). Per process
  the model counts USS, not PSS: PSS charges each process 1/n of the shared pages, so it
  depends on how many processes share them when it is read, whereas the USS of each plus
  the shared pages once is the total for any n (``process_pss_bytes`` is recorded for
  reference);
* the network: ``network_host_bytes`` per Mininet host (its shell, namespace and first
  veth pair with htb on both ends) + ``network_link_bytes`` per further link of a host;
* the harness: ``harness_uss_bytes`` + ``bwm_ng_uss_bytes``.

Model parameter bytes are the registry's (:func:`traffic.models.model_info`,
``param_bytes``: float32 at the model's native input). In ``compute.mode: real`` the runtime
builds the model for the data set's input instead; the only shipped data set (``digits``,
64 features) makes that model no larger, so the native size is an upper bound.

CPU (busy cores), an upper bound:

* every process waiting: ``process_idle_cores`` each;
* capture (bwm-ng, the qdisc and CPU samplers in the harness): per sample costs of
  ``bwm_ng_*``, ``qdisc_*`` (growing with the switch ports) and ``cpu_sampler_*``, times the
  samples per second of the spec's ``capture`` periods;
* the network: every host interface that carries a process sends at its dilated line rate
  ``host_bw_mbps / scale`` (background hosts: their flows' rates, capped at their links),
  each byte costing ``path_cpu_s_per_byte`` (two namespaces' TCP ends over one bridge with
  htb on the veths), plus ``path_cpu_s_per_byte_per_host`` for each host sending at once
  (optional, 0 when absent: the per-byte cost grows with the hosts, their sockets,
  qdiscs and processes' buffers sharing the caches; fitted to finished runs by
  ``benchmarks/fit_host_cost.py``: least squares through the origin of each run's network CPU
  that the other terms miss, ``(busy - fixed) x scale - network(1)``, against bytes/s sent at
  scale 1 x hosts sending; the shipped value from ring-allreduce runs of 32, 64 and 128 hosts,
  which used 1.10-1.36 times the estimate without it and 0.97-1.21 with it), and
  ``extra_bridge_cpu_s_per_byte`` for each further bridge; with
  ``rack_core``, bytes crossing the core (at most the total rate, and at most ``racks x
  uplink / scale``) traverse two more bridges (ToR, core, ToR); bytes sent by the runtime
  add ``runtime_user_cpu_s_per_byte`` (gloo, aggregation, optimizer: the runtime's own user
  time per byte sent);
* the runtime's messages: the processes' sending rate over the scheme's mean message
  (:meth:`traffic.schemes.Scheme.message_bytes`: P3's slices, PHub's frames, gloo's ring
  segments ...) is messages per second, each costing ``runtime_message_cpu_s`` (the
  transport's CPU per message, sender and receiver together, measured with the runtime's
  :class:`~traffic.runtime.transport.Transport` between two processes on loopback) plus the
  scheme's own ``<scheme>_message_cpu_s`` (:func:`scheme_message_key`: what a loopback run
  of that scheme spends per message beyond every other term of this model -- the transport's
  per-message and per-byte CPU, ``runtime_user_cpu_s_per_byte`` and the waiting processes;
  measured for the built-in schemes by ``testbed profile --machine`` (step ``scheme``), floored
  at 0). The key is optional: a scheme without it -- one a researcher adds, or ``program``,
  which does not run the runtime -- adds 0 beyond ``runtime_message_cpu_s``. Both are listed
  together as ``messages`` in :attr:`Estimate.cpu_breakdown`.

``cpu(scale) = fixed + network(1) / scale`` (``network`` including the messages), so the
smallest dilation keeping the rule is ``min_scale = network(1) / (0.65 x cores - fixed)``
(infinite when the fixed part alone breaks it). Not in the model (not measured): real
compute's own CPU (``compute.mode: real`` runs undilated, as fast as the cores allow),
compression codecs, the endpoint sampler (``capture.endpoints``), tcpdump
(``capture.pcap``) and background flows' iperf3 memory.

A scheme's own per-message term is what its loopback run spends beyond the model's per-byte
and per-message terms, floored at 0. For P3 and some PHub and ps runs ``min_scale`` is still
below the dilation that keeps 35 % idle: the runs' processes spend more per message than a
loopback run at full speed, and what a paced, shaped network adds per message (each
message's threads sleeping and waking, partial writes) is not measured. The terms measured
on the development machine and the estimate's ratio to finished runs
(``benchmarks/capacity_vs_runs.py``) are in ``docs/experiments.md``, "Will it fit? The
capacity check". Example::

    from testbed.runner import plan_point
    hosts, procs = plan_point(exp)
    print(describe(estimate(exp, hosts, procs)))
    warnings = check([("", exp, hosts, procs)], force=exp.run.force)   # may raise CapacityError
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from analysis.metrics import CPU_IDLE_RULE, MIN_IDLE_PCT
from common.errors import CapacityError
from testbed.machine_costs import (
    COST_KEYS,
    COSTS_PATH,
    OPTIONAL_KEYS,
    SCHEME_MESSAGE_UNIT,
    Cost,
    CostModel,
    Machine,
    scheme_message_key,
)
from testbed.spec import AUTO, Experiment
from topologies.hosts import HostInfo
from traffic.models import model_info
from traffic.runtime.buffers import ELEMENT_BYTES, REPLAY_CHUNK_ELEMENTS, SHARED_SCRATCH_BYTES
from traffic.schemes import ProcessPlan
from traffic.schemes import get as get_scheme

__all__ = [
    "COST_KEYS",
    "COSTS_PATH",
    "OPTIONAL_KEYS",
    "SCHEME_MESSAGE_UNIT",
    "Cost",
    "CostModel",
    "Machine",
    "Estimate",
    "estimate",
    "auto_scale",
    "check",
    "describe",
    "scheme_message_key",
    "light_scratch_bytes",
    "CapacityError",
]

GIB = 1024**3

#: fraction of the cores that may be busy (Mininet-HiFi keeps >= 35 % idle)
BUSY_FRACTION = 1.0 - MIN_IDLE_PCT / 100.0


@dataclass
class Estimate:
    """What a run would demand of this machine.

    Attributes:
        memory_bytes: estimated memory of the run, bytes (sum of ``memory_breakdown``).
        memory_breakdown: bytes per part: ``processes`` (their USS), ``shared pages`` (the
            zygote's, or the libraries of processes started with exec, once), ``network``,
            ``harness``.
        cpu_cores: busy cores demanded at ``scale`` (an upper bound; sum of ``cpu_breakdown``).
        cpu_breakdown: busy cores per part: ``processes``, ``capture``, ``network`` (the
            bytes: forwarding and the runtime's per-byte work), ``messages`` (the per-message
            work: the runtime's and the scheme's own); the last two at ``scale``.
        scale: the spec's dilation the CPU figure is for.
        min_scale: smallest dilation keeping >= 35 % of the cores idle (``math.inf`` when the
            fixed part alone breaks the rule; may be below 1).
        cores: this machine's logical cores.
        available_bytes: memory available now (``psutil.virtual_memory().available``).
        total_bytes: the machine's memory.
        processes: processes of the run; hosts: hosts of its network.
        param_bytes: the model's parameter bytes.
        message_bytes: the scheme's mean bytes per message
            (:meth:`traffic.schemes.Scheme.message_bytes`; ``math.inf``: it sends none).
    """

    memory_bytes: int
    memory_breakdown: dict[str, int]
    cpu_cores: float
    cpu_breakdown: dict[str, float]
    scale: float
    min_scale: float
    cores: int
    available_bytes: int
    total_bytes: int
    processes: int = 0
    hosts: int = 0
    param_bytes: int = 0
    message_bytes: float = math.inf
    network_cores_at_scale_1: float = field(default=0.0, repr=False)

    @property
    def fixed_cores(self) -> float:
        """Busy cores that dilation does not reduce (processes waiting, capture)."""
        return self.cpu_breakdown["processes"] + self.cpu_breakdown["capture"]

    def cpu_at(self, scale: float) -> float:
        """Busy cores demanded at dilation ``scale`` (> 0)."""
        return self.fixed_cores + self.network_cores_at_scale_1 / scale


def _link_bytes_per_s(mbps: float) -> float:
    return mbps * 1e6 / 8.0


def estimate(
    exp: Experiment,
    hosts: Sequence[HostInfo],
    processes: Sequence[ProcessPlan],
    model: CostModel | None = None,
    machine: Machine | None = None,
) -> Estimate:
    """Memory and CPU that one point of a spec demands of this machine (module docstring).

    Args:
        exp: the point (no sweep): a validated :class:`testbed.spec.Experiment`.
        hosts: the hosts of its network (:func:`testbed.runner.plan_point`, all kinds).
        processes: the scheme's processes on them (:func:`testbed.runner.plan_point`).
        model: the cost model; default :meth:`CostModel.load` (the user's, else the shipped one).
        machine: the machine; default :meth:`Machine.current`.

    Returns:
        The :class:`Estimate` (memory in bytes, CPU in busy cores at ``exp.scale``; for
        ``scale: auto``, at the scale it resolves to, :func:`auto_scale`).

    Raises:
        CapacityError: the cost model is missing or malformed.
        KeyError: a model name the registry does not know (a validated spec has none).
        SchemeNotFound: a scheme the registry does not know (a validated spec has none).
    """
    m = model if model is not None else CostModel.load()
    mach = machine if machine is not None else Machine.current()
    w, t = exp.workload, exp.topology
    param_bytes = int(model_info(w.model)["param_bytes"])
    n_servers = sum(1 for p in processes if p.role == "server")
    real = w.compute.mode == "real"

    worker = f"{w.scheme}_worker" if f"{w.scheme}_worker_bytes_per_param_byte" in m.costs else "worker"
    light = w.compute.memory == "light"
    scratch = light_scratch_bytes(w, processes) if light else 0.0
    proc_bytes, forked, execed = 0.0, 0, 0
    for p in processes:
        # a second interface's process, and a researcher's program, are always exec'd
        by_exec = exp.run.launcher == "exec" or p.iface > 0 or w.program is not None
        forked, execed = forked + (not by_exec), execed + by_exec
        kind = "server" if p.role == "server" else worker
        b = m[f"{kind}_exec_base_uss_bytes" if by_exec else f"{kind}_base_uss_bytes"]
        if light:  # no model: its scratch, its own unless it shares the zygote's
            b += scratch if by_exec or scratch > SHARED_SCRATCH_BYTES else 0.0
        elif p.role == "server":
            b += m["server_bytes_per_param_byte"] * param_bytes / n_servers
        else:
            b += m[f"{kind}_bytes_per_param_byte"] * param_bytes
            if real:
                b += m["real_compute_worker_bytes"]
        proc_bytes += b
    shared = m["zygote_bytes"] if forked else (m["process_shared_bytes"] if execed else 0.0)
    if light and forked and scratch <= SHARED_SCRATCH_BYTES:
        shared += scratch  # the zygote's shared scratch: resident once, as large as the largest buffer
    extra_links = sum(max(h.interfaces - 1, 0) for h in hosts)
    memory = {
        "processes": int(round(proc_bytes)),
        "shared pages": int(round(shared)),
        "network": int(round(len(hosts) * m["network_host_bytes"] + extra_links * m["network_link_bytes"])),
        "harness": int(round(m["harness_uss_bytes"] + m["bwm_ng_uss_bytes"])),
    }

    # CPU: fixed part
    idle = len(processes) * m["process_idle_cores"]
    cross_links = t.racks if t.kind == "rack_core" else 0
    ports = sum(h.interfaces for h in hosts) + 2 * cross_links  # switch-side ends (what bwm-ng samples)
    c = exp.capture
    capture = (m["bwm_ng_cpu_s_per_sample"] + m["bwm_ng_cpu_s_per_sample_port"] * ports) * 1000.0 / c.interval_ms
    if c.qdisc:
        capture += (
            (m["qdisc_cpu_s_per_sample"] + m["qdisc_cpu_s_per_sample_port"] * ports) * 1000.0 / c.qdisc_interval_ms
        )
    if c.cpu:
        capture += m["cpu_sampler_cpu_s_per_sample"] * 1000.0 / c.cpu_interval_ms

    # CPU: the network at scale 1 (divided by the scale below)
    line = _link_bytes_per_s(t.host_bw_mbps)
    by_name = {h.name: h for h in hosts}
    busy_hosts = {p.host for p in processes}
    sent_proc = sum(by_name[n].interfaces * line for n in busy_hosts if n in by_name)
    bg_rate: dict[str, float] = {}
    for f in exp.background:
        bg_rate[f.src] = bg_rate.get(f.src, 0.0) + _link_bytes_per_s(f.rate_mbps)
    sent_bg = sum(min(r, by_name[s].interfaces * line) for s, r in bg_rate.items() if s in by_name)
    sent = sent_proc + sent_bg
    crossing = min(sent, t.racks * _link_bytes_per_s(t.uplink_mbps())) if t.kind == "rack_core" and t.racks > 1 else 0.0
    # each byte also costs more the more hosts send at once (path_cpu_s_per_byte_per_host)
    senders = len({n for n in busy_hosts if n in by_name} | {s for s in bg_rate if s in by_name})
    bytes_1 = (
        sent * (m["path_cpu_s_per_byte"] + senders * m.optional("path_cpu_s_per_byte_per_host"))
        + 2.0 * crossing * m["extra_bridge_cpu_s_per_byte"]
        + sent_proc * m["runtime_user_cpu_s_per_byte"]
    )
    # the runtime's messages: the processes' bytes/s over the scheme's mean message, each
    # costing runtime_message_cpu_s (sender and receiver together) plus the scheme's own
    # <scheme>_message_cpu_s (0 when the model has none for it)
    msg_bytes = float(get_scheme(w.scheme).message_bytes(w, processes))
    per_message = m["runtime_message_cpu_s"] + m.scheme_message_cpu_s(w.scheme)
    messages_1 = sent_proc / msg_bytes * per_message if sent_proc > 0 else 0.0
    network_1 = bytes_1 + messages_1

    fixed = idle + capture
    room = BUSY_FRACTION * mach.cores - fixed
    if room <= 0:
        min_scale = math.inf
    else:
        min_scale = network_1 / room
    scale = _auto_value(exp, min_scale) if exp.scale == AUTO else exp.scale
    cpu = {"processes": idle, "capture": capture, "network": bytes_1 / scale, "messages": messages_1 / scale}
    return Estimate(
        memory_bytes=sum(memory.values()),
        memory_breakdown=memory,
        cpu_cores=sum(cpu.values()),
        cpu_breakdown=cpu,
        scale=scale,
        min_scale=min_scale,
        cores=mach.cores,
        available_bytes=mach.available_bytes,
        total_bytes=mach.total_bytes,
        processes=len(processes),
        hosts=len(hosts),
        param_bytes=param_bytes,
        message_bytes=msg_bytes,
        network_cores_at_scale_1=network_1,
    )


def light_scratch_bytes(workload, processes: Sequence[ProcessPlan]) -> float:
    """Bytes of scratch one process of a ``compute.memory: light`` run touches: the scheme's
    largest buffer (:meth:`traffic.schemes.Scheme.light_buffer_bytes`) or the optimizer
    replay's three chunks (:data:`traffic.runtime.buffers.REPLAY_CHUNK_ELEMENTS`), whichever
    is larger.

    Raises:
        KeyError: unknown model.
    """
    replay = 3 * REPLAY_CHUNK_ELEMENTS * ELEMENT_BYTES
    return max(float(get_scheme(workload.scheme).light_buffer_bytes(workload, processes)), float(replay))


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _scale_text(s: float) -> str:
    return "no scale" if math.isinf(s) else f"{s:.3g}"


def describe(est: Estimate) -> str:
    """One line: ``estimated memory X GiB of Y available; CPU Z cores busy of N at scale S
    (keeps 35% idle from scale M)``."""
    keeps = (
        "no scale keeps 35% idle: the processes and capture alone are too busy"
        if math.isinf(est.min_scale)
        else f"keeps 35% idle from scale {_scale_text(est.min_scale)}"
    )
    return (
        f"estimated memory {_gib(est.memory_bytes)} of {_gib(est.available_bytes)} available; "
        f"CPU {est.cpu_cores:.2f} cores busy of {est.cores} at scale {est.scale:g} ({keeps})"
    )


def _who(label: str, exp: Experiment) -> str:
    return f"point '{label}'" if label else f"run '{exp.name}'"


def _memory_refusal(who: str, exp: Experiment, est: Estimate) -> str:
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in est.memory_breakdown.items())
    c = exp.workload.compute
    light = (
        ", workload.compute.memory: light (no model per process: traffic.runtime.buffers)"
        if c.mode == "emulated" and c.memory == "full"
        else ""
    )
    return (
        f"{who}: estimated memory {_gib(est.memory_bytes)} ({parts}; {est.processes} processes, {est.hosts} hosts, "
        f"model {est.param_bytes / 1e6:.1f} MB of parameters) exceeds the {_gib(est.available_bytes)} this machine "
        f"has available (of {_gib(est.total_bytes)}): use fewer hosts or workers (topology.racks, "
        f"topology.hosts_per_rack, workload.workers, workload.servers), a smaller model (workload.model){light}, "
        f"or set run.force: true to run anyway"
    )


def _cpu_warning(who: str, exp: Experiment, est: Estimate) -> str:
    head = (
        f"{who}: CPU estimate {est.cpu_cores:.2f} cores busy of {est.cores} at scale {est.scale:g} (upper bound: "
        f"every host link at its dilated line rate) leaves less than {MIN_IDLE_PCT:g}% idle ({CPU_IDLE_RULE}); "
        f"link rates and timings may be off"
    )
    if math.isinf(est.min_scale):
        return (
            head + f"; no dilation suffices: {est.processes} waiting processes and the capture alone keep "
            f"{est.fixed_cores:.2f} cores busy: use fewer processes (workload.workers, workload.servers) or "
            f"longer capture periods (capture.*interval_ms, capture.qdisc: false)"
        )
    fix = f"; use scale >= {math.ceil(est.min_scale * 100) / 100:g}"
    if exp.workload.compute.mode != "emulated":
        fix += " (with workload.compute.mode: emulated: real compute cannot be dilated)"
    return head + fix + " or fewer hosts"


def check(
    points: Iterable[tuple[str, Experiment, Sequence[HostInfo], Sequence[ProcessPlan]]],
    force: bool = False,
    model: CostModel | None = None,
    machine: Machine | None = None,
) -> list[str]:
    """Check every point of a spec against this machine before anything is built.

    Args:
        points: ``(label, exp, hosts, processes)`` per point (label '' for a spec without
            sweep; hosts and processes as :func:`testbed.runner.plan_point` returns them).
        force: turn the memory refusal into a warning line (``run.force: true``).
        model: the cost model; default :meth:`CostModel.load`.
        machine: the machine; default :meth:`Machine.current` (read once for all points).

    Returns:
        Warning lines: a point whose ``scale`` is below its ``min_scale`` (naming the point,
        the CPU estimate and the scale to use); with ``force``, each memory refusal; a cost
        model measured on another machine.

    Raises:
        CapacityError: a point's memory estimate exceeds the available memory (and not
            ``force``); the message names every such point, its estimate, what the machine
            has and what to change. Also: the cost model is missing or malformed.
    """
    m = model if model is not None else CostModel.load()
    mach = machine if machine is not None else Machine.current()
    warnings, refusals = [], []
    if (line := m.measured_elsewhere(mach)) is not None:
        warnings.append(f"capacity: {line}")
    for label, exp, hosts, processes in points:
        est = estimate(exp, hosts, processes, model=m, machine=mach)
        who = _who(label, exp)
        if est.memory_bytes > est.available_bytes:
            refusals.append(_memory_refusal(who, exp, est))
        if est.scale < est.min_scale:
            warnings.append(_cpu_warning(who, exp, est))
    if refusals and not force:
        raise CapacityError(
            "this machine cannot hold the run:\n  " + "\n  ".join(refusals)
            if len(refusals) > 1
            else "this machine cannot hold the run: " + refusals[0]
        )
    return [f"{r} (run.force: true: running anyway)" for r in refusals] + warnings


def _auto_value(exp: Experiment, min_scale: float) -> float:
    if exp.workload.compute.mode != "emulated":
        return 1.0  # real compute cannot be dilated (testbed.spec.Experiment)
    base = 1 if math.isinf(min_scale) else max(1, math.ceil(min_scale - 1e-9))  # inf: no scale helps; warned
    for k in range(base, base + 1000):  # iperf3 -t takes whole seconds: duration_s x scale must be whole
        if all(abs(f.duration_s * k - round(f.duration_s * k)) <= 1e-9 for f in exp.background):
            return float(k)
    return float(base)  # no whole dilation near it does: with_scale names the flows


def auto_scale(
    exp: Experiment,
    hosts: Sequence[HostInfo],
    processes: Sequence[ProcessPlan],
    model: CostModel | None = None,
    machine: Machine | None = None,
) -> float:
    """The dilation ``scale: auto`` stands for on this machine (:class:`testbed.spec.Experiment`).

    1 when ``workload.compute.mode`` is ``real`` (real compute cannot be slowed down). With
    emulated compute: the smallest whole number >= 1 that is at least the estimate's
    :attr:`Estimate.min_scale` (the run keeps 35 % of the cores idle by the cost model,
    Mininet-HiFi's rule) and gives every background flow a whole number of dilated seconds;
    1 when no dilation keeps the rule (``min_scale`` infinite: the check warns).

    Args:
        exp, hosts, processes: one planned point (:func:`testbed.runner.plan_point`).
        model, machine: as for :func:`estimate`.

    Returns:
        The scale, a whole number >= 1.

    Raises:
        CapacityError: the cost model is missing or malformed.
    """
    if exp.workload.compute.mode != "emulated":
        return 1.0
    return estimate(exp, hosts, processes, model=model, machine=machine).scale
