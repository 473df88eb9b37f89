"""Header capture on chosen switch ports: tcpdump, one process per port.

``capture.pcap`` (:class:`testbed.spec.PcapSpec`) names the ports; :func:`resolve_ports`
turns its tokens into switch-side interfaces of the root namespace:

``uplinks``
    the ToR end of every ToR-core uplink (what crosses the core, once);
``host:<name>``
    the ToR port facing host ``<name>`` (everything that host sends and receives);
``<interface>``
    a switch port by its name (``tor1-eth3``, ``core1-eth1``).

Each port gets ``tcpdump -i <port> -s <snaplen> -n -U --immediate-mode -w
traces/pcap/<port>.pcap [-- filter]`` (every packet handed over and written as it is captured,
so a stopped or killed capture leaves whole packets up to its last moments), started when the capture starts (just
before the training processes
are launched) or ``start_after_s`` later, and stopped with the capture or after
``duration_s``. ``traces/pcap/ports.json`` lists ``{port, file, snaplen_bytes, filter,
started, stopped, packets_captured, packets_dropped, exit_code, terminated, error}`` (unix s;
the counts from tcpdump's closing report, None if it was killed; ``exit_code`` tcpdump's exit
status, negative for the signal that killed it, None if it never started; ``terminated`` true
when it was still running when the harness stopped it with SIGTERM, false when it had exited
on its own; ``error`` why it never started, e.g. a start too far away to schedule).
tcpdump's messages go to ``logs/tcpdump-<port>.log``. The analysis is :func:`analysis.flows`;
:mod:`analysis.effects` judges from ``ports.json`` whether each port was captured.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mininet.util import natural

from common.errors import FieldError, MissingRequirement, SpecError
from testbed.interrupts import deferred_signals
from testbed.lifetime import tied_preexec
from testbed.spec import PcapSpec
from traffic.rundir import open_private

__all__ = ["PcapRecorder", "resolve_ports", "topo_links", "find_tcpdump", "tcpdump_command"]

_FIELD = "capture.pcap.ports"


def find_tcpdump() -> str:
    """Path of tcpdump.

    Raises:
        MissingRequirement: it is not installed (remedy: apt-get install tcpdump).
    """
    path = shutil.which("tcpdump") or ("/usr/bin/tcpdump" if Path("/usr/bin/tcpdump").exists() else None)
    if path is None:
        raise MissingRequirement("capture.pcap needs tcpdump: apt-get install tcpdump (scripts/setup.sh installs it)")
    return path


def topo_links(topo) -> list[dict]:
    """The links of a Mininet Topo graph as ``topology.json`` lists them (``class, node1, intf1,
    node2, intf2``), with the interface names the network will give them: what
    :func:`resolve_ports` reads before anything is built."""
    return [
        {
            "class": info.get("link_class"),
            "node1": n1,
            "intf1": f"{n1}-eth{info['port1']}",
            "node2": n2,
            "intf2": f"{n2}-eth{info['port2']}",
        }
        for n1, n2, info in topo.links(withInfo=True)
    ]


def resolve_ports(tokens: list[str], links: list[dict], switches: set[str]) -> list[str]:
    """The switch ports named by ``capture.pcap.ports`` tokens, in order, without repeats.

    Args:
        tokens: ``uplinks``, ``host:<name>`` or a switch port name.
        links: ``topology.json`` links (or :func:`topo_links` of the Topo).
        switches: names of the switches (ToRs and core).

    Raises:
        SpecError: a token names no port (each bad token, with what is allowed).
    """
    switch_ports = [l[f"intf{e}"] for l in links for e in ("1", "2") if l[f"node{e}"] in switches]
    host_port = {}
    for l in links:
        if l["class"] == "host":
            host, sw = (l["node1"], l["intf2"]) if l["node2"] in switches else (l["node2"], l["intf1"])
            host_port[host] = sw
    uplinks = [l["intf1"] if l["node1"].startswith("tor") else l["intf2"] for l in links if l["class"] == "uplink"]
    out, bad = [], []
    for t in tokens:
        if t == "uplinks":
            if not uplinks:
                bad.append(
                    FieldError(_FIELD, t, "uplinks exist only in a rack_core topology; name a port or host:<name>")
                )
            out += uplinks
        elif t.startswith("host:"):
            name = t[len("host:") :]
            if name not in host_port:
                bad.append(
                    FieldError(
                        _FIELD, t, "host:<name> of a host of the topology: " + ", ".join(sorted(host_port, key=natural))
                    )
                )
            else:
                out.append(host_port[name])
        elif t in switch_ports:
            out.append(t)
        else:
            bad.append(
                FieldError(
                    _FIELD,
                    t,
                    "'uplinks', 'host:<name>' or a switch port: " + ", ".join(sorted(switch_ports, key=natural)),
                )
            )
    if bad:
        raise SpecError.of(bad)
    return list(dict.fromkeys(out))


def tcpdump_command(binary: str, port: str, snaplen: int, out_file: Path, bpf: str | None) -> list[str]:
    """``tcpdump -i PORT -s SNAPLEN -n -U --immediate-mode -Z root -w OUT [-- BPF]``.

    The filter follows ``--``, so one that begins with ``-`` (``-1 != 0 and tcp`` is valid
    BPF) is read as the filter, never as options.

    ``--immediate-mode``: without it libpcap (TPACKET_V3) hands packets over in blocks, up to
    a second late, and a tcpdump stopped with SIGTERM drops the block it holds (the packets
    lost so: ``docs/scaling.md``, "What the capture costs"). ``-Z root``: the
    file stays root's."""
    return [
        binary,
        "-i",
        port,
        "-s",
        str(snaplen),
        "-n",
        "-U",
        "--immediate-mode",
        "-Z",
        "root",
        "-w",
        str(out_file),
    ] + (["--", bpf] if bpf else [])


_REPORT = re.compile(r"(\d+) packets? captured.*?(\d+) packets? dropped by kernel", re.S)


class PcapRecorder:
    """tcpdump on each port of ``ports`` for one run (see the module doc).

    Args:
        ports: switch ports (root namespace), as :func:`resolve_ports` gives them.
        run_dir: the run directory (``traces/pcap/``, ``logs/tcpdump-<port>.log``).
        spec: the ``capture.pcap`` section (ports are given resolved; its window is given in
            wall-clock seconds by the next two arguments).
        start_after_s: wall-clock seconds after :meth:`start` at which tcpdump starts
            (``spec.start_s * scale``).
        duration_s: wall-clock seconds tcpdump runs (``spec.duration_s * scale``; None: until
            :meth:`stop`).
        on_pid: called as ``on_pid(pid, "tcpdump:<port>")`` for every tcpdump started.
        errors: problems are appended here (a failed tcpdump does not fail the run).

    ``start()`` starts them now, or after ``start_after_s`` on a timer; ``stop()`` is
    idempotent and safe without a start.

    Raises:
        MissingRequirement: tcpdump is not installed (at construction).
    """

    def __init__(
        self,
        ports: list[str],
        run_dir: str | Path,
        spec: PcapSpec,
        start_after_s: float = 0.0,
        duration_s: float | None = None,
        on_pid: Callable[[int, str], None] | None = None,
        errors: list[str] | None = None,
    ):
        self.binary = find_tcpdump()
        self.ports, self.spec = list(ports), spec
        self.start_after_s, self.duration_s = start_after_s, duration_s
        self.dir = Path(run_dir) / "traces" / "pcap"
        self.logs = Path(run_dir) / "logs"
        self.on_pid = on_pid or (lambda pid, what: None)
        self.errors = errors if errors is not None else []
        self.procs: dict[str, subprocess.Popen] = {}
        self.entries: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._timers: list[threading.Timer] = []

    def start(self) -> PcapRecorder:
        self.dir.mkdir(parents=True, exist_ok=True)
        for port in self.ports:
            self.entries[port] = {
                "port": port,
                "file": f"{port}.pcap",
                "snaplen_bytes": self.spec.snaplen_bytes,
                "filter": self.spec.filter,
                "started": None,
                "stopped": None,
                "packets_captured": None,
                "packets_dropped": None,
                "exit_code": None,
                "terminated": None,
                "error": None,
            }
        self._write_index()
        if self.start_after_s > 0:
            self._timer(self.start_after_s, self._start_all, "start", "tcpdump was not started")
        else:
            self._start_all()
        return self

    def _timer(self, delay_s: float, fn, what: str, otherwise: str) -> None:
        """Call ``fn`` in ``delay_s`` s on a daemon timer. A delay no timer can wait
        (beyond ``threading.TIMEOUT_MAX`` s, about 292 years) is recorded as an error, in
        :attr:`errors` and in the ``error`` of every port not started, instead of a timer
        thread dying with a traceback: "the ``what`` ... cannot be scheduled ...: ``otherwise``"."""
        if not delay_s <= threading.TIMEOUT_MAX:
            msg = (
                f"capture.pcap: the {what} {delay_s:g} s away cannot be scheduled (a timer waits at most "
                f"{threading.TIMEOUT_MAX:.0f} s): {otherwise}"
            )
            self.errors.append(msg)
            for e in self.entries.values():
                if e["started"] is None:
                    e["error"] = msg
            self._write_index()
            return
        t = threading.Timer(delay_s, fn)
        t.daemon = True
        t.name = "capture-pcap-window"
        self._timers.append(t)
        t.start()

    def _start_all(self) -> None:
        for port in self.ports:
            with self._lock:
                if self._stopped:
                    return
                cmd = tcpdump_command(
                    self.binary, port, self.spec.snaplen_bytes, self.dir / f"{port}.pcap", self.spec.filter
                )
                log = open_private(self.logs / f"tcpdump-{port}.log")
                try:
                    log.write((" ".join(cmd) + "\n").encode())
                    log.flush()
                    with deferred_signals():  # recorded before a Ctrl-C can interrupt
                        # tied to the harness when started from its main thread (a window's timer
                        # thread would end it early); in the run's cgroup either way (on_pid)
                        p = subprocess.Popen(
                            cmd,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                            preexec_fn=tied_preexec(),
                        )
                        self.procs[port] = p
                        self.on_pid(p.pid, f"tcpdump:{port}")
                finally:
                    log.close()
                self.entries[port]["started"] = time.time()
        self._wait_listening()
        self._write_index()
        if self.duration_s is not None:
            self._timer(self.duration_s, self.stop, "end of the window", "tcpdump runs until the capture stops")

    def _wait_listening(self, wait_s: float = 5.0) -> None:
        """Wait until each tcpdump says it listens (its first packet would be missed before)."""
        deadline = time.monotonic() + wait_s
        pending = set(self.procs)
        while pending and time.monotonic() < deadline:
            for port in list(pending):
                text = (self.logs / f"tcpdump-{port}.log").read_text(errors="replace")
                if "listening on" in text:
                    pending.discard(port)
                elif self.procs[port].poll() is not None:
                    pending.discard(port)
                    self.errors.append(f"tcpdump on {port} exited at once: {text.strip()[-500:]}")
            time.sleep(0.02)
        for port in pending:
            self.errors.append(f"tcpdump on {port} did not report listening within {wait_s:.0f} s")

    def stop(self) -> None:
        """Stop every tcpdump (SIGTERM: it flushes and reports its counts; SIGKILL after 3 s)
        and complete ``ports.json``."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for t in self._timers:
            t.cancel()
        for port, p in self.procs.items():
            self.entries[port]["terminated"] = p.poll() is None
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for port, p in self.procs.items():
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            e = self.entries[port]
            e["stopped"] = time.time()
            e["exit_code"] = p.returncode
            try:
                m = _REPORT.search((self.logs / f"tcpdump-{port}.log").read_text(errors="replace"))
            except OSError:
                m = None
            if m:
                e["packets_captured"], e["packets_dropped"] = int(m.group(1)), int(m.group(2))
                if e["packets_dropped"]:
                    self.errors.append(
                        f"tcpdump on {port}: the kernel dropped {e['packets_dropped']} packets "
                        f"of the capture (not of the network): narrow capture.pcap"
                    )
        try:
            self._write_index()
        except OSError as e:
            self.errors.append(f"could not write {self.dir / 'ports.json'}: {e}")

    def _write_index(self) -> None:
        tmp = self.dir / "ports.json.tmp"
        tmp.write_text(json.dumps(list(self.entries.values()), indent=1))
        tmp.replace(self.dir / "ports.json")

    def __enter__(self) -> PcapRecorder:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
