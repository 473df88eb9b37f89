"""The capture side of packet analysis: port names, tcpdump per port, and the endpoint record."""
import json
import os
import socket
import time

import pytest

from testbed.capture.endpoints import EndpointSampler, _addr, read_tcp_table
from testbed.capture.pcap import PcapRecorder, resolve_ports, topo_links
from testbed.runner import plan_point
from testbed.spec import PcapSpec, from_dict
from tests.leftovers import needs_root
from topologies import build_topo
from common.errors import SpecError


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
    exp = from_dict({"topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2},
                     "workload": {"scheme": "allreduce", "workers": 4},
                     "capture": {"pcap": {"ports": ["host:h7"]}}})
    with pytest.raises(SpecError, match="host:h7"):
        plan_point(exp)


def test_a_bad_bpf_filter_is_a_spec_error():
    with pytest.raises(SpecError, match="capture.pcap.filter"):
        from_dict({"capture": {"pcap": {"ports": ["uplinks"], "filter": "tcp and prt 80"}}})
    assert PcapSpec(ports=["uplinks"], filter="  ").filter is None


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
        assert read_tcp_table(2 ** 22 + 12345) == {}  # a process that is gone
    finally:
        for x in (cli, acc, srv):
            x.close()


@pytest.mark.skipif(needs_root, reason="needs root (tcpdump)")
def test_tcpdump_records_the_port_and_reports_its_counts(tmp_path):
    (tmp_path / "logs").mkdir()
    started = []
    rec = PcapRecorder(["lo"], tmp_path, PcapSpec(ports=["lo"], filter="tcp"),
                       on_pid=lambda pid, what: started.append(what)).start()
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
    assert (tmp_path / "traces" / "pcap" / "lo.pcap").stat().st_size > 24
    rec.stop()  # idempotent


@pytest.mark.skipif(needs_root, reason="needs root (tcpdump)")
def test_a_capture_window_records_only_inside_it(tmp_path):
    """start_after_s / duration_s: packets sent before the window opens and after it closes are
    not in the pcap (its ports.json times bound the window)."""
    (tmp_path / "logs").mkdir()
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rec = PcapRecorder(["lo"], tmp_path, PcapSpec(ports=["lo"], filter=f"udp and port {srv.getsockname()[1]}"),
                       start_after_s=1.0, duration_s=1.0).start()
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
