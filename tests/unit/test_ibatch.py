"""iBatch: the model (eqs. (1)-(5)), the greedy algorithms, and the ``ibatch`` scheme end to end.

Model and algorithms (pure Python): eq. (1)-(4) values computed by hand; batchings are
contiguous covers of the layers meeting constraint (5); Algorithms 1 and 2 on two
hand-built 12-layer profiles (Fig. 4's shape: heavy forward in the first layers, heavy
pulls in the fully-connected layer 11): on the first the chosen batching is the
brute-force minimum of eq. (4) among batchings meeting (5); on the second both greedy
algorithms give (5, 12), eq. (4) = 38.4, while the minimum is (2, 8, 12) with 33.9
(greedy 13 % above the optimum: Algorithm 1's first step makes batch 1 as long as the
later pulls can cover, which leaves a long last batch). The exact dynamic program equals
the brute force on random profiles.

Scheme (run_local, 4 workers and 2 servers on loopback, digits_mlp, real gloo): each pull
strategy ends with the parameters of a single process trained on the same global batches
(so all three agree); the batches recorded in ``ibatch.json`` are the strategy's; a
layer's forward never starts before the pull bringing it ended; every iteration pulls
every parameter exactly once. With emulated compute (60 ms per layer forward, far longer
than any pull on loopback), ``layer_by_layer`` overlaps later pulls with the forward of
layer 0, while ``ibatch`` chooses one pull (no split can meet (5)), i.e. ``default``, and
never overlaps.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from analysis.paper_models.ibatch import (
    STRATEGIES,
    PullProfile,
    algorithm1,
    algorithm2,
    batch_ranges,
    brute_force_batching,
    choose_batching,
    exe_parts,
    exe_time,
    optimal_batching,
    pipeline_time,
    satisfies_constraint,
    strategy_ends,
    validate_ends,
)
from common.errors import SpecError
from testbed.loopback import run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from traffic import schemes
from traffic.compute_profiles import LayerProfile, Profile
from traffic.reference import reference_train
from traffic.runtime.events import read_events
from traffic.schemes import ibatch as scheme_mod
from traffic.schemes.ibatch import batching

# ----------------------------------------------------------------------------- model

FIG4 = PullProfile([5, 6, 1, 1, 4, 4, 2, 1, 1, 2, 1, 1], [0.5, 6, 3, 2, 4, 8, 2, 1, 0.5, 6, 8, 1], 1)
GOOGLENET_LIKE = PullProfile(
    [4, 9, 3, 2.5, 2.5, 2, 2, 2, 1.5, 1, 0.3, 0.1], [0.2, 0.3, 1, 1.5, 2, 2, 2.5, 3, 3, 4, 6, 1], 1.5
)


def test_equations_by_hand():
    p = PullProfile([3, 1, 2], [1, 4, 2], 1)
    # (1, 3): EXE1 = 1 + 1, EXE2 = 1*1 + 4 + 2, EXE3 = 1 + 2
    assert exe_parts(p, (1, 3)) == (2, 7, 3) and exe_time(p, (1, 3)) == 12
    assert satisfies_constraint(p, (1, 3)) and pipeline_time(p, (1, 3)) == 12
    assert exe_time(p, strategy_ends("default", 3)) == 1 + 7 + 6 == pipeline_time(p, (3,))
    assert exe_time(p, (1, 2, 3)) == 2 + 8 + 2 and satisfies_constraint(p, (1, 2, 3))
    # (5) violated: layer 1's forward (10) outlasts the pull of layer 2 (1): eq. (4) says 3,
    # the two-thread timeline 1 + 10 + 1
    q = PullProfile([10, 1], [1, 1], 0)
    assert not satisfies_constraint(q, (1, 2)) and exe_time(q, (1, 2)) == 3 and pipeline_time(q, (1, 2)) == 12
    assert batch_ranges((2, 5, 6)) == [(0, 2), (2, 5), (5, 6)]
    assert strategy_ends("layer_by_layer", 4) == (1, 2, 3, 4) and strategy_ends("ibatch", 4, [1, 4]) == (1, 4)
    with pytest.raises(ValueError):
        validate_ends((2, 2, 3), 3)
    with pytest.raises(ValueError):
        exe_time(p, (1, 2))  # does not end at L
    with pytest.raises(ValueError):
        PullProfile([1, -1], [1, 1], 0)
    with pytest.raises(ValueError):
        PullProfile([1], [1, 1], 0)
    with pytest.raises(ValueError):
        strategy_ends("nope", 3)
    with pytest.raises(ValueError):
        strategy_ends("ibatch", 3)


def test_greedy_matches_brute_force_on_fig4_profile():
    c = choose_batching(FIG4)
    assert c["algorithm1"] == (5, 10, 12) and c["algorithm2"] == (5, 12)
    assert c["exe_s"] == {"algorithm1": 47.0, "algorithm2": 56.0}
    assert c["chosen"] == "algorithm1" and c["ends"] == (5, 10, 12)
    assert brute_force_batching(FIG4) == ((5, 10, 12), 47.0) == optimal_batching(FIG4)
    assert exe_time(FIG4, (12,)) == 1 + 42 + 29  # the default PS: one pull, then forward


def test_greedy_gap_on_googlenet_like_profile():
    c = choose_batching(GOOGLENET_LIKE)
    assert c["algorithm1"] == c["algorithm2"] == (5, 12)
    assert c["exe_s"]["algorithm1"] == pytest.approx(38.4)
    ends, best = brute_force_batching(GOOGLENET_LIKE)
    assert ends == (2, 8, 12) and best == pytest.approx(33.9)
    assert c["exe_s"]["algorithm1"] / best - 1 == pytest.approx(0.1327, abs=1e-3)


def test_algorithms_cover_layers_and_meet_constraint():
    rnd = random.Random(7)
    for _ in range(300):
        L = rnd.randint(1, 9)
        p = PullProfile([rnd.uniform(0, 5) for _ in range(L)], [rnd.uniform(0, 5) for _ in range(L)], rnd.uniform(0, 2))
        for ends in (algorithm1(p), algorithm2(p)):
            assert validate_ends(ends, L) == ends  # contiguous, cover 1..L
            covered = [l for lo, hi in batch_ranges(ends) for l in range(lo, hi)]
            assert covered == list(range(L))
        assert satisfies_constraint(p, algorithm1(p))
        c = choose_batching(p)
        assert satisfies_constraint(p, c["ends"])
        assert pipeline_time(p, c["ends"]) == pytest.approx(exe_time(p, c["ends"]))
        ends, best = brute_force_batching(p)
        assert optimal_batching(p)[1] == pytest.approx(best)
        assert satisfies_constraint(p, ends) and c["exe_s"][c["chosen"]] >= best - 1e-9
    # only one pull meets (5) when no later pull can cover any forward
    assert algorithm1(PullProfile([100, 100], [1, 1], 0)) == (2,) == algorithm2(PullProfile([100, 100], [1, 1], 0))
    assert algorithm1(PullProfile([1], [1], 1)) == (1,)


# ----------------------------------------------------------------------------- scheme

W, ITERS, BATCH, SERVERS, P = 4, 6, 16, 2, 2
N_PARAMS = 301066  # digits_mlp


def test_analysis_reexports_the_schemes_algorithms():
    # one implementation: the scheme's (analysis imports it, never the reverse)
    assert PullProfile is batching.PullProfile and choose_batching is batching.choose_batching
    assert strategy_ends is batching.strategy_ends and optimal_batching is batching.optimal_batching


def test_option_validation():
    scheme = schemes.get("ibatch")
    assert scheme is scheme_mod.IBatch and scheme.name == "ibatch"
    assert STRATEGIES == scheme_mod.STRATEGIES
    opts = scheme.Options()
    assert (opts.pull, opts.profile_iterations, opts.overlap) == ("ibatch", 2, False)
    for pull in STRATEGIES:
        assert scheme.validate_options({"pull": pull, "overlap": True}).pull == pull


@pytest.mark.parametrize(
    "key, bad",
    [("pull", "bulk"), ("profile_iterations", 0), ("profile_iterations", True), ("bigarray_bound", 0), ("nope", 1)],
)
def test_bad_options_are_named(key, bad):
    with pytest.raises(SpecError, match=f"workload.options.{key}"):
        schemes.get("ibatch").validate_options({key: bad})


def test_options():
    assert STRATEGIES == scheme_mod.STRATEGIES
    assert schemes.get("ibatch").Options().pull == "ibatch"
    for pull in STRATEGIES:
        from_dict({"workload": {"scheme": "ibatch", "options": {"pull": pull, "overlap": True}}})
    with pytest.raises(SpecError, match="workload.options.pull"):
        from_dict({"workload": {"scheme": "ibatch", "options": {"pull": "bulk"}}})
    with pytest.raises(SpecError, match="workload.options.profile_iterations"):
        from_dict({"workload": {"scheme": "ibatch", "options": {"profile_iterations": 0}}})


def test_pull_request_is_a_ps_option():
    """``pull_request: true`` under ibatch is an error naming the field (ps's MXNet-like
    notify-then-pull; ibatch always pulls by request), whether or not ps has the option."""
    with pytest.raises(SpecError, match="workload.options.pull_request") as e:
        from_dict({"workload": {"scheme": "ibatch", "options": {"pull_request": True}}})
    if "pull_request" in schemes.get("ps").Options.model_fields:
        assert "ibatch always pulls by request; pull_request applies to ps" in str(e.value)
        assert from_dict({"workload": {"scheme": "ps", "options": {"pull_request": True}}})
        assert schemes.get("ibatch").validate_options({"pull_request": False}).pull == "ibatch"


def _experiment(options, compute=None):
    return experiment(
        "ibatch",
        workers=W,
        iterations=ITERS,
        warmup_iterations=P + 1,
        batch_size=BATCH,
        servers={"count": SERVERS},
        **({"compute": compute} if compute else {}),
        options={"bigarray_bound": 100_000, "profile_iterations": P, **options},
    )


@pytest.fixture(scope="module")
def reference():
    return reference_train(_experiment({}).workload, W)


def _end(e):
    return e["ts"] + e["dur"]


def _check_pulls(run_dir, ends):
    """Forward of a layer after its batch's pull; every parameter pulled once per iteration."""
    for w in range(W):
        ev = read_events(run_dir / "events" / f"worker{w}.jsonl")
        batches = [e for e in ev if e["kind"] == "pull_batch"]
        fwd = {(e["iteration"], e["layer"]): e for e in ev if e["kind"] == "forward"}
        for it in range(1, ITERS + 1):
            bs = sorted((e for e in batches if e["iteration"] == it), key=lambda e: e["ts"])
            assert sum(e["payload_bytes"] for e in bs) == 4 * N_PARAMS
            assert sum(e["bytes"] for e in ev if e["kind"] == "pull" and e["iteration"] == it) == 4 * N_PARAMS
            if it > P and it < ITERS:
                assert [(e["first_layer"], e["last_layer"] + 1) for e in bs] == batch_ranges(ends)
            if 1 <= it <= P:
                assert [(e["first_layer"], e["last_layer"]) for e in bs] == [(l, l) for l in range(3)]
                assert any(e["kind"] == "probe" and e["iteration"] == it for e in ev)
            for e in bs:
                assert all(e["thread"] == "pull" for e in bs)
                if it < ITERS:
                    for l in range(e["first_layer"], e["last_layer"] + 1):
                        assert fwd[(it, l)]["ts"] >= _end(e)
        yield ev


@pytest.mark.parametrize("pull", STRATEGIES)
def test_strategies_match_reference(pull, tmp_path, reference):
    run_dir = run_local(_experiment({"pull": pull}), tmp_path / pull)
    for w in range(W):
        state = torch.load(run_dir / "params" / f"worker{w}.pt")
        for k in reference:
            torch.testing.assert_close(state[k], reference[k], rtol=1e-4, atol=1e-5, msg=f"{pull} worker{w} {k}")
    doc = json.loads((run_dir / "ibatch.json").read_text())
    ends = tuple(doc["used"]["ends"])
    assert ends == strategy_ends(pull, 3, doc["candidates"][doc["chosen"]]["ends"])
    prof = doc["profile"]
    assert len(prof["forward_s"]) == len(prof["transfer_s"]) == 3 and prof["startup_s"] > 0
    assert all(x > 0 for x in prof["forward_s"]) and len(doc["per_worker"]) == W
    for w in range(W):
        assert json.loads((run_dir / "results" / f"worker{w}.json").read_text())["batch_ends"] == list(ends)
    assert len(list(_check_pulls(run_dir, ends))) == W


def _emulated_profile(path):
    layers = [LayerProfile(i, f"fc{i + 1}", 0.06, 0.01) for i in range(3)]
    prof = Profile("digits_mlp", "test", BATCH, "test: 60 ms forward per layer", "measured", False, layers)
    path.write_text(json.dumps(prof.to_dict()))
    return {"mode": "emulated", "profile": str(path)}


@pytest.mark.parametrize("pull", ["layer_by_layer", "ibatch"])  # ibatch's choice here is default's
def test_pull_overlaps_forward(pull, tmp_path):
    compute = _emulated_profile(tmp_path / "profile.json")
    run_dir = run_local(_experiment({"pull": pull, "overlap": True}, compute), tmp_path / pull)
    doc = json.loads((run_dir / "ibatch.json").read_text())
    assert doc["candidates"][doc["chosen"]]["ends"] == [3]  # forward >> pulls: only one pull meets (5)
    for ev in _check_pulls(run_dir, strategy_ends(pull, 3, (3,))):
        fwd = {(e["iteration"], e["layer"]): e for e in ev if e["kind"] == "forward"}
        overlapped_iterations = []
        for it in range(P + 1, ITERS):
            bs = [e for e in ev if e["kind"] == "pull_batch" and e["iteration"] == it]
            # a pull that ends after the forward of an earlier layer started: overlapped
            if any(_end(b) > fwd[(it, 0)]["ts"] for b in bs):
                overlapped_iterations.append(it)
        # one batch (ibatch here) can never overlap; layer by layer does unless the pull thread
        # finished every later layer before the forward thread was scheduled (a loaded machine):
        # in some iteration at least
        if pull == "layer_by_layer":
            assert overlapped_iterations, pull
        else:
            assert overlapped_iterations == [], pull


def test_servers_charge_request_startup_per_pull_and_probe(tmp_path, reference):
    """``request_startup`` once per pull and probe request a server answers (none per sync),
    every point-to-point message charged on both ends, the parameters still the reference's,
    and the workers' measured ``T_s`` includes the start-up."""
    startup_s, overhead_s = 0.010, 50e-6
    exp = _experiment({"pull": "ibatch"})
    exp = from_dict(
        {
            **exp.to_dict(),
            "scale": 1,
            "host": {"request_startup_ms": startup_s * 1e3, "message_overhead_us": overhead_s * 1e6},
        }
    )
    run_dir = run_local(exp, tmp_path / "run")
    for w in range(W):
        state = torch.load(run_dir / "params" / f"worker{w}.pt")
        for k in reference:
            torch.testing.assert_close(state[k], reference[k], rtol=1e-4, atol=1e-5, msg=f"worker{w} {k}")
    procs = {p["name"]: p for p in json.loads((run_dir / "processes.json").read_text())["processes"]}
    events = {name: read_events(run_dir / "events" / f"{name}.jsonl") for name in procs}
    requests = [e for w in range(W) for e in events[f"worker{w}"] if e["kind"] == "pull_request"]
    assert {e["request"] for e in requests} == {"sync", "probe", "pull"}
    for s in range(SERVERS):
        name, rank = f"server{s}", procs[f"server{s}"]["rank"]
        costs = json.loads((run_dir / "results" / f"{name}.json").read_text())["host_costs"]
        asked = {r: sum(1 for e in requests if e["peer"] == rank and e["request"] == r) for r in ("probe", "pull")}
        assert asked["probe"] == W * P  # every worker probes every server once per profiling iteration
        assert costs["request_startup"]["count"] == asked["probe"] + asked["pull"]
        assert costs["request_startup"]["emulated_s"] == pytest.approx(startup_s * (asked["probe"] + asked["pull"]))
        charged = [e for e in events[name] if e["kind"] == "host_request_startup"]
        assert {r: sum(1 for e in charged if e["request"] == r) for r in ("probe", "pull")} == asked
    for name, ev in events.items():  # one message charge per point-to-point message logged
        costs = json.loads((run_dir / "results" / f"{name}.json").read_text())["host_costs"]
        assert costs["message"]["count"] == sum(1 for e in ev if e.get("dir") in ("tx", "rx")) > 0, name
    for w in range(W):
        prof = json.loads((run_dir / "results" / f"worker{w}.json").read_text())["ibatch_profile"]
        assert prof["startup_s"] >= startup_s  # the probe waits for a server's start-up
        single = [e for e in events[f"worker{w}"] if e["kind"] == "pull_batch" and e["profiling"]]
        assert len(single) == 3 * P
        # each layer's pull pays it too (at least half: a sleep may give back an earlier overshoot)
        assert all(e["dur"] >= startup_s / 2 for e in single)
