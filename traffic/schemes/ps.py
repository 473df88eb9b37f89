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

Messages: push and pull of shard ``i`` use tag ``i`` (``Shard.id``). Events: workers log
``push`` (dir tx) and ``pull`` (dir rx); servers log ``push`` (dir rx), ``update`` and
``pull`` (dir tx), each with ``bytes``, ``peer``, ``key``, ``shard`` and ``layer``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from traffic.runtime.trainer import make_optimizer
from traffic.schemes.base import Scheme, register

__all__ = ["BIGARRAY_BOUND", "Shard", "assign_keys", "model_shards", "ParameterServer"]

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


def assign_keys(numels: Sequence[int], num_servers: int, bigarray_bound: int = BIGARRAY_BOUND,
                names: Sequence[str] | None = None) -> list[Shard]:
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


@register
class ParameterServer(Scheme):
    """Bulk-synchronous parameter server (see the module docstring).

    Options:
        bigarray_bound: keys with at least this many elements are split over all servers.
    """
    name = "ps"
    roles = ("worker", "server")
    options = {"bigarray_bound": BIGARRAY_BOUND}

    @classmethod
    def model_device(cls, role: str) -> str | None:
        """Servers need only the model's shapes: they get the values from worker 0."""
        return "meta" if role == "server" else None

    def _layout(self) -> None:
        ctx = self.ctx
        self.server_ranks = ctx.ranks("server")
        self.worker_ranks = ctx.ranks("worker")
        if not self.server_ranks or not self.worker_ranks:
            raise RuntimeError(f"scheme ps needs workers and servers; processes.json has "
                               f"{len(self.worker_ranks)} workers, {len(self.server_ranks)} servers")
        self.params = list(ctx.model.parameters())
        self.key_layer = ctx.model.param_layers()
        self.shards = model_shards(ctx.model, len(self.server_ranks), int(self.opts["bigarray_bound"]))

    def _fields(self, it: int, s: Shard) -> dict:
        return {"iteration": it, "layer": self.key_layer[s.key], "key": s.key, "shard": s.id}

    # ---------------------------------------------------------------- worker

    def setup(self) -> None:
        """Lay out the shards; worker 0 sends every shard's initial values to its server."""
        self._layout()
        if self.ctx.index == 0:
            tr = self.ctx.transport
            flat = [p.data.view(-1) for p in self.params]
            tr.wait_all([tr.isend(flat[s.key][s.lo:s.hi], self.server_ranks[s.server], tag=s.id,
                                  kind="init", **self._fields(-1, s)) for s in self.shards])

    def on_backward_end(self, it: int) -> None:
        """Push every shard of the gradient, pull every shard of the new parameters into the model."""
        tr = self.ctx.transport
        flat_params = [p.data.view(-1) for p in self.params]
        flat_grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        pulls = [tr.irecv(flat_params[s.key][s.lo:s.hi], self.server_ranks[s.server], tag=s.id,
                          kind="pull", **self._fields(it, s)) for s in self.shards]
        pushes = [tr.isend(flat_grads[s.key][s.lo:s.hi], self.server_ranks[s.server], tag=s.id,
                           kind="push", **self._fields(it, s)) for s in self.shards]
        tr.wait_all(pushes)
        tr.wait_all(pulls)

    # ---------------------------------------------------------------- server

    def run_server(self) -> None:
        """Serve ``workload.iterations`` rounds of push/update/pull for this server's shards.

        Raises:
            RuntimeError / DistBackendError: a worker died or communication timed out.
        """
        ctx = self.ctx
        self._layout()
        tr, ev, W = ctx.transport, ctx.events, len(self.worker_ranks)
        self.mine = [s for s in self.shards if s.server == ctx.index]
        self.values = [torch.nn.Parameter(torch.empty(s.numel)) for s in self.mine]
        tr.wait_all([tr.irecv(v.data, self.worker_ranks[0], tag=s.id, kind="init", **self._fields(-1, s))
                     for s, v in zip(self.mine, self.values)])
        opts = [make_optimizer([v], ctx.workload.optimizer) for v in self.values]
        bufs = [[torch.empty(s.numel) for _ in range(W)] for s in self.mine]
        ev.instant("server_keys", shards=[s.id for s in self.mine], numel=sum(s.numel for s in self.mine))
        for it in range(ctx.iterations):
            ctx.maybe_crash(it)
            pushes = [[tr.irecv(bufs[i][j], wr, tag=s.id, kind="push", **self._fields(it, s))
                       for j, wr in enumerate(self.worker_ranks)] for i, s in enumerate(self.mine)]
            sends = []
            for i, s in enumerate(self.mine):
                tr.wait_all(pushes[i])
                with ev.span("update", **self._fields(it, s)):
                    g = bufs[i][0]  # summed in place: the buffers are refilled only next round
                    for b in bufs[i][1:]:
                        g += b
                    g /= W
                    self.values[i].grad = g
                    opts[i].step()
                v = self.values[i].detach()
                sends += [tr.isend(v, wr, tag=s.id, kind="pull", **self._fields(it, s))
                          for wr in self.worker_ranks]
            tr.wait_all(sends)  # before the next round changes the values in place

    def final_state(self) -> dict | None:
        """Workers: the model's state dict. Servers: ``{"<param>[lo:hi]": shard values (1-D)}``."""
        if self.ctx.role == "server":
            return {f"{s.name}[{s.lo}:{s.hi}]": v.detach() for s, v in zip(self.mine, self.values)}
        return super().final_state()
