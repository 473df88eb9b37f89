"""Background traffic: iperf3 flows between hosts of the emulated network while a run trains.

PHub blames part of the slowdown of cloud training on the network core: racks have full
bisection bandwidth inside, but "not across racks when the core is busy" (PHub
Section 2.3.3, Figure 6). A spec's ``background`` section (:class:`testbed.spec.BackgroundFlow`)
adds such traffic: each flow is one iperf3 client on host ``src`` sending to an iperf3
server on host ``dst`` at ``rate_mbps`` for ``duration_s``, starting ``start_s`` after the
training processes are launched. Times and rates are emulated: under time dilation ``scale``
the flow sends at rate / scale (like the links) for duration x scale seconds, starting at
start x scale. To load the core rather than the workers' own links, put the endpoints on
background hosts (``topology.background_hosts_per_rack``: ``bg1..``, which run no training)
in different racks.

For flow ``i`` named ``<name>`` (``bg<i>`` by default) the harness runs, inside the Mininet
hosts (:class:`Background`)::

    dst:  iperf3 -s -1 -p <5201 + i> --json --logfile RUN/traces/background/<name>.server.json
    src:  iperf3 -c <dst's first address> -p <5201 + i> -b <bit/s> -t <seconds> [-u] -J \\
              --logfile RUN/traces/background/<name>.json
          (wrapped in ``sh -c 'sleep <start>; exec ...'`` when the start is not 0)

Servers are started, and listening, before the training processes; clients are started with
them and each sleeps until its start. A flow still running when training ends is stopped
(SIGTERM: iperf3 still writes its JSON, with an ``error``). Every pid is in the run's ledger,
so teardown and ``testbed clean`` kill whatever is left. ``traces/background/flows.json``
records each flow as planned and, after the run, when the harness stopped the flows still
running and what iperf3 reports each moved (format in :mod:`traffic.rundir`);
:mod:`analysis.effects` judges from it whether each flow ran as asked.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from common.errors import SpecError, TestbedError
from testbed.interrupts import deferred_signals
from testbed.launch import Launched, kill_all
from traffic.rundir import open_private, write_json

__all__ = [
    "BASE_PORT",
    "MAX_FLOWS",
    "IPERF3_MAX_TIME_S",
    "IPERF3_MIN_RATE_BPS",
    "FlowPlan",
    "plan_flows",
    "server_command",
    "client_command",
    "read_result",
    "listening",
    "listening_in_shell",
    "Background",
]

#: TCP port of flow i's iperf3 server: BASE_PORT + i (iperf3's default port for flow 0).
BASE_PORT = 5201
#: the most flows a spec may have: flow i listens on TCP port BASE_PORT + i, at most 65535
MAX_FLOWS = 65535 - BASE_PORT + 1
#: iperf3's longest test, seconds (``-t``): MAX_TIME in iperf3's src/iperf_api.h; iperf 3.12
#: refuses more with "test duration too long (maximum = 86400 seconds)"
IPERF3_MAX_TIME_S = 86_400
#: the least ``-b`` (bit/s) that limits a flow: ``-b 0`` is no limit at all (man iperf3:
#: "Setting the target bitrate to 0 will disable bitrate limits"), so a shaped rate that
#: rounds to 0 bit/s would send as fast as the links allow
IPERF3_MIN_RATE_BPS = 1
#: Subdirectory of the run directory holding the flows' files.
SUBDIR = Path("traces") / "background"


@dataclass
class FlowPlan:
    """One flow as it runs on this machine.

    ``rate_mbps``, ``start_s``, ``duration_s``: emulated values from the spec;
    ``shaped_bps``: iperf3's ``-b`` (bit/s, rate / scale); ``delay_s``: real seconds between
    the launch of training and the client's start (start x scale); ``seconds``: iperf3's
    ``-t`` (duration x scale, whole seconds).
    """

    index: int
    name: str
    src: str
    dst: str
    dst_ip: str
    port: int
    protocol: str
    rate_mbps: float
    start_s: float
    duration_s: float
    shaped_bps: int
    delay_s: float
    seconds: int


def plan_flows(flows: list, topology: dict, scale: float = 1.0) -> list[FlowPlan]:
    """The flows of a spec (``Experiment.background``) on the built network.

    Args:
        flows: :class:`testbed.spec.BackgroundFlow` s.
        topology: the ``topology.json`` document (hosts and their addresses).
        scale: time dilation (``Experiment.scale``).

    Raises:
        SpecError: a flow names a host the topology does not have (``background[i].src`` /
            ``.dst``, listing the hosts).
    """
    hosts = {h["name"]: h for h in topology["hosts"]}
    out = []
    for i, f in enumerate(flows):
        for end in ("src", "dst"):
            if getattr(f, end) not in hosts:
                raise SpecError(
                    f"background[{i}].{end}", getattr(f, end), "a host of the topology: " + ", ".join(hosts)
                )
        out.append(
            FlowPlan(
                index=i,
                name=f.name or f"bg{i}",
                src=f.src,
                dst=f.dst,
                dst_ip=hosts[f.dst]["ip"],
                port=BASE_PORT + i,
                protocol=f.protocol,
                rate_mbps=f.rate_mbps,
                start_s=f.start_s,
                duration_s=f.duration_s,
                shaped_bps=int(round(f.rate_mbps * 1e6 / scale)),
                delay_s=f.start_s * scale,
                seconds=int(round(f.duration_s * scale)),
            )
        )
    return out


def server_command(fp: FlowPlan, out_dir: Path) -> list[str]:
    """The iperf3 server of a flow (one test, then it exits)."""
    return ["iperf3", "-s", "-1", "-p", str(fp.port), "--json", "--logfile", str(out_dir / f"{fp.name}.server.json")]


def client_command(fp: FlowPlan, out_dir: Path) -> list[str]:
    """The iperf3 client of a flow, behind a ``sleep`` of its start delay if there is one."""
    cmd = [
        "iperf3",
        "-c",
        fp.dst_ip,
        "-p",
        str(fp.port),
        "-b",
        str(fp.shaped_bps),
        "-t",
        str(fp.seconds),
        *(["-u"] if fp.protocol == "udp" else []),
        "--json",
        "--logfile",
        str(out_dir / f"{fp.name}.json"),
    ]
    if fp.delay_s <= 0:
        return cmd
    return ["sh", "-c", f"sleep {fp.delay_s:.3f}; exec {shlex.join(cmd)}"]


def read_result(path: Path) -> dict:
    """What an iperf3 client's JSON says the flow moved.

    Returns:
        ``{"bytes_sent", "bytes_received", "seconds", "error"}``: payload bytes the client
        sent and the server received (null if not reported), seconds of the test, and
        iperf3's error message (or why there is no result) or null.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return {
            "bytes_sent": None,
            "bytes_received": None,
            "seconds": None,
            "error": f"no iperf3 result in {Path(path).name} ({type(e).__name__}): the flow did not run "
            f"to its end (training ended first?)",
        }
    end = doc.get("end") or {}
    sent = end.get("sum_sent") or end.get("sum") or {}
    received = end.get("sum_received") or {}
    return {
        "bytes_sent": sent.get("bytes"),
        "bytes_received": received.get("bytes"),
        "seconds": sent.get("seconds"),
        "error": doc.get("error"),
    }


def listening(pid: int, port: int) -> bool:
    """True if a TCP socket in the network namespace of ``pid`` listens on ``port``."""
    lines = []
    for table in ("tcp", "tcp6"):
        try:
            lines += Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
    return _listens(lines, port)


def listening_in_shell(node, port: int) -> bool:
    """:func:`listening` for a Mininet host on another machine (its shell reads its namespace's tables)."""
    return _listens(node.cmd("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null").splitlines(), port)


def _listens(lines: list[str], port: int) -> bool:
    """True if a line of ``/proc/net/tcp{,6}`` is a socket listening on ``port`` (headers skipped)."""
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
            except (ValueError, IndexError):
                continue
    return False


class Background:
    """The background flows of one run on the built network (no flows: every call is a no-op).

    Args:
        flows: ``Experiment.background``.
        topology: the ``topology.json`` document.
        site: the run's :class:`testbed.site.Site`: it runs a command in a host, tells whether
            a host listens on a port, and where a host's files are (on another machine, the
            flows' files are written in its staging directory and fetched from there, and a
            flow is stopped there with SIGTERM, so that iperf3 writes its JSON).
        run_dir: the run directory (files go to ``traces/background/``, logs to ``logs/``).
        scale: time dilation.
        on_pid: called with ``(what, pid)`` for every process started (the run's ledger).

    Raises:
        SpecError: a flow names a host the topology does not have.
    """

    def __init__(
        self,
        flows: list,
        topology: dict,
        site,
        run_dir: Path,
        scale: float = 1.0,
        on_pid: Callable[[str, int], None] | None = None,
    ):
        self.site = site
        self.plans = plan_flows(flows, topology, scale)
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / SUBDIR
        self.scale = scale
        self.on_pid = on_pid or (lambda what, pid: None)
        self.procs: list[Launched] = []
        self.started_at: dict[str, float] = {}
        self.stopped_at: float | None = None

    def _popen(self, fp: FlowPlan, role: str, cmd: list[str]) -> Launched:
        log = self.run_dir / "logs" / f"background-{fp.name}-{role}.log"
        host = fp.src if role == "client" else fp.dst
        with deferred_signals():  # recorded before a Ctrl-C can interrupt
            with open_private(log) as f:
                p = self.site.run_in(host, cmd, f)
            launched = Launched({"name": f"background:{fp.name}:{role}", "role": role, "host": host}, p, log)
            self.procs.append(launched)
            self.on_pid(launched.info["name"], p.pid)
        return launched

    def start_servers(self, timeout_s: float = 10.0) -> None:
        """Start every flow's iperf3 server and wait until each listens.

        Raises:
            TestbedError: a server exited or did not listen within ``timeout_s``.
        """
        if not self.plans:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        servers = [
            (fp, self._popen(fp, "server", server_command(fp, self.site.host_dir(fp.dst) / SUBDIR)))
            for fp in self.plans
        ]
        deadline = time.monotonic() + timeout_s
        for fp, l in servers:
            while not self.site.listening(fp.dst, fp.port):
                if l.popen.poll() is not None or time.monotonic() > deadline:
                    raise TestbedError(
                        f"background flow {fp.name}: the iperf3 server on {fp.dst} (port {fp.port}) "
                        f"did not start listening; see {l.log} and {self.dir / (fp.name + '.server.json')}"
                    )
                time.sleep(0.02)

    def start_clients(self) -> None:
        """Start every flow's client now (each sleeps until its start) and write
        ``flows.json``. Call it when the training processes are launched."""
        if not self.plans:
            return
        t0 = time.time()
        for fp in self.plans:
            self._popen(fp, "client", client_command(fp, self.site.host_dir(fp.src) / SUBDIR))
            self.started_at[fp.name] = t0 + fp.delay_s
        self._write()

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop every flow still running (SIGTERM, SIGKILL after ``grace_s``) and record when
        (``stopped``) and each flow's result in ``flows.json``. Never raises."""
        if not self.plans:
            return
        if self.stopped_at is None:
            self.stopped_at = time.time()
        self.site.stop_matching(str(SUBDIR), grace_s)
        kill_all(self.procs, grace_s=grace_s)
        try:
            self._write(results=True)
        except OSError:  # the run directory is gone: nothing to record into
            pass

    def _write(self, results: bool = False) -> None:
        flows = []
        for fp in self.plans:
            d = asdict(fp)
            d["client_start"] = self.started_at.get(fp.name)
            if results:
                self.site.fetch(fp.src, str(SUBDIR / f"{fp.name}.json"))
                d["result"] = read_result(self.dir / f"{fp.name}.json")
            flows.append(d)
        write_json(self.dir / "flows.json", {"scale": self.scale, "stopped": self.stopped_at, "flows": flows})
