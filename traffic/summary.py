"""A run's ``summary.json`` as a typed model: :class:`RunSummary`, one sub-model per section.

:func:`analysis.metrics.compute_summary` computes it (its module doc defines every figure)
and :func:`analysis.metrics.summarize` writes it; every reader loads it with
:meth:`RunSummary.load` and reads attributes (``s.throughput.mean``,
``s.fidelity.cpu_starved``). The model mirrors the file key for key: the identity of the run,
its iteration counts and its accuracy are top-level keys, each other concern is a section
(``provenance``, ``throughput``, ``iteration_time_s``, ``bytes``, ``bytes_per_iteration``, ``cpu``,
``memory``, ``fidelity``, ``host_costs``, ``segments`` ...).

A key is written exactly when it was set: read from the file, or given by the analysis (a
value it could not compute is set to None and written as null). So a summary written by an
older version, which lacks some keys, or a run whose files could not be loaded (only
``status, error, run_id, analysis_errors``) is written back with the keys it had, and keys
this version does not know are kept and written back too. Reading an absent key gives its
default: None, or an empty list or mapping for a list or mapping.

Units: seconds (``_s``), bytes, samples/s, % (``_pct``: of one core, or idle share of the
cores), Mbit/s (``_mbps``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common.provenance import Provenance
from traffic.rundir import write_json

#: the summary's file in a run directory
SUMMARY_FILE = "summary.json"


class _Section(BaseModel):
    """Base of the summary's models: unknown keys are kept (and written back), a key known by
    an alias (``class``) is read and written under it."""

    model_config = ConfigDict(
        extra="allow",
        use_attribute_docstrings=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Throughput(_Section):
    """Throughput of the measured iterations (the complete ones after the warm-up); per
    iteration: the global batch (samples of all workers) over the iteration time. A segment's
    has only ``mean``, ``overall`` and ``unit``."""

    mean: float | None = None
    """Mean of the per-iteration throughput, samples/s."""
    spread95: float | None = None
    """1.96 x ``std``, samples/s: the half-width of the band that would hold 95 % of the
    iterations were they normal (as Horovod's synthetic benchmark prints it); a spread of the
    iterations, not an uncertainty of ``mean``."""
    mean_ci95_low: float | None = None
    """Lower end of the 95 % confidence interval of ``mean``, samples/s: Student's t interval
    ``mean -+ t(0.975, n - 1) x sd / sqrt(n)`` (sd with ddof=1; it takes the iterations as
    independent draws). None with fewer than two iterations."""
    mean_ci95_high: float | None = None
    """Upper end of that interval, samples/s."""
    std: float | None = None
    """Standard deviation of the per-iteration throughput (ddof=0), samples/s."""
    min: float | None = None
    """Lowest per-iteration throughput, samples/s."""
    max: float | None = None
    """Highest per-iteration throughput, samples/s."""
    overall: float | None = None
    """All measured samples over the sum of their iteration times, samples/s."""
    n: int | None = None
    """Measured iterations of positive duration (the ones averaged)."""
    unit: str | None = None
    """``"samples/s"``."""
    method: str | None = None
    """How the figures are computed, in words."""
    ci95: float | None = None
    """``spread95`` under the name summaries written before version 0.2.0 give it; read from
    such a file (and written back), never computed. Read :attr:`spread` for either."""

    @property
    def spread(self) -> float | None:
        """``spread95``, or ``ci95`` in a summary that has that key instead, samples/s."""
        return self.spread95 if self.spread95 is not None else self.ci95


class IterationTime(_Section):
    """Iteration time of the measured iterations: from the completion of the iteration before
    (its latest worker end) to the iteration's own, seconds (emulated under time dilation;
    ``analysis.metrics``). A segment's has only ``mean`` and ``p95``."""

    mean: float | None = None
    """Mean, s."""
    p50: float | None = None
    """Median, s."""
    p95: float | None = None
    """95th percentile, s."""
    std: float | None = None
    """Standard deviation (ddof=0), s."""
    min: float | None = None
    """Shortest, s."""
    max: float | None = None
    """Longest, s."""
    n: int | None = None
    """Measured iterations of positive duration."""


class TxRx(_Section):
    """Bytes one way and the other over the whole capture; None when a port has no samples."""

    tx: int | None = None
    """Bytes sent: by the host (``per_host``), or by the switch on that port (``per_port``)."""
    rx: int | None = None
    """Bytes received, from the same point of view."""


class Bytes(_Section):
    """Bytes per link class over the whole capture, from the bwm-ng samples of the switch
    ports; a total is None when one of its ports has no samples."""

    host_links: int | None = None
    """Both directions of every host link (host to its ToR), bytes."""
    uplinks: int | None = None
    """Both directions of every ToR-core uplink, measured at the ToR end, bytes (0 without a core)."""
    core: int | None = None
    """Bytes the ToRs sent up to the core: each byte that crossed the core counted once."""
    per_host: dict[str, TxRx] | None = None
    """Host name -> what it sent and received over its host link(s)."""
    per_port: dict[str, TxRx | None] | None = None
    """Switch port -> what the switch sent and received on it (None: no samples)."""
    core_background: int | None = None
    """Core bytes of the background flows (the background hosts' tx), bytes; 0 without flows,
    None when they cannot be told apart from training's (a flow has an end that is not a
    background host, or stays in one rack)."""
    core_training: int | None = None
    """``core`` - ``core_background``, bytes; None when that is."""


class BytesPerIteration(_Section):
    """Bytes of the measured window divided by the measured iterations, bytes per iteration."""

    host_links: float | None = None
    """Both directions of every host link."""
    uplinks: float | None = None
    """Both directions of every ToR-core uplink."""
    core: float | None = None
    """Bytes the ToRs sent up to the core."""
    core_background: float | None = None
    """The background flows' share of ``core``."""
    core_training: float | None = None
    """``core`` - ``core_background``."""
    worker_link: float | None = None
    """tx + rx of the link(s) of a host running a worker, mean over those hosts."""


class MachineCpu(_Section):
    """CPU use of one machine, averaged over the measured iterations (or the whole capture)."""

    idle_pct_mean: float | None = None
    """Mean idle % of all cores."""
    idle_pct_per_core: dict[str, float | None] = Field(default_factory=dict)
    """Core id -> its mean idle %."""
    min_idle_pct: float | None = None
    """Lowest 1-s mean of the all-core idle %."""
    window: str | None = None
    """What was averaged over: ``"measured iterations"`` or ``"capture"``."""
    procs_busy_pct_mean: dict[str, float | None] = Field(default_factory=dict)
    """Process name -> its mean busy % of one core (above 100 for more than a core)."""


class Cpu(MachineCpu):
    """CPU use of the run. A run spread over several machines also has ``machines`` and
    ``worst_machine``; its top-level figures are then the worst machine's (core ids prefixed
    ``<machine>:``), ``min_idle_pct`` the lowest over machines."""

    machines: dict[str, MachineCpu] | None = None
    """Machine address (``"controller"`` for the unprefixed rows) -> its own figures; only in
    a run over several machines."""
    worst_machine: str | None = None
    """The machine of lowest mean idle %; only in a run over several machines (None when no
    machine has samples)."""


class UssPeaks(_Section):
    """The training processes' private memory: each process's peak USS (the pages no other
    process maps, read every 5 s or less often, :mod:`testbed.capture.memory`), then over
    processes."""

    median: int | None = None
    """Median over processes of their peak USS, bytes."""
    max: int | None = None
    """Largest peak USS of a process, bytes."""
    sum: int | None = None
    """Sum over processes of their peak USS, bytes: at least what they held together at any
    one time (their peaks need not coincide)."""
    processes: int | None = None
    """Processes with at least one USS sample."""


class MachineMemory(_Section):
    """Memory of one machine over the run (``traces/memory.csv``): its used memory, psutil
    ``virtual_memory()`` ``total - available`` (``MemTotal - MemAvailable``), from just before
    the network is built to the teardown, and the USS of the training processes on it."""

    machine_used_start_bytes: int | None = None
    """Used memory just before the network was built, bytes."""
    machine_used_peak_bytes: int | None = None
    """Highest used memory sampled while the run lasted (start included), bytes."""
    machine_growth_bytes: int | None = None
    """``machine_used_peak_bytes - machine_used_start_bytes``, bytes: what the run (network,
    processes, capture) took at its peak, and whatever else the machine did meanwhile."""
    process_uss_peak_bytes: UssPeaks | None = None
    """The peak USS of the training processes, over processes, bytes."""
    period_s: float | None = None
    """Median interval between two used-memory samples, s of wall clock (the period asked is
    ``capture.cpu_interval_ms``)."""
    uss_period_s: float | None = None
    """Median over processes of the median interval between two USS reads of one, s of wall
    clock: at least 5 s, longer when the reads' CPU budget (2 % of a core) holds them back, as
    with many processes (:mod:`testbed.capture.memory`)."""


class Memory(MachineMemory):
    """Memory of the run. A run spread over several machines also has ``machines`` and
    ``worst_machine``; its top-level machine figures are then those of the machine whose used
    memory grew most, and ``process_uss_peak_bytes`` is over the processes of every machine."""

    machines: dict[str, MachineMemory] | None = None
    """Machine address -> its own figures; only in a run over several machines. A machine's
    start is read over SSH before the build; its other samples are its capture agent's, from
    when the agent starts (after the build)."""
    worst_machine: str | None = None
    """The machine of largest ``machine_growth_bytes``; only in a run over several machines
    (None when no machine has samples)."""


class LinkRate(_Section):
    """The shaping check of one link, both directions, at one switch port."""

    iface: str | None = None
    """The switch port checked (a host link at its switch port, an uplink at its ToR end)."""
    link_class: str | None = Field(default=None, alias="class")
    """``"host"`` or ``"uplink"`` (key ``class`` in the file)."""
    bw_mbps: float | None = None
    """The highest rate configured for it during the run (build or scheduled event), Mbit/s."""
    max_tx_mbps: float | None = None
    """Highest rate the switch sent at over a window, Mbit/s."""
    max_rx_mbps: float | None = None
    """Highest rate the switch received at over a window, Mbit/s."""
    max_ratio: float | None = None
    """max(max_tx_mbps, max_rx_mbps) / bw_mbps."""


class RateCheck(_Section):
    """Every link's highest achieved rate against its configured one."""

    shaping_failed: bool | None = None
    """Some link ran more than 10 % above its ``bw_mbps`` (None: nothing checked)."""
    window_s: float | None = None
    """Window the rates are taken over: max(0.1 s, 5 x the median sample interval), s."""
    rule: str | None = None
    """The rule, in words."""
    links: list[LinkRate] = Field(default_factory=list)
    """One entry per checked switch port."""


class Effect(_Section):
    """One effect the spec asked of the emulation, and whether the run's files show it happened
    (:mod:`analysis.effects`). ``asked`` and ``achieved`` hold, by ``kind``:

    ``background`` (one per flow, ``name`` the flow's)
        asked ``src, dst, protocol, rate_mbps`` (emulated Mbit/s), ``start_s, duration_s``
        (emulated s); achieved ``rate_mbps`` (payload iperf3 sent over the seconds it ran,
        emulated Mbit/s: x scale), ``duration_s`` (emulated s it ran), ``bytes_sent,
        bytes_received`` (payload bytes, iperf3's report), ``error`` (iperf3's),
        ``stopped_by_harness`` (it was still running when training ended and the harness
        stopped it), ``src_link_tx_bytes`` (bytes the source host sent over its link during the
        capture, null without counters).
    ``capture`` (one per tcpdump port, ``name`` the port)
        asked ``filter, snaplen_bytes, start_s, duration_s`` (emulated s; duration null: with
        the run); achieved ``seconds`` (emulated s tcpdump ran), ``packets_captured,
        packets_dropped`` (its closing report), ``exit_code``.
    ``event`` (one per scheduled event, ``name`` ``#<index> <kind> <target>``)
        asked the spec's event (its trigger ``at_s`` emulated s or ``at_iteration``, and
        ``bw_mbps`` emulated Mbit/s, ``compute_slowdown`` ...); achieved ``applied,
        iteration, emulated_s, error`` and for a rate ``readback_mbps`` ({iface: emulated
        Mbit/s read back}).
    ``process`` (one per planned process, ``name`` the process's)
        asked ``role, host``; achieved ``exit_code`` (negative: killed by that signal) and
        ``killed`` (why the run killed it on purpose, or null).
    ``shaping`` (one per run, ``name`` ``links``)
        asked ``links`` (count) and ``bw_mbps`` (the emulated rates); achieved ``ends`` (link
        ends read back after the build) and ``errors`` (one line per end that differed).
    ``netem`` (one per run, ``name`` ``delay/loss``)
        asked ``delay_ms`` (emulated ms, one way, every link) and ``loss_pct`` (%);
        achieved ``available`` (the kernel has netem), ``ends`` (ends read back with a netem
        leaf), ``delay_ms``/``loss_pct`` (``[lowest, highest]`` read back: emulated ms, %) and
        ``errors``.
    """

    kind: str | None = None
    """``background``, ``capture``, ``event``, ``process``, ``shaping`` or ``netem``."""
    name: str | None = None
    """Which one: the flow, port, event, process; ``links`` or ``delay/loss`` for the run's."""
    asked: dict[str, Any] = Field(default_factory=dict)
    """What the spec asked, in the spec's units (emulated seconds and Mbit/s)."""
    achieved: dict[str, Any] = Field(default_factory=dict)
    """What the run's files say happened, in the same units."""
    verified: bool | None = None
    """True: it happened as asked; False: it did not (the run fails, see
    :data:`analysis.effects.EFFECTS_RULE`); None: it could not be judged (nothing asked, or a
    file an older version did not write)."""
    reason: str | None = None
    """Why it is not verified (False or None); None when it is."""


class Fidelity(_Section):
    """Whether the emulation kept its promises: enough CPU idle, links at their rates, host
    costs within their budgets, every effect the spec asked for done. A flag is None when it
    could not be judged."""

    cpu_starved: bool | None = None
    """Mean idle % below 35 (in a run over several machines: on some machine)."""
    min_idle_pct: float | None = None
    """``cpu.min_idle_pct``, %."""
    idle_pct_mean: float | None = None
    """``cpu.idle_pct_mean``, %."""
    rule: str | None = None
    """The CPU rule, in words."""
    shaping_failed: bool | None = None
    """``rates.shaping_failed``."""
    rates: RateCheck | None = None
    """The shaping check of every link."""
    host_cost_overrun: bool | None = None
    """For some process, the real work of its modelled host costs overran their budgets by
    more than :data:`traffic.hostmodel.costs.OVERRUN_THRESHOLD` (5 %) of the process's wall
    time (:func:`analysis.metrics.host_cost_overrun`)."""
    effects: list[Effect] = Field(default_factory=list)
    """Every effect the spec asked for (background flows, captures, scheduled events,
    processes, shaping, delay and loss), each judged from the run's files."""
    unverified: list[str] = Field(default_factory=list)
    """One line per effect not done (``verified`` false): ``<kind> <name>: <reason>``."""
    effects_rule: str | None = None
    """The rule that turns an effect not done into a failed run, in words
    (:data:`analysis.effects.EFFECTS_RULE`)."""


class HostCost(_Section):
    """One kind of host cost added up over every process (see :mod:`traffic.hostmodel.costs`)."""

    count: int | None = None
    """Operations charged."""
    modelled: bool | None = None
    """Every charge had a cost stated by the host model (one without takes its real time)."""
    emulated_s: float | None = None
    """Seconds charged on the emulated machine (not modelled: real seconds / scale)."""
    budget_s: float | None = None
    """Real seconds budgeted: scale x ``emulated_s``."""
    real_s: float | None = None
    """Real seconds the work took."""
    overruns: int | None = None
    """Operations whose real work went beyond their budget."""
    overrun_s: float | None = None
    """Real seconds beyond the budgets."""
    overrun_fraction: float | None = None
    """``overrun_s`` / ``budget_s`` (0 without a budget)."""
    queued_s: float | None = None
    """A kind whose rate is the whole host's (scope ``machine``): real seconds its operations
    waited behind other operations of their host, beyond their budgets (the host's
    contention); absent for a kind each process has to itself."""


class Segment(_Section):
    """The measured iterations between two scheduled events (or before the first)."""

    from_event: int | None = None
    """``index`` of the first event opening it; None for the first segment."""
    events: list[int | None] = Field(default_factory=list)
    """``index`` of every event opening it (applied at the same iteration count)."""
    kind: str | None = None
    """The first opening event's kind (``link_rate``, ``compute_slowdown`` ...)."""
    target: str | None = None
    """The first opening event's target (``uplink:tor1``, a host, a process)."""
    iterations: list[int | None] = Field(default_factory=list)
    """``[first, last]`` iteration index that may fall in it; last None: open-ended."""
    start_s: float | None = None
    """When its opening events were applied, emulated s since the first measured iteration started."""
    end_s: float | None = None
    """When the next segment's events were applied, same clock; None: open-ended."""
    n: int | None = None
    """Measured iterations in it."""
    throughput: Throughput | None = None
    """Its ``mean`` and ``overall``, samples/s."""
    iteration_time_s: IterationTime | None = None
    """Its ``mean`` and ``p95``, s."""


class RunSummary(_Section):
    """The headline figures and fidelity flags of one run (``summary.json``)."""

    # --- the run: status and identity
    status: str | None = None
    """``ok``, ``failed``, ``interrupted`` (Ctrl-C or SIGTERM) or ``killed`` (the runner died;
    written by ``testbed clean``). A run the harness ended ``ok`` is ``failed`` when an effect
    its spec asked for was not done (``fidelity.unverified``, :data:`analysis.effects.EFFECTS_RULE`)."""
    error: str | None = None
    """The error of a run that did not end ``ok``; for an effect not done, ``asked for but not
    done: `` and then ``fidelity.unverified``, one per line."""
    run_id: str | None = None
    """The run directory's name."""
    name: str | None = None
    """The spec's ``name``."""
    scheme: str | None = None
    """The workload's scheme (``program`` for a researcher's program)."""
    program: list[str] | None = None
    """The command of a researcher's program (``workload.program.command``); only in such a run."""
    model: str | None = None
    """The workload's model (None for a program)."""
    dataset: str | None = None
    """The workload's dataset (None for a program)."""
    compute: dict[str, Any] | str | None = None
    """The workload's ``compute`` section as the spec gives it (``mode``, ``profile`` ...)."""
    topology: str | None = None
    """The topology's ``kind`` (``rack``, ``rack_core``)."""
    tcp_congestion_control: list[str] | None = None
    """The TCP congestion controls the hosts used, as read back when the network was built
    (``topology.json``), sorted, each once (e.g. ``["cubic"]``); None for a run without a
    network (loopback) or one from before the read-back."""
    scale: float | None = None
    """Time dilation: real seconds per emulated second."""
    workers: int | None = None
    """Worker processes."""
    batch_size: int | None = None
    """Samples per worker per iteration (None for a program)."""
    global_batch: int | None = None
    """Samples of all workers per iteration."""
    provenance: Provenance | None = None
    """The code, software and machine the run ran on, when and how it was started (the run's
    ``provenance.json``, :class:`common.provenance.Provenance`); None for a run without one."""

    # --- iteration counts
    iterations: int | None = None
    """Iterations the workload asks for."""
    iterations_completed: int | None = None
    """Iterations every worker reported."""
    warmup_iterations: int | None = None
    """Smallest iteration numbers left out of the figures: ``workload.warmup_iterations``,
    or with ``max_warmup_iterations`` the warm-up the run settled after."""
    max_warmup_iterations: int | None = None
    """``workload.max_warmup_iterations``: the warm-up was until steady, at most this many
    (:func:`analysis.metrics.settled_warmup`); None: it was ``warmup_iterations``."""
    measured_iterations: int | None = None
    """Complete iterations after the warm-up (with ``max_warmup_iterations``, the next
    ``iterations - max_warmup_iterations`` of them): the ones the figures are over."""

    # --- figures
    throughput: Throughput | None = None
    """Samples/s of the measured iterations."""
    iteration_time_s: IterationTime | None = None
    """Iteration time of the measured iterations, s."""
    bytes: Bytes | None = None
    """Bytes per link class and per host over the whole capture."""
    bytes_per_iteration: BytesPerIteration | None = None
    """Bytes of the measured window per measured iteration."""

    # --- accuracy
    final_accuracy: float | None = None
    """Fraction of the test set classified right at the end, in [0, 1]."""
    final_loss: float | None = None
    """Test loss at the end."""
    accuracy_source: str | None = None
    """Where the accuracy comes from (the last ``eval`` event, or ``results/<proc>.json``)."""

    # --- emulation fidelity
    cpu: Cpu | None = None
    """CPU use of the run's machine(s)."""
    memory: Memory | None = None
    """Memory of the run's machine(s) and processes; None for a run without
    ``traces/memory.csv`` (one made before the harness recorded it, or a loopback run)."""
    fidelity: Fidelity | None = None
    """Fidelity flags."""
    host_costs: dict[str, HostCost] | None = None
    """Kind of host cost -> its totals over every process; None when no process reported any."""

    # --- notes, scheduled events, capture
    iterations_note: str | None = None
    """Why the iteration figures are absent (no worker recorded an iteration), or None."""
    events: list[dict[str, Any]] = Field(default_factory=list)
    """The records of the scheduled events applied, as the harness wrote them in
    ``schedule.jsonl`` (``index``, ``kind``, ``target``, ``applied``, ``ts`` ...)."""
    events_not_reached: list[dict[str, Any]] = Field(default_factory=list)
    """The records of the scheduled events whose trigger never came."""
    segments: list[Segment] = Field(default_factory=list)
    """The measured iterations split at each event applied without error; empty without one."""
    capture_s: float | None = None
    """Seconds spanned by the bwm-ng samples."""
    analysis_errors: list[str] = Field(default_factory=list)
    """A section the analysis could not compute: its name, the exception and a short traceback."""
    capture_errors: list[str] = Field(default_factory=list)
    """The capture's problems (``logs/capture.log``), one per line."""

    @classmethod
    def load(cls, path: str | Path) -> RunSummary:
        """The summary of a run directory (its ``summary.json``), or of that file itself.

        Raises:
            OSError: the file cannot be read (FileNotFoundError: there is none).
            ValueError: it is not JSON, or not a summary (pydantic's ``ValidationError`` is a
                ``ValueError``).
        """
        p = Path(path)
        if p.is_dir():
            p = p / SUMMARY_FILE
        return cls.model_validate(json.loads(p.read_text()))

    def dump(self) -> dict:
        """The JSON document: every key that was set, under its name in the file (a value no
        JSON type fits is written as its ``str``, as the harness always did)."""
        return self.model_dump(mode="json", exclude_unset=True, fallback=str)

    def write(self, run_dir: str | Path) -> Path:
        """Write ``run_dir/summary.json`` atomically (:func:`traffic.rundir.write_json`).

        Returns:
            The file's path.

        Raises:
            OSError: it cannot be written (e.g. a full disk); it is then absent or its
                earlier content, never a torn file.
        """
        p = Path(run_dir) / SUMMARY_FILE
        write_json(p, self.dump())
        return p
