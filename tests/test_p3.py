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
"""
from __future__ import annotations

import math

import pytest
import torch

from testbed.spec import from_dict
from traffic.reference import reference_train
from traffic.runtime.events import read_events
from testbed.local import run_local
from traffic import schemes
from traffic.schemes.p3 import assign_slices
from tests.conftest import experiment

W, ITERS, BATCH, SERVERS, SLICE = 4, 3, 16, 2, 20_000
CASES = {
    "p3": ("p3", {"slice_params": SLICE}),
    "p3-fifo": ("p3", {"slice_params": SLICE, "priority": False}),
    "ps-overlap": ("ps", {"overlap": True, "bigarray_bound": 100_000}),  # the 512x512 key is split
}


def test_assign_slices_round_robin_and_cover():
    numels = [32768, 512, 262144, 512, 5120, 10]
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


def _experiment(scheme, options):
    return experiment(scheme, workers=W, iterations=ITERS, batch_size=BATCH, servers={"count": SERVERS},
                      options=options)


@pytest.fixture(scope="module")
def reference():
    return reference_train(_experiment("ps", {}).workload, W)


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
                    f"{h['slice']} (it {h['iteration']}, priority {h['priority']}) was queued")
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
def test_matches_reference_and_order(case, tmp_path, reference):
    scheme, options = CASES[case]
    exp = _experiment(scheme, options)
    run_dir = run_local(exp, tmp_path / case)
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
        assert sum(e["bytes"] for e in pushes) == ITERS * 4 * 301066
        if scheme == "p3":
            assert all(e["bytes"] <= 4 * SLICE for e in pushes)
            assert len(pushes) == ITERS * len(assign_slices([32768, 512, 262144, 512, 5120, 10], SERVERS, SLICE))
            if options.get("priority", True):
                judged += check_send_order(events)
            else:  # FIFO: slices go out in the order they were produced
                enq = sorted((e for e in comm if e["kind"] == "enqueue"), key=lambda e: e["ts"])
                assert [(e["iteration"], e["slice"]) for e in sorted(pushes, key=lambda e: e["ts"])] == \
                    [(e["iteration"], e["slice"]) for e in enq]
    if case == "p3":
        assert judged > 0, "no send was ever judged against a queued slice of another layer"
    for s in range(SERVERS):
        check_server_order(read_events(run_dir / "events" / f"server{s}.jsonl"), bcast)
