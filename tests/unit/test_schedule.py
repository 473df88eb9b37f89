"""Scheduled events without a network: the spec's checks, the plan-time
check, the schedule's triggers on synthetic event logs, the runtime's straggler, the summary's
segments, plots and timeline. The emulated network's behaviour is tests/e2e/test_schedule_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import psutil
import pytest
import yaml

import analysis
from analysis import metrics, plots, timeline
from common.errors import SpecError
from common.validation import load_yaml
from testbed import cgroups
from testbed.capture.pcap import topo_links
from testbed.event_applier import SCHEDULE_FILE, Schedule, check, resolve_link
from testbed.ledger import Ledger, lock_holder
from testbed.loopback import run_local
from testbed.spec import dump_spec, from_dict
from topologies import build_topo, hosts_of
from traffic import schemes
from traffic.event_spec import ComputeSlowdown, parse_events
from traffic.hostmodel.costs import HostCosts
from traffic.models import build_model
from traffic.runtime.emulation import EmulatedCompute
from traffic.runtime.events import EventLog, read_events

RACK_CORE = {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 100, "oversubscription": 2}


def spec(events, **over) -> dict:
    d = {
        "topology": dict(RACK_CORE),
        "workload": {"scheme": "allreduce", "iterations": 20, "warmup_iterations": 2},
        "events": events,
    }
    for k, v in over.items():
        d[k] = v
    return d


def spec_error(events, **over) -> SpecError:
    with pytest.raises(SpecError) as e:
        from_dict(spec(events, **over))
    return e.value


# ---------------------------------------------------------------------------- spec


def test_a_valid_schedule_is_kept_as_written_in_spec_yaml():
    events = [
        {"at_s": 10, "link": "uplink:tor1", "bw_mbps": 50},
        {"at_s": 20, "link": "host:h3", "down": True},
        {"at_s": 22, "link": "host:h3", "up": True},
        {"at_iteration": 10, "host": "h4", "compute_slowdown": 2.0},
        {"at_iteration": 15, "kill": "worker3"},
    ]
    exp = from_dict(spec(events))
    assert [e.kind for e in exp.events] == ["link_rate", "link_down", "link_up", "compute_slowdown", "kill"]
    assert [e.target for e in exp.events] == ["uplink:tor1", "host:h3", "host:h3", "h4", "worker3"]
    assert exp.events[0].trigger == ("at_s", 10.0) and exp.events[3].trigger == ("at_iteration", 10)
    written = load_yaml(dump_spec(exp))["events"]
    assert written == [
        {"at_s": 10.0, "link": "uplink:tor1", "bw_mbps": 50.0},
        {"at_s": 20.0, "link": "host:h3", "down": True},
        {"at_s": 22.0, "link": "host:h3", "up": True},
        {"at_iteration": 10, "host": "h4", "compute_slowdown": 2.0},
        {"at_iteration": 15, "kill": "worker3"},
    ]
    # what the runtime reads back from spec.yaml, and a spec without events
    assert parse_events(written) == exp.events
    assert from_dict({}).events == [] and load_yaml(dump_spec(from_dict({})))["events"] == []


@pytest.mark.parametrize(
    "event, field, words",
    [
        ({"at_s": -1, "link": "uplink:tor1", "bw_mbps": 5}, "events[0].at_s", "a time >= 0"),
        ({"at_iteration": -2, "kill": "worker0"}, "events[0].at_iteration", "an iteration index >= 0"),
        ({"at_s": 1, "link": "uplink:tor1", "bw_mbps": 0}, "events[0].bw_mbps", "a rate > 0"),
        ({"at_s": 1, "link": "uplink:tor1", "bw_mbps": -3.5}, "events[0].bw_mbps", "a rate > 0"),
        ({"at_s": 1, "host": "h1", "compute_slowdown": 0}, "events[0].compute_slowdown", "a factor in (0, 1000]"),
        ({"at_s": 1, "link": "tor1-eth3", "down": True}, "events[0].link", "uplink:<tor>"),
        ({"at_s": 1, "link": "host:", "down": True}, "events[0].link", "host:<host>"),
        ({"link": "host:h1", "down": True}, "events[0]", "one trigger"),
        ({"at_s": 1, "at_iteration": 2, "kill": "worker0"}, "events[0].at_iteration", "left out when at_s is given"),
        ({"at_s": 1}, "events[0]", "one action"),
        (
            {"at_s": 1, "link": "host:h1", "bw_mbps": 5, "down": True},
            "events[0].down",
            "bw_mbps is this event's action",
        ),
        (
            {"at_s": 1, "kill": "worker0", "host": "h1", "compute_slowdown": 2},
            "events[0].kill",
            "compute_slowdown is this event's action",
        ),
        ({"at_s": 1, "bw_mbps": 5}, "events[0].link", "the link to act on"),
        ({"at_s": 1, "link": "host:h1"}, "events[0]", "an action on link host:h1"),
        ({"at_s": 1, "host": "h1"}, "events[0].compute_slowdown", "the factor on host h1's compute"),
        ({"at_s": 1, "compute_slowdown": 2}, "events[0].host", "the host whose compute slows down"),
        ({"at_s": 1, "link": "host:h1", "down": False}, "events[0].down", "true, or leave it out"),
        ({"at_iteration": 20, "kill": "worker0"}, "events[0].at_iteration", "below workload.iterations (20)"),
        ({"at_s": 1, "kill": "worker0", "what": 1}, "events[0].what", "a known field of events"),
        ({"at_s": "1", "kill": "worker0"}, "events[0].at_s", "a number"),
    ],
)
def test_each_bad_event_is_a_spec_error_naming_field_value_and_what_is_allowed(event, field, words):
    err = spec_error([event])
    got = {e.field: e for e in err.errors}
    assert field in got, str(err)
    assert words in got[field].allowed, str(err)
    assert f"spec field '{field}'" in str(err)


def test_uplinks_only_in_rack_core_and_conflicts_at_one_trigger():
    err = spec_error([{"at_s": 1, "link": "uplink:tor1", "bw_mbps": 5}], topology={"kind": "rack", "hosts_per_rack": 4})
    assert err.field == "events[0].link" and "only with topology.kind 'rack_core'" in err.allowed
    # the same part of the same target at the same trigger: an error naming both events
    err = spec_error([{"at_s": 5, "link": "host:h1", "down": True}, {"at_s": 5, "link": "host:h1", "up": True}])
    assert err.field == "events[1]" and "state (up or down) of host:h1" in err.allowed and "events[0]" in err.allowed
    err = spec_error(
        [
            {"at_iteration": 3, "link": "uplink:tor1", "bw_mbps": 5},
            {"at_iteration": 3, "link": "uplink:tor1", "bw_mbps": 7},
        ]
    )
    assert err.field == "events[1]" and "rate of uplink:tor1" in err.allowed
    # not a conflict: other triggers, other targets, other parts, unsorted
    exp = from_dict(
        spec(
            [
                {"at_s": 9, "link": "host:h1", "up": True},
                {"at_s": 5, "link": "host:h1", "down": True},
                {"at_s": 5, "link": "host:h1", "bw_mbps": 5},
                {"at_s": 5, "link": "host:h2", "down": True},
                {"at_iteration": 5, "link": "host:h1", "up": True},
            ]
        )
    )
    assert len(exp.events) == 5


def test_several_bad_events_are_reported_at_once():
    err = spec_error([{"at_s": -1, "kill": "worker0"}, {"at_s": 1}, {"at_s": 1, "link": "host:h1", "bw_mbps": 0}])
    assert {e.field for e in err.errors} == {"events[0].at_s", "events[2].bw_mbps"}  # field errors first
    err = spec_error([{"at_s": 1}, {"at_s": 2, "link": "host:h1", "up": True, "down": True}])
    assert {e.field for e in err.errors} == {"events[0]", "events[1].up"}


# ---------------------------------------------------------------------------- plan-time check


def planned(exp):
    """What testbed.runner.plan_point has: the Topo's links and switches, the hosts, the plan."""
    scheme = schemes.get(exp.workload.scheme)
    topo = build_topo(exp.topology, scheme.hosts(exp.workload, exp.topology))
    hosts = hosts_of(topo)
    return topo_links(topo), set(topo.switches()), hosts, scheme.plan(exp.workload, hosts)


def check_error(events, **over) -> SpecError:
    exp = from_dict(spec(events, **over))
    with pytest.raises(SpecError) as e:
        check(exp.events, *planned(exp), compute_mode=exp.workload.compute.mode, scale=exp.scale)
    return e.value


def test_check_accepts_what_the_planned_network_has():
    exp = from_dict(
        spec(
            [
                {"at_s": 1, "link": "uplink:tor2", "bw_mbps": 20},
                {"at_s": 2, "link": "host:bg2", "down": True},
                {"at_iteration": 3, "host": "h4", "compute_slowdown": 3},
                {"at_iteration": 4, "kill": "worker1"},
            ],
            topology={**RACK_CORE, "background_hosts_per_rack": 1},
            workload={"scheme": "allreduce", "iterations": 20, "compute": {"mode": "emulated"}},
        )
    )
    links, switches, hosts, plan = planned(exp)
    check(exp.events, links, switches, hosts, plan, compute_mode="emulated", scale=2.0)
    # the links a token names, as topology.json lists them
    (up,) = resolve_link("uplink:tor2", links, switches)
    assert {up["node1"], up["node2"]} == {"tor2", "core1"} and up["class"] == "uplink"
    (h,) = resolve_link("host:h3", links, switches)
    assert {h["node1"], h["node2"]} == {"h3", "tor2"}


def test_check_names_what_exists_for_an_unknown_link_host_or_process():
    err = check_error(
        [
            {"at_s": 1, "link": "uplink:tor3", "bw_mbps": 20},
            {"at_s": 1, "link": "host:h9", "down": True},
            {"at_s": 1, "link": "uplink:core1", "bw_mbps": 20},
            {"at_s": 1, "host": "h7", "compute_slowdown": 2},
            {"at_s": 1, "kill": "worker9"},
        ]
    )
    by = {e.field: e for e in err.errors}
    assert set(by) == {"events[0].link", "events[1].link", "events[2].link", "events[3].host", "events[4].kill"}
    tokens = "host:h1, host:h2, host:h3, host:h4, uplink:tor1, uplink:tor2"
    assert by["events[0].link"].value == "uplink:tor3" and tokens in by["events[0].link"].allowed
    assert tokens in by["events[1].link"].allowed and tokens in by["events[2].link"].allowed
    assert "a host of the topology: h1, h2, h3, h4" in by["events[3].host"].allowed
    assert "a process of the run: worker0, worker1, worker2, worker3" in by["events[4].kill"].allowed


def test_check_refuses_a_slowdown_where_nothing_computes_and_a_rate_beyond_shaping():
    # bg1 carries background flows only; ps1 runs the parameter server
    err = check_error(
        [{"at_s": 1, "host": "bg1", "compute_slowdown": 2}], topology={**RACK_CORE, "background_hosts_per_rack": 1}
    )
    assert err.field == "events[0].host" and "a host that runs a worker" in err.allowed
    err = check_error(
        [{"at_s": 1, "host": "ps1", "compute_slowdown": 2}],
        workload={"scheme": "ps", "iterations": 20, "servers": {"config": "NCC"}},
    )
    assert err.field == "events[0].host" and "h1, h2, h3, h4" in err.allowed
    err = check_error([{"at_s": 1, "link": "host:h1", "bw_mbps": 50_000}])
    assert err.field == "events[0].bw_mbps" and "at most 40000 Mbit/s" in err.allowed


def test_check_refuses_a_real_compute_straggler_without_the_cpu_cgroup_controller(monkeypatch, tmp_path):
    events = [{"at_iteration": 3, "host": "h2", "compute_slowdown": 2}]
    monkeypatch.setattr("testbed.event_applier.cpu_controller", lambda: None)
    err = check_error(events)  # compute.mode real (the default)
    assert err.field == "events[0].compute_slowdown" and "the cpu cgroup controller" in err.allowed
    exp = from_dict(spec(events, workload={"scheme": "allreduce", "iterations": 20, "compute": {"mode": "emulated"}}))
    check(exp.events, *planned(exp), compute_mode="emulated")  # emulated: the runtime applies it
    monkeypatch.setattr("testbed.event_applier.cpu_controller", lambda: cgroups.CpuController(1, tmp_path))
    check(from_dict(spec(events)).events, *planned(from_dict(spec(events))), compute_mode="real")


# ---------------------------------------------------------------------------- the schedule's triggers


class FakeShaper:
    """Records what the schedule asks of the network (the first end of each link for a rate,
    the switch ends for a link down or up); ``readback`` maps iface -> rate to report."""

    def __init__(self, fail=None, readback=None):
        self.calls, self.fail, self.readback = [], fail, readback or {}

    def set_rate(self, ends, shaped_mbps):
        self.calls.append(("rate", [i for _, i in ends[::2]], shaped_mbps))
        if self.fail:
            raise RuntimeError(self.fail)
        return {i: self.readback.get(i, shaped_mbps) for _, i in ends}

    def set_state(self, ends, up):
        self.calls.append(("up" if up else "down", [i for _, i in ends]))
        return [i for _, i in ends]


def topology_json() -> dict:
    """topology.json's switches and links of RACK_CORE (what the Schedule reads)."""
    links, switches, _, _ = planned(from_dict(spec([])))
    return {"switches": [{"name": s} for s in sorted(switches)], "links": links}


class Logs:
    """The runtime's event logs of a synthetic run: ``iteration`` spans written as EventLog does."""

    def __init__(self, run_dir: Path, workers=2):
        (run_dir / "events").mkdir(parents=True, exist_ok=True)
        procs = [
            {"name": f"worker{i}", "role": "worker", "index": i, "rank": i, "host": f"h{i + 1}"} for i in range(workers)
        ]
        (run_dir / "processes.json").write_text(json.dumps({"world_size": workers, "processes": procs}))
        self.logs = {
            p["name"]: EventLog(run_dir / "events" / f"{p['name']}.jsonl", p["name"], "worker", p["rank"])
            for p in procs
        }

    def iteration(self, worker: str, it: int, start: float, dur: float) -> None:
        self.logs[worker].record("iteration", start, dur, iteration=it, samples=32)
        self.logs[worker].record("forward", start, dur / 2, iteration=it, layer=0)  # noise the tail skips


def new_schedule(tmp_path, events, scale=1.0, warmup=2, **kw):
    exp = from_dict(
        spec(
            events,
            workload={
                "scheme": "allreduce",
                "iterations": 20,
                "warmup_iterations": warmup,
                "compute": {"mode": "emulated"},
            },
        )
    )
    killed = []
    shaper = kw.pop("shaper", FakeShaper())
    s = Schedule(
        exp.events,
        topology_json(),
        tmp_path,
        scale,
        warmup,
        {"h1": 1, "h2": 2},
        killed.append,
        shaper=shaper,
        compute_mode=kw.pop("compute_mode", "emulated"),
        **kw,
    )
    return s, shaper, killed


def lines(tmp_path) -> list[dict]:
    return [json.loads(l) for l in (tmp_path / SCHEDULE_FILE).read_text().splitlines()]


def test_at_iteration_fires_once_every_worker_has_finished_the_iteration_before(tmp_path):
    logs = Logs(tmp_path)
    s, shaper, _ = new_schedule(
        tmp_path,
        [
            {"at_iteration": 3, "link": "uplink:tor1", "bw_mbps": 50},
            {"at_iteration": 0, "link": "host:h1", "down": True},
        ],
    )
    assert [r["index"] for r in s.poll(now=100.0)] == [1]  # iteration 0: at once
    for it in range(3):
        logs.iteration("worker0", it, 100 + it, 1.0)
    logs.iteration("worker1", 0, 100, 1.0)
    logs.iteration("worker1", 1, 101, 1.0)
    assert s.poll(now=103.5) == [] and s.iteration == 2  # worker1 has not finished iteration 2
    logs.iteration("worker1", 2, 102, 1.5)
    (rec,) = s.poll(now=103.6)
    assert rec["index"] == 0 and rec["iteration"] == 3 and rec["kind"] == "link_rate"
    assert shaper.calls == [("down", ["tor1-eth1"]), ("rate", ["tor1-eth3"], 50.0)]
    assert (
        rec["bw_mbps"] == 50
        and rec["shaped_mbps"] == 50
        and rec["readback_mbps"] == {"tor1-eth3": 50, "core1-eth1": 50}
    )
    assert rec["ifaces"] == ["tor1-eth3", "core1-eth1"] and rec["applied"] and "error" not in rec
    assert s.poll(now=200) == []  # once only
    assert [r["index"] for r in lines(tmp_path)] == [1, 0]


def test_at_s_counts_emulated_seconds_from_the_first_measured_iteration(tmp_path):
    logs = Logs(tmp_path)
    s, shaper, _ = new_schedule(tmp_path, [{"at_s": 2.0, "link": "host:h2", "bw_mbps": 25}], scale=4.0)
    logs.iteration("worker0", 0, 100.0, 1.0)
    logs.iteration("worker1", 0, 100.2, 1.0)
    assert s.poll(now=150.0) == [] and s.t_measured is None  # still in the warm-up: no clock yet
    logs.iteration("worker1", 1, 101.2, 0.9)  # ends 102.1: iteration 2 (the first measured) starts then
    logs.iteration("worker0", 1, 101.0, 1.3)  # ends 102.3
    assert s.poll(now=102.4) == [] and s.t_measured == pytest.approx(102.1)
    assert s.next_deadline(102.4) == pytest.approx(s.poll_s)  # due at 102.1 + 2 x 4 = 110.1
    assert s.next_deadline(110.09) == pytest.approx(0.01)
    logs.iteration("worker0", 2, 102.05, 3.0)  # its real start: the earliest worker's
    assert s.poll(now=110.0) == [] and s.t_measured == pytest.approx(102.05)
    (rec,) = s.poll(now=110.06)
    assert rec["at_s"] == 2.0 and rec["shaped_mbps"] == 25 / 4 and shaper.calls == [("rate", ["h2-eth0"], 6.25)]
    assert rec["emulated_s"] == pytest.approx((rec["ts"] - 102.05) / 4)  # unix ts of now, not the poll's clock


def test_failures_are_recorded_and_the_next_events_still_apply(tmp_path):
    Logs(tmp_path)
    s, shaper, killed = new_schedule(
        tmp_path,
        [{"at_iteration": 0, "link": "uplink:tor2", "bw_mbps": 30}, {"at_iteration": 0, "kill": "worker1"}],
        shaper=FakeShaper(fail="netlink says no"),
    )
    recs = s.poll(now=1.0)
    assert [r["index"] for r in recs] == [0, 1]
    assert recs[0]["error"] == "RuntimeError: netlink says no" and recs[0]["applied"]
    assert killed == ["worker1"] and "error" not in recs[1]
    # a read-back that is off is an error of the event too
    (tmp_path / "b").mkdir()
    s2, _, _ = new_schedule(
        tmp_path / "b",
        [{"at_iteration": 0, "link": "host:h1", "bw_mbps": 30}],
        shaper=FakeShaper(readback={"tor1-eth1": 33.0}),
    )
    (rec,) = s2.poll(now=1.0)
    assert "tor1-eth1: 33.0" in rec["error"] and rec["readback_mbps"]["h1-eth0"] == 30


def test_a_killed_worker_no_longer_holds_back_the_iteration_count(tmp_path):
    logs = Logs(tmp_path, workers=3)
    s, _, killed = new_schedule(
        tmp_path, [{"at_iteration": 1, "kill": "worker2"}, {"at_iteration": 3, "host": "h1", "compute_slowdown": 2.5}]
    )
    for w in ("worker0", "worker1", "worker2"):
        logs.iteration(w, 0, 10, 1)
    assert [r["index"] for r in s.poll(now=11.5)] == [0] and killed == ["worker2"]
    for it in (1, 2):
        for w in ("worker0", "worker1"):
            logs.iteration(w, it, 10 + it, 1)
    (rec,) = s.poll(now=13.5)
    assert rec["kind"] == "compute_slowdown" and rec["slowdown"] == 2.5 and rec["target"] == "h1"
    assert rec["iteration"] == 3 and "cgroup" not in rec  # emulated compute: the runtime applies it


def test_stop_records_what_never_came_is_idempotent_and_the_thread_applies_on_time(tmp_path):
    logs = Logs(tmp_path)
    s, shaper, _ = new_schedule(
        tmp_path,
        [
            {"at_s": 0.3, "link": "host:h1", "down": True},
            {"at_s": 0.6, "link": "host:h1", "up": True},
            {"at_iteration": 19, "kill": "worker0"},
        ],
        warmup=0,
        poll_s=0.02,
    )
    s.start()
    now = time.time()
    logs.logs["worker0"].record("setup", now - 0.5, 0.5)  # iteration 0 starts when setup ends
    deadline = time.time() + 10
    while len(s.records) < 2 and time.time() < deadline:
        time.sleep(0.01)
    s.stop()
    s.stop()
    recs = lines(tmp_path)
    assert [(r["index"], r["applied"]) for r in recs] == [(0, True), (1, True), (2, False)]
    assert shaper.calls == [("down", ["tor1-eth1"]), ("up", ["tor1-eth1"])]
    assert recs[0]["ts"] - now == pytest.approx(0.3, abs=0.15) and recs[1]["ts"] - now == pytest.approx(0.6, abs=0.15)
    assert recs[0]["ifaces"] == ["tor1-eth1"]  # the switch-side end
    assert recs[2]["ts"] is None and recs[2]["emulated_s"] is None and recs[2]["at_iteration"] == 19
    assert s.poll() == [] and s._thread is not None and not s._thread.is_alive()


def test_a_real_compute_straggler_throttles_the_hosts_processes_in_a_cgroup(tmp_path, monkeypatch):
    Logs(tmp_path)
    calls = []

    class Throttle:
        def __init__(self, ctl, name, on_cgroup=None):
            self.path = ctl.root / f"testbed-{name}"
            on_cgroup(str(self.path))

        def apply(self, slowdown, pids):
            calls.append(("apply", slowdown, pids))
            return {"cgroup": str(self.path), "quota_us": 50_000, "period_us": 100_000, "pids": len(pids)}

        def remove(self):
            calls.append(("remove",))
            return True

    monkeypatch.setattr("testbed.event_applier.cpu_controller", lambda: cgroups.CpuController(1, Path("/cg")))
    monkeypatch.setattr("testbed.event_applier.CpuThrottle", Throttle)
    monkeypatch.setattr("testbed.event_applier.netns_pids", lambda pid: [pid, pid * 10])
    made = []
    s, _, _ = new_schedule(
        tmp_path,
        [
            {"at_iteration": 0, "host": "h2", "compute_slowdown": 2},
            {"at_iteration": 5, "host": "h2", "compute_slowdown": 1},
        ],
        compute_mode="real",
        on_cgroup=made.append,
    )
    (rec,) = s.poll(now=1.0)
    assert calls == [("apply", 2, [2, 20])] and made == [f"/cg/testbed-{tmp_path.name}-h2"]
    assert rec["cgroup"] == made[0] and rec["pids"] == 2
    s.stop()
    assert calls[-1] == ("remove",) and lines(tmp_path)[-1]["applied"] is False


# ---------------------------------------------------------------------------- cgroups


def test_quota_and_controller_detection(tmp_path):
    assert cgroups.quota_us(2) == (50_000, 100_000)
    assert cgroups.quota_us(0.5) == (200_000, 100_000)  # faster than normal: two cores
    assert cgroups.quota_us(1000) == (1_000, 1_000_000)  # the kernel's 1 ms minimum of quota
    with pytest.raises(ValueError):
        cgroups.quota_us(0)
    v1, v2 = tmp_path / "cpu", tmp_path / "unified"
    v1.mkdir(), v2.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v2 / "cgroup.controllers").write_text("memory pids\n")
    mounts = tmp_path / "mounts"
    mounts.write_text(
        f"cgroup {tmp_path / 'acct'} cgroup rw,cpuacct 0 0\ncgroup {v1} cgroup rw,relatime,cpu 0 0\n"
        f"cgroup2 {v2} cgroup2 rw 0 0\n"
    )
    assert cgroups.cpu_controller(mounts) == cgroups.CpuController(1, v1)  # v2 lacks cpu here
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    assert cgroups.cpu_controller(mounts) == cgroups.CpuController(2, v2)  # preferred when it has it
    mounts.write_text(f"cgroup2 {tmp_path / 'none'} cgroup2 rw 0 0\n")
    assert cgroups.cpu_controller(mounts) is None


@pytest.mark.skipif(os.geteuid() != 0 or cgroups.cpu_controller() is None, reason="needs root and a cpu cgroup")
def test_a_throttled_process_gets_its_share_of_a_core_and_nothing_is_left(tmp_path):
    if lock_holder() is not None:  # a live run's leftover check would see this test's cgroup
        pytest.skip("a testbed run is live")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    led = Ledger(path=tmp_path / "ledger.json", run_dir=str(tmp_path))
    try:
        t = cgroups.CpuThrottle(cgroups.cpu_controller(), f"unittest-{os.getpid()}", on_cgroup=led.add_cgroup)
        info = t.apply(4.0, [busy.pid])
        assert info["pids"] == 1 and led.cgroups == [info["cgroup"]] and Path(info["cgroup"]).is_dir()
        assert str(busy.pid) in (Path(info["cgroup"]) / "cgroup.procs").read_text().split()
        p = psutil.Process(busy.pid)
        c0, t0 = sum(p.cpu_times()[:2]), time.monotonic()
        time.sleep(1.5)
        share = (sum(p.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
        assert share <= 0.25 * 1.2, share  # the kernel holds it to a quarter of a core
        assert t.remove() and not Path(info["cgroup"]).exists() and busy.poll() is None
        assert cgroups.testbed_cgroups() == []
        # a ledger's sweep removes a cgroup teardown missed, and kills what is in it (the run's processes)
        t.apply(2.0, [busy.pid])
        swept = led.sweep()
        assert f"cgroup {info['cgroup']}" in swept and any(r.startswith(f"process {busy.pid} ") for r in swept)
        assert cgroups.testbed_cgroups() == []
        busy.wait(timeout=5)
    finally:
        busy.kill()
        busy.wait()
        for c in cgroups.testbed_cgroups():
            cgroups.remove_cgroup(c)


# ---------------------------------------------------------------------------- the runtime's straggler


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_compute_slowdown_takes_effect_at_its_iteration_or_time_and_is_recorded(tmp_path):
    events = parse_events(
        [
            {"at_iteration": 3, "host": "h2", "compute_slowdown": 2.0},
            {"at_s": 1.5, "host": "h2", "compute_slowdown": 3.0},
            {"at_iteration": 1, "host": "h1", "compute_slowdown": 5.0},
        ]
    )
    assert ComputeSlowdown.for_host(events, "h3", 2.0, 2) is None
    log = EventLog(tmp_path / "w.jsonl", "worker1", "worker", 1)
    clock = Clock()
    sd = ComputeSlowdown([(i, e) for i, e in enumerate(events) if e.host == "h2"], 2.0, 2, log=log, clock=clock)
    for it in range(3):
        clock.t = 10.0 * it
        sd.iteration_started(it)
        assert sd.factor() == 1.0
    assert sd.t_measured == 20.0  # iteration 2 = warmup_iterations
    clock.t = 22.9
    assert sd.factor() == 1.0
    clock.t = 23.0
    sd.iteration_started(3)  # both due: at_iteration 3, and at_s 1.5 x scale 2 = 3 s after 20
    assert sd.factor() == 3.0  # the later trigger wins
    log.close()
    recs = [e for e in read_events(tmp_path / "w.jsonl") if e["kind"] == "compute_slowdown"]
    assert [(r["event"], r["slowdown"], r["iteration"]) for r in recs] == [(0, 2.0, 3), (1, 3.0, 3)]
    assert recs[0]["at_iteration"] == 3 and recs[1]["at_s"] == 1.5


def test_emulated_compute_is_charged_the_slowed_times():
    model = build_model("digits_mlp", 0)
    costs = HostCosts(scale=1.0)
    em = EmulatedCompute(model, [1e-4, 2e-4, 3e-4], [4e-4, 5e-4, 6e-4], seed=0, costs=costs)
    assert em.forward(1) == 2e-4
    factor = [2.0]
    costs.compute_slowdown = lambda: factor[0]
    assert em.forward(1) == pytest.approx(4e-4) and em.backward(2, []) == pytest.approx(12e-4)
    assert costs.stats["compute"]["emulated_s"] == pytest.approx(2e-4 + 4e-4 + 12e-4)
    assert costs.stats["compute"]["count"] == 3


PROFILE = {
    "model": "digits_mlp",
    "device": "test",
    "batch_size": 16,
    "source": "unit test",
    "method": "measured",
    "derived": False,
    "layers": [
        {"index": i, "name": f"l{i}", "forward_s": f, "backward_s": b}
        for i, (f, b) in enumerate([(0.002, 0.004), (0.002, 0.004), (0.001, 0.002)])
    ],
}


def test_a_straggler_host_doubles_its_processes_compute_from_its_iteration_on(tmp_path):
    """Loopback (no network): the runtime reads the events from spec.yaml; worker1 on h2 asks for
    twice the profiled compute from iteration 4 on, worker0 never."""
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 2},
            "workload": {
                "scheme": "allreduce",
                "iterations": 8,
                "warmup_iterations": 2,
                "batch_size": 16,
                "compute": {"mode": "emulated", "profile": str(tmp_path / "p.json")},
            },
            "scale": 1,
            "events": [{"at_iteration": 4, "host": "h2", "compute_slowdown": 2.0}],
            "run": {"timeout_s": 120},
        }
    )
    run_dir = run_local(exp, tmp_path / "run")
    per_iteration = sum(l["forward_s"] + l["backward_s"] for l in PROFILE["layers"])
    for w, slowed in (("worker0", False), ("worker1", True)):
        ev = read_events(run_dir / "events" / f"{w}.jsonl")
        req = {}
        for e in ev:
            if e["kind"] in ("forward", "backward"):
                req[e["iteration"]] = req.get(e["iteration"], 0.0) + e["requested_s"]
        want = [per_iteration * (2 if slowed and it >= 4 else 1) for it in range(8)]
        assert [req[it] for it in range(8)] == pytest.approx(want)
        marks = [e for e in ev if e["kind"] == "compute_slowdown"]
        assert [(m["iteration"], m["slowdown"]) for m in marks] == ([(4, 2.0)] if slowed else [])
        res = json.loads((run_dir / "results" / f"{w}.json").read_text())
        assert res["host_costs"]["compute"]["emulated_s"] == pytest.approx(sum(want))


# ---------------------------------------------------------------------------- analysis


BATCH, WORKERS = 16, 2
TIMES = [1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0]  # real seconds of iterations 0..9


def synthetic_run(root: Path, schedule: list[dict], scale=2.0, program=False, iterations=True) -> Path:
    d = root / "run"
    (d / "events").mkdir(parents=True)
    wl = {"scheme": "allreduce", "iterations": len(TIMES), "warmup_iterations": 2, "batch_size": BATCH}
    if program:
        wl = {
            "scheme": "program",
            "program": {"command": ["python", "x.py"]},
            "iterations": len(TIMES),
            "warmup_iterations": 2,
        }
    (d / "spec.yaml").write_text(yaml.safe_dump({"scale": scale, "workload": wl}))
    procs = [
        {"name": f"worker{i}", "role": "worker", "index": i, "rank": i, "host": f"h{i + 1}"} for i in range(WORKERS)
    ]
    (d / "processes.json").write_text(json.dumps({"world_size": WORKERS, "processes": procs}))
    t = 1000.0
    starts = []
    for it, dur in enumerate(TIMES):
        starts.append(t)
        for p in procs:
            log = EventLog(d / "events" / f"{p['name']}.jsonl", p["name"], "worker", p["rank"])
            if iterations:
                log.record("iteration", t, dur, iteration=it, samples=BATCH)
            else:
                log.record("allreduce", t, dur, bytes=100)
            log.close()
        t += dur
    with open(d / SCHEDULE_FILE, "w") as f:
        for r in schedule:
            r = dict(r)
            if r.get("ts") == "start of":
                r["ts"] = starts[r["iteration"]] - 0.01
            f.write(json.dumps(r) + "\n")
    return d


RECORDS = [
    {
        "index": 0,
        "kind": "link_rate",
        "target": "uplink:tor1",
        "at_s": 3.0,
        "applied": True,
        "ts": "start of",
        "iteration": 5,
        "bw_mbps": 50.0,
    },
    {
        "index": 1,
        "kind": "compute_slowdown",
        "target": "h2",
        "at_iteration": 9,
        "applied": True,
        "ts": "start of",
        "iteration": 9,
        "slowdown": 2.0,
    },
    {
        "index": 2,
        "kind": "kill",
        "target": "worker1",
        "at_iteration": 9,
        "applied": True,
        "ts": "start of",
        "iteration": 9,
        "error": "ProcessLookupError: gone",
    },
    {"index": 3, "kind": "link_up", "target": "host:h1", "at_s": 99.0, "applied": False, "ts": None, "iteration": 10},
]
#: a second uplink changed at the same moment as record 0
SAME_TIME = {
    "index": 4,
    "kind": "link_rate",
    "target": "uplink:tor2",
    "at_s": 3.0,
    "applied": True,
    "ts": "start of",
    "iteration": 5,
    "bw_mbps": 50.0,
}


def test_summary_gives_throughput_and_iteration_time_between_consecutive_events(tmp_path):
    d = synthetic_run(tmp_path, RECORDS + [SAME_TIME])
    s = metrics.summarize(d)
    assert [e["index"] for e in s.events] == [0, 1, 2, 4] and [e["index"] for e in s.events_not_reached] == [3]
    assert s.iterations_note is None
    seg = s.segments
    # both uplinks changed at iteration 5 open one segment together
    assert [(g.from_event, g.events, g.kind, g.iterations, g.n) for g in seg] == [
        (None, [], None, [0, 4], 3),
        (0, [0, 4], "link_rate", [5, 8], 4),
        (1, [1], "compute_slowdown", [9, None], 1),
    ]
    # emulated time: real seconds / scale 2; the failed kill is no boundary
    assert seg[0].iteration_time_s.mean == pytest.approx(0.5)
    assert seg[1].iteration_time_s.mean == pytest.approx(1.0) and seg[1].iteration_time_s.p95 == 1.0
    assert seg[2].iteration_time_s.mean == pytest.approx(1.5)
    assert seg[1].throughput.mean == pytest.approx(BATCH * WORKERS / 1.0)
    assert seg[0].throughput.overall == pytest.approx(3 * BATCH * WORKERS / 1.5)
    # start_s: when the event was applied, emulated s since iteration 2 started (at 1002.0)
    assert seg[0].start_s is None and seg[1].start_s == pytest.approx((1004.99 - 1002.0) / 2)
    assert seg[1].end_s == pytest.approx((1012.99 - 1002.0) / 2) and seg[2].end_s is None
    # the segments together hold every measured iteration, and the whole-run figures stand
    assert sum(g.n for g in seg) == s.measured_iterations == 8
    assert s.iteration_time_s.mean == pytest.approx(np.mean(TIMES[2:]) / 2)
    assert metrics.summarize(synthetic_run(tmp_path / "none", [])).segments == []


def test_a_run_without_iteration_marks_says_so(tmp_path):
    s = metrics.summarize(synthetic_run(tmp_path / "p", [], program=True, iterations=False))
    assert s.iterations_note == "the program marked no iterations: iteration figures are absent"
    assert s.throughput.mean is None and s.measured_iterations == 0
    s = metrics.summarize(synthetic_run(tmp_path / "s", [], iterations=False))
    assert s.iterations_note == "no worker recorded an iteration: iteration figures are absent"


def test_timeline_and_plots_mark_each_applied_event(tmp_path):
    d = synthetic_run(tmp_path, RECORDS)
    run = analysis.load(d)
    assert run.schedule[0]["time"] == pytest.approx(run.t0 + (1004.99 - run.t0) / 2)  # the frames' clock
    doc = json.loads(timeline.write_timeline(d).read_text())
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert [e["name"] for e in inst] == ["#0 uplink:tor1 50 Mbit/s", "#1 h2 x2 compute", "#2 kill worker1 FAILED"]
    assert inst[0]["ts"] == pytest.approx((run.schedule[0]["time"] - run.t0) * 1e6)
    assert inst[0]["args"]["bw_mbps"] == 50.0 and "time" not in inst[0]["args"]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "scheduled events" in names
    fig, (a1, a2) = plt.subplots(2)
    assert plots.mark_events(a1, run) == 3 and plots.mark_events(a2, run, axis="iteration") == 3
    t0 = run.t0
    assert [l.get_xdata()[0] for l in a1.lines] == pytest.approx([r["time"] - t0 for r in run.schedule[:3]])
    assert [l.get_xdata()[0] for l in a2.lines] == [4.5, 8.5, 8.5]  # just before the first iteration after each
    plt.close(fig)
    assert plots.plot_iteration_times(run).is_file()
