"""Record what crosses the network and how busy the machine is while a run trains.

Three recorders write into ``<run_dir>/traces/`` (formats in :mod:`traffic.rundir`):

``bwm-ng.csv``
    bwm-ng itself, unmodified output, started as::

        bwm-ng -o csv -T rate -t <interval_ms> -I <port,port,...> -a 0 -c 0 -F traces/bwm-ng.csv

    ``-o csv`` CSV output; ``-T rate`` the per-interval type (the only one whose counters
    are per-interval); ``-t`` the period in ms; ``-I`` the interfaces, matched by exact name;
    ``-a 0`` is required for ``-I`` to restrict the output: with the default ``-a 1`` bwm-ng
    prints *every* interface that is up, and ``-a 2`` every interface, whatever ``-I`` says
    (``-a 0`` prints only selected interfaces that are up; an unknown name is silently
    ignored, which is why :meth:`Capture.start` checks the names first); ``-c 0`` prints
    until killed; ``-F`` writes the file itself and flushes after every line.

    Facts verified on bwm-ng 0.6.3 (Debian 0.6.3-2+b1) with veth pairs in private
    namespaces (tests/test_capture.py repeats the check, tests/data/bwm-ng-veth.csv is such a
    capture):

    * 21 ``;``-separated fields per line: ``time;iface;bytes_out/s;bytes_in/s;
      bytes_total/s;bytes_in;bytes_out;packets_out/s;packets_in/s;packets_total/s;
      packets_in;packets_out;errors_out/s;errors_in/s;errors_in;errors_out;bits_out/s;
      bits_in/s;bits_total/s;bits_in;bits_out`` (the README of 0.6.3 documents the same
      order), then a ``total`` line summing the selected interfaces.
    * ``time`` is gettimeofday() at the moment the line is printed, microsecond resolution.
    * ``bytes_in``/``bytes_out`` are **per-interval deltas**, not cumulative: 200 UDP
      datagrams of 1000 payload bytes sent through a bridge port showed up as lines of
      8336 = 8 x 1042 and 9378 = 9 x 1042 bytes (1042 = 1000 + 8 UDP + 20 IP + 14 Ethernet),
      summing to exactly 200 x 1042 = 208400 bytes, equal to the /proc/net/dev difference.
      The first line of an interface is the delta since bwm-ng's start-up read (not zero when
      traffic flows at start-up).
    * the ``/s`` columns are delta x 1000 / (elapsed ms truncated to an integer): a line
      10.375 ms after the previous one showed 9378 B and 937800 B/s where the true rate is
      903904 B/s (+3.7 %). Analysis therefore recomputes rates from the deltas and the
      timestamps (:func:`analysis.traces.rates`).
    * ``bits_in``/``bits_out`` = 8 x bytes; ``in``/``out`` are from the interface's point of
      view (a switch port's ``out`` is what the switch sends on that link).
    * the period drifts: ``-t 10`` gives ~10.4 ms between lines of an interface.

``qdisc.csv``
    A thread that reads the root qdisc of each interface in ``qdisc_ifaces`` every
    ``capture.qdisc_interval_ms`` (default 50 ms) with pyroute2 (:class:`QdiscSampler`: one RTM_GETQDISC dump of
    the root namespace per sample, on one socket kept open for the whole capture). An htb
    root's counters include its leaf queue (verified: the htb root's backlog and drops follow
    the leaf under overload), so the root row is the queue of the link. Columns: ``time``
    (unix s at which the dump was requested; all rows of a sample share it), ``iface``,
    ``qdisc`` (kind), ``backlog_bytes``, ``backlog_packets`` (gauges), ``drops``,
    ``overlimits``, ``sent_bytes``, ``sent_packets`` (cumulative kernel counters since the
    qdisc was created).

``cpu.csv``
    A thread that samples ``/proc/stat`` (psutil) every ``capture.cpu_interval_ms``:
    ``time, kind, id, busy_pct`` with ``kind`` ``core`` (``id`` = core index, busy % of that
    core over the interval; iowait counts as idle) or ``proc`` (``id`` = process name from
    ``pids()``, busy % of *one* core used by the process and all its descendants, so 150
    means one and a half cores; /proc counts CPU time in 10 ms ticks, so at a 100 ms period a
    process value is +-10 points; a process gets rows from its second sample on). Two
    extra process rows, ``bwm-ng`` and ``harness`` (this Python process, which also runs
    the samplers), show what the measurement costs.

Samplers schedule on a fixed grid (``k * interval``); a sample that overruns its slot skips
the missed slots (the next one starts on the next free slot) instead of bursting to catch
up, so a slow sample lowers the rate and the timestamps show the rate achieved.

Measured cost (2-core machine, 10 ms period): bwm-ng ~1 % of a core; the CPU sampler at
100 ms ~2.5 %; the qdisc sampler is pyroute2 decoding every qdisc of the root namespace (it
grows with the qdiscs there, not with the interfaces sampled): 4 shaped ports (11 qdiscs)
~1.1 ms CPU per sample, 11 % of a core; 12 shaped ports (14-19 qdiscs) 2.2-3 ms per
sample, 22-28 % of a core, all of it in the harness process (the ``harness`` row of
``cpu.csv``).
"""
from __future__ import annotations

import asyncio
import csv
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import TC_H_ROOT

from topologies.errors import MissingRequirement, TestbedError
from testbed.spec import CaptureSpec

log = logging.getLogger(__name__)

QDISC_FIELDS = ["time", "iface", "qdisc", "backlog_bytes", "backlog_packets", "drops", "overlimits",
                "sent_bytes", "sent_packets"]
CPU_FIELDS = ["time", "kind", "id", "busy_pct"]


def bwm_ng_command(ports: list[str], interval_ms: int, out_file: str | Path, binary: str = "bwm-ng") -> list[str]:
    """The bwm-ng command line that samples exactly ``ports`` every ``interval_ms`` into ``out_file``."""
    return [binary, "-o", "csv", "-T", "rate", "-t", str(int(interval_ms)), "-I", ",".join(ports),
            "-a", "0", "-c", "0", "-F", str(out_file)]


def find_bwm_ng() -> str:
    """Path of the bwm-ng binary.

    Raises:
        MissingRequirement: bwm-ng is not installed (the message gives the remedy).
    """
    path = shutil.which("bwm-ng") or ("/usr/bin/bwm-ng" if os.access("/usr/bin/bwm-ng", os.X_OK) else None)
    if not path:
        raise MissingRequirement("bwm-ng is not installed; the testbed records every switch port with it. "
                                 "Install it with `apt-get install bwm-ng` (scripts/setup.sh does this).")
    return path


def _root_ns_links() -> dict[str, int]:
    """{interface name: index} of the root network namespace (this process's namespace)."""
    out = {}
    for name in os.listdir("/sys/class/net"):
        try:
            out[name] = int(Path(f"/sys/class/net/{name}/ifindex").read_text())
        except (OSError, ValueError):
            pass
    return out


class _Periodic(threading.Thread):
    """A daemon thread calling ``step()`` on a fixed time grid (``k * period_s``) until stopped.

    ``on_start``/``on_exit`` run in the thread before the first and after the last step (for
    resources tied to a thread, like pyroute2 sockets); a failing ``on_start`` is recorded in
    ``errors`` and ends the thread. A step that overruns its slot skips the missed slots: the
    next step starts on the next free slot, so a slow step lowers the rate, never piles up.
    """

    def __init__(self, name: str, period_s: float, step: Callable[[], None], errors: list,
                 on_start: Callable[[], None] | None = None, on_exit: Callable[[], None] | None = None,
                 first_after_period: bool = False):
        super().__init__(name=f"capture-{name}", daemon=True)
        self.period_s, self.step, self.errors = period_s, step, errors
        self.on_start, self.on_exit = on_start, on_exit
        self.first_after_period = first_after_period
        self.stop_event = threading.Event()
        self.steps = self.overruns = 0  # steps taken, steps that overran their slot

    def run(self):
        try:
            if self.on_start:
                self.on_start()
            self._loop()
        except Exception as e:  # noqa: BLE001 -- on_start failed: record it, never raise in a thread
            log.warning("%s sampler could not start: %s", self.name, e)
            self.errors.append(f"{self.name}: could not start: {e}")
        finally:
            if self.on_exit:
                self.on_exit()

    def _loop(self):
        t0 = time.monotonic()
        k = 0
        if self.first_after_period and self.stop_event.wait(self.period_s):
            return
        t0 += self.period_s if self.first_after_period else 0.0
        failures = 0
        while not self.stop_event.is_set():
            try:
                self.step()
                failures = 0
            except Exception as e:  # noqa: BLE001 -- a sampler must never take the run down
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning("%s sampler: %s", self.name, e)
                    self.errors.append(f"{self.name}: {e}")
            k += 1
            self.steps += 1
            now = time.monotonic()
            nxt = t0 + k * self.period_s
            if nxt < now:  # overran: skip the missed slots
                self.overruns += 1
                if self.overruns == 1:
                    log.info("%s sampler: a step took longer than the %.1f ms period; skipping missed slots",
                             self.name, 1000 * self.period_s)
                k = int((now - t0) / self.period_s) + 1
                nxt = t0 + k * self.period_s
            self.stop_event.wait(nxt - now)


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
        on_pid: called as ``on_pid(pid, "bwm-ng")`` once bwm-ng runs (the harness ledger).

    Use ``start()``/``stop()`` or ``with Capture(...) as cap:``. ``stop()`` is idempotent,
    always kills bwm-ng and joins the threads. ``errors`` lists sampler problems (a sampler
    logs and keeps going rather than failing the run); ``stop()`` also appends them to
    ``logs/capture.log``.
    """

    def __init__(self, run_dir, ports: list[str], qdisc_ifaces: list[str] | None = None,
                 pids: Callable[[], dict] | None = None, spec: CaptureSpec | None = None,
                 on_pid: Callable[[int, str], None] | None = None):
        self.run_dir = Path(run_dir)
        self.ports = list(dict.fromkeys(ports))
        self.qdisc_ifaces = list(dict.fromkeys(qdisc_ifaces or []))
        self.pids = pids or (lambda: {})
        self.spec = spec or CaptureSpec()
        self.on_pid = on_pid
        self.traces_dir = self.run_dir / "traces"
        self.bwm_path = self.traces_dir / "bwm-ng.csv"
        self.qdisc_path = self.traces_dir / "qdisc.csv"
        self.cpu_path = self.traces_dir / "cpu.csv"
        self.errors: list[str] = []
        self.bwm: subprocess.Popen | None = None
        self._bwm_log = None
        self._threads: list[_Periodic] = []
        self._files: list = []
        self._lock = threading.Lock()
        self._started = self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "Capture":
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
            raise TestbedError(f"capture: interface(s) {', '.join(missing)} not found in the root network "
                               f"namespace; capture samples switch ports, which Mininet creates there")
        if not self.ports:
            raise TestbedError("capture: no switch ports to sample")
        self._started = True
        self.traces_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._start_bwm_ng(binary)
            if self.spec.qdisc and self.qdisc_ifaces:
                self._start_qdisc(links)
            if self.spec.cpu:
                self._start_cpu()
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
        for t in self._threads:
            t.stop_event.set()
        for t in self._threads:
            t.join(timeout=5.0)
            if t.is_alive():
                self.errors.append(f"{t.name} sampler did not stop within 5 s")
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass
        self._files.clear()
        self._stop_bwm_ng()
        if self.errors:  # kept with the run (summary.json lists them as capture_errors)
            try:
                with open(self.run_dir / "logs" / "capture.log", "a") as f:
                    f.writelines(e.replace("\n", " ") + "\n" for e in self.errors)
            except OSError:
                pass
            log.warning("capture problems: %s", "; ".join(self.errors))

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __del__(self):  # last resort: never leave a bwm-ng behind
        try:
            if self.bwm is not None and self.bwm.poll() is None:
                self.bwm.kill()
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ bwm-ng

    def _start_bwm_ng(self, binary: str) -> None:
        cmd = bwm_ng_command(self.ports, self.spec.interval_ms, self.bwm_path, binary)
        self._bwm_log = open(self.run_dir / "logs" / "bwm-ng.log", "ab")
        self._bwm_log.write((" ".join(cmd) + "\n").encode())
        self._bwm_log.flush()
        self.bwm = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._bwm_log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        if self.on_pid:
            self.on_pid(self.bwm.pid, "bwm-ng")
        # wait for the first line so that the capture covers what the caller starts next
        deadline = time.monotonic() + max(2.0, 20 * self.spec.interval_ms / 1000)
        while time.monotonic() < deadline:
            if self.bwm.poll() is not None:
                msg = (self.run_dir / "logs" / "bwm-ng.log").read_text(errors="replace")[-2000:]
                raise TestbedError(f"bwm-ng exited at once with code {self.bwm.returncode}: {msg.strip()}")
            try:
                if self.bwm_path.stat().st_size > 0:
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.005)
        log.warning("bwm-ng wrote nothing within %.1f s of its start", max(2.0, 20 * self.spec.interval_ms / 1000))

    def _stop_bwm_ng(self) -> None:
        p = self.bwm
        if p is not None and p.poll() is not None:
            self.errors.append(f"bwm-ng ended before the capture was stopped (exit code {p.returncode}); "
                               f"see {self.run_dir / 'logs' / 'bwm-ng.log'}")
        elif p is not None:
            for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._bwm_log is not None:
            self._bwm_log.close()
            self._bwm_log = None

    # ------------------------------------------------------------------ qdisc

    def _start_qdisc(self, links: dict[str, int]) -> None:
        by_index = {links[n]: n for n in self.qdisc_ifaces}
        f = open(self.qdisc_path, "w", newline="")
        self._files.append(f)
        w = csv.writer(f)
        w.writerow(QDISC_FIELDS)
        f.flush()
        sampler = QdiscSampler(by_index)

        def step():
            now = time.time()  # the kernel fills the dump when asked; decoding comes after
            for row in sampler.read():
                w.writerow([f"{now:.6f}", *row])
            f.flush()

        t = _Periodic("qdisc", self.spec.qdisc_interval_ms / 1000.0, step, self.errors, on_start=sampler.open,
                      on_exit=sampler.close)
        self._threads.append(t)
        t.start()

    # ------------------------------------------------------------------ cpu

    def _start_cpu(self) -> None:
        import psutil

        f = open(self.cpu_path, "w", newline="")
        self._files.append(f)
        w = csv.writer(f)
        w.writerow(CPU_FIELDS)
        f.flush()
        cache: dict[int, psutil.Process] = {}
        prev = {"cores": psutil.cpu_times(percpu=True)}
        me = os.getpid()
        members_of: dict[int, list[int]] = {}  # root pid -> pids of it and its descendants
        tree = {"age": 0}

        def refresh_tree(roots: list[int]) -> None:
            """One scan of /proc for every root's descendants (psutil's ``children()`` scans
            all of /proc per call: per root and per sample it cost the harness ~30 % of a core)."""
            children: dict[int, list[int]] = {}
            for p in psutil.process_iter(["ppid"]):
                children.setdefault(p.info["ppid"], []).append(p.pid)
            members_of.clear()
            for root in roots:
                out, todo = [], [root]
                while todo:
                    q = todo.pop()
                    out.append(q)
                    todo += children.get(q, [])
                members_of[root] = out
            tree["age"] = 0

        def proc_busy(pid: int) -> float | None:
            """% of one core used by pid and its descendants since the previous call (None
            on the first call for pid, which only takes the baseline)."""
            new_root = pid not in cache
            try:
                if new_root:
                    cache[pid] = psutil.Process(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                return None
            total = 0.0
            for q in members_of.get(pid, [pid]):
                try:
                    p = cache.get(q) or cache.setdefault(q, psutil.Process(q))
                    total += p.cpu_percent(None)  # first call per Process gives 0.0 (baseline)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    cache.pop(q, None)
            return None if new_root else total

        def step():
            now = time.time()
            cores = psutil.cpu_times(percpu=True)
            for i, (a, b) in enumerate(zip(prev["cores"], cores)):
                busy = _busy_pct(a, b)
                if busy is not None:
                    w.writerow([f"{now:.6f}", "core", i, f"{busy:.2f}"])
            prev["cores"] = cores
            named = dict(self.pids() or {})
            if self.bwm is not None:
                named["bwm-ng"] = self.bwm.pid
            roots = [int(pid) for pid in named.values() if pid is not None]
            tree["age"] += 1
            if tree["age"] >= 10 or any(r not in members_of for r in roots):  # new processes: rescan
                refresh_tree(roots)
            for name, pid in named.items():
                if pid is None:
                    continue
                busy = proc_busy(int(pid))
                if busy is not None:
                    w.writerow([f"{now:.6f}", "proc", name, f"{busy:.2f}"])
            busy = proc_busy_self()
            if busy is not None:
                w.writerow([f"{now:.6f}", "proc", "harness", f"{busy:.2f}"])
            f.flush()

        me_proc = psutil.Process(me)
        me_proc.cpu_percent(None)

        def proc_busy_self():
            try:
                return me_proc.cpu_percent(None)  # the harness itself (not its children)
            except psutil.Error:
                return None

        # the first sample one period after the baselines: /proc times have 10 ms ticks, so a
        # few-ms interval would give meaningless percentages
        t = _Periodic("cpu", self.spec.cpu_interval_ms / 1000.0, step, self.errors, first_after_period=True)
        self._threads.append(t)
        t.start()


def _busy_pct(a, b) -> float | None:
    """Busy % of one core between two ``psutil.cpu_times`` samples (iowait counts as idle)."""
    idle_a = a.idle + getattr(a, "iowait", 0.0)
    idle_b = b.idle + getattr(b, "iowait", 0.0)
    # guest time is already included in user time on Linux
    tot_a = sum(a) - getattr(a, "guest", 0.0) - getattr(a, "guest_nice", 0.0)
    tot_b = sum(b) - getattr(b, "guest", 0.0) - getattr(b, "guest_nice", 0.0)
    d = tot_b - tot_a
    if d <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (1.0 - (idle_b - idle_a) / d)))


class QdiscSampler:
    """Counters of the root qdisc of chosen interfaces of this network namespace, via pyroute2.

    :meth:`read` sends one ``RTM_GETQDISC`` dump (what ``tc -s qdisc show`` sends) and keeps
    the root qdisc of each chosen interface. The kernel has no per-interface qdisc dump (a
    request naming one interface still returns every qdisc), so one dump per sample is the
    cheapest. One pyroute2 ``AsyncIPRoute`` socket and a private event loop are opened by
    :meth:`open` and kept until :meth:`close`; pyroute2 ties both to the thread that opened
    them, so call all three methods from one thread. (``AsyncIPRoute`` because the
    synchronous ``IPRoute`` runs the event loop once per message, ~25 % more CPU.)

    Args:
        ifaces: ``{ifindex: name}`` of the interfaces to report.
    """

    def __init__(self, ifaces: dict[int, str]):
        self.ifaces = dict(ifaces)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ipr: AsyncIPRoute | None = None

    def open(self) -> "QdiscSampler":
        """Open the netlink socket (raises OSError if it cannot)."""
        self._loop = asyncio.new_event_loop()
        self._ipr = self._loop.run_until_complete(self._connect())
        return self

    @staticmethod
    async def _connect() -> AsyncIPRoute:
        ipr = AsyncIPRoute()  # made inside the loop: pyroute2 uses it and leaves closing it to us
        await ipr.setup_endpoint()
        return ipr

    def close(self) -> None:
        """Close the socket and the event loop (idempotent)."""
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        if self._loop is not None:
            self._loop.run_until_complete(asyncio.sleep(0))  # let the aborted transport finish closing
            self._loop.close()
            self._loop = None

    def __enter__(self) -> "QdiscSampler":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self) -> list[tuple]:
        """One row per chosen interface that has a root qdisc: ``(iface, qdisc kind,
        backlog_bytes, backlog_packets, drops, overlimits, sent_bytes, sent_packets)``, the
        ``qdisc.csv`` columns after ``time``. Backlogs are gauges, the rest cumulative since
        the qdisc was created.

        Raises:
            pyroute2.NetlinkError: the kernel refused the dump.
        """
        if self._loop is None:
            raise TestbedError("QdiscSampler.read() before open()")
        return self._loop.run_until_complete(self._read())

    async def _read(self) -> list[tuple]:
        rows = []
        async for msg in await self._ipr.get_qdiscs():
            name = self.ifaces.get(msg["index"])
            if name is not None and msg["parent"] == TC_H_ROOT:
                rows.append((name, msg.get_attr("TCA_KIND"), *_qdisc_counters(msg)))
        return rows


def _qdisc_counters(msg) -> tuple:
    """``(backlog_bytes, backlog_packets, drops, overlimits, sent_bytes, sent_packets)`` of a
    pyroute2 qdisc message: from ``TCA_STATS2`` (``TCA_STATS_QUEUE``, ``TCA_STATS_BASIC``),
    else from the legacy ``TCA_STATS``; Nones if the kernel sent neither."""
    stats2 = msg.get_attr("TCA_STATS2")
    if stats2 is not None:
        basic, queue = stats2.get_attr("TCA_STATS_BASIC"), stats2.get_attr("TCA_STATS_QUEUE")
        if basic is not None and queue is not None:
            return (queue["backlog"], queue["qlen"], queue["drops"], queue["overlimits"], basic["bytes"],
                    basic["packets"])
    st = msg.get_attr("TCA_STATS")
    if st is not None:
        return st["backlog"], st["qlen"], st["drop"], st["overlimits"], st["bytes"], st["packets"]
    return (None,) * 6
