"""``python -m traffic.runtime RUN_DIR PROC_NAME``: run one process of a run.

Reads ``RUN_DIR/spec.yaml`` and ``RUN_DIR/processes.json``, joins the gloo process group
through the store rank 0 hosts at ``master_addr:master_port`` (timeout ``run.timeout_s``;
:func:`rendezvous`), builds the
:class:`~traffic.runtime.context.Context`, runs the scheme's ``main()`` for this process's
role, then writes ``results/<proc>.json`` and, if ``workload.save_params``,
``params/<proc>.pt`` (the scheme's :meth:`~traffic.schemes.base.Scheme.final_state`), and
leaves once every process has finished (:func:`leave_together`).

Exit status: 0 on success; 1 if anything failed (the traceback goes to stdout, i.e. the
process's log); 2 for a bad command line. The process leaves through ``os._exit`` so that a
peer stuck in gloo or a non-daemon thread can never keep it alive. A process that fails
because a *peer* failed (a torch.distributed error) waits ``SECONDARY_FAILURE_DELAY_S``
before exiting, so the harness, which polls exit codes, reports the process that failed
first and its log rather than a victim's.

Debug option: ``TESTBED_CRASH_AT=<proc>:<iteration>`` makes that process raise at the start
of that iteration (see :meth:`Context.maybe_crash`).
"""

from __future__ import annotations

import time

_T_START = time.time()  # before the heavy imports below: the process's start-up counts them

import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from common.validation import load_yaml, validate  # noqa: E402
from topologies.spec import TopologySpec  # noqa: E402
from traffic import schemes  # noqa: E402
from traffic.compute_profiles import load_profile  # noqa: E402
from traffic.data import GlobalBatches, load_dataset  # noqa: E402
from traffic.event_spec import ComputeSlowdown, parse_events  # noqa: E402
from traffic.hostmodel import HostSpec  # noqa: E402
from traffic.hostmodel.costs import HostCosts  # noqa: E402
from traffic.hostmodel.machine import HostMachine  # noqa: E402
from traffic.models import build_model  # noqa: E402
from traffic.rundir import read_json, write_json  # noqa: E402
from traffic.runtime.buffers import Buffers  # noqa: E402
from traffic.runtime.comm import CommThread  # noqa: E402
from traffic.runtime.context import Context, InjectedCrash  # noqa: E402
from traffic.runtime.events import EventLog  # noqa: E402
from traffic.runtime.transport import Transport  # noqa: E402
from traffic.spec import WorkloadSpec  # noqa: E402

SECONDARY_FAILURE_DELAY_S = 1.5


def _is_peer_failure(e: BaseException) -> bool:
    if isinstance(e, dist.DistError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and any(
        s in msg
        for s in (
            "Connection closed by peer",
            "Connection reset by peer",
            "gloo",
            "Broken pipe",
            "Timed out",
            "timed out",
        )
    )


def rendezvous(master_addr: str, master_port: int, rank: int, world: int, timeout: timedelta) -> dist.TCPStore:
    """Join the run's gloo process group; the rendezvous store it was made with.

    The store is a ``torch.distributed.TCPStore`` that rank 0 hosts at
    ``master_addr:master_port`` (what ``init_method="tcp://..."`` would make), made here so
    that the process keeps it (:func:`leave_together`) without torch's private
    ``_get_default_store``. gloo connects two processes when they first exchange data
    (``TORCH_GLOO_LAZY_INIT``, :func:`testbed.launch.process_env`), through this store.

    Raises:
        torch.distributed.DistError / RuntimeError: the store or a peer was not reached
            within ``timeout``.
    """
    store = dist.TCPStore(master_addr, master_port, world, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    return store


def leave_together(store: dist.Store, rank: int, world: int, timeout: timedelta) -> None:
    """Wait until every process has finished, through the rendezvous ``store`` rather than a
    gloo barrier (which, with gloo's connections made on first use, would connect processes
    that never talked, through the store rank 0 may be closing). Rank 0 hosts the store: it
    returns last, once every other process has said it no longer needs it. No process polls:
    the last to arrive (then the last to leave) sets a key the others wait for.

    Raises:
        torch.distributed.DistStoreError: the others did not arrive (or leave) within ``timeout``.
    """
    if store.add("testbed/arrived", 1) == world:
        store.set("testbed/all-arrived", "1")
    store.wait(["testbed/all-arrived"], timeout)
    if rank != 0:
        if store.add("testbed/left", 1) == world - 1:
            store.set("testbed/all-left", "1")
    elif world > 1:
        store.wait(["testbed/all-left"], timeout)


def run_process(run_dir: str | Path, name: str) -> int:
    """Run process ``name`` of the run in ``run_dir`` to completion; returns the exit status.

    Reads the sections of ``spec.yaml`` this package owns (``workload``, ``host``,
    ``topology``, ``scale``, ``events``: the ``compute_slowdown`` events of this process's
    host make it a straggler in emulated compute, :class:`traffic.event_spec.ComputeSlowdown`)
    and ``processes.json`` (which gives the run's ``timeout_s``). Does not call
    ``os._exit`` (:func:`main` does). When the host model has whole-host rates
    (``machine_kinds``), they are charged on this process's host's shared clock
    (:meth:`traffic.hostmodel.machine.HostMachine.for_host`: ``RUN_DIR/hostclock/<host>``).
    """
    t_start = _T_START
    torch.set_num_threads(1)
    run_dir = Path(run_dir)
    spec = load_yaml((run_dir / "spec.yaml").read_text())
    w = validate(WorkloadSpec, spec.get("workload", {}), "workload")
    topology = validate(TopologySpec, spec.get("topology", {}), "topology")
    scale = spec.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        print(
            f"traffic.runtime: {run_dir / 'spec.yaml'} has scale {scale!r}: a number > 0 is needed (the harness "
            f"resolves 'auto' before it writes spec.yaml)",
            flush=True,
        )
        return 2
    scale = float(scale)
    host = validate(HostSpec, spec.get("host") or {}, "host").resolve()
    doc = read_json(run_dir / "processes.json")
    entry = next((p for p in doc["processes"] if p["name"] == name), None)
    if entry is None:
        print(f"traffic.runtime: no process {name!r} in {run_dir / 'processes.json'}", flush=True)
        return 2
    role, index, rank, world = entry["role"], entry["index"], entry["rank"], doc["world_size"]
    events = EventLog(run_dir / "events" / f"{name}.jsonl", name, role, rank)
    print(
        f"traffic.runtime: {name} (role {role}, rank {rank}/{world}) on host {entry.get('host')} "
        f"ip {entry.get('ip')} iface {os.environ.get('GLOO_SOCKET_IFNAME')}; scheme {w.scheme}",
        flush=True,
    )
    ctx = machine = None
    try:
        if host.machine_kinds:  # before the rendezvous: a clock that cannot be made fails fast
            machine = HostMachine.for_host(run_dir, entry.get("host"))
        with events.span("init", world_size=world):
            store = rendezvous(doc["master_addr"], doc["master_port"], rank, world, timedelta(seconds=doc["timeout_s"]))
        n_workers = sum(1 for p in doc["processes"] if p["role"] == "worker")
        data = batches = profile = None
        scheme_cls = schemes.get(w.scheme)
        device = scheme_cls.model_device(role)
        light = w.compute.memory == "light"
        if w.compute.mode == "emulated":  # the model's native input; no data is read
            model = build_model(w.model, w.seed, device="meta" if light else device)
            profile = load_profile(w.compute.profile, w.model, w.batch_size, n_layers=len(model.layers))
        else:
            data = load_dataset(w.dataset, w.seed)
            model = build_model(w.model, w.seed, data.input_shape, data.num_classes, device=device)
            batches = GlobalBatches(data, w.batch_size, max(n_workers, 1), w.seed)
        costs = HostCosts(host, scale, events, machine)  # one accountant: the scheme's and the transport's messages
        slowdown = None
        if w.compute.mode == "emulated":  # real compute: the harness throttles the host (testbed.event_applier)
            slowdown = ComputeSlowdown.for_host(
                parse_events(spec.get("events")), entry.get("host"), scale, w.warmup_iterations, log=events
            )
            if slowdown is not None:
                costs.compute_slowdown = slowdown.factor
        ctx = Context(
            run_dir=run_dir,
            workload=w,
            topology=topology,
            scale=scale,
            name=name,
            role=role,
            index=index,
            rank=rank,
            world_size=world,
            processes=doc["processes"],
            model=model,
            data=data,
            batches=batches,
            transport=Transport(events, rank, world, costs=costs),
            events=events,
            comm=CommThread("comm"),
            crash_at=Context.crash_iteration(name),
            profile=profile,
            costs=costs,
            slowdown=slowdown,
            buffers=Buffers(light),
        )
        scheme = scheme_cls(ctx)
        t0 = time.perf_counter()
        scheme.main()
        ctx.comm.close(wait=True, timeout=60)
        ctx.comm.check()
        wall = time.perf_counter() - t0
        tr = ctx.transport
        write_json(
            run_dir / "results" / f"{name}.json",
            {
                "proc": name,
                "role": role,
                "rank": rank,
                "final_accuracy": ctx.results.pop("final_accuracy", None),
                "final_loss": ctx.results.pop("final_loss", None),
                "iterations": w.iterations,
                "wall_s": wall,
                "startup_s": round(time.time() - t_start - wall, 3),
                "bytes_sent": tr.bytes_sent,
                "bytes_received": tr.bytes_received,
                "bytes_reduced": tr.bytes_reduced,
                "host_costs": ctx.costs.summary(),
                **ctx.results,
            },
        )
        if w.save_params:
            state = scheme.final_state()
            if state is not None:
                torch.save({k: v.detach().clone() for k, v in state.items()}, run_dir / "params" / f"{name}.pt")
        # nobody leaves before everyone is done: rank 0 hosts the rendezvous store
        leave_together(store, rank, world, timedelta(seconds=doc["timeout_s"]))
        dist.destroy_process_group()
        return 0
    except BaseException as e:  # noqa: BLE001 - reported, then the process exits 1
        traceback.print_exc(file=sys.stdout)
        print(f"traffic.runtime: {name} failed: {type(e).__name__}: {e}", flush=True)
        if not isinstance(e, InjectedCrash) and _is_peer_failure(e):
            time.sleep(SECONDARY_FAILURE_DELAY_S)
        return 1
    finally:
        events.close()
        if machine is not None:
            machine.close()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``RUN_DIR PROC_NAME``; exits the process with run_process's status."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m traffic.runtime RUN_DIR PROC_NAME", file=sys.stderr)
        code = 2
    else:
        try:
            code = run_process(argv[0], argv[1])
        except BaseException:  # noqa: BLE001 - failures before the event log exists
            traceback.print_exc(file=sys.stdout)
            code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
