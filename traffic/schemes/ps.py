"""Parameter server (``ps``): bulk-synchronous SGD with sharded servers, as MXNet's KVStore.

Roles ``worker`` and ``server``. A *key* is one parameter tensor of the model (forward
order: key 0 is layer 0's weight). Keys are cut into *shards*, each owned by one server
(:func:`assign_keys`):

* a key of at least ``bigarray_bound`` elements (option, default 1,000,000 as MXNet's
  ``MXNET_KVSTORE_BIGARRAY_BOUND``) is split into ``S`` contiguous, near-equal ranges of its
  flattened elements, range ``s`` on server ``s`` (``S`` = number of servers);
* every other key goes whole to the server with the fewest elements assigned so far, keys
  taken in key order, ties to the lowest server index (greedy balancing by size; with
  equal-size keys this is round robin).

One iteration, per worker (in ``on_backward_end``, after the whole backward pass):
*push* each shard of its gradient to the shard's server, then *pull* each shard of the new
parameters from it into the model. Per server: receive the ``W`` pushes of each of its
shards, average them (sum / ``W``), apply ``torch.optim.SGD`` (momentum, weight decay; one
optimizer state per shard -- the update is element-wise, so this equals a single process
updating the whole model), and send the updated shard to every worker. Servers run
``workload.iterations`` such rounds, then exit.

Initial parameters: every worker builds the model from ``workload.seed``; servers build it
on the meta device (shapes only, no memory) and worker 0 sends each shard's initial values
to its server during ``setup`` (kind ``init``), as MXNet's KVStore ``init`` does. From then
on the servers' copy is authoritative. (A server holding the whole model would need one
model's memory per server: 570 MB each for VGG-19.)

Layer-wise overlap (option ``overlap: true``; default ``false``, the bulk behaviour above):
MXNet's KVStore with wait-free backprop (Poseidon), the P3 paper's baseline. Per worker:

* ``after_backward(it, l)`` (compute thread): post the receives (``pull``) of every shard of
  layer ``l``'s keys straight into the model's parameters (layer ``l`` is not read again
  before the next forward), then hand one job to ``ctx.comm`` (FIFO) that pushes those
  shards (``isend`` to each shard's server, then waits) -- backward of the earlier layers
  continues meanwhile, and layers are pushed in the order their gradients became ready;
* ``before_forward(it, l)`` (``it`` > 0): wait for the pulls of layer ``l`` only;
* ``finish``: wait for the remaining pulls and drain the comm thread. Worker 0 also waits
  for every pull at the end of an iteration after which it evaluates.

Servers process their shards in the order workers push them (last layer first) and send
each updated shard to every worker as soon as it is aggregated and updated: the pull of a
key is "issued" once that key is aggregated. (MXNet's worker sends a pull request on the
update notification; here the server sends unasked, saving that request's round trip, as
P3Server does.)

Pull requests (option ``pull_request: true``; default ``false``, the unasked sends above):
MXNet KVStore's own pull path, the P3 paper's baseline (Sec. 4.1, 4.2), in
:mod:`traffic.schemes.ps_pull_request`. A server sends each worker a small update
*notification* per updated shard instead of the values; a worker's ``pull`` thread, once it
holds the notifications of every shard of a layer, sends one pull request per server holding
shards of that layer and receives the answers straight into the model; each server answers
on one ``respond<j>`` thread per worker, charging the host cost ``request_startup`` per
request. Bulk mode: ``on_backward_end`` pushes every shard, then waits until every layer
is pulled; with ``overlap``: ``after_backward`` only pushes, ``before_forward(it, l)`` waits
for layer ``l`` of round ``it - 1``. The values each forward pass reads are the same as
without the option; only the messages (and their timing) differ.

Light memory (``workload.compute.memory: light``, :mod:`traffic.runtime.buffers`): workers
push their gradients from the shared zeros and pull onto scratch (of each shard's size:
:meth:`~traffic.runtime.buffers.Buffers.landing_range`); a server receives the
initial values and the pushes onto scratch, sends zeros, and skips the summation and the
optimizer step, whose stated host costs are still charged. Every message is the same.

Messages: push and pull of shard ``i`` use tag ``i`` (``Shard.id``); notifications and pull
requests their own tags (:data:`traffic.schemes.ps_pull_request.NOTIFY_TAG`,
``PULL_REQUEST_TAG``). Events: workers log ``push`` (dir tx) and ``pull`` (dir rx); servers
log ``push`` (dir rx), ``update`` and ``pull`` (dir tx), each with ``bytes``, ``peer``,
``iteration``, ``layer``, ``key``, ``shard`` and ``slice`` (both the shard's id) and
``priority`` (the layer index; ``ps`` does not schedule by it, the field lets plots compare
with ``p3``). With ``pull_request`` also ``notify`` and ``pull_request`` on both ends (fields
in :mod:`traffic.schemes.ps_pull_request`).

Subclasses (``p3``) change the cut of keys (:meth:`ParameterServer._make_shards`), the
message kinds, the worker's send path (:meth:`ParameterServer._submit_push`) and the
server's processing order (:meth:`ParameterServer._aggregated`); ``ibatch`` changes how
updated shards reach the workers (:meth:`ParameterServer._publish`, ``_round_start``,
``_round_end``: answered pull requests instead of unasked sends).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from pydantic import Field

from common.errors import SpecError
from topologies.hosts import HostInfo, HostRequest
from traffic.runtime.trainer import TensorSGD
from traffic.runtime.transport import Pending
from traffic.schemes import register
from traffic.schemes.base import (
    ProcessPlan,
    Scheme,
    SchemeOptions,
    count_roles,
    gradient_sync_bytes,
    model_keys,
    worker_hosts,
)
from traffic.schemes.ps_pull_request import CONTROL_BYTES, NotifiedPuller, RequestResponder

__all__ = ["BIGARRAY_BOUND", "Shard", "assign_keys", "model_shards", "ParameterServer"]

#: bytes per element of every key (float32)
ELEMENT_BYTES = 4

BIGARRAY_BOUND = 1_000_000


@dataclass(frozen=True)
class Shard:
    """A contiguous range ``[lo, hi)`` of the flattened key ``key``, owned by server ``server``.

    ``id`` numbers the shards of a model from 0 (key order, then server order) and is the
    tag of the shard's push and pull messages. ``name`` is the parameter's name in the
    model's state dict.
    """

    id: int
    key: int
    name: str
    server: int
    lo: int
    hi: int

    @property
    def numel(self) -> int:
        """Number of elements of the shard."""
        return self.hi - self.lo


def assign_keys(
    numels: Sequence[int], num_servers: int, bigarray_bound: int = BIGARRAY_BOUND, names: Sequence[str] | None = None
) -> list[Shard]:
    """Cut keys into shards and give each shard a server (the rule in the module docstring).

    Args:
        numels: elements of each key, in key order.
        num_servers: ``S`` >= 1.
        bigarray_bound: keys with at least this many elements are split over all servers.
        names: the keys' names (default ``"key<i>"``).

    Returns:
        Shards ordered by key, then server; every element of every key is in exactly one.

    Raises:
        ValueError: ``num_servers`` < 1 or ``bigarray_bound`` < 1.
    """
    if num_servers < 1:
        raise ValueError(f"need at least one server, got {num_servers}")
    if bigarray_bound < 1:
        raise ValueError(f"bigarray_bound must be >= 1, got {bigarray_bound}")
    names = list(names) if names is not None else [f"key{k}" for k in range(len(numels))]
    load = [0] * num_servers
    shards: list[Shard] = []
    for k, n in enumerate(numels):
        n = int(n)
        if n >= bigarray_bound and num_servers > 1:
            for s in range(num_servers):
                lo, hi = s * n // num_servers, (s + 1) * n // num_servers
                if hi > lo:
                    shards.append(Shard(len(shards), k, names[k], s, lo, hi))
                    load[s] += hi - lo
        else:
            s = min(range(num_servers), key=lambda i: (load[i], i))
            shards.append(Shard(len(shards), k, names[k], s, 0, n))
            load[s] += n
    return shards


def model_shards(model: torch.nn.Module, num_servers: int, bigarray_bound: int = BIGARRAY_BOUND) -> list[Shard]:
    """:func:`assign_keys` over ``model.named_parameters()`` (the keys, in forward order)."""
    named = list(model.named_parameters())
    return assign_keys([p.numel() for _, p in named], num_servers, bigarray_bound, [n for n, _ in named])


class PSOptions(SchemeOptions):
    """Options of ``ps`` (and of ``ibatch``, which adds its own)."""

    bigarray_bound: int = Field(BIGARRAY_BOUND, gt=0)
    """Keys with at least this many elements are split over all servers (MXNet's
    ``MXNET_KVSTORE_BIGARRAY_BOUND``)."""
    overlap: bool = False
    """Push each layer's gradient as soon as its backward is done and wait, before each
    layer's forward, only for that layer's parameters (false: push and pull everything
    after the whole backward pass)."""
    pull_request: bool = False
    """Pull as MXNet's KVStore, the P3 paper's baseline: a server sends an update
    notification per updated shard, and a worker that holds the notifications of every shard
    of a layer sends a pull request to each server holding shards of it, which answers with
    them (P3 Sec. 4.1: "KVWorker receives a notification, it immediately issues a Pull
    request to the KVServer(s) for the corresponding updated parameter values. KVServer then
    sends the latest parameter values in response"; Sec. 4.2: "MXNet only issues a pull
    request once it has received the update notification for all the slices of a layer").
    Each request costs the server ``host.request_startup_ms``. False: servers send updated
    shards unasked, as P3Server (Sec. 4.2: "we remove the explicit update notification and
    pull requests")."""


@register("ps")
class ParameterServer(Scheme):
    """Parameter server, bulk-synchronous or with layer-wise overlap (see the module docstring).

    Options: :class:`PSOptions`. Server placement: ``workload.servers``
    (:class:`traffic.spec.ServersSpec`), shared by every PS-family scheme (``p3``,
    ``ibatch``, ``phub``), which asks for dedicated server hosts through :meth:`hosts`.
    """

    roles = ("worker", "server")
    Options = PSOptions
    push_kind = "push"  # event kind of a gradient message
    pull_kind = "pull"  # event kind of an updated-parameter message (server -> worker)
    # with pull_request: the worker's puller (setup) and the server's responder (run_server)
    _notified: NotifiedPuller | None = None
    _responder: RequestResponder | None = None
    light_refusal = None

    @classmethod
    def light_buffer_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """:meth:`Scheme.light_buffer_bytes`: the largest shard of :meth:`planned_shards`
        (a worker's pull lands on scratch; a server receives each push there).

        Raises:
            KeyError: unknown model.
        """
        return ELEMENT_BYTES * max(s.numel for s in cls.planned_shards(workload, processes)[1])

    @classmethod
    def hosts(cls, workload, topology) -> list[HostRequest]:
        """Dedicated server hosts (``workload.servers.placement: dedicated``), each with
        ``servers.interfaces`` links (a PBox when > 1); none for colocated servers.

        ``servers.count`` hosts globally (spread over racks round robin) or per rack
        (``scope: per_rack``). ``servers.count: 0`` (``servers.config: NCS``) means one
        server host per worker, in that worker's rack; the workers are the first
        ``workload.workers`` worker hosts (all ``racks * hosts_per_rack`` when 0), rack by rack.
        """
        s = workload.servers
        if s.placement != "dedicated":
            return []
        racks, per_rack = topology.racks, topology.hosts_per_rack
        if s.count == 0:
            n = workload.workers or racks * per_rack
            in_racks = [min(i // per_rack, racks - 1) for i in range(n)]
        elif s.scope == "per_rack":
            in_racks = [r for r in range(racks) for _ in range(s.count)]
        else:
            in_racks = [i % racks for i in range(s.count)]
        return [HostRequest("server", r, s.interfaces) for r in in_racks]

    @classmethod
    def plan(cls, workload, hosts: list[HostInfo]) -> list[ProcessPlan]:
        """Workers as :meth:`Scheme.plan`; servers colocated on worker hosts (spread evenly:
        per rack when ``servers.scope`` is ``per_rack``) or, on dedicated server hosts, one
        server per interface of each host (a PBox of k interfaces runs k servers, ``iface``
        0..k-1, numbered host by host; PHub Sec. 3.3: keys are balanced over the
        interfaces). ``servers.count: 0`` means one server per worker.

        Raises:
            SpecError: more workers or servers asked for than there are hosts.
        """
        workers = worker_hosts(workload, hosts)
        procs = [ProcessPlan("worker", i, h.name) for i, h in enumerate(workers)]
        s = workload.servers
        if s.placement == "dedicated":
            return procs + [
                ProcessPlan("server", j, h, i)
                for j, (h, i) in enumerate(
                    (h.name, i) for h in hosts if h.kind == "server" for i in range(h.interfaces)
                )
            ]
        if s.scope == "per_rack":
            server_hosts = []
            for r in sorted({h.rack for h in workers}):
                in_rack = [h.name for h in workers if h.rack == r]
                count = s.count or len(in_rack)
                if count > len(in_rack):
                    raise SpecError(
                        "workload.servers.count", s.count, f"at most {len(in_rack)} colocated servers per rack"
                    )
                server_hosts += _spread(in_rack, count)
        else:
            count = s.count or len(workers)
            if count > len(workers):
                raise SpecError(
                    "workload.servers.count", s.count, f"at most {len(workers)} colocated servers (one per worker host)"
                )
            # spread over racks: take hosts in an order that alternates racks
            by_rack: dict[int, list[str]] = {}
            for h in workers:
                by_rack.setdefault(h.rack, []).append(h.name)
            server_hosts = _interleave(list(by_rack.values()))[:count]
        return procs + [ProcessPlan("server", i, h) for i, h in enumerate(server_hosts)]

    @classmethod
    def planned_shards(cls, workload, processes: Sequence[ProcessPlan]) -> tuple:
        """``(keys, shards)`` of a plan, without building anything: the model's keys
        (:func:`~traffic.schemes.base.model_keys`: ``(elements, layer)`` each) and their
        :func:`assign_keys` shards over the plan's server processes (at least one), split at
        the options' ``bigarray_bound``.

        Raises:
            KeyError: unknown model.
        """
        keys = model_keys(workload.model)
        servers = max(count_roles(processes).get("server", 0), 1)
        return keys, assign_keys([n for n, _ in keys], servers, cls.options_of(workload).bigarray_bound)

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message (:meth:`Scheme.message_bytes`): per iteration every worker
        pushes every shard of :func:`assign_keys` (the model's keys, those of at least
        ``bigarray_bound`` elements split over the ``S`` server processes of the plan) and
        receives it back, one message each way, so the mean is the parameter bytes over the
        number of shards. With ``pull_request`` a worker also receives one notification per
        shard and sends one request per (layer, server holding shards of it), each
        :data:`~traffic.schemes.ps_pull_request.CONTROL_BYTES` (16) bytes
        (:mod:`traffic.schemes.ps_pull_request`), which lowers the mean.

        Raises:
            KeyError: unknown model.
        """
        opts = cls.options_of(workload)
        keys, shards = cls.planned_shards(workload, processes)
        data = ELEMENT_BYTES * sum(s.numel for s in shards)
        if not getattr(opts, "pull_request", False):
            return data / len(shards)
        requests = len({(keys[s.key][1], s.server) for s in shards})
        # per worker: push + pull per shard, a notification per shard, a request per (layer, server)
        return (2 * data + CONTROL_BYTES * (len(shards) + requests)) / (3 * len(shards) + requests)

    @classmethod
    def min_sent_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float | None:
        """:meth:`Scheme.min_sent_bytes`: every worker pushes its whole float32 gradient every
        iteration (so do P3's slices and iBatch's pushes):
        :func:`~traffic.schemes.base.gradient_sync_bytes` of the workers."""
        return gradient_sync_bytes(workload, processes)

    @classmethod
    def model_device(cls, role: str) -> str | None:
        """Servers need only the model's shapes: they get the values from worker 0."""
        return "meta" if role == "server" else None

    @property
    def overlapped(self) -> bool:
        """True when pushes start in ``after_backward`` and pulls are awaited per layer."""
        return self.opts.overlap

    @property
    def pull_requested(self) -> bool:
        """True when workers pull on update notifications (option ``pull_request``; subclasses
        whose options lack it: false)."""
        return bool(getattr(self.opts, "pull_request", False))

    def _make_shards(self) -> list[Shard]:
        """The cut of the model's keys into shards with their servers (ps: :func:`model_shards`)."""
        return model_shards(self.ctx.model, len(self.server_ranks), self.opts.bigarray_bound)

    def _layout(self) -> None:
        ctx = self.ctx
        self.server_ranks = ctx.ranks("server")
        self.worker_ranks = ctx.ranks("worker")
        if not self.server_ranks or not self.worker_ranks:
            raise RuntimeError(
                f"scheme {self.name} needs workers and servers; processes.json has "
                f"{len(self.worker_ranks)} workers, {len(self.server_ranks)} servers"
            )
        self.params = list(ctx.model.parameters())
        self.key_layer = ctx.model.param_layers()
        self.shards = self._make_shards()
        self.layer_shards: list[list[Shard]] = [[] for _ in ctx.model.layers]
        for s in self.shards:
            self.layer_shards[self.key_layer[s.key]].append(s)

    def _priority(self, s: Shard) -> int:
        """Priority of a shard: its layer's index in forward order (0 = most urgent)."""
        return self.key_layer[s.key]

    def _fields(self, it: int, s: Shard) -> dict:
        return {
            "iteration": it,
            "layer": self.key_layer[s.key],
            "key": s.key,
            "shard": s.id,
            "slice": s.id,
            "priority": self._priority(s),
        }

    # ---------------------------------------------------------------- worker

    def setup(self) -> None:
        """Lay out the shards; worker 0 sends every shard's initial values to its server."""
        self._layout()
        self._pulls: dict[int, list[Pending]] = {}  # layer -> pulls in flight
        if self.ctx.index == 0:
            tr = self.ctx.transport
            flat = [self.ctx.buffers.values(p).view(-1) for p in self.params]
            tr.wait_all(
                [
                    tr.isend(
                        flat[s.key][s.lo : s.hi],
                        self.server_ranks[s.server],
                        tag=s.id,
                        kind="init",
                        **self._fields(-1, s),
                    )
                    for s in self.shards
                ]
            )
        if self.pull_requested:
            self._notified = NotifiedPuller(
                self.ctx.transport, self.shards, self.key_layer, self.server_ranks, self.ctx.iterations, self._post_pull
            )
            self._notified.start()

    def _grad_slice(self, s: Shard) -> torch.Tensor:
        return self.ctx.buffers.grad(self.params[s.key]).view(-1)[s.lo : s.hi]

    def _post_pull(self, it: int, s: Shard) -> Pending:
        """Post the receive of shard ``s``'s updated values straight into the model (light
        memory: onto scratch of the shard's size)."""
        return self.ctx.transport.irecv(
            self.ctx.buffers.landing_range(self.params[s.key], s.lo, s.hi),
            self.server_ranks[s.server],
            tag=s.id,
            kind=self.pull_kind,
            **self._fields(it, s),
        )

    def on_backward_end(self, it: int) -> None:
        """Bulk: push every shard of the gradient, pull every shard of the new parameters.

        With ``overlap``: nothing, except on worker 0 before an evaluation (wait for every pull).
        With ``pull_request``: the pulls are the ``pull`` thread's; bulk waits for all of them.
        """
        if self.overlapped:
            every = self.ctx.workload.eval_every
            if self.ctx.index == 0 and every > 0 and (it + 1) % every == 0:
                if self._notified is not None:
                    self._notified.wait_round(it)
                self._wait_pulls()
            return
        tr = self.ctx.transport
        if self._notified is not None:
            tr.wait_all(
                [
                    tr.isend(
                        self._grad_slice(s),
                        self.server_ranks[s.server],
                        tag=s.id,
                        kind=self.push_kind,
                        **self._fields(it, s),
                    )
                    for s in self.shards
                ]
            )
            self._notified.wait_round(it)
            return
        pulls = [self._post_pull(it, s) for s in self.shards]
        pushes = [
            tr.isend(
                self._grad_slice(s), self.server_ranks[s.server], tag=s.id, kind=self.push_kind, **self._fields(it, s)
            )
            for s in self.shards
        ]
        tr.wait_all(pushes)
        tr.wait_all(pulls)

    def after_backward(self, it: int, layer: int) -> None:
        """Overlap: post layer ``layer``'s pulls, then queue its pushes on the comm thread."""
        if not self.overlapped or not self.layer_shards[layer]:
            return
        shards = self.layer_shards[layer]
        if self._notified is None:  # with pull_request the pull thread posts them on the notifications
            self._pulls[layer] = [self._post_pull(it, s) for s in shards]
        self._submit_push(it, layer, [(s, self._grad_slice(s)) for s in shards])

    def _submit_push(self, it: int, layer: int, items: list[tuple[Shard, torch.Tensor]]) -> None:
        """Queue the pushes of one layer's shards: one FIFO job that isends all, then waits."""
        tr = self.ctx.transport

        def push() -> None:
            tr.wait_all(
                [
                    tr.isend(g, self.server_ranks[s.server], tag=s.id, kind=self.push_kind, **self._fields(it, s))
                    for s, g in items
                ]
            )

        self.ctx.comm.submit(push)

    def before_forward(self, it: int, layer: int) -> None:
        """Overlap: wait until layer ``layer``'s parameters of the previous iteration arrived."""
        if self.overlapped:
            if self._notified is not None and it > 0:
                self._notified.wait_layer(it - 1, layer)
            self.ctx.transport.wait_all(self._pulls.pop(layer, []))

    def _wait_pulls(self) -> None:
        for layer in list(self._pulls):
            self.ctx.transport.wait_all(self._pulls.pop(layer))

    def finish(self) -> None:
        """Overlap: wait for every outstanding pull and push (the final parameters are in the
        model). With ``pull_request``: also the last round's pulls, then stop the pull threads."""
        if self._notified is not None:
            if self.ctx.iterations > 0:
                self._notified.wait_round(self.ctx.iterations - 1)
            self._notified.close()
        if self.overlapped:
            self._wait_pulls()
            self.ctx.comm.drain()

    # ---------------------------------------------------------------- server

    def _aggregated(self, it: int) -> Iterator[int]:
        """Receive every worker's push of every own shard of round ``it`` into
        ``self._bufs[i][j]`` (shard ``i``, worker ``j``) and yield the index (into
        ``self.mine``) of each shard once all ``W`` copies are in, in processing order.

        ps: receives posted at once; bulk in key order, with ``overlap`` in the order the
        workers push (last layer first, key order within a layer)."""
        tr = self.ctx.transport
        pushes = [
            [
                tr.irecv(self._bufs[i][j], wr, tag=s.id, kind=self.push_kind, **self._fields(it, s))
                for j, wr in enumerate(self.worker_ranks)
            ]
            for i, s in enumerate(self.mine)
        ]
        order = range(len(self.mine))
        if self.overlapped:
            order = sorted(order, key=lambda i: (-self._priority(self.mine[i]), self.mine[i].id))
        for i in order:
            tr.wait_all(pushes[i])
            yield i

    def run_server(self) -> None:
        """Serve ``workload.iterations`` rounds of push/update/pull for this server's shards.

        Per round, for each own shard as :meth:`_aggregated` yields it (all workers' pushes
        in): average, SGD step, send to every worker. The summation of the ``W`` copies and
        the step are charged as host costs ``aggregate`` (``W x`` the shard's bytes of
        incoming gradient) and ``optimizer`` (the shard's bytes of parameters).

        Raises:
            RuntimeError / DistBackendError: a worker died or communication timed out.
        """
        ctx = self.ctx
        self._layout()
        tr, ev, W, light = ctx.transport, ctx.events, len(self.worker_ranks), ctx.buffers.light
        self.mine = [s for s in self.shards if s.server == ctx.index]
        # light memory: the values sent are zeros (no memory), what arrives lands on scratch
        self.values = [torch.nn.Parameter(ctx.buffers.zeros(s.numel), requires_grad=not light) for s in self.mine]
        tr.wait_all(
            [
                tr.irecv(
                    v.data if not light else ctx.buffers.empty(s.numel),
                    self.worker_ranks[0],
                    tag=s.id,
                    kind="init",
                    **self._fields(-1, s),
                )
                for s, v in zip(self.mine, self.values)
            ]
        )
        opts = [TensorSGD(v, ctx.workload.optimizer) for v in self.values] if not light else []
        bufs = self._bufs = [[ctx.buffers.empty(s.numel) for _ in range(W)] for s in self.mine]
        ev.instant("server_keys", shards=[s.id for s in self.mine], numel=sum(s.numel for s in self.mine))
        if self.pull_requested:
            self._responder = RequestResponder(
                tr, ctx.costs, self.mine, self.values, self.key_layer, self.worker_ranks, self.pull_kind, self._fields
            )
        for it in range(ctx.iterations):
            ctx.maybe_crash(it)
            self._round_start(it)
            sends = []
            for i in self._aggregated(it):
                s = self.mine[i]
                nbytes = s.numel * ELEMENT_BYTES
                with ev.span("update", **self._fields(it, s)):
                    # host costs (traffic.hostmodel): summing W copies, then the optimizer on the shard
                    # (light memory: no values, the host model charges the stated costs alone)
                    with ctx.costs.charge("aggregate", nbytes=W * nbytes, iteration=it, shard=s.id):
                        if not light:
                            g = bufs[i][0]  # summed in place: the buffers are refilled only next round
                            for b in bufs[i][1:]:
                                g += b
                            g /= W
                    with ctx.costs.charge("optimizer", nbytes=nbytes, iteration=it, shard=s.id):
                        if not light:
                            opts[i].step(g)
                sends += self._publish(it, i)
            tr.wait_all(sends)  # before the next round changes the values in place
            self._round_end(it)

    def _round_start(self, it: int) -> None:
        """Server hook at the start of round ``it``, before any push is received (ps: nothing;
        with ``pull_request``: start answering the workers' requests)."""
        if self._responder is not None:
            self._responder.start_round(it)

    def _publish(self, it: int, i: int) -> list[Pending]:
        """Server hook: shard ``self.mine[i]`` was just updated in round ``it``; returns the
        sends to wait for before the next round (ps: send it unasked to every worker; with
        ``pull_request``: its update notification to every worker)."""
        if self._responder is not None:
            return self._responder.notify(it, i)
        s, v = self.mine[i], self.values[i].detach()
        return [
            self.ctx.transport.isend(v, wr, tag=s.id, kind=self.pull_kind, **self._fields(it, s))
            for wr in self.worker_ranks
        ]

    def _round_end(self, it: int) -> None:
        """Server hook after round ``it``'s sends completed, before the next round's updates (ps:
        nothing; with ``pull_request``: wait until every worker pulled every own shard).

        Raises:
            RuntimeError / DistBackendError: a protocol error or failed transfer while answering.
        """
        if self._responder is not None:
            self._responder.end_round(it)

    def final_state(self) -> dict | None:
        """Workers: the model's state dict. Servers: ``{"<param>[lo:hi]": shard values (1-D)}``."""
        if self.ctx.role == "server":
            return {f"{s.name}[{s.lo}:{s.hi}]": v.detach() for s, v in zip(self.mine, self.values)}
        return super().final_state()


def _spread(items: list, count: int) -> list:
    """``count`` items spread evenly over ``items`` (first, then every len/count-th)."""
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def _interleave(groups: list[list]) -> list:
    """Round-robin merge: [[a,b],[c,d]] -> [a,c,b,d]."""
    out = []
    for i in range(max(len(g) for g in groups)):
        out += [g[i] for g in groups if i < len(g)]
    return out
