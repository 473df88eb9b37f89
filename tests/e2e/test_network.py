"""Real Mininet networks: shaping read back, connectivity, refusal, and teardown leaving nothing."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from common.errors import MissingRequirement, TestbedError
from testbed.check import kernel_qdiscs
from testbed.ledger import Ledger, NetworkLock
from testbed.network import Network
from testbed.shaping import htb_burst_bytes
from tests.leftovers import leftovers, needs_root
from topologies import TopologySpec
from traffic import rundir

pytestmark = [pytest.mark.root, pytest.mark.skipif(needs_root, reason="needs root")]


@pytest.fixture
def run_dir(tmp_path):
    assert leftovers() == [], "machine not clean before the test"
    d = rundir.create(tmp_path, "net")
    yield d
    assert leftovers() == []


def test_quickstart_topology_is_built_shaped_and_torn_down(run_dir):
    spec = TopologySpec(kind="rack_core", racks=2, hosts_per_rack=4, host_bw_mbps=100, oversubscription=2)
    with NetworkLock():
        led = Ledger.create("t", run_dir)
        with Network(spec, [], run_dir, led) as net:
            topo = json.loads((run_dir / "topology.json").read_text())
            assert len(topo["hosts"]) == 8 and len(topo["links"]) == 10
            assert all(l["mtu_bytes"] == [1500, 1500] for l in topo["links"])
            for link in topo["links"]:
                want = 100.0 if link["class"] == "host" else 200.0
                assert link["bw_mbps"] == want
                for end in (link["intf1"], link["intf2"]):  # both ends read back from the kernel
                    assert link["shaping"][end]["qdisc"] == "htb"
                    assert link["shaping"][end]["rate_mbps"] == pytest.approx(want, rel=0.01)
            assert {h["rack"] for h in topo["hosts"] if h["name"] in ("h1", "h4")} == {0}
            assert {h["rack"] for h in topo["hosts"] if h["name"] in ("h5", "h8")} == {1}
            out = net.hosts["h1"].cmd("ping -c1 -W2", net.hosts["h8"].IP())  # across the core
            assert " 0% packet loss" in out
            assert led.path.exists() and len(led.pids) == 8
        assert not led.path.exists()


def test_rates_above_1gbit_are_shaped_not_ignored(run_dir):
    # stock Mininet TCLink leaves links above 1000 Mbit/s unshaped; ours shapes them
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, host_bw_mbps=2500)
    with NetworkLock():
        with Network(spec, [], run_dir, Ledger.create("t", run_dir)) as net:
            for link in net.topology["links"]:
                for got in link["shaping"].values():
                    assert got["rate_mbps"] == pytest.approx(2500, rel=0.01)
            assert net.topology["links"][0]["htb_burst_bytes"] == htb_burst_bytes(2500) == 312_500


def test_jumbo_frames_and_tcp_setting_on_every_host(run_dir):
    root_lowat = open("/proc/sys/net/ipv4/tcp_notsent_lowat").read()
    spec = TopologySpec(kind="rack_core", racks=2, hosts_per_rack=1, mtu_bytes=9000, tcp_notsent_lowat_bytes=131072)
    with NetworkLock():
        with Network(spec, [], run_dir, Ledger.create("t", run_dir)) as net:
            assert all(l["mtu_bytes"] == [9000, 9000] for l in net.topology["links"])
            out = net.hosts["h1"].cmd("ping -c1 -W2 -M do -s 8972", net.hosts["h2"].IP())  # no fragmentation
            assert " 0% packet loss" in out
            assert [h["tcp_notsent_lowat"] for h in net.topology["hosts"]] == [131072, 131072]
            assert net.hosts["h2"].cmd("cat /proc/sys/net/ipv4/tcp_notsent_lowat").strip() == "131072"
    assert open("/proc/sys/net/ipv4/tcp_notsent_lowat").read() == root_lowat  # the hosts' namespaces only


def _listener(host):
    """A process on ``host`` listening on port 5201 that never accepts: the kernel completes
    the connections in its backlog."""
    return host.popen(
        [
            sys.executable,
            "-c",
            "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 5201)); s.listen(8); time.sleep(60)",
        ]
    )


def test_congestion_control_on_every_route_and_min_tso_segs(run_dir):
    """cubic, the default, on every route of both interfaces' tables whatever the machine's own
    default, where the namespace's sysctl may not allow it; a connection from either interface
    takes it; the machine keeps its own."""
    root = {k: open(f"/proc/sys/net/ipv4/{k}").read() for k in ("tcp_congestion_control", "tcp_min_tso_segs")}
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, interfaces_per_host=2, tcp_min_tso_segs=44)
    with NetworkLock():
        with Network(spec, [], run_dir, Ledger.create("t", run_dir)) as net:
            assert [(h["tcp_congestion_control"], h["tcp_min_tso_segs"]) for h in net.topology["hosts"]] == [
                ("cubic", 44)
            ] * 2
            routes = net.hosts["h1"].cmd("ip -4 -o route show table all").splitlines()
            # and Linux's least retransmission timeout, 200 ms, by default (here at scale 1)
            assert [
                r
                for r in routes
                if r.startswith("10.") and ("congctl cubic" not in r or " rto_min lock 200ms" not in r)
            ] == []
            server = _listener(net.hosts["h2"])
            try:
                time.sleep(0.5)
                probe = (
                    "import socket, sys; s = socket.create_connection(('{}', 5201), source_address=('{}', 0)); "
                    "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b'\\0').decode())"
                )
                h1, h2 = net.hosts["h1"], net.hosts["h2"]
                for src in (h1.IP(), h1.intfList()[1].IP()):
                    out = h1.cmd(f'python3 -c "{probe.format(h2.IP(), src)}"').strip()
                    assert out == "cubic", (src, out)
            finally:
                server.kill()
                server.wait()
    assert {k: open(f"/proc/sys/net/ipv4/{k}").read() for k in root} == root  # the hosts' namespaces only


def test_a_dilated_least_retransmission_timeout_on_every_route_reaches_a_connection(run_dir):
    """rto_min on every route of both interfaces' tables, dilated; with a null congestion
    control the routes take it alone; a connection's timeout starts from it (``ss -ti``)."""
    spec = TopologySpec(
        kind="rack", racks=1, hosts_per_rack=2, interfaces_per_host=2, tcp_congestion_control=None, tcp_rto_min_ms=50
    )
    with NetworkLock():
        with Network(spec, [], run_dir, Ledger.create("t", run_dir), scale=40) as net:
            routes = net.hosts["h1"].cmd("ip -4 -o route show table all").splitlines()
            ours = [r for r in routes if r.startswith("10.")]
            assert ours and all(" rto_min lock 2s" in r and "congctl" not in r for r in ours), ours
            server = _listener(net.hosts["h2"])
            try:
                time.sleep(0.5)
                h1, h2 = net.hosts["h1"], net.hosts["h2"]
                client = h1.popen(
                    [
                        sys.executable,
                        "-c",
                        f"import socket, time; s = socket.create_connection(('{h2.IP()}', 5201)); time.sleep(60)",
                    ]
                )
                try:
                    time.sleep(0.5)
                    out = h1.cmd("ss -tin dst", h2.IP())
                    # 50 ms emulated x 40, above the kernel's 1 s before any RTT sample
                    assert 2000 <= float(re.search(r"\brto:([0-9.]+)", out).group(1)) < 2100, out
                finally:
                    client.kill()
                    client.wait()
            finally:
                server.kill()
                server.wait()


def test_null_congestion_control_keeps_the_machines_default(run_dir):
    root = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, tcp_congestion_control=None, tcp_rto_min_ms=None)
    with NetworkLock():
        with Network(spec, [], run_dir, Ledger.create("t", run_dir)) as net:
            assert [h["tcp_congestion_control"] for h in net.topology["hosts"]] == [root] * 2
            routes = net.hosts["h1"].cmd("ip -4 -o route show table all")
            assert "congctl" not in routes and "rto_min" not in routes  # both left to the kernel


def test_queue_limit_without_netem_uses_pfifo(run_dir):
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, max_queue_packets=20)
    with NetworkLock():
        with Network(spec, [], run_dir, Ledger.create("t", run_dir)) as net:
            for link in net.topology["links"]:
                assert {g["leaf"] for g in link["shaping"].values()} <= {"pfifo", "netem"}


@pytest.mark.skipif(kernel_qdiscs().get("netem", False), reason="this kernel has netem")
def test_delay_without_netem_fails_before_building(run_dir):
    spec = TopologySpec(kind="rack", racks=1, hosts_per_rack=2, delay_ms=1)
    with NetworkLock():
        led = Ledger.create("t", run_dir)
        with pytest.raises(MissingRequirement, match="netem"):
            Network(spec, [], run_dir, led).__enter__()
    assert not (run_dir / "topology.json").exists()


def test_failure_during_build_leaves_nothing(run_dir, monkeypatch):
    def broken(self):
        raise TestbedError("simulated shaping mismatch")

    monkeypatch.setattr(Network, "_verify_shaping", broken)
    with NetworkLock():
        led = Ledger.create("t", run_dir)
        with pytest.raises(TestbedError, match="simulated"):
            with Network(TopologySpec(), [], run_dir, led):
                pass


def test_second_run_is_refused_while_one_holds_the_network():
    with NetworkLock(run_dir="runs/first"):
        out = subprocess.run(
            [sys.executable, "-c", "from testbed.ledger import NetworkLock; NetworkLock().__enter__()"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )
    assert out.returncode != 0 and "another testbed run" in out.stderr and "runs/first" in out.stderr


KILLED = r"""
import sys, time
from traffic import rundir
from testbed.ledger import Ledger, NetworkLock
from testbed.lifetime import RunCgroup
from testbed.network import Network
from topologies import TopologySpec
d = rundir.create(sys.argv[1], "killed")
lock = NetworkLock().__enter__()
led = Ledger.create("killed", d)
cg = RunCgroup(d.name)
led.set_process_cgroup(str(cg.path))
net = Network(TopologySpec(), [], d, led, cgroup=cg).start()
# not recorded in the ledger and not tied to this process: only the run's cgroup knows it
net.hosts["h1"].popen(["sh", "-c", "sleep 600 & exec sleep 601"], preexec_fn=cg.preexec)
print("up", flush=True)
time.sleep(600)
"""


def test_clean_removes_what_a_killed_run_left(tmp_path):
    assert leftovers() == []
    p = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert p.stdout.readline().strip() == b"up"
    os.kill(p.pid, signal.SIGKILL)  # no teardown at all
    p.wait()
    assert any("tor1" in x for x in leftovers())
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "bridge tor1" in out.stdout
    time.sleep(0.5)
    assert leftovers() == []
