"""Record what crosses the network and how busy the machine is while a run trains.

Three recorders write into ``<run_dir>/traces/`` (formats in CONTRACTS.md):

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
    A thread that dumps every qdisc of the root namespace (one rtnetlink RTM_GETQDISC dump per
    sample, :class:`QdiscReader`, cross-checked against pyroute2 in the tests) every
    ``capture.interval_ms`` and writes the root qdisc of each interface in
    ``qdisc_ifaces``. An htb root's counters include its leaf queue (verified: the htb
    root's backlog and drops follow the leaf under overload), so the root row is the queue
    of the link. Columns: ``time`` (unix s), ``iface``, ``qdisc`` (kind), ``backlog_bytes``,
    ``backlog_packets`` (gauges), ``drops``, ``overlimits``, ``sent_bytes``, ``sent_packets``
    (cumulative kernel counters since the qdisc was created).

``cpu.csv``
    A thread that samples ``/proc/stat`` (psutil) every ``capture.cpu_interval_ms``:
    ``time, kind, id, busy_pct`` with ``kind`` ``core`` (``id`` = core index, busy % of that
    core over the interval; iowait counts as idle) or ``proc`` (``id`` = process name from
    ``pids()``, busy % of *one* core used by the process and all its descendants, so 150
    means one and a half cores; /proc counts CPU time in 10 ms ticks, so at a 100 ms period a
    process value is +-10 points; a process gets rows from its second sample on). Two
    extra process rows, ``bwm-ng`` and ``harness`` (this Python process, which also runs
    the samplers), show what the measurement costs.

Measured cost at the defaults (10 ms / 100 ms): bwm-ng ~1 % of a core; the samplers ~3-5 %
of a core of the harness process (pyroute2's decoder instead of :class:`QdiscReader` made
the qdisc sampler alone cost ~13 %).

Samplers schedule on a fixed grid (``k * interval``); a sample that overruns skips the
missed slots instead of bursting to catch up.
"""
from __future__ import annotations

import csv
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from testbed.errors import MissingRequirement, TestbedError
from testbed.spec import CaptureSpec

log = logging.getLogger(__name__)

TC_H_ROOT = 0xFFFFFFFF
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
    """A daemon thread calling ``step()`` on a fixed time grid until stopped."""

    def __init__(self, name: str, period_s: float, step: Callable[[], None], errors: list,
                 on_exit: Callable[[], None] | None = None, first_after_period: bool = False):
        super().__init__(name=f"capture-{name}", daemon=True)
        self.period_s, self.step, self.errors, self.on_exit = period_s, step, errors, on_exit
        self.first_after_period = first_after_period
        self.stop_event = threading.Event()

    def run(self):
        try:
            self._loop()
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
            now = time.monotonic()
            nxt = t0 + k * self.period_s
            if nxt < now:  # overran: skip the missed slots
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
        reader = QdiscReader()

        def step():
            rows = reader.dump()
            now = time.time()
            for q in rows:
                name = by_index.get(q["index"])
                if name is None or q["parent"] != TC_H_ROOT:
                    continue
                w.writerow([f"{now:.6f}", name, q["kind"], q["backlog_bytes"], q["backlog_packets"], q["drops"],
                            q["overlimits"], q["sent_bytes"], q["sent_packets"]])
            f.flush()

        t = _Periodic("qdisc", self.spec.interval_ms / 1000.0, step, self.errors, on_exit=reader.close)
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

        def proc_busy(pid: int) -> float | None:
            """% of one core used by pid and its descendants since the previous call (None
            on the first call for pid, which only takes the baseline)."""
            new_root = pid not in cache
            try:
                root = cache[pid] if not new_root else cache.setdefault(pid, psutil.Process(pid))
                members = [root] + root.children(recursive=True)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                cache.pop(pid, None)
                return None
            total = 0.0
            for p in members:
                p = cache.setdefault(p.pid, p)
                try:
                    total += p.cpu_percent(None)  # first call per Process gives 0.0 (baseline)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    cache.pop(p.pid, None)
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


# rtnetlink constants (linux/rtnetlink.h, linux/pkt_sched.h, linux/gen_stats.h)
_RTM_NEWQDISC, _RTM_GETQDISC = 36, 38
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCA_KIND, _TCA_STATS, _TCA_STATS2 = 1, 3, 7
_TCA_STATS_BASIC, _TCA_STATS_QUEUE = 1, 3
_NLMSG_HDR = struct.Struct("=IHHII")      # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")       # family, ifindex, handle, parent, info
_RTA = struct.Struct("=HH")               # len, type
_GNET_BASIC = struct.Struct("=QI")        # bytes, packets
_GNET_QUEUE = struct.Struct("=IIIII")     # qlen, backlog, drops, requeues, overlimits
_TC_STATS = struct.Struct("=QIIIIIII")    # struct tc_stats: bytes, packets, drops, overlimits, bps, pps, qlen, backlog


class QdiscReader:
    """Every qdisc of this process's network namespace with its counters, in one netlink dump.

    The same RTM_GETQDISC dump that ``pyroute2.IPRoute().get_qdiscs()`` (and ``tc -s qdisc``)
    sends, decoded with :mod:`struct` for only the attributes needed: ~0.03 ms per dump
    instead of ~0.7 ms through pyroute2's generic decoder, which at a 10 ms period would cost
    7-15 % of a core of a 2-core machine. tests/test_capture.py checks that both agree.
    """

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def dump(self) -> list[dict]:
        """One dict per qdisc: ``index`` (ifindex), ``handle``, ``parent`` (``TC_H_ROOT`` for a
        root qdisc), ``kind``, ``backlog_bytes``, ``backlog_packets``, ``drops``,
        ``overlimits``, ``sent_bytes``, ``sent_packets``.

        Raises:
            OSError: the kernel answered with an error.
        """
        self.seq += 1
        body = _TCMSG.pack(0, 0, 0, 0, 0)
        self.sock.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), _RTM_GETQDISC,
                                       _NLM_F_REQUEST | _NLM_F_DUMP, self.seq, 0) + body)
        out: list[dict] = []
        while True:
            data = self.sock.recv(1 << 17)
            off = 0
            while off + _NLMSG_HDR.size <= len(data):
                length, mtype, _flags, seq, _pid = _NLMSG_HDR.unpack_from(data, off)
                if length < _NLMSG_HDR.size:
                    break
                if seq == self.seq:
                    if mtype == _NLMSG_DONE:
                        return out
                    if mtype == _NLMSG_ERROR:
                        err = struct.unpack_from("=i", data, off + _NLMSG_HDR.size)[0]
                        if err:
                            raise OSError(-err, f"RTM_GETQDISC: {os.strerror(-err)}")
                    elif mtype == _RTM_NEWQDISC:
                        out.append(_parse_qdisc(data, off + _NLMSG_HDR.size, off + length))
                off += (length + 3) & ~3


def _parse_qdisc(data: bytes, start: int, end: int) -> dict:
    _fam, ifindex, handle, parent, _info = _TCMSG.unpack_from(data, start)
    q = {"index": ifindex, "handle": handle, "parent": parent, "kind": None, "backlog_bytes": 0,
         "backlog_packets": 0, "drops": 0, "overlimits": 0, "sent_bytes": 0, "sent_packets": 0}
    have2 = False
    a = start + _TCMSG.size
    while a + _RTA.size <= end:
        alen, atype = _RTA.unpack_from(data, a)
        if alen < _RTA.size:
            break
        atype &= 0x3FFF  # strip NLA_F_NESTED / NLA_F_NET_BYTEORDER
        if atype == _TCA_KIND:
            q["kind"] = data[a + 4:a + alen].split(b"\0", 1)[0].decode()
        elif atype == _TCA_STATS2:
            have2 = True
            b, bend = a + 4, a + alen
            while b + _RTA.size <= bend:
                blen, btype = _RTA.unpack_from(data, b)
                if blen < _RTA.size:
                    break
                if btype == _TCA_STATS_BASIC and blen >= 4 + _GNET_BASIC.size:
                    q["sent_bytes"], q["sent_packets"] = _GNET_BASIC.unpack_from(data, b + 4)
                elif btype == _TCA_STATS_QUEUE and blen >= 4 + _GNET_QUEUE.size:
                    qlen, backlog, drops, _requeues, overlimits = _GNET_QUEUE.unpack_from(data, b + 4)
                    q.update(backlog_packets=qlen, backlog_bytes=backlog, drops=drops, overlimits=overlimits)
                b += (blen + 3) & ~3
        elif atype == _TCA_STATS and not have2 and alen >= 4 + _TC_STATS.size:
            by, pk, dr, ov, _bps, _pps, ql, bl = _TC_STATS.unpack_from(data, a + 4)
            q.update(sent_bytes=by, sent_packets=pk, drops=dr, overlimits=ov, backlog_packets=ql, backlog_bytes=bl)
        a += (alen + 3) & ~3
    return q
