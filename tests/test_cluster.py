"""Several machines without a run: rack placement
(:mod:`topologies.placement`), the spec's ``cluster:`` section and ``testbed check --cluster``
(:mod:`testbed.cluster`), checked against "machines" made of network namespaces on this
machine, each running its own SSH server with a throw-away key."""

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

from common.errors import SpecError
from testbed.cli import main as cli_main
from testbed.cluster import GRE_PACKET_BYTES, ClusterSpec, Machine, check_machine, clock_offset, load_cluster
from topologies import build_topo
from topologies.placement import PlacementError, links_between_machines, place_racks
from topologies.spec import TopologySpec

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


# ------------------------------------------------------------------------------ placement


def _topo(**kw):
    return build_topo(TopologySpec.model_validate({"kind": "rack_core", **kw}))


def test_whole_racks_go_to_machines_and_only_uplinks_cross():
    topo = _topo(racks=2, hosts_per_rack=4)
    where = place_racks(topo, ["m1", "m2"])
    assert {n for n, m in where.items() if m == "m1"} == {"core1", "tor1", "h1", "h2", "h3", "h4"}
    assert {n for n, m in where.items() if m == "m2"} == {"tor2", "h5", "h6", "h7", "h8"}
    assert {frozenset(link) for link in links_between_machines(topo, where)} == {frozenset({"tor2", "core1"})}


def test_racks_are_spread_in_contiguous_blocks():
    topo = _topo(racks=5, hosts_per_rack=1)
    where = place_racks(topo, ["a", "b", "c"])
    assert [where[f"tor{r}"] for r in range(1, 6)] == ["a", "a", "b", "b", "c"]
    assert where["core1"] == "a"
    crossing = {frozenset(link) for link in links_between_machines(topo, where)}
    assert crossing == {frozenset({"core1", f"tor{r}"}) for r in (3, 4, 5)}


@pytest.mark.parametrize(
    "kw, machines, says",
    [
        ({"racks": 2}, ["a", "b", "c"], "3 machines for 2 racks"),
        ({"racks": 2}, [], "no machines"),
        ({"racks": 2}, ["a", "a"], "machines repeated: a"),
        ({"kind": "rack", "racks": 2}, ["a", "b"], "without a core switch"),
    ],
)
def test_a_placement_that_cannot_be_made_says_why(kw, machines, says):
    with pytest.raises(PlacementError, match=says):
        place_racks(_topo(**kw), machines)


# ------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize(
    "cluster, field, allowed",
    [
        ({"machines": []}, "cluster.machines", "at least 1 item"),
        ({"machines": ["a", "a"]}, "cluster.machines", "each machine once"),
        ({"machines": ["a b"]}, "cluster.machines", "host names or IP addresses"),
        ({"machines": ["a"], "user": "Root!"}, "cluster.user", "a user name"),
        ({"machines": ["a"], "placement": "random"}, "cluster.placement", "'rack'"),
        ({"machines": ["a"], "colour": 1}, "cluster.colour", "machines"),
    ],
)
def test_a_malformed_cluster_section_names_its_field(tmp_path, cluster, field, allowed):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"topology": {"racks": 2}, "cluster": cluster}))
    with pytest.raises(SpecError) as e:
        load_cluster(spec)
    assert any(x.field == field and allowed in x.allowed for x in e.value.errors), e.value.errors


def test_every_bad_field_and_an_impossible_placement_are_reported(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"topology": {"racks": 0}, "cluster": {"machines": ["a"], "user": "X"}}))
    with pytest.raises(SpecError) as e:
        load_cluster(spec)
    assert {x.field for x in e.value.errors} == {"topology.racks", "cluster.user"}
    spec.write_text(yaml.safe_dump({"topology": {"racks": 2}, "cluster": {"machines": ["a", "b", "c"]}}))
    with pytest.raises(SpecError, match="3 machines for 2 racks") as e:
        load_cluster(spec)
    assert e.value.field == "cluster.machines"
    spec.write_text(yaml.safe_dump({"topology": {"racks": 2}}))
    with pytest.raises(SpecError, match="a 'cluster:' section"):
        load_cluster(spec)


def test_ssh_runs_in_batch_mode_with_the_spec_s_key():
    m = Machine.of(
        ClusterSpec.model_validate(
            {"machines": ["10.0.0.2"], "ssh_port": 2222, "identity_file": "/k", "known_hosts_file": "/kh"}
        )
    )[0]
    argv = m.ssh_argv("id -u")
    assert argv[0] == "ssh" and argv[-2:] == ["root@10.0.0.2", "id -u"]
    assert "BatchMode=yes" in argv and ["-p", "2222"] == argv[argv.index("-p") : argv.index("-p") + 2]
    assert argv[argv.index("-i") + 1] == "/k" and "UserKnownHostsFile=/kh" in argv


# ------------------------------------------------------------------ machines made of namespaces


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


# ------------------------------------------------------------------ an experiment with a cluster


def test_an_experiment_refuses_what_a_cluster_run_cannot_do_naming_each_field():
    from testbed.spec import from_dict

    with pytest.raises(SpecError) as e:
        from_dict(
            {
                "topology": {"kind": "rack", "racks": 2},
                "cluster": {"machines": ["10.0.0.1", "10.0.0.2", "10.0.0.3"]},
                "workload": {"compute": {"mode": "real"}},
                "events": [{"at_iteration": 2, "host": "h1", "compute_slowdown": 2}],
            }
        )
    fields = {x.field for x in e.value.errors}
    assert {"cluster.machines", "topology.kind", "events"} <= fields, fields
    with pytest.raises(SpecError, match="addresses the other machines reach"):
        from_dict({"cluster": {"machines": ["localhost"]}})
    exp = from_dict(
        {"topology": {"kind": "rack_core", "racks": 2}, "cluster": {"machines": ["a", "b"], "tunnel": "vxlan"}}
    )
    assert exp.cluster.tunnel == "vxlan" and exp.cluster.machines == ["a", "b"]


def test_the_remote_sweep_kills_the_run_s_processes_and_removes_its_links_only(tmp_path):
    from testbed.ledger import remote_sweep_script

    staging = str(tmp_path / ".x-1@10.0.0.2")
    other = subprocess.Popen(["sh", "-c", "sleep 30", str(tmp_path / ".x-2@10.0.0.2")])  # another run's
    victim = subprocess.Popen(["sh", "-c", "sleep 30", staging])  # a process of the run: its argv names staging
    try:
        script = remote_sweep_script(
            {"staging": staging, "pids": {}, "interfaces": ["tbnosuch-eth1"], "bridges": ["tbnosuch"]}
        )
        r = subprocess.run(["sh", "-s"], input=script, text=True, capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"process {victim.pid} (of the run)"]  # not the script's own shell
        assert victim.wait(timeout=5) == -signal.SIGKILL and other.poll() is None
    finally:
        for p in (victim, other):
            p.kill()
            p.wait()
    script = remote_sweep_script(
        {"staging": "", "pids": {"shell:h5": 41}, "interfaces": ["tor2-eth1"], "bridges": ["tor2"]}
    )
    assert "kill -KILL 41" in script
    assert "ip link del dev tor2-eth1" in script and "ip link set dev tor2 down" in script


def test_a_remote_node_shell_ends_on_sighup_when_the_harness_ignores_it():
    """Under nohup the harness ignores SIGHUP and its children inherit that; Mininet stops a
    remote node's ssh shell with SIGHUP and waits for it, so the shell must get it back."""
    import signal

    from testbed.remote import OnMachine

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        p = subprocess.Popen(["sleep", "30"], preexec_fn=OnMachine._ignoreSignal)
    finally:
        signal.signal(signal.SIGHUP, old)
    try:
        os.killpg(p.pid, signal.SIGHUP)
        assert p.wait(timeout=10) == -signal.SIGHUP
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
