"""The traffic runtime: models, data, event log, comm thread, launch and failure handling.

Everything here runs on loopback (127.0.0.1, iface lo) without Mininet; only
``test_crashing_worker_fails_the_run`` starts processes (4 workers).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import numpy as np
import psutil
import pytest
import torch

from common.errors import RunFailed
from testbed.launch import write_processes
from testbed.loopback import run_local
from testbed.spec import dump_spec, from_dict, with_scale
from traffic.data import GlobalBatches, available_datasets, digits_raw, load_dataset
from traffic.models import LayeredModel, available_models, build_model
from traffic.runtime.__main__ import leave_together, run_process
from traffic.runtime.comm import CommThread, PriorityCommThread
from traffic.runtime.context import parse_crash_at
from traffic.runtime.events import EventLog, read_events

REQUIRED = {"proc", "role", "rank", "thread", "kind", "ts", "dur", "iteration", "layer"}


# ----------------------------------------------------------------------------- models


def test_digits_mlp_layers_and_determinism():
    assert "digits_mlp" in available_models()
    rng_before = torch.get_rng_state()
    a = build_model("digits_mlp", 7, (64,), 10)
    assert torch.equal(torch.get_rng_state(), rng_before), "build_model must not touch the caller's RNG"
    b = build_model("digits_mlp", 7, (64,), 10)
    c = build_model("digits_mlp", 8, (64,), 10)
    assert isinstance(a, LayeredModel) and len(a.layers) == 3 and a.split_index is None
    assert [tuple(p.shape) for p in a.parameters()] == [(512, 64), (512,), (512, 512), (512,), (10, 512), (10,)]
    assert a.param_layers() == [0, 0, 1, 1, 2, 2]
    assert a.layer_numels() == [64 * 512 + 512, 512 * 512 + 512, 512 * 10 + 10]
    for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb)
        assert not torch.equal(pa, pc)
    x = torch.randn(5, 64)
    out = a(x)
    assert out.shape == (5, 10)
    y = x
    for layer in a.layers:  # forward is the layers in order
        y = layer(y)
    assert torch.equal(out, y)
    with pytest.raises(KeyError, match="unknown model"):
        build_model("no_such_model", 0, (64,), 10)


# ----------------------------------------------------------------------------- data


def test_digits_matches_sklearn_and_is_standardized():
    from sklearn.datasets import load_digits

    x, y = digits_raw()
    sx, sy = load_digits(return_X_y=True)
    assert np.array_equal(x, sx) and np.array_equal(y, sy)

    assert "digits" in available_datasets()
    d = load_dataset("digits", seed=3)
    assert d.x_train.shape == (1437, 64) and d.x_test.shape == (360, 64)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.input_shape == (64,) and d.num_classes == 10
    assert d.x_train.mean(0).abs().max() < 1e-4
    nonconst = d.x_train.std(0) > 0
    assert torch.allclose(d.x_train.std(0, unbiased=False)[nonconst], torch.ones(int(nonconst.sum())), atol=1e-3)
    again = load_dataset("digits", seed=3)
    other = load_dataset("digits", seed=4)
    assert torch.equal(d.x_test, again.x_test) and torch.equal(d.y_train, again.y_train)
    assert not torch.equal(d.y_test, other.y_test)
    assert set(d.y_test.tolist()) == set(range(10))


def test_global_batches_shards_and_epochs():
    d = load_dataset("digits", 0)
    n = d.n_train
    gb = GlobalBatches(d, batch_size=16, workers=4, seed=1)
    # deterministic, and independent of which object asks
    assert torch.equal(gb.indices(5), GlobalBatches(d, 16, 4, 1).indices(5))
    assert not torch.equal(gb.indices(5), GlobalBatches(d, 16, 4, 2).indices(5))
    # shards partition the global batch in worker order
    x, y = gb.global_batch(3)
    assert x.shape == (64, 64) and y.shape == (64,)
    parts = [gb.shard(3, w) for w in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    # the stream: each epoch visits every row once, and epochs are reshuffled
    per_epoch = -(-n // 64) + 1
    stream = torch.cat([gb.indices(t) for t in range(2 * per_epoch)])
    assert sorted(stream[:n].tolist()) == list(range(n))
    assert sorted(stream[n : 2 * n].tolist()) == list(range(n))
    assert not torch.equal(stream[:n], stream[n : 2 * n])
    # a global batch larger than the training set still works
    big = GlobalBatches(d, batch_size=1000, workers=2, seed=0)
    assert big.indices(0).shape == (2000,)
    with pytest.raises(ValueError):
        gb.shard(0, 4)
    with pytest.raises(ValueError):
        GlobalBatches(d, 0, 4, 0)


# ----------------------------------------------------------------------------- events


def test_event_log_threads_spans_and_errors(tmp_path):
    path = tmp_path / "events" / "worker0.jsonl"
    log = EventLog(path, "worker0", "worker", 0)

    def writer(i):
        for j in range(200):
            log.record("send", time.time(), 0.001, iteration=j, bytes=4 * j, peer=i)

    threads = [threading.Thread(target=writer, args=(i,), name=f"t{i}") for i in range(4)]
    for t in threads:
        t.start()
    with log.span("iteration", iteration=0, samples=32) as ev:
        ev["loss"] = 1.5
        time.sleep(0.01)
    with pytest.raises(ZeroDivisionError):
        with log.span("update", iteration=1):
            1 / 0  # noqa: B018 (the error the span must record)
    for t in threads:
        t.join()
    log.instant("eval", iteration=1, accuracy=0.5, loss=1.0)
    # written through already (a crash would keep it), before close
    assert len(path.read_text().splitlines()) == 4 * 200 + 3
    log.close()
    log.instant("late")  # after close: dropped, no error
    events = read_events(path)
    assert len(events) == 803
    assert all(REQUIRED <= set(e) for e in events)
    it = next(e for e in events if e["kind"] == "iteration")
    assert it["thread"] == "main" and it["samples"] == 32 and it["loss"] == 1.5 and it["dur"] >= 0.01
    assert next(e for e in events if e["kind"] == "update")["error"] == "ZeroDivisionError"
    assert {e["thread"] for e in events if e["kind"] == "send"} == {"t0", "t1", "t2", "t3"}


# ----------------------------------------------------------------------------- comm thread


def test_comm_thread_fifo_futures_and_errors():
    comm = CommThread("comm")
    order = []
    futs = [comm.submit(order.append, i, priority=10 - i) for i in range(20)]  # priority ignored
    assert [f.result(5) for f in futs] == [None] * 20
    assert order == list(range(20))
    assert comm.submit(lambda a, b=0: (a + b, threading.current_thread().name), 2, b=3).result(5) == (5, "comm")
    bad = comm.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bad.result(5)
    with pytest.raises(ZeroDivisionError):
        comm.check()
    comm.close()
    with pytest.raises(RuntimeError, match="closed"):
        comm.submit(print)


def test_priority_comm_thread_runs_most_urgent_first():
    comm = PriorityCommThread("comm")
    gate = threading.Event()
    order = []
    comm.submit(gate.wait, 5, priority=0)  # occupies the thread while the others queue
    time.sleep(0.05)
    for tag, prio in [("a", 3), ("b", 1), ("c", 2), ("d", 1), ("e", 0)]:
        comm.submit(order.append, tag, priority=prio)
    gate.set()
    comm.drain(timeout=5)
    assert order == ["e", "b", "d", "c", "a"]
    comm.close()


def test_parse_crash_at():
    assert parse_crash_at(None) == {}
    assert parse_crash_at("worker1:3, server0:0") == {"worker1": 3, "server0": 0}
    with pytest.raises(ValueError):
        parse_crash_at("worker1")


# ----------------------------------------------------------------------------- process


def _spec(scheme="allreduce", **workload):
    w = {"scheme": scheme, "workers": 4, "iterations": 6, "warmup_iterations": 1, "batch_size": 16}
    w.update(workload)
    return from_dict(
        {"topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 4}, "workload": w, "run": {"timeout_s": 300}}
    )


def test_runtime_rejects_unknown_process(tmp_path):
    (tmp_path / "spec.yaml").write_text(dump_spec(with_scale(_spec(), 1.0)))
    write_processes(
        tmp_path,
        [{"name": "worker0", "role": "worker", "index": 0, "host": "h1", "rack": 0, "ip": "127.0.0.1", "iface": "lo"}],
        "127.0.0.1",
        29999,
        timeout_s=60,
    )
    assert run_process(tmp_path, "worker9") == 2


def test_runtime_refuses_an_unresolved_scale_clearly(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(dump_spec(_spec()))  # scale: auto, as no harness writes it
    write_processes(
        tmp_path,
        [{"name": "worker0", "role": "worker", "index": 0, "host": "h1", "rack": 0, "ip": "127.0.0.1", "iface": "lo"}],
        "127.0.0.1",
        29999,
        timeout_s=60,
    )
    assert run_process(tmp_path, "worker0") == 2
    assert "scale 'auto': a number > 0 is needed" in capsys.readouterr().out


def _stores(world: int) -> list:
    """``world`` TCPStore handles on one store (rank 0's hosts it), as the processes of a run hold them."""
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    return [master] + [
        dist.TCPStore("127.0.0.1", master.port, world, timeout=timedelta(seconds=30)) for _ in range(world - 1)
    ]


def test_processes_leave_together_and_rank_0_with_its_store_last():
    stores = _stores(3)
    left_when_rank0_returned = []

    def leave(rank: int) -> None:
        leave_together(stores[rank], rank, 3, timedelta(seconds=30))
        if rank == 0:
            left_when_rank0_returned.append(stores[0].add("testbed/left", 0))

    threads = [threading.Thread(target=leave, args=(r,), daemon=True) for r in range(3)]
    threads[0].start()
    threads[1].start()
    time.sleep(0.3)
    assert threads[0].is_alive() and threads[1].is_alive()  # rank 2 has not finished: nobody leaves
    threads[2].start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert left_when_rank0_returned == [2]  # the store went on serving until the others had gone


def test_leaving_alone_fails_after_the_timeout():
    stores = _stores(2)
    with pytest.raises(RuntimeError):  # torch.distributed.DistStoreError
        leave_together(stores[0], 0, 2, timedelta(seconds=0.5))


def _runtime_procs(under) -> list[psutil.Process]:
    """Runtime processes whose run directory is inside ``under``."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "traffic.runtime" in cmd and any(a.startswith(str(under)) for a in cmd):
            out.append(p)
    return out


def test_crashing_worker_fails_the_run(tmp_path):
    """TESTBED_CRASH_AT makes worker1 fail at iteration 2: watch raises RunFailed within
    seconds (not at the 300 s timeout) with worker1's log tail, and nothing keeps running."""
    run_dir = tmp_path / "crash"
    started = []
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as err:
        run_local(
            _spec(iterations=50),
            run_dir,
            env={"TESTBED_CRASH_AT": "worker1:2"},
            on_start=lambda l: started.append(l.popen.pid),
        )
    raised_at = time.time()
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "worker1" in msg and "exited with code 1" in msg
    assert "InjectedCrash" in msg and "crashes at iteration 2" in msg  # the log tail
    # worker1 did iterations 0 and 1, then died; the failure surfaced within seconds
    ev = read_events(run_dir / "events" / "worker1.jsonl")
    its = [e["iteration"] for e in ev if e["kind"] == "iteration"]
    assert its == [0, 1]
    last = max(e["ts"] + e["dur"] for e in ev)
    assert raised_at - last < 5.0
    assert not (run_dir / "results" / "worker1.json").exists()
    assert len(started) == 4
    assert not [
        pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert _runtime_procs(tmp_path) == []


@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 1e-4), (0.0, 0.0), (0.5, 0.0)])
def test_tensor_sgd_equals_torch_sgd_bit_for_bit(momentum, weight_decay):
    from traffic.runtime.trainer import TensorSGD, make_optimizer
    from traffic.spec import OptimizerSpec

    spec = OptimizerSpec(lr=0.05, momentum=momentum, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(3)
    start = torch.randn(5000, generator=g)
    ref = torch.nn.Parameter(start.clone())
    opt = make_optimizer([ref], spec)
    light = TensorSGD(start.clone(), spec)
    for _ in range(4):
        grad = torch.randn(5000, generator=g)
        ref.grad = grad.clone()
        opt.step()
        light.step(grad.clone())
        assert torch.equal(ref.detach(), light.param)
    if momentum:
        assert torch.equal(opt.state[ref]["momentum_buffer"], light.momentum_buffer)
    else:
        assert light.momentum_buffer is None
