"""What a run's spec asked for, verified on the emulated network (analysis.effects): a UDP
background flow that ran at its rate, a flow whose start training never reached (the run
fails, every figure kept), tcpdump given a filter that begins with ``-`` (after ``--``), a
scheduled rate change read back. Needs root and Mininet; slow (each case builds a network and
trains for a few seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.runner import one_line, run_experiment
from testbed.spec import from_dict
from tests.e2e.test_schedule_e2e import profile
from tests.leftovers import leftovers, needs_root

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.skipif(needs_root, reason="needs root")]


def spec(tmp_path: Path, iterations: int = 100, **extra) -> dict:
    """Ring allreduce across two racks (10 ms per layer and pass: several seconds of training),
    one background host per rack."""
    return {
        "name": "effects",
        "scale": 1,
        "topology": {
            "kind": "rack_core",
            "racks": 2,
            "hosts_per_rack": 2,
            "host_bw_mbps": 100,
            "background_hosts_per_rack": 1,
        },
        "workload": {
            "scheme": "allreduce",
            "iterations": iterations,
            "warmup_iterations": 3,
            "batch_size": 16,
            "compute": {"mode": "emulated", "profile": profile(tmp_path, [0.01] * 3, [0.01] * 3)},
        },
        "run": {"runs_dir": str(tmp_path / "runs"), "timeout_s": 300},
        **extra,
    }


def effects(res, kind: str) -> list:
    return [e for e in res.summary.fidelity.effects if e.kind == kind]


def test_a_udp_flow_that_ran_at_its_rate_is_verified(tmp_path):
    assert leftovers() == []
    # 30 iterations: about 6 s of training (0.22 s an iteration); the flow sends from 0.5 to 2.5 s after the launch
    exp = from_dict(
        spec(
            tmp_path,
            iterations=30,
            background=[
                {
                    "name": "udp",
                    "src": "bg1",
                    "dst": "bg2",
                    "rate_mbps": 20,
                    "start_s": 0.5,
                    "duration_s": 2,
                    "protocol": "udp",
                }
            ],
        )
    )
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    (flow,) = effects(res, "background")
    assert flow.verified is True, flow
    assert flow.achieved["stopped_by_harness"] is False and flow.achieved["error"] is None
    assert flow.achieved["rate_mbps"] == pytest.approx(20, rel=0.10)
    assert flow.achieved["duration_s"] == pytest.approx(2, abs=0.1)
    assert flow.achieved["src_link_tx_bytes"] >= flow.achieved["bytes_received"] > 0  # it crossed bg1's link
    assert json.loads((res.run_dir / "traces" / "background" / "flows.json").read_text())["stopped"]
    assert [e.verified for e in effects(res, "process")] == [True] * 4 and effects(res, "shaping")[0].verified
    assert res.summary.fidelity.unverified == []
    assert leftovers() == []


def test_a_flow_starting_after_training_ended_fails_the_run_keeping_every_figure(tmp_path):
    assert leftovers() == []
    exp = from_dict(
        spec(
            tmp_path,
            iterations=20,
            background=[{"name": "late", "src": "bg1", "dst": "bg2", "rate_mbps": 10, "start_s": 200, "duration_s": 1}],
        )
    )
    (res,) = run_experiment(exp, progress=False)
    s = res.summary
    (line,) = s.fidelity.unverified
    assert line.startswith("background late: never started during training: it ended ") and line.endswith(
        "before the flow's start at 200.0 s"
    ), line
    assert s.status == "failed" and s.error == f"asked for but not done: {line}"
    assert s.throughput.mean > 0 and s.measured_iterations == 17 and s.bytes.core > 0  # every figure kept
    assert one_line(res) == f"{res.run_dir}: failed: asked for but not done: {line}"
    assert leftovers() == []


def test_a_filter_beginning_with_a_dash_is_given_after_a_double_dash_and_captures(tmp_path):
    """``-0 = 0 and tcp`` is valid BPF (every TCP packet); before it went after ``--``,
    tcpdump read ``-0`` as an option and exited at once."""
    assert leftovers() == []
    exp = from_dict(spec(tmp_path, iterations=20, capture={"pcap": {"ports": ["host:h1"], "filter": "-0 = 0 and tcp"}}))
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    (entry,) = json.loads((res.run_dir / "traces" / "pcap" / "ports.json").read_text())
    assert entry["filter"] == "-0 = 0 and tcp" and entry["exit_code"] == 0 and entry["terminated"] is True
    assert entry["packets_captured"] > 100, entry
    log = (res.run_dir / "logs" / f"tcpdump-{entry['port']}.log").read_text()
    assert " -- -0 = 0 and tcp" in log.splitlines()[0], log
    (cap,) = effects(res, "capture")
    assert cap.verified is True and cap.achieved["packets_captured"] == entry["packets_captured"]
    assert res.summary.capture_errors == []
    assert leftovers() == []


def test_a_rate_change_read_back_is_verified_in_emulated_units(tmp_path):
    """scale 2: the uplink's 50 emulated Mbit/s are shaped at 25 here and read back at both ends."""
    assert leftovers() == []
    s = spec(tmp_path, iterations=14, events=[{"at_iteration": 6, "link": "uplink:tor1", "bw_mbps": 50}])
    exp = from_dict({**s, "scale": 2})
    (res,) = run_experiment(exp, progress=False)
    assert res.ok, res.summary.error
    (ev,) = effects(res, "event")
    assert ev.name == "#0 link_rate uplink:tor1" and ev.verified is True, ev
    assert ev.asked == {"at_iteration": 6, "link": "uplink:tor1", "bw_mbps": 50.0}
    assert len(ev.achieved["readback_mbps"]) == 2
    assert all(v == pytest.approx(50, rel=0.01) for v in ev.achieved["readback_mbps"].values()), ev.achieved
    (shaping,) = effects(res, "shaping")
    assert shaping.verified is True and shaping.achieved["errors"] == []
    (netem,) = effects(res, "netem")
    assert netem.verified is None and netem.reason.startswith("the spec asks for no delay or loss")
    assert leftovers() == []
