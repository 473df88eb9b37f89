"""Specs that cannot work are refused before anything is built: at validation
(:func:`testbed.spec.from_dict`) or at planning (:func:`testbed.runner.plan_experiment`, on
the topology graph), with exit status 2 from ``testbed run --dry-run`` and a message naming
the field, the value and what is allowed.

One section per class of limit: the shaper's rates, iperf3's limits, ports, bounded numbers,
a bridge's ports, capture windows, duplicate YAML keys and runs too slow to finish.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest
import yaml

from common.errors import SpecError, TestbedError
from common.validation import DuplicateKeyError, load_yaml
from testbed import cli
from testbed.background import BASE_PORT, IPERF3_MAX_TIME_S, plan_flows
from testbed.runner import plan_experiment, time_errors
from testbed.shaping import ShapedIntf
from testbed.spec import MAX_TIMEOUT_S, from_dict, load_spec, with_scale
from topologies.spec import MAX_BRIDGE_PORTS, MAX_DELAY_MS, MAX_RATE_MBPS, MIN_RATE_MBPS
from traffic import rundir, schemes
from traffic.schemes.base import sync_sent_bytes
from traffic.spec import MAX_ITERATIONS, MAX_SEED

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
#: a small valid point: one rack of 4 hosts, 3 iterations of the quick-start model
RACK = {"topology": {"kind": "rack", "hosts_per_rack": 4}, "workload": {"iterations": 3}}


def dry_run(tmp_path: Path, spec: dict | Path, *sets: str) -> tuple[int, str, str]:
    """``testbed run --dry-run SPEC --set ...`` in this process: (exit status, stdout, stderr)."""
    if isinstance(spec, dict):
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
    else:
        path = spec
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(
            ["run", "--dry-run", str(path), *[f"--set={s}" for s in sets], "--runs-dir", str(tmp_path / "runs")]
        )
    assert "Traceback" not in err.getvalue()
    assert not (tmp_path / "runs").exists()  # nothing written
    return rc, out.getvalue(), err.getvalue()


def refused(data: dict, overrides: list[str] | None = None) -> SpecError:
    """The SpecError validation or planning raises for ``data``."""
    with pytest.raises(SpecError) as e:
        plan_experiment(from_dict(data, overrides))
    return e.value


def fields(err: SpecError) -> list[str]:
    return [e.field for e in err.errors]


def with_(base: dict, **sections) -> dict:
    """``base`` with each section's fields updated (one level deep)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for k, v in sections.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


# ---------------------------------------------------------------- link rates inside the shaper's range


def test_a_host_link_below_the_shapers_minimum_is_exit_2_naming_the_field_and_the_range(tmp_path):
    rc, _, err = dry_run(tmp_path, QUICKSTART, "topology.host_bw_mbps=1e-7")
    assert rc == 2
    assert "'topology.host_bw_mbps': got 1e-07" in err
    assert f"at least {MIN_RATE_MBPS:g} Mbit/s" in err and f"[{MIN_RATE_MBPS:g}, {MAX_RATE_MBPS:g}] Mbit/s" in err


@pytest.mark.parametrize(
    "topology, field",
    [
        ({"host_bw_mbps": MIN_RATE_MBPS / 2}, "topology.host_bw_mbps"),
        ({"host_bw_mbps": 0.001, "oversubscription": 20}, "topology.uplink_bw_mbps"),  # derived: 4 x 0.001 / 20
        ({"uplink_bw_mbps": 1e-5}, "topology.uplink_bw_mbps"),
    ],
)
def test_every_link_rate_given_or_derived_is_at_least_the_minimum(topology, field):
    err = refused({"topology": topology})
    assert fields(err) == [field] and "at least 0.0008 Mbit/s" in err.allowed


def test_the_minimum_holds_after_dilation_and_the_build_refuses_the_same_rate():
    base = {"workload": {"compute": {"mode": "emulated"}, "iterations": 3}}
    from_dict({**base, "scale": 1, "topology": {"host_bw_mbps": 0.01}})
    err = refused({**base, "scale": 20, "topology": {"host_bw_mbps": 0.01}})  # 0.0005 Mbit/s shaped
    assert fields(err)[0] == "topology.host_bw_mbps" and "lower scale" in err.allowed
    with pytest.raises(TestbedError, match="outside"):
        ShapedIntf.bwCmds(None, bw=MIN_RATE_MBPS * 0.99)
    ShapedIntf.bwCmds(None, bw=MIN_RATE_MBPS)


def test_a_scheduled_rate_below_the_minimum_is_refused_at_validation():
    events = [{"at_s": 1, "link": "host:h1", "bw_mbps": 1e-5}]
    err = refused(with_(RACK, events=events))
    assert fields(err) == ["events[0].bw_mbps"] and "at least 0.0008 Mbit/s" in err.allowed


def test_with_scale_auto_the_rates_are_checked_again_once_it_is_resolved(monkeypatch):
    # emulated compute: auto resolves from the cost model; here it resolves to 100
    monkeypatch.setattr("testbed.runner.capacity.auto_scale", lambda *a, **k: 100.0)
    spec = {
        "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 0.05},
        "workload": {"compute": {"mode": "emulated"}, "iterations": 3},
    }
    exp = from_dict(spec)  # at scale 1 (the least auto gives) 0.05 Mbit/s is fine
    assert exp.scale == "auto"
    with pytest.raises(SpecError) as e:
        plan_experiment(exp)  # 0.05 / 100 = 0.0005 Mbit/s
    assert fields(e.value) == ["topology.host_bw_mbps"] and "scale 100" in e.value.allowed
    # and a rate no scale can save is refused at once
    err = refused(with_(spec, topology={"host_bw_mbps": 1e-4}))
    assert fields(err) == ["topology.host_bw_mbps"] and "scale 1 " in err.allowed


def test_a_delay_netem_cannot_hold_is_refused():
    err = refused(with_(RACK, topology={"delay_ms": MAX_DELAY_MS * 1.01}))
    assert fields(err)[0] == "topology.delay_ms" and "at most 274878 ms" in err.allowed


# ---------------------------------------------------------------- background flows inside iperf3's limits


def flow(**kw) -> dict:
    return {"src": "bg1", "dst": "bg2", "rate_mbps": 10, "duration_s": 10, **kw}


BG = {"topology": {"background_hosts_per_rack": 1}, "workload": {"iterations": 3}}


@pytest.mark.parametrize(
    "over, field, fragment",
    [
        (flow(rate_mbps=1e-7), "background[0].rate_mbps", "at least 1 bit/s once rounded (-b 0 is no limit"),
        (flow(duration_s=IPERF3_MAX_TIME_S + 1), "background[0].duration_s", "in [1, 86400]"),
        (flow(start_s=600), "background[0].start_s", "below run.timeout_s (600 s)"),
        (flow(start_s=1e300), "background[0].start_s", "below run.timeout_s"),
    ],
)
def test_a_flow_outside_iperf3s_limits_is_refused(over, field, fragment):
    err = refused(with_(BG, background=[over]))
    assert fields(err) == [field] and fragment in err.allowed


def test_iperf3s_limits_hold_after_dilation_at_a_number_and_once_auto_is_resolved(monkeypatch):
    emulated = with_(BG, workload={"compute": {"mode": "emulated"}, "iterations": 3})
    err = refused(with_(emulated, scale=2, background=[flow(duration_s=IPERF3_MAX_TIME_S)]))  # -t 172800
    assert fields(err) == ["background[0].duration_s"]
    err = refused(with_(emulated, scale=4e6, background=[flow(rate_mbps=1)]))  # -b 0.25
    assert "background[0].rate_mbps" in fields(err)
    monkeypatch.setattr("testbed.runner.capacity.auto_scale", lambda *a, **k: 10.0)
    exp = from_dict(with_(emulated, background=[flow(start_s=100, duration_s=1)]))  # fine at 1
    with pytest.raises(SpecError) as e:
        plan_experiment(exp)  # at 10: starts at 1000 s > 600 s
    assert fields(e.value) == ["background[0].start_s"]


def test_an_accepted_flow_plans_an_iperf3_command_inside_its_limits():
    exp = from_dict(with_(BG, background=[flow(rate_mbps=1e-6, duration_s=IPERF3_MAX_TIME_S, start_s=599)]))
    topo = {"hosts": [{"name": "bg1", "ip": "10.0.0.9"}, {"name": "bg2", "ip": "10.0.0.10"}]}
    (fp,) = plan_flows(exp.background, topo, scale=1.0)
    assert fp.shaped_bps == 1 and fp.seconds == IPERF3_MAX_TIME_S and fp.delay_s < exp.run.timeout_s


# ---------------------------------------------------------------- ports that cannot clash


def test_the_rendezvous_port_cannot_be_a_background_flows_iperf3_port(tmp_path):
    spec = with_(BG, background=[flow(), flow(src="bg2", dst="bg1")])
    rc, _, err = dry_run(tmp_path, spec, f"run.master_port={BASE_PORT + 1}")
    assert rc == 2 and "'run.master_port': got 5202" in err and "background[1]'s iperf3 server listens on 5202" in err
    assert dry_run(tmp_path, spec, f"run.master_port={BASE_PORT + 2}")[0] == 0
    assert dry_run(tmp_path, RACK, f"run.master_port={BASE_PORT}")[0] == 0  # no flows: 5201 is free


# ---------------------------------------------------------------- bounded seeds, timeouts and counts


@pytest.mark.parametrize(
    "override, field",
    [
        ("workload.seed=-1", "workload.seed"),
        ("workload.seed=4294967296", "workload.seed"),
        ("workload.seed=1000000000000000000000000000000", "workload.seed"),
        (f"workload.iterations={MAX_ITERATIONS + 1}", "workload.iterations"),
        ("run.timeout_s=1e12", "run.timeout_s"),
        ("topology.max_queue_packets=4294967296", "topology.max_queue_packets"),
        ("topology.tcp_notsent_lowat_bytes=4294967296", "topology.tcp_notsent_lowat_bytes"),
        ("topology.tcp_min_tso_segs=256", "topology.tcp_min_tso_segs"),  # the kernel keeps one byte
        ("topology.tcp_min_tso_segs=0", "topology.tcp_min_tso_segs"),
        ("topology.tcp_congestion_control=dctcp", "topology.tcp_congestion_control"),  # not on this kernel
        ("capture.interval_ms=1000000", "capture.interval_ms"),  # 1000 s > run.timeout_s 240 s
        ("capture.cpu_interval_ms=9223372036854775807", "capture.cpu_interval_ms"),
        ("capture.endpoints_interval_ms=1000000000", "capture.endpoints_interval_ms"),
        ("host.message_overhead_us=1e12", "host.message_overhead_us"),
        ("host.request_startup_ms=1e12", "host.request_startup_ms"),
        ("host.aggregate_gb_per_s=1e-15", "host.aggregate_gb_per_s"),  # 4 bytes take 4e6 s
        ("events=[{at_s: 1e12, link: 'host:h1', bw_mbps: 10}]", "events[0].at_s"),
        ("events=[{at_s: 240, kill: worker1}]", "events[0].at_s"),
    ],
)
def test_numbers_that_would_crash_or_hang_the_run_are_exit_2_naming_the_field(tmp_path, override, field):
    rc, _, err = dry_run(tmp_path, QUICKSTART, override)
    assert rc == 2 and f"'{field}'" in err, err


def test_the_bounds_themselves_are_accepted():
    exp = from_dict(
        {
            "workload": {"seed": MAX_SEED, "iterations": MAX_ITERATIONS},
            "run": {"timeout_s": MAX_TIMEOUT_S},
            "topology": {
                "max_queue_packets": 2**32 - 1,
                "tcp_notsent_lowat_bytes": 2**32 - 1,
                "tcp_min_tso_segs": 255,
                "tcp_congestion_control": "reno",
            },
        }
    )
    assert exp.workload.seed == 2**32 - 1
    assert from_dict({"workload": {"seed": 0}}).workload.seed == 0


def test_min_tso_segs_with_bbr_is_refused_naming_the_field(tmp_path):
    # BBR sizes its packets itself: the sysctl would be set and change nothing
    rc, _, err = dry_run(tmp_path, QUICKSTART, "topology.tcp_congestion_control=bbr", "topology.tcp_min_tso_segs=44")
    assert rc == 2 and "'topology.tcp_min_tso_segs'" in err and "cubic or reno" in err, err


def test_a_capture_period_or_an_event_is_checked_against_the_runs_own_timeout():
    # the same period is fine with a longer run
    from_dict({"capture": {"interval_ms": 1_000_000}, "run": {"timeout_s": 1001}})
    err = refused({"capture": {"qdisc_interval_ms": 700_000}})  # 700 s > 600 s
    assert fields(err) == ["capture.qdisc_interval_ms"] and "at most run.timeout_s (600 s)" in err.allowed
    from_dict({"capture": {"qdisc": False, "qdisc_interval_ms": 700_000}})  # off: not waited for
    from_dict(with_(RACK, events=[{"at_s": 599.5, "link": "host:h1", "bw_mbps": 5}]))  # real compute: 599.5 s
    emulated = with_(RACK, workload={"compute": {"mode": "emulated"}, "iterations": 3})
    err = refused(with_(emulated, scale=2, events=[{"at_s": 300, "link": "host:h1", "bw_mbps": 5}]))
    assert fields(err) == ["events[0].at_s"] and "at_s x scale 2 = 600 s" in err.allowed


# ---------------------------------------------------------------- a bridge's ports


@pytest.mark.parametrize(
    "topology, field, switch",
    [
        ({"kind": "rack", "hosts_per_rack": 1024}, "topology.hosts_per_rack", "tor1 would have 1024"),
        (
            {"racks": 2, "hosts_per_rack": 16, "interfaces_per_host": 64},
            "topology.hosts_per_rack",
            "tor1 would have 1025",
        ),
        (
            {"racks": 2, "hosts_per_rack": 1000, "background_hosts_per_rack": 23},
            "topology.hosts_per_rack",
            "tor2 would have 1024",
        ),
        ({"racks": 1024, "hosts_per_rack": 1}, "topology.racks", "core1 would have 1024"),
    ],
)
def test_a_switch_with_more_ports_than_a_linux_bridge_takes_is_refused_at_planning(topology, field, switch):
    exp = from_dict({"topology": topology, "workload": {"workers": 1, "iterations": 3}})  # valid as a spec
    with pytest.raises(SpecError) as e:
        plan_experiment(exp)
    assert fields(e.value) == [field] and switch in e.value.allowed and f"at most {MAX_BRIDGE_PORTS}" in e.value.allowed


def test_the_schemes_hosts_count_on_their_tor_and_a_full_bridge_is_accepted():
    spec = {"topology": {"kind": "rack", "hosts_per_rack": 1022}, "workload": {"workers": 1, "iterations": 3}}
    plan_experiment(from_dict(spec))  # 1022 ports
    with pytest.raises(SpecError) as e:  # two dedicated server hosts: 1024
        plan_experiment(from_dict(spec, ["workload.servers.count=2", "workload.servers.placement=dedicated"]))
    assert fields(e.value) == ["topology.hosts_per_rack"] and "tor1 would have 1024" in e.value.allowed


def test_the_bridge_check_shows_in_a_dry_run(tmp_path):
    rc, _, err = dry_run(tmp_path, QUICKSTART, "topology.hosts_per_rack=1100")
    assert rc == 2 and "'topology.hosts_per_rack': got 1100" in err and "tor1 would have 1101" in err


# ---------------------------------------------------------------- capture windows inside the run


@pytest.mark.parametrize(
    "pcap, field",
    [
        ({"ports": ["uplinks"], "start_s": 1e12}, "capture.pcap.start_s"),
        ({"ports": ["uplinks"], "start_s": 600}, "capture.pcap.start_s"),
        ({"ports": ["uplinks"], "duration_s": 1e12}, "capture.pcap.duration_s"),
    ],
)
def test_a_capture_window_outside_the_run_is_refused(pcap, field):
    err = refused({"workload": {"iterations": 3}, "capture": {"pcap": pcap}})
    assert fields(err) == [field] and "run.timeout_s (600 s)" in err.allowed


def test_a_capture_window_is_dilated_before_it_is_compared(tmp_path):
    base = {"workload": {"iterations": 3, "compute": {"mode": "emulated"}}, "capture": {"pcap": {"ports": ["uplinks"]}}}
    from_dict(base, ["capture.pcap.start_s=100", "scale=5"])  # 500 s
    err = refused(base, ["capture.pcap.start_s=100", "scale=6"])  # 600 s
    assert fields(err) == ["capture.pcap.start_s"]
    rc, _, err = dry_run(tmp_path, QUICKSTART, "capture.pcap={ports: [uplinks], start_s: 1e12}")
    assert rc == 2 and "'capture.pcap.start_s': got 1000000000000.0" in err


# ---------------------------------------------------------------- duplicate YAML keys


def test_a_key_given_twice_in_a_spec_file_names_its_path_both_lines_and_the_file(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text(
        "name: dup\ntopology:\n  kind: rack\n  hosts_per_rack: 4\n  kind: rack_core\nworkload: {iterations: 3}\n"
    )
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "topology.kind"
    assert e.value.allowed == f"each key once (lines 3 and 5 of {p})"
    rc, _, err = dry_run(tmp_path, p)
    assert rc == 2 and "'topology.kind'" in err and "lines 3 and 5" in err


def test_a_key_given_twice_in_a_list_item_or_a_set_value_names_its_path():
    with pytest.raises(DuplicateKeyError) as e:
        load_yaml("background:\n- {src: h1, dst: h2}\n- {src: h1, dst: h2, dst: h3}\n")
    assert e.value.field == "background[1].dst" and "lines 3 and 3" in e.value.allowed
    with pytest.raises(SpecError) as e:
        from_dict({}, ["workload.options={overlap: true, overlap: false}"])
    assert e.value.field == "workload.options.overlap" and "--set value" in e.value.allowed


def test_a_duplicate_key_is_an_error_in_a_runs_spec_yaml_too(tmp_path):
    run = rundir.create(tmp_path, "r")
    (run / "spec.yaml").write_text("scale: 1\nscale: 2\n")
    with pytest.raises(TestbedError, match=r"'scale'.*lines 1 and 2 of .*spec.yaml"):
        rundir.read_spec(run)


def test_load_yaml_keeps_its_other_behaviour():
    assert load_yaml("a: 1e12\nb: [1E-3]\n") == {"a": 1e12, "b": [1e-3]}
    # a merge key's values may be overridden (YAML's merge, not a repeated key)
    assert load_yaml("base: &b {x: 1, y: 2}\nm: {<<: *b, x: 3}\n")["m"] == {"x": 3, "y": 2}
    with pytest.raises(yaml.YAMLError, match="nested at most 32"):
        load_yaml("a: " + "[" * 40 + "]" * 40)
    with pytest.raises(DuplicateKeyError):  # 1 and true are the same key of a Python mapping
        load_yaml("{1: a, true: b}")


# ---------------------------------------------------------------- runs too slow to finish


def test_a_link_too_slow_for_the_run_is_exit_2_with_the_estimate(tmp_path):
    rc, _, err = dry_run(tmp_path, QUICKSTART, "topology.host_bw_mbps=1")
    assert rc == 2 and "'topology.host_bw_mbps': got 1.0" in err
    # 60 iterations x 7 hosts x 1,204,264 bytes (digits_mlp's float32 gradient) x 8 / (8 links x 1 Mbit/s)
    assert "at least 505.8 s of wall clock" in err and "at least 2.107 Mbit/s" in err and "(240 s)" in err
    assert dry_run(tmp_path, QUICKSTART, "topology.host_bw_mbps=2.2")[0] == 0


def test_the_estimate_is_a_lower_bound_with_its_arithmetic():
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 1},
            "workload": {"scheme": "allreduce", "iterations": 100},
            "run": {"timeout_s": 10_000},
        }
    )
    (pr,) = plan_experiment(exp)
    assert time_errors(pr.exp, pr.hosts, pr.processes) == []
    grad = 4 * 301_066  # digits_mlp
    assert schemes.get("allreduce").min_sent_bytes(exp.workload, pr.processes) == 3 * grad
    need = 100 * 3 * grad * 8 / (4 * 1e6)  # 722.6 s
    tight = from_dict(pr.exp.to_dict(), [f"run.timeout_s={need * 0.99}"])
    (err,) = time_errors(tight, pr.hosts, pr.processes)
    assert err.field == "topology.host_bw_mbps" and f"{need:.4g} s" in err.allowed
    # a scheduled event that speeds the links up counts: the bound takes the fastest rate
    faster = from_dict(tight.to_dict(), ["events=[{at_iteration: 1, link: 'host:h1', bw_mbps: 2}]"])
    assert time_errors(faster, pr.hosts, pr.processes) == []


def test_the_bound_counts_hosts_not_workers_and_each_job_apart():
    assert sync_sent_bytes([["h1", "h2", "h3", "h4"]], 10) == 30
    assert sync_sent_bytes([["h1", "h1"]], 10) == 0  # on one host nothing must cross a link
    assert sync_sent_bytes([["h1", "h2"], ["h3", "h4"]], 10) == 20
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 4},
            "workload": {"scheme": "phub", "iterations": 3, "options": {"jobs": 2}},
        }
    )
    (pr,) = plan_experiment(exp)
    assert schemes.get("phub").min_sent_bytes(exp.workload, pr.processes) == 2 * 4 * 301_066


@pytest.mark.parametrize("compression, element_bytes", [("none", 4), ("truncation", 2), ("quantization", 1)])
def test_pipe_sgds_compression_lowers_the_bound_by_its_ratio(compression, element_bytes):
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 4},
            "workload": {"scheme": "pipe_sgd", "iterations": 3, "options": {"compression": compression}},
        }
    )
    (pr,) = plan_experiment(exp)
    assert schemes.get("pipe_sgd").min_sent_bytes(exp.workload, pr.processes) == 3 * element_bytes * 301_066


def test_stanza_counts_its_conv_layers_and_real_compute_the_model_built_for_the_data():
    from traffic.models import model_info

    info = model_info("digits_cnn")
    conv = 4 * sum(info["layer_numels"][: info["split_index"]])
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 4},
            "workload": {"scheme": "stanza", "model": "digits_cnn", "iterations": 3},
        }
    )
    (pr,) = plan_experiment(exp)
    assert schemes.get("stanza").min_sent_bytes(exp.workload, pr.processes) == 2 * conv  # 3 CONV workers
    # real compute on digits: vgg19 is built for 64 features, fewer parameters than at 224 x 224
    real = from_dict({"workload": {"model": "vgg19", "iterations": 3}})
    emulated = from_dict({"scale": 1, "workload": {"model": "vgg19", "iterations": 3, "compute": {"mode": "emulated"}}})
    (r,), (e,) = plan_experiment(real), plan_experiment(emulated)
    assert (
        0
        < schemes.get("ps").min_sent_bytes(real.workload, r.processes)
        < schemes.get("ps").min_sent_bytes(emulated.workload, e.processes)
    )


def test_a_program_whose_traffic_is_unknown_is_not_checked():
    assert schemes.get("program").min_sent_bytes(None, []) is None
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 0.001},
            "workload": {"program": {"command": ["python", "-c", "pass"]}},
        }
    )
    plan_experiment(exp)


def test_with_auto_the_time_is_estimated_at_the_resolved_scale(monkeypatch):
    spec = {
        "topology": {"kind": "rack", "hosts_per_rack": 4, "host_bw_mbps": 100},
        "workload": {"compute": {"mode": "emulated"}, "iterations": 100},
    }
    monkeypatch.setattr("testbed.runner.capacity.auto_scale", lambda *a, **k: 1.0)
    plan_experiment(from_dict(spec))
    monkeypatch.setattr("testbed.runner.capacity.auto_scale", lambda *a, **k: 2000.0)
    with pytest.raises(SpecError) as e:  # 100 x 3 x 1.2 MB x 8 / (4 x 0.05 Mbit/s) = 14,451 s
        plan_experiment(from_dict(spec))
    assert fields(e.value) == ["topology.host_bw_mbps"] and "scale 2000" in e.value.allowed


# ---------------------------------------------------------------- shipped specs


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_experiment_is_still_planned(path):
    planned = plan_experiment(load_spec(path))
    assert planned and all(isinstance(pr.exp.scale, float) and math.isfinite(pr.exp.scale) for pr in planned)
    for pr in planned:
        assert with_scale(pr.exp, pr.exp.scale) is not None
