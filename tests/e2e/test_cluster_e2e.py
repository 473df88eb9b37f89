"""A run spread over two "machines": network namespaces of this machine, each with
its own SSH server (tests/e2e/test_cluster_machines.py), joined by a bridge. The kernel is shared, so this
tests the control and data paths (SSH, tunnels, the per-machine ledger, capture, gathering,
teardown), not performance."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from analysis import load
from analysis import traces as tr
from testbed.cluster import Machine
from testbed.ledger import Ledger
from testbed.remote import ClusterNetwork
from testbed.runner import run_experiment
from testbed.spec import ClusterSpec, from_dict, load_spec
from tests.e2e.test_cluster_machines import cluster_section, namespace_machines
from tests.e2e.test_faults_e2e import ROOT, cli, harness_says, start_run, wait_for
from tests.e2e.test_program_e2e import DDP
from tests.e2e.test_program_e2e import ITERATIONS as DDP_ITERATIONS
from tests.e2e.test_schedule_e2e import applied, flow_end, kill_spec, port_of, uplink_halving_spec
from tests.leftovers import leftovers, needs_root
from tests.link_payload import core_payload
from topologies.spec import TopologySpec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(needs_root, reason="needs root")]

#: the quickstart's parameter-server point, shortened: 6 iterations (4 measured after 2 of warm-up)
ITERATIONS, WARMUP_ITERATIONS = 6, 2


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Three namespace machines; the quickstart's two racks use the first two."""
    with namespace_machines(tmp_path_factory.mktemp("machines"), count=3) as ns:
        yield ns


def quickstart(tmp_path: Path, runs: Path, cluster: dict | None, extra: dict | None = None, **run) -> Path:
    data = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    del data["sweep"]
    data["workload"].update(scheme="ps", iterations=ITERATIONS, warmup_iterations=WARMUP_ITERATIONS)
    for section, values in (extra or {}).items():
        data.setdefault(section, {})
        if isinstance(values, dict):
            data[section].update(values)
        else:
            data[section] = values
    data["run"].update(runs_dir=str(runs), **run)
    if cluster:
        data["cluster"] = cluster
    path = tmp_path / f"quickstart{'_cluster' if cluster else ''}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def machine_netns(ns: dict) -> frozenset[str]:
    """The network namespaces of the namespace machines themselves (their sshd runs there),
    as ``/proc/PID/ns/net`` names them: not a run's leftovers."""
    return frozenset(f"net:[{os.stat(f'/run/netns/{name}').st_ino}]" for name in ns["namespaces"])


def machine_leftovers(ns: dict, runs: Path) -> list[str]:
    """What a run may have left on the namespace machines: links besides their own, node
    shells, processes of a staging directory, staging directories."""
    out = []
    for name in ns["namespaces"]:
        links = subprocess.run(["ip", "-n", name, "-o", "link", "show"], capture_output=True, text=True).stdout
        out += [f"{name}: link {m}" for m in re.findall(r"^\d+: ([^:@]+)", links, re.M) if m not in ("lo", f"{name}n")]
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if re.search(r"mininet:|@10\.251\.0\.", cmd) and "pytest" not in cmd:
            out.append(f"process {p.pid} {cmd[:80]}")
    out += [f"staging {d}" for d in runs.glob(".*@*")]
    return out


def test_quickstart_on_two_machines_moves_the_core_bytes_of_one_machine(machines, tmp_path):
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, tmp_path / "runs") == []
    (one,) = run_experiment(load_spec(quickstart(tmp_path, tmp_path / "runs", None)), progress=False)
    (two,) = run_experiment(
        load_spec(quickstart(tmp_path, tmp_path / "runs", cluster_section(machines, 2))), progress=False
    )
    assert one.ok and two.ok, (one.summary.error, two.summary.error)
    assert two.summary.iterations_completed == one.summary.iterations_completed
    core1, core2 = core_payload(one.run_dir), core_payload(two.run_dir)  # the MTUs differ: 1500, 1450
    assert core1 > 1e6 and abs(core2 - core1) <= 0.02 * core1, (core1, core2)

    d = two.run_dir
    topo = json.loads((d / "topology.json").read_text())
    a, b = machines["machines"][:2]
    assert topo["cluster"]["placement"]["core1"] == a and topo["cluster"]["placement"]["h5"] == b
    assert all(link["mtu_bytes"] == [1450, 1450] for link in topo["links"])
    assert all(s["qdisc"] == "htb" for link in topo["links"] for s in link["shaping"].values())
    cluster = json.loads((d / "cluster.json").read_text())
    for m in (a, b):  # one kernel, one clock: the offset lies within its uncertainty
        off = cluster["clock_offset_s"][m]
        assert abs(off["offset"]) <= off["uncertainty"] + 0.002
        assert (d / "machines" / m / "traces" / "bwm-ng.csv").stat().st_size > 0
    ifaces = {line.split(";")[1] for line in (d / "traces" / "bwm-ng.csv").read_text().splitlines()}
    assert {"core1-eth1", "core1-eth2", "tor2-eth1"} <= ifaces  # ports of both machines, merged
    for p in json.loads((d / "processes.json").read_text())["processes"]:
        assert (d / "events" / f"{p['name']}.jsonl").stat().st_size > 0, p["name"]
        assert (d / "logs" / f"{p['name']}.log").is_file()
    time.sleep(0.5)
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, tmp_path / "runs") == []


def test_a_plain_ddp_program_on_two_machines_moves_its_allreduce_bytes(machines, tmp_path):
    """The plain DDP script of tests/e2e/test_program_e2e.py, unmodified, its workers spread over
    two machines: each worker's link moves what the ring allreduce implies (the bytes seen on
    the switch ports of both machines, merged on one clock)."""
    (tmp_path / "ddp.py").write_text(DDP)
    exp = from_dict(
        {
            "name": "ddp",
            "topology": {
                "kind": "rack_core",
                "racks": 2,
                "hosts_per_rack": 4,
                "host_bw_mbps": 100,
                "oversubscription": 2,
            },
            "workload": {"program": {"command": ["python", "ddp.py"], "cwd": str(tmp_path)}},
            "cluster": cluster_section(machines, 2),
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 180},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    p = 8
    grad = int(re.search(r"grad_bytes (\d+)", (res.run_dir / "logs" / "worker0.log").read_text()).group(1))
    logs = [(res.run_dir / "logs" / f"worker{i}.log").read_text() for i in range(p)]
    start = min(float(re.search(r"t_start ([\d.]+)", log).group(1)) for log in logs)
    end = max(float(re.search(r"t_end ([\d.]+)", log).group(1)) for log in logs)
    run = load(res.run_dir)
    window = run.traces[(run.traces["time"] > start) & (run.traces["time"] <= end + 0.2)]
    expected = 2 * (p - 1) / p * grad * DDP_ITERATIONS
    for h in [f"h{i}" for i in range(1, p + 1)]:
        port = next(
            l["intf2"] if l["node1"] == h else l["intf1"]
            for l in run.topology["links"]
            if l["class"] == "host" and h in (l["node1"], l["node2"])
        )
        rows = window[window["iface"] == port]
        for direction, got in (("to", rows["bytes_out"].sum()), ("from", rows["bytes_in"].sum())):
            assert 1.0 <= got / expected <= 1.05, (h, direction, got, expected)
    time.sleep(0.5)
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, tmp_path / "runs") == []


def test_an_uplink_between_machines_halved_at_a_scheduled_time_runs_at_the_new_rate(machines, tmp_path):
    """tests/e2e/test_schedule_e2e.py's uplink event with rack 2 on the second machine: the flow
    bg2 -> bg1 saturates tor2's uplink, whose ends are on two machines (a tunnel); at at_s = 5
    it drops from 80 to 40 Mbit/s: both ends change, each on its machine, and the flow follows. at_s counts from the
    first measured iteration, known here from the
    events the machines' processes write, mirrored while the run trains."""
    exp = from_dict(
        {**uplink_halving_spec(tmp_path, "tor2", src="bg2", dst="bg1"), "cluster": cluster_section(machines, 2)}
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    run = load(res.run_dir)
    rec = applied(run, 0)
    up = next(l for l in run.topology["links"] if l["class"] == "uplink" and "tor2" in (l["node1"], l["node2"]))
    placement = run.topology["cluster"]["placement"]
    assert placement[up["node1"]] != placement[up["node2"]]  # the link crosses machines
    assert set(rec["ifaces"]) == {up["intf1"], up["intf2"]}
    assert all(abs(v - 40) <= 0.01 * 40 for v in rec["readback_mbps"].values()), rec  # both ends, read back
    assert rec["emulated_s"] == pytest.approx(5, abs=0.5)
    port = port_of(run, "uplink", "tor2")  # the ToR's end: what rack 2 sends into the tunnel
    w = tr.windowed_rates(run.rates[run.rates["iface"] == port], 0.5)
    t_start, t_event = run.iterations["start"].min(), rec["time"]
    t_end = min(run.iterations["end"].max(), flow_end(run))  # while the flow saturates the uplink
    before = w[(w["time"] > t_start + 1.5) & (w["time"] < t_event - 0.1)]["tx_bps"] / 1e6
    after = w[(w["time"] > t_event + 1.0) & (w["time"] < t_end - 0.5)]["tx_bps"] / 1e6
    assert len(before) >= 4 and len(after) >= 6, (len(before), len(after))
    assert abs(before.mean() - 80) <= 0.10 * 80, before.describe()
    assert abs(after.mean() - 40) <= 0.10 * 40, after.describe()
    (flow,) = json.loads((res.run_dir / "traces" / "background" / "flows.json").read_text())["flows"]
    # its report, fetched from the other machine (stopped with training; it shared the uplink
    # with the allreduce, so it got less than the uplink's rate)
    assert (
        flow["result"]["seconds"] > 10 and 10e6 < flow["result"]["bytes_sent"] * 8 / flow["result"]["seconds"] < 80e6
    ), flow
    time.sleep(0.5)
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, tmp_path / "runs") == []


def test_a_scheduled_kill_on_another_machine_ends_the_run_naming_it(machines, tmp_path):
    """The kill reaches the process on its machine (not only its SSH session here), and the
    peers' failure comes back through SSH."""
    exp = from_dict({**kill_spec(tmp_path, "worker3"), "cluster": cluster_section(machines, 2)})
    (res,) = run_experiment(exp, progress=False)
    assert res.summary.status == "failed"
    assert "after worker3 was killed by a scheduled event" in res.summary.error, res.summary.error
    run = load(res.run_dir)
    assert run.topology["cluster"]["placement"]["h4"] == machines["machines"][1]  # worker3's host
    rec = applied(run, 0)
    assert rec["kind"] == "kill" and rec["iteration"] == 10
    mine = run.iterations[run.iterations["worker"] == "worker3"]
    # the kill is one SSH command to the other machine (a login, about 0.3 s here): the
    # process starts no iteration a second after the event, where one machine kills at once
    assert mine["start"].max() < rec["ts"] + 1.0, mine["start"].max() - rec["ts"]
    assert mine["iteration"].max() < 39  # it did not run to the end
    time.sleep(0.5)
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, tmp_path / "runs") == []


def test_a_worker_crash_on_another_machine_ends_the_run_promptly_with_its_log(machines, tmp_path, monkeypatch):
    """A remote process's exit status comes back through SSH (tests/e2e/test_runs_e2e.py's crash); the
    machines' files are gathered and nothing is left on any machine."""
    monkeypatch.setenv("TESTBED_CRASH_AT", "worker5:3")  # on h6, rack 2: the second machine
    (res,) = run_experiment(
        load_spec(quickstart(tmp_path, tmp_path / "runs", cluster_section(machines, 2))), progress=False
    )
    assert res.summary.status == "failed", res.summary
    assert "worker5" in res.summary.error, res.summary.error
    assert "crash" in (res.run_dir / "logs" / "worker5.log").read_text().lower()
    assert (res.run_dir / "machines" / machines["machines"][1] / "processes.json").is_file()
    time.sleep(0.5)
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, tmp_path / "runs") == []


def test_a_sigkilled_cluster_run_is_cleaned_on_every_machine(machines, tmp_path):
    runs = tmp_path / "runs"
    p = start_run(quickstart(tmp_path, runs, cluster_section(machines, 2)))
    run_dir = wait_for(harness_says(runs, "launching"), "the launch")
    time.sleep(3)
    p.kill()  # no teardown at all
    p.communicate()
    assert machine_leftovers(machines, runs) != []
    out = cli("clean")
    assert out.returncode == 0, out.stderr
    assert f"{machines['machines'][1]}: bridge tor2" in out.stdout, out.stdout
    time.sleep(0.5)
    assert leftovers(machine_netns(machines)) == [] and machine_leftovers(machines, runs) == []
    assert (run_dir / "machines" / machines["machines"][1] / "processes.json").is_file()  # gathered by clean


def test_twenty_two_nodes_on_three_machines_all_reach_each_other(machines, tmp_path):
    """Mininet's cluster support has an open report of hosts losing reachability beyond about
    10 nodes; 3 racks x 6 hosts, 3 ToRs and a core (22 nodes) on three machines: every host
    pings every other, and the shaping is read back on every machine."""
    topo = TopologySpec.model_validate({"kind": "rack_core", "racks": 3, "hosts_per_rack": 6})
    spec = ClusterSpec.model_validate(cluster_section(machines))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ledger = Ledger.create("reach", run_dir)
    with ClusterNetwork(topo, [], run_dir, ledger, machines=Machine.of(spec), tunnel=spec.tunnel) as net:
        placement = net.topology["cluster"]["placement"]
        assert {placement[f"tor{r}"] for r in (1, 2, 3)} == set(machines["machines"])
        assert len(net.topology["hosts"]) == 18
        assert net.net.pingAll(timeout=2) == 0.0  # per cent of pings lost, over 18 x 17 pairs
    assert not ledger.path.exists()  # swept on every machine
    time.sleep(0.5)
    assert machine_leftovers(machines, tmp_path) == []
