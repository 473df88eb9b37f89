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
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(ROOT))

import analysis  # noqa: E402
from analysis import metrics  # noqa: E402
from analysis.traces import parse_bwm_ng  # noqa: E402
from testbed.capture import Capture, QdiscSampler, bwm_ng_command  # noqa: E402
from testbed.spec import CaptureSpec  # noqa: E402

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
            # a receiver that forwarded would answer the datagrams for addresses it does not own
            # (a namespace inherits forwarding from the machine's, where libvirt or Docker runs)
            _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=0")
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
