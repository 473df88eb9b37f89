"""Scheduled events on the emulated network: an
uplink halved at a scheduled time runs at the new rate, a host link taken down carries no bytes
until it is brought up, a straggler at 2x lengthens a synchronous iteration by its compute
time, a real-compute straggler's cgroup holds the host's processes and is gone afterwards;
nothing is left behind. Needs root and Mininet; slow (each case builds a network and trains
for tens of seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import analysis
from analysis import traces as tr
from testbed.cgroups import cpu_controller
from testbed.runner import run_experiment
from testbed.spec import from_dict
from tests.leftovers import leftovers, needs_root

root_only = pytest.mark.skipif(needs_root, reason="needs root")


def profile(tmp_path: Path, forward_s, backward_s, batch=16) -> str:
    """A compute profile of digits_mlp (3 layers) with the given per-layer times, as a file."""
    p = tmp_path / "profile.json"
    p.write_text(
        json.dumps(
            {
                "model": "digits_mlp",
                "device": "test",
                "batch_size": batch,
                "method": "measured",
                "source": "tests/e2e/test_schedule_e2e.py",
                "derived": False,
                "layers": [
                    {"index": i, "name": f"l{i}", "forward_s": f, "backward_s": b}
                    for i, (f, b) in enumerate(zip(forward_s, backward_s))
                ],
            }
        )
    )
    return str(p)


def port_of(run, link_class: str, node: str) -> str:
    """The switch port of ``node``'s access link (class host) or the ToR end of ``node``'s uplink."""
    ports = run.ports()
    if link_class == "host":
        return ports[(ports["link_class"] == "host") & (ports["host"] == node)]["iface"].iloc[0]
    return ports[ports["tor_side"] & (ports["switch"] == node)]["iface"].iloc[0]


def uplink_halving_spec(tmp_path: Path, tor: str = "tor1", src: str = "bg1", dst: str = "bg2") -> dict:
    """Allreduce across two racks and a 25 s TCP flow ``src`` -> ``dst`` offering more than the
    80 Mbit/s uplinks take; at at_s = 5 ``tor``'s uplink drops to 40 Mbit/s. at_s counts from
    the first measured iteration; with no warm-up iteration that is the first iteration, so the
    event comes at the same point of the flow on any machine (after a warm-up iteration sharing
    the uplink with the flow, which took 5-18 s, too little of the flow could be left). The
    uplink is saturated while the flow sends, until :func:`flow_end` or the end of training,
    whichever comes first (a flow still sending when training ends is stopped). While the flow
    sends, an allreduce iteration takes seconds (its small messages queue behind the
    flow's), after it 0.5 s: 20 iterations outlast the flow."""
    return {
        "name": "sched-rate",
        "scale": 1,
        "topology": {
            "kind": "rack_core",
            "racks": 2,
            "hosts_per_rack": 2,
            "host_bw_mbps": 100,
            "uplink_bw_mbps": 80,
            "background_hosts_per_rack": 1,
        },
        "workload": {
            "scheme": "allreduce",
            "iterations": 20,
            "warmup_iterations": 0,
            "batch_size": 16,
            "compute": {"mode": "emulated", "profile": profile(tmp_path, [0.005] * 3, [0.005] * 3)},
        },
        "background": [{"src": src, "dst": dst, "rate_mbps": 300, "duration_s": 25, "protocol": "tcp"}],
        "events": [{"at_s": 5, "link": f"uplink:{tor}", "bw_mbps": 40}],
        "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 300},
    }


def flow_end(run) -> float:
    """When the run's one background flow stopped sending, on the frames' clock: its client's
    start plus the seconds iperf3 reports it sent for (``traces/background/flows.json``)."""
    (flow,) = json.loads((run.path / "traces" / "background" / "flows.json").read_text())["flows"]
    return run.on_clock(flow["client_start"] + flow["result"]["seconds"])


def kill_spec(tmp_path: Path, victim: str) -> dict:
    """Allreduce on 2 racks x 2 hosts, ``victim`` killed at iteration 10 of 40."""
    return {
        "name": "sched-kill",
        "scale": 1,
        "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 100},
        "workload": {
            "scheme": "allreduce",
            "iterations": 40,
            "warmup_iterations": 3,
            "batch_size": 16,
            "compute": {"mode": "emulated", "profile": profile(tmp_path, [0.005] * 3, [0.005] * 3)},
        },
        "events": [{"at_iteration": 10, "kill": victim}],
        "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 300},
    }


def applied(run, index: int) -> dict:
    (rec,) = [r for r in run.schedule if r["index"] == index]
    assert rec["applied"] and not rec.get("error"), rec
    return rec


@pytest.mark.slow
@root_only
def test_an_uplink_halved_at_a_scheduled_time_runs_at_the_new_rate(tmp_path):
    """A TCP background flow bg1 -> bg2 (rack 0 -> rack 1) offers more than the uplink takes,
    with allreduce training across the racks: the ToR1 -> core direction is saturated; at
    at_s = 5 the uplink drops from 80 to 40 Mbit/s."""
    assert leftovers() == []
    exp = from_dict(uplink_halving_spec(tmp_path))
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    run = analysis.load(res.run_dir)
    rec = applied(run, 0)
    up = next(l for l in run.topology["links"] if l["class"] == "uplink" and "tor1" in (l["node1"], l["node2"]))
    assert set(rec["ifaces"]) == {up["intf1"], up["intf2"]}
    assert all(abs(v - 40) <= 0.01 * 40 for v in rec["readback_mbps"].values()), rec  # both ends, read back
    assert rec["emulated_s"] == pytest.approx(5, abs=0.3)
    port = port_of(run, "uplink", "tor1")
    w = tr.windowed_rates(run.rates[run.rates["iface"] == port], 0.5)
    t_start = run.iterations["start"].min()
    t_event, t_end = rec["time"], min(run.iterations["end"].max(), flow_end(run))  # while saturated
    before = w[(w["time"] > t_start + 1.5) & (w["time"] < t_event - 0.1)]["tx_bps"] / 1e6
    after = w[(w["time"] > t_event + 1.0) & (w["time"] < t_end - 0.5)]["tx_bps"] / 1e6
    assert len(before) >= 4 and len(after) >= 6, (len(before), len(after))
    assert abs(before.mean() - 80) <= 0.10 * 80, before.describe()  # saturated at the old rate
    assert abs(after.mean() - 40) <= 0.10 * 40, after.describe()  # and at the new one
    assert res.summary.segments[1].from_event == 0
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_host_link_taken_down_carries_no_bytes_until_it_is_brought_up(tmp_path):
    assert leftovers() == []
    exp = from_dict(
        {
            "name": "sched-down",
            "scale": 1,
            "topology": {
                "kind": "rack_core",
                "racks": 2,
                "hosts_per_rack": 2,
                "host_bw_mbps": 100,
                "oversubscription": 1,
            },
            "workload": {
                "scheme": "allreduce",
                "iterations": 60,
                "warmup_iterations": 3,
                "batch_size": 16,
                "compute": {"mode": "emulated", "profile": profile(tmp_path, [0.005] * 3, [0.005] * 3)},
            },
            "events": [{"at_s": 3, "link": "host:h2", "down": True}, {"at_s": 5, "link": "host:h2", "up": True}],
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 300},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error  # training survives a 2 s outage
    run = analysis.load(res.run_dir)
    down, up = applied(run, 0), applied(run, 1)
    port = port_of(run, "host", "h2")
    assert down["ifaces"] == [port] and up["ifaces"] == [port]  # the switch-side end
    r = run.rates[run.rates["iface"] == port]
    during = r[(r["time"] - r["dt_s"] >= down["time"] + 0.02) & (r["time"] <= up["time"])]
    assert len(during) >= 50, len(during)  # sampled every 10 ms while down
    assert int(during["tx_bytes"].sum()) == 0 and int(during["rx_bytes"].sum()) == 0
    before = r[(r["time"] > down["time"] - 1.0) & (r["time"] <= down["time"])]
    after = r[r["time"] > up["time"]]
    assert before["tx_bytes"].sum() > 0 and after["tx_bytes"].sum() > 0 and after["rx_bytes"].sum() > 0
    # an iteration in progress while the link was down waited for it to come back (the one
    # that starts just after the link goes down stalls too: its allreduce cannot finish)
    seg = res.summary.segments
    # down and up open segments; one segment for both when no iteration ended in between
    assert seg[0].from_event is None and [e for s in seg for e in s.events] == [0, 1]
    it = run.iterations.groupby("iteration").agg(start=("start", "min"), end=("end", "max"))
    stalled = it[(it["start"] < up["time"]) & (it["end"] > up["time"])]
    assert len(stalled) >= 1 and (stalled["end"] - stalled["start"]).max() >= 0.9 * (up["time"] - down["time"]), it
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_straggler_at_2x_lengthens_a_synchronous_iteration_by_its_compute_time(tmp_path):
    """allreduce waits for the slowest worker: from the event on, the iteration takes one more
    compute time C (the straggler's compute doubles, the others wait for it)."""
    assert leftovers() == []
    fwd, bwd = [0.03, 0.03, 0.01], [0.06, 0.06, 0.01]
    compute = sum(fwd) + sum(bwd)  # C = 0.2 s per iteration
    exp = from_dict(
        {
            "name": "sched-straggler",
            "scale": 1,
            "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 400},
            "workload": {
                "scheme": "allreduce",
                "iterations": 60,
                "warmup_iterations": 5,
                "batch_size": 16,
                "compute": {"mode": "emulated", "profile": profile(tmp_path, fwd, bwd)},
            },
            "events": [{"at_iteration": 30, "host": "h2", "compute_slowdown": 2.0}],
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 300},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    run = analysis.load(res.run_dir)
    rec = applied(run, 0)
    assert rec["iteration"] == 30 and rec["slowdown"] == 2.0
    # the runtime of the straggler's process (worker1 on h2) took it up at its iteration 30
    marks = run.events[run.events["kind"] == "compute_slowdown"]
    assert list(marks["proc"]) == ["worker1"] and list(marks["iteration"]) == [30]
    seg = res.summary.segments
    assert [(s.iterations, s.n) for s in seg] == [([0, 29], 25), ([30, None], 30)]
    t0, t1 = seg[0].iteration_time_s.mean, seg[1].iteration_time_s.mean
    assert t0 > compute  # compute and the allreduce
    assert abs((t1 - t0) - compute) <= 0.15 * compute, (t0, t1, compute)
    assert seg[1].throughput.mean < seg[0].throughput.mean
    assert leftovers() == []


@pytest.mark.slow
@root_only
@pytest.mark.skipif(cpu_controller() is None, reason="needs the cpu cgroup controller")
def test_a_real_compute_straggler_is_throttled_in_a_cgroup_that_is_gone_afterwards(tmp_path):
    assert leftovers() == []
    exp = from_dict(
        {
            "name": "sched-cgroup",
            "topology": {"kind": "rack", "hosts_per_rack": 2, "host_bw_mbps": 100},
            "workload": {"scheme": "allreduce", "iterations": 30, "warmup_iterations": 2, "model": "digits_mlp"},
            "events": [{"at_iteration": 10, "host": "h2", "compute_slowdown": 4.0}],
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 300},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    run = analysis.load(res.run_dir)
    rec = applied(run, 0)
    assert rec["cgroup"] and rec["pids"] >= 2  # h2's shell and its training process at least
    assert rec["quota_us"] * 4 == rec["period_us"]
    assert not Path(rec["cgroup"]).exists()
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_scheduled_kill_ends_a_synchronous_run_naming_it_and_leaves_nothing(tmp_path):
    """ring allreduce has no recovery: the killed worker's peers fail, and the run's error
    says the kill came first; schedule.jsonl records it at its iteration."""
    assert leftovers() == []
    exp = from_dict(kill_spec(tmp_path, "worker1"))
    (res,) = run_experiment(exp, progress=False)
    assert res.summary.status == "failed"
    assert "after worker1 was killed by a scheduled event" in res.summary.error, res.summary.error
    run = analysis.load(res.run_dir)
    rec = applied(run, 0)
    assert rec["kind"] == "kill" and rec["iteration"] == 10
    done = run.iterations[run.iterations["worker"] == "worker1"]["iteration"]
    assert done.max() <= 10  # it ran no iteration after the one it was killed in
    assert leftovers() == []


@pytest.mark.slow
@root_only
def test_a_programs_uplink_degrades_from_launch_time_even_without_marks(tmp_path):
    """A researcher's program that marks nothing: at_s counts from the launch, the uplink's
    rate is changed and read back."""
    assert leftovers() == []
    (tmp_path / "idle.py").write_text("import time\ntime.sleep(4)\n")
    exp = from_dict(
        {
            "name": "sched-program",
            "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 1, "host_bw_mbps": 100},
            "workload": {"program": {"command": ["python", "idle.py"], "cwd": str(tmp_path)}},
            "events": [{"at_s": 1, "link": "uplink:tor2", "bw_mbps": 25}],
            "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 60},
        }
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    rec = applied(analysis.load(res.run_dir), 0)
    assert all(abs(v - 25) <= 0.25 for v in rec["readback_mbps"].values()), rec
    assert "marked no iterations" in res.summary.iterations_note
    assert leftovers() == []
