"""``testbed check --cluster`` (:mod:`testbed.cluster`) against "machines" made of network
namespaces on this machine, each running its own SSH server with a throw-away key.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from testbed.cli import main as cli_main
from testbed.cluster import GRE_PACKET_BYTES, ClusterSpec, Machine, check_machine, clock_offset

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _wait_port(ns: str, addr: str, port: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((addr, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"sshd in {ns} did not listen on {addr}:{port}")


def tunnel_here() -> str:
    """The tunnel kind this kernel makes: ``gre`` when it has ip_gre, else ``vxlan``."""
    r = _ip("link", "add", "tbtunprobe", "type", "gretap", "local", "127.0.0.1", "remote", "127.0.0.2", check=False)
    if r.returncode == 0:
        _ip("link", "del", "tbtunprobe", check=False)
        return "gre"
    return "vxlan"


@contextlib.contextmanager
def namespace_machines(tmp_path, count: int = 2):
    """``count`` "machines": network namespaces tbm1.. on one bridge of this namespace
    (tbmbr0: 10.251.0.1 here, 10.251.0.1k there), each running sshd with a throw-away host
    key and accepting a throw-away client key. Everything is removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    if SSHD is None:
        pytest.skip("needs sshd: apt-get install openssh-server (scripts/setup.sh installs it)")
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "id.pub").read_text())
    made_run_sshd = not Path("/run/sshd").exists()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    procs, names, addrs = [], [], []
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", "10.251.0.1/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for k in range(1, count + 1):
            ns, here, there, addr = f"tbm{k}", f"tbm{k}h", f"tbm{k}n", f"10.251.0.{10 + k}"
            _ip("netns", "add", ns)
            names.append(ns)
            _ip("link", "add", here, "type", "veth", "peer", "name", there)
            _ip("link", "set", there, "netns", ns)
            _ip("link", "set", here, "master", BRIDGE)
            _ip("link", "set", here, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", there)
            _ip("-n", ns, "link", "set", there, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hostkey = tmp_path / f"host{k}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)], check=True)
            cfg = tmp_path / f"sshd{k}.conf"
            cfg.write_text(
                f"ListenAddress {addr}\nPort 22\nHostKey {hostkey}\n"
                f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                f"PasswordAuthentication no\nStrictModes no\nUsePAM no\nUseDNS no\nMaxSessions 100\n"
                f"MaxStartups 100\nPidFile {tmp_path / f'sshd{k}.pid'}\n"
            )
            procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(cfg)],
                    stdout=subprocess.DEVNULL,
                    stderr=open(tmp_path / f"sshd{k}.log", "w"),
                )
            )
            addrs.append(addr)
            _wait_port(ns, addr, 22)
        yield {
            "machines": addrs,
            "identity_file": str(key),
            "known_hosts_file": str(tmp_path / "known_hosts"),
            "tunnel": tunnel_here(),
            "namespaces": names,
        }
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for ns in names:  # the veth pair first: a deleted namespace frees its end asynchronously
            _ip("link", "del", f"{ns}h", check=False)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", BRIDGE, check=False)
        if made_run_sshd:
            shutil.rmtree("/run/sshd", ignore_errors=True)


BRIDGE = "tbmbr0"


@pytest.fixture
def ns_machines(tmp_path):
    with namespace_machines(tmp_path) as m:
        yield m


def cluster_section(ns: dict, count: int | None = None) -> dict:
    """The ``cluster:`` section of a spec for namespace machines (the first ``count`` of them)."""
    return {**{k: v for k, v in ns.items() if k != "namespaces"}, "machines": ns["machines"][:count]}


def test_every_namespace_machine_passes_the_check(ns_machines):
    spec = ClusterSpec.model_validate(cluster_section(ns_machines))
    for m in Machine.of(spec):
        items = check_machine(m, tunnel=spec.tunnel)
        assert [i.name.split(": ", 1)[1] for i in items] == [
            "ssh",
            "root",
            "project",
            "mnexec",
            "bwm-ng",
            "qdisc htb",
            "clock",
            f"tunnel {spec.tunnel}",
            "path MTU",
        ]
        assert all(i.ok for i in items), [(i.name, i.detail) for i in items if not i.ok]
        offset, uncertainty = clock_offset(m)
        assert abs(offset) <= uncertainty + 0.005  # one kernel, one clock: the offset is within the round trip
        assert f"{1500} bytes unfragmented" in items[-1].detail and 1500 >= GRE_PACKET_BYTES


def test_an_unreachable_machine_fails_at_ssh_with_a_remedy(ns_machines):
    m = Machine(
        "10.251.0.9", identity_file=ns_machines["identity_file"], known_hosts_file=ns_machines["known_hosts_file"]
    )
    items = check_machine(m)
    assert len(items) == 1 and items[0].name == "10.251.0.9: ssh" and not items[0].ok
    assert "ssh-copy-id root@10.251.0.9" in items[0].remedy


def test_cli_check_cluster_prints_the_placement_and_the_machines(ns_machines, tmp_path, capsys):
    spec = tmp_path / "cluster.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 4},
                "cluster": cluster_section(ns_machines),
            }
        )
    )
    assert cli_main(["check", "--cluster", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "10.251.0.11: core1 tor1 h1 h2 h3 h4" in out and "10.251.0.12: tor2 h5 h6 h7 h8" in out
    assert "2 machines: ready" in out


def test_the_namespace_machines_are_gone():
    """Runs after the tests that used them (file order): their namespaces and sshds are gone."""
    listing = _ip("netns", "list").stdout
    assert "tbm1" not in listing and "tbm2" not in listing
    assert not [
        line
        for line in subprocess.run(
            ["pgrep", "-af", "sshd.*sshd[12].conf"], capture_output=True, text=True
        ).stdout.splitlines()
        if "pgrep" not in line
    ]
