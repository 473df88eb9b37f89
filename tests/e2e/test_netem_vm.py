"""Link delay and loss on a kernel with netem (the Vagrant VM: scripts/test-vm.sh), end to end:
each is read back from the kernel's qdiscs and measured by real traffic between two emulated
hosts, under time dilation.

Two hosts on one switch: a packet from h1 to h2 crosses two links, each shaped at both ends
(htb with a netem leaf), so one way it meets two netem ends and a round trip four: the spec's
``delay_ms`` of every link gives a round trip of 4 x ``delay_ms`` in emulated time, 4 x
``delay_ms`` x scale on this machine's clock. Loss is drawn at every end: one way, a datagram
survives two ends, (1 - loss)^2.

Each measured figure is printed on a line starting with ``netem:`` (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from testbed.ledger import Ledger, NetworkLock
from testbed.network import Network
from tests.leftovers import leftovers
from topologies import TopologySpec
from traffic import rundir


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, qdiscs)"
    if shutil.which("mnexec") is None or shutil.which("iperf3") is None:
        return "needs Mininet and iperf3: apt-get install mininet iperf3 (or run scripts/setup.sh)"
    from testbed.check import kernel_qdiscs

    if not kernel_qdiscs().get("netem", False):
        return (
            "needs a kernel with the netem qdisc (sch_netem), which this one lacks: boot a full "
            "distribution kernel (Debian's linux-image-amd64), e.g. the Vagrant VM: bash scripts/test-vm.sh"
        )
    return None


_REASON = _why_not()
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

#: time dilation of these tests: delays are shaped x SCALE, rates / SCALE
SCALE = float(os.environ.get("TESTBED_NETEM_SCALE", "4"))
#: the tolerance on a measured delay or rate
REL = 0.10
#: UDP payload bytes of the loss and rate measurements; on the wire each is 42 bytes more
#: (UDP 8, IPv4 20, Ethernet 14: htb counts the Ethernet frame)
PAYLOAD = 1000
WIRE = PAYLOAD + 42


def figure(name: str, **values) -> None:
    """One measured figure, printed for scripts/test-vm.sh and docs/vm.md."""
    print(
        f"netem: {name}: "
        + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()),
        flush=True,
    )


@pytest.fixture
def run_dir(tmp_path):
    assert leftovers() == [], "machine not clean before the test"
    d = rundir.create(tmp_path, "netem")
    yield d
    assert leftovers() == []


def _network(run_dir, **topology) -> Network:
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, **topology)
    return Network(spec, [], run_dir, Ledger.create("netem", run_dir), scale=SCALE)


def _ends(net: Network) -> tuple[str, str]:
    """h1's own end of its link, and the switch's end of h2's link: the two netem ends a
    packet from h1 to h2 is sent through."""
    h1 = h2 = None
    for link in net.topology["links"]:
        for mine, other in (("1", "2"), ("2", "1")):
            if link[f"node{mine}"] == "h1":
                h1 = link[f"intf{mine}"]
            if link[f"node{mine}"] == "h2":
                h2 = link[f"intf{other}"]
    assert h1 and h2, net.topology["links"]
    return h1, h2


def _read_back(net: Network) -> list[dict]:
    """Every link end's shaping as the build read it back from the kernel."""
    return [got for link in net.topology["links"] for got in link["shaping"].values()]


def _netem_counts(net: Network, intf: str) -> tuple[int, int]:
    """(packets sent, packets dropped) by the netem qdisc of ``intf`` (in h1's namespace for
    h1's end, the machine's for a switch's end), from ``tc -s -j``."""
    cmd = f"tc -s -j qdisc show dev {intf}"
    out = (
        net.hosts["h1"].cmd(cmd)
        if intf.startswith("h1-")
        else subprocess.run(cmd.split(), capture_output=True, text=True, check=True).stdout
    )
    (q,) = [q for q in json.loads(out) if q["kind"] == "netem"]
    return int(q["packets"]), int(q["drops"])


def _ping_ms(net: Network, count: int = 25) -> list[float]:
    """Round trips of ICMP echo from h1 to h2, ms of this machine's clock (the first, which
    waits for ARP, left out)."""
    out = net.hosts["h1"].cmd(f"ping -n -c {count} -i 0.2 -W 5 {net.hosts['h2'].IP()}")
    times = [float(t) for t in re.findall(r"time=([\d.]+) ms", out)]
    assert len(times) >= count - 2, out
    return times[1:]


TCP_ECHO = r"""
import socket, statistics, sys, time
mode, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 5201 + 7)); s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
else:
    c = socket.create_connection((addr, 5201 + 7), timeout=30); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(n):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); out.append((time.perf_counter() - t) * 1e3)
    print(" ".join(f"{x:.3f}" for x in out))
"""


def _tcp_rtt_ms(net: Network, count: int = 25) -> list[float]:
    """Round trips of one byte echoed over a TCP connection from h1 to h2 (TCP_NODELAY),
    ms of this machine's clock (the first left out)."""
    h2 = net.hosts["h2"]
    script = net.run_dir / "tcp_echo.py"
    script.write_text(TCP_ECHO)
    server = h2.popen([sys.executable, str(script), "server", h2.IP(), "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        out = net.hosts["h1"].cmd(f"{sys.executable} {script} client {h2.IP()} {count}")
        times = [float(x) for x in out.split()]
        assert len(times) == count, out
        return times[1:]
    finally:
        server.kill()
        server.wait()


def _iperf3(net: Network, *args: str) -> dict:
    """One iperf3 test from h1 to h2 (``args`` for the client), its JSON."""
    h2 = net.hosts["h2"]
    server = h2.popen(["iperf3", "-s", "-1", "-B", h2.IP()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = ""
        for _ in range(20):  # until the server listens
            out = net.hosts["h1"].cmd(f"iperf3 -J -c {h2.IP()} " + " ".join(args))
            if '"error"' not in out:
                break
            time.sleep(0.5)
        doc = json.loads(out)
        assert "error" not in doc, doc.get("error")
        return doc
    finally:
        server.kill()
        server.wait()


def _snmp_tcp(net: Network, host: str) -> dict[str, int]:
    """The TCP counters of a host's namespace (/proc/net/snmp)."""
    lines = [l.split() for l in net.hosts[host].cmd("cat /proc/net/snmp").splitlines() if l.startswith("Tcp:")]
    return dict(zip(lines[0][1:], map(int, lines[1][1:])))


def test_delay_reads_back_and_tcp_and_icmp_round_trips_match_the_dilated_spec(run_dir):
    delay_ms = 5.0
    with NetworkLock():
        with _network(run_dir, host_bw_mbps=100, delay_ms=delay_ms) as net:
            ends = _read_back(net)
            assert len(ends) == 4 and {e["leaf"] for e in ends} == {"netem"}
            for e in ends:  # the kernel shapes the dilated delay at every end
                assert e["delay_ms"] == pytest.approx(delay_ms * SCALE, rel=1e-3)
            want = 4 * delay_ms  # emulated ms: four netem ends a round trip
            icmp = statistics.median(_ping_ms(net)) / SCALE
            tcp = statistics.median(_tcp_rtt_ms(net)) / SCALE
    figure(
        "delay",
        spec_ms=delay_ms,
        scale=SCALE,
        read_back_ms=ends[0]["delay_ms"],
        rtt_spec_ms=want,
        icmp_rtt_ms=icmp,
        tcp_rtt_ms=tcp,
        icmp_err_pct=100 * (icmp / want - 1),
        tcp_err_pct=100 * (tcp / want - 1),
    )
    assert icmp == pytest.approx(want, rel=REL)
    assert tcp == pytest.approx(want, rel=REL)


def _per_end(one_way_loss: float) -> float:
    """The loss of one netem end from the loss of a path through two: 1 - sqrt(1 - p)."""
    return 1 - math.sqrt(1 - one_way_loss)


def test_loss_reads_back_and_is_measured_at_the_qdisc_by_datagrams_and_by_tcp(run_dir):
    loss_pct = 1.0
    with NetworkLock():
        with _network(run_dir, host_bw_mbps=100, loss_pct=loss_pct) as net:
            ends = _read_back(net)
            assert {e["leaf"] for e in ends} == {"netem"}
            for e in ends:
                assert e["loss_pct"] == pytest.approx(loss_pct, rel=1e-3)
            first, second = _ends(net)
            before = [_netem_counts(net, i) for i in (first, second)]
            # 5000 datagrams at 4 Mbit/s of this machine's clock, well below the shaped 25 Mbit/s
            udp = _iperf3(net, "-u", "-b", "4M", "-l", str(PAYLOAD), "-k", "5000")
            after = [_netem_counts(net, i) for i in (first, second)]
            snmp0 = _snmp_tcp(net, "h1")
            tcp = _iperf3(net, "-t", "8")
            snmp1 = _snmp_tcp(net, "h1")
    s = udp["end"]["sum"]
    one_way = s["lost_packets"] / s["packets"]
    measured = 100 * _per_end(one_way)
    qdisc = []
    for (p0, d0), (p1, d1) in zip(before, after):
        sent, dropped = p1 - p0, d1 - d0
        qdisc.append(100 * dropped / (sent + dropped))
    out_segs = snmp1["OutSegs"] - snmp0["OutSegs"]
    retrans = snmp1["RetransSegs"] - snmp0["RetransSegs"]
    retrans_pct = 100 * retrans / out_segs
    figure(
        "loss",
        spec_pct=loss_pct,
        read_back_pct=ends[0]["loss_pct"],
        datagrams=s["packets"],
        lost=s["lost_packets"],
        per_end_pct=measured,
        qdisc_h1_pct=qdisc[0],
        qdisc_switch_pct=qdisc[1],
        tcp_mbps=tcp["end"]["sum_received"]["bits_per_second"] / 1e6 * SCALE,
        tcp_segments=out_segs,
        tcp_retrans=retrans,
        tcp_retrans_pct=retrans_pct,
        tcp_retrans_spec_pct=100 * (1 - (1 - loss_pct / 100) ** 2),
    )
    assert 0.5 <= measured <= 1.5
    assert all(0.5 <= q <= 1.5 for q in qdisc), qdisc
    # TCP loses what the path loses and sends it again (a lost retransmission twice, a
    # spurious one on a late acknowledgement): a loose bound around the path's 1.99 %
    assert retrans > 0 and 0.5 <= retrans_pct <= 8, (retrans, out_segs)


def test_rate_delay_and_loss_on_one_link_all_read_back_and_are_measured_together(run_dir):
    rate_mbps, delay_ms, loss_pct, queue = 20.0, 5.0, 1.0, 100
    with NetworkLock():
        with _network(
            run_dir, host_bw_mbps=rate_mbps, delay_ms=delay_ms, loss_pct=loss_pct, max_queue_packets=queue
        ) as net:
            ends = _read_back(net)
            for e in ends:  # all three, at every end
                assert e["qdisc"] == "htb" and e["leaf"] == "netem"
                assert e["rate_mbps"] == pytest.approx(rate_mbps / SCALE, rel=0.01)
                assert e["delay_ms"] == pytest.approx(delay_ms * SCALE, rel=1e-3)
                assert e["loss_pct"] == pytest.approx(loss_pct, rel=1e-3)
            icmp = _ping_ms(net, count=40)
            first, second = _ends(net)
            before = [_netem_counts(net, i) for i in (first, second)]
            # below the shaped rate: every drop is netem's loss, none the queue's
            low = _iperf3(net, "-u", "-b", f"{rate_mbps / SCALE / 2:.3f}M", "-l", str(PAYLOAD), "-k", "4000")
            after = [_netem_counts(net, i) for i in (first, second)]
            # above it: what arrives is what htb lets through, less the second end's loss
            high = _iperf3(net, "-u", "-b", f"{1.5 * rate_mbps / SCALE:.3f}M", "-l", str(PAYLOAD), "-t", "10")
    # ping's 84-byte packets are also serialized at the shaped rate: 4 times a round trip
    serialize_ms = 4 * (84 + 14) * 8 / (rate_mbps * 1e3)
    want_rtt = 4 * delay_ms + serialize_ms
    rtt = statistics.median(icmp) / SCALE
    s = low["end"]["sum"]
    per_end = 100 * _per_end(s["lost_packets"] / s["packets"])
    qdisc = [100 * (d1 - d0) / ((p1 - p0) + (d1 - d0)) for (p0, d0), (p1, d1) in zip(before, after)]
    h = high["end"]["sum"]
    got_mbps = (h["packets"] - h["lost_packets"]) * PAYLOAD * 8 / h["seconds"] / 1e6 * SCALE
    want_mbps = rate_mbps * PAYLOAD / WIRE * (1 - loss_pct / 100)
    figure(
        "rate+delay+loss",
        rate_spec_mbps=rate_mbps,
        rate_read_back_mbps=ends[0]["rate_mbps"] * SCALE,
        udp_payload_mbps=got_mbps,
        udp_want_mbps=want_mbps,
        rate_err_pct=100 * (got_mbps / want_mbps - 1),
        rtt_spec_ms=want_rtt,
        icmp_rtt_ms=rtt,
        rtt_err_pct=100 * (rtt / want_rtt - 1),
        loss_spec_pct=loss_pct,
        per_end_pct=per_end,
        qdisc_h1_pct=qdisc[0],
        qdisc_switch_pct=qdisc[1],
    )
    assert rtt == pytest.approx(want_rtt, rel=REL)
    assert 0.5 <= per_end <= 1.5 and all(0.5 <= q <= 1.5 for q in qdisc), (per_end, qdisc)
    assert got_mbps == pytest.approx(want_mbps, rel=REL)
