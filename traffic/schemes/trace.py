"""``workload.trace``: a Chakra execution trace replayed on the emulated network.

Role ``worker`` only, one per rank of the trace: rank ``r`` runs on the ``r``-th worker process
(the trace must have as many ranks as there are worker processes). Each process walks its
rank's steps in the order :mod:`traffic.chakra.trace` gives (the dependencies, one step at a
time, iteration by iteration):

* compute: the nodes' ``duration_micros`` as emulated compute, charged like every
  emulated layer (host cost ``compute``: dilated by ``scale``, times a straggler's slowdown);
  event ``compute`` (``nodes``: how many trace nodes it stands for, ``node``: the first one's
  id, ``requested_s``: the real seconds asked for);
* a collective: the real gloo collective of the node's size over its group (a process group
  per distinct group of the trace, made once in ``setup``; the whole job's is the default
  group); event ``allreduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
  ``broadcast``, ``reduce``, ``gather``, ``scatter`` or ``barrier`` (:mod:`traffic.runtime.transport`,
  with ``node`` and ``name``); the tensors are float32 when the size is a multiple of 4
  bytes, else bytes;
* a send: posted at once (non-blocking, so that two ranks that send to each other first do
  not wait on each other) and waited for at the end of the iteration; a receive: blocking.
  Events ``send``/``recv``.

Every worker marks each iteration (event ``iteration``, ``samples`` = ``workload.batch_size``,
``trace_iteration``: the trace's iteration it replays): iteration ``i`` of the run replays
iteration ``i mod K`` of the trace's ``K``. Steps run one after another: a trace whose
communication overlapped its compute (independent branches of the dependency graph) is
replayed without that overlap.

The trace is read and checked before anything is built (:func:`traffic.spec.trace_of`, from
the spec's validation and from :meth:`TraceReplay.plan`); each process reads it again from
the same path, so the path must be readable from the emulated hosts (on one machine it is).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from common.errors import SpecError, TestbedError
from traffic.chakra import Op
from traffic.runtime.transport import Pending
from traffic.schemes import register
from traffic.schemes.allreduce import gloo_ring_sends
from traffic.schemes.base import ProcessPlan, Scheme, worker_hosts
from traffic.spec import TRACE_SCHEME, trace_of

__all__ = ["TraceReplay"]

#: the event kind of each collective (the transport's own names)
EVENT_KINDS = {
    "all_reduce": "allreduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}


@register(TRACE_SCHEME)
class TraceReplay(Scheme):
    """Replays ``workload.trace`` (module docstring)."""

    roles = ("worker",)

    @classmethod
    def plan(cls, workload, hosts) -> list[ProcessPlan]:
        """One worker per rank of the trace on the worker hosts.

        Raises:
            SpecError: the trace cannot be read, or its rank count differs from the worker
                processes (``workload.workers``, or every worker host when 0).
        """
        procs = [ProcessPlan("worker", i, h.name) for i, h in enumerate(worker_hosts(workload, hosts))]
        try:
            trace = trace_of(workload)
        except TestbedError as e:
            raise SpecError(
                "workload.trace.path", getattr(workload.trace, "path", None), f"a readable Chakra trace: {e}"
            ) from e
        if trace.world_size != len(procs):
            hint = (
                f"; to use the first {trace.world_size} worker hosts only, set workload.workers: {trace.world_size}"
                if trace.world_size < len(procs)
                else "; use a topology with as many worker hosts"
            )
            raise SpecError(
                "workload.trace.path",
                workload.trace.path,
                f"a trace with as many ranks as worker processes: it has {trace.world_size} "
                f"({trace.prefix}.0.et to .{trace.world_size - 1}.et), the run {len(procs)} "
                f"(workload.workers: {workload.workers or 'one per worker host'}){hint}",
            )
        return procs

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message over one pass of the trace: a point-to-point message is one;
        an all-reduce, the segments of gloo's ring (:func:`~traffic.schemes.allreduce.gloo_ring_sends`);
        another collective, one message per part and peer. ``math.inf`` when the trace sends
        nothing or cannot be read."""
        try:
            trace = trace_of(workload)
        except TestbedError:
            return math.inf
        msgs = sent = 0
        for rt in trace.ranks:
            for op in rt.ops():
                if op.kind == "send":
                    msgs, sent = msgs + 1, sent + op.nbytes
                elif op.kind == "collective" and op.nbytes and len(op.group) > 1 and op.group[0] == rt.rank:
                    p = len(op.group)
                    if op.collective == "all_reduce":
                        m, b = gloo_ring_sends(op.nbytes, p)
                    else:
                        m, b = p * (p - 1), op.nbytes * (p - 1)
                    msgs, sent = msgs + m, sent + b
        return sent / msgs if msgs else math.inf

    # ---------------------------------------------------------------- process side

    def run_worker(self) -> None:
        """Replay this rank's steps for ``workload.iterations`` iterations (module docstring)."""
        ctx = self.ctx
        ev = ctx.events
        with ev.span("setup"):
            self.setup()
        steps = self.mine.iterations
        for it in range(ctx.iterations):
            ctx.maybe_crash(it)
            k = it % len(steps)
            with ev.span("iteration", iteration=it, samples=ctx.workload.batch_size, trace_iteration=k):
                for op in steps[k]:
                    self.run_op(op, it)
                ctx.transport.wait_all(self.sends)
                self.sends.clear()
        with ev.span("finish"):
            self.finish()

    def setup(self) -> None:
        """Read the trace; make a process group for each distinct group of its collectives
        (every process makes every group, in the same order, as torch.distributed requires)."""
        ctx = self.ctx
        trace = trace_of(ctx.workload)
        self.mine = trace.ranks[ctx.index]
        self.global_rank = ctx.ranks("worker")  # trace rank r -> global rank
        groups = sorted({op.group for rt in trace.ranks for op in rt.ops() if op.kind == "collective"})
        self.groups = {}
        for g in groups:
            if len(g) == ctx.world_size:
                self.groups[g] = None  # the default group
            else:
                self.groups[g] = ctx.transport.new_group([self.global_rank[r] for r in g])
        self.sends: list[Pending] = []
        self.buffers: dict[tuple[int, int, bool], torch.Tensor] = {}

    def buffer(self, nbytes: int, slot: int = 0, unit: int | None = None) -> torch.Tensor:
        """A tensor of ``nbytes`` bytes, reused: float32 when ``unit`` (default ``nbytes``) is a
        multiple of 4 bytes, else uint8 (``unit``: the part each member of a collective of
        parts holds, so that the whole splits into equal parts of whole elements)."""
        floats = (nbytes if unit is None else unit) % 4 == 0
        key = (nbytes, slot, floats)
        t = self.buffers.get(key)
        if t is None:
            t = torch.zeros(nbytes // 4, dtype=torch.float32) if floats else torch.zeros(nbytes, dtype=torch.uint8)
            self.buffers[key] = t
        return t

    def run_op(self, op: Op, it: int) -> None:
        """Run one step (module docstring)."""
        ctx, tr = self.ctx, self.ctx.transport
        f = {"iteration": it, "node": op.nodes[0], "name": op.name}
        if op.kind == "compute":
            seconds = op.seconds * ctx.costs.compute_factor()
            ts, t0 = time.time(), time.perf_counter()
            ctx.costs.wait("compute", seconds, span=False)
            ctx.events.record(
                "compute", ts, time.perf_counter() - t0, nodes=len(op.nodes), requested_s=seconds * ctx.costs.scale, **f
            )
        elif op.kind == "send":
            self.sends.append(tr.isend(self.buffer(op.nbytes, 1), self.global_rank[op.peer], tag=op.tag, **f))
        elif op.kind == "recv":
            tr.recv(self.buffer(op.nbytes, 2), self.global_rank[op.peer], tag=op.tag, **f)
        else:
            self.collective(op, f)

    def collective(self, op: Op, f: dict) -> None:
        """One collective of the trace over its group (module docstring)."""
        tr, group = self.ctx.transport, self.groups[op.group]
        kind = EVENT_KINDS[op.collective]
        root = None if op.root is None else self.global_rank[op.root]
        c = op.collective
        if c == "barrier":
            tr.barrier(group, kind=kind, **f)
            return
        if c == "all_reduce":
            tr.all_reduce(self.buffer(op.nbytes, 3), group=group, kind=kind, **f)
        elif c == "broadcast":
            tr.broadcast(self.buffer(op.nbytes, 3), root, group=group, kind=kind, **f)
        elif c == "reduce":
            tr.reduce(self.buffer(op.nbytes, 3), root, group=group, kind=kind, **f)
        else:
            p = len(op.group)
            part_bytes = op.nbytes // p
            whole = self.buffer(op.nbytes, 3, part_bytes)
            part = self.buffer(part_bytes, 4, part_bytes)
            parts = list(whole.split(part.numel())) if part.numel() else [part] * p
            if c == "all_gather":
                tr.all_gather(parts, part, group=group, kind=kind, **f)
            elif c == "reduce_scatter":
                tr.reduce_scatter(part, parts, group=group, kind=kind, **f)
            elif c == "all_to_all":
                tr.all_to_all(self.buffer(op.nbytes, 5, part_bytes), whole, group=group, kind=kind, **f)
            elif c == "gather":
                tr.gather(part, parts if root == self.ctx.rank else None, root, group=group, kind=kind, **f)
            elif c == "scatter":
                tr.scatter(part, parts if root == self.ctx.rank else None, root, group=group, kind=kind, **f)
            else:  # pragma: no cover - the reader refuses what COLLECTIVES does not name
                raise ValueError(f"collective {c!r} is not replayed")

    def final_state(self) -> dict | None:
        """Nothing: a replay trains no parameters."""
        return None
