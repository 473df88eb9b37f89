"""Per-message host cost of the transport (``host.message_overhead_us``: the software cost per
message sent and per message received).

Two processes over gloo on loopback (:func:`_member`): rank 0 sends, rank 1 receives. With a
host model stating a message overhead, every point-to-point message is charged exactly one
``message`` (its payload bytes, no event span) on each end: ``send`` and ``isend`` before the
message is posted (an ``isend``'s charge is there before any ``wait``), ``recv`` on return and
an ``irecv`` in its first ``wait`` only (not when posted, not again in a second ``wait``).
Transfers marked ``message=False`` and collectives are not charged; with an overhead of 0
nothing is (no statistics at all). The data still arrives intact.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from testbed.loopback import free_port
from traffic.hostmodel import HostModel
from traffic.hostmodel.costs import HostCosts
from traffic.runtime.events import EventLog, read_events

OVERHEAD_S = 2e-4
SCALE = 2.0
SIZES = [1, 1_000, 65_539]  # float32 elements per message
PAYLOADS = [4 * n for n in SIZES]


class _Spy(HostCosts):
    """HostCosts that also records every charge as ``(kind, nbytes, span)``."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.charged: list[tuple] = []

    @contextmanager
    def charge(self, kind, *, nbytes=0, span=True, **fields):
        self.charged.append((kind, nbytes, span))
        with super().charge(kind, nbytes=nbytes, span=span, **fields):
            yield


def _data(n: int, k: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1000 * k


def _exchange(tr, rank: int, tag: int, snap, message: bool = True) -> bool:
    """Blocking then asynchronous transfers of :data:`SIZES` from rank 0 to rank 1; returns
    whether every received tensor is the one sent. ``snap(label)`` records the charges."""
    ok = True
    if rank == 0:
        for k, n in enumerate(SIZES):
            tr.send(_data(n, k), 1, tag=tag, message=message)
        snap("blocking")
        pend = [tr.isend(_data(n, k), 1, tag=tag + 1, message=message) for k, n in enumerate(SIZES)]
        snap("posted")
        tr.wait_all(pend)
        snap("waited")
    else:
        for k, n in enumerate(SIZES):
            buf = torch.empty(n)
            assert tr.recv(buf, 0, tag=tag, message=message) == 0
            ok &= torch.equal(buf, _data(n, k))
        snap("blocking")
        bufs = [torch.empty(n) for n in SIZES]
        pend = [tr.irecv(b, None, tag=tag + 1, message=message) for b in bufs]
        snap("posted")
        tr.wait_all(pend)
        snap("waited")
        assert [p.wait() for p in pend] == [0] * len(SIZES)  # idempotent: no second charge
        snap("waited twice")
        ok &= all(torch.equal(b, _data(n, k)) for k, (b, n) in enumerate(zip(bufs, SIZES)))
    return ok


def _member(rank: int, port: int, out_dir: str) -> None:
    from traffic.runtime.transport import Transport

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out: dict = {"ok": True}
    log = EventLog(os.path.join(out_dir, f"events{rank}.jsonl"), f"p{rank}", "worker", rank)

    costs = _Spy(HostModel(message_overhead_s=OVERHEAD_S), SCALE, log)
    tr = Transport(log, rank, 2, costs=costs)

    def snap(phase):
        return lambda label: out.setdefault(phase, {}).__setitem__(label, list(costs.charged))

    out["ok"] &= _exchange(tr, rank, 10, snap("messages"))
    out["ok"] &= _exchange(tr, rank, 20, snap("not messages"), message=False)
    x = torch.ones(SIZES[1])
    tr.all_reduce(x)
    tr.broadcast(x, 0)
    tr.barrier()
    out["after collectives"] = list(costs.charged)
    out["summary"] = costs.summary()

    # an overhead of 0 (or no costs at all): nothing charged, no statistics
    zero = _Spy(HostModel(message_overhead_s=0.0), SCALE)
    out["ok"] &= _exchange(Transport(None, rank, 2, costs=zero), rank, 30, lambda label: None)
    out["zero"] = (list(zero.charged), zero.summary())
    out["ok"] &= _exchange(Transport(None, rank, 2), rank, 40, lambda label: None)
    log.close()
    torch.save(out, os.path.join(out_dir, f"costs{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("message_costs")
    mp.spawn(_member, args=(free_port(), str(d)), nprocs=2, join=True)
    return [torch.load(d / f"costs{r}.pt") for r in range(2)], d


def test_data_arrives_intact(results):
    res, _ = results
    assert res[0]["ok"] and res[1]["ok"]


def test_one_charge_per_message_on_each_end(results):
    res, _ = results
    one = [("message", b, False) for b in PAYLOADS]
    sender, receiver = res[0]["messages"], res[1]["messages"]
    assert sender["blocking"] == one == receiver["blocking"]
    assert sender["posted"] == one + one  # isend: charged before posting, before any wait
    assert sender["waited"] == one + one
    assert receiver["posted"] == one  # irecv: nothing until the message is in
    assert receiver["waited"] == receiver["waited twice"] == one + one


def test_statistics_count_each_message_at_its_stated_cost(results):
    res, _ = results
    for r in res:
        s = r["summary"]
        assert set(s) == {"message"}
        m = s["message"]
        n = 2 * len(SIZES)
        assert m["count"] == n and m["modelled"]
        assert m["emulated_s"] == pytest.approx(n * OVERHEAD_S)
        assert m["budget_s"] == pytest.approx(SCALE * n * OVERHEAD_S)


def test_marked_transfers_and_collectives_are_not_charged(results):
    res, _ = results
    for r in res:
        final = r["messages"]["waited"]
        assert all(v == final for v in r["not messages"].values())
        assert r["after collectives"] == final


def test_no_overhead_charges_nothing(results):
    res, _ = results
    for r in res:
        assert r["zero"] == ([], {})


def test_message_charges_are_not_spans(results):
    res, d = results
    for rank in range(2):
        kinds = [e["kind"] for e in read_events(d / f"events{rank}.jsonl")]
        assert "host_message" not in kinds
        assert kinds.count("send" if rank == 0 else "recv") == 4 * len(SIZES)  # the transport still logs
