"""Whole-host rates (scope ``machine``): one shared clock per emulated host, across processes
and threads (traffic.hostmodel.machine, traffic.hostmodel.costs, the profiles' scopes)."""

import json
import math
import multiprocessing as mp
import os
import threading
import time
from dataclasses import replace

import pytest
import yaml

from common.errors import SpecError, TestbedError
from testbed.loopback import run_local
from testbed.spec import dump_spec, from_dict
from tests.conftest import experiment
from traffic.hostmodel import RATE_FIELDS, HostModel, HostSpec, available_host_profiles, load_host_profile
from traffic.hostmodel.costs import HostCosts
from traffic.hostmodel.machine import CLOCK_DIR, HostMachine
from traffic.runtime.events import EventLog, read_events
from traffic.schemes.phub.charges import ChargeBatch

MB = 1_000_000
PROCS = 4
CTX = mp.get_context("fork")  # the children run only this module's functions


def _profile(tmp_path, **scopes) -> str:
    """A profile file with every rate stated, ``scopes`` (field -> scope) written."""
    lines = ["description: a test host"]
    for f, v in (
        ("message_overhead_us", 1),
        ("request_startup_ms", 2),
        ("aggregate_gb_per_s", 40),
        ("optimizer_gb_per_s", 24),
        ("codec_gb_per_s", 3),
    ):
        scope = f", scope: {scopes[f]}" if f in scopes else ""
        lines.append(f"{f}: {{value: {v}, source: 'a paper'{scope}}}")
    path = tmp_path / "mine.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ----------------------------------------------------------------------------- the clock


def _reserve_many(run_dir, host, n, budget, barrier, out):
    with HostMachine.for_host(run_dir, host) as m:
        barrier.wait()
        out.put([(r.issued, r.start, r.end) for r in (m.reserve(budget) for _ in range(n))])


def _in_processes(target, args, procs):
    """``target(*args, barrier, out)`` in ``procs`` processes started together; what each put in ``out``."""
    barrier, out = CTX.Barrier(procs), CTX.Queue()
    ps = [CTX.Process(target=target, args=(*args, barrier, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    got = [out.get(timeout=60) for _ in ps]
    for p in ps:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


def _reservations(run_dir, host, procs, n, budget):
    return _in_processes(_reserve_many, (run_dir, host, n, budget), procs)


def test_processes_reserving_on_one_host_queue_one_after_another(tmp_path):
    n, budget = 25, 1.0  # nothing waits: the reservations are arithmetic on the shared clock
    got = _reservations(tmp_path, "pbox", PROCS, n, budget)
    slots = sorted((s for mine in got for s in mine), key=lambda s: s[1])
    assert len(slots) == PROCS * n
    for (_, _, end), (issued, start, nxt) in zip(slots, slots[1:]):
        assert start == pytest.approx(max(issued, end), abs=1e-12)  # FIFO: after the one before, never overlapping
        assert nxt - start == pytest.approx(budget)
    for mine in got:  # each process's own operations in the order it issued them
        assert all(a[2] <= b[1] + 1e-12 for a, b in zip(mine, mine[1:]))
    # all issued long before the first budget ends, so the host is busy throughout: PROCS x n
    # budgets back to back, i.e. the stated rate in total, not PROCS times it
    assert slots[-1][2] - slots[0][1] == pytest.approx(PROCS * n * budget, rel=1e-9)
    assert HostMachine.for_host(tmp_path, "pbox").busy_until() == slots[-1][2]
    assert sorted(os.listdir(tmp_path / CLOCK_DIR)) == ["pbox"]


def test_hosts_have_clocks_of_their_own(tmp_path):
    a, b = HostMachine.for_host(tmp_path, "h1"), HostMachine.for_host(tmp_path, "h2")
    ra, rb = a.reserve(10.0), b.reserve(10.0)
    assert rb.queued_s == 0 and ra.queued_s == 0
    again = HostMachine.for_host(tmp_path, "h1").reserve(1.0)  # joins h1's clock: behind ra
    assert again.start == ra.end and again.queued_s > 9
    assert math.isinf(HostMachine.for_host(tmp_path, "h3").busy_until())


def test_an_idle_clock_is_not_credited(tmp_path):
    m = HostMachine.for_host(tmp_path, "h")
    r1 = m.reserve(0.001)
    time.sleep(0.01)
    r2 = m.reserve(0.001)
    assert r2.start == r2.issued > r1.end and r2.queued_s == 0


@pytest.mark.parametrize("host", ["../x", "a/b", ".hidden", "", None])
def test_a_host_name_that_is_no_plain_name_is_refused(tmp_path, host):
    with pytest.raises(ValueError, match="host name"):
        HostMachine.for_host(tmp_path, host)
    assert not (tmp_path / CLOCK_DIR).exists()


def test_a_symbolic_link_is_not_followed_out_of_the_run_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / CLOCK_DIR).symlink_to(outside)
    with pytest.raises(OSError):
        HostMachine.for_host(run, "h")
    (run / CLOCK_DIR).unlink()
    (run / CLOCK_DIR).mkdir()
    (run / CLOCK_DIR / "h").symlink_to(outside / "h")
    with pytest.raises(OSError):
        HostMachine.for_host(run, "h")
    assert os.listdir(outside) == []


def test_a_bad_budget_is_refused(tmp_path):
    m = HostMachine.for_host(tmp_path, "h")
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="budget"):
            m.reserve(bad)


# ----------------------------------------------------------------------------- charged costs


MACHINE = HostModel(
    aggregate_bytes_per_s=100 * MB, optimizer_bytes_per_s=100 * MB, machine_kinds=frozenset({"aggregate", "optimizer"})
)
PER_PROCESS = HostModel(aggregate_bytes_per_s=100 * MB, optimizer_bytes_per_s=100 * MB)


def _charge_many(run_dir, model, kinds, n, barrier, out):
    costs = HostCosts(model, 1.0, machine=HostMachine.for_host(run_dir, "pbox"))
    barrier.wait()
    t0 = time.monotonic()
    for i in range(n):
        with costs.charge(kinds[i % len(kinds)], nbytes=2 * MB):  # 20 ms each
            pass
    out.put((t0, time.monotonic(), costs.summary()))


def _charge_in_processes(run_dir, model, kinds, n):
    return _in_processes(_charge_many, (run_dir, model, kinds, n), PROCS)


def test_processes_of_one_host_share_a_machine_rate(tmp_path):
    """Aggregation and optimizer of PROCS processes on one clock: together they get the stated
    rate, so the last one finishes no earlier than all their budgets back to back."""
    n, op = 5, 0.020
    got = _charge_in_processes(tmp_path, MACHINE, ("aggregate", "optimizer"), n)
    first, last = min(g[0] for g in got), max(g[1] for g in got)
    assert last - first >= PROCS * n * op * 0.98  # the reservations cannot overlap
    assert last - first < PROCS * n * op * 2.0  # generous: only a bound against a hang
    stats = [g[2] for g in got]
    for s in stats:
        assert s["aggregate"]["count"] + s["optimizer"]["count"] == n
        assert s["aggregate"]["emulated_s"] + s["optimizer"]["emulated_s"] == pytest.approx(n * op)
        assert s["aggregate"]["overruns"] == s["optimizer"]["overruns"] == 0
    # queued: the first round 0 + 1 + ... + (PROCS - 1) budgets; then each operation, issued
    # when the process's one before ends, waits behind the other PROCS - 1 processes' ones
    queued = sum(s[k]["queued_s"] for s in stats for k in ("aggregate", "optimizer"))
    want = op * (PROCS * (PROCS - 1) / 2 + (n - 1) * PROCS * (PROCS - 1))
    assert queued == pytest.approx(want, rel=0.15)


def test_process_scoped_rates_stay_each_processs(tmp_path):
    n, op = 5, 0.020
    got = _charge_in_processes(tmp_path, PER_PROCESS, ("aggregate",), n)
    first, last = min(g[0] for g in got), max(g[1] for g in got)
    assert last - first < PROCS * n * op * 0.6  # concurrent: about n x op, not PROCS x n x op
    assert all("queued_s" not in g[2]["aggregate"] for g in got)
    assert not (tmp_path / CLOCK_DIR / "pbox").stat().st_size  # the clock was never written


def test_threads_of_one_process_share_a_machine_rate(tmp_path):
    n, op, kinds = 4, 0.020, ("aggregate", "optimizer", "aggregate")
    costs = HostCosts(MACHINE, 1.0, machine=HostMachine.for_host(tmp_path, "h"))

    def work(kind):
        for _ in range(n):
            with costs.charge(kind, nbytes=2 * MB):
                pass

    t0 = time.monotonic()
    threads = [threading.Thread(target=work, args=(k,)) for k in kinds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - t0 >= len(kinds) * n * op * 0.98  # the reservations cannot overlap
    s = costs.summary()
    assert s["aggregate"]["count"] == 2 * n and s["optimizer"]["count"] == n
    # after the first round each operation waits behind the other threads' (as for processes)
    k = len(kinds)
    want = op * (k * (k - 1) / 2 + (n - 1) * k * (k - 1))
    assert s["aggregate"]["queued_s"] + s["optimizer"]["queued_s"] == pytest.approx(want, rel=0.2)


def test_a_machine_kind_overruns_only_past_its_reservation(tmp_path):
    m = HostMachine.for_host(tmp_path, "h")
    costs = HostCosts(MACHINE, 1.0, machine=m)
    with costs.charge("aggregate", nbytes=MB) as op:  # budget 10 ms, work 30 ms
        time.sleep(0.030)
    assert op.overrun and op.queued_s == pytest.approx(0, abs=1e-3)
    m.reserve(0.050)  # another process holds the host 50 ms
    with costs.charge("aggregate", nbytes=MB) as op:  # queued ~50 ms: the 30 ms of work fit in
        time.sleep(0.030)
    assert not op.overrun and op.queued_s > 0.040
    s = costs.summary()["aggregate"]
    assert s["overruns"] == 1 and s["budget_s"] == pytest.approx(0.020)


def test_a_process_scoped_kind_ignores_the_clock(tmp_path):
    m = HostMachine.for_host(tmp_path, "h")
    m.reserve(10.0)  # the host is busy for 10 s
    costs = HostCosts(
        HostModel(aggregate_bytes_per_s=100 * MB, codec_bytes_per_s=100 * MB, machine_kinds=frozenset({"aggregate"})),
        1.0,
        machine=m,
    )
    t0 = time.monotonic()
    with costs.charge("codec", nbytes=MB):
        pass
    assert time.monotonic() - t0 < 1.0
    assert not costs.on_machine("codec") and costs.on_machine("aggregate")
    assert HostCosts(MACHINE, 1.0).on_machine("aggregate") is False  # no clock given: per process


def test_charge_batch_reports_the_time_queued(tmp_path):
    m = HostMachine.for_host(tmp_path, "h")
    costs = HostCosts(MACHINE, 1.0, EventLog(tmp_path / "e.jsonl", "p", "server", 0), machine=m)
    m.reserve(0.030)
    with ChargeBatch(costs, "aggregate", frame=1) as batch:
        for _ in range(2):
            with batch.charge(100_000):  # 1 ms each
                pass
    costs.events.close()
    (span,) = [e for e in read_events(tmp_path / "e.jsonl") if e["kind"] == "host_aggregate"]
    assert span["ops"] == 2 and span["queued_s"] == pytest.approx(batch.queued_s) and batch.queued_s > 0.02
    assert span["emulated_s"] == pytest.approx(0.002)


# ----------------------------------------------------------------------------- profiles and spec


@pytest.mark.parametrize("name", ["phub_pbox", "mxnet_kvstore_phub"])
def test_the_dram_derived_rates_are_the_whole_hosts(name):
    prof = load_host_profile(name)
    assert prof.aggregate_gb_per_s.scope == prof.optimizer_gb_per_s.scope == "machine"
    assert prof.codec_gb_per_s.scope == prof.message_overhead_us.scope == "process"
    m = HostSpec(profile=name).resolve()
    assert m.machine_kinds == {"aggregate", "optimizer"}


def test_no_other_shipped_value_is_machine_scoped():
    machine = {
        (n, f) for n in available_host_profiles() for f in RATE_FIELDS if load_host_profile(n)[f].scope == "machine"
    }
    assert machine == {
        (n, f) for n in ("phub_pbox", "mxnet_kvstore_phub") for f in ("aggregate_gb_per_s", "optimizer_gb_per_s")
    }
    assert HostSpec().resolve().machine_kinds == frozenset()


@pytest.mark.parametrize("field", ["message_overhead_us", "request_startup_ms"])
def test_only_a_rate_may_be_machine_scoped(tmp_path, field):
    path = _profile(tmp_path, **{field: "machine"})
    with pytest.raises(TestbedError, match=f"{field}: scope: process"):
        load_host_profile(path)
    with pytest.raises(SpecError) as e:
        from_dict({"host": {"profile": path}})
    assert e.value.field == "host.profile"


def test_a_scope_is_process_or_machine(tmp_path):
    with pytest.raises(TestbedError, match="aggregate_gb_per_s.scope"):
        load_host_profile(_profile(tmp_path, aggregate_gb_per_s="rack"))
    with pytest.raises(SpecError) as e:
        from_dict({"host": {"machine_rates": ["message_overhead_us"]}})
    assert e.value.field.startswith("host.machine_rates")


def test_machine_rates_written_inline_replace_the_profiles_scopes(tmp_path):
    path = _profile(tmp_path, aggregate_gb_per_s="machine", codec_gb_per_s="machine")
    assert HostSpec(profile=path).resolve().machine_kinds == {"aggregate", "codec"}
    assert HostSpec(profile=path, aggregate_gb_per_s=80).resolve().machine_kinds == {"aggregate", "codec"}
    assert HostSpec(profile=path, machine_rates=["optimizer_gb_per_s"]).resolve().machine_kinds == {"optimizer"}
    assert HostSpec(profile=path, machine_rates=[]).resolve().machine_kinds == frozenset()
    assert HostSpec(aggregate_gb_per_s=5, machine_rates=["aggregate_gb_per_s"]).resolve().machine_kinds == {"aggregate"}
    assert HostSpec(machine_rates=["codec_gb_per_s"]).resolve().machine_kinds == {"codec"}  # the reference's rate


def test_a_rate_falling_through_to_the_reference_is_each_processs(tmp_path):
    """The reference profile is one process's measurement: a machine-scoped field whose profile
    states no number resolves to it, per process."""
    path = tmp_path / "partial.yaml"
    path.write_text(
        "description: a test host\n"
        "message_overhead_us: {value: 1, source: 'a paper'}\n"
        "request_startup_ms: {value: 2, source: 'a paper'}\n"
        "aggregate_gb_per_s: {value: 40, source: 'a paper', scope: machine}\n"
        "optimizer_gb_per_s: {value: null, source: 'the paper gives none', scope: machine}\n"
        "codec_gb_per_s: {value: 3, source: 'a paper'}\n"
    )
    m = HostSpec(profile=str(path)).resolve()
    assert m.machine_kinds == {"aggregate"}
    assert m.optimizer_bytes_per_s == load_host_profile("reference").optimizer_gb_per_s.value * 1e9
    assert all(
        load_host_profile("reference")[f].scope == "process"
        for f in ("aggregate_gb_per_s", "optimizer_gb_per_s", "codec_gb_per_s")
    )
    # a number written inline for that field keeps the profile's scope
    assert HostSpec(profile=str(path), optimizer_gb_per_s=5).resolve().machine_kinds == {"aggregate", "optimizer"}


@pytest.mark.parametrize(
    "host",
    [
        {"profile": "phub_pbox"},
        {"profile": "phub_pbox", "machine_rates": ["optimizer_gb_per_s"]},
        {"profile": "phub_pbox", "machine_rates": []},
        {"aggregate_gb_per_s": 5, "machine_rates": ["aggregate_gb_per_s"]},
    ],
)
def test_a_runs_spec_yaml_keeps_the_scopes(host):
    exp = from_dict(
        {"topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 2}, "workload": {"scheme": "ps"}, "host": host}
    )
    before = exp.host.resolve()
    dumped = yaml.safe_load(dump_spec(exp))["host"]
    assert sorted(dumped["machine_rates"]) == sorted(f"{k}_gb_per_s" for k in before.machine_kinds)

    def rates(m):  # read back, every rate's source says "spec"
        return replace(m, sources=None)

    assert rates(HostSpec(**dumped).resolve()) == rates(before)
    assert rates(from_dict({**exp.to_dict(), "host": dumped}).host.resolve()) == rates(before)


# ----------------------------------------------------------------------------- a run


def test_a_runs_server_processes_on_one_host_share_its_clock(tmp_path):
    """PHub NCC puts both server processes on one host: with whole-host rates they charge on
    that host's one clock (results' queued_s), and the values stay exact."""
    exp = experiment(
        "phub",
        iterations=2,
        batch_size=16,
        eval_every=0,
        options={"server_threads": 2},
        servers={"config": "NCC", "interfaces": 2},
    )
    host = {
        "aggregate_gb_per_s": 0.5,
        "optimizer_gb_per_s": 0.5,
        "machine_rates": ["aggregate_gb_per_s", "optimizer_gb_per_s"],
    }
    exp = from_dict({**exp.to_dict(), "host": host})
    run = run_local(exp, tmp_path / "run")
    procs = json.loads((run / "processes.json").read_text())["processes"]
    servers = [p for p in procs if p["role"] == "server"]
    assert len(servers) == 2 and len({p["host"] for p in servers}) == 1
    for p in servers:
        hc = json.loads((run / "results" / f"{p['name']}.json").read_text())["host_costs"]
        assert "queued_s" in hc["aggregate"] and "queued_s" in hc["optimizer"]
        assert "queued_s" not in hc.get("message", {})
    clocks = sorted(os.listdir(run / CLOCK_DIR))
    assert servers[0]["host"] in clocks
    assert set(clocks) <= {p["host"] for p in procs}
