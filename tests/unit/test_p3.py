"""P3 and the layer-wise-overlapped parameter server: slicing, equivalence, send and update order.

End-to-end cases run 4 workers and 2 servers on loopback (real gloo) for a few iterations
of ``digits_mlp`` with small slices (many slices per layer) and compare every worker's
final parameters with a single process trained on the same global batches
(:mod:`traffic.reference`); P3 is lossless, so they must agree to float tolerance.

Order properties checked from the events logs:

* **Worker send order (priority on).** The sender (``comm`` thread) sends one slice at a
  time. For a ``push`` event ``e`` let ``prev_end(e)`` be the end (``ts + dur``) of the push
  that the same worker sent just before ``e`` in the same process (``-inf`` for the first).
  The comm thread took ``e`` from the queue after ``prev_end(e)``. A slice ``h`` whose
  ``enqueue`` event (logged right *after* ``h`` entered the queue) has ``ts <
  prev_end(e)`` and whose own push starts after ``e``'s was therefore queued when ``e``
  was taken; the rule is that then ``priority(h) >= priority(e)`` (no strictly more urgent
  slice was waiting). A slice put in the queue in the short gap between ``prev_end(e)``
  and the dequeue of ``e`` is not judged (the logs cannot order those two instants), so
  the check never fails a correct sender. The test also asserts the check is not vacuous:
  some send was judged against a queued slice of another layer.
  With ``priority: false`` the sends must follow the production (``enqueue``) order.
* **Server update order.** A server's ``broadcast`` of slice ``j`` in iteration ``it``
  starts no earlier than the end of each of the ``W`` matching ``push`` receives (all
  logged by the server), i.e. a slice is never sent before every worker's copy is in.

Messages (P3 cases): exactly one push message per slice, worker and iteration, carrying its
id (:func:`~traffic.schemes.p3.pack_slice`); the slices shorter than the largest land in
longer posted receive rows, so these runs also check that gloo accepts a message shorter
than its receive buffer, which the server's receives rely on.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from testbed.loopback import run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from traffic import schemes
from traffic.models import available_models, build_model
from traffic.reference import reference_train
from traffic.runtime.events import read_events
from traffic.schemes.p3 import ID_ELEMENTS, MAX_SLICE_ID, PUSH_TAG, assign_slices, pack_slice, slice_id_of

W, ITERS, BATCH, SERVERS, SLICE = 4, 3, 16, 2, 20_000
NUMELS = [32768, 512, 262144, 512, 5120, 10]  # digits_mlp's keys
CASES = {
    "p3": ("p3", {"slice_params": SLICE}),
    "p3-fifo": ("p3", {"slice_params": SLICE, "priority": False}),
    "ps-overlap": ("ps", {"overlap": True, "bigarray_bound": 100_000}),  # the 512x512 key is split
}


def test_assign_slices_round_robin_and_cover():
    numels = NUMELS
    sl = assign_slices(numels, 3, 20_000)
    assert [s.id for s in sl] == list(range(len(sl)))
    assert [s.server for s in sl] == [j % 3 for j in range(len(sl))]
    assert all(0 < s.numel <= 20_000 for s in sl)
    assert len(sl) == sum(math.ceil(n / 20_000) for n in numels)
    for k, n in enumerate(numels):
        cover = [(s.lo, s.hi) for s in sl if s.key == k]
        assert cover[0][0] == 0 and cover[-1][1] == n and all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
    assert [(s.lo, s.hi) for s in assign_slices([100_001], 1)] == [(0, 50_000), (50_000, 100_000), (100_000, 100_001)]
    with pytest.raises(ValueError):
        assign_slices(numels, 1, 0)


def test_options():
    assert schemes.get("p3").Options().model_dump() == {"slice_params": 50_000, "priority": True}
    assert schemes.get("ps").Options().overlap is False
    from_dict({"workload": {"scheme": "p3", "options": {"slice_params": 40_000, "priority": False}}})
    from_dict({"workload": {"scheme": "ps", "options": {"overlap": True}}})


def test_slice_id_round_trips_through_the_message():
    """Every id up to the largest slice count any model can have (``slice_params`` 1: one
    slice per parameter) comes back from a message, and the gradient part is the slice."""
    largest = max(build_model(m, 0, device="meta").num_params() for m in available_models())
    ids = sorted({*range(3000), 2**23 - 1, 2**23, 2**24 + 1, 2**30, largest - 1, largest, MAX_SLICE_ID})
    assert largest < PUSH_TAG <= MAX_SLICE_ID  # ids (also the broadcast tags) never reach the push tag
    buf = torch.full((8,), float("nan"))
    for sid in ids:
        g = torch.randn(5) * 1e-38  # tiny floats too: the id is bits, never a computed value
        msg = pack_slice(buf, sid, g)
        assert msg.numel() == 5 + ID_ELEMENTS and msg.data_ptr() == buf.data_ptr()
        copied = torch.cat([msg.clone()])  # as a message: copied, never computed with
        assert slice_id_of(copied) == sid
        assert torch.equal(copied[ID_ELEMENTS:], g)
    for bad in (-1, MAX_SLICE_ID + 1):
        with pytest.raises(ValueError):
            pack_slice(buf, bad, torch.zeros(1))
    with pytest.raises(ValueError):
        pack_slice(buf, 0, torch.zeros(8))  # no room for the id
    with pytest.raises(ValueError):
        pack_slice(buf.double(), 0, torch.zeros(1))


def _experiment(scheme, options):
    return experiment(
        scheme, workers=W, iterations=ITERS, batch_size=BATCH, servers={"count": SERVERS}, options=options
    )


@pytest.fixture(scope="module")
def reference():
    return reference_train(_experiment("ps", {}).workload, W)


@pytest.fixture(scope="module")
def run_of(tmp_path_factory):
    """``run_of(case)``: the run directory of a loopback run of ``CASES[case]`` (run once per module)."""
    runs = {}

    def run(case):
        if case not in runs:
            scheme, options = CASES[case]
            runs[case] = run_local(_experiment(scheme, options), tmp_path_factory.mktemp("p3") / case)
        return runs[case]

    return run


def _end(e):
    return e["ts"] + e["dur"]


def check_send_order(events: list[dict]) -> int:
    """Assert the send-order rule of the module docstring on one worker's events.

    Returns:
        How many (send, queued slice of another layer) pairs were judged.
    """
    pushes = sorted((e for e in events if e["kind"] == "push" and e["dir"] == "tx"), key=lambda e: e["ts"])
    enq = {(e["iteration"], e["slice"]): e for e in events if e["kind"] == "enqueue"}
    start = {(e["iteration"], e["slice"]): e["ts"] for e in pushes}
    assert set(enq) == set(start)
    judged, prev_end = 0, -math.inf
    for e in pushes:
        for key, h in enq.items():
            if h["ts"] < prev_end and start[key] > e["ts"]:  # h was queued when e was taken
                assert h["priority"] >= e["priority"], (
                    f"sent slice {e['slice']} (it {e['iteration']}, priority {e['priority']}) while slice "
                    f"{h['slice']} (it {h['iteration']}, priority {h['priority']}) was queued"
                )
                judged += h["layer"] != e["layer"]
        prev_end = _end(e)
    return judged


def check_server_order(events: list[dict], bcast_kind: str) -> None:
    """Assert every update is sent only after all ``W`` copies of its slice were received."""
    rx: dict[tuple[int, int], list[float]] = {}
    for e in events:
        if e["kind"] == "push" and e["dir"] == "rx":
            rx.setdefault((e["iteration"], e["slice"]), []).append(_end(e))
    tx = [e for e in events if e["kind"] == bcast_kind and e["dir"] == "tx"]
    assert tx and len(tx) == W * len(rx)
    for e in tx:
        ends = rx[(e["iteration"], e["slice"])]
        assert len(ends) == W and e["ts"] >= max(ends)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference_and_order(case, run_of, reference):
    scheme, options = CASES[case]
    run_dir = run_of(case)
    for w in range(W):
        state = torch.load(run_dir / "params" / f"worker{w}.pt")
        assert set(state) == set(reference)
        for k in reference:
            torch.testing.assert_close(state[k], reference[k], rtol=1e-4, atol=1e-5, msg=f"{case} worker{w} {k}")

    bcast = "broadcast" if scheme == "p3" else "pull"
    fields = {"iteration", "layer", "key", "slice", "priority", "bytes"}
    judged = 0
    for w in range(W):
        events = read_events(run_dir / "events" / f"worker{w}.jsonl")
        comm = [e for e in events if e["kind"] in ("push", bcast, "enqueue") and e["iteration"] >= 0]
        assert all(fields <= set(e) and e["bytes"] > 0 and e["priority"] == e["layer"] for e in comm)
        pushes = [e for e in comm if e["kind"] == "push"]
        assert all(e["thread"] == "comm" for e in pushes)
        if scheme == "p3":  # the payload is the gradient and its 4-byte slice id
            assert sum(e["grad_bytes"] for e in pushes) == ITERS * 4 * 301066
            assert all(e["bytes"] == e["grad_bytes"] + 4 * ID_ELEMENTS <= 4 * (SLICE + ID_ELEMENTS) for e in pushes)
            assert len(pushes) == ITERS * len(assign_slices(NUMELS, SERVERS, SLICE))
            if options.get("priority", True):
                judged += check_send_order(events)
            else:  # FIFO: slices go out in the order they were produced
                enq = sorted((e for e in comm if e["kind"] == "enqueue"), key=lambda e: e["ts"])
                assert [(e["iteration"], e["slice"]) for e in sorted(pushes, key=lambda e: e["ts"])] == [
                    (e["iteration"], e["slice"]) for e in enq
                ]
        else:
            assert sum(e["bytes"] for e in pushes) == ITERS * 4 * 301066
    if case == "p3":
        assert judged > 0, "no send was ever judged against a queued slice of another layer"
    for s in range(SERVERS):
        check_server_order(read_events(run_dir / "events" / f"server{s}.jsonl"), bcast)


@pytest.mark.parametrize("case", ["p3", "p3-fifo"])
def test_one_push_message_per_slice(case, run_of):
    """Each worker sends each slice to its server exactly once per iteration, as one message
    of tag ``PUSH_TAG`` whose payload is the gradient plus the 4-byte id, and sends nothing
    else after the initial values; each server receives exactly those messages, logged with
    their slice and exact size; the transports' byte counters agree with the events."""
    run_dir = run_of(case)
    slices = assign_slices(NUMELS, SERVERS, SLICE)
    want = {(it, s.id) for it in range(ITERS) for s in slices}
    size = {s.id: 4 * s.numel for s in slices}

    def result(proc):
        return json.loads((run_dir / "results" / f"{proc}.json").read_text())

    for w in range(W):
        events = read_events(run_dir / "events" / f"worker{w}.jsonl")
        tx = [e for e in events if e.get("dir") == "tx"]
        assert {e["kind"] for e in tx} == ({"init", "push"} if w == 0 else {"push"})
        pushes = [e for e in tx if e["kind"] == "push"]
        keys = [(e["iteration"], e["slice"]) for e in pushes]
        assert len(keys) == len(want) and set(keys) == want  # one message per slice and iteration
        for e in pushes:
            s = slices[e["slice"]]
            assert e["tag"] == PUSH_TAG and e["peer"] == W + s.server  # ranks: workers, then servers
            assert e["grad_bytes"] == size[s.id] and e["bytes"] == size[s.id] + 4
        assert result(f"worker{w}")["bytes_sent"] == sum(e["bytes"] for e in tx)
    for srv in range(SERVERS):
        events = read_events(run_dir / "events" / f"server{srv}.jsonl")
        rx = [e for e in events if e.get("dir") == "rx"]
        pushes = [e for e in rx if e["kind"] == "push"]
        keys = [(e["iteration"], e["slice"], e["peer"]) for e in pushes]
        assert len(keys) == len(set(keys)) == W * ITERS * sum(s.server == srv for s in slices)
        assert {(it, sid) for it, sid, _ in keys} == {(it, sid) for it, sid in want if slices[sid].server == srv}
        for e in pushes:
            assert e["grad_bytes"] == size[e["slice"]] and e["bytes"] == size[e["slice"]] + 4
            assert e["layer"] == e["priority"] and e["key"] == slices[e["slice"]].key
        assert result(f"server{srv}")["bytes_received"] == sum(e["bytes"] for e in rx)
