"""Pipe-SGD: codecs, the point-to-point ring allreduce, the scheme's iteration dependency.

* Codecs (no processes): the element-wise error bounds of 16-bit truncation and 8-bit
  quantization hold, and the payloads have the real wire sizes (2 bytes/element; 1
  byte/element + a 4-byte scale).
* Ring (4 processes over gloo on loopback, :func:`_ring_member`): uncompressed, the
  reduce-scatter + all-gather over p2p transfers equals ``torch.distributed.all_reduce`` to
  float tolerance; compressed, every member gets bit-identical values within
  ``p`` (compressions per element) times the codec's bound of the largest partial sum; the
  bytes sent are the payload sizes.
* Scheme (4 workers, ``run_local``, digits + the paper's MLP shape 64-500-500-10): ``K = 1``
  ends with the parameters of a single process on the global batches (D-Sync); ``K = 2``
  with those of a single process whose update at the end of iteration ``t`` applies the
  global-batch gradient of iteration ``t - 1`` (zero at ``t = 0``: a step of weight decay and
  momentum only) -- and these differ from the synchronous ones far beyond the tolerance.
  In emulated compute with quantization, the communication of iteration ``t`` runs on the
  comm thread while iteration ``t + 1`` computes, and the ring sends 1 byte/element.
"""

from __future__ import annotations

import json
import os
import typing

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common.errors import SpecError
from testbed.loopback import free_port, run_local
from tests.conftest import experiment
from traffic import schemes
from traffic.collectives.ring import compressions_per_element, ring_allreduce, ring_blocks
from traffic.compression import CODECS, Identity, Quantization, Truncation, make_codec
from traffic.data import GlobalBatches, load_dataset
from traffic.models import build_model
from traffic.reference import reference_train
from traffic.runtime.events import read_events
from traffic.runtime.trainer import make_optimizer
from traffic.schemes.pipe_sgd import Compression, grad_iteration

# ----------------------------------------------------------------------------- codecs


def _vectors():
    g = torch.Generator().manual_seed(0)
    n = 20_001
    wide = torch.randn(n, generator=g) * torch.logspace(-30, 30, n)  # magnitudes over 60 decades
    v = [wide, torch.randn(n, generator=g) * 1e-3, torch.zeros(7), torch.tensor([1e-40, -3e-42, 0.0, 1.0])]
    return v


@pytest.mark.parametrize("codec", [Truncation(), Quantization()], ids=lambda c: c.name)
def test_codec_error_bounds_and_wire_size(codec):
    for x in _vectors():
        n = x.numel()
        payload = codec.encode(x)
        assert payload.dtype == codec.payload_dtype and payload.numel() == codec.payload_numel(n)
        y = codec.decode(payload, n)
        assert y.dtype == torch.float32 and y.shape == x.shape
        err, bound = (y - x).abs(), codec.error_bound(x)
        assert bool((err <= bound).all()), f"{codec.name}: max err/bound {float((err / bound).max())}"
    assert Truncation().payload_bytes(1000) == 2000 and Quantization().payload_bytes(1000) == 1004
    # truncation rounds toward zero and keeps the sign; the bound is tight within a factor ~2
    x = torch.tensor([1 + 2.0**-7 + 2.0**-8, -(1 + 2.0**-7 + 2.0**-8)])
    y = Truncation().decode(Truncation().encode(x), 2)
    assert y.tolist() == [1 + 2.0**-7, -(1 + 2.0**-7)]
    # quantization: the largest magnitude is exact, others within max/254
    q = Quantization()
    x = torch.tensor([-2.0, 1.0, 0.01, 0.0])
    y = q.decode(q.encode(x), 4)
    assert y[0] == -2.0 and y[3] == 0.0 and abs(float(y[1]) - 1.0) <= 2 / 254
    with pytest.raises(SpecError, match="workload.options.compression"):
        make_codec("zip")


def test_truncation_keeps_exactly_the_upper_16_bits():
    """Decoded bit patterns are the float32's upper half and 16 zero bits, for normal,
    subnormal, zero, infinite and NaN values alike."""
    special = torch.tensor([0.0, -0.0, 1e-40, -3e-42, float("inf"), -float("inf"), float("nan"), 3.4e38])
    for x in [*_vectors(), special]:
        y = Truncation().decode(Truncation().encode(x), x.numel())
        want = x.view(torch.int32) & ~0xFFFF  # the low 16 bits cleared
        assert torch.equal(y.view(torch.int32), want)


@pytest.mark.parametrize("codec", [Identity(), Truncation(), Quantization()], ids=lambda c: c.name)
def test_decoding_into_a_block_gives_the_values_of_a_new_tensor(codec):
    for x in _vectors():
        n = x.numel()
        payload = codec.encode(x)
        buf = torch.full((n + 3,), 7.0)
        got = codec.decode(payload, n, out=buf[1 : n + 1])
        assert got.data_ptr() == buf[1:].data_ptr()  # written in place, nothing beside it
        assert torch.equal(got.view(torch.int32), codec.decode(payload, n).view(torch.int32))
        assert buf[0] == 7.0 and bool((buf[n + 1 :] == 7.0).all())


@pytest.mark.parametrize("codec", [Identity(), Truncation(), Quantization()], ids=lambda c: c.name)
@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_payload_never_shares_memory_with_its_vector(codec, n):
    """A ring decodes a block's own payload back into the block: the payload is a copy,
    for a vector of one element too (a strided view of one element counts as contiguous)."""
    x = torch.randn(n)
    payload = codec.encode(x)
    lo, hi = x.data_ptr(), x.data_ptr() + 4 * n
    assert not lo <= payload.data_ptr() < hi
    got = codec.decode(payload, n, out=x)
    assert got.data_ptr() == lo


# ----------------------------------------------------------------------------- ring over p2p

P = 4
SIZES = [1, 3, 1_001, 65_539]


def _data(rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + n)
    return torch.randn(n, generator=g) * (rank + 1) * 1e-2


def _ring_member(rank: int, port: int, out_dir: str) -> None:
    from traffic.runtime.transport import Transport

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    tr = Transport(None, rank, P)
    ranks = [0, 2, 1, 3]  # ring order need not be rank order
    out = {}
    for n in SIZES:
        ref = _data(rank, n)
        dist.all_reduce(ref)
        out[("all_reduce", n)] = ref
        for codec in (Identity(), Truncation(), Quantization()):
            x = _data(rank, n)
            st = ring_allreduce(tr, x, ranks, codec, tag=10)
            out[(codec.name, n)] = x
            out[(codec.name, n, "bytes")] = st.bytes_sent
            out[(codec.name, n, "steps")] = st.steps
    torch.save(out, os.path.join(out_dir, f"ring{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("ring")
    mp.spawn(_ring_member, args=(free_port(), str(d)), nprocs=P, join=True)
    return [torch.load(d / f"ring{r}.pt") for r in range(P)]


def _sent_blocks(n: int, pos: int) -> list[int]:
    """Sizes of the blocks the member at ring position ``pos`` sends (module docstring of ring)."""
    sizes = [b.numel() for b in ring_blocks(torch.empty(n), P)]
    rs = [sizes[(pos - s) % P] for s in range(P - 1)]
    ag = [sizes[(pos + 1 - s) % P] for s in range(P - 1)]
    return rs + ag


def test_uncompressed_ring_equals_all_reduce(ring_results):
    for r, res in enumerate(ring_results):
        for n in SIZES:
            torch.testing.assert_close(res[("none", n)], res[("all_reduce", n)], rtol=1e-5, atol=1e-7)
            assert res[("none", n, "steps")] == 2 * (P - 1)
            pos = [0, 2, 1, 3].index(r)
            assert res[("none", n, "bytes")] == 4 * sum(_sent_blocks(n, pos))
    for n in SIZES:  # every member holds the same sum
        assert all(torch.equal(res[("none", n)], ring_results[0][("none", n)]) for res in ring_results)


@pytest.mark.parametrize("codec", [Truncation(), Quantization()], ids=lambda c: c.name)
def test_compressed_ring_error_within_steps_times_bound(codec, ring_results):
    k = compressions_per_element(P)
    assert k == P
    for n in SIZES:
        xs = [_data(r, n).double() for r in range(P)]
        exact = sum(xs)
        magnitude = sum(x.abs() for x in xs).float()  # bounds every partial sum's magnitude
        bound = torch.cat([codec.error_bound(b) for b in ring_blocks(magnitude, P)]).double()
        # the partial sums also carry the earlier steps' errors (<= 3 %) and float32 rounding
        bound = k * bound * 1.05 + P * magnitude.double() * 2.0**-23
        got = ring_results[0][(codec.name, n)]
        err = (got.double() - exact).abs()
        assert bool((err <= bound).all()), f"{codec.name} n={n}: max err/bound {float((err / bound).max())}"
        assert float(err.max()) > 0 or n < P, "compression must actually change the values"
        for r, res in enumerate(ring_results):
            assert torch.equal(res[(codec.name, n)], got), "members must end with identical values"
            pos = [0, 2, 1, 3].index(r)
            sent = _sent_blocks(n, pos)
            expect = 2 * sum(sent) if codec.name == "truncation" else sum(s + 4 for s in sent)
            assert res[(codec.name, n, "bytes")] == expect


# ----------------------------------------------------------------------------- the scheme

W, ITERS, BATCH, SEED = 4, 5, 16, 3
OPT = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}


def _experiment(options: dict, compute: dict | None = None, model: str = "mnist_mlp"):
    return experiment(
        "pipe_sgd",
        hosts_per_rack=W,
        model=model,
        workers=W,
        iterations=ITERS,
        batch_size=BATCH,
        eval_every=0,
        seed=SEED,
        optimizer=OPT,
        options=options,
        **({"compute": compute} if compute else {}),
    )


def delayed_reference(workload, workers: int, K: int) -> dict[str, torch.Tensor]:
    """One process on the global batches; the update at the end of iteration ``t`` applies
    the global-batch gradient of iteration ``t - (K - 1)`` (zeros before that)."""
    data = load_dataset(workload.dataset, workload.seed)
    model = build_model(workload.model, workload.seed, data.input_shape, data.num_classes)
    batches = GlobalBatches(data, workload.batch_size, workers, workload.seed)
    params = list(model.parameters())
    opt = make_optimizer(params, workload.optimizer)
    history = []
    for t in range(workload.iterations):
        x, y = batches.global_batch(t)
        model.zero_grad(set_to_none=True)
        model.loss(model(x), y).backward()
        history.append([p.grad.clone() for p in params])
        j = grad_iteration(t, K)
        for i, p in enumerate(params):
            p.grad = history[j][i] if j is not None else torch.zeros_like(p)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_params(run_dir, ref, what):
    for w in range(W):
        state = torch.load(run_dir / "params" / f"worker{w}.pt")
        assert set(state) == set(ref)
        for k in ref:
            torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"{what} worker{w} {k}")


def test_grad_iteration_and_options():
    assert [grad_iteration(t, 2) for t in range(4)] == [None, 0, 1, 2]
    assert [grad_iteration(t, 1) for t in range(3)] == [0, 1, 2]
    assert [grad_iteration(t, 3) for t in range(4)] == [None, None, 0, 1]


BAD_OPTIONS = [
    {"K": 0},
    {"K": 1.5},
    {"K": True},
    {"compression": "zip"},
    {"bucket_mb": -1},
    {"bucket_mb": True},
    {"nope": 1},
]


@pytest.mark.parametrize("bad", BAD_OPTIONS)
def test_bad_options_are_named_in_the_spec(bad):
    with pytest.raises(SpecError, match="workload.options." + next(iter(bad))):
        _experiment(bad)


def test_option_validation():
    scheme = schemes.get("pipe_sgd")
    assert scheme.name == "pipe_sgd"
    assert set(typing.get_args(Compression)) == set(CODECS)  # every codec, and only codecs
    o = scheme.Options()
    assert (o.K, o.compression, o.bucket_mb) == (2, "none", None)
    o = scheme.validate_options({"K": 1, "compression": "quantization", "bucket_mb": 25})
    assert (o.K, o.compression, o.bucket_mb) == (1, "quantization", 25.0)


@pytest.mark.parametrize("bad", BAD_OPTIONS)
def test_bad_options_are_named_by_the_scheme(bad):
    with pytest.raises(SpecError, match="workload.options." + next(iter(bad))):
        schemes.get("pipe_sgd").validate_options(bad)


@pytest.mark.parametrize("K", [1, 2])
def test_iteration_dependency_matches_reference(K, tmp_path):
    exp = _experiment({"K": K})
    run_dir = run_local(exp, tmp_path / f"k{K}")
    sync = reference_train(exp.workload, W)
    if K == 1:
        _assert_params(run_dir, sync, "K=1 (D-Sync)")
        return
    ref = delayed_reference(exp.workload, W, K)
    gap = max((ref[k] - sync[k]).abs().max().item() for k in ref)
    assert gap > 1e-3, "the delayed update must differ from the synchronous one far beyond the tolerance"
    _assert_params(run_dir, ref, f"K={K}")
    events = read_events(run_dir / "events" / "worker1.jsonl")
    updates = sorted((e for e in events if e["kind"] == "update"), key=lambda e: e["iteration"])
    assert [(e["iteration"], e["grad_iteration"]) for e in updates] == [(t, grad_iteration(t, K)) for t in range(ITERS)]
    ar = [e for e in events if e["kind"] == "allreduce"]
    assert sorted(e["iteration"] for e in ar) == list(range(ITERS)) and all(e["thread"] == "comm" for e in ar)
    assert all(e["bytes"] == 4 * 288_010 for e in ar)  # 64*500+500 + 500*500+500 + 500*10+10


def test_emulated_compute_overlaps_and_compresses(tmp_path):
    """Quantized Pipe-SGD in emulated compute: the allreduce of iteration t starts before the
    forward pass of t + 1 ends (the two threads overlap), and sends 1 byte/element + scale."""
    model = build_model("mnist_mlp", 0, device="meta")
    prof = {
        "model": "mnist_mlp",
        "device": "test",
        "batch_size": BATCH,
        "source": "test",
        "method": "measured",
        "derived": False,
        "layers": [
            {"index": i, "name": n, "forward_s": 0.02, "backward_s": 0.02} for i, n in enumerate(model.layer_names)
        ],
    }
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    exp = _experiment({"K": 2, "compression": "quantization"}, {"mode": "emulated", "profile": str(path)})
    run_dir = run_local(exp, tmp_path / "emu")
    n = 648_010
    for w in range(W):
        events = read_events(run_dir / "events" / f"worker{w}.jsonl")
        ar = {e["iteration"]: e for e in events if e["kind"] == "allreduce"}
        fwd_end = {e["iteration"]: e["ts"] + e["dur"] for e in events if e["kind"] == "forward" and e["layer"] == 2}
        for t in range(ITERS - 1):
            assert ar[t]["ts"] < fwd_end[t + 1], f"worker{w}: allreduce of {t} did not overlap iteration {t + 1}"
        sizes = [b.numel() for b in ring_blocks(torch.empty(n), W)]
        pos = w  # ring order = worker order
        sent = [sizes[(pos - s) % W] for s in range(W - 1)] + [sizes[(pos + 1 - s) % W] for s in range(W - 1)]
        assert all(
            e["wire_bytes"] == sum(s + 4 for s in sent) and e["compression"] == "quantization" for e in ar.values()
        )
        tx = [e for e in events if e["kind"] in ("reduce_scatter", "all_gather") and e["dir"] == "tx"]
        assert len(tx) == ITERS * 2 * (W - 1) and all(e["thread"] == "comm" for e in tx)
        assert sum(e["kind"] == "compress" for e in events) == ITERS * W


# ----------------------------------------------------------------------------- timing model


def test_timing_model_equations():
    from analysis.paper_models.pipe_sgd import (
        Network,
        beta_from_mbps,
        iteration_model,
        pipe_ideal_total_s,
        pipe_pipelined_total_s,
        pipe_sequential_total_s,
        pipe_total_s,
        ring_allreduce_s,
        ring_codec_s,
        scaling_efficiency,
        sync_total_s,
    )

    beta = beta_from_mbps(10_000)
    assert beta == pytest.approx(8e-10)
    net = Network(alpha_s=50e-6, beta_s_per_byte=beta, gamma_s_per_byte=1e-10, sync_s=1e-4)
    n, p = 244e6, 4  # AlexNet's gradient in bytes, four workers
    ring = ring_allreduce_s(n, p, net)
    assert ring == pytest.approx(6 * 50e-6 + 1.5 * n * beta + 0.75 * n * 1e-10 + 1e-4)  # eq. (5)'s term
    assert ring_allreduce_s(n, p, net, segments=8) > ring  # eq. (6): L alpha, L S
    assert ring_allreduce_s(n, p, net, wire_ratio=0.5) < ring and ring_allreduce_s(n, 1, net) == 0
    T, up, comp = 100, 0.002, 0.03
    assert sync_total_s(T, up, comp, ring) == pytest.approx(T * (up + comp + ring))  # eq. (2)
    assert pipe_ideal_total_s(T, 2, up, comp, ring) == pytest.approx(sync_total_s(T, up, comp, ring) / 2)  # (3)
    assert pipe_total_s(T, up, comp, ring) == pytest.approx(T * ring)  # (4), comm-bound
    assert pipe_sequential_total_s(T, up, 0.01, 0.02, n, p, net) == pytest.approx(T * ring)
    # communication-bound: sequential (5) is no slower than pipelined (6) (the paper's conclusion)
    assert pipe_sequential_total_s(T, up, 0.01, 0.02, n, p, net) <= pipe_pipelined_total_s(
        T, up, 0.01, 0.002, n, p, 8, net
    )
    assert scaling_efficiency(up, comp, ring) == pytest.approx((up + comp) / ring)  # eq. (7)
    assert scaling_efficiency(up, comp, 0.001) == 1.0
    assert ring_codec_s(n, p, 1e-10, 2e-10) == pytest.approx(n * 1e-10 + 7 / 4 * n * 2e-10)
    d = iteration_model("D-Sync", K=1, n_bytes=n, p=p, net=net, l_comp=comp, l_up=up)
    q = iteration_model(
        "Pipe-SGD+Q",
        K=2,
        n_bytes=n,
        p=p,
        net=net,
        l_comp=comp,
        l_up=up,
        wire_ratio=0.25,
        encode_s_per_byte=1e-11,
        decode_s_per_byte=1e-11,
    )
    assert d.iteration_s == pytest.approx(up + comp + ring)
    assert q.iteration_s == pytest.approx(max(up + comp, q.l_comm + q.l_codec)) and q.iteration_s < d.iteration_s
    with pytest.raises(ValueError):
        beta_from_mbps(0)
