"""PHub's frames and host costs: chunks packed into frames, charged one by one.

* **Frames** (:mod:`traffic.schemes.phub.frames`): every chunk in exactly one frame, of one
  (job, interface, thread, layer), within ``frame_bytes`` unless alone; the buffer layout
  (payloads, then each chunk's metadata) and the reply of a refused sender.
* **Charges per logical chunk** (PHub Sec. 3.2.2, 3.2.4, 4.8): :class:`ChargeBatch`
  makes one accountant operation per chunk (or one block charged as its chunks) and one
  span per batch; a frame's one real optimizer step equals one step per chunk
  (:func:`step_frame`); the ring of a frame
  charges each chunk the messages of its own ring (:func:`ring_messages` checked against the
  transfers :func:`ring_allreduce` makes).
* **End to end** on loopback, ``digits_mlp`` (40 chunks of at most 32 KB), with a host
  model that states aggregation, optimizer and per-message costs: every worker equals the
  single-process reference with 32 KB chunks in frames; per server and iteration,
  ``aggregate`` is charged chunks x copies, ``optimizer`` chunks, ``message`` one per chunk
  copy received and sent (plus the set-up messages), and the spans account for every
  charge. With hierarchical reduction the ring's local sums and its per-chunk messages are
  charged too.
"""

from __future__ import annotations

import json

import pytest
import torch

from testbed.loopback import run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from traffic.collectives.ring import ring_allreduce
from traffic.hostmodel import HostModel
from traffic.hostmodel.costs import HostCosts
from traffic.reference import reference_train
from traffic.runtime.events import EventLog, read_events
from traffic.runtime.trainer import make_optimizer
from traffic.schemes.phub import ACCEPTED, FRAME_BYTES, META, REJECTED, assign_chunks, pack_frames
from traffic.schemes.phub.charges import ChargeBatch
from traffic.schemes.phub.frames import refused_reply
from traffic.schemes.phub.hierarchy import ring_messages, ring_reduce
from traffic.schemes.phub.tenancy import token_meta
from traffic.schemes.phub.update import step_frame
from traffic.spec import OptimizerSpec

ITERS, BATCH = 3, 16
NUMELS = [32768, 512, 262144, 512, 5120, 10]  # digits_mlp's keys
LAYER_OF_KEY = [0, 0, 1, 1, 2, 2]
HOST = {"aggregate_gb_per_s": 5.0, "optimizer_gb_per_s": 5.0, "message_overhead_us": 1.0}


def layer_of(c):
    return LAYER_OF_KEY[c.key]


# ----------------------------------------------------------------------------- frames


@pytest.mark.parametrize("frame_elems", [0, 8192, 65536, 10**6])
def test_pack_frames_covers_groups_and_bounds(frame_elems):
    chunks = assign_chunks(NUMELS, 8192, interfaces=3, threads=2, jobs=2)
    frames = pack_frames(chunks, frame_elems, layer_of)
    assert [f.id for f in frames] == list(range(len(frames)))
    assert sorted(c.id for f in frames for c in f.chunks) == [c.id for c in chunks]  # each chunk once
    for f in frames:
        assert len({(c.job, c.server, c.thread, layer_of(c)) for c in f.chunks}) == 1
        assert f.layer == layer_of(f.chunks[0]) and f.numel == sum(c.numel for c in f.chunks)
        assert [c.id for c in f.chunks] == sorted(c.id for c in f.chunks)
        assert len(f.chunks) == 1 or f.numel <= frame_elems
        assert f.size == f.numel + META * len(f.chunks)
    if frame_elems == 0:
        assert len(frames) == len(chunks)
    if frame_elems >= 65536:  # layer 1's 32 chunks per job go to 6 (interface, thread) pairs
        assert len(frames) < len(chunks) // 2
    if frame_elems == 10**6:  # unbounded: one frame per (job, interface, thread, layer) used
        assert len(frames) == len({(c.job, c.server, c.thread, layer_of(c)) for c in chunks})
    assert frames == pack_frames(chunks, frame_elems, layer_of)
    with pytest.raises(ValueError):
        pack_frames(chunks, -1, layer_of)


def test_frame_layout_and_refused_reply():
    chunks = assign_chunks([5, 3, 4], 8, interfaces=1, threads=1)
    (f,) = pack_frames(chunks, 100, lambda c: 0)
    assert f.offsets == [0, 5, 8] and f.size == 12 + 3 * META
    store = torch.arange(float(f.size))
    for j in range(3):
        f.meta_slots(store, j).copy_(token_meta(ACCEPTED))
    assert [f.payload(store, j).tolist() for j in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11]]
    assert [f.meta(store, j) for j in range(3)] == [ACCEPTED] * 3
    reply = refused_reply(store, f, [1])
    assert f.payload(reply, 1).tolist() == [0, 0, 0] and f.meta(reply, 1) == REJECTED
    assert torch.equal(f.payload(reply, 0), f.payload(store, 0)) and f.meta(reply, 2) == ACCEPTED
    assert f.meta(store, 1) == ACCEPTED  # the store itself is untouched


# ----------------------------------------------------------------------------- charges


def test_charge_batch_charges_each_chunk_and_records_one_span(tmp_path):
    costs = HostCosts(HostModel(aggregate_bytes_per_s=1e9), 1.0, EventLog(tmp_path / "e.jsonl", "p", "server", 0))
    x = torch.zeros(100)
    with ChargeBatch(costs, "aggregate", iteration=2, frame=7) as batch:
        for n in (1000, 2000, 3000):
            with batch.charge(n):
                x.add_(1)
    with ChargeBatch(costs, "aggregate", iteration=2, frame=8):
        pass  # empty: no span
    costs.events.close()
    s = costs.summary()["aggregate"]
    assert s["count"] == 3 and s["emulated_s"] == pytest.approx(6e-6)
    (span,) = [e for e in read_events(tmp_path / "e.jsonl") if e["kind"] == "host_aggregate"]
    assert (span["ops"], span["bytes"], span["frame"], span["iteration"]) == (3, 6000, 7, 2)
    assert span["emulated_s"] == pytest.approx(6e-6) and span["real_s"] <= span["dur"]
    assert torch.equal(x, torch.full((100,), 3.0))
    with ChargeBatch(None, "aggregate") as batch:  # no accountant: the work still runs
        with batch.charge(10):
            x.add_(1)
    assert x[0] == 4


def test_charge_batch_charges_one_block_as_its_chunks():
    costs = HostCosts(HostModel(aggregate_bytes_per_s=1e9), 1.0)
    with ChargeBatch(costs, "aggregate") as batch:
        with batch.charge(6000, ops=3):
            pass
    assert (batch.count, batch.nbytes) == (3, 6000) and batch.emulated_s == pytest.approx(6e-6)
    assert costs.summary()["aggregate"]["count"] == 3


@pytest.mark.parametrize("counts", [[3, 3, 3], [2, 3, 1], [3, 0, 2]])
def test_step_frame_equals_one_step_per_chunk(counts):
    """One real step over a frame (chunks skipped where no copy was accepted) gives the values
    and momentum of one SGD step per chunk, over several rounds, and charges per chunk."""
    spec = OptimizerSpec(lr=0.1, momentum=0.9, weight_decay=1e-3)
    chunks = assign_chunks([5, 3, 4], 8, interfaces=1, threads=1)
    (f,) = pack_frames(chunks, 100, lambda c: 0)
    torch.manual_seed(0)
    init = torch.randn(f.numel)
    value = torch.nn.Parameter(init.clone())
    opt = make_optimizer([value], spec)
    ref = [torch.nn.Parameter(f.payload(init, j).clone()) for j in range(3)]
    ref_opt = [make_optimizer([p], spec) for p in ref]
    costs = HostCosts(HostModel(optimizer_bytes_per_s=1e9), 1.0)
    for rnd in range(3):
        agg = torch.randn(f.numel)
        cs = counts if rnd != 1 else [1, 1, 1]  # a skipped chunk is stepped again later
        for j in range(3):
            if cs[j]:
                ref[j].grad = f.payload(agg, j) / cs[j]
                ref_opt[j].step()
        step_frame(f, value, opt, agg.clone(), cs, costs)
        for j in range(3):
            assert torch.allclose(f.payload(value.detach(), j), ref[j].detach(), atol=1e-6), (rnd, j)
    stepped = sum(c > 0 for c in counts) * 2 + 3
    assert costs.summary()["optimizer"]["count"] == stepped
    with pytest.raises(ValueError, match="entries"):
        step_frame(f, value, opt, torch.zeros(f.numel), [1, 1])


class FakeTransport:
    """Records the point-to-point transfers a ring makes (and whether they were messages)."""

    def __init__(self, rank):
        self.rank, self.events, self.calls = rank, None, []

    def _op(self, op, tensor, peer, message=True, **_):
        self.calls.append((op, tensor.numel(), message))
        return self

    def isend(self, tensor, dst, **kw):
        return self._op("send", tensor, dst, **kw)

    def irecv(self, tensor, src, **kw):
        return self._op("recv", tensor, src, **kw)

    def wait(self):
        return None

    @staticmethod
    def wait_all(pendings):
        for p in pendings:
            p.wait()


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("numel", [0, 1, 2, 4, 7, 8192])
def test_ring_messages_are_the_rings_transfers(p, numel):
    for i in range(p):
        tr = FakeTransport(10 + i)
        ring_allreduce(tr, torch.zeros(numel), [10 + m for m in range(p)])
        sent = sum(op == "send" for op, _, _ in tr.calls)
        received = sum(op == "recv" for op, _, _ in tr.calls)
        assert ring_messages(numel, p, i) == (sent, received)
        assert all(n > 0 for _, n, _ in tr.calls)


def test_ring_of_a_frame_charges_each_chunks_messages_and_sums():
    costs = HostCosts(HostModel(message_overhead_s=1e-7, aggregate_bytes_per_s=1e12))
    chunks, p = [8192, 10, 1, 3], 3
    tr = FakeTransport(21)
    ring_reduce(tr, torch.zeros(sum(chunks)), [20, 21, 22], frame_id=4, racks=p, chunk_numels=chunks, costs=costs)
    assert tr.calls and not any(message for _, _, message in tr.calls)  # the transfers are not messages
    s = costs.summary()
    assert s["message"]["count"] == sum(sum(ring_messages(n, p, 1)) for n in chunks)
    assert s["aggregate"]["count"] == p - 1  # the ring's local sums, on the frame
    with pytest.raises(ValueError):
        ring_reduce(FakeTransport(21), torch.zeros(5), [20, 21, 22], 4, p, chunk_numels=[2, 2], costs=costs)


# ----------------------------------------------------------------------------- end to end


def _results(run_dir):
    procs = json.loads((run_dir / "processes.json").read_text())["processes"]
    return {p["name"]: json.loads((run_dir / "results" / f"{p['name']}.json").read_text()) for p in procs}


def _ops(run_dir, proc, kind):
    return sum(e["ops"] for e in read_events(run_dir / "events" / f"{proc}.jsonl") if e["kind"] == f"host_{kind}")


def _assert_equal(state, ref, what):
    assert set(state) == set(ref)
    for k in ref:
        torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"{what} {k}")


def test_pbox_at_32kb_in_frames_equals_reference_and_charges_every_chunk(tmp_path):
    exp = experiment(
        "phub",
        iterations=ITERS,
        batch_size=BATCH,
        options={"server_threads": 2},
        servers={"config": "NCC", "interfaces": 2},
    )
    exp = from_dict({**exp.to_dict(), "host": HOST})
    run_dir = run_local(exp, tmp_path / "pbox")
    ref = reference_train(exp.workload, 4)
    for w in range(4):
        _assert_equal(torch.load(run_dir / "params" / f"worker{w}.pt"), ref, f"worker{w}")
    chunks = assign_chunks(NUMELS, 32768 // 4, 2, 2)
    frames = pack_frames(chunks, FRAME_BYTES // 4, layer_of)
    assert len(frames) < len(chunks) // 2  # frames do pack chunks
    res, W = _results(run_dir), 4
    for s in range(2):
        own = [c for c in chunks if c.server == s]
        r, name = res[f"server{s}"], f"server{s}"
        assert (r["chunks"], r["frames"]) == (len(own), len([f for f in frames if f.server == s]))
        hc = r["host_costs"]
        assert hc["aggregate"]["count"] == ITERS * W * len(own)  # every copy of every chunk, as it arrives
        assert hc["optimizer"]["count"] == ITERS * len(own)  # every chunk, once per iteration
        # per-message overhead per chunk: create_service + W connects, the initial values,
        # then per iteration W copies received and W replies sent per chunk
        assert hc["message"]["count"] == 1 + W + len(own) + ITERS * 2 * W * len(own)
        assert all(hc[k]["modelled"] for k in ("aggregate", "optimizer", "message"))
        # the timeline shows every charge: one span per batch, its ops adding up
        assert _ops(run_dir, name, "aggregate") == hc["aggregate"]["count"]
        assert _ops(run_dir, name, "optimizer") == hc["optimizer"]["count"]
        assert _ops(run_dir, name, "message") == hc["message"]["count"] - 1 - W  # set-up: the transport's
    # a worker other than the first: the token, 2 connects, then a message per chunk each way
    assert res["worker1"]["host_costs"]["message"]["count"] == 1 + 2 + ITERS * 2 * len(chunks)


def test_hierarchical_charges_the_rings_sums_and_messages(tmp_path):
    exp = experiment(
        "phub",
        racks=2,
        hosts_per_rack=2,
        iterations=ITERS,
        batch_size=BATCH,
        options={"hierarchical": True, "server_threads": 2},
        servers={"count": 1, "placement": "dedicated", "scope": "per_rack"},
    )
    exp = from_dict({**exp.to_dict(), "host": HOST})
    run_dir = run_local(exp, tmp_path / "hier")
    ref = reference_train(exp.workload, 4)
    for w in range(4):
        _assert_equal(torch.load(run_dir / "params" / f"worker{w}.pt"), ref, f"worker{w}")
    chunks = assign_chunks(NUMELS, 32768 // 4, 1, 2)  # every PBox holds every chunk
    frames = pack_frames(chunks, FRAME_BYTES // 4, layer_of)
    res, N, R = _results(run_dir), 2, 2
    for s in range(R):
        hc = res[f"server{s}"]["host_costs"]
        # the rack's N copies of each chunk, then one local sum of the ring per frame (R - 1 steps)
        assert hc["aggregate"]["count"] == ITERS * (N * len(chunks) + (R - 1) * len(frames))
        assert hc["optimizer"]["count"] == ITERS * len(chunks)
        ring = sum(sum(ring_messages(c.numel, R, s)) for c in chunks)  # each chunk's own ring
        assert hc["message"]["count"] == 1 + N + len(chunks) + ITERS * (2 * N * len(chunks) + ring)
