"""The capture side of packet analysis: port names, tcpdump per port, and the endpoint record."""

import json
import os
import socket
import threading
import time

import pytest

from common.errors import SpecError
from testbed.capture.endpoints import EndpointSampler, _addr, read_tcp_table
from testbed.capture.pcap import PcapRecorder, resolve_ports, tcpdump_command, topo_links
from testbed.runner import plan_point
from testbed.spec import PcapSpec, from_dict
from tests.leftovers import needs_root
from topologies import build_topo


def quickstart_topo(**topology):
    spec = from_dict({"topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, **topology}})
    return build_topo(spec.topology, [])


def test_port_tokens_resolve_to_switch_ports_of_the_topology():
    topo = quickstart_topo()
    links, switches = topo_links(topo), set(topo.switches())
    # each ToR's end of its uplink, once
    assert resolve_ports(["uplinks"], links, switches) == ["tor1-eth3", "tor2-eth3"]
    assert resolve_ports(["host:h3", "tor1-eth1", "host:h3"], links, switches) == ["tor2-eth1", "tor1-eth1"]
    with pytest.raises(SpecError) as e:
        resolve_ports(["host:h9", "h1-eth0", "spine"], links, switches)
    msg = str(e.value)
    assert msg.count("capture.pcap.ports") == 3 and "host:h9" in msg and "h1-eth0" in msg and "h4" in msg


def test_uplinks_of_a_rack_topology_is_a_spec_error():
    spec = from_dict({"topology": {"kind": "rack", "hosts_per_rack": 4}})
    topo = build_topo(spec.topology, [])
    with pytest.raises(SpecError, match="rack_core"):
        resolve_ports(["uplinks"], topo_links(topo), set(topo.switches()))


def test_an_unknown_port_is_refused_at_planning_before_anything_is_built():
    exp = from_dict(
        {
            "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2},
            "workload": {"scheme": "allreduce", "workers": 4},
            "capture": {"pcap": {"ports": ["host:h7"]}},
        }
    )
    with pytest.raises(SpecError, match="host:h7"):
        plan_point(exp)


def test_a_bad_bpf_filter_is_a_spec_error():
    with pytest.raises(SpecError, match="capture.pcap.filter"):
        from_dict({"capture": {"pcap": {"ports": ["uplinks"], "filter": "tcp and prt 80"}}})
    assert PcapSpec(ports=["uplinks"], filter="  ").filter is None


def test_the_filter_follows_a_double_dash_so_one_beginning_with_a_dash_is_no_option(tmp_path):
    cmd = tcpdump_command("tcpdump", "tor1-eth3", 128, tmp_path / "p.pcap", "-1 != 0 and tcp")
    assert cmd[-2:] == ["--", "-1 != 0 and tcp"] and cmd[cmd.index("-w") + 1] == str(tmp_path / "p.pcap")
    assert "--" not in tcpdump_command("tcpdump", "tor1-eth3", 128, tmp_path / "p.pcap", None)
    PcapSpec(ports=["uplinks"], filter="-1 != 0 and tcp")  # valid BPF, so the spec takes it


def test_a_start_no_timer_can_wait_is_recorded_not_a_dying_thread(tmp_path):
    """A window start beyond threading.TIMEOUT_MAX: no timer thread (which would die with
    OverflowError), the error in ``errors`` and in ports.json, and stop() is still safe."""
    (tmp_path / "logs").mkdir()
    errors = []
    before = threading.active_count()
    rec = PcapRecorder(["lo"], tmp_path, PcapSpec(ports=["lo"]), start_after_s=1e300, errors=errors).start()
    assert threading.active_count() == before and rec.procs == {}
    assert len(errors) == 1 and "cannot be scheduled" in errors[0] and "not started" in errors[0]
    (entry,) = json.loads((tmp_path / "traces" / "pcap" / "ports.json").read_text())
    assert entry["started"] is None and entry["error"] == errors[0]
    rec.stop()
    (entry,) = json.loads((tmp_path / "traces" / "pcap" / "ports.json").read_text())
    assert entry["exit_code"] is None and entry["error"] == errors[0]


def test_procfs_addresses_are_decoded():
    assert _addr("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _addr("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)  # v4-mapped v6
    assert _addr("00000000000000000000000001000000:0016") == ("::1", 22)


def test_endpoint_sampler_records_a_processs_own_sockets_once():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        info = {"name": "worker0", "role": "worker", "rank": 0, "host": "h1"}
        s = EndpointSampler(lambda: [(info, os.getpid())]).open()
        rows = s.read()
        by_local = {(r[5], r[6]): r for r in rows}
        port = srv.getsockname()[1]
        assert by_local[("127.0.0.1", port)][-1] in ("LISTEN", "ESTABLISHED")
        c = by_local[cli.getsockname()]
        assert c[:5] == ("worker0", "worker", 0, "h1", os.getpid())
        assert (c[7], c[8], c[9]) == ("127.0.0.1", port, "ESTABLISHED")
        assert s.read() == []  # written once
        for _ in range(EndpointSampler.FAST_SAMPLES - 2):
            s.read()
        late = socket.create_connection(srv.getsockname())  # after the fast samples: seen at the next slow one
        try:
            got = [s.read() for _ in range(EndpointSampler.SLOW_EVERY)]
            assert got[:-1] == [[]] * (EndpointSampler.SLOW_EVERY - 1)
            assert late.getsockname() in {(r[5], r[6]) for r in got[-1]}
        finally:
            late.close()
        s.close()
        assert read_tcp_table(2**22 + 12345) == {}  # a process that is gone
    finally:
        for x in (cli, acc, srv):
            x.close()


def test_endpoint_sampler_backs_off_while_nothing_is_new_and_returns_when_a_socket_appears():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1024)  # about 160 connections, never accepted
    opened, reads = [], []
    info = {"name": "worker0", "role": "worker", "rank": 0, "host": "h1"}
    s = EndpointSampler(lambda: reads.append(1) or [(info, os.getpid())]).open()  # called once per read

    def gaps(count: int, connect: bool) -> list[int]:
        """The calls between the next ``count`` reads; with ``connect``, a new connection before every call."""
        out, since = [], 0
        while len(out) < count:
            if connect:
                opened.append(socket.create_connection(srv.getsockname()))
            before = len(reads)
            s.read()
            since += 1
            if len(reads) > before:
                out.append(since)
                since = 0
        return out

    try:
        assert gaps(EndpointSampler.FAST_SAMPLES, connect=False) == [1] * EndpointSampler.FAST_SAMPLES
        assert gaps(3, connect=True) == [EndpointSampler.SLOW_EVERY] * 3  # each read finds something new
        assert gaps(5, connect=False) == [10, 20, 40, 80, 120]  # nothing new: the gap doubles, up to MAX_EVERY
        assert gaps(2, connect=True) == [120, 10]  # a new socket: back to every SLOW_EVERY after the read finding it
        s.close()
    finally:
        for x in (*opened, srv):
            x.close()


@pytest.mark.skipif(needs_root, reason="needs root (tcpdump)")
def test_tcpdump_records_the_port_and_reports_its_counts(tmp_path):
    (tmp_path / "logs").mkdir()
    started = []
    rec = PcapRecorder(
        ["lo"], tmp_path, PcapSpec(ports=["lo"], filter="tcp"), on_pid=lambda pid, what: started.append(what)
    ).start()
    try:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        c = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        c.sendall(b"x" * 10000)
        got = 0
        while got < 10000:
            got += len(a.recv(65536))
        for x in (c, a, srv):
            x.close()
        time.sleep(0.2)
    finally:
        rec.stop()
    assert started == ["tcpdump:lo"]
    (entry,) = json.loads((tmp_path / "traces" / "pcap" / "ports.json").read_text())
    assert entry["port"] == "lo" and entry["stopped"] >= entry["started"] and entry["packets_captured"] >= 4
    assert entry["exit_code"] == 0 and entry["terminated"] is True  # ended by the harness's SIGTERM
    assert (tmp_path / "traces" / "pcap" / "lo.pcap").stat().st_size > 24
    rec.stop()  # idempotent


@pytest.mark.skipif(needs_root, reason="needs root (tcpdump)")
def test_a_filter_beginning_with_a_dash_is_captured(tmp_path):
    """``-0 = 0 and udp and port P`` (true for every datagram to P): without the ``--`` before
    it, tcpdump reads ``-0`` as an option and exits at once."""
    (tmp_path / "logs").mkdir()
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    errors = []
    rec = PcapRecorder(
        ["lo"],
        tmp_path,
        PcapSpec(ports=["lo"], filter=f"-0 = 0 and udp and port {srv.getsockname()[1]}"),
        errors=errors,
    ).start()
    try:
        for _ in range(5):
            cli.sendto(b"x", srv.getsockname())
        time.sleep(0.2)
    finally:
        rec.stop()
        cli.close()
        srv.close()
    (entry,) = json.loads((tmp_path / "traces" / "pcap" / "ports.json").read_text())
    assert errors == [] and entry["exit_code"] == 0 and entry["packets_captured"] == 5, (errors, entry)


@pytest.mark.skipif(needs_root, reason="needs root (tcpdump)")
def test_a_capture_window_records_only_inside_it(tmp_path):
    """start_after_s / duration_s: packets sent before the window opens and after it closes are
    not in the pcap (its ports.json times bound the window)."""
    (tmp_path / "logs").mkdir()
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rec = PcapRecorder(
        ["lo"],
        tmp_path,
        PcapSpec(ports=["lo"], filter=f"udp and port {srv.getsockname()[1]}"),
        start_after_s=1.0,
        duration_s=1.0,
    ).start()
    try:
        t0 = time.time()
        sent = []
        while time.time() - t0 < 3.5:
            cli.sendto(b"x", srv.getsockname())
            sent.append(time.time())
            time.sleep(0.02)
    finally:
        rec.stop()
        cli.close()
        srv.close()
    (entry,) = json.loads((tmp_path / "traces" / "pcap" / "ports.json").read_text())
    from scapy.utils import RawPcapReader

    stamps = [m.sec + m.usec / 1e6 for _, m in RawPcapReader(str(tmp_path / "traces" / "pcap" / "lo.pcap"))]
    assert stamps and entry["started"] - 0.05 <= min(stamps) and max(stamps) <= entry["stopped"] + 0.05
    assert 0.9 <= entry["started"] - t0 <= 1.6 and 0.9 <= entry["stopped"] - entry["started"] <= 1.6
    assert 20 <= len(stamps) <= 0.6 * len(sent)  # about a second's worth of the 3.5 s sent
