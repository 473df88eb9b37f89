"""The scheme interface: what a communication scheme implements, and how it is registered.

A scheme is one module in ``traffic/schemes/`` holding one :class:`Scheme` subclass decorated
with :func:`register`. The harness never imports a scheme by name: it asks the registry for
the scheme's process plan (:meth:`Scheme.plan`), launches one process per planned role on its
host, and each process runs ``python -m traffic.runtime``, which builds a
:class:`~traffic.runtime.context.Context` and calls :meth:`Scheme.main`.

Roles are free-form names (``worker``, ``server``, ``conv``, ``fc``, ``pbox`` ...). A role
``R`` is run by the method ``run_R(self)``. The base class gives ``run_worker``: the standard
training loop of :class:`~traffic.runtime.trainer.Trainer`, which calls the hooks below at
the points a scheme needs to act:

    setup()                       once, after the process group is up (initial sync)
    on_iteration_start(it)        before the forward pass of iteration ``it``
    before_forward(it, layer)     before layer ``layer`` (forward order) computes forward;
                                  a scheme that pulls parameters layer by layer waits here
    after_backward(it, layer)     as soon as layer ``layer``'s gradients are ready
                                  (backward runs from the last layer to the first); a
                                  scheme with wait-free backprop enqueues the push here
    on_backward_end(it)           after the whole backward pass; a bulk-synchronous scheme
                                  synchronizes here and leaves the new parameters in the model
    finish()                      once, after the last iteration; must leave the final
                                  parameters in the model (the final evaluation and
                                  ``params/<proc>.pt`` read them)

After ``main()`` returns, the runtime writes ``params/<proc>.pt`` from :meth:`Scheme.final_state`
when ``workload.save_params`` is set.

Hooks run on the compute thread; a scheme that overlaps communication with computation
hands work to ``ctx.comm`` (a :class:`~traffic.runtime.comm.CommThread`) and waits on the
returned futures where it must.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from topologies.errors import SpecError

if TYPE_CHECKING:  # pragma: no cover
    from testbed.spec import WorkloadSpec
    from traffic.runtime.context import Context


@dataclass(frozen=True)
class HostInfo:
    """A host of the built topology as a scheme's plan sees it.

    ``kind`` is ``worker`` for ordinary hosts, ``server`` for hosts added to run only
    servers (``workload.servers.placement: dedicated``) and ``background`` for hosts that
    only carry background traffic (a plan must not use them). ``rack`` counts from 0.
    ``interfaces``: the host's links to its ToR (``ProcessPlan.iface`` indexes them; a PBox
    has ``workload.servers.interfaces``).
    """
    name: str
    rack: int
    kind: str = "worker"
    interfaces: int = 1


@dataclass(frozen=True)
class ProcessPlan:
    """One process to launch: its role, the index within that role, its host and the
    host's interface it communicates on.

    ``iface`` indexes the host's interfaces to its ToR (0 = ``<host>-eth0``; a host built
    with several interfaces, e.g. a PBox, has ``0 .. k-1``): the process's address and
    ``GLOO_SOCKET_IFNAME`` are that interface's. The harness assigns ``rank``
    (torch.distributed global rank) in plan order.
    """
    role: str
    index: int
    host: str
    iface: int = 0

    @property
    def name(self) -> str:
        """Process name used for files: ``events/<name>.jsonl``, ``logs/<name>.log``."""
        return f"{self.role}{self.index}"


class Scheme:
    """Base class of every communication scheme (one instance per process).

    Class attributes a subclass sets:
        name: registry name, used as ``workload.scheme``.
        roles: the roles it needs, e.g. ``("worker", "server")``.
        options: default scheme options (``workload.options``); keys not listed here are
            rejected by :meth:`validate_options`.
    """
    name: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ("worker",)
    options: ClassVar[dict] = {}

    def __init__(self, ctx: "Context"):
        self.ctx = ctx
        self.opts = {**self.options, **ctx.workload.options}

    # ---------------------------------------------------------------- harness side (classmethods)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        """Reject unknown ``workload.options`` keys.

        Raises:
            SpecError: naming ``workload.options.<key>`` and the keys allowed.
        """
        for k, v in options.items():
            if k not in cls.options:
                allowed = ", ".join(cls.options) or "none for this scheme"
                raise SpecError(f"workload.options.{k}", v, f"options of scheme '{cls.name}': {allowed}")

    @classmethod
    def dedicated_server_hosts(cls, workload: "WorkloadSpec", racks: int,
                               hosts_per_rack: int | None = None) -> list[int]:
        """Racks that need one extra server-only host each (one entry per host).

        Default: none unless the scheme has a ``server`` role and the spec asks for
        ``servers.placement: dedicated``; then ``servers.count`` hosts globally (spread over
        racks round robin) or per rack. ``servers.count: 0`` (``servers.config: NCS``) means
        one server host per worker, in that worker's rack; the workers are the first
        ``workload.workers`` hosts (all ``racks * hosts_per_rack`` when 0), rack by rack.

        Raises:
            ValueError: ``servers.count`` is 0 with ``workload.workers`` 0 and no
                ``hosts_per_rack`` (the number of workers is unknown).
        """
        s = workload.servers
        if "server" not in cls.roles or s.placement != "dedicated":
            return []
        if s.count == 0:
            if hosts_per_rack is None:  # racks of the workers unknown: round robin
                if not workload.workers:
                    raise ValueError("servers.count 0 (one server host per worker) needs hosts_per_rack")
                return [i % racks for i in range(workload.workers)]
            n = workload.workers or racks * hosts_per_rack
            return [min(i // hosts_per_rack, racks - 1) for i in range(n)]
        if s.scope == "per_rack":
            return [r for r in range(racks) for _ in range(s.count)]
        return [i % racks for i in range(s.count)]

    @classmethod
    def plan(cls, workload: "WorkloadSpec", hosts: list[HostInfo]) -> list[ProcessPlan]:
        """Which process runs on which host.

        Default: one ``worker`` per worker host (the first ``workload.workers`` hosts, or
        all when 0); if the scheme has a ``server`` role, servers colocated on worker hosts
        (spread evenly: per rack when ``servers.scope`` is ``per_rack``) or, on dedicated
        server hosts, one server per interface of each host (a PBox of k interfaces runs k
        servers, ``iface`` 0..k-1, numbered host by host; PHub Sec. 3.3: keys are balanced
        over the interfaces). ``servers.count: 0`` means one server per worker.

        Raises:
            SpecError: more workers or servers asked for than there are hosts.
        """
        worker_hosts = [h for h in hosts if h.kind == "worker"]
        n = workload.workers or len(worker_hosts)
        if n > len(worker_hosts):
            raise SpecError("workload.workers", workload.workers,
                            f"at most {len(worker_hosts)} (the topology's worker hosts)")
        worker_hosts = worker_hosts[:n]
        procs = [ProcessPlan("worker", i, h.name) for i, h in enumerate(worker_hosts)]
        if "server" not in cls.roles:
            return procs
        s = workload.servers
        if s.placement == "dedicated":
            return procs + [ProcessPlan("server", j, h, i) for j, (h, i) in enumerate(
                (h.name, i) for h in hosts if h.kind == "server" for i in range(h.interfaces))]
        else:
            if s.scope == "per_rack":
                racks = sorted({h.rack for h in worker_hosts})
                server_hosts = []
                for r in racks:
                    in_rack = [h.name for h in worker_hosts if h.rack == r]
                    count = s.count or len(in_rack)
                    if count > len(in_rack):
                        raise SpecError("workload.servers.count", s.count,
                                        f"at most {len(in_rack)} colocated servers per rack")
                    server_hosts += _spread(in_rack, count)
            else:
                count = s.count or len(worker_hosts)
                if count > len(worker_hosts):
                    raise SpecError("workload.servers.count", s.count,
                                    f"at most {len(worker_hosts)} colocated servers (one per worker host)")
                # spread over racks: take hosts in an order that alternates racks
                by_rack: dict[int, list[str]] = {}
                for h in worker_hosts:
                    by_rack.setdefault(h.rack, []).append(h.name)
                server_hosts = _interleave(list(by_rack.values()))[:count]
        procs += [ProcessPlan("server", i, h) for i, h in enumerate(server_hosts)]
        return procs

    @classmethod
    def model_device(cls, role: str) -> str | None:
        """Device the runtime builds the model on for ``role``: None (CPU, real values) or
        ``"meta"`` for a role that needs only the layers' shapes (it must then get values
        over the network). Default: None for every role."""
        return None

    # ---------------------------------------------------------------- process side

    def main(self) -> None:
        """Entry point of a process: runs ``run_<role>``.

        Raises:
            NotImplementedError: the scheme has no method for this process's role.
        """
        fn = getattr(self, f"run_{self.ctx.role}", None)
        if fn is None:
            raise NotImplementedError(f"scheme {self.name!r} has no role {self.ctx.role!r}")
        fn()

    def run_worker(self) -> None:
        """The standard training loop with this scheme's hooks (see the module docstring)."""
        from traffic.runtime.trainer import Trainer
        Trainer(self.ctx, self).run()

    # hooks of the training loop: default no-ops
    def setup(self) -> None: ...
    def on_iteration_start(self, it: int) -> None: ...
    def before_forward(self, it: int, layer: int) -> None: ...
    def after_backward(self, it: int, layer: int) -> None: ...
    def on_backward_end(self, it: int) -> None: ...
    def finish(self) -> None: ...

    def final_state(self) -> dict | None:
        """What ``params/<proc>.pt`` holds (``workload.save_params``); ``None``: write nothing.

        Default: the model's state dict for a ``worker``, ``None`` for other roles. A role
        that holds part of the parameters (a parameter server's shards) may return them.
        """
        return self.ctx.model.state_dict() if self.ctx.role == "worker" else None


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


_REGISTRY: dict[str, type[Scheme]] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: make ``cls`` available as ``workload.scheme: <cls.name>``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls
