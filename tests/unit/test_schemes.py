"""The schemes: process plans, key assignment, and end-to-end training equal to the reference.

End-to-end cases run 4 workers (plus servers) on loopback with real gloo communication
for a few iterations and compare every worker's final parameters with a single process
trained on the same global batches (:mod:`traffic.reference`).
"""

from __future__ import annotations

import pytest
import torch

from common.errors import SpecError
from testbed.loopback import local_entries, run_local
from testbed.spec import from_dict
from tests.conftest import assert_server_shards_match, experiment
from topologies import HostInfo, TopologySpec
from traffic.reference import reference_train
from traffic.runtime.events import read_events
from traffic.schemes import available, get
from traffic.schemes.allreduce import make_buckets
from traffic.schemes.ps import assign_keys

REQUIRED = {"proc", "role", "rank", "thread", "kind", "ts", "dur", "iteration", "layer"}
COMM_KINDS = {"push", "pull", "allreduce", "send", "recv", "broadcast", "all_gather"}


# ----------------------------------------------------------------------------- plans


def _hosts(racks=2, per_rack=4, servers=()):
    hosts = [HostInfo(f"h{r * per_rack + i + 1}", r) for r in range(racks) for i in range(per_rack)]
    return hosts + [HostInfo(f"ps{j + 1}", r, "server") for j, r in enumerate(servers)]


def _workload(**kw):
    return from_dict({"workload": {"scheme": "ps", **kw}}).workload


def _servers(plan):
    return [(p.name, p.host) for p in plan if p.role == "server"]


def test_plan_colocated_global_spreads_over_racks():
    ps = get("ps")
    plan = ps.plan(_workload(servers={"count": 2}), _hosts())
    assert [(p.name, p.host) for p in plan if p.role == "worker"] == [(f"worker{i}", f"h{i + 1}") for i in range(8)]
    assert _servers(plan) == [("server0", "h1"), ("server1", "h5")]
    # count 0: one server per worker host
    plan = ps.plan(_workload(servers={"count": 0}), _hosts())
    assert sorted(h for _, h in _servers(plan)) == sorted(f"h{i + 1}" for i in range(8))
    # workers: 4 -> only the first 4 hosts (all in rack 0) are used
    plan = ps.plan(_workload(workers=4, servers={"count": 2}), _hosts())
    assert [p.host for p in plan if p.role == "worker"] == ["h1", "h2", "h3", "h4"]
    assert _servers(plan) == [("server0", "h1"), ("server1", "h2")]  # one rack: the first hosts
    with pytest.raises(SpecError, match="servers.count"):
        ps.plan(_workload(workers=4, servers={"count": 5}), _hosts())
    with pytest.raises(SpecError, match="workload.workers"):
        ps.plan(_workload(workers=9), _hosts())


def test_plan_per_rack_and_dedicated():
    ps = get("ps")
    plan = ps.plan(_workload(servers={"count": 1, "scope": "per_rack"}), _hosts())
    assert _servers(plan) == [("server0", "h1"), ("server1", "h5")]
    plan = ps.plan(_workload(servers={"count": 2, "scope": "per_rack"}), _hosts())
    assert _servers(plan) == [("server0", "h1"), ("server1", "h3"), ("server2", "h5"), ("server3", "h7")]

    w = _workload(servers={"count": 2, "placement": "dedicated"})
    assert [r.rack for r in ps.hosts(w, TopologySpec(racks=2))] == [0, 1]
    plan = ps.plan(w, _hosts(servers=[0, 1]))
    assert _servers(plan) == [("server0", "ps1"), ("server1", "ps2")]
    assert len([p for p in plan if p.role == "worker"]) == 8  # server hosts run no worker
    w = _workload(servers={"count": 2, "placement": "dedicated", "scope": "per_rack"})
    assert [r.rack for r in ps.hosts(w, TopologySpec(racks=2))] == [0, 0, 1, 1]
    # the local launcher builds the same hosts from the topology
    exp = from_dict(
        {"workload": {"scheme": "ps", "servers": {"count": 1, "placement": "dedicated", "scope": "per_rack"}}}
    )
    entries = local_entries(exp)
    assert [(e["name"], e["host"]) for e in entries if e["role"] == "server"] == [
        ("server0", "ps1"),
        ("server1", "ps2"),
    ]
    assert all(e["ip"] == "127.0.0.1" and e["iface"] == "lo" for e in entries)
    # schemes without servers ignore the servers section
    ar = get("allreduce")
    assert ar.hosts(w, TopologySpec(racks=2)) == []
    assert {p.role for p in ar.plan(w, _hosts())} == {"worker"}


def test_registry_and_options():
    assert {"ps", "allreduce"} <= set(available())
    with pytest.raises(SpecError, match="workload.options.nope"):
        from_dict({"workload": {"scheme": "ps", "options": {"nope": 1}}})
    from_dict({"workload": {"scheme": "ps", "options": {"bigarray_bound": 10}}})
    from_dict({"workload": {"scheme": "allreduce", "options": {"bucket_mb": 0}}})


# ----------------------------------------------------------------------------- keys, buckets


def test_assign_keys_splits_big_keys_and_balances_small_ones():
    numels = [32768, 512, 262144, 512, 5120, 10]
    one = assign_keys(numels, 1)
    assert [(s.key, s.server, s.lo, s.hi) for s in one] == [(k, 0, 0, n) for k, n in enumerate(numels)]
    # big key (>= bound) split evenly over all servers, the rest to the least loaded server
    shards = assign_keys(numels, 3, bigarray_bound=100000)
    big = [s for s in shards if s.key == 2]
    assert [(s.server, s.lo, s.hi) for s in big] == [(0, 0, 87381), (1, 87381, 174762), (2, 174762, 262144)]
    small = {s.key: s.server for s in shards if s.key != 2}
    assert small == {0: 0, 1: 1, 3: 2, 4: 1, 5: 2}
    assert [s.id for s in shards] == list(range(len(shards)))
    for k, n in enumerate(numels):  # every element in exactly one shard
        cover = sorted((s.lo, s.hi) for s in shards if s.key == k)
        assert cover[0][0] == 0 and cover[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
    # equal keys: round robin
    assert [s.server for s in assign_keys([100] * 6, 3)] == [0, 1, 2, 0, 1, 2]
    # the default bound is MXNet's 1,000,000
    assert len(assign_keys([999_999], 2)) == 1 and len(assign_keys([1_000_000], 2)) == 2
    with pytest.raises(ValueError):
        assign_keys(numels, 0)


def test_make_buckets():
    sizes = [400, 100, 300, 200]
    assert make_buckets(sizes, 0) == [[3], [2], [1], [0]]
    assert make_buckets(sizes, 1) == [[3, 2, 1, 0]]
    assert make_buckets(sizes, 500 / 2**20) == [[3, 2], [1, 0]]
    assert make_buckets(sizes, 450 / 2**20) == [[3], [2, 1], [0]]
    with pytest.raises(ValueError):
        make_buckets(sizes, -1)


# ----------------------------------------------------------------------------- end to end

W, ITERS, BATCH = 4, 5, 16
CASES = {
    "ps-1server": ("ps", {"servers": {"count": 1}}),
    # bound below the 512x512 weight: that key is split over both servers
    "ps-2servers-split": ("ps", {"servers": {"count": 2}, "options": {"bigarray_bound": 100000}}),
    "ps-server-per-worker": ("ps", {"servers": {"count": 0}}),
    "allreduce": ("allreduce", {"options": {"bucket_mb": 0.5}}),
}


def _experiment(scheme, extra):
    return experiment(scheme, timeout_s=180, workers=W, iterations=ITERS, batch_size=BATCH, **extra)


@pytest.fixture(scope="module")
def reference():
    """Reference state dict (identical workload apart from the scheme) and the initial one."""
    exp = _experiment("ps", {})
    from traffic.data import load_dataset
    from traffic.models import build_model

    d = load_dataset("digits", 3)
    init = build_model("digits_mlp", 3, d.input_shape, d.num_classes).state_dict()
    return reference_train(exp.workload, W), init


def _check_events(run_dir, exp, n_servers):
    n_params = 301066  # 64*512+512 + 512*512+512 + 512*10+10
    workers = [read_events(run_dir / "events" / f"worker{w}.jsonl") for w in range(W)]
    for w, events in enumerate(workers):
        assert all(REQUIRED <= set(e) for e in events)
        assert all(e["proc"] == f"worker{w}" and e["role"] == "worker" for e in events)
        its = [e for e in events if e["kind"] == "iteration"]
        assert [e["iteration"] for e in its] == list(range(ITERS))
        assert all(e["samples"] == BATCH and e["dur"] > 0 for e in its)
        for kind in ("forward", "backward"):
            assert sorted((e["iteration"], e["layer"]) for e in events if e["kind"] == kind) == [
                (i, l) for i in range(ITERS) for l in range(3)
            ]
        comm = [e for e in events if e["kind"] in COMM_KINDS]
        assert comm and all(isinstance(e["bytes"], int) and e["bytes"] > 0 for e in comm)
        for it in range(ITERS):
            if exp.workload.scheme == "ps":
                for kind, d in (("push", "tx"), ("pull", "rx")):
                    evs = [e for e in comm if e["kind"] == kind and e["iteration"] == it]
                    assert all(e["dir"] == d and e["peer"] >= W for e in evs)  # servers come after workers
                    assert sum(e["bytes"] for e in evs) == 4 * n_params
            else:
                evs = [e for e in comm if e["kind"] == "allreduce" and e["iteration"] == it]
                assert sum(e["bytes"] for e in evs) == 4 * n_params
                assert all(e["group_size"] == W for e in evs)
    evals = [e for e in workers[0] if e["kind"] == "eval"]
    assert [e["iteration"] for e in evals] == [1, 3, ITERS - 1] and evals[-1]["final"]
    assert all(0 <= e["accuracy"] <= 1 and e["loss"] > 0 for e in evals)
    assert not any(e["kind"] == "eval" for ws in workers[1:] for e in ws)
    for s in range(n_servers):
        events = read_events(run_dir / "events" / f"server{s}.jsonl")
        assert not any(e["kind"] == "iteration" for e in events)
        rx = [e for e in events if e["kind"] == "push"]
        tx = [e for e in events if e["kind"] == "pull"]
        assert len(rx) == len(tx) and all(e["bytes"] > 0 for e in rx + tx)
        assert {e["peer"] for e in rx} <= set(range(W)) and {e["dir"] for e in tx} <= {"tx"}


@pytest.mark.parametrize("case", list(CASES))
def test_scheme_matches_reference(case, tmp_path, reference):
    scheme, extra = CASES[case]
    exp = _experiment(scheme, extra)
    ref, init = reference
    run_dir = run_local(exp, tmp_path / case)

    moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
    assert moved > 1e-2, "the reference must move far beyond the tolerance for the test to mean anything"
    for w in range(W):
        state = torch.load(run_dir / "params" / f"worker{w}.pt")
        assert set(state) == set(ref)
        for k in ref:
            torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"{case} worker{w} {k}")

    n_servers = sum(1 for e in local_entries(exp) if e["role"] == "server")
    assert n_servers == {"ps-1server": 1, "ps-2servers-split": 2, "ps-server-per-worker": W, "allreduce": 0}[case]
    if n_servers:  # the servers' shards reassemble into the reference too
        assert_server_shards_match(run_dir, ref, n_servers)

    from traffic.rundir import read_json

    res = read_json(run_dir / "results" / "worker0.json")
    assert res["proc"] == "worker0" and res["iterations"] == ITERS and res["wall_s"] > 0
    assert 0 <= res["final_accuracy"] <= 1 and res["final_loss"] > 0
    _check_events(run_dir, exp, n_servers)
