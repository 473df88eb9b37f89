"""Each scheme's mean bytes per message (``Scheme.message_bytes``), what the capacity model
divides a sending rate by to count messages: values worked out by hand from the schemes'
message layouts, and gloo's ring segments replayed offset by offset. No network, no
processes: plans on the topology graph, models on the meta device."""

from __future__ import annotations

import math

import pytest

from testbed.runner import plan_point
from testbed.spec import from_dict
from traffic.models import model_info
from traffic.schemes import Scheme, get
from traffic.schemes.allreduce import GLOO_MAX_SEGMENT_BYTES, gloo_ring_sends
from traffic.schemes.base import model_keys
from traffic.schemes.phub import assign_chunks, pack_frames

#: digits_mlp's parameter tensors: 64x512, 512, 512x512, 512, 512x10, 10 (layers 0, 0, 1, 1, 2, 2)
DIGITS = [64 * 512, 512, 512 * 512, 512, 512 * 10, 10]
#: AlexNet's: conv1-5 weight and bias, fc6-8 weight and bias
ALEXNET = [23232, 64, 307200, 192, 663552, 384, 884736, 256, 589824, 256, 37748736, 4096, 16777216, 4096, 4096000, 1000]


def message_bytes(scheme: str, model: str, hosts: int = 4, **workload) -> float:
    exp = from_dict(
        {
            "scale": 1,
            "topology": {"kind": "rack", "hosts_per_rack": hosts},
            "workload": {"scheme": scheme, "model": model, "compute": {"mode": "emulated"}, **workload},
        }
    )
    _, procs = plan_point(exp)
    return get(scheme).message_bytes(exp.workload, procs)


def test_the_models_keys_are_as_written_here():
    assert [n for n, _ in model_keys("digits_mlp")] == DIGITS
    assert [layer for _, layer in model_keys("digits_mlp")] == [0, 0, 1, 1, 2, 2]
    assert [n for n, _ in model_keys("alexnet")] == ALEXNET
    assert 4 * sum(ALEXNET) == model_info("alexnet")["param_bytes"]


def test_default_is_one_message_per_parameter_tensor():
    class Plain(Scheme):  # a plugin scheme that says nothing about its messages
        pass

    exp = from_dict({"workload": {"model": "alexnet", "compute": {"mode": "emulated"}}})
    assert Plain.message_bytes(exp.workload, []) == pytest.approx(4 * sum(ALEXNET) / 16)


def test_ps_sends_a_message_per_shard_and_splits_big_keys_over_the_servers():
    assert message_bytes("ps", "digits_mlp") == pytest.approx(4 * sum(DIGITS) / 6)  # one server, keys whole
    # 2 servers: the 3 keys of >= 1,000,000 elements in 2 shards each, 13 others whole: 19 shards
    assert message_bytes("ps", "alexnet", servers={"count": 2}) == pytest.approx(4 * sum(ALEXNET) / 19)
    assert message_bytes("ps", "alexnet", servers={"count": 2}, options={"bigarray_bound": 10**9}) == pytest.approx(
        4 * sum(ALEXNET) / 16
    )


def test_ps_pull_requests_add_notifications_and_requests():
    # per worker: push and pull of 6 shards, 6 notifications, a request per layer (3): 16 bytes each
    assert message_bytes("ps", "digits_mlp", options={"pull_request": True}) == pytest.approx(
        (2 * 4 * sum(DIGITS) + 16 * (6 + 3)) / (3 * 6 + 3)
    )


def test_p3_sends_a_push_and_a_broadcast_per_slice():
    slices = sum(math.ceil(n / 1000) for n in DIGITS)  # 33 + 1 + 263 + 1 + 6 + 1
    assert slices == 305
    got = message_bytes("p3", "digits_mlp", options={"slice_params": 1000})
    assert got == pytest.approx((2 * 4 * sum(DIGITS) + 4 * slices) / (2 * slices))
    assert message_bytes("p3", "digits_mlp", options={"slice_params": 100}) < got / 5


def test_phub_messages_are_frames_of_chunks():
    chunks = sum(math.ceil(n / 8192) for n in ALEXNET)  # 32 KB chunks
    per_chunk = message_bytes(
        "phub", "alexnet", servers={"placement": "dedicated", "interfaces": 2}, options={"frame_bytes": 0}
    )
    assert per_chunk == pytest.approx((4 * sum(ALEXNET) + 8 * chunks) / chunks)  # payload and 8 bytes of metadata
    framed = message_bytes("phub", "alexnet", servers={"placement": "dedicated", "interfaces": 2})
    assert 4 * per_chunk < framed <= 256 * 1024 + 8 * 8  # 256 KB frames of 8 chunks, mostly full


def test_phub_hierarchical_frames_also_go_round_the_ring():
    spec = {
        "scale": 1,
        "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2},
        "workload": {
            "scheme": "phub",
            "model": "digits_mlp",
            "compute": {"mode": "emulated"},
            "servers": {"placement": "dedicated", "scope": "per_rack", "count": 1, "interfaces": 2},
            "options": {"hierarchical": True, "chunk_bytes": 4096, "frame_bytes": 16384},
        },
    }
    exp = from_dict(spec)
    _, procs = plan_point(exp)
    frames = pack_frames(assign_chunks(DIGITS, 1024, 2, 2), 4096, lambda c: [0, 0, 1, 1, 2, 2][c.key])
    W = 4
    # each worker: a push and a reply per frame; a ring of 2 PBoxes: each sends 2 half-frames
    msgs = 2 * W * len(frames) + 4 * sum(f.numel >= 2 for f in frames) + 2 * sum(f.numel == 1 for f in frames)
    sent = 2 * W * 4 * sum(f.size for f in frames) + 2 * 4 * sum(f.numel for f in frames)
    assert get("phub").message_bytes(exp.workload, procs) == pytest.approx(sent / msgs)
    flat = from_dict(
        {**spec, "workload": {**spec["workload"], "options": {**spec["workload"]["options"], "hierarchical": False}}}
    )
    assert get("phub").message_bytes(flat.workload, plan_point(flat)[1]) != pytest.approx(sent / msgs)


def _gloo_replay(nbytes: int, p: int) -> tuple[int, int]:
    """gloo's ring() in allreduce.cc, offset by offset: sends of every rank in both phases."""
    n_seg = max(-(-nbytes // GLOO_MAX_SEGMENT_BYTES), 2 * p)
    n_seg = -(-n_seg // p) * p
    per = n_seg // p
    seg = -(-(-(-nbytes // n_seg)) // 4) * 4  # noqa: B002 (ceiling divisions, as gloo rounds)
    msgs = sent = 0
    for rank in range(p):
        for first in ((rank + 1) * per, rank * per):
            for i in range(n_seg - per):
                length = min(seg, nbytes - ((first + i) * seg) % (n_seg * seg))
                if length > 0:
                    msgs, sent = msgs + 1, sent + length
    return msgs, sent


@pytest.mark.parametrize(
    "nbytes,p", [(4, 2), (40, 3), (4000, 7), (3 * 2**20, 2), (25 * 2**20, 4), (7 * 2**20 + 12, 5), (123_456 * 4, 8)]
)
def test_gloo_ring_sends_replays_gloo(nbytes, p):
    msgs, sent = gloo_ring_sends(nbytes, p)
    assert (msgs, sent) == _gloo_replay(nbytes, p)
    assert sent == 2 * (p - 1) * nbytes


def test_gloo_ring_segments_of_a_ddp_bucket():
    # 25 MiB over 4: roundUp(max(25, 8), 4) = 28 segments of 936,232 bytes, each sent 3 times per phase
    assert gloo_ring_sends(25 * 2**20, 4) == (2 * 3 * 28, 2 * 3 * 25 * 2**20)
    assert gloo_ring_sends(1000, 1) == (0, 0)


def test_allreduce_messages_are_gloo_segments():
    # digits_mlp fits one 25 MiB bucket: over 2 workers 4 segments of 301,066 bytes
    assert message_bytes("allreduce", "digits_mlp", hosts=2) == pytest.approx(4 * sum(DIGITS) / 4)
    assert message_bytes("allreduce", "digits_mlp", hosts=2, workers=1) == math.inf
    # one bucket per key: the mean over every key's segments
    per_key = sum(gloo_ring_sends(4 * n, 4)[0] for n in ALEXNET)
    assert message_bytes("allreduce", "alexnet", options={"bucket_mb": 0}) == pytest.approx(
        sum(gloo_ring_sends(4 * n, 4)[1] for n in ALEXNET) / per_key
    )


def test_pipe_sgd_messages_are_ring_blocks_as_coded():
    whole = message_bytes("pipe_sgd", "alexnet")  # one bucket, 4 blocks, float32
    assert whole == pytest.approx(4 * sum(ALEXNET) / 4)
    assert message_bytes("pipe_sgd", "alexnet", options={"compression": "truncation"}) == pytest.approx(whole / 2)
    assert message_bytes("pipe_sgd", "alexnet", hosts=2, workers=1) == math.inf


def test_stanza_counts_activations_labels_and_the_allreduces():
    act = 4 * 32 * 256 * 6 * 6  # (K, 256, 6, 6) float32 at batch 32
    conv = 4 * sum(ALEXNET[:10])  # CONV gradient
    # 4 CONV workers: 4 activations, 4 labels (32 int64), 4 gradients; recursive doubling 2 rounds of 4
    got = message_bytes("stanza", "alexnet", hosts=5)
    assert got == pytest.approx((8 * act + 4 * 32 * 8 + 8 * conv) / 20)
    # 2 FC workers: their FC gradient's recursive doubling (1 round of 2) joins; 3 CONV workers: 3 rounds, 4 transfers
    fc = 4 * sum(ALEXNET[10:])
    got2 = message_bytes("stanza", "alexnet", hosts=5, options={"fc_workers": 2})
    assert got2 == pytest.approx((6 * act + 3 * 256 + 4 * conv + 2 * fc) / (9 + 4 + 2))


def test_ibatch_requests_per_batch():
    data = 2 * 4 * sum(DIGITS)
    # one server: 6 pushes and 6 pulls, a sync request (32 B) and answer (4 B), pull requests of 32 B
    assert message_bytes("ibatch", "digits_mlp", options={"pull": "default"}) == pytest.approx(
        (data + 36 + 32) / (12 + 2 + 1)
    )
    for pull in ("layer_by_layer", "ibatch"):  # one request per layer (ibatch: at most that)
        assert message_bytes("ibatch", "digits_mlp", options={"pull": pull}) == pytest.approx(
            (data + 36 + 3 * 32) / (12 + 2 + 3)
        )
