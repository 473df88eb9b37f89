"""Stanza: layer separation, recursive doubling, the performance model and node assignment.

End-to-end cases run ``n_c`` CONV workers and ``n_f`` FC workers on loopback (real gloo)
for a few iterations of ``digits_cnn`` on ``digits`` and compare the parameters with a
single process trained on the same global batches (:mod:`traffic.reference`): CONV
worker 0's whole model (its FC layers come from FC worker 0), every CONV worker's CONV
layers and every FC worker's FC layers. ``n_c`` covers powers of two and not, ``n_f`` 1
and 2 (with equal and unequal groups). The events must show recursive doubling's round
count (Stanza §4.1.2) and true-size activation messages; worker 0's evaluations must equal
the reference model's; the ``n_c = 2`` case also writes §5.3 checkpoints (each process's
own, and FC worker 0's copy on a randomly chosen CONV worker), equal to SGD after two
iterations. The ``(5, 2)`` case runs with host costs (``aggregate`` and ``optimizer`` rates)
and counts the charges: one ``aggregate`` per local sum of each recursive doubling, one
``optimizer`` per FC worker iteration; an emulated-compute run counts the ``compute``
charges of the FC layers (``g`` times their profiled time).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from analysis.paper_models import stanza as model
from analysis.stanza_report import run_figures
from common.errors import SpecError
from testbed.loopback import local_entries, run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from topologies.hosts import HostInfo
from traffic import schemes
from traffic.collectives.recursive_doubling import rounds, schedule, sums
from traffic.models import build_model
from traffic.reference import reference_accuracy, reference_train
from traffic.rundir import read_json
from traffic.runtime.events import read_events
from traffic.schemes.stanza import assignment, checkpoint_holder, fc_groups, fc_of, split_shape

ITERS, BATCH, SEED = 3, 16, 5


# ----------------------------------------------------------------------------- recursive doubling


@pytest.mark.parametrize(
    "p,expected", [(1, 0), (2, 1), (3, 3), (4, 2), (5, 4), (6, 4), (7, 4), (8, 3), (9, 5), (16, 4)]
)
def test_recursive_doubling_rounds_as_the_paper_states(p, expected):
    # log2 p for a power of two, floor(log2 p) + 2 otherwise (Stanza §4.1.2)
    assert rounds(p) == expected == len(schedule(p)) == model.allreduce_rounds(p)


@pytest.mark.parametrize("p", range(1, 12))
def test_recursive_doubling_schedule_sums_everything_everywhere(p):
    have = [{i} for i in range(p)]  # whose contributions each index holds
    for transfers in schedule(p):
        new = [set(h) for h in have]
        dsts = [dst for _, dst, _ in transfers]
        assert len(dsts) == len(set(dsts))  # one message per receiver and round
        for src, dst, phase in transfers:
            new[dst] = new[dst] | have[src] if phase != "unfold" else set(have[src])
        have = new
    assert all(h == set(range(p)) for h in have)
    with pytest.raises(ValueError):
        rounds(0)


@pytest.mark.parametrize("p", range(1, 12))
def test_recursive_doubling_sums_are_the_transfers_received_and_added(p):
    # every fold or exchange transfer is added into its receiver's tensor; an unfold overwrites
    added = [0] * p
    for transfers in schedule(p):
        for _, dst, phase in transfers:
            added[dst] += phase != "unfold"
    assert [sums(p, i) for i in range(p)] == added
    q = 1 << (p.bit_length() - 1)
    assert sums(p, 0) == (rounds(p) if p == q else rounds(p) - 1)  # log2 q exchanges (+ a fold)
    with pytest.raises(ValueError):
        sums(p, p)


# ----------------------------------------------------------------------------- model and search


def _toy():
    # B = 32 bit/s moves one float32 value per second, so times are value counts
    return model.Constants(K=1, P=10, P_c=3, A=1, T_c=10.0, T_f=4.0, T_ps=1.0), 32.0


def test_performance_model_equations():
    c, B = _toy()
    assert model.stanza_compute_time(c, 3, 2) == 10 + 3 / 2 * 4  # eq. (2)
    parts = model.stanza_iteration_time(c, 3, 2, B, parts=True)  # eq. (3)
    assert parts == {"compute": 16.0, "conv_fc": 3.0, "conv_allreduce": 9.0, "total": 28.0}
    assert model.stanza_iteration_time(c, 4, 1, B) == 26 + 8 + 3 * 2  # n_c power of 2
    assert model.stanza_throughput(c, 3, 2, B) == 3 / 28  # eq. (4)
    assert model.ps_iteration_time(c, 4, 2, B) == 2 * 4 * 10 / 2 + 1  # eq. (6)
    assert model.ps_throughput(c, 4, 2, B) == 4 / 41  # eq. (7)
    with pytest.raises(ValueError):
        model.stanza_iteration_time(c, 0, 1, B)


def test_node_assignment_returns_the_maximizer_of_eq4():
    # by hand, N = 5: (n_c, n_f, t_s) = (1, 4, 11.5), (2, 3, 17), (3, 2, 28), (4, 1, 40);
    # throughputs 0.087, 0.1176, 0.1071, 0.1: the optimum is 2 CONV + 3 FC workers
    c, B = _toy()
    a = model.node_assignment(c, 5, B)
    assert (a.n_c, a.n_f, a.time_s) == (2, 3, 17.0) and a.throughput == pytest.approx(2 / 17)
    brute = max(range(1, 5), key=lambda n: model.stanza_throughput(c, n, 5 - n, B))
    assert brute == a.n_c
    with pytest.raises(ValueError):
        model.node_assignment(c, 1, B)
    p = model.ps_node_assignment(c, 5, B)
    assert (p.n_c, p.n_f) == (1, 4)  # eq. (7): 1/(20/4 + 1) = 0.167 beats 2/(40/3 + 1) = 0.140 ...


def test_constants_from_the_zoo_and_a_profile():
    from traffic.compute_profiles import load_profile

    c = model.Constants.from_profile("alexnet", load_profile("v100", "alexnet", 32))
    assert c.A == 9216 and c.K == 32  # Stanza §3.2: 9,216 per sample
    assert c.P == 61_100_840 and c.P_c == 2_469_696  # Table 2: 2.47E+06 CONV
    assert c.T_ps == pytest.approx(c.T_c + c.T_f) and c.T_c > 5 * c.T_f
    assert split_shape(build_model("vgg16", 0, device="meta")) == (512, 7, 7)
    assert split_shape(build_model("digits_cnn", 0)) == (32, 4, 4)


def test_analysis_reexports_the_schemes_assignment():
    # one implementation: the scheme's (analysis imports it, never the reverse)
    assert model.Constants is assignment.Constants and model.node_assignment is assignment.node_assignment
    assert model.Assignment is assignment.Assignment and model.split_activations is assignment.split_activations


# ----------------------------------------------------------------------------- plan and options


def test_option_validation():
    st = schemes.get("stanza")
    assert st.name == "stanza"
    o = st.Options()
    assert (o.fc_workers, o.nodes, o.bw_gbps, o.checkpoint_every) == (1, 0, 10.0, 0)
    o = st.validate_options({"fc_workers": "auto", "nodes": 11, "bw_gbps": 10, "checkpoint_every": 2})
    assert (o.fc_workers, o.nodes, o.bw_gbps, o.checkpoint_every) == ("auto", 11, 10.0, 2)
    assert st.validate_options({"fc_workers": 3}).fc_workers == 3
    for bad in (
        {"fc_workers": 0},
        {"fc_workers": "many"},
        {"fc_workers": True},
        {"bw_gbps": 0},
        {"nodes": 1},
        {"nodes": -1},
        {"x": 1},
        {"checkpoint_every": -1},
    ):
        with pytest.raises(SpecError, match="workload.options." + next(iter(bad))):
            st.validate_options(bad)
    with pytest.raises(SpecError, match="an integer >= 1 or 'auto'"):
        st.validate_options({"fc_workers": 0})
    with pytest.raises(SpecError, match=r"0 \(every host\) or an integer >= 2"):
        st.validate_options({"nodes": 1})


def _workload(**kw):
    w = {"scheme": "stanza", "model": "digits_cnn", **kw}
    return from_dict({"workload": w}).workload


def test_groups_plan_and_options():
    assert fc_groups(4, 2) == [range(0, 2), range(2, 4)]
    assert fc_groups(5, 2) == [range(0, 2), range(2, 5)]
    assert [fc_of(i, 5, 2) for i in range(5)] == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError):
        fc_groups(2, 3)
    st = schemes.get("stanza")
    hosts = [HostInfo(f"h{i + 1}", 0) for i in range(8)]
    plan = st.plan(_workload(workers=5, options={"fc_workers": 2}), hosts)
    assert [(p.name, p.host) for p in plan] == [(f"worker{i}", f"h{i + 1}") for i in range(5)] + [
        ("fc0", "h6"),
        ("fc1", "h7"),
    ]
    assert len(st.plan(_workload(), hosts)) == 8  # workers 0: every host but the FC worker's
    for bad in (
        {"fc_workers": 0},
        {"fc_workers": "many"},
        {"bw_gbps": 0},
        {"nodes": 1},
        {"x": 1},
        {"checkpoint_every": -1},
    ):
        with pytest.raises(SpecError):
            _workload(options=bad)
    with pytest.raises(SpecError, match="workload.workers"):
        st.plan(_workload(workers=8), hosts)
    with pytest.raises(SpecError, match="workload.model"):
        st.plan(_workload(model="digits_mlp", workers=2), hosts)
    with pytest.raises(SpecError, match="workload.workers"):
        st.plan(_workload(workers=2, options={"fc_workers": "auto"}), hosts)


def test_auto_assignment_uses_the_search():
    w = from_dict(
        {
            "workload": {
                "scheme": "stanza",
                "model": "alexnet",
                "batch_size": 32,
                "compute": {"mode": "emulated", "profile": "v100"},
                "options": {"fc_workers": "auto", "nodes": 11, "bw_gbps": 10},
            }
        }
    ).workload
    hosts = [HostInfo(f"h{i + 1}", 0) for i in range(12)]
    plan = schemes.get("stanza").plan(w, hosts)
    from traffic.compute_profiles import load_profile

    best = model.node_assignment(model.Constants.from_profile("alexnet", load_profile("v100", "alexnet", 32)), 11, 10e9)
    assert sum(p.role == "worker" for p in plan) == best.n_c
    assert sum(p.role == "fc" for p in plan) == best.n_f == 11 - best.n_c


# ----------------------------------------------------------------------------- end to end


#: host rates of the host-cost case, GB/s
HOST = {"aggregate_gb_per_s": 0.5, "optimizer_gb_per_s": 1.0}
AGG_BPS, OPT_BPS = HOST["aggregate_gb_per_s"] * 1e9, HOST["optimizer_gb_per_s"] * 1e9


def _experiment(n_c, n_f, host=None, compute=None, **options):
    exp = experiment(
        "stanza",
        hosts_per_rack=8,
        model="digits_cnn",
        workers=n_c,
        iterations=ITERS,
        batch_size=BATCH,
        seed=SEED,
        optimizer={"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
        options={"fc_workers": n_f, **options},
        **({"compute": compute} if compute else {}),
    )
    return from_dict({**exp.to_dict(), "host": host}) if host else exp


def _check_host_costs(run_dir, n_c, n_f):
    """One ``aggregate`` charge per local sum of each recursive doubling (CONV and FC
    gradients, whole flat buffers), one ``optimizer`` per FC iteration (the FC parameters'
    bytes), at the stated rates; the results' ``host_costs`` add up to the events."""
    m = build_model("digits_cnn", SEED)
    conv_bytes = sum(p.numel() * 4 for l in m.layers[:2] for p in l.parameters())
    fc_bytes = sum(p.numel() * 4 for l in m.layers[2:] for p in l.parameters())
    procs = [(f"worker{i}", sums(n_c, i), conv_bytes) for i in range(n_c)]
    procs += [(f"fc{j}", sums(n_f, j), fc_bytes) for j in range(n_f)]
    assert sum(k for _, k, _ in procs) > 0
    for name, k, nbytes in procs:
        ev = read_events(run_dir / "events" / f"{name}.jsonl")
        agg = [e for e in ev if e["kind"] == "host_aggregate"]
        for it in range(ITERS):
            mine = [e for e in agg if e["iteration"] == it]
            assert len(mine) == k, (name, it)
            assert all(e["bytes"] == nbytes and e["emulated_s"] == pytest.approx(nbytes / AGG_BPS) for e in mine)
        opt = [e for e in ev if e["kind"] == "host_optimizer"]
        hc = read_json(run_dir / "results" / f"{name}.json")["host_costs"]
        if name.startswith("fc"):
            assert [e["iteration"] for e in opt] == list(range(ITERS)), name
            assert all(e["bytes"] == fc_bytes and e["emulated_s"] == pytest.approx(fc_bytes / OPT_BPS) for e in opt)
            assert hc["optimizer"]["count"] == ITERS and hc["optimizer"]["modelled"]
        if k:
            assert hc["aggregate"]["count"] == ITERS * k and hc["aggregate"]["modelled"]
            assert hc["aggregate"]["emulated_s"] == pytest.approx(ITERS * k * nbytes / AGG_BPS)
        else:  # a surplus process of the recursive doubling adds nothing
            assert "aggregate" not in hc, name


@pytest.mark.parametrize("n_c,n_f,host", [(2, 1, None), (3, 1, None), (4, 2, None), (5, 2, HOST)])
def test_stanza_matches_single_process_sgd(n_c, n_f, host, tmp_path):
    ckpt = 2 if n_c == 2 else 0  # Stanza §5.3 checkpoints, once (after iteration 1)
    exp = _experiment(n_c, n_f, host=host, checkpoint_every=ckpt)
    ref = reference_train(exp.workload, n_c)
    init = build_model("digits_cnn", SEED).state_dict()
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-2  # training moved far
    run_dir = run_local(exp, tmp_path / f"stanza-{n_c}-{n_f}")
    s = 2  # digits_cnn split_index: keys layers.0.*, layers.1.* are CONV
    conv_keys = [k for k in ref if int(k.split(".")[1]) < s]
    fc_keys = [k for k in ref if int(k.split(".")[1]) >= s]

    def check(got, keys, who):
        assert sorted(got) == sorted(keys), who
        for k in keys:
            assert torch.allclose(got[k], ref[k], atol=1e-5, rtol=1e-4), (
                f"{who} {k}: max diff {float((got[k] - ref[k]).abs().max()):.3g}"
            )

    check(torch.load(run_dir / "params" / "worker0.pt"), list(ref), "worker0")
    for i in range(1, n_c):
        check(torch.load(run_dir / "params" / f"worker{i}.pt"), conv_keys, f"worker{i}")
    fc_params = [torch.load(run_dir / "params" / f"fc{j}.pt") for j in range(n_f)]
    for j, got in enumerate(fc_params):
        check(got, fc_keys, f"fc{j}")
    for got in fc_params[1:]:  # FC replicas bit-identical (recursive doubling sums agree)
        assert all(torch.equal(got[k], fc_params[0][k]) for k in fc_keys)

    # events: recursive-doubling rounds, activation sizes, who talks to whom
    names = [e["name"] for e in local_entries(exp)]
    ev = {n: read_events(run_dir / "events" / f"{n}.jsonl") for n in names}
    conv_rounds = {
        e["round"]
        for n in names
        if n.startswith("worker")
        for e in ev[n]
        if e["kind"] == "allreduce" and e.get("iteration") == 0
    }
    assert conv_rounds == set(range(rounds(n_c)))
    act_bytes = BATCH * math.prod(split_shape(build_model("digits_cnn", SEED))) * 4
    for i in range(n_c):
        acts = [e for e in ev[f"worker{i}"] if e["kind"] == "activation"]
        grads = [e for e in ev[f"worker{i}"] if e["kind"] == "activation_grad"]
        assert len(acts) == len(grads) == ITERS
        assert {e["bytes"] for e in acts + grads} == {act_bytes}
        fc_rank = n_c + fc_of(i, n_c, n_f)
        assert {e["peer"] for e in acts + grads} == {fc_rank}
    for j in range(n_f):
        fc_ar = [e for e in ev[f"fc{j}"] if e["kind"] == "allreduce"]
        assert {e["round"] for e in fc_ar} == (set(range(rounds(n_f))) if n_f > 1 else set())
        got = sorted(e["peer"] for e in ev[f"fc{j}"] if e["kind"] == "activation" and e["iteration"] == 0)
        assert got == list(fc_groups(n_c, n_f)[j])
    if ckpt:  # own checkpoints and the FC copy on a randomly chosen CONV worker: SGD after 2 iterations
        ref2 = reference_train(exp.workload, n_c, iterations=2)
        d = run_dir / "checkpoints"
        holder = checkpoint_holder(SEED, 0, 1, n_c)
        for name, keys in [(f"worker{i}-it1.pt", conv_keys) for i in range(n_c)] + [
            ("fc0-it1.pt", fc_keys),
            (f"worker{holder}-fc0-it1.pt", fc_keys),
        ]:
            doc = torch.load(d / name)
            assert doc["iteration"] == 1 and sorted(doc["params"]) == sorted(keys), name
            assert all(torch.allclose(doc["params"][k], ref2[k], atol=1e-5, rtol=1e-4) for k in keys), name
        assert len(list(d.iterdir())) == n_c + 2
    if n_f == 1:  # Figure 6b's FC-Data from the events: activations, their gradients, labels
        fig = run_figures(run_dir)
        assert fig["fc_bytes_per_iter"] == n_c * (2 * act_bytes + BATCH * 8)
        assert fig["workers"] == n_c and fig["fc_workers"] == n_f
    # worker 0 evaluates with FC worker 0's FC layers: the reference model's accuracy
    evals = [e for e in ev["worker0"] if e["kind"] == "eval"]
    assert [(e["iteration"], e["final"]) for e in evals] == [(1, False), (ITERS - 1, True)]
    for e in evals:
        acc, loss = reference_accuracy(exp.workload, n_c, iterations=e["iteration"] + 1)
        assert e["accuracy"] == pytest.approx(acc, abs=1 / 360) and e["loss"] == pytest.approx(loss, rel=1e-4)
    if host:
        _check_host_costs(run_dir, n_c, n_f)


def test_emulated_fc_compute_is_charged_as_compute(tmp_path):
    """Emulated compute: the FC worker charges each FC layer's profiled forward and backward
    time x its group size ``g`` as host cost ``compute`` (Stanza eq. (2)), the CONV workers
    their CONV layers' times."""
    fwd, bwd = [0.002, 0.003, 0.001, 0.0005], [0.004, 0.006, 0.002, 0.001]  # digits_cnn: conv1 conv2 | fc1 fc2
    prof = tmp_path / "p.json"
    prof.write_text(
        json.dumps(
            {
                "model": "digits_cnn",
                "device": "test",
                "batch_size": BATCH,
                "source": "written by the test",
                "method": "test",
                "derived": False,
                "layers": [
                    {"index": i, "name": f"layer{i}", "forward_s": f, "backward_s": b}
                    for i, (f, b) in enumerate(zip(fwd, bwd))
                ],
            }
        )
    )
    n_c, n_f, s = 3, 1, 2
    run_dir = run_local(_experiment(n_c, n_f, compute={"mode": "emulated", "profile": str(prof)}), tmp_path / "run")
    fc = read_json(run_dir / "results" / "fc0.json")["host_costs"]["compute"]
    assert fc["count"] == ITERS * 2 * (len(fwd) - s)
    assert fc["emulated_s"] == pytest.approx(ITERS * n_c * (sum(fwd[s:]) + sum(bwd[s:])))
    for i in range(n_c):
        conv = read_json(run_dir / "results" / f"worker{i}.json")["host_costs"]["compute"]
        assert conv["count"] == ITERS * 2 * s
        assert conv["emulated_s"] == pytest.approx(ITERS * (sum(fwd[:s]) + sum(bwd[:s])))
    ev = read_events(run_dir / "events" / "fc0.jsonl")
    assert sorted(e["requested_s"] for e in ev if e["kind"] == "forward" and e["iteration"] == 0) == pytest.approx(
        sorted(n_c * t for t in fwd[s:])
    )
