"""allreduce: the local reduction of gloo's ring all_reduce charged as host cost ``aggregate``.

gloo sums inside the collective; the scheme charges, after each bucket's all_reduce, the
``(p-1)/p x n`` bytes a ring allreduce member sums (Pipe-SGD Sec. 3.1, Eq. (5)). A loopback
run with an ``aggregate`` rate must still equal the single-process reference and charge
exactly one ``aggregate`` per bucket and iteration, of those bytes, at the stated rate.
"""

from __future__ import annotations

import pytest
import torch

from testbed.loopback import run_local
from testbed.spec import from_dict
from tests.conftest import experiment
from traffic.reference import reference_train
from traffic.rundir import read_json
from traffic.runtime.events import read_events
from traffic.schemes.allreduce import ring_reduced_bytes

AGG_BPS = 0.5e9  # host.aggregate_gb_per_s 0.5


@pytest.mark.parametrize(
    "nbytes,p,expected", [(1200, 1, 0), (1200, 2, 600), (1200, 3, 800), (1200, 4, 900), (10, 3, 6), (0, 5, 0)]
)
def test_ring_reduced_bytes_is_p_minus_1_over_p_of_the_payload(nbytes, p, expected):
    assert ring_reduced_bytes(nbytes, p) == expected


@pytest.mark.parametrize("nbytes,p", [(-1, 2), (100, 0)])
def test_ring_reduced_bytes_rejects_bad_arguments(nbytes, p):
    with pytest.raises(ValueError):
        ring_reduced_bytes(nbytes, p)


def test_allreduce_charges_its_local_reduction_and_still_equals_the_reference(tmp_path):
    W, iters = 3, 4  # 3 does not divide the payloads: the charged bytes are rounded down
    exp = experiment("allreduce", workers=W, iterations=iters, batch_size=16, options={"bucket_mb": 0.5})
    exp = from_dict({**exp.to_dict(), "host": {"aggregate_gb_per_s": AGG_BPS / 1e9}})
    run = run_local(exp, tmp_path / "run")
    ref = reference_train(exp.workload, W)
    for w in range(W):
        state = torch.load(run / "params" / f"worker{w}.pt")
        assert set(state) == set(ref)
        for k in ref:
            torch.testing.assert_close(state[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"worker{w} {k}")
    for w in range(W):
        ev = read_events(run / "events" / f"worker{w}.jsonl")
        total = 0
        for it in range(iters):
            buckets = {e["bucket"]: e["bytes"] for e in ev if e["kind"] == "allreduce" and e["iteration"] == it}
            charged = {e["bucket"]: e for e in ev if e["kind"] == "host_aggregate" and e["iteration"] == it}
            assert len(buckets) > 1 and sorted(charged) == sorted(buckets)  # one charge per bucket
            for b, n in buckets.items():
                assert charged[b]["bytes"] == n * (W - 1) // W
                assert charged[b]["emulated_s"] == pytest.approx(n * (W - 1) // W / AGG_BPS)
            total += sum(n * (W - 1) // W for n in buckets.values())
        hc = read_json(run / "results" / f"worker{w}.json")["host_costs"]["aggregate"]
        assert hc["modelled"] and hc["count"] == iters * len(buckets)
        assert hc["emulated_s"] == pytest.approx(total / AGG_BPS)
