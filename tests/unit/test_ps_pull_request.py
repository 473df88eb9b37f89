"""``ps`` with ``pull_request: true``: MXNet KVStore's update notification, then pull request.

* Protocol pieces alone (:mod:`traffic.schemes.ps_pull_request`, over an in-memory
  transport): a worker requests a layer only once the notifications of all its shards, from
  every server, are in, one request per server holding shards of it, in the order layers
  complete; a server answers a request with its shards of that layer, charges
  ``request_startup`` once per request, and refuses a request that comes before the update
  notification, names another iteration or a layer it already answered.
* End to end on loopback (4 workers, 2 servers, the 512x512 key split over both): final
  parameters of every worker and the servers' shards equal the single-process reference
  (:mod:`traffic.reference`), bulk and with ``overlap``; per iteration every worker receives
  one notification per shard and sends one request per (layer with parameters, server
  holding shards of it); each server charges ``request_startup`` once per request it
  answered; the pulled bytes are the model's.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch

from common.errors import SpecError
from testbed.loopback import run_local
from testbed.spec import from_dict
from tests.conftest import assert_server_shards_match, experiment
from traffic.hostmodel import HostModel
from traffic.hostmodel.costs import HostCosts
from traffic.reference import reference_train
from traffic.rundir import read_json
from traffic.runtime.events import read_events
from traffic.schemes import get
from traffic.schemes.ps import assign_keys
from traffic.schemes.ps_pull_request import NOTIFY_TAG, PULL_REQUEST_TAG, NotifiedPuller, RequestResponder

# digits_mlp: keys (w0, b0, w1, b1, w2, b2) of layers 0, 0, 1, 1, 2, 2
NUMELS = [32768, 512, 262144, 512, 5120, 10]
KEY_LAYER = [0, 0, 1, 1, 2, 2]
BOUND = 100_000  # the 512x512 key is split over both servers
W, ITERS, BATCH, SERVERS = 4, 4, 16, 2
STARTUP_MS = 2.0


# ----------------------------------------------------------------------------- in-memory transport


class _Done:
    def wait(self):
        return None


class FakeTransport:
    """Point-to-point messages in memory: ``isend`` records, ``recv`` takes what the test feeds."""

    def __init__(self):
        self.sent: list[tuple[int, int, str, torch.Tensor]] = []  # (dst, tag, kind, payload copy)
        self._inbox: dict[tuple[int, int], queue.Queue] = {}
        self._lock = threading.Lock()

    def box(self, src: int, tag: int) -> queue.Queue:
        with self._lock:
            return self._inbox.setdefault((src, tag), queue.Queue())

    def feed(self, src: int, tag: int, values) -> None:
        self.box(src, tag).put(torch.tensor(values, dtype=torch.int64))

    def recv(self, buf, src, *, tag, kind, **fields):
        buf.copy_(self.box(src, tag).get(timeout=10))
        return src

    def isend(self, t, dst, *, tag, kind, **fields):
        with self._lock:
            self.sent.append((dst, tag, kind, t.detach().clone()))
        return _Done()

    @staticmethod
    def wait_all(pendings):
        for p in pendings:
            p.wait()

    def sent_with(self, tag):
        with self._lock:
            return [(dst, payload.tolist()) for dst, t, _, payload in self.sent if t == tag]


def _shards():
    return assign_keys(NUMELS, SERVERS, BOUND)


def test_the_layout_exercises_split_and_single_server_layers():
    shards = _shards()
    servers = {l: sorted({s.server for s in shards if KEY_LAYER[s.key] == l}) for l in range(3)}
    assert servers == {0: [0, 1], 1: [0, 1], 2: [1]}
    assert len(shards) == 7  # the 512x512 weight is two shards


def _wait_for(pred, timeout=10.0):
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.005)


def test_worker_requests_a_layer_once_every_shard_is_notified():
    shards = _shards()
    tr = FakeTransport()
    ranks = [10, 11]
    posted = []
    puller = NotifiedPuller(tr, shards, KEY_LAYER, ranks, 1, lambda it, s: posted.append((it, s.id)) or _Done())
    puller.start()
    by_layer = {l: [s for s in shards if KEY_LAYER[s.key] == l] for l in range(3)}

    def notify(s):
        tr.feed(ranks[s.server], NOTIFY_TAG, [s.id, 0])

    # servers update last layer first (overlap): layer 2 first, complete from server 1 alone
    for s in by_layer[2]:
        notify(s)
    puller.wait_layer(0, 2)
    assert tr.sent_with(PULL_REQUEST_TAG) == [(11, [2, 0])]
    assert sorted(posted) == sorted((0, s.id) for s in by_layer[2])
    # layer 1: server 0's half of the split weight alone is not enough
    half = [s for s in by_layer[1] if s.server == 0]
    for s in half:
        notify(s)
    time.sleep(0.3)
    assert len(tr.sent_with(PULL_REQUEST_TAG)) == 1
    for s in by_layer[1]:
        if s not in half:
            notify(s)
    puller.wait_layer(0, 1)
    assert sorted(tr.sent_with(PULL_REQUEST_TAG)[1:]) == [(10, [1, 0]), (11, [1, 0])]
    for s in by_layer[0]:
        notify(s)
    puller.wait_round(0)
    requests = tr.sent_with(PULL_REQUEST_TAG)
    assert len(requests) == 5 and sorted(requests[3:]) == [(10, [0, 0]), (11, [0, 0])]
    assert sorted(posted) == sorted((0, s.id) for s in shards)  # every shard received once
    puller.close()


def test_worker_refuses_a_notification_of_another_round():
    shards = _shards()
    tr = FakeTransport()
    puller = NotifiedPuller(tr, shards, KEY_LAYER, [10, 11], 2, lambda it, s: _Done())
    puller.start()
    s = next(s for s in shards if s.server == 1)
    tr.feed(11, NOTIFY_TAG, [s.id, 1])  # round 1's while round 0 is being pulled
    with pytest.raises(RuntimeError, match="unexpected notification"):
        puller.wait_layer(0, KEY_LAYER[s.key])


def _responder(tr, costs, server=1):
    shards = _shards()
    mine = [s for s in shards if s.server == server]
    values = [torch.full((s.numel,), float(s.id)) for s in mine]
    r = RequestResponder(
        tr, costs, mine, values, KEY_LAYER, [0, 1], "pull", lambda it, s: {"iteration": it, "shard": s.id}
    )
    return r, mine


def test_server_notifies_then_answers_each_request_with_its_shards_of_the_layer():
    tr = FakeTransport()
    costs = HostCosts(HostModel(request_startup_s=0.001))
    r, mine = _responder(tr, costs)
    r.start_round(0)
    for i in range(len(mine)):
        r.notify(0, i)
    assert sorted(tr.sent_with(NOTIFY_TAG)) == sorted((w, [s.id, 0]) for s in mine for w in (0, 1))
    layers = sorted({KEY_LAYER[s.key] for s in mine})
    assert layers == [0, 1, 2]
    for w in (0, 1):
        for l in reversed(layers):
            tr.feed(w, PULL_REQUEST_TAG, [l, 0])
    r.end_round(0)
    data = [(dst, tag, payload) for dst, tag, kind, payload in tr.sent if kind == "pull"]
    for w in (0, 1):
        got = {tag: p for dst, tag, p in data if dst == w}
        assert sorted(got) == sorted(s.id for s in mine)  # each own shard once to each worker
        assert all(torch.equal(got[s.id], torch.full((s.numel,), float(s.id))) for s in mine)
    assert costs.summary()["request_startup"]["count"] == 2 * len(layers)


@pytest.mark.parametrize(
    "request_, notified, match",
    [
        ([2, 0], False, "before their update notification"),
        ([2, 1], True, "iteration 1"),
        ([2, 0, 2, 0], True, "request of layer 2"),  # the same layer twice
    ],
)
def test_server_refuses_requests_outside_the_protocol(request_, notified, match):
    tr = FakeTransport()
    r, mine = _responder(tr, HostCosts(HostModel()))
    r.start_round(0)
    if notified:
        for i in range(len(mine)):
            r.notify(0, i)
    for k in range(0, len(request_), 2):
        tr.feed(0, PULL_REQUEST_TAG, request_[k : k + 2])
    for l in (0, 1, 2):  # worker 1 behaves
        tr.feed(1, PULL_REQUEST_TAG, [l, 0])
    with pytest.raises(RuntimeError, match=match):
        r.end_round(0)


def test_option_defaults_false_and_is_ps_only():
    assert get("ps").validate_options({}).pull_request is False
    assert get("ps").validate_options({"pull_request": True}).pull_request is True
    for scheme in ("p3", "ibatch"):  # p3 has no such option; ibatch always pulls by request
        with pytest.raises(SpecError) as e:
            get(scheme).validate_options({"pull_request": True})
        assert e.value.field == "workload.options.pull_request"


# ----------------------------------------------------------------------------- end to end


def _experiment(overlap: bool):
    exp = experiment(
        "ps",
        timeout_s=180,
        workers=W,
        iterations=ITERS,
        batch_size=BATCH,
        servers={"count": SERVERS},
        options={"pull_request": True, "overlap": overlap, "bigarray_bound": BOUND},
    )
    return from_dict({**exp.to_dict(), "host": {"request_startup_ms": STARTUP_MS}})


@pytest.fixture(scope="module")
def reference():
    return reference_train(_experiment(False).workload, W)


@pytest.mark.parametrize("overlap", [False, True], ids=["bulk", "overlap"])
def test_pull_request_matches_reference_and_counts_messages(overlap, tmp_path, reference):
    exp = _experiment(overlap)
    run = run_local(exp, tmp_path / "run")
    ref = reference
    for w in range(W):
        state = torch.load(run / "params" / f"worker{w}.pt")
        assert set(state) == set(ref)
        for k in ref:
            torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"worker{w} {k}")
    assert_server_shards_match(run, ref, SERVERS)

    shards = _shards()
    n_params = sum(NUMELS)
    requests = {(l, srv) for s in shards for l, srv in [(KEY_LAYER[s.key], s.server)]}
    assert len(requests) == 5
    for w in range(W):
        ev = read_events(run / "events" / f"worker{w}.jsonl")
        for it in range(ITERS):
            notes = [e for e in ev if e["kind"] == "notify" and e["iteration"] == it]
            reqs = [e for e in ev if e["kind"] == "pull_request" and e["iteration"] == it]
            pulls = [e for e in ev if e["kind"] == "pull" and e["iteration"] == it]
            assert len(notes) == len(shards) and all(e["dir"] == "rx" and e["bytes"] == 16 for e in notes)
            assert sorted((e["layer"], e["server"]) for e in reqs) == sorted(requests)
            assert all(e["dir"] == "tx" and e["bytes"] == 16 and e["peer"] >= W for e in reqs)
            assert sum(e["bytes"] for e in pulls) == 4 * n_params and len(pulls) == len(shards)
    total_requests = 0
    for srv in range(SERVERS):
        mine = [s for s in shards if s.server == srv]
        own_layers = {KEY_LAYER[s.key] for s in mine}
        ev = read_events(run / "events" / f"server{srv}.jsonl")
        for it in range(ITERS):
            notes = [e for e in ev if e["kind"] == "notify" and e["iteration"] == it]
            reqs = [e for e in ev if e["kind"] == "pull_request" and e["iteration"] == it]
            sent = [e for e in ev if e["kind"] == "pull" and e["iteration"] == it]
            assert sorted((e["peer"], e["shard"]) for e in notes) == sorted((w, s.id) for w in range(W) for s in mine)
            assert len(reqs) == W * len(own_layers) and {e["peer"] for e in reqs} == set(range(W))
            assert sorted((e["peer"], e["shard"]) for e in sent) == sorted((w, s.id) for w in range(W) for s in mine)
            charged = [e for e in ev if e["kind"] == "host_request_startup" and e["iteration"] == it]
            assert sorted((e["worker"], e["layer"]) for e in charged) == sorted(
                (w, l) for w in range(W) for l in own_layers
            )
            # each answer is posted after its request's start-up was charged (the request came first)
            end = {(e["worker"], e["layer"]): e["ts"] + e["dur"] for e in charged}
            assert all(e["ts"] >= end[(e["peer"], e["layer"])] - 5e-4 for e in sent)
        costs = read_json(run / "results" / f"server{srv}.json")["host_costs"]["request_startup"]
        assert costs["count"] == W * ITERS * len(own_layers)
        assert costs["emulated_s"] == pytest.approx(costs["count"] * STARTUP_MS / 1000)
        total_requests += costs["count"]
    assert total_requests == W * ITERS * len(requests)
