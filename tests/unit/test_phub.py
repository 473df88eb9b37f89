"""PHub: chunk mapping, equivalence with the reference, hierarchical cross-rack bytes, tokens.

End-to-end cases run ``digits_mlp`` (keys of 32768, 512, 262144, 512, 5120, 10 elements) on
loopback (real gloo) for a few iterations and compare every worker's final parameters with a
single process trained on the same global batches (:mod:`traffic.reference`): PHub is a
synchronous PS, so they must agree to float tolerance, whatever the chunking, threads,
server processes, hierarchy or tenancy.

* **Chunk -> (interface, thread) is fixed** (PHub Sec. 3.2.4): from the servers' events,
  every ``push`` received for a chunk, in every iteration and from every worker, is received
  by the same server process on the same thread (``srv<t>``), the one :func:`assign_chunks`
  gives it; and every worker sends each chunk to that process.
* **Hierarchical reduction moves 1/N of the flat cross-rack bytes** (Sec. 3.4): two racks of
  N = 2 workers, one PBox per rack. Cross-rack bytes are counted from the events: every
  transfer a process sent (``dir`` tx) during training to a process on a host of another
  rack (hosts from ``processes.json``, racks as ``run_local`` fakes them: ``h1, h2`` rack 0,
  ``h3, h4`` rack 1, ``ps1`` rack 0, ``ps2`` rack 1). Flat: a worker's push and the reply
  of each chunk held by the other rack's PBox (payload + 8 bytes of metadata each way).
  Hierarchical: the two PBoxes' ring transfers, ``2(R-1) = 2`` blocks summing to one frame
  per PBox. Both are checked exactly, and their ratio is 1/N up to the metadata.
* **Wrong token** (Sec. 3.1): two jobs of two workers share the server; worker 4 intrudes
  on job 0 with a made-up token. Each server counts one refused connection and one refused
  push per job-0 chunk it owns per iteration; both jobs still equal the 2-worker reference
  (nothing of the intruder was applied) and the intruder, refused every pull, ends with its
  initial parameters.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import yaml

from analysis.paper_models.phub import (
    PAPER_TABLE2,
    bandwidth_lower_bounds,
    cross_rack_bytes,
    hierarchical_pays,
    hierarchical_terms,
    table2,
)
from common.errors import SpecError
from testbed.loopback import local_hosts, run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from topologies.hosts import HostInfo
from topologies.spec import TopologySpec
from traffic import schemes
from traffic.models import build_model
from traffic.reference import reference_train
from traffic.runtime.events import read_events
from traffic.schemes.phub import FRAME_BYTES, META, PHubOptions, assign_chunks, job_groups, lpt, pack_frames

ITERS, BATCH = 3, 16
NUMELS = [32768, 512, 262144, 512, 5120, 10]  # digits_mlp's keys
LAYER_OF_KEY = [0, 0, 1, 1, 2, 2]  # their layers (weight, bias)
OPT = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}


# ----------------------------------------------------------------------------- pure functions


def test_lpt_is_balanced_and_deterministic():
    sizes = [8192] * 37 + [5120, 512, 512, 10]
    bins = lpt(sizes, 3)
    loads = [sum(s for s, b in zip(sizes, bins) if b == k) for k in range(3)]
    assert max(loads) - min(loads) <= max(sizes)  # LPT: within one item of each other
    assert max(loads) <= 4 / 3 * (sum(sizes) / 3) + 1  # Graham's 4/3 bound against the mean
    assert lpt(sizes, 3) == bins
    with pytest.raises(ValueError):
        lpt(sizes, 0)


def test_assign_chunks_cover_balance_and_namespaces():
    ch = assign_chunks(NUMELS, 8192, interfaces=3, threads=2, jobs=2)
    per_job = len(ch) // 2
    assert [c.id for c in ch] == list(range(len(ch)))
    assert all(0 < c.numel <= 8192 for c in ch)
    for g in range(2):
        mine = ch[g * per_job : (g + 1) * per_job]
        assert all(c.job == g and c.local == i for i, c in enumerate(mine))
        for k, n in enumerate(NUMELS):  # every element of every key in exactly one chunk
            cover = [(c.lo, c.hi) for c in mine if c.key == k]
            assert cover[0][0] == 0 and cover[-1][1] == n and all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
    load = {}
    for c in ch:
        load[(c.server, c.thread)] = load.get((c.server, c.thread), 0) + c.numel
    assert set(load) == {(i, t) for i in range(3) for t in range(2)}
    iface = [sum(v for (i, _), v in load.items() if i == k) for k in range(3)]
    assert max(iface) - min(iface) <= 8192
    assert ch == assign_chunks(NUMELS, 8192, interfaces=3, threads=2, jobs=2)  # fixed at initialisation
    with pytest.raises(ValueError):
        assign_chunks(NUMELS, 0, 1, 1)


def test_job_groups():
    assert job_groups(4, 2) == [[0, 1], [2, 3]]
    assert job_groups(5, 2, intruder=4) == [[0, 1], [2, 3]]
    assert job_groups(5, 2, intruder=0) == [[1, 2], [3, 4]]
    with pytest.raises(ValueError):
        job_groups(5, 2)
    with pytest.raises(ValueError):
        job_groups(4, 1, intruder=7)


def test_options_are_validated():
    ok = {"chunk_bytes": 4 << 20, "server_threads": 3, "hierarchical": "auto", "jobs": 2, "overlap": False}
    from_dict(
        {"topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 4}, "workload": {"scheme": "phub", "options": ok}}
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"chunk_bytes": 6},
        {"chunk_bytes": 0},
        {"server_threads": 0},
        {"hierarchical": "yes"},
        {"jobs": 0},
        {"bad_token_worker": -1},
        {"slice_params": 5},
    ],
)
def test_bad_options_are_named(bad):
    key = next(iter(bad))
    with pytest.raises(SpecError, match=f"workload.options.{key}"):
        from_dict({"workload": {"scheme": "phub", "options": bad}})


@pytest.mark.parametrize("scheme", ["phub", "ps", "ibatch"])
def test_plan_pbox_runs_one_server_per_interface(scheme):
    """Every PS-family scheme runs one server per PBox interface (the host has 3 links)."""
    w = from_dict(
        {"workload": {"scheme": scheme, "servers": {"count": 1, "placement": "dedicated", "interfaces": 3}}}
    ).workload
    hosts = [HostInfo(f"h{i + 1}", 0) for i in range(4)] + [HostInfo("ps1", 0, "server", 3)]
    plan = schemes.get(scheme).plan(w, hosts)
    assert [(p.name, p.host, p.iface) for p in plan if p.role == "server"] == [
        ("server0", "ps1", 0),
        ("server1", "ps1", 1),
        ("server2", "ps1", 2),
    ]
    assert [p.host for p in plan if p.role == "worker"] == ["h1", "h2", "h3", "h4"]


def test_plan_phub_checks_options():
    phub = schemes.get("phub")
    hosts = [HostInfo(f"h{i + 1}", 0) for i in range(4)] + [HostInfo("ps1", 0, "server", 3)]
    # hierarchical needs one server host per rack with workers
    w2 = from_dict(
        {
            "workload": {
                "scheme": "phub",
                "options": {"hierarchical": True},
                "servers": {"count": 1, "placement": "dedicated"},
            }
        }
    ).workload
    hosts2 = [HostInfo(f"h{i + 1}", i // 2) for i in range(4)] + [HostInfo("ps1", 0, "server")]
    with pytest.raises(SpecError, match="workload.servers"):
        phub.plan(w2, hosts2)
    w3 = from_dict({"workload": {"scheme": "phub", "options": {"jobs": 3}}}).workload
    with pytest.raises(SpecError, match="workload.options.jobs"):
        phub.plan(w3, hosts)


def test_table2_bounds_follow_figure4():
    b = bandwidth_lower_bounds(1e9 / 8, 1.0, 8)  # M = 1 Gbit, T = 1 s, N = 8
    assert b == {"CC": 14e9, "CS": 3.5e9, "NCC": 16e9, "NCS": 2e9}
    rows = {r["network"]: r for r in table2(workers=8)}
    for net, paper in PAPER_TABLE2.items():
        r = rows[net]
        # the column ratios are Table 2's exactly; the values within 11 % (AlexNet: M, T of Table 3)
        assert r["CC"] / r["NCC"] == pytest.approx(7 / 8) and r["CS"] / r["CC"] == pytest.approx(1 / 4)
        assert r["NCS"] / r["NCC"] == pytest.approx(1 / 8)
        for cfg in ("CC", "NCC"):
            assert r[cfg] == pytest.approx(paper[cfg], rel=0.11)
    with pytest.raises(ValueError):
        bandwidth_lower_bounds(1, 0, 8)


def test_hierarchical_inequality():
    # 2 racks of N = 4 workers at 10, PBox of 4 interfaces (40), uplink 40 / oversubscription
    t = hierarchical_terms(b_pbox=40, b_core=40, b_wkr=10, racks=2, n=4)
    assert (t.flat_cross_rack, t.c, t.two_level) == pytest.approx((4 / 80, 1 / 80, 0.1 + 1 / 80))
    assert not t.pays
    assert not hierarchical_pays(40, 20, 10, 2, 4)  # 2:1: 0.1 < 0.125
    assert hierarchical_pays(40, 40 / 3, 10, 2, 4)  # 3:1: 0.15 > 0.1375
    assert hierarchical_pays(40, 40 / 3, 10, 2, 4, c=0.05) is False
    assert hierarchical_pays(4e10, 4e10 / 3, 1e10, 2, 4)  # unit-free
    assert cross_rack_bytes(100, 3, 4, True) / cross_rack_bytes(100, 3, 4, False) == 1 / 4
    with pytest.raises(ValueError):
        hierarchical_terms(0, 1, 1, 2, 2)


def test_hierarchical_auto_decides_from_the_spec_bandwidths():
    from types import SimpleNamespace

    PHub = schemes.get("phub")
    for oversub, expected in ((1, False), (2, False), (3, True)):  # see test_hierarchical_inequality
        topology = TopologySpec(
            kind="rack_core", racks=2, hosts_per_rack=4, host_bw_mbps=10000, oversubscription=oversub
        )
        fake = SimpleNamespace(
            opts=PHubOptions(hierarchical="auto"), pboxes=[[4], [5]], ctx=SimpleNamespace(topology=topology)
        )
        assert PHub._decide_hierarchical(fake, racks_with_workers=2, per_rack=4, k=4) is expected
    fake.opts = PHubOptions(hierarchical=True)
    assert PHub._decide_hierarchical(fake, 1, 4, 4) is True


# ----------------------------------------------------------------------------- end to end


def _experiment(options, servers, racks=1, per_rack=4, workers=0):
    return experiment(
        "phub",
        racks=racks,
        hosts_per_rack=per_rack,
        workers=workers,
        iterations=ITERS,
        batch_size=BATCH,
        servers=servers,
        optimizer=OPT,
        options=options,
    )


def _assert_equal(state, ref, what):
    assert set(state) == set(ref)
    for k in ref:
        torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"{what} {k}")


def _procs(run_dir):
    return json.loads((run_dir / "processes.json").read_text())["processes"]


def _check_mapping(run_dir, exp):
    """Every chunk is received by one fixed (server process, thread) of each PBox (host) in
    every iteration (each push transfer, a frame, lists its chunks); returns
    ``{(host, chunk id): (server index, thread name)}``."""
    procs = _procs(run_dir)
    servers = [p for p in procs if p["role"] == "server"]
    seen: dict[int, set] = {}
    for s in servers:
        for e in read_events(run_dir / "events" / f"{s['name']}.jsonl"):
            if e["kind"] == "push" and e.get("dir") == "rx" and e["iteration"] >= 0:
                for c in e["chunks"]:
                    seen.setdefault((s["host"], c), set()).add((s["index"], e["thread"], e["iteration"]))
                assert e["thread"] == f"srv{e['server_thread']}"
    placed = {c: {(i, t) for i, t, _ in v} for c, v in seen.items()}
    assert all(len(v) == 1 for v in placed.values()), placed
    iters = {c: {it for _, _, it in v} for c, v in seen.items()}
    assert all(v == set(range(ITERS)) for v in iters.values())
    return {c: next(iter(v)) for c, v in placed.items()}


@pytest.fixture(scope="module")
def reference():
    return reference_train(_experiment({}, {"count": 1}).workload, 4)


CASES = {
    # PBox: one non-colocated central server host (NCC) with 3 interfaces -> 3 server
    # processes x 2 threads, PHub's 32 KB chunks in frames of the default size
    "pbox": ({"server_threads": 2}, {"config": "NCC", "interfaces": 3}),
    # colocated sharded (CS, "PShard"): 4 server processes x 3 threads, 8 KB chunks, bulk
    # push_pull, frames of up to 4 chunks
    "cs-bulk": ({"server_threads": 3, "chunk_bytes": 8192, "overlap": False, "frame_bytes": 32768}, {"count": 0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference_and_fixed_mapping(case, tmp_path, reference):
    options, servers = CASES[case]
    exp = _experiment(options, servers)
    run_dir = run_local(exp, tmp_path / case)
    for w in range(4):
        _assert_equal(torch.load(run_dir / "params" / f"worker{w}.pt"), reference, f"{case} worker{w}")
    placed = _check_mapping(run_dir, exp)
    n_servers = servers.get("interfaces", 1) if servers.get("config") == "NCC" else 4
    chunks = assign_chunks(NUMELS, options.get("chunk_bytes", 32768) // 4, n_servers, options["server_threads"])
    host = servers.get("config") == "NCC" and "ps1"
    assert {c: v for (_, c), v in placed.items()} == {c.id: (c.server, f"srv{c.thread}") for c in chunks}
    if host:
        assert {h for h, _ in placed} == {host}
    ranks = {p["index"]: p["rank"] for p in _procs(run_dir) if p["role"] == "server"}
    frames = pack_frames(chunks, options.get("frame_bytes", FRAME_BYTES) // 4, lambda c: LAYER_OF_KEY[c.key])
    for w in range(4):  # every push of a chunk goes to its server process, with the token's 8 bytes
        pushes = [
            e
            for e in read_events(run_dir / "events" / f"worker{w}.jsonl")
            if e["kind"] == "push" and e["iteration"] >= 0
        ]
        assert len(pushes) == ITERS * len(frames)
        assert sorted(c for e in pushes for c in e["chunks"]) == sorted(c.id for c in chunks for _ in range(ITERS))
        assert all(e["peer"] == ranks[chunks[c].server] for e in pushes for c in e["chunks"])
        assert all(e["bytes"] == sum(4 * (chunks[c].numel + META) for c in e["chunks"]) for e in pushes)


def _cross_rack_bytes(run_dir, exp) -> int:
    rack = {h.name: h.rack for h in local_hosts(exp)}
    procs = _procs(run_dir)
    rack_of = {p["rank"]: rack[p["host"]] for p in procs}
    total = 0
    for p in procs:
        for e in read_events(run_dir / "events" / f"{p['name']}.jsonl"):
            if (
                e.get("dir") == "tx"
                and (e["iteration"] if e["iteration"] is not None else -1) >= 0
                and rack_of[e["peer"]] != rack_of[p["rank"]]
            ):
                total += e["bytes"]
    return total


def test_hierarchical_matches_reference_and_cuts_cross_rack_bytes(tmp_path, reference):
    servers = {"count": 1, "placement": "dedicated", "scope": "per_rack"}
    runs = {}
    for hier in (False, True):  # flat with one message per chunk, hierarchical in frames: the same bytes
        exp = _experiment(
            {"hierarchical": hier, "server_threads": 2, "frame_bytes": 0 if not hier else FRAME_BYTES},
            servers,
            racks=2,
            per_rack=2,
        )
        run_dir = run_local(exp, tmp_path / f"hier-{hier}")
        for w in range(4):
            _assert_equal(torch.load(run_dir / "params" / f"worker{w}.pt"), reference, f"hier={hier} worker{w}")
        res = [json.loads((run_dir / "results" / f"server{s}.json").read_text()) for s in range(2)]
        assert all(r["hierarchical"] is hier for r in res)
        runs[hier] = (run_dir, exp)
    flat_chunks = assign_chunks(NUMELS, 8192, 2, 2)  # flat: chunks over both PBoxes
    hier_chunks = assign_chunks(NUMELS, 8192, 1, 2)  # hierarchical: every PBox has all chunks
    N = 2
    # flat: the other rack's N workers push each chunk and get it back (payload + metadata)
    flat_expected = ITERS * sum(2 * N * 4 * (c.numel + META) for c in flat_chunks)
    # hierarchical: each of the R = 2 PBoxes sends 2(R-1)/R of each chunk in the ring
    hier_expected = ITERS * sum(2 * 4 * c.numel for c in hier_chunks)
    flat = _cross_rack_bytes(*runs[False])
    hier = _cross_rack_bytes(*runs[True])
    assert flat == flat_expected
    assert hier == hier_expected
    assert hier / flat == pytest.approx(1 / N, rel=1e-3)
    placed = _check_mapping(*runs[True])  # each PBox: chunk -> (its interface process, thread)
    assert placed == {(f"ps{r + 1}", c.id): (r, f"srv{c.thread}") for r in range(2) for c in hier_chunks}
    ring = [
        e
        for e in read_events(runs[True][0] / "events" / "server0.jsonl")
        if e["kind"] in ("reduce_scatter", "all_gather") and e.get("dir") == "tx"
    ]
    hier_frames = pack_frames(hier_chunks, FRAME_BYTES // 4, lambda c: LAYER_OF_KEY[c.key])  # a ring per frame
    assert len(ring) == ITERS * 2 * len(hier_frames) and all(e["thread"].startswith("srv") for e in ring)


def test_jobs_and_wrong_token_rejected(tmp_path):
    exp = _experiment(
        {"jobs": 2, "bad_token_worker": 4, "server_threads": 2}, {"count": 2, "placement": "dedicated"}, per_rack=5
    )
    run_dir = run_local(exp, tmp_path / "tenants")
    ref2 = reference_train(exp.workload, 2)
    for w in range(4):  # both jobs train as the 2-worker reference: nothing of the intruder applied
        _assert_equal(torch.load(run_dir / "params" / f"worker{w}.pt"), ref2, f"worker{w}")
    init = build_model("digits_mlp", 3, (64,), 10).state_dict()
    _assert_equal(torch.load(run_dir / "params" / "worker4.pt"), init, "intruder")
    intruder = json.loads((run_dir / "results" / "worker4.json").read_text())
    chunks = assign_chunks(NUMELS, 8192, 2, 2, jobs=2)
    job0 = [c for c in chunks if c.job == 0]
    assert intruder["rejected_pulls"] == ITERS * len(job0) and intruder["job"] is None
    for s in range(2):
        res = json.loads((run_dir / "results" / f"server{s}.json").read_text())
        own0 = [c for c in job0 if c.server == s]
        assert res["rejected_connects"] == 1
        assert res["rejected_pushes"] == ITERS * len(own0)
        rejects = [e for e in read_events(run_dir / "events" / f"server{s}.jsonl") if e["kind"] == "reject"]
        assert {e["peer"] for e in rejects} == {4} and all(e["job"] == 0 for e in rejects)
        # every job has its own serving loop per server thread: no job waits on another's chunks
        pushes = [e for e in read_events(run_dir / "events" / f"server{s}.jsonl") if e["kind"] == "push"]
        assert {e["job"] for e in pushes} == {0, 1}
        assert all(e["thread"] == f"srv{e['server_thread']}-job{e['job']}" for e in pushes)
        # the server holds both jobs' namespaces, each equal to the reference's slice
        state = torch.load(run_dir / "params" / f"server{s}.pt")
        assert {k.split("/")[0] for k in state} == {"job0", "job1"}
        for k, v in state.items():
            name, rng = k.split("/")[1].split("[")
            lo, hi = map(int, rng.rstrip("]").split(":"))
            torch.testing.assert_close(v, ref2[name].view(-1)[lo:hi], rtol=1e-4, atol=1e-5)
    for w in range(4):
        r = json.loads((run_dir / "results" / f"worker{w}.json").read_text())
        assert r["job"] == w // 2 and r["job_workers"] == 2
    # each job's throughput, over its own two workers (the intruder in neither)
    from analysis.metrics import summarize
    from analysis.phub_report import _per_job

    summary = summarize(run_dir)
    assert sorted(_per_job(run_dir, yaml.safe_load((run_dir / "spec.yaml").read_text()), summary)) == [0, 1]


def _fake_run(root, name, variant, racks, background, samples_per_s, core, workers=8, jobs=None):
    """A run directory with what analysis.phub_report reads: spec, summary, and with ``jobs``
    (each job's samples/s) the iterations of that many equal jobs of the workers at those rates."""
    d = root / name
    d.mkdir(parents=True)
    spec = {
        "topology": {
            "kind": "rack_core" if racks > 1 else "rack",
            "racks": racks,
            "oversubscription": 3,
            "background_hosts_per_rack": 1 if background else 0,
        },
        "workload": {
            "scheme": "phub",
            "model": "resnet50",
            "workers": workers,
            "warmup_iterations": 1,
            "options": {"jobs": len(jobs or [0])},
        },
        "background": [{"src": "bg1", "dst": "bg2", "rate_mbps": 1000, "duration_s": 1}] if background else [],
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    (d / "summary.json").write_text(
        json.dumps(
            {"workers": workers, "bytes_per_iteration": {"core": core + 1e9, "core_training": core, "worker_link": 2e8}}
        )
    )
    if jobs:
        per, batch = workers // len(jobs), 32
        # back to back; iteration 0 (the warm-up) at a tenth of the rate: left out of the job's throughput
        ends = {v: [per * batch / v * k for k in (10, 11, 12)] for v in jobs}
        pd.DataFrame(
            [
                {
                    "iteration": it,
                    "worker": f"worker{w}",
                    "start": ([0.0] + ends[v])[it],
                    "end": ends[v][it],
                    "samples": batch,
                }
                for g, v in enumerate(jobs)
                for it in range(3)
                for w in range(g * per, (g + 1) * per)
            ]
        ).to_csv(d / "iterations.csv", index=False)
    return {
        "variant": variant,
        "status": "ok",
        "samples_per_s": samples_per_s,
        "samples_per_s_ci95": 1.0,
        "iter_mean_s": 0.1,
        "cpu_starved": False,
        "run_dir": str(d),
    }


def test_phub_report_matches_points_and_takes_background_out(tmp_path):
    from analysis.phub_report import sweep_table

    rows = [
        _fake_run(tmp_path, "a", "ps_cs", 2, False, 100, 8e8),
        _fake_run(tmp_path, "b", "phub_flat", 2, False, 200, 8e8),
        _fake_run(tmp_path, "c", "phub_hier", 2, False, 300, 2e8),
        _fake_run(tmp_path, "d", "ps_cs", 2, True, 50, 8e8),
        _fake_run(tmp_path, "e", "phub_flat", 2, True, 150, 8e8),
        _fake_run(tmp_path, "f", "phub_hier", 2, True, 100, 4e8),
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "sweep.csv", index=False)
    t = sweep_table(tmp_path, baseline="ps_cs", flat="phub_flat").set_index(["variant", "background"])
    # speedup and byte ratio against the same point (the busy core has its own baseline)
    assert t.loc[("phub_hier", False), "speedup"] == pytest.approx(3.0)
    assert t.loc[("phub_hier", True), "speedup"] == pytest.approx(2.0)
    assert t.loc[("phub_hier", True), "core_MB_per_iter"] == pytest.approx(400)  # training bytes only
    assert t.loc[("phub_hier", False), "core_vs_flat"] == pytest.approx(0.25)
    assert t.loc[("phub_hier", True), "core_vs_flat"] == pytest.approx(0.5)
    assert t.loc[("phub_hier", True), "one_over_N"] == pytest.approx(0.25)
    assert "per_job_drop_pct" not in t.columns
    from analysis.phub_report import plot_table

    png = plot_table(sweep_table(tmp_path, baseline="ps_cs", flat="phub_flat"), tmp_path / "plots" / "s.png")
    assert png.stat().st_size > 10_000


def test_phub_report_matches_worker_counts_when_the_baseline_sweeps_them(tmp_path):
    from analysis.phub_report import sweep_table

    rows = [
        _fake_run(tmp_path, f"{v}{w}", v, 1, False, s, 0, workers=w)
        for v, w, s in [("mxnet-cs", 1, 100), ("mxnet-cs", 8, 400), ("pbox", 1, 50), ("pbox", 8, 1200)]
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "sweep.csv", index=False)
    t = sweep_table(tmp_path, baseline="mxnet-cs", flat=None).set_index(["variant", "workers"])
    assert t.loc[("pbox", 1), "speedup"] == pytest.approx(0.5)
    assert t.loc[("pbox", 8), "speedup"] == pytest.approx(3.0)
    # a baseline at one worker count is every point's: Fig. 12's PBox with 7 workers against CS with 8
    pd.DataFrame(rows[1:2] + [_fake_run(tmp_path, "pbox7", "pbox-7w", 1, False, 1000, 0, workers=7)]).to_csv(
        tmp_path / "sweep.csv", index=False
    )
    t = sweep_table(tmp_path, baseline="mxnet-cs", flat=None).set_index("variant")
    assert t.loc["pbox-7w", "speedup"] == pytest.approx(2.5)


def test_phub_report_gives_per_job_drop(tmp_path):
    from analysis.phub_report import sweep_table

    rows = [
        _fake_run(tmp_path, "a", "1job", 1, False, 100, 0, workers=2, jobs=[100.0]),
        _fake_run(tmp_path, "b", "2jobs", 1, False, 190, 0, workers=4, jobs=[96.0, 94.0]),
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "sweep.csv", index=False)
    t = sweep_table(tmp_path, baseline=None, flat=None).set_index("variant")
    assert t.loc["2jobs", "per_job_drop_pct"] == pytest.approx(5.0) and t.loc["1job", "per_job_drop_pct"] == 0


def test_phub_report_gives_the_least_iteration_the_bytes_allow(tmp_path):
    from analysis.phub_report import sweep_table
    from traffic.compute_profiles import load_profile

    rows = []
    for name, variant, link_bytes, samples_per_s in (("cs", "mxnet-cs", 8e8, 500), ("box", "pbox", 4e8, 1000)):
        rows.append(_fake_run(tmp_path, name, variant, 1, False, samples_per_s, 0))
        spec = yaml.safe_load((tmp_path / name / "spec.yaml").read_text())
        spec["topology"]["host_bw_mbps"] = 10000
        spec["workload"].update(model="alexnet", batch_size=32, compute={"mode": "emulated", "profile": "gtx1080ti"})
        (tmp_path / name / "spec.yaml").write_text(yaml.safe_dump(spec))
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"workers": 8, "bytes_per_iteration": {"worker_link": link_bytes}})
        )
    pd.DataFrame(rows).to_csv(tmp_path / "sweep.csv", index=False)
    t = sweep_table(tmp_path, baseline="mxnet-cs", flat=None).set_index("variant")
    p = load_profile("gtx1080ti", "alexnet", 32)
    compute = 1e3 * (sum(p.forward_s()) + sum(p.backward_s()))
    # one direction of the link's bytes at 10 Gbit/s: 4e8 B -> 320 ms, 2e8 B -> 160 ms
    assert t.loc["mxnet-cs", "wire_ms"] == pytest.approx(320) and t.loc["pbox", "wire_ms"] == pytest.approx(160)
    assert t.loc["pbox", "compute_ms"] == pytest.approx(compute)
    assert t.loc["pbox", "link_bound_ms"] == pytest.approx(max(compute, 160))
    assert t.loc["pbox", "speedup_bound"] == pytest.approx((compute + 320) / max(compute, 160))
    assert pd.isna(t.loc["mxnet-cs", "speedup_bound"])
