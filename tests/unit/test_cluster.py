"""Several machines without a run: rack placement (:mod:`topologies.placement`), the spec's
``cluster:`` section and the commands a cluster run sends. The checks against "machines"
made of network namespaces are tests/e2e/test_cluster_machines.py.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import yaml

from common.errors import SpecError
from testbed.cluster import ClusterSpec, Machine, load_cluster
from topologies import build_topo
from topologies.placement import PlacementError, links_between_machines, place_racks
from topologies.spec import TopologySpec


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
