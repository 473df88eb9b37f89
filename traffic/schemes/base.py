"""The scheme interface: what a communication scheme implements, and how it is registered.

A scheme is a :class:`Scheme` subclass, registered by name with
:func:`traffic.schemes.register` or named as ``module:Class`` (see :mod:`traffic.schemes`).
It declares its options (``workload.options``) as a :class:`SchemeOptions` model. The
harness never imports a scheme by name: it asks the registry's class for the hosts the
scheme needs beside the worker hosts (:meth:`Scheme.hosts`), builds them, asks for the
process plan (:meth:`Scheme.plan`), launches one process per planned role on its host, and
each process runs ``python -m traffic.runtime``, which builds a
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

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from common.errors import SpecError
from common.validation import SpecModel, validate
from topologies.hosts import HostInfo, HostRequest
from traffic.data import load_dataset
from traffic.models import build_model
from traffic.runtime.trainer import Trainer


class SchemeOptions(SpecModel):
    """Base of a scheme's options (``workload.options``): a pydantic model, one field per
    option with its default, units in its name and a docstring. This base has none."""


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
        name: registry name, used as ``workload.scheme`` (set by ``@register(name)``).
        roles: the roles it needs, e.g. ``("worker", "server")``.
        Options: its options model (a :class:`SchemeOptions` subclass); ``self.opts`` is
            the validated instance.
        switch_interval_s: the GIL switch interval (seconds, ``sys.setswitchinterval``) its
            processes run with, or None for CPython's default (5 ms). A scheme whose
            processes run several Python threads sets it lower: a thread back from a gloo
            operation (or a stated host cost's wait) otherwise waits up to 5 ms for the GIL
            while another thread runs Python code (measured: ``docs/schemes.md``, "p3").
        light_refusal: why the scheme cannot run with ``workload.compute.memory: light``
            (:meth:`light_memory_refusal`), or None when its payload tensors come from
            ``ctx.buffers`` (:mod:`traffic.runtime.buffers`); read from the class's own
            attributes only (not inherited).
    """

    name: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ("worker",)
    Options: ClassVar[type[SchemeOptions]] = SchemeOptions
    switch_interval_s: ClassVar[float | None] = None
    light_refusal: ClassVar[str | None] = "its tensors do not go through traffic.runtime.buffers"

    def __init__(self, ctx):
        self.ctx = ctx
        self.opts = self.options_of(ctx.workload)

    # ---------------------------------------------------------------- harness side (classmethods)

    @classmethod
    def validate_options(cls, options: dict) -> SchemeOptions:
        """``options`` (``workload.options``) validated into :attr:`Options`.

        Raises:
            SpecError: naming every bad ``workload.options.<key>``, its value and what is
                allowed.
        """
        return validate(cls.Options, options, "workload.options", what=f"options of scheme '{cls.name}'")

    @classmethod
    def options_of(cls, workload) -> SchemeOptions:
        """The validated options of ``workload`` (a :class:`traffic.spec.WorkloadSpec`)."""
        return cls.validate_options(workload.options)

    @classmethod
    def hosts(cls, workload, topology) -> list[HostRequest]:
        """The hosts this scheme needs beside the topology's worker hosts (dedicated server
        hosts, k-interface PBoxes, FC hosts), each in a rack; the harness builds them and
        gives them to :meth:`plan`. ``workload``: a :class:`traffic.spec.WorkloadSpec`;
        ``topology``: a :class:`topologies.spec.TopologySpec`. Default: none.
        """
        return []

    @classmethod
    def plan(cls, workload, hosts: list[HostInfo]) -> list[ProcessPlan]:
        """Which process runs on which host. Default: one ``worker`` per worker host (the
        first ``workload.workers`` hosts of kind ``worker``, or all when 0).

        Raises:
            SpecError: more workers asked for than there are worker hosts.
        """
        return [ProcessPlan("worker", i, h.name) for i, h in enumerate(worker_hosts(workload, hosts))]

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean payload of one message this scheme sends, in bytes: the bytes its processes
        send in one training iteration divided by the number of point-to-point messages (or,
        for a collective of gloo's, the chunks gloo sends) that carry them, over all
        processes. What the capacity model (:mod:`testbed.capacity`) divides a sending rate
        (bytes/s) by to count messages per second, each costing the runtime's per-message
        CPU.

        ``workload``: a :class:`traffic.spec.WorkloadSpec`; ``processes``: the scheme's
        :meth:`plan` (roles and their counts). Sizes are those of the model as the registry
        builds it (native input; ``compute.mode: real`` on a smaller data set may shrink
        tensors, never their number). Set-up messages (initial values, profiles) and
        occasional ones (evaluation, checkpoints) are left out: per iteration only.

        Default: one message per parameter tensor (key), the model's parameter bytes over
        its number of keys -- a scheme that cuts or packs tensors otherwise overrides it.

        Returns:
            bytes per message (> 0); ``math.inf`` when the scheme sends no message.

        Raises:
            KeyError: a model name the registry does not know.
        """
        keys = model_keys(workload.model)
        return ELEMENT_BYTES * sum(n for n, _ in keys) / len(keys)

    @classmethod
    def min_sent_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float | None:
        """A lower bound of the bytes that the hosts of the plan's ``worker`` processes send,
        together, over their own links in one training iteration: what
        :func:`testbed.runner.time_errors` divides by those links' rate to refuse a run that
        cannot finish within ``run.timeout_s``. It must be sound for every run the scheme
        makes (a bound too high refuses runs that would finish): count only bytes the scheme
        cannot avoid sending, compressed as sent (:func:`sync_sent_bytes` is the bound of
        data-parallel synchronization).

        ``workload``: a :class:`traffic.spec.WorkloadSpec`; ``processes``: the scheme's
        :meth:`plan`.

        Returns:
            bytes (>= 0), or None when the scheme states no bound (its runs' time is not
            checked). Default: None (a scheme that does not say what it sends, e.g. a
            researcher's own program).
        """
        return None

    @classmethod
    def light_memory_refusal(cls) -> str | None:
        """Why this scheme cannot run with ``workload.compute.memory: light``, or None when it
        can (:mod:`traffic.runtime.buffers`: its payload tensors come from ``ctx.buffers``).
        The spec's validation refuses ``light`` with this reason, naming the scheme.

        Default: :attr:`light_refusal` as the class itself sets it; a class that does not
        set it (a subclass of a scheme that supports light memory, say) is refused, since
        what it adds may read values that light memory does not hold.
        """
        if "light_refusal" in vars(cls):
            return cls.light_refusal
        return (
            f"{cls.__name__} does not state that its tensors go through traffic.runtime.buffers "
            f"(a scheme that does sets light_refusal = None in its own class)"
        )

    @classmethod
    def light_buffer_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """With ``compute.memory: light``: bytes of the largest single payload buffer one of
        the plan's processes asks ``ctx.buffers`` for (a bucket, a shard, a message), the
        size its scratch grows to; what the capacity model (:mod:`testbed.capacity`) counts
        once per machine (shared scratch) or once per process (private scratch).

        ``workload``: a :class:`traffic.spec.WorkloadSpec`; ``processes``: the scheme's
        :meth:`plan`. Default: the model's largest parameter tensor (one key), float32.

        Raises:
            KeyError: unknown model.
        """
        return ELEMENT_BYTES * max(n for n, _ in model_keys(workload.model))

    @classmethod
    def model_device(cls, role: str) -> str | None:
        """Device the runtime builds the model on for ``role``: None (CPU, real values) or
        ``"meta"`` for a role that needs only the layers' shapes (it must then get values
        over the network). Default: None for every role."""
        return None

    # ---------------------------------------------------------------- process side

    def main(self) -> None:
        """Entry point of a process: sets :attr:`switch_interval_s` (when not None), then
        runs ``run_<role>``.

        Raises:
            NotImplementedError: the scheme has no method for this process's role.
        """
        fn = getattr(self, f"run_{self.ctx.role}", None)
        if fn is None:
            raise NotImplementedError(f"scheme {self.name!r} has no role {self.ctx.role!r}")
        if self.switch_interval_s is not None:
            sys.setswitchinterval(self.switch_interval_s)
        fn()

    def run_worker(self) -> None:
        """The standard training loop with this scheme's hooks (see the module docstring)."""
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


#: bytes of one parameter element (float32)
ELEMENT_BYTES = 4


@functools.cache
def model_keys(model: str) -> tuple[tuple[int, int], ...]:
    """``(elements, layer)`` of every parameter tensor (key) of registry model ``model``, in
    ``parameters()`` order (built once on the meta device: no memory; cached per name).

    Raises:
        KeyError: unknown model.
    """
    m = build_model(model, 0, device="meta")
    return tuple((p.numel(), layer) for p, layer in zip(m.parameters(), m.param_layers()))


def trained_layer_numels(workload) -> tuple[int, ...] | None:
    """Parameters per layer of ``workload.model`` as the runtime builds it (on the meta
    device: no memory; cached): at the model's native input in ``compute.mode: emulated``,
    for the samples of ``workload.dataset`` in ``real`` (:mod:`traffic.runtime`, which can be
    smaller: the FC layers follow the input's size). None if it cannot be built so (the run
    itself would fail on it, and says so)."""
    return _layer_numels(workload.model, workload.dataset if workload.compute.mode == "real" else None)


@functools.cache
def _layer_numels(model: str, dataset: str | None) -> tuple[int, ...] | None:
    try:
        if dataset is None:
            return tuple(build_model(model, 0, device="meta").layer_numels())
        data = load_dataset(dataset, 0)
        return tuple(build_model(model, 0, data.input_shape, data.num_classes, device="meta").layer_numels())
    except Exception:  # noqa: BLE001 - any model/data mismatch: no bound, the run reports it
        return None


def sync_sent_bytes(groups: Sequence[Sequence[str]], gradient_bytes: float) -> float:
    """The least that the hosts of data-parallel workers send together per iteration when
    each group (the hosts of its workers) sums a gradient of ``gradient_bytes`` bytes, as
    sent on the wire, every iteration: ``gradient_bytes x sum(H_g - 1)``, ``H_g`` the
    group's distinct hosts.

    Why it is a lower bound: each element's sum is formed on one host; every other host of
    the group holds a contribution to it that must leave that host at least once, alone or
    inside a partial sum, so for each element at least ``H_g - 1`` of the group's hosts send
    it (whatever the pattern: parameter servers, colocated or not, rings, trees); workers
    that share a host count once. The bytes servers send back (updated parameters), headers
    and retransmissions only add to it."""
    return gradient_bytes * sum(max(len(set(g)) - 1, 0) for g in groups)


def gradient_sync_bytes(
    workload,
    processes: Sequence[ProcessPlan],
    element_bytes: float = ELEMENT_BYTES,
    layers: slice = slice(None),
    groups: Sequence[Sequence[int]] | None = None,
) -> float | None:
    """:func:`sync_sent_bytes` of the plan's ``worker`` processes summing the gradient of the
    model's ``layers`` (as trained: :func:`trained_layer_numels`) every iteration,
    ``element_bytes`` per element on the wire (4: float32). ``groups``: worker indices (in
    plan order) of each group that sums its own gradient; None: all workers, one group.
    None when the model cannot be built for the workload."""
    numels = trained_layer_numels(workload)
    if numels is None:
        return None
    hosts = [p.host for p in processes if p.role == "worker"]
    groups = [range(len(hosts))] if groups is None else groups
    return sync_sent_bytes([[hosts[w] for w in g] for g in groups], element_bytes * sum(numels[layers]))


def count_roles(processes: Sequence[ProcessPlan]) -> dict[str, int]:
    """Number of processes of each role in a plan."""
    out: dict[str, int] = {}
    for p in processes:
        out[p.role] = out.get(p.role, 0) + 1
    return out


def worker_hosts(workload, hosts: list[HostInfo]) -> list[HostInfo]:
    """The hosts that run workers: the first ``workload.workers`` of kind ``worker`` (all when 0).

    Raises:
        SpecError: more workers asked for than there are worker hosts.
    """
    all_workers = [h for h in hosts if h.kind == "worker"]
    n = workload.workers or len(all_workers)
    if n > len(all_workers):
        raise SpecError(
            "workload.workers", workload.workers, f"at most {len(all_workers)} (the topology's worker hosts)"
        )
    return all_workers[:n]
