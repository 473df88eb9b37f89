"""The run directory: the only interface between the harness and the analysis.

A run directory is created exclusively (:func:`create`): an existing one is never
overwritten. Layout of ``runs/<id>/`` (a sweep puts one per point in
``runs/<sweep-id>/<NNN>_<point>/``, next to ``sweep.yaml``, the sweep's spec, and
``sweep.csv``: one row per point with the swept values, its ``variant`` and
:data:`SWEEP_FIGURES`; the throughput's from its summary: ``samples_per_s`` the mean,
``samples_per_s_spread95`` 1.96 sd of the iterations, ``samples_per_s_mean_ci95_low``/``_high``
the 95 % confidence interval of the mean; a file written before version 0.2.0 has
``samples_per_s_ci95`` for ``samples_per_s_spread95`` (:data:`SWEEP_RENAMED`))::

    spec.yaml            the resolved experiment (every default filled in), headed by the
                         run's provenance as a comment block
    provenance.json      the code, software and machine of the run, when and how it was
                         started, and the machine cost model its capacity check read
                         (:class:`common.provenance.Provenance`), written first
    topology.json        the network as built and read back
    processes.json       the launch plan
    events/<proc>.jsonl  per-process events
    results/<proc>.json  per-process results
    params/<proc>.pt     final parameters (torch.save of a state dict), if workload.save_params
    logs/                <proc>.log (stdout+stderr of each process), harness.log,
                         bwm-ng.log (its command line and output), capture.log (sampler
                         problems, one per line), exits.json (each process's exit status)
    shaping.json         the build's read-back verdict: link ends, rates, delay and loss
    traces/bwm-ng.csv    bwm-ng's CSV of every switch port
    traces/qdisc.csv     root-qdisc counters of the uplink ports
    traces/cpu.csv       per-core and per-process CPU use
    traces/memory.csv    the machine's used memory and the training processes' USS
    traces/background/   background flows (spec ``background``): flows.json, and per flow
                         <name>.json (iperf3 client) and <name>.server.json (iperf3 server);
                         their logs are logs/background-<name>-{client,server}.log
    traces/pcap/         packet headers (spec ``capture.pcap``): <port>.pcap per port and
                         ports.json (each tcpdump's window, counts and exit status; format in
                         :mod:`testbed.capture.pcap`)
    iterations.csv       one row per (iteration, worker)
    schedule.jsonl       the spec's scheduled events as applied (spec ``events``)
    hostclock/<host>     a host model with whole-host rates (``scope: machine``) only: the
                         emulated host's shared clock, one float64 (``time.monotonic()``
                         seconds; :mod:`traffic.hostmodel.machine`), written by its processes
    summary.json         headline figures and fidelity flags (:class:`traffic.summary.RunSummary`)
    ibatch.json          scheme ibatch only: measured pull/forward profile and batches
    cluster.json         a run spread over machines (spec ``cluster``): machines, tunnel,
                         each machine's clock offset and its uncertainty (s), staging
                         directories, timings (clocks, build, launch)
    machines/<addr>/     what each machine's processes and capture agent wrote there (its
                         staging directory, gathered at teardown); its events, results and
                         params are also put in events/, results/, params/ (event ``ts``
                         corrected by the clock offset) and its traces merged into traces/

A loopback run (:mod:`testbed.loopback`) writes only provenance.json, spec.yaml, processes.json,
events/, results/, params/ and logs/. Times are unix seconds (``time.time()``), durations
seconds of wall clock, unless a name says otherwise.

``processes.json`` (:func:`testbed.launch.write_processes`)
    ``{"world_size": N, "master_addr": ip of the first process, "master_port": int,
    "timeout_s": the run's time limit, "processes": [{"name": "worker0", "role": "worker",
    "index": 0, "rank": 0, "host": "h1", "rack": 0, "ip": "10.0.0.1", "iface": "h1-eth0",
    "iface_index": 0}, ...]}``; ranks follow list order; ``rack`` counts from 0. ``iface_index`` is the planned
    interface of the host (``ProcessPlan.iface``; 0 is
    ``<host>-eth0``), ``ip``/``iface`` its address and name (``127.0.0.1``/``lo`` in a
    loopback run). Each process runs ``python -u -m traffic.runtime RUN_DIR NAME`` on its
    host with ``GLOO_SOCKET_IFNAME=<iface>`` and ``OMP_NUM_THREADS=MKL_NUM_THREADS=1``; on a
    host with several interfaces a process with ``iface_index`` i >= 1 runs as uid
    4200000000 + i so that all its connections leave from that interface
    (:func:`testbed.network.bind_to_interface`), and files it writes belong to that uid.

``topology.json`` (:class:`testbed.network.Network`)
    ``kind`` (``rack`` | ``rack_core``), ``spec`` (the topology section), ``uplink_bw_mbps``
    (null without a core); ``hosts``: ``[{name, rack (from 0), kind ("worker" | "server" |
    "background"), ip, pid, intfs: [{name, ip}, ...]}]`` (the first interface is the main
    one; interface i >= 1 has address 10.<i>.x.y where x.y ends the main one);
    ``switches``: ``[{name, role ("tor" | "core"), rack (null for the core)}]``; ``links``:
    ``[{class ("host": node1 is the host, node2 its ToR | "uplink": node1 the ToR, node2 the
    core), rack, bw_mbps, node1, intf1, node2, intf2, delay_ms`` (emulated)``,
    shaped_delay_ms`` (as built: x scale)``, loss_pct, max_queue_packets, mtu_bytes: [end1,
    end2], htb_burst_bytes, shaping: {intf: {qdisc, rate_mbps, leaf, delay_ms, loss_pct}}}]``
    (``shaping`` is read back from the kernel; ``delay_ms``/``loss_pct`` there are a netem
    leaf's, as built, null without one). Switch ports (the
    switch ends of links) are in the root namespace and are what capture samples; a port's
    tx is what the switch sends on that link, so a host's tx is its switch port's rx.

``shaping.json`` (:meth:`testbed.network.Network._verify_shaping`, written after every build,
before a mismatch fails it)
    ``{"ends": link ends read back, "rate_tolerance": the fraction a rate (and a netem delay
    or loss) may be off, "errors": [one line per end that differs from what was asked: htb
    rate, MTU, netem delay and loss, queue], "netem": {"available": this machine's kernel has
    the netem qdisc, "delay_ms": delay asked of every link as built (ms, emulated x scale),
    "loss_pct": loss asked (%), "ends": ends read back with a netem leaf, "errors": [the netem
    lines of errors]}}``.

``logs/exits.json`` (:func:`testbed.launch.watch`, when it returns or raises)
    ``{<proc>: {"exit_code": its exit status (negative: the signal that killed it; null: still
    running when the harness stopped watching), "killed": why the run killed it on purpose
    (a scheduled ``kill`` event), or null}}``.

``events/<proc>.jsonl`` (:mod:`traffic.runtime.events`)
    One JSON object per line, flushed as each event ends: always ``proc, role, rank,
    thread`` (``main``, ``comm`` ...: one timeline track each), ``kind``, ``ts`` (start),
    ``dur`` (s), ``iteration``, ``layer`` (forward order from 0; both may be null).
    Communication events add ``bytes`` (payload), point-to-point ones ``peer`` (rank),
    ``dir`` (``tx``/``rx``) and ``tag``, collectives ``group_size`` (and ``group``, the members'
    global ranks, on a group other than the default). Kinds: ``init``,
    ``setup``, ``iteration`` (every worker, ``samples`` = its batch, ``loss``), ``forward``
    and ``backward`` (per layer), ``send``/``recv``/``allreduce``/``broadcast``/
    ``all_gather``/``barrier`` or a scheme's names (``push``, ``pull`` ...), ``update``,
    ``finish``, ``eval`` (worker 0, every ``workload.eval_every`` iterations if > 0 and once
    at the end with ``final`` true: ``accuracy`` in [0, 1], ``loss``, ``samples``),
    ``host_<kind>`` (one charged host cost, :mod:`traffic.hostmodel.costs`: ``emulated_s``,
    ``real_s``, ``overrun``). A span that raised has ``error`` (the exception type).

``results/<proc>.json`` (:mod:`traffic.runtime`)
    ``proc, role, rank, final_accuracy, final_loss`` (worker 0; null elsewhere),
    ``iterations, wall_s, startup_s, bytes_sent, bytes_received`` (point-to-point payload),
    ``bytes_reduced`` (collective payload), ``train_loss``, ``host_costs`` (per kind of host
    cost, :meth:`traffic.hostmodel.costs.HostCosts.summary`: ``count, modelled, emulated_s,
    budget_s, real_s, overruns, overrun_s, overrun_fraction``), plus any scheme fields.

``traces/bwm-ng.csv`` (:mod:`testbed.capture`)
    bwm-ng's own output, no header, from ``bwm-ng -o csv -T rate -t <capture.interval_ms>
    -I <port,...> -a 0 -c 0 -F traces/bwm-ng.csv`` (``-a 0`` makes ``-I`` restrict the
    output, ``-c 0`` runs until killed). 21 ``;``-separated fields: ``time; iface;
    bytes_out/s; bytes_in/s; bytes_total/s; bytes_in; bytes_out; packets_out/s;
    packets_in/s; packets_total/s; packets_in; packets_out; errors_out/s; errors_in/s;
    errors_in; errors_out``, and the last five are bits columns ``bits_out/s; bits_in/s;
    bits_total/s; bits_in; bits_out`` (8 x bytes). ``bytes_in``/``bytes_out`` (and the
    packet and error counts) are per interval, not cumulative; ``in``/``out`` are from the
    port's point of view. Each round of lines ends with a ``total`` line. ``-t 10`` gives
    about 10.4 ms between lines of an interface, and the ``/s`` columns divide by the
    interval truncated to whole ms, so analysis computes rates from the per-interval bytes
    and the timestamps.

``traces/qdisc.csv`` (:mod:`testbed.capture`, when ``capture.qdisc``)
    Header ``time, iface, qdisc, backlog_bytes, backlog_packets, drops, overlimits,
    sent_bytes, sent_packets``; every ``capture.interval_ms``, one row per sampled
    interface (both ends of every uplink; every switch port if there are none): its root
    qdisc's kind, backlog (gauges) and cumulative counters since the qdisc was created. An
    htb root's counters include its leaf queue.

``traces/background/`` (:mod:`testbed.background`, when the spec has ``background`` flows)
    ``flows.json``: ``{"scale", "stopped", "flows": [{index, name, src, dst, dst_ip, port,
    protocol, rate_mbps, start_s, duration_s`` (emulated, from the spec)``, shaped_bps`` (iperf3
    ``-b``, bit/s)``, delay_s, seconds`` (real start delay after launch and iperf3 ``-t``)``,
    client_start`` (unix s)``, result: {bytes_sent, bytes_received, seconds, error}}]}``
    (``stopped``: unix s when the harness stopped the flows still running, after training
    ended; null until then. ``result`` from the client's JSON once the run ended; payload
    bytes; ``error`` is iperf3's message, e.g. ``interrupt - the client has terminated`` for a
    flow cut short when training ended, or null).
    ``<name>.json`` / ``<name>.server.json``: iperf3's own ``--json`` output of the client
    and the server.

``traces/cpu.csv`` (:mod:`testbed.capture`, when ``capture.cpu``)
    Header ``time, kind, id, busy_pct``; every ``capture.cpu_interval_ms``: ``kind`` ``core``
    with ``id`` the core index (busy % of that core), or ``proc`` with ``id`` a process name
    (busy % of one core used by the process and its descendants, above 100 for more than a
    core), including ``bwm-ng`` and ``harness`` (the harness process, which runs the samplers).

``traces/memory.csv`` (:mod:`testbed.capture.memory`)
    Header ``time, kind, id, bytes``; from just before the network is built until the
    teardown, every ``capture.cpu_interval_ms``: ``kind`` ``machine`` with ``id`` ``used``
    (the machine's ``MemTotal - MemAvailable``, bytes), and ``kind`` ``proc`` with ``id`` a
    training process's name (its USS, bytes; each process every 5 s or less often:
    :mod:`testbed.capture.memory`). In a cluster run every ``id`` is
    prefixed ``<machine>:``; a machine's first row is read over SSH before the build, the
    others come from its capture agent.

``schedule.jsonl`` (:class:`testbed.event_applier.Schedule`, when the spec has ``events``)
    One JSON object per event, in the order applied: ``index`` (in the spec), ``kind``
    (``link_rate``, ``link_down``, ``link_up``, ``compute_slowdown``, ``kill``), ``target``,
    its trigger (``at_s`` or ``at_iteration``), ``applied``, ``ts`` (unix s when applied; null
    for an event never reached, written when the run ends with ``applied`` false),
    ``emulated_s`` (emulated s since the first measured iteration started, null before),
    ``iteration`` (the global iteration count then), and as they apply ``bw_mbps``,
    ``shaped_mbps``, ``readback_mbps`` (``{iface: Mbit/s}`` read back), ``rate_tolerance``
    (the fraction a read-back may be off), ``ifaces``,
    ``slowdown``, ``cgroup``, ``quota_us``, ``period_us``, ``pids``; ``error`` when applying
    failed. A straggler's processes (emulated compute) also write an instant event
    ``compute_slowdown`` (``slowdown``, ``iteration``, ``event``) when it takes effect.

``iterations.csv`` (:func:`analysis.metrics.summarize`, from the events)
    ``iteration, worker, start, end, duration_s, samples``: one row per ``iteration`` event
    of a process of role ``worker``; ``worker`` is the process name (``worker0`` ...).

``ibatch.json`` (:mod:`traffic.schemes.ibatch`, written by worker 0 when it decides the batches)
    ``strategy``, ``profile_iterations``, ``scale``, ``workers``, ``servers``, ``layers``,
    ``layer_names``, ``layer_params``; ``profile`` (mean over workers) and ``per_worker``:
    ``{forward_s: [C^i], transfer_s: [T_t^i], startup_s: T_s}`` in wall-clock seconds of the
    run (divide by ``scale`` for the emulated network); ``candidates.{algorithm1,
    algorithm2}``, ``optimal``, ``strategies.{default, layer_by_layer, ibatch}`` and ``used``,
    each ``{ends: [l_1..l_N] (1-based last layers), batches: [[first, last] 0-based], exe_s
    (iBatch eq. (4)), pipeline_s, meets_constraint (eq. (5))}``; ``chosen``: the candidate used.

``summary.json`` (:class:`traffic.summary.RunSummary`, which names every key and its unit;
written by :func:`analysis.metrics.summarize`, which defines every figure)
    The run's ``status`` (``ok`` | ``failed`` | ``interrupted`` | ``killed``), ``error`` and
    identity (``run_id``, the spec's name, scheme, model, workers, batch ...), its iteration
    counts, then one section per concern: ``throughput`` (samples/s), ``iteration_time_s``
    (s), ``bytes`` (per link class, host and switch port) and ``bytes_per_iteration``,
    ``final_accuracy``, ``cpu`` (idle %, per machine in a cluster run), ``memory`` (used
    memory at the start and at the peak, the processes' peak USS), ``fidelity`` (flags and
    the shaping check of every link), ``host_costs``, the scheduled ``events`` and the
    ``segments`` between them, ``capture_s``, ``capture_errors`` and ``analysis_errors``. A
    value that cannot be computed is null; a run whose files cannot be loaded gets only
    ``status, error, run_id, analysis_errors``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import yaml

from common.errors import TestbedError
from common.provenance import PROVENANCE_FILE, CostModelSource, Provenance, collect
from common.validation import load_yaml

SUBDIRS = ("events", "results", "params", "logs", "traces")
#: the columns of ``sweep.csv`` after the swept values and ``variant``, in order
SWEEP_FIGURES = (
    "scheme",
    "status",
    "samples_per_s",
    "samples_per_s_spread95",
    "samples_per_s_mean_ci95_low",
    "samples_per_s_mean_ci95_high",
    "iter_mean_s",
    "iter_p95_s",
    "core_bytes",
    "accuracy",
    "cpu_starved",
    "host_cost_overrun",
    "run_dir",
)
#: a ``sweep.csv`` column under the name an older file gives it -> its name in :data:`SWEEP_FIGURES`
SWEEP_RENAMED = {"samples_per_s_ci95": "samples_per_s_spread95"}


def new_run_id(name: str) -> str:
    """``<name>-YYYYmmdd-HHMMSS`` in local time; callers add a suffix on collision."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _contained(parent: Path, name: str) -> Path:
    """``parent / name``, checked to be a directory entry directly inside ``parent``.

    Raises:
        TestbedError: ``name`` is not one path component (empty, ``.``, ``..``, a ``/`` or a
            NUL in it, longer than 255 bytes), or ``parent / name`` resolves outside ``parent``.
    """
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\0" in name
        or len(name.encode("utf-8", "surrogateescape")) > 255
    ):
        raise TestbedError(
            f"run id {name!r} is not a directory name: a run's output never goes outside the runs directory {parent}"
        )
    path = parent / name
    if path.resolve().parent != parent.resolve():
        raise TestbedError(
            f"run directory {path} resolves to {path.resolve()}, outside the runs directory "
            f"{parent.resolve()}: a run's output never goes outside it"
        )
    return path


def create(parent: str | Path, run_id: str, exclusive_id: bool = True, subdirs=SUBDIRS) -> Path:
    """Create ``parent/run_id`` with its subdirectories, never reusing an existing one.

    If ``exclusive_id`` is false and the name is taken, ``-2``, ``-3`` ... is appended.
    ``run_id`` must be one directory name: the run directory is always directly inside
    ``parent`` (checked after resolving symbolic links too). Spec names are checked earlier
    (:func:`common.validation.safe_name`); this is the second guard.

    Raises:
        TestbedError: the directory exists and ``exclusive_id`` is true; ``run_id`` is not one
            path component or leads outside ``parent``; ``parent`` or the directory cannot be
            created (the message gives the OS's reason).
    """
    parent = Path(parent)
    path = _contained(parent, run_id)  # before anything is created
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TestbedError(f"cannot create the runs directory {parent}: {e.strerror or e}") from None
    n = 1
    while True:
        try:
            path.mkdir()
            break
        except FileExistsError:
            if exclusive_id:
                raise TestbedError(
                    f"run directory {path} already exists; earlier results are never "
                    f"overwritten: choose another run.id or remove it yourself"
                ) from None
            n += 1
            path = _contained(parent, f"{run_id}-{n}")
        except OSError as e:
            raise TestbedError(f"cannot create the run directory {path}: {e.strerror or e}") from None
    for d in subdirs:
        (path / d).mkdir(mode=PRIVATE_DIR_MODE if d in PRIVATE_SUBDIRS else 0o777)
    return path


#: subdirectories that may hold secrets (a program's output, its environment): owner only
PRIVATE_SUBDIRS = ("logs",)
#: mode of a private directory, and of a private file
PRIVATE_DIR_MODE, PRIVATE_FILE_MODE = 0o700, 0o600


def open_private(path: str | Path, mode: str = "ab"):
    """Open ``path`` for writing (``"ab"``, ``"a"``, ``"wb"``, ``"w"``), creating it with mode
    0600 (a log or a spec that may hold secrets: a program's environment, its output)."""
    return open(path, mode, opener=lambda p, flags: os.open(p, flags, PRIVATE_FILE_MODE))


def write_private(path: str | Path, text: str) -> None:
    """Write ``text`` to a new or emptied file readable by its owner only (mode 0600)."""
    with open_private(path, "w") as f:
        os.fchmod(f.fileno(), PRIVATE_FILE_MODE)  # an existing file keeps its mode otherwise
        f.write(text)


def write_json(path: str | Path, data) -> None:
    """Write JSON atomically (temp file then rename): ``path`` is either its old content or
    the whole new one, never a torn file (the temp file is removed if the write fails).

    Raises:
        OSError: the file cannot be written (e.g. the disk is full).
    """
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str))
        os.replace(tmp, path)
    except BaseException:  # e.g. a full disk: leave the old file (if any), not a torn temp file
        tmp.unlink(missing_ok=True)
        raise


def write_provenance(run_dir: str | Path, cost_model: CostModelSource | None = None) -> Provenance:
    """Collect the provenance of a run starting now (:func:`common.provenance.collect`), with
    the machine cost model it used (``cost_model``, when it used one), and write it to
    ``run_dir/provenance.json`` (:func:`write_json`).

    Returns:
        What was written.

    Raises:
        OSError: the file cannot be written.
    """
    prov = collect(cost_model=cost_model)
    write_json(Path(run_dir) / PROVENANCE_FILE, prov.dump())
    return prov


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def is_run(path: str | Path) -> bool:
    """True if ``path`` looks like a run directory (has spec.yaml and processes or summary);
    False for a path the OS refuses to look at (e.g. a name that is too long)."""
    p = Path(path)
    try:
        return (p / "spec.yaml").is_file() and ((p / "summary.json").is_file() or (p / "processes.json").is_file())
    except OSError:
        return False


class NotARunError(TestbedError):
    """A path given as a run or sweep directory is neither, or a run's spec cannot be read."""


def is_sweep(path: str | Path) -> bool:
    """True if ``path`` is a sweep directory: it holds ``sweep.yaml`` (written when the sweep
    starts) or ``sweep.csv`` (rewritten after each point), next to one run directory per point."""
    p = Path(path)
    try:
        return (p / "sweep.yaml").is_file() or (p / "sweep.csv").is_file()
    except OSError:
        return False


def find_runs(paths) -> list[Path]:
    """The run directories among ``paths``, in the order given.

    Args:
        paths: run directories (:func:`is_run`), each kept as it is, and sweep directories
            (:func:`is_sweep`), each replaced by its run directories (the subdirectories that
            are runs) sorted by name, which is the sweep's order (``<NNN>_<point>``). A sweep
            whose first point has not started gives none.

    Returns:
        The run directories as :class:`~pathlib.Path` s.

    Raises:
        NotARunError: a path that does not exist, or that is neither a run nor a sweep directory.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        try:
            exists, is_dir = p.exists(), p.is_dir()
        except OSError as e:  # e.g. a name too long for the file system
            raise NotARunError(
                f"{p} cannot be looked at ({e.strerror or e}); give run or sweep directories (see 'testbed ls')"
            ) from None
        if is_run(p):
            out.append(p)
        elif is_dir and is_sweep(p):
            try:
                out += sorted(d for d in p.iterdir() if d.is_dir() and is_run(d))
            except OSError as e:
                raise NotARunError(f"cannot list the sweep directory {p}: {e.strerror or e}") from None
        elif not exists:
            raise NotARunError(f"{p} does not exist; give run or sweep directories (see 'testbed ls')")
        else:
            raise NotARunError(
                f"{p} is neither a run directory (spec.yaml with summary.json or "
                f"processes.json) nor a sweep directory (sweep.yaml or sweep.csv); "
                f"see 'testbed ls'"
            )
    return out


def _read_yaml_mapping(path: Path) -> dict:
    try:
        doc = load_yaml(path.read_text(), source=str(path))  # the loader every spec is read with (1e12 is a number)
    except FileNotFoundError:
        raise NotARunError(f"{path} not found: {path.parent} is not a run or sweep directory") from None
    except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: not UTF-8
        raise NotARunError(f"cannot read {path}: {e}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise NotARunError(f"{path} is not a YAML mapping (got {type(doc).__name__})")
    return doc


def read_spec(run_dir: str | Path) -> dict:
    """A run's ``spec.yaml`` (the resolved experiment, every default filled in) as a plain
    mapping, as written: no validation, no defaults added.

    Raises:
        NotARunError: no ``spec.yaml`` in ``run_dir``, or it is not a YAML mapping.
    """
    return _read_yaml_mapping(Path(run_dir) / "spec.yaml")


def read_sweep_spec(sweep_dir: str | Path) -> dict:
    """A sweep's ``sweep.yaml`` (the sweep's spec, with its ``sweep`` and ``variants``
    sections) as a plain mapping; ``{}`` when the directory has none.

    Raises:
        NotARunError: ``sweep.yaml`` is not a YAML mapping.
    """
    p = Path(sweep_dir) / "sweep.yaml"
    return _read_yaml_mapping(p) if p.is_file() else {}
