"""Every effect a spec asks for, judged from the run's files (analysis.effects), and the rule
that fails an ``ok`` run with one not done. Each case is a small run directory: the synthetic
run of tests/unit/test_analysis.py (capture from unix 99 to 121 s) plus the files the harness's
own writers produce (flows.json by testbed.background.Background from real iperf3 output in
tests/data/iperf3, exits.json by testbed.launch.watch, ports.json, schedule.jsonl and
shaping.json as their writers lay them out)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import analysis
from analysis import effects, metrics
from common.errors import RunFailed
from testbed import launch
from testbed.background import Background
from testbed.spec import from_dict
from tests.unit.test_analysis import make_run, topology
from traffic.summary import Effect, RunSummary

IPERF3 = Path(__file__).parents[1] / "data" / "iperf3"
T_LAUNCH = 100.0  # unix s: inside the synthetic run's capture (99 .. 121 s)


def with_spec(d: Path, **sections) -> Path:
    """Add sections to the run's spec.yaml as the harness writes them (every default filled
    in); of a section the synthetic run has (``topology``, ``workload``, ``capture``), only the
    keys given."""
    spec = yaml.safe_load((d / "spec.yaml").read_text())
    full = yaml.safe_load(yaml.safe_dump(from_dict(sections).model_dump(mode="json")))
    for k, v in sections.items():
        spec[k] = {**spec[k], **{kk: full[k][kk] for kk in v}} if isinstance(spec.get(k), dict) else full[k]
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    return d


class NoSite:
    """The part of a site Background.stop uses, on this machine with nothing left to stop."""

    def stop_matching(self, pattern, grace_s):
        pass

    def fetch(self, host, path):
        pass


def flows_run(
    tmp_path: Path,
    flows: list[dict],
    outputs: dict[str, str | None],
    stopped_after_s: float,
    scale: float = 1.0,
    name: str = "run",
) -> Path:
    """A run whose ``background`` flows were launched at :data:`T_LAUNCH` and stopped
    ``stopped_after_s`` real seconds later; ``outputs``: flow name -> the tests/data/iperf3
    file its client wrote (None: it wrote none). flows.json is written by Background.stop."""
    d = with_spec(make_run(tmp_path, name), background=flows, scale=scale, workload={"compute": {"mode": "emulated"}})
    topo = topology()
    topo["hosts"] = [{**h, "ip": h["ip"]} for h in topo["hosts"]]
    bg = Background(
        from_dict({"background": flows, "scale": scale, "workload": {"compute": {"mode": "emulated"}}}).background,
        topo,
        NoSite(),
        d,
        scale=scale,
    )
    bg.dir.mkdir(parents=True)
    bg.started_at = {fp.name: T_LAUNCH + fp.delay_s for fp in bg.plans}
    bg.stopped_at = T_LAUNCH + stopped_after_s
    for flow, fixture in outputs.items():
        if fixture is not None:
            shutil.copy(IPERF3 / f"{fixture}.json", bg.dir / f"{flow}.json")
    bg.stop()
    return d


def effects_of(d: Path, kind: str) -> list[Effect]:
    s = metrics.compute_summary(analysis.load(d))
    return [e for e in s.fidelity.effects if e.kind == kind]


def flow(name, src="h3", dst="h1", rate=10, duration=2, start=0, protocol="tcp") -> dict:
    return {
        "name": name,
        "src": src,
        "dst": dst,
        "rate_mbps": rate,
        "duration_s": duration,
        "start_s": start,
        "protocol": protocol,
    }


# ---------------------------------------------------------------------------- background flows


def test_flows_that_ran_their_duration_or_until_training_ended_are_done(tmp_path):
    """UDP at its rate for its 2 s; UDP and TCP flows of 30 s stopped by the harness with
    SIGTERM 2.3 s in (training ended); a TCP flow below its rate (congestion) is recorded."""
    d = flows_run(
        tmp_path,
        [
            flow("udp", protocol="udp"),
            flow("udp_cut", protocol="udp", duration=30),
            flow("tcp_cut", duration=30),
            flow("tcp_slow", rate=50),
        ],
        {"udp": "udp_ok", "udp_cut": "udp_term", "tcp_cut": "tcp_term", "tcp_slow": "tcp_ok"},
        stopped_after_s=2.35,
    )
    got = {e.name: e for e in effects_of(d, "background")}
    assert [(n, e.verified, e.reason) for n, e in got.items()] == [(n, True, None) for n in got]
    udp = got["udp"]
    assert udp.asked == {
        "src": "h3",
        "dst": "h1",
        "protocol": "udp",
        "rate_mbps": 10.0,
        "start_s": 0.0,
        "duration_s": 2.0,
    }
    assert udp.achieved["rate_mbps"] == pytest.approx(2509824 * 8 / 2.00011 / 1e6)
    assert udp.achieved["duration_s"] == pytest.approx(2.00011) and udp.achieved["stopped_by_harness"] is False
    assert udp.achieved["bytes_received"] == 2509824 and udp.achieved["src_link_tx_bytes"] == 3000 * 2201
    assert got["udp_cut"].achieved["stopped_by_harness"] and got["udp_cut"].achieved["duration_s"] == pytest.approx(
        2.29894
    )
    assert got["udp_cut"].achieved["error"] == "interrupt - the client has terminated"
    assert got["tcp_slow"].achieved["rate_mbps"] == pytest.approx(10.49, abs=0.01)  # below its 50: recorded


def test_rates_and_durations_are_emulated_under_dilation(tmp_path):
    """scale 2: 20 emulated Mbit/s for 1 emulated s is iperf3 -b 10 Mbit/s -t 2 here."""
    d = flows_run(
        tmp_path, [flow("udp", protocol="udp", rate=20, duration=1)], {"udp": "udp_ok"}, stopped_after_s=5, scale=2
    )
    (e,) = effects_of(d, "background")
    assert e.verified is True
    assert e.achieved["rate_mbps"] == pytest.approx(2 * 2509824 * 8 / 2.00011 / 1e6)
    assert e.achieved["duration_s"] == pytest.approx(2.00011 / 2)


@pytest.mark.parametrize(
    "spec, output, stopped_after_s, reason",
    [
        (
            flow("late", start=500),
            None,
            10,
            "never started during training: it ended 55 emulated s after the launch, "
            "before the flow's start at 500.0 s",
        ),
        # started during the teardown, after the last event (155 s) but before the harness stopped the flows
        (
            flow("teardown", start=56, duration=30),
            "tcp_term",
            60,
            "never started during training: it ended 55 emulated s after the launch, before the flow's start at 56.0 s",
        ),
        (flow("refused"), "refused", 10, "iperf3: unable to connect to server: Connection refused"),
        (flow("busy"), "busy", 10, "iperf3: the server is busy running a test. try again later"),
        (
            flow("udp_fast", protocol="udp", rate=20),
            "udp_ok",
            10,
            "UDP sent at 10.04 Mbit/s, asked 20 Mbit/s (within 10%)",
        ),
        (flow("tcp_fast", rate=5), "tcp_ok", 10, "TCP sent at 10.49 Mbit/s, above its 5 Mbit/s by more than 10%"),
        (flow("short", duration=30), "tcp_term", 10, "ran 2.3 of 10 emulated s (until the harness stopped it)"),
        (flow("short_udp", protocol="udp", duration=4), "udp_ok", 10, "ran 2 of 4 emulated s"),
        (
            flow("h1_link", src="h1", dst="h3"),
            "tcp_ok",
            10,
            "its server received 2621440 payload bytes but h1's link carried 2201000 bytes during the capture",
        ),
    ],
)
def test_a_flow_not_done_says_why(tmp_path, spec, output, stopped_after_s, reason):
    d = flows_run(tmp_path, [spec], {spec["name"]: output}, stopped_after_s=stopped_after_s)
    (e,) = effects_of(d, "background")
    assert (e.verified, e.reason) == (False, reason)


def test_without_any_event_training_ends_when_the_harness_stopped_the_flows(tmp_path):
    d = flows_run(tmp_path, [flow("late", start=20)], {"late": None}, stopped_after_s=10)
    shutil.rmtree(d / "events")
    (d / "iterations.csv").unlink(missing_ok=True)
    (e,) = effects_of(d, "background")
    assert e.reason == (
        "never started during training: it ended 10 emulated s after the launch, before the flow's start at 20.0 s"
    )


def test_a_client_that_wrote_no_json_is_named_by_its_log(tmp_path):
    """iperf3 refuses a -t above a day before writing any JSON: its log says so."""
    d = make_run(tmp_path)
    (d / "logs" / "background-long-client.log").write_text(
        "iperf3: parameter error - test duration too long (maximum = 86400 seconds)\nUsage: iperf3 [-s|-c host]\n"
        "[KMG] indicates options that support a K/M/G suffix for kilo-, mega-, or giga-\n"
    )
    d2 = flows_run(tmp_path / "b", [flow("long")], {"long": None}, stopped_after_s=10)
    shutil.copy(d / "logs" / "background-long-client.log", d2 / "logs")
    (e,) = effects_of(d2, "background")
    assert e.verified is False and e.reason.startswith("iperf3 wrote no result: [KMG] indicates")
    assert json.loads((d2 / "traces" / "background" / "flows.json").read_text())["flows"][0]["result"]["error"]


def test_an_older_flows_json_without_a_stop_time_cannot_judge_a_cut_flow(tmp_path):
    d = flows_run(
        tmp_path, [flow("cut", duration=30), flow("full")], {"cut": "tcp_term", "full": "tcp_ok"}, stopped_after_s=2.35
    )
    path = d / "traces" / "background" / "flows.json"
    doc = json.loads(path.read_text())
    del doc["stopped"]
    path.write_text(json.dumps(doc))
    cut, full = effects_of(d, "background")
    assert cut.verified is None and "no stop time" in cut.reason and full.verified is True


def test_flows_asked_for_without_flows_json_were_never_started(tmp_path):
    d = with_spec(make_run(tmp_path), background=[flow("a")])
    (e,) = effects_of(d, "background")
    assert (e.name, e.verified, e.reason) == ("a", False, "no traces/background/flows.json: the flow was never started")


# ---------------------------------------------------------------------------- packet captures


def port_entry(port="tor1-eth3", **kw) -> dict:
    """A ports.json entry as PcapRecorder writes it, after a capture that went well."""
    return {
        "port": port,
        "file": f"{port}.pcap",
        "snaplen_bytes": 128,
        "filter": "tcp",
        "started": 100.5,
        "stopped": 120.5,
        "packets_captured": 1200,
        "packets_dropped": 0,
        "exit_code": 0,
        "terminated": True,
        "error": None,
        **kw,
    }


def pcap_run(tmp_path: Path, entries: list[dict] | None, **pcap) -> Path:
    d = with_spec(
        make_run(tmp_path),
        capture={"pcap": {"ports": ["uplinks"], **pcap}},
        scale=2,
        workload={"compute": {"mode": "emulated"}},
    )
    if entries is not None:
        (d / "traces" / "pcap").mkdir(parents=True)
        (d / "traces" / "pcap" / "ports.json").write_text(json.dumps(entries, indent=1))
    return d


def test_a_port_captured_in_its_window_is_done(tmp_path):
    (e,) = effects_of(pcap_run(tmp_path, [port_entry()], duration_s=10), "capture")
    assert e.verified is True and e.name == "tor1-eth3"
    assert e.asked == {"port": "tor1-eth3", "filter": "tcp", "snaplen_bytes": 128, "start_s": 0.0, "duration_s": 10.0}
    assert e.achieved == {"seconds": 10.0, "packets_captured": 1200, "packets_dropped": 0, "exit_code": 0}


@pytest.mark.parametrize(
    "entry, reason",
    [
        (port_entry(packets_captured=0), "captured no packet (filter 'tcp')"),
        (
            port_entry(
                started=None,
                stopped=None,
                exit_code=None,
                terminated=None,
                packets_captured=None,
                error="capture.pcap: the start 1e+300 s away cannot be scheduled (a timer waits at most 9223372036 s): "
                "tcpdump was not started",
            ),
            "capture.pcap: the start 1e+300 s away cannot be scheduled (a timer waits at most 9223372036 s): "
            "tcpdump was not started",
        ),
        (
            port_entry(started=None, stopped=None, exit_code=None, terminated=None, packets_captured=None),
            "never started: the run ended before its start at 0.0 emulated s",
        ),
        (
            port_entry(exit_code=1, terminated=False, packets_captured=None),
            "tcpdump exited on its own (code 1) before the harness stopped it; see logs/tcpdump-tor1-eth3.log; "
            "tcpdump reported no counts (it was killed before its closing report)",
        ),
        (
            port_entry(exit_code=-9, packets_captured=None),
            "tcpdump did not exit on SIGTERM (killed by signal 9); tcpdump reported no counts "
            "(it was killed before its closing report)",
        ),
    ],
)
def test_a_port_not_captured_says_why(tmp_path, entry, reason):
    (e,) = effects_of(pcap_run(tmp_path, [entry]), "capture")
    assert (e.verified, e.reason) == (False, reason)


def test_older_ports_json_and_a_missing_one(tmp_path):
    old = {k: v for k, v in port_entry().items() if k not in ("exit_code", "terminated", "error")}
    (e,) = effects_of(pcap_run(tmp_path / "old", [old]), "capture")
    assert e.verified is None and "no exit status" in e.reason
    (e,) = effects_of(pcap_run(tmp_path / "none", None), "capture")
    assert (e.name, e.verified) == ("uplinks", False) and "never started" in e.reason


# ---------------------------------------------------------------------------- scheduled events


EVENTS = [
    {"at_s": 3, "link": "uplink:tor1", "bw_mbps": 50},
    {"at_iteration": 4, "host": "h2", "compute_slowdown": 2},
    {"at_iteration": 5, "kill": "worker1"},
    {"at_s": 99, "link": "host:h1", "up": True},
]


def record(index, kind, target, applied=True, **kw) -> dict:
    """A schedule.jsonl record as testbed.event_applier.Schedule writes it."""
    trig = (
        {"at_s": EVENTS[index].get("at_s")}
        if "at_s" in EVENTS[index]
        else {"at_iteration": EVENTS[index]["at_iteration"]}
    )
    return {
        "index": index,
        "kind": kind,
        "target": target,
        **trig,
        "applied": applied,
        "ts": 112.5 if applied else None,
        "emulated_s": 0.25 if applied else None,
        "iteration": 4,
        **kw,
    }


def events_run(tmp_path: Path, records: list[dict], scale=2) -> Path:
    d = with_spec(make_run(tmp_path), events=EVENTS, scale=scale, workload={"compute": {"mode": "emulated"}})
    (d / "schedule.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


RATE = dict(
    bw_mbps=50.0,
    shaped_mbps=25.0,
    rate_tolerance=0.01,
    ifaces=["tor1-eth3", "core1-eth1"],
    readback_mbps={"tor1-eth3": 25.0, "core1-eth1": 25.1},
)


def test_events_applied_and_read_back_are_done(tmp_path):
    d = events_run(
        tmp_path,
        [
            record(0, "link_rate", "uplink:tor1", **RATE),
            record(1, "compute_slowdown", "h2", slowdown=2.0),
            record(2, "kill", "worker1"),
            record(3, "link_up", "host:h1", ifaces=["tor1-eth1"]),
        ],
    )
    got = effects_of(d, "event")
    assert [(e.name, e.verified) for e in got] == [
        ("#0 link_rate uplink:tor1", True),
        ("#1 compute_slowdown h2", True),
        ("#2 kill worker1", True),
        ("#3 link_up host:h1", True),
    ]
    assert got[0].asked == {"at_s": 3.0, "link": "uplink:tor1", "bw_mbps": 50.0}
    assert got[0].achieved["readback_mbps"] == {"tor1-eth3": 50.0, "core1-eth1": 50.2}  # emulated: x scale


def test_an_event_not_done_says_why(tmp_path):
    d = events_run(
        tmp_path,
        [
            record(0, "link_rate", "uplink:tor1", **{**RATE, "readback_mbps": {"tor1-eth3": 25.0, "core1-eth1": 30.0}}),
            record(1, "compute_slowdown", "h2", error="TestbedError: cannot throttle h2"),
            record(3, "link_up", "host:h1", applied=False, iteration=6),
        ],
    )
    got = effects_of(d, "event")
    # the synthetic run (from 99 s): iteration 2, the first measured, starts at 112 s and its last
    # event ends at 155 s: (155 - 112) / scale 2 emulated s
    assert [(e.name, e.verified, e.reason) for e in got] == [
        ("#0 link_rate uplink:tor1", False, "asked 50.0 Mbit/s, read back core1-eth1 60"),
        ("#1 compute_slowdown h2", False, "TestbedError: cannot throttle h2"),
        ("#2 kill worker1", False, "no record in schedule.jsonl"),
        ("#3 link_up host:h1", False, "never reached: the run ended at iteration 6, emulated second 21.5"),
    ]


# ---------------------------------------------------------------------------- processes


def test_processes_done_when_they_exit_0_or_were_killed_on_purpose(tmp_path):
    d = make_run(tmp_path)
    exits = {f"worker{i}": {"exit_code": 0, "killed": None} for i in range(4)}
    exits["worker2"] = {"exit_code": -15, "killed": "was killed by a scheduled event"}
    exits["server0"] = {"exit_code": 0, "killed": None}
    (d / "logs" / "exits.json").write_text(json.dumps(exits))
    got = effects_of(d, "process")
    assert [(e.name, e.verified) for e in got] == [
        (n, True) for n in ("worker0", "worker1", "worker2", "worker3", "server0")
    ]
    assert got[2].asked == {"role": "worker", "host": "h3"}
    assert got[2].achieved == {"exit_code": -15, "killed": "was killed by a scheduled event"}
    exits["worker1"] = {"exit_code": 1, "killed": None}
    exits["worker3"] = {"exit_code": None, "killed": None}
    del exits["server0"]
    (d / "logs" / "exits.json").write_text(json.dumps(exits))
    assert [(e.name, e.reason) for e in effects_of(d, "process") if not e.verified] == [
        ("worker1", "exited with code 1"),
        ("worker3", "still running when the harness stopped watching it"),
        ("server0", "never started: no exit status recorded"),
    ]
    (d / "logs" / "exits.json").unlink()
    assert {(e.verified, e.reason) for e in effects_of(d, "process")} == {
        (None, "no logs/exits.json (an older version): its exit status was not recorded")
    }


def launched(tmp_path: Path, name: str, script: str) -> launch.Launched:
    log = tmp_path / "logs" / f"{name}.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "ab") as f:
        p = subprocess.Popen([sys.executable, "-c", script], stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return launch.Launched({"name": name, "role": "worker", "host": "h1"}, p, log)


def test_watch_records_every_exit_status_when_it_returns_or_raises(tmp_path):
    procs = [launched(tmp_path, "a", "pass"), launched(tmp_path, "b", "import time; time.sleep(30)")]
    procs[1].popen.terminate()  # killed on purpose, as a scheduled kill does
    launch.watch(procs, timeout_s=30, poll_s=0.02, killed=lambda: {"b": "was killed by a scheduled event"})
    assert json.loads((tmp_path / "logs" / "exits.json").read_text()) == {
        "a": {"exit_code": 0, "killed": None},
        "b": {"exit_code": -15, "killed": "was killed by a scheduled event"},
    }
    procs = [launched(tmp_path, "c", "import sys; sys.exit(3)"), launched(tmp_path, "d", "import time; time.sleep(30)")]
    with pytest.raises(RunFailed, match="process c .* exited with code 3"):
        launch.watch(procs, timeout_s=30, poll_s=0.02)
    assert json.loads((tmp_path / "logs" / "exits.json").read_text()) == {
        "c": {"exit_code": 3, "killed": None},
        "d": {"exit_code": -15, "killed": None},
    }  # SIGTERM by kill_all


# ---------------------------------------------------------------------------- shaping, delay and loss


def shaping_doc(errors=(), netem_errors=(), available=True, delay_ms=0.0, loss_pct=0.0, ends=0) -> dict:
    """shaping.json as testbed.network.Network._verify_shaping writes it."""
    return {
        "ends": 12,
        "rate_tolerance": 0.01,
        "errors": list(errors) + list(netem_errors),
        "netem": {
            "available": available,
            "delay_ms": delay_ms,
            "loss_pct": loss_pct,
            "ends": ends,
            "errors": list(netem_errors),
        },
    }


def test_shaping_is_done_when_the_build_read_back_every_end_as_asked(tmp_path):
    d = make_run(tmp_path)
    (d / "shaping.json").write_text(json.dumps(shaping_doc(available=False)))
    shaping, netem = effects_of(d, "shaping") + effects_of(d, "netem")
    assert (shaping.verified, shaping.asked, shaping.achieved) == (
        True,
        {"links": 6, "bw_mbps": [100.0, 200.0]},
        {"ends": 12, "errors": []},
    )
    assert (
        netem.verified is None
        and netem.reason == "the spec asks for no delay or loss; this machine's kernel has no netem"
    )
    assert netem.achieved["available"] is False
    (d / "shaping.json").write_text(json.dumps(shaping_doc(["tor1-eth1: asked 100.0 Mbit/s htb, kernel has {}"])))
    (shaping,) = effects_of(d, "shaping")
    assert shaping.verified is False and shaping.reason == (
        "1 link end(s) not shaped as asked, first tor1-eth1: asked 100.0 Mbit/s htb, kernel has {}"
    )
    (d / "shaping.json").unlink()
    assert effects_of(d, "shaping")[0].verified is None


def test_delay_and_loss_are_done_when_every_end_read_them_back(tmp_path):
    d = with_spec(
        make_run(tmp_path),
        topology={"kind": "rack_core", "delay_ms": 2.0, "loss_pct": 0.5},
        scale=2,
        workload={"compute": {"mode": "emulated"}},
    )
    topo = json.loads((d / "topology.json").read_text())
    for l in topo["links"]:  # as built: delay x scale, read back from each end's netem leaf
        l["shaping"] = {
            l[f"intf{e}"]: {
                "qdisc": "htb",
                "rate_mbps": l["bw_mbps"] / 2,
                "leaf": "netem",
                "delay_ms": 3.999968,
                "loss_pct": 0.5,
            }
            for e in ("1", "2")
        }
    (d / "topology.json").write_text(json.dumps(topo))
    (d / "shaping.json").write_text(json.dumps(shaping_doc(delay_ms=4.0, loss_pct=0.5, ends=12)))
    (netem,) = effects_of(d, "netem")
    assert netem.verified is True and netem.asked == {"delay_ms": 2.0, "loss_pct": 0.5}
    assert netem.achieved["delay_ms"] == pytest.approx([1.999984, 1.999984]) and netem.achieved["loss_pct"] == [
        0.5,
        0.5,
    ]
    bad = "tor1-eth1: asked netem delay 4 ms loss 0.5 %, kernel has {}"
    (d / "shaping.json").write_text(json.dumps(shaping_doc(netem_errors=[bad], delay_ms=4.0, loss_pct=0.5, ends=11)))
    (netem,) = effects_of(d, "netem")
    assert netem.verified is False and netem.reason == f"1 link end(s) without the delay or loss asked, first {bad}"


# ---------------------------------------------------------------------------- the rule


def test_an_ok_run_with_an_effect_not_done_fails_keeping_every_figure(tmp_path):
    fine = flows_run(tmp_path, [flow("a")], {"a": "tcp_ok"}, stopped_after_s=10, name="fine")
    s = metrics.summarize(fine)
    assert s.status == "ok" and s.error is None and s.fidelity.unverified == []
    assert s.fidelity.effects_rule == effects.EFFECTS_RULE
    d = flows_run(
        tmp_path,
        [flow("a"), flow("late", start=500), flow("gone")],
        {"a": "tcp_ok", "late": None, "gone": "refused"},
        stopped_after_s=10,
        name="undone",
    )
    bad = metrics.summarize(d)
    assert bad.fidelity.unverified == [
        "background late: never started during training: it ended 55 emulated s after the launch, before the flow's "
        "start at 500.0 s",
        "background gone: iperf3: unable to connect to server: Connection refused",
    ]
    assert bad.status == "failed" and bad.error == "asked for but not done: " + "\n".join(bad.fidelity.unverified)
    assert bad.throughput.mean == s.throughput.mean and bad.bytes.core == s.bytes.core  # every figure kept
    again = RunSummary.load(d)  # written and read back
    assert again.status == "failed" and [e.verified for e in again.fidelity.effects if e.kind == "background"] == [
        True,
        False,
        False,
    ]
    # a run that already failed keeps the harness's error
    kept = metrics.summarize(d, status="failed", error="process worker0 exited with code 1")
    assert kept.error == "process worker0 exited with code 1" and len(kept.fidelity.unverified) == 2


def test_the_run_line_and_testbed_ls_show_failed_with_the_first_line(tmp_path, capsys):
    from testbed import cli
    from testbed.runner import RunResult, one_line

    d = flows_run(tmp_path / "runs", [flow("late", start=500)], {"late": None}, stopped_after_s=10)
    s = metrics.summarize(d)
    first = (
        "asked for but not done: background late: never started during training: it ended 55 emulated s after "
        "the launch, before the flow's start at 500.0 s"
    )
    assert one_line(RunResult(d, s)) == f"{d}: failed: {first}"
    (d / "logs" / "harness.log").write_text("")
    assert cli.main(["ls", str(tmp_path / "runs")]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[:2] == ["run", "failed"] and line.endswith(first)


def test_a_summary_without_effects_reads_with_defaults_and_one_with_them_round_trips(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "ok", "fidelity": {"cpu_starved": False}}))
    old = RunSummary.load(tmp_path)
    assert old.fidelity.effects == [] and old.fidelity.unverified == [] and old.fidelity.effects_rule is None
    assert "effects" not in old.dump()["fidelity"]
    d = flows_run(tmp_path / "b", [flow("a")], {"a": "tcp_ok"}, stopped_after_s=10)
    doc = metrics.summarize(d).dump()
    assert RunSummary.load(d).dump() == doc and doc["fidelity"]["effects"][0]["kind"] == "background"
