"""Capture on real interfaces: bwm-ng's counters against a known amount of traffic.

The live tests build their own network (never Mininet): namespaces ``tbxA``/``tbxB``, each
with a veth whose root-namespace end (``tbx0a``/``tbx0b``) is a port of the bridge ``tbxbr``,
the way Mininet's LinuxBridge switch ports look. IPv6 is off and neighbours are static, so
the only frames on the wire are the test's own UDP datagrams (sent to an address the
receiver does not own, so it drops them without any ICMP answer). Everything is removed in
the fixture's teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import analysis  # noqa: E402
import testbed.capture.bwmng as bwmng  # noqa: E402
from analysis import metrics  # noqa: E402
from analysis.traces import parse_bwm_ng, rates  # noqa: E402
from common.errors import MissingRequirement, TestbedError  # noqa: E402
from testbed.capture import Capture, CpuSampler, QdiscSampler, SampledCsv, bwm_ng_command, find_bwm_ng  # noqa: E402
from testbed.capture.cpu import PROCESSES_PER_SAMPLE  # noqa: E402
from testbed.capture.periodic import Periodic as _Periodic  # noqa: E402
from testbed.spec import CaptureSpec  # noqa: E402

DATA = Path(__file__).parent / "data"
ETH_IP_UDP = 14 + 20 + 8  # bytes of headers per datagram as counted by a veth
NS = {"a": "tbxA", "b": "tbxB"}
IP = {"a": "192.0.2.1", "b": "192.0.2.2"}
# addresses nobody owns, mapped to the peer's MAC: the peer receives and silently drops them
SINK = {"a": "192.0.2.201", "b": "192.0.2.202"}

can_net = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("bwm-ng") is not None
need_net = pytest.mark.skipif(not can_net, reason="needs root, iproute2 and bwm-ng")


def _sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def _teardown_net():
    for cmd in (
        ["ip", "link", "del", "tbx0a"],
        ["ip", "link", "del", "tbx0b"],
        ["ip", "link", "del", "tbxbr"],
        ["ip", "netns", "del", "tbxA"],
        ["ip", "netns", "del", "tbxB"],
    ):
        _sh(*cmd, check=False)


@contextlib.contextmanager
def veth_net():
    """Two namespaces behind a root-namespace bridge; yields the root-side ports."""
    _teardown_net()
    try:
        _sh("ip", "netns", "add", "tbxA")
        _sh("ip", "netns", "add", "tbxB")
        _sh("ip", "link", "add", "tbxbr", "type", "bridge")
        _sh("sysctl", "-qw", "net.ipv6.conf.tbxbr.disable_ipv6=1")
        _sh("ip", "link", "set", "tbxbr", "up")
        for s, ns in NS.items():
            _sh("ip", "link", "add", f"tbx0{s}", "type", "veth", "peer", "name", f"tbx1{s}", "netns", ns)
            _sh("sysctl", "-qw", f"net.ipv6.conf.tbx0{s}.disable_ipv6=1")
            _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            _sh("ip", "link", "set", f"tbx0{s}", "master", "tbxbr", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{IP[s]}/24", "dev", f"tbx1{s}")
            # no multicast: no IGMP reports either, so the test's datagrams are the only frames
            _sh("ip", "-n", ns, "link", "set", f"tbx1{s}", "multicast", "off", "up")
        mac = {
            s: _sh("ip", "netns", "exec", NS[s], "cat", f"/sys/class/net/tbx1{s}/address").stdout.strip() for s in NS
        }
        for s, peer in (("a", "b"), ("b", "a")):
            _sh(
                "ip",
                "-n",
                NS[s],
                "neigh",
                "replace",
                SINK[peer],
                "lladdr",
                mac[peer],
                "dev",
                f"tbx1{s}",
                "nud",
                "permanent",
            )
        yield ["tbx0a", "tbx0b"]
    finally:
        _teardown_net()


def send_udp(src: str, dst: str, count: int, payload: int, gap_s: float = 0.001) -> subprocess.Popen:
    """Start ``count`` UDP datagrams of ``payload`` bytes from namespace side ``src`` to the
    sink address of side ``dst`` (returns the running sender)."""
    code = (
        f"import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        f"for i in range({count}):\n s.sendto(b'x'*{payload},('{SINK[dst]}',9))\n time.sleep({gap_s})\n"
    )
    return subprocess.Popen(["ip", "netns", "exec", NS[src], sys.executable, "-c", code])


def tc_root(dev: str) -> dict:
    """The root qdisc of ``dev`` as ``tc -j -s qdisc show`` reports it (kind, bytes, packets,
    drops, overlimits, backlog, qlen ...)."""
    (root,) = [q for q in json.loads(_sh("tc", "-j", "-s", "qdisc", "show", "dev", dev).stdout) if q.get("root")]
    return root


def _ifindex(dev: str) -> int:
    return int(Path(f"/sys/class/net/{dev}/ifindex").read_text())


def _bwm_ng_pids() -> set[int]:
    out = _sh("pgrep", "-x", "bwm-ng", check=False).stdout.split()
    return {int(p) for p in out}


# ----------------------------------------------------------------------------- no root needed


def test_fixture_is_real_bwm_ng_and_counts_match():
    """tests/data/bwm-ng-veth.csv: a real capture of 200 x 1000 B (a->b) and 50 x 500 B (b->a)."""
    df = parse_bwm_ng(DATA / "bwm-ng-veth.csv")
    assert set(df["iface"]) == {"tbx0a", "tbx0b"}  # the 'total' lines are gone
    tot = df.groupby("iface")[["bytes_in", "bytes_out", "packets_in", "packets_out"]].sum()
    # switch-port view: a's port receives a's datagrams and sends b's
    assert tot.loc["tbx0a", "bytes_in"] == 200 * (1000 + ETH_IP_UDP)
    assert tot.loc["tbx0a", "packets_in"] == 200
    assert tot.loc["tbx0a", "bytes_out"] == 50 * (500 + ETH_IP_UDP)
    assert tot.loc["tbx0b", "bytes_out"] == 200 * (1000 + ETH_IP_UDP)
    assert tot.loc["tbx0b", "bytes_in"] == 50 * (500 + ETH_IP_UDP)
    # per-interval deltas, not cumulative: no line holds (nearly) the whole total
    assert df["bytes_in"].max() < 0.5 * tot["bytes_in"].max()
    # timestamps have sub-millisecond resolution and ~10 ms spacing
    gaps = df[df["iface"] == "tbx0a"]["time"].diff().dropna()
    assert 0.009 < gaps.median() < 0.02


def test_bwm_ng_rate_columns_are_quantized_but_ours_are_not():
    df = parse_bwm_ng(DATA / "bwm-ng-veth.csv", keep_rates=True)
    a = df[df["iface"] == "tbx0a"].sort_values("time").reset_index(drop=True)
    dt = a["time"].diff()
    busy = a[(a["bytes_in"] > 0) & dt.notna()]
    # bwm-ng's rate is bytes * 1000 / int(ms): a multiple of bytes*1000/k for an integer k
    k = busy["bytes_in"] * 1000 / busy["bytes_in_s"]
    assert ((k - k.round()).abs() < 1e-6).all()
    r = rates(df)
    r = r[(r["iface"] == "tbx0a") & (r["rx_bytes"] > 0)]
    assert (r["rx_bps"] - 8 * r["rx_bytes"] / r["dt_s"]).abs().max() < 1e-6
    # ours differ from bwm-ng's whenever the interval is not a whole number of ms
    merged = r.merge(df[["time", "iface", "bytes_in_s"]], on=["time", "iface"])
    assert (merged["rx_bps"] - 8 * merged["bytes_in_s"]).abs().max() > 0


def test_parser_tolerates_truncated_last_line_and_old_format(tmp_path):
    lines = (DATA / "bwm-ng-veth.csv").read_text().splitlines(keepends=True)
    p = tmp_path / "t.csv"
    p.write_text("".join(lines[:30]) + lines[30][:25])  # killed mid-line
    full = parse_bwm_ng(p)
    assert len(full) == sum(1 for l in lines[:30] if ";total;" not in l)
    old = tmp_path / "old.csv"  # bwm-ng 0.6.1: 16 fields, no bits columns
    old.write_text(
        "1.5;eth0;10.00;20.00;30.00;2;1;1.00;1.00;2.00;1;1;0.00;0.00;0;0\n"
        "1.5;total;10.00;20.00;30.00;2;1;1.00;1.00;2.00;1;1;0.00;0.00;0;0\ngarbage\n"
        "1.6;eth0;x;y;z;bad;bad;0;0;0;0;0;0;0;0;0\n"
    )
    o = parse_bwm_ng(old)
    assert list(o["bytes_in"]) == [2] and list(o["bytes_out"]) == [1]
    assert parse_bwm_ng(tmp_path / "missing.csv").empty


def test_bwm_ng_command_restricts_to_ports():
    cmd = bwm_ng_command(["s1-eth1", "s1-eth2"], 10, "/x/bwm-ng.csv")
    assert cmd[cmd.index("-I") + 1] == "s1-eth1,s1-eth2"
    assert cmd[cmd.index("-a") + 1] == "0"  # without -a 0, -I does not restrict the output
    assert cmd[cmd.index("-T") + 1] == "rate" and cmd[cmd.index("-t") + 1] == "10"


def test_missing_bwm_ng_raises_with_remedy(monkeypatch):
    monkeypatch.setattr(bwmng.shutil, "which", lambda name: None)
    monkeypatch.setattr(bwmng.os, "access", lambda *a: False)
    with pytest.raises(MissingRequirement, match="apt-get install bwm-ng"):
        find_bwm_ng()
    with pytest.raises(MissingRequirement):
        Capture("/nonexistent", ["lo"]).start()


def test_sampler_thread_never_piles_up_and_records_real_times():
    """A step slower than the period (25 ms vs 10 ms) runs on the next free slot of the
    grid: one step every 30 ms, never a burst of catch-up steps."""
    times, errors = [], []

    def slow_step():
        times.append(time.monotonic())
        time.sleep(0.025)

    t = _Periodic("slow", 0.010, slow_step, errors)
    t.start()
    time.sleep(0.32)
    t.stop_event.set()
    t.join(2)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert errors == [] and 6 <= len(times) <= 12
    assert min(gaps) >= 0.025  # no burst after an overrun
    assert t.overruns >= len(times) - 2 and t.steps == len(times)


def test_sampler_that_cannot_start_is_recorded_not_raised():
    errors, exited = [], []

    def boom():
        raise OSError("no netlink")

    t = _Periodic("qdisc", 0.01, lambda: None, errors, on_start=boom, on_exit=lambda: exited.append(1))
    t.start()
    t.join(2)
    assert not t.is_alive() and exited == [1] and t.steps == 0
    assert errors == ["capture-qdisc: could not start: no netlink"]
    with pytest.raises(TestbedError, match="before open"):
        QdiscSampler({1: "lo"}).read()


def test_unknown_port_is_an_error(tmp_path):
    if shutil.which("bwm-ng") is None:
        pytest.skip("bwm-ng not installed")
    with pytest.raises(TestbedError, match="tbx-no-such"):
        Capture(tmp_path, ["lo", "tbx-no-such"]).start()
    assert not (tmp_path / "traces" / "bwm-ng.csv").exists()


def test_cpu_sampler_reports_cores_named_processes_with_descendants_and_itself():
    """A process is reported from its second sample on, with the CPU of its descendants (the
    spinning Python is the child of the named ``sh``)."""
    spin = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'while True: pass' & wait"], start_new_session=True)
    sampler = CpuSampler(lambda: {"spin": spin.pid, "not yet": None})
    try:
        with pytest.raises(TestbedError, match="before open"):
            sampler.read()
        time.sleep(0.3)  # the child runs
        with sampler:
            time.sleep(0.2)
            first = sampler.read()
            time.sleep(0.3)
            second = sampler.read()
    finally:
        os.killpg(spin.pid, signal.SIGKILL)
        spin.wait()
    for rows in (first, second):
        assert {r[1] for r in rows if r[0] == "core"} >= set(range(os.cpu_count()))
        assert all(0 <= r[2] <= 100 for r in rows if r[0] == "core")
        assert ("proc", "harness") in {r[:2] for r in rows}
        assert all(0 <= r[2] <= 100 * os.cpu_count() for r in rows)
    assert "spin" not in {r[1] for r in first}  # its first sample is the baseline
    (spun,) = [r[2] for r in second if r[:2] == ("proc", "spin")]
    assert spun > 20  # a busy loop in a child: a good part of a core even on a loaded machine
    assert "not yet" not in {r[1] for r in first + second}
    assert CpuSampler.csv_row(("core", 0, 12.3456)) == ("core", 0, "12.35")
    with pytest.raises(TestbedError, match="before open"):
        sampler.read()  # closed


def test_cpu_sampler_reads_many_processes_every_few_periods_and_cores_every_period():
    """32 processes: process rows every ceil(32 / 16) = 2 samples, cores and the harness every sample."""
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2 * PROCESSES_PER_SAMPLE)]
    try:
        with CpuSampler(lambda: {f"p{i}": p.pid for i, p in enumerate(sleepers)}) as sampler:
            samples = []
            for _ in range(6):
                time.sleep(0.1)  # the default period: 10 ticks, so every core's /proc times move forward
                samples.append(sampler.read())
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    procs = [sum(r[0] == "proc" and r[1] != "harness" for r in rows) for rows in samples]
    assert procs == [0, 32, 0, 32, 0, 32]  # the first read takes the baselines
    assert all({r[1] for r in rows if r[0] == "core"} >= set(range(os.cpu_count())) for rows in samples)
    assert all(("proc", "harness") in {r[:2] for r in rows} for rows in samples[1:])


def test_a_core_whose_times_have_not_moved_gets_no_row_and_its_next_row_covers_both_periods(monkeypatch):
    """/proc/stat counts in 10 ms ticks per field, so over a short period a core can show no
    progress: that core gets no row (not a made-up 0 or 100 %), and its next row covers both periods."""
    cputimes = type(psutil.cpu_times())  # psutil's named tuple of this platform's fields

    def times(busy, idle):
        return cputimes(**{f: 0.0 for f in cputimes._fields} | {"user": busy, "idle": idle})

    readings = iter(
        [
            [times(1.0, 1.0), times(1.0, 1.0)],  # baselines
            [times(1.5, 1.5), times(1.0, 1.0)],  # core 1 has not moved
            [times(2.0, 2.0), times(1.9, 1.1)],  # core 1: 0.9 s busy, 0.1 s idle since its baseline
        ]
    )
    monkeypatch.setattr("testbed.capture.cpu.psutil.cpu_times", lambda percpu: next(readings))
    with CpuSampler(dict) as sampler:
        first = [r for r in sampler.read() if r[0] == "core"]
        second = [r for r in sampler.read() if r[0] == "core"]
    assert first == [("core", 0, 50.0)]
    assert [r[:2] for r in second] == [("core", 0), ("core", 1)]
    assert second[0][2] == pytest.approx(50.0) and second[1][2] == pytest.approx(90.0)


def test_failing_recorder_start_stops_the_recorders_started_before_it(tmp_path, monkeypatch):
    if shutil.which("bwm-ng") is None:
        pytest.skip("bwm-ng not installed")
    started, real_start = [], SampledCsv.start

    def start(self):
        if self.name == "cpu":
            raise RuntimeError("cpu sampler cannot start")
        started.append(real_start(self))
        return self

    monkeypatch.setattr(SampledCsv, "start", start)
    cap = Capture(tmp_path, ["lo"], qdisc_ifaces=["lo"], spec=CaptureSpec(interval_ms=10, qdisc_interval_ms=10))
    with pytest.raises(RuntimeError, match="cpu sampler cannot start"):
        cap.start()
    assert cap.bwm is not None and cap.bwm.poll() is not None  # bwm-ng ran and was stopped
    assert cap.bwm.pid not in _bwm_ng_pids()
    assert [s.name for s in started] == ["qdisc"] and not started[0].thread.is_alive()
    assert not [t for t in cap._threads if t.is_alive()]
    assert cap.errors == []
    cap.stop()  # idempotent
    assert (tmp_path / "traces" / "qdisc.csv").read_text().startswith("time,iface,qdisc")


# ----------------------------------------------------------------------------- live, own veths


@pytest.fixture
def net():
    if not can_net:
        pytest.skip("needs root, iproute2 and bwm-ng")
    with veth_net() as ports:
        yield ports


@need_net
def test_capture_counts_known_traffic_and_leaves_nothing(net, tmp_path):
    ledger = []
    _sh("tc", "qdisc", "add", "dev", "tbx0b", "root", "handle", "5:", "htb", "default", "1")
    _sh("tc", "class", "add", "dev", "tbx0b", "parent", "5:", "classid", "5:1", "htb", "rate", "50mbit", "burst", "15k")
    senders = {}
    cap = Capture(
        tmp_path,
        net,
        qdisc_ifaces=["tbx0b"],
        pids=lambda: senders,
        spec=CaptureSpec(interval_ms=10, qdisc_interval_ms=10, cpu_interval_ms=50),
        on_pid=lambda p, w: ledger.append((w, p)),
    )
    with cap:
        assert ledger == [("bwm-ng", cap.bwm.pid)]
        assert cap.bwm.pid in _bwm_ng_pids()
        s1 = send_udp("a", "b", 300, 1200)
        s2 = send_udp("b", "a", 40, 100, gap_s=0.005)
        senders.update({"s1": s1.pid, "s2": s2.pid})
        assert s1.wait(20) == 0 and s2.wait(20) == 0
        time.sleep(0.1)  # let the last samples be taken
    cap.stop()  # idempotent
    assert cap.bwm.poll() is not None
    assert cap.bwm.pid not in _bwm_ng_pids()  # (other bwm-ngs may run on a shared machine)
    assert not [t for t in cap._threads if t.is_alive()]
    assert cap.errors == []

    df = parse_bwm_ng(tmp_path / "traces" / "bwm-ng.csv")
    assert set(df["iface"]) == {"tbx0a", "tbx0b"}  # exactly the ports asked for
    tot = df.groupby("iface")[["bytes_in", "bytes_out", "packets_in", "packets_out"]].sum()

    def about(got, want, frames):  # the datagrams, plus at most a couple of stray small frames
        return want <= got <= want + 2 * 100 and frames in range(0, 3)

    big, small = 300 * (1200 + ETH_IP_UDP), 40 * (100 + ETH_IP_UDP)
    assert about(tot.loc["tbx0a", "bytes_in"], big, tot.loc["tbx0a", "packets_in"] - 300)
    assert about(tot.loc["tbx0b", "bytes_out"], big, tot.loc["tbx0b", "packets_out"] - 300)
    assert about(tot.loc["tbx0a", "bytes_out"], small, tot.loc["tbx0a", "packets_out"] - 40)
    assert about(tot.loc["tbx0b", "bytes_in"], small, tot.loc["tbx0b", "packets_in"] - 40)
    assert len(df) >= 2 * 20  # >= 0.2 s of samples of both ports

    q = pd_read(tmp_path / "traces" / "qdisc.csv")
    assert set(q["iface"]) == {"tbx0b"} and set(q["qdisc"]) == {"htb"}
    assert q["sent_bytes"].is_monotonic_increasing
    assert q["sent_packets"].iloc[-1] - q["sent_packets"].iloc[0] >= 300
    assert q["time"].diff().median() < 0.03

    c = pd_read(tmp_path / "traces" / "cpu.csv")
    assert set(c["kind"]) == {"core", "proc"}
    assert {str(i) for i in range(os.cpu_count())} <= set(c["id"].astype(str))
    assert {"s1", "s2", "bwm-ng", "harness"} <= set(c["id"].astype(str))
    assert c["busy_pct"].between(0, 100 * os.cpu_count()).all()


@need_net
def test_shaped_link_rate_from_real_capture(net, tmp_path):
    """htb at 20 Mbit/s on a port: the rates computed from bwm-ng's counters show 20 Mbit/s
    while the queue drains, and the summary's shaping check passes."""
    _sh("tc", "qdisc", "add", "dev", "tbx0b", "root", "handle", "5:", "htb", "default", "1")
    _sh("tc", "class", "add", "dev", "tbx0b", "parent", "5:", "classid", "5:1", "htb", "rate", "20mbit", "burst", "15k")
    with Capture(tmp_path, net, ["tbx0b"], spec=CaptureSpec(interval_ms=10, cpu=False)):
        s = send_udp("a", "b", 1500, 1400, gap_s=0)  # 2.1 MB at once: ~0.85 s at 20 Mbit/s
        assert s.wait(20) == 0
        deadline = time.time() + 5
        while time.time() < deadline and tc_root("tbx0b")["qlen"]:  # until the queue has drained
            time.sleep(0.05)
        time.sleep(0.05)
    topo = {
        "hosts": [{"name": "hA"}, {"name": "hB"}],
        "switches": [{"name": "br", "role": "tor"}],
        "links": [
            {"class": "host", "node1": h, "intf1": f"tbx1{x}", "node2": "br", "intf2": f"tbx0{x}", "bw_mbps": 20.0}
            for h, x in (("hA", "a"), ("hB", "b"))
        ],
    }
    (tmp_path / "topology.json").write_text(json.dumps(topo))
    summ = metrics.summarize(tmp_path)
    assert summ.bytes.per_host["hB"].rx >= 1500 * (1400 + ETH_IP_UDP) - 1000 * 1442  # htb may drop
    r = analysis_load(tmp_path).rates
    busy = r[(r["iface"] == "tbx0b") & (r["tx_bps"] > 1e6)]
    assert len(busy) > 30
    assert busy["tx_bps"].median() == pytest.approx(20e6, rel=0.05)
    link = next(l for l in summ.fidelity.rates.links if l.iface == "tbx0b")
    assert 0.9 < link.max_tx_mbps / 20.0 < 1.1
    q = pd_read(tmp_path / "traces" / "qdisc.csv")
    assert q["backlog_bytes"].max() > 100_000  # the queue built up behind the 20 Mbit/s shaper


def analysis_load(path):
    return analysis.load(path)


@need_net
def test_qdisc_sampler_counts_known_traffic_and_agrees_with_tc(net):
    """pyroute2's counters of an htb root: exactly the datagrams sent through it, the same
    values as ``tc -s qdisc`` on a quiet link, and bracketed by two ``tc`` readings while an
    overloaded queue moves."""
    _sh("tc", "qdisc", "add", "dev", "tbx0a", "root", "handle", "5:", "htb", "default", "1")
    _sh("tc", "class", "add", "dev", "tbx0a", "parent", "5:", "classid", "5:1", "htb", "rate", "50mbit", "burst", "15k")
    cols = ("kind", "backlog", "qlen", "drops", "overlimits", "bytes", "packets")

    def ours(sampler):
        rows = {r[0]: r[1:] for r in sampler.read()}
        assert set(rows) == {"tbx0a", "tbx0b"}  # exactly the interfaces asked for
        assert rows["tbx0b"][0] == "noqueue"  # a veth's default root
        return dict(zip(cols, rows["tbx0a"]))

    def quiet_read(sampler):
        """Ours and tc's counters, read while no frame crossed between them (a stray frame,
        e.g. IPv6 neighbour discovery, may arrive at any moment: read again then)."""
        for _ in range(20):
            a, t, b = ours(sampler), {k: tc_root("tbx0a")[k] for k in cols}, ours(sampler)
            if a == b:
                return a, t
            time.sleep(0.05)
        raise AssertionError("the link never stayed quiet for one reading")

    with QdiscSampler({_ifindex("tbx0a"): "tbx0a", _ifindex("tbx0b"): "tbx0b"}) as sampler:
        before, tc_before = quiet_read(sampler)
        assert before == tc_before
        s = send_udp("b", "a", 100, 1000)  # 100 x 1042 B at ~8 Mbit/s: no queue, no drop
        assert s.wait(20) == 0
        time.sleep(0.1)
        after, tc_after = quiet_read(sampler)
        assert after == tc_after  # quiet link: identical
        assert after["kind"] == "htb"
        # the datagrams, plus at most a couple of stray small frames (as in the bwm-ng test)
        stray = after["packets"] - before["packets"] - 100
        assert stray in range(0, 3), stray
        assert 0 <= after["bytes"] - before["bytes"] - 100 * (1000 + ETH_IP_UDP) <= 100 * stray
        assert after["drops"] == before["drops"] == 0 and after["backlog"] == after["qlen"] == 0

        _sh(
            "tc",
            "class",
            "change",
            "dev",
            "tbx0a",
            "parent",
            "5:",
            "classid",
            "5:1",
            "htb",
            "rate",
            "5mbit",
            "burst",
            "15k",
        )
        s = send_udp("b", "a", 400, 1400, gap_s=0)  # overload 5 Mbit/s: backlog and drops
        try:
            deadline = time.time() + 5
            while time.time() < deadline and tc_root("tbx0a")["qlen"] < 20:  # the queue builds up
                time.sleep(0.01)
            lo, mid, hi = tc_root("tbx0a"), ours(sampler), tc_root("tbx0a")  # counters move under load
        finally:
            s.wait(20)
    for k in ("bytes", "packets", "drops", "overlimits"):
        assert lo[k] <= mid[k] <= hi[k], k
    assert mid["backlog"] > 0 and mid["qlen"] > 0  # the queue really built up
    assert hi["packets"] - after["packets"] < 400  # and the shaper held packets back


def pd_read(path):
    return pd.read_csv(path)


if __name__ == "__main__":
    # Regenerate tests/data/bwm-ng-veth.csv (root): 200 x 1000 B a->b, 50 x 500 B b->a.
    with veth_net() as ports:
        out = DATA / "bwm-ng-veth.csv"
        out.unlink(missing_ok=True)
        p = subprocess.Popen(bwm_ng_command(ports, 10, out))
        try:
            time.sleep(0.1)
            s1, s2 = send_udp("a", "b", 200, 1000, 0.002), send_udp("b", "a", 50, 500, 0.008)
            s1.wait(), s2.wait()
            time.sleep(0.1)
        finally:
            p.terminate()
            p.wait()
        print(f"wrote {out}: {len(out.read_text().splitlines())} lines")
