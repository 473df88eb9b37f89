"""Light memory (``workload.compute.memory: light``, traffic.runtime.buffers): the scratch is
reused, ordered receive rows keep their messages' ids, a forked child neither copies the
model nor the shared scratch, the capacity model counts a light process as its base plus its
scratch, the spec refuses what cannot work, and light loopback runs of p3 and ibatch send
the messages of full runs. No root, no network (the end-to-end checks over a real network are
in test_light_memory_e2e.py, marked slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import torch

from common.errors import SpecError
from testbed.capacity import estimate, light_scratch_bytes
from testbed.loopback import run_local
from testbed.runner import plan_point
from testbed.spec import from_dict
from tests.conftest import experiment
from tests.unit.test_capacity import MACHINE, synthetic
from traffic import schemes
from traffic.models import model_info
from traffic.runtime import buffers as bufmod
from traffic.runtime.buffers import Buffers
from traffic.runtime.events import read_events
from traffic.spec import OptimizerSpec

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
GIB = 2**30


# ---------------------------------------------------------------- the buffers


def test_light_scratch_is_one_region_reused_by_every_request():
    b = Buffers(light=True)
    large = b.empty(4, 25)  # the private scratch grows to the largest request, then serves every smaller one
    small, again = b.empty(10), b.empty(50)
    assert small.data_ptr() == large.data_ptr() == again.data_ptr()
    assert tuple(large.shape) == (4, 25) and b.scratch_numel == 100
    meta = torch.nn.Parameter(torch.empty(3, 5, device="meta"))
    land = b.landing(meta)
    assert land.device.type == "cpu" and tuple(land.shape) == (3, 5) and land.data_ptr() == small.data_ptr()
    flat = b.flat([torch.empty(2, 2, device="meta"), torch.empty(6, device="meta")])
    assert flat.numel() == 10 and flat.data_ptr() == small.data_ptr()


def test_light_sources_are_read_only_zeros_of_the_parameters_shape():
    b = Buffers(light=True)
    meta = torch.nn.Parameter(torch.empty(7, 3, device="meta"))
    g, v = b.grad(meta), b.values(meta)
    assert tuple(g.shape) == (7, 3) and g.device.type == "cpu" and float(g.abs().sum()) == 0.0
    assert g.data_ptr() == v.data_ptr()  # one region of zeros for every source
    assert meta.grad is None  # nothing is set on the (meta) model


def test_full_buffers_are_the_models_own_tensors():
    b = Buffers(light=False)
    p = torch.nn.Parameter(torch.ones(4))
    g = b.grad(p)
    assert g is p.grad and float(g.sum()) == 0.0  # zeros set when backward left none
    assert b.landing(p).data_ptr() == p.data_ptr()
    f = b.flat([torch.ones(2), torch.full((3,), 2.0)])
    assert f.tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert b.empty(3).data_ptr() != b.empty(3).data_ptr() and b.scratch_numel == 0


def test_a_light_landing_range_is_scratch_of_the_range_alone():
    b = Buffers(light=True)
    meta = torch.nn.Parameter(torch.empty(1000, device="meta"))
    r = b.landing_range(meta, 900, 1000)
    assert tuple(r.shape) == (100,) and r.is_contiguous() and b.scratch_numel == 100
    p = torch.nn.Parameter(torch.zeros(10))
    full = Buffers(light=False).landing_range(p, 2, 5)
    full.fill_(1.0)
    assert p.detach().tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]  # full memory: into the parameter


@pytest.mark.parametrize("light", [False, True])
def test_ordered_rows_keep_every_messages_first_element(light):
    """Messages of any length up to the row written whole, in row order, into rows ``0 ..
    n-1``: every row's first element is still its message's afterwards; light rows overlap
    (``n + width - 1`` elements of their own), full rows are disjoint and keep everything."""
    n, width = 6, 5
    rows = Buffers(light=light).ordered_rows(n, width)
    assert tuple(rows.shape) == (n, width) and all(rows[k].is_contiguous() for k in range(n))
    lengths = [5, 1, 3, 5, 2, 4]
    for k, m in enumerate(lengths):  # message k: its id k + 100, then its payload
        rows[k, :m] = torch.tensor([k + 100.0] + [-(k + 1.0)] * (m - 1))
    assert [float(rows[k, 0]) for k in range(n)] == [k + 100.0 for k in range(n)]
    if light:
        assert rows.untyped_storage().nbytes() == 4 * (n + width - 1)
        assert rows[1].data_ptr() == rows[0].data_ptr() + 4
    else:
        assert all(rows[k, 1 : lengths[k]].eq(-(k + 1.0)).all() for k in range(n))


def test_replay_of_an_sgd_step_stays_on_a_few_chunks_of_scratch():
    b = Buffers(light=True)
    b.replay_sgd(5 * bufmod.REPLAY_CHUNK_ELEMENTS + 7, OptimizerSpec(lr=0.1, momentum=0.9, weight_decay=1e-4))
    assert b.scratch_numel == 3 * bufmod.REPLAY_CHUNK_ELEMENTS
    assert float(b.empty(b.scratch_numel).abs().sum()) == 0.0  # zeros stay zeros
    Buffers(light=False).replay_sgd(10, OptimizerSpec())  # full memory: nothing to replay


# ---------------------------------------------------------------- what a forked child holds

_CHILD = r"""
import os, sys, time
from traffic.models import build_model
from traffic.runtime import buffers
from traffic.runtime.buffers import Buffers
from traffic.runtime.zygote import warm_up
warm_up()  # as the zygote does before it forks (its imports are then shared, not each child's)
buffers.reserve_shared(256 * 2 ** 20)
ready_w = []
pids = []
for role in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        model = build_model("vgg19", 0, device="meta" if role != "full" else None)
        b = Buffers(light=role != "full")
        total = 0.0
        for p in model.parameters():               # read every gradient a light worker sends
            total += float(b.grad(p).sum())
        b.empty(48 * 2 ** 20).fill_(0.0)           # touch 192 MiB of (shared) scratch
        os.write(w, b"1")
        os.close(w)
        time.sleep(60)
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    pids.append(pid)
print(" ".join(str(p) for p in pids), flush=True)
sys.stdin.read()
for p in pids:
    os.kill(p, 9)
"""


def _children(*roles: str):
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *roles],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    return proc, pids


def test_a_forked_light_worker_holds_neither_the_model_nor_the_shared_scratch():
    """Two light children of one parent: every VGG-19 gradient read (575 MB) and 192 MiB of
    shared scratch touched by both, yet each child's USS stays small; a full child holds the
    model (its USS grows by more than the parameters)."""
    proc, pids = _children("light", "light", "full")
    try:
        assert len(pids) == 3
        time.sleep(0.5)
        uss = [psutil.Process(p).memory_full_info().uss for p in pids]
    finally:
        proc.communicate("", timeout=30)
    params = model_info("vgg19")["param_bytes"]
    assert uss[0] < 64 * MIB and uss[1] < 64 * MIB, [u / MIB for u in uss]
    assert uss[2] > params, [u / MIB for u in uss]


# ---------------------------------------------------------------- the spec


def _light(**workload):
    return {
        "workload": {
            "scheme": "allreduce",
            "model": "digits_mlp",
            "compute": {"mode": "emulated", "memory": "light"},
            **workload,
        }
    }


def test_light_memory_is_accepted_for_the_schemes_that_support_it():
    for scheme in ("allreduce", "ps", "p3", "ibatch", "pipe_sgd"):
        exp = from_dict(_light(scheme=scheme))
        assert exp.workload.compute.memory == "light"
    assert from_dict({"workload": {"compute": {"mode": "emulated"}}}).workload.compute.memory == "full"


@pytest.mark.parametrize("scheme", ["phub", "stanza", "mymod:MyAllreduce"])
def test_light_memory_with_a_scheme_that_cannot_is_refused_naming_scheme_and_reason(scheme, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    with pytest.raises(SpecError) as e:
        from_dict(_light(scheme=scheme))
    fields = {x.field: x.allowed for x in e.value.errors}
    assert "workload.compute.memory" in fields and repr(scheme) in fields["workload.compute.memory"]
    assert schemes.get(scheme).light_memory_refusal() in fields["workload.compute.memory"]


def test_light_memory_needs_emulated_compute_and_no_saved_parameters():
    with pytest.raises(SpecError) as e:
        from_dict({"workload": {"scheme": "allreduce", "compute": {"mode": "real", "memory": "light"}}})
    assert [x.field for x in e.value.errors] == ["workload.compute.memory"] and "real" in e.value.errors[0].allowed
    with pytest.raises(SpecError) as e:
        from_dict(_light(save_params=True))
    assert "save_params" in e.value.errors[0].allowed


def test_the_cli_refuses_a_light_run_it_cannot_make_with_exit_2(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "experiments/vgg19_10g.yaml",
            "--set",
            "sweep={}",
            "--set",
            "workload.scheme=phub",
            "--set",
            "workload.compute.memory=light",
            "--dry-run",
            "--runs-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "workload.compute.memory" in out.stderr and "'phub'" in out.stderr


# ---------------------------------------------------------------- capacity


def _vgg19_ring(memory: str, workers: int = 128, launcher: str = "zygote"):
    exp = from_dict(
        {
            "topology": {"kind": "rack_core", "racks": 8, "hosts_per_rack": workers // 8},
            "workload": {
                "scheme": "allreduce",
                "model": "vgg19",
                "batch_size": 32,
                "compute": {"mode": "emulated", "profile": "gtx1080ti", "memory": memory},
            },
            "run": {"launcher": launcher},
            "scale": 20,
        }
    )
    hosts, procs = plan_point(exp)
    return exp, hosts, procs


def test_a_light_process_costs_its_base_and_the_shared_scratch_counts_once():
    m = synthetic()
    full = estimate(*_vgg19_ring("full"), model=m, machine=MACHINE)
    light = estimate(*_vgg19_ring("light"), model=m, machine=MACHINE)
    exp, _, procs = _vgg19_ring("light")
    scratch = light_scratch_bytes(exp.workload, procs)
    # the largest bucket of VGG-19 is its 411 MB fc6 weight alone
    assert scratch == 4 * 25088 * 4096
    assert light.memory_breakdown["processes"] == 128 * 40 * MIB
    assert light.memory_breakdown["shared pages"] == round(400 * MIB + scratch)
    assert light.memory_breakdown["network"] == full.memory_breakdown["network"]
    assert full.memory_bytes > 128 * model_info("vgg19")["param_bytes"] > light.memory_bytes
    assert light.memory_bytes < 16 * GIB


def test_exec_started_light_processes_each_hold_their_scratch():
    m = synthetic()
    exp, hosts, procs = _vgg19_ring("light", workers=16, launcher="exec")
    est = estimate(exp, hosts, procs, model=m, machine=MACHINE)
    scratch = light_scratch_bytes(exp.workload, procs)
    assert est.memory_breakdown["processes"] == round(16 * (210 * MIB + scratch))
    assert est.memory_breakdown["shared pages"] == 300 * MIB


def test_light_scratch_follows_the_schemes_largest_buffer():
    exp = from_dict(
        {
            "workload": {
                "scheme": "ps",
                "model": "vgg19",
                "servers": {"count": 4},
                "compute": {"mode": "emulated", "memory": "light"},
            },
            "topology": {"hosts_per_rack": 4},
        }
    )
    _, procs = plan_point(exp)
    # fc6 (102,760,448 elements) split over the 4 servers is the largest shard
    assert light_scratch_bytes(exp.workload, procs) == 4 * (25088 * 4096 // 4)
    small = from_dict(_light(scheme="allreduce"))
    _, procs = plan_point(small)
    assert light_scratch_bytes(small.workload, procs) == 3 * bufmod.REPLAY_CHUNK_ELEMENTS * 4  # the replay's chunks


def test_dry_run_of_vgg19_ring_allreduce_on_128_workers_no_longer_refuses_for_memory(tmp_path):
    args = [
        sys.executable,
        "-m",
        "testbed.cli",
        "run",
        "experiments/vgg19_10g.yaml",
        "--set",
        "sweep={}",
        "--set",
        "workload.scheme=allreduce",
        "--set",
        "topology.kind=rack_core",
        "--set",
        "topology.racks=8",
        "--set",
        "topology.hosts_per_rack=16",
        "--dry-run",
        "--runs-dir",
        str(tmp_path / "r"),
    ]
    full = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert full.returncode == 2 and "cannot hold the run" in full.stderr
    assert "workload.compute.memory: light" in full.stderr  # the refusal names the way out
    light = subprocess.run(args + ["--set", "workload.compute.memory=light"], capture_output=True, text=True, cwd=ROOT)
    assert light.returncode == 0, light.stderr
    assert "cannot hold the run" not in light.stdout + light.stderr


def test_p3s_light_scratch_is_its_largest_slice():
    exp = from_dict(
        {
            "workload": {
                "scheme": "p3",
                "model": "vgg19",
                "servers": {"count": 4},
                "compute": {"mode": "emulated", "memory": "light"},
            },
            "topology": {"hosts_per_rack": 4},
        }
    )
    _, procs = plan_point(exp)
    assert schemes.get("p3").light_buffer_bytes(exp.workload, procs) == 4 * 50_000  # slice_params
    assert light_scratch_bytes(exp.workload, procs) == 3 * bufmod.REPLAY_CHUNK_ELEMENTS * 4  # the replay's chunks


# ---------------------------------------------------------------- loopback runs: the same messages

#: scheme -> options of the loopback runs: 4 workers, 2 servers, digits_mlp. p3: slices of
#: 20,000 elements give each server 10 slices, so every worker's pushes to a server land in
#: 10 overlapping light rows; ibatch: one profiling iteration, then the chosen batches
LOOPBACK = {"p3": {"slice_params": 20_000}, "ibatch": {"bigarray_bound": 100_000, "profile_iterations": 1}}


def _messages(events: list[dict]) -> Counter:
    """The parameter messages of one process: ``(kind, dir, iteration, slice, peer, bytes)``,
    counted (every push, pull, broadcast and initial value; for a p3 server, the slice is the
    id it read from the message)."""
    return Counter(
        (e["kind"], e["dir"], e["iteration"], e["slice"], e["peer"], e["bytes"])
        for e in events
        if "slice" in e and e.get("dir") in ("tx", "rx")
    )


@pytest.mark.parametrize("scheme", list(LOOPBACK))
def test_a_light_loopback_run_sends_the_messages_of_a_full_run(scheme, tmp_path):
    """Full and light memory, emulated compute: every process sends and receives the same
    bytes (its transport's counters, within 1 %: ibatch's batches, chosen from measured times,
    may differ by a 32-byte request) and the same parameter messages, slice by slice."""
    runs = {}
    for memory in ("full", "light"):
        exp = experiment(
            scheme,
            workers=4,
            iterations=4,
            warmup_iterations=2,
            batch_size=16,
            servers={"count": 2},
            save_params=False,
            options=LOOPBACK[scheme],
            compute={"mode": "emulated", "memory": memory},
        )
        runs[memory] = run_local(exp, tmp_path / memory)
    assert "memory: light" in (runs["light"] / "spec.yaml").read_text()
    names = [p["name"] for p in json.loads((runs["full"] / "processes.json").read_text())["processes"]]
    assert len(names) == 6
    for name in names:
        full, light = (json.loads((runs[m] / "results" / f"{name}.json").read_text()) for m in ("full", "light"))
        for key in ("bytes_sent", "bytes_received"):
            assert full[key] > 0 and abs(light[key] - full[key]) <= 0.01 * full[key], (name, key, full[key], light[key])
        msgs = {m: _messages(read_events(runs[m] / "events" / f"{name}.jsonl")) for m in ("full", "light")}
        assert msgs["full"] and msgs["light"] == msgs["full"], name
