"""Record what crosses the network and how busy the machine is while a run trains.

The recorders write into ``<run_dir>/traces/`` (formats in :mod:`traffic.rundir`), one
module each; :class:`Capture` starts and stops them together:

``bwm-ng.csv`` (:mod:`testbed.capture.bwmng`)
    bwm-ng itself, unmodified output, started as::

        bwm-ng -o csv -T rate -t <interval_ms> -I <port,port,...> -a 0 -c 0 -F traces/bwm-ng.csv

    on the switch ports every ``capture.interval_ms``: per-interval byte, packet and error
    counts per interface (``-a 0`` makes ``-I`` restrict the output, and bwm-ng silently
    ignores an unknown name, which is why :meth:`Capture.start` checks the names first). The
    facts verified on bwm-ng 0.6.3 (fields, units, timestamps, the drift of the period) are
    in that module.

``qdisc.csv`` (:mod:`testbed.capture.qdisc`)
    A thread that reads the root qdisc of each interface in ``qdisc_ifaces`` every
    ``capture.qdisc_interval_ms`` (default 50 ms) with pyroute2 (:class:`QdiscSampler`).
    Columns: ``time`` (unix s at which the dump was requested; all rows of a sample share
    it), ``iface``, ``qdisc`` (kind), ``backlog_bytes``, ``backlog_packets`` (gauges),
    ``drops``, ``overlimits``, ``sent_bytes``, ``sent_packets`` (cumulative kernel counters
    since the qdisc was created).

``cpu.csv`` (:mod:`testbed.capture.cpu`)
    A thread that samples ``/proc/stat`` (psutil) every ``capture.cpu_interval_ms``
    (:class:`CpuSampler`): ``time, kind, id, busy_pct`` with ``kind`` ``core`` (``id`` =
    core index) or ``proc`` (``id`` = process name from ``pids()``, busy % of *one* core
    used by the process and all its descendants), including ``bwm-ng`` and ``harness`` (this
    Python process, which also runs the samplers).

``memory.csv`` (:mod:`testbed.capture.memory`)
    The machine's used memory every ``capture.cpu_interval_ms`` and the training processes'
    USS every 5 s or less often (a CPU budget of 2 % of a core; :class:`MemorySampler`):
    ``time, kind, id, bytes``. On this machine the
    site records it from before the network is built (:meth:`testbed.site.Site.start_memory`),
    outside :class:`Capture`; a cluster machine's capture agent asks :class:`Capture` for it
    (``memory=True``).

``endpoints.csv`` (:mod:`testbed.capture.endpoints`)
    A thread that records, every ``capture.endpoints_interval_ms``, the TCP sockets of each
    training process read in its own network namespace: which process owns which
    (address, port), so that captured flows can be attributed to processes.

``pcap/<port>.pcap`` (:mod:`testbed.capture.pcap`, only with ``capture.pcap``)
    tcpdump on the chosen switch ports, headers only, with ``pcap/ports.json``.

Samplers schedule on a fixed grid (``k * interval``); a sample that overruns its slot skips
the missed slots (the next one starts on the next free slot) instead of bursting to catch
up, so a slow sample lowers the rate and the timestamps show the rate achieved
(:mod:`testbed.capture.periodic`).

Each sampler's CPU is the measurement's own cost: bwm-ng's and the harness's (which runs the
samplers) are rows of ``cpu.csv``. The qdisc sampler's grows with the qdiscs of the root
namespace, not with the interfaces sampled (pyroute2 decodes every one). Their measured costs:
``docs/scaling.md``, "What the capture costs".
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from common.errors import TestbedError
from testbed.capture.bwmng import BwmNgRecorder, bwm_ng_command, find_bwm_ng
from testbed.capture.cpu import CPU_FIELDS, CpuSampler
from testbed.capture.endpoints import ENDPOINT_FIELDS, EndpointSampler
from testbed.capture.memory import MEMORY_FIELDS, MemorySampler, memory_recorder
from testbed.capture.pcap import PcapRecorder
from testbed.capture.periodic import Periodic, SampledCsv
from testbed.capture.qdisc import QDISC_FIELDS, QdiscSampler
from testbed.spec import CaptureSpec

__all__ = [
    "Capture",
    "BwmNgRecorder",
    "CpuSampler",
    "MemorySampler",
    "QdiscSampler",
    "SampledCsv",
    "CPU_FIELDS",
    "MEMORY_FIELDS",
    "QDISC_FIELDS",
    "bwm_ng_command",
    "find_bwm_ng",
    "keep_errors",
    "memory_recorder",
]

log = logging.getLogger(__name__)


def _root_ns_links() -> dict[str, int]:
    """{interface name: index} of the root network namespace (this process's namespace)."""
    out = {}
    for name in os.listdir("/sys/class/net"):
        try:
            out[name] = int(Path(f"/sys/class/net/{name}/ifindex").read_text())
        except (OSError, ValueError):
            pass
    return out


def keep_errors(run_dir: str | Path, errors: list[str]) -> None:
    """Append a recorder's problems to ``run_dir/logs/capture.log``, one per line (summary.json
    lists them as ``capture_errors``), and log them; nothing without any (a file that cannot
    be written is skipped: the run goes on)."""
    if not errors:
        return
    try:
        with open(Path(run_dir) / "logs" / "capture.log", "a") as f:
            f.writelines(e.replace("\n", " ") + "\n" for e in errors)
    except OSError:
        pass
    log.warning("capture problems: %s", "; ".join(errors))


class Capture:
    """bwm-ng on the switch ports, a qdisc sampler and a CPU sampler for one run.

    Args:
        run_dir: the run directory; files go to ``run_dir/traces/`` (created if missing),
            bwm-ng's own messages to ``run_dir/logs/bwm-ng.log``.
        ports: interfaces of the root namespace that bwm-ng samples (switch ports).
        qdisc_ifaces: interfaces of the root namespace whose root qdisc is sampled.
        pids: called at every CPU sample; returns ``{process name: pid}`` of the training
            processes started so far (their descendants are included).
        spec: ``capture`` section of the experiment (periods in ms, qdisc/cpu on or off).
        on_pid: called as ``on_pid(pid, what)`` for every capture process started (bwm-ng,
            each tcpdump): the harness ledger.
        procs: called at every endpoint sample; ``[(processes.json entry, pid)]`` of the
            training processes started so far (``traces/endpoints.csv``).
        pcap_ports: resolved ``capture.pcap`` ports (:func:`testbed.capture.pcap.resolve_ports`).
        scale: the run's time dilation (the pcap window is in emulated seconds).
        memory: also record ``memory.csv`` (:mod:`testbed.capture.memory`) with the CPU
            sampler's period and ``pids``'s processes (a cluster machine's agent; on this
            machine the site records it from before the build).

    Use ``start()``/``stop()`` or ``with Capture(...) as cap:``. ``stop()`` is idempotent,
    always kills bwm-ng and joins the threads. ``errors`` lists sampler problems (a sampler
    logs and keeps going rather than failing the run); ``stop()`` also appends them to
    ``logs/capture.log``.
    """

    def __init__(
        self,
        run_dir,
        ports: list[str],
        qdisc_ifaces: list[str] | None = None,
        pids: Callable[[], dict] | None = None,
        spec: CaptureSpec | None = None,
        on_pid: Callable[[int, str], None] | None = None,
        procs: Callable[[], list[tuple[dict, int]]] | None = None,
        pcap_ports: list[str] | None = None,
        scale: float = 1.0,
        memory: bool = False,
    ):
        self.run_dir = Path(run_dir)
        self.ports = list(dict.fromkeys(ports))
        self.qdisc_ifaces = list(dict.fromkeys(qdisc_ifaces or []))
        self.pids = pids or (lambda: {})
        self.spec = spec or CaptureSpec()
        self.on_pid = on_pid
        self.procs = procs
        self.pcap_ports = list(pcap_ports or [])
        self.scale = scale
        self.memory = memory
        self.traces_dir = self.run_dir / "traces"
        self.bwm_path = self.traces_dir / "bwm-ng.csv"
        self.qdisc_path = self.traces_dir / "qdisc.csv"
        self.cpu_path = self.traces_dir / "cpu.csv"
        self.errors: list[str] = []
        self._bwm_ng: BwmNgRecorder | None = None
        self._samplers: list[SampledCsv] = []
        self._recorders = contextlib.ExitStack()  # the stop() of every recorder started, in reverse order
        self._lock = threading.Lock()
        self._started = self._stopped = False

    @property
    def bwm(self) -> subprocess.Popen | None:
        """The bwm-ng process (None before :meth:`start`)."""
        return self._bwm_ng.proc if self._bwm_ng is not None else None

    @property
    def _threads(self) -> list[Periodic]:
        """The sampling threads started."""
        return [s.thread for s in self._samplers if s.thread is not None]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Capture:
        """Start bwm-ng (waiting for its first line) and the samplers.

        Raises:
            MissingRequirement: bwm-ng is not installed.
            TestbedError: a port is not an interface of the root namespace, or bwm-ng exited
                at once (its message is included).
        """
        if self._started:
            raise TestbedError("Capture.start() called twice; use a new Capture per run")
        binary = find_bwm_ng()
        links = _root_ns_links()
        missing = [p for p in self.ports + self.qdisc_ifaces if p not in links]
        if missing:
            raise TestbedError(
                f"capture: interface(s) {', '.join(missing)} not found in the root network "
                f"namespace; capture samples switch ports, which Mininet creates there"
            )
        if not self.ports:
            raise TestbedError("capture: no switch ports to sample")
        self._started = True
        self.traces_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:  # a recorder that fails to start stops what it started itself; stop() stops the others
            self._bwm_ng = BwmNgRecorder(
                self.ports,
                self.spec.interval_ms,
                self.bwm_path,
                self.run_dir / "logs" / "bwm-ng.log",
                self.errors,
                on_pid=self.on_pid,
                binary=binary,
            )
            self._recorders.enter_context(self._bwm_ng)
            if self.spec.qdisc and self.qdisc_ifaces:
                self._start_sampler(
                    SampledCsv(
                        "qdisc",
                        QdiscSampler({links[n]: n for n in self.qdisc_ifaces}),
                        self.qdisc_path,
                        QDISC_FIELDS,
                        self.spec.qdisc_interval_ms / 1000.0,
                        self.errors,
                    )
                )
            if self.spec.cpu:
                self._start_sampler(
                    SampledCsv(
                        "cpu",
                        CpuSampler(self._named_pids),
                        self.cpu_path,
                        CPU_FIELDS,
                        self.spec.cpu_interval_ms / 1000.0,
                        self.errors,
                        row_format=CpuSampler.csv_row,
                        first_after_period=True,
                    )
                )
            if self.memory:
                self._start_sampler(
                    memory_recorder(self.traces_dir, self.pids, self.spec.cpu_interval_ms / 1000.0, self.errors)
                )
            if self.spec.endpoints and self.procs is not None:
                self._start_sampler(
                    SampledCsv(
                        "endpoints",
                        EndpointSampler(self.procs),
                        self.traces_dir / "endpoints.csv",
                        ENDPOINT_FIELDS,
                        self.spec.endpoints_interval_ms / 1000.0,
                        self.errors,
                    )
                )
            if self.spec.pcap is not None and self.pcap_ports:
                pc = self.spec.pcap
                pcap = PcapRecorder(
                    self.pcap_ports,
                    self.run_dir,
                    pc,
                    start_after_s=pc.start_s * self.scale,
                    duration_s=None if pc.duration_s is None else pc.duration_s * self.scale,
                    on_pid=self.on_pid,
                    errors=self.errors,
                )
                self._recorders.enter_context(pcap)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop everything (idempotent): samplers first, then bwm-ng (SIGTERM, then SIGKILL)."""
        with self._lock:
            if self._stopped or not self._started:
                self._stopped = self._stopped or self._started
                return
            self._stopped = True
        self._recorders.close()
        keep_errors(self.run_dir, self.errors)

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    # ------------------------------------------------------------------ recorders

    def _start_sampler(self, sampler: SampledCsv) -> None:
        self._samplers.append(sampler)
        self._recorders.enter_context(sampler)

    def _named_pids(self) -> dict:
        """What the CPU sampler reports: the training processes and bwm-ng."""
        named = dict(self.pids() or {})
        if self.bwm is not None:
            named["bwm-ng"] = self.bwm.pid
        return named
