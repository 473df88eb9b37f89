"""The emulated host: stated costs, dilated, overruns counted (traffic.hostmodel, traffic.hostmodel.costs)."""

import threading
import time

import pandas as pd
import pytest
import torch

from common.errors import SpecError, TestbedError
from testbed.loopback import run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from traffic.hostmodel import HostModel, HostSpec, available_host_profiles, load_host_profile
from traffic.hostmodel.costs import HostCosts
from traffic.reference import reference_train
from traffic.rundir import read_json
from traffic.runtime.events import EventLog, read_events

MB = 1_000_000


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_a_stated_cost_takes_scale_times_its_time(scale, tmp_path):
    costs = HostCosts(
        HostModel(aggregate_bytes_per_s=100 * MB), scale, EventLog(tmp_path / "e.jsonl", "p", "server", 0)
    )
    x = torch.ones(1000)
    x.add_(x)  # warm: the first operation of a process may take longer than a budget
    t0 = time.perf_counter()
    for _ in range(5):
        with costs.charge("aggregate", nbytes=2 * MB, iteration=0):  # 20 ms of the emulated host
            x.add_(x)
    took = time.perf_counter() - t0
    assert took == pytest.approx(5 * 0.020 * scale, rel=0.10)
    s = costs.summary()["aggregate"]
    assert s["count"] == 5 and s["modelled"] and s["overruns"] == 0
    assert s["emulated_s"] == pytest.approx(0.1) and s["budget_s"] == pytest.approx(0.1 * scale)
    spans = [e for e in read_events(tmp_path / "e.jsonl") if e["kind"] == "host_aggregate"]
    assert len(spans) == 5 and all(e["emulated_s"] == pytest.approx(0.02) for e in spans)


def test_real_work_beyond_the_budget_is_an_overrun():
    costs = HostCosts(HostModel(optimizer_bytes_per_s=1000 * MB), scale=2.0)
    with costs.charge("optimizer", nbytes=1 * MB):  # budget 2 x 1 ms
        time.sleep(0.030)
    with costs.charge("optimizer", nbytes=1 * MB):
        pass
    s = costs.summary()["optimizer"]
    assert s["count"] == 2 and s["overruns"] == 1
    assert s["overrun_s"] == pytest.approx(0.028, abs=0.006)
    assert s["overrun_fraction"] > 0.05


def test_one_block_charged_as_several_operations():
    costs = HostCosts(HostModel(optimizer_bytes_per_s=1000 * MB, message_overhead_s=50e-6), scale=1.0)
    with costs.charge("optimizer", nbytes=3 * MB, ops=3):  # three 1 MB steps done as one
        pass
    with costs.charge("message", nbytes=300, ops=4):  # four messages' overheads
        pass
    s = costs.summary()
    assert s["optimizer"]["count"] == 3 and s["optimizer"]["emulated_s"] == pytest.approx(0.003)
    assert s["message"]["count"] == 4 and s["message"]["emulated_s"] == pytest.approx(200e-6)
    with costs.charge("optimizer", nbytes=2 * MB, ops=2):  # budget 2 ms: both count as overruns
        time.sleep(0.010)
    assert costs.summary()["optimizer"]["overruns"] == 2
    with pytest.raises(ValueError, match="ops"):
        with costs.charge("optimizer", nbytes=MB, ops=0):
            pass


def test_a_kind_not_modelled_takes_and_reports_its_real_time():
    costs = HostCosts(HostModel(), scale=10.0)
    with costs.charge("codec", nbytes=MB):
        time.sleep(0.02)
    s = costs.summary()["codec"]
    assert not s["modelled"] and s["overruns"] == 0
    assert s["real_s"] == pytest.approx(0.02, abs=0.01) and s["emulated_s"] == pytest.approx(s["real_s"] / 10)


def test_threads_charge_on_their_own_clocks():
    costs = HostCosts(HostModel(request_startup_s=0.05), scale=1.0)

    def serve():
        with costs.charge("request_startup"):
            pass

    t0 = time.perf_counter()
    threads = [threading.Thread(target=serve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.perf_counter() - t0 < 0.05 * 2  # concurrent, not 4 x 50 ms
    assert costs.summary()["request_startup"]["count"] == 4
    with pytest.raises(ValueError, match="unknown host cost kind"):
        with costs.charge("lunch"):
            pass


def test_spec_inline_fields_override_the_profile(tmp_path):
    prof = tmp_path / "mine.yaml"
    prof.write_text(
        "description: a test host\n"
        "message_overhead_us: {value: 12, source: 'measured: scripts/x'}\n"
        "request_startup_ms: {value: 3, source: 'a paper'}\n"
        "aggregate_gb_per_s: {value: 2.5, source: 'a paper'}\n"
        "optimizer_gb_per_s: {value: null, source: 'the paper gives no figure'}\n"
        "codec_gb_per_s: {value: null, source: 'not used'}\n"
    )
    exp = from_dict({"host": {"profile": str(prof), "aggregate_gb_per_s": 5}})
    m = exp.host.resolve()
    assert m.message_overhead_s == pytest.approx(12e-6) and m.request_startup_s == pytest.approx(3e-3)
    assert m.aggregate_bytes_per_s == 5e9
    assert m.sources["aggregate_gb_per_s"] == "spec" and "a paper" in m.sources["request_startup_ms"]
    # a value the profile leaves null is the reference profile's, never "not modelled"
    ref = load_host_profile("reference")
    assert m.optimizer_bytes_per_s == ref["optimizer_gb_per_s"].value * 1e9
    assert m.sources["optimizer_gb_per_s"].startswith("reference measurement (")


@pytest.mark.parametrize(
    "host, field",
    [
        ({"aggregate_gb_per_s": -1}, "host.aggregate_gb_per_s"),
        ({"message_overhead_us": -5}, "host.message_overhead_us"),
        ({"profile": "no_such_host"}, "host.profile"),
        ({"codec_gbps": 1}, "host.codec_gbps"),
    ],
)
def test_bad_host_fields_are_named(host, field):
    with pytest.raises(SpecError) as e:
        from_dict({"host": host})
    assert e.value.field == field


def test_a_malformed_profile_file_names_its_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nmessage_overhead_us: {value: -1, source: s}\n")
    with pytest.raises(TestbedError, match="message_overhead_us"):
        load_host_profile(str(bad))
    with pytest.raises(SpecError) as e:
        from_dict({"host": {"profile": str(bad)}})
    assert e.value.field == "host.profile"


def test_every_shipped_profile_loads_and_states_its_sources():
    names = available_host_profiles()
    for name in names:
        prof = load_host_profile(name)
        for f in (
            "message_overhead_us",
            "request_startup_ms",
            "aggregate_gb_per_s",
            "optimizer_gb_per_s",
            "codec_gb_per_s",
        ):
            assert len(prof[f].source) > 10, (name, f)


def test_ps_with_host_costs_still_equals_the_reference(tmp_path):
    exp = experiment("ps", workers=4, iterations=4, batch_size=16, servers={"count": 2})
    exp = from_dict({**exp.to_dict(), "host": {"aggregate_gb_per_s": 0.5, "optimizer_gb_per_s": 1.0}})
    run = run_local(exp, tmp_path / "run")
    ref = reference_train(exp.workload, 4)
    state = torch.load(run / "params" / "worker0.pt")
    for k in ref:
        torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5)
    servers = [read_json(run / "results" / f"server{i}.json")["host_costs"] for i in range(2)]
    shards = sum(
        len(read_events(run / "events" / f"server{i}.jsonl"))
        and len([e for e in read_events(run / "events" / f"server{i}.jsonl") if e["kind"] == "update"])
        for i in range(2)
    )
    assert sum(s["aggregate"]["count"] for s in servers) == shards == sum(s["optimizer"]["count"] for s in servers)
    assert all(s["aggregate"]["modelled"] for s in servers)


def _iteration_time(run_dir, scale) -> float:
    ev = pd.DataFrame(read_events(run_dir / "events" / "worker0.jsonl"))
    it = ev[(ev.kind == "iteration") & (ev.iteration >= 2)]
    return float(it["dur"].mean()) / scale


def test_iteration_time_agrees_across_scales_with_a_host_cost(tmp_path):
    """The emulated iteration time does not depend on the dilation once host costs dominate."""
    times = {}
    for scale in (1, 4):
        exp = experiment(
            "ps",
            workers=2,
            hosts_per_rack=2,
            iterations=6,
            batch_size=16,
            servers={"count": 1},
            compute={"mode": "emulated", "profile": "zero"},
            eval_every=0,
        )
        exp = from_dict(
            {**exp.to_dict(), "scale": scale, "host": {"aggregate_gb_per_s": 0.02, "optimizer_gb_per_s": 0.05}}
        )
        times[scale] = _iteration_time(run_local(exp, tmp_path / f"s{scale}"), scale)
    # digits_mlp: 1.2 MB of parameters; 2 copies summed at 0.02 GB/s + one update at 0.05 GB/s ~ 0.14 s
    assert times[1] > 0.1
    assert times[4] == pytest.approx(times[1], rel=0.10)


def test_pipe_sgd_charges_every_encode_decode_and_local_sum(tmp_path):
    p, iters, buckets = 3, 3, 1
    exp = experiment(
        "pipe_sgd",
        hosts_per_rack=p,
        model="mnist_mlp",
        workers=p,
        iterations=iters,
        batch_size=8,
        eval_every=0,
        options={"K": 1, "compression": "truncation", "bucket_mb": 100},
    )
    exp = from_dict({**exp.to_dict(), "host": {"codec_gb_per_s": 2.0, "aggregate_gb_per_s": 5.0}})
    run = run_local(exp, tmp_path / "run")
    c = read_json(run / "results" / "worker0.json")["host_costs"]
    # per ring allreduce and member: p encodes, (p - 1) + 1 + (p - 1) decodes, p - 1 local sums
    assert c["codec"]["count"] == iters * buckets * (p + 2 * p - 1)
    assert c["aggregate"]["count"] == iters * buckets * (p - 1)
    assert c["codec"]["modelled"] and c["codec"]["emulated_s"] > 0


def test_a_zero_overhead_is_not_an_overrun():
    """A per-request start-up left at 0 (the default) has nothing to wait for: the work is
    reported at its real time, not as an overrun of a zero budget."""
    costs = HostCosts(HostModel(), scale=10.0)
    with costs.charge("request_startup"):
        time.sleep(0.005)
    s = costs.summary()["request_startup"]
    assert not s["modelled"] and s["overruns"] == 0 and s["count"] == 1


@pytest.mark.parametrize(
    "host", [{"profile": "phub_pbox"}, {"profile": "phub_pbox", "optimizer_gb_per_s": 3, "request_startup_ms": 2}]
)
def test_a_runs_spec_yaml_keeps_the_profiles_rates(host):
    """What a run's spec.yaml holds resolves to the rates the spec resolved to: a rate not
    written inline must not come back as an explicit null that overrides the profile."""
    import yaml

    from testbed.spec import dump_spec

    exp = from_dict(
        {"topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 2}, "workload": {"scheme": "ps"}, "host": host}
    )
    before = exp.host.resolve()
    dumped = yaml.safe_load(dump_spec(exp))["host"]
    after = HostSpec(**dumped).resolve()
    assert before.aggregate_bytes_per_s == after.aggregate_bytes_per_s == 40e9
    assert before.optimizer_bytes_per_s == after.optimizer_bytes_per_s
    assert before.request_startup_s == after.request_startup_s
    assert dumped["profile"] == "phub_pbox"


def test_a_run_is_flagged_by_the_share_of_a_process_time_its_overruns_added():
    from analysis.metrics import host_cost_overrun

    def proc(overrun_s, budget_s, wall_s=None, modelled=True):
        r = {"host_costs": {"aggregate": {"modelled": modelled, "budget_s": budget_s, "overrun_s": overrun_s}}}
        if wall_s is not None:
            r["wall_s"] = wall_s
        return r

    # 12x its budget of 3 ms, but 0.05 % of a 67 s process: not flagged
    assert host_cost_overrun({"server0": proc(0.034, 0.0027, 67.0)}) is False
    # 4 s of a 60 s process (6.7 %): flagged, whatever the others do
    assert host_cost_overrun({"w": proc(0.0, 1.0, 60.0), "s": proc(4.0, 10.0, 60.0)}) is True
    assert host_cost_overrun({"s": proc(2.9, 10.0, 60.0)}) is False  # 4.8 %
    # a kind not modelled does not count
    assert host_cost_overrun({"s": proc(30.0, 1.0, 60.0, modelled=False)}) is False
    # without wall_s: against the budgets (25 % of them)
    assert host_cost_overrun({"s": proc(0.3, 1.2)}) is True
    assert host_cost_overrun({"w": {"iterations": 3}}) is None
