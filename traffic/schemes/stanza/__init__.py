"""Stanza (``stanza``): layer separation into CONV workers and FC workers.

Roles. A model of the zoo is cut at its ``split_index`` (the first fully connected layer;
the CONV part ends with the last pooling after the last convolution, Stanza §3.2):

* ``worker`` -- a *CONV worker* (Stanza's name). It holds and trains layers
  ``[0, split_index)`` on its data shard. The role is called ``worker`` because in Stanza
  the CONV workers are the data-parallel workers: the runtime gives role ``worker`` the
  data shards (``ctx.batches.shard(it, ctx.index)`` with ``W`` = number of CONV workers,
  so the global batch is ``n_c * batch_size`` as in the paper) and the analysis counts
  the samples and iteration times of role ``worker`` for throughput; calling CONV workers
  anything else would need both to learn a second name for the same thing.
* ``fc`` -- an *FC worker*. It holds a complete replica of layers ``[split_index, L)`` and
  trains them on the activations of its group of CONV workers.

With ``n_f`` FC workers the ``n_c`` CONV workers are cut into ``n_f`` contiguous groups of
near-equal size (equal when ``n_f`` divides ``n_c``, §4.1.3); FC worker ``j`` serves CONV
workers ``j*n_c//n_f .. (j+1)*n_c//n_f - 1`` (:func:`fc_groups`).

One iteration (bulk-synchronous, §3.2 Figure 4 and §4.1):

1. CONV worker: forward of the CONV layers on its batch of ``K``; *push_activation*: send
   the split layer's output ``(K, *split_shape)`` (float32) and the ``K`` labels (int64)
   to its FC worker (many-to-one); *pull_fc*: block until the gradient of those
   activations (same shape) comes back (one-to-many).
2. FC worker: receive every group member's activations and labels, concatenate them in
   CONV-worker order, forward the FC layers, loss, backward; send each CONV worker its rows
   of the activations' gradient; then (``n_f`` > 1) allreduce the FC gradients with the
   other FC workers by recursive doubling -- this runs while the CONV workers allreduce
   theirs (§4.1.3) -- and apply the optimizer to its FC replica.
3. CONV worker: backward of the CONV layers from the received gradient; allreduce of all
   CONV gradients (one flat buffer) among the ``n_c`` CONV workers by recursive doubling
   (:mod:`traffic.collectives.recursive_doubling`, ``floor(log2 n_c) + 2`` rounds when
   ``n_c`` is not a power of two, §4.1.2); optimizer step on the CONV layers.

Equivalence with SGD over the global batch (eq. 1). The FC worker's loss is
``model.loss(logits, y) * g / n_c`` for its ``g * K`` samples (``g`` = group size): the
mean loss of its group times ``g/n_c``, i.e. its share of the mean over the global batch
of ``n_c K``. Its FC gradients, summed over FC workers, and the CONV gradients that the
activation gradients produce, summed over CONV workers, are therefore exactly the global
batch's mean-loss gradients; every replica applies the same ``torch.optim.SGD`` step
(element-wise), so CONV and FC parameters equal those of a single process
(:mod:`traffic.reference`) up to floating-point rounding. The recursive-doubling sums are
bit-identical on every member, so replicas never drift.

Emulated compute (``workload.compute.mode: emulated``): a CONV worker sleeps the
profile's forward/backward times of the CONV layers (times ``scale``); an FC worker sleeps
the FC layers' times multiplied by its group size ``g``, since it processes ``g`` CONV
workers' activations (``(n_c/n_f) T_f`` in Stanza eq. (2)). Every message has the true
size: activations and their gradients ``(K, *split_shape)``, labels ``(K,)``, gradients of
every CONV (FC) parameter. CONV workers keep no FC parameters and FC workers no CONV
parameters in that mode (their layers are moved to the meta device), as in the paper.

Host costs (:mod:`traffic.hostmodel.costs`, rates from the ``host:`` section):

* FC compute (``compute``): in emulated compute the FC worker's forward and backward of each
  FC layer are charged their profiled times ``x g`` through
  :class:`~traffic.runtime.emulation.EmulatedCompute` (Stanza §3.2, Figure 4: the FC worker
  "continues the forward pass to compute the loss values. It then starts backpropagation and
  computes gradients for all FC layers and the last CONV layer"; §4.2.1 eq. (2): the FC
  computation time is ``(n_c/n_f) T_f``), as the CONV workers' layers are charged by the
  :class:`~traffic.runtime.trainer.Trainer`. Real compute takes this machine's time, as
  everywhere in real mode.
* Local sums of the allreduces (``aggregate``): every addition of a received tensor in the
  CONV workers' allreduce of the CONV gradients (§4.1.2: "the objective of CONV worker
  communication is to disseminate the global average gradients among all CONV workers,
  which is essentially an allreduce operation", by recursive doubling) and in the FC
  workers' one of the FC gradients (§4.1.3: "Stanza relies on the same recursive doubling
  algorithm described above to exchange gradients"), as it happens, of the whole flat
  gradient's bytes (:func:`traffic.collectives.recursive_doubling.sums` additions per
  process). No averaging division follows: the loss is already scaled by ``g / n_c``.
* Between CONV and FC workers nothing is reduced: §4.1.1, "it is thus not possible to combine
  the activations or gradients to reduce the transmission volume". The FC worker
  concatenates its group's activations and splits the activations' gradient by rows
  (copies and views); summing the per-sample FC gradients over its ``g K`` rows is part of
  the FC backward, i.e. of ``compute``.
* The FC worker's update (``optimizer``, the FC parameters' bytes): §3.2, it "pushes
  gradients of the last CONV layer ... to the CONV workers, and updates FC layer parameters".

Evaluation and the final parameters. Only an FC worker has the trained FC layers. Before
CONV worker 0 evaluates (every ``workload.eval_every`` iterations and after the last,
real compute only), FC worker 0 sends it its FC parameters (kind ``fc_sync``).
``params/worker0.pt`` then holds the whole model; other CONV workers save their CONV
layers, FC workers their FC layers.

Checkpoints (Stanza §5.3; option ``checkpoint_every``, iterations, default 0 = none). After
the update of every ``checkpoint_every``-th iteration each process writes its parameters
and optimizer state to ``checkpoints/<proc>-it<it>.pt`` (``{"iteration", "params",
"optimizer"}``, parameter names of the full model). FC worker ``j`` also sends a copy of its
FC parameters (one flat message, kind ``fc_checkpoint``) to a CONV worker picked at random
(seeded by ``workload.seed``, ``j`` and the iteration: :func:`checkpoint_holder`); the
transfer runs while both go on training -- the CONV worker posts the receive and waits for
it only at the end of its next iteration (or at the end of training) -- and the CONV worker
writes ``checkpoints/<proc>-fc<j>-it<it>.pt`` (``{"iteration", "params"}``). Restarting from
checkpoints is not implemented.

Placement (:meth:`Stanza.plan`): CONV workers on the first ``n_c`` hosts, FC workers on the
next ``n_f`` hosts, one process per host as in the paper. ``workload.workers`` is ``n_c``
(0: every host but the FC workers'). Option ``fc_workers``: an integer ``n_f`` >= 1, or
``auto``: ``n_c`` and ``n_f`` come from the exhaustive search of Stanza eq. (5)
(:func:`traffic.schemes.stanza.assignment.node_assignment`) for ``N`` = option ``nodes``
(0: every host) at option ``bw_gbps`` Gbit/s with the constants of
``workload.compute.profile`` (a profile of ``workload.model`` at ``workload.batch_size``);
``workload.workers`` must then be 0.

Events: CONV workers log ``activation`` (tx) and ``label`` (tx) to their FC worker,
``activation_grad`` (rx), ``allreduce`` per recursive-doubling transfer (``round``,
``phase``, ``members: conv``), ``host_aggregate`` per local sum of it (``bytes``, ``round``,
``phase``, ``members``) and ``update``; FC workers log ``fc_iteration`` (span, with
``samples`` and ``loss``), the matching rx/tx events, ``allreduce`` (``members: fc``),
``host_aggregate``, ``update`` (with ``host_optimizer`` inside it) and ``fc_sync``. Every
event has ``iteration``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import time
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field, field_validator

from common.errors import SpecError, TestbedError
from traffic.collectives import recursive_doubling
from traffic.compute_profiles import load_profile
from traffic.models import LayeredModel, build_model, model_info
from traffic.runtime.emulation import EmulatedCompute
from traffic.runtime.trainer import Trainer, make_optimizer
from traffic.schemes import register
from traffic.schemes.base import ELEMENT_BYTES, ProcessPlan, Scheme, SchemeOptions, count_roles, gradient_sync_bytes
from traffic.schemes.stanza.assignment import Assignment, Constants, node_assignment, split_shape

__all__ = ["Stanza", "StanzaOptions", "ConvTrainer", "fc_groups", "fc_of", "split_shape", "checkpoint_holder"]

TAG_ACT, TAG_LABEL, TAG_GRAD, TAG_SYNC, TAG_CKPT, TAG_RD_CONV, TAG_RD_FC = 1, 2, 3, 4, 5, 10, 11


def checkpoint_holder(seed: int, fc_index: int, it: int, n_c: int) -> int:
    """The CONV worker (index) that keeps FC worker ``fc_index``'s checkpoint copy of
    iteration ``it``: drawn at random (Stanza §5.3), reproducibly from ``(seed, fc_index, it)``."""
    return random.Random(f"stanza-ckpt-{seed}-{fc_index}-{it}").randrange(n_c)


@functools.cache
def _split_shape(model: str) -> tuple[int, ...]:
    """:func:`split_shape` of registry model ``model`` (built on the meta device; cached)."""
    return split_shape(build_model(model, 0, device="meta"))


def fc_groups(n_c: int, n_f: int) -> list[range]:
    """CONV workers served by each FC worker: ``n_f`` contiguous near-equal ranges of
    ``0 .. n_c-1`` (FC worker ``j`` gets ``j*n_c//n_f .. (j+1)*n_c//n_f - 1``).

    Raises:
        ValueError: ``n_f`` < 1 or ``n_f`` > ``n_c`` (an FC worker would serve nobody).
    """
    if n_f < 1 or n_f > n_c:
        raise ValueError(f"need 1 <= fc_workers <= CONV workers, got {n_f} FC for {n_c} CONV workers")
    return [range(j * n_c // n_f, (j + 1) * n_c // n_f) for j in range(n_f)]


def fc_of(conv_index: int, n_c: int, n_f: int) -> int:
    """Index of the FC worker that serves CONV worker ``conv_index``."""
    return next(j for j, g in enumerate(fc_groups(n_c, n_f)) if conv_index in g)


def _part(model: LayeredModel, lo: int, hi: int) -> LayeredModel:
    """Layers ``[lo, hi)`` of ``model`` as a LayeredModel sharing the modules (not copies).
    Its state-dict keys are renumbered from 0; :meth:`Stanza._state` uses the full model's."""
    return LayeredModel(
        list(model.layers[lo:hi]), name=f"{model.name}[{lo}:{hi}]", layer_names=model.layer_names[lo:hi]
    )


def _params(layers) -> list[torch.nn.Parameter]:
    return [p for layer in layers for p in layer.parameters() if p.requires_grad]


def _flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """A new flat float32 tensor holding every parameter's gradient (zeros where none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def _assign_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Make each parameter's ``.grad`` a view of its range of ``flat``."""
    off = 0
    for p in params:
        p.grad = flat[off : off + p.numel()].view_as(p)
        off += p.numel()


class ConvTrainer(Trainer):
    """The standard training loop for a CONV worker: only the CONV layers, with the
    exchange with the FC worker between the forward and the backward pass.

    ``ctx.model`` is the CONV part (see :meth:`Stanza.run_worker`); forward/backward
    events, hooks, emulation, iteration spans and evaluation are the
    :class:`~traffic.runtime.trainer.Trainer`'s. Evaluation uses ``full_model`` (whose FC
    layers the scheme refreshed from FC worker 0).
    """

    def __init__(self, ctx, scheme: Stanza, full_model: LayeredModel):
        super().__init__(ctx, scheme)
        self.full_model = full_model

    def backward_root(self, it: int, out: torch.Tensor | None, y: torch.Tensor | None):
        """push_activation / pull_fc between the forward and the backward pass: backward
        starts from the CONV part's output with the gradient the FC worker sent back; the
        loss is the FC worker's (``None`` here)."""
        grad = self.scheme.exchange(it, None if out is None else out.detach(), y)
        return out, grad, None

    def eval_event(self, it: int, final: bool = False) -> tuple[float, float]:
        """Evaluate the whole model (CONV layers here, FC layers from FC worker 0)."""
        conv, self.model = self.model, self.full_model
        try:
            return super().eval_event(it, final)
        finally:
            self.model = conv


class StanzaOptions(SchemeOptions):
    """Options of ``stanza``."""

    fc_workers: int | Literal["auto"] = 1
    """Number of FC workers ``n_f`` (an integer >= 1), or ``auto`` for the node assignment of
    Stanza eq. (5)."""
    nodes: int = 0
    """With ``fc_workers: auto``, the total number of nodes ``N`` (0: every host; else >= 2)."""
    bw_gbps: float = Field(10.0, gt=0)
    """With ``fc_workers: auto``, the per-node bandwidth ``B`` the model assumes, Gbit/s
    (10, the paper's EC2 cluster)."""
    checkpoint_every: int = Field(0, ge=0)
    """Write checkpoints every this many iterations (0: never; Stanza §5.3)."""

    @field_validator("fc_workers")
    @classmethod
    def _fc_workers(cls, v):
        if v != "auto" and v < 1:
            raise ValueError("an integer >= 1 or 'auto'")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v):
        if v < 0 or v == 1:
            raise ValueError("0 (every host) or an integer >= 2")
        return v


@register("stanza")
class Stanza(Scheme):
    """Layer separation: CONV workers (role ``worker``) and FC workers (role ``fc``); see
    the module docstring. Options: :class:`StanzaOptions`."""

    roles = ("worker", "fc")
    Options = StanzaOptions
    light_refusal = (
        "not supported yet: its CONV and FC workers exchange activations and hold the FC layers' "
        "tensors outside traffic.runtime.buffers"
    )

    # ---------------------------------------------------------------- harness side

    @classmethod
    def counts(cls, workload, n_hosts: int) -> tuple[int, int]:
        """``(n_c, n_f)`` for ``workload`` on ``n_hosts`` hosts (see the module docstring).

        Raises:
            SpecError: the model has no ``split_index``; too few hosts; ``fc_workers``
                larger than the CONV workers; ``auto`` with ``workload.workers`` set, or
                without a usable profile.
        """
        if model_info(workload.model)["split_index"] is None:
            raise SpecError(
                "workload.model",
                workload.model,
                "a model with a CONV/FC boundary (split_index), e.g. alexnet, vgg16, digits_cnn",
            )
        opts = cls.options_of(workload)
        if opts.fc_workers == "auto":
            if workload.workers:
                raise SpecError(
                    "workload.workers",
                    workload.workers,
                    "0 with options.fc_workers: auto (the node assignment picks the CONV workers)",
                )
            N = opts.nodes or n_hosts
            if N > n_hosts:
                raise SpecError("workload.options.nodes", N, f"at most {n_hosts} (the topology's hosts)")
            if N < 2:
                raise SpecError("workload.options.nodes", N, "at least 2 (one CONV and one FC worker)")
            a = cls.assignment(workload, N, float(opts.bw_gbps) * 1e9)
            return a.n_c, a.n_f
        n_f = opts.fc_workers
        n_c = workload.workers or n_hosts - n_f
        if n_c < 1 or n_c + n_f > n_hosts:
            raise SpecError(
                "workload.workers",
                workload.workers,
                f"CONV workers + {n_f} FC worker(s) <= {n_hosts} hosts, at least one CONV worker",
            )
        if n_f > n_c:
            raise SpecError("workload.options.fc_workers", n_f, f"at most the CONV workers ({n_c})")
        return n_c, n_f

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message (:meth:`Scheme.message_bytes`) over one iteration of the
        plan's ``n_c`` CONV (``worker``) and ``n_f`` FC workers: each CONV worker sends its
        activations ``(K, *split_shape)`` float32 and its ``K`` int64 labels to its FC worker
        and gets the activations' gradient back (3 messages); the CONV workers' recursive
        doubling sends :func:`~traffic.collectives.recursive_doubling.schedule` ``(n_c)``'s
        transfers of the whole CONV gradient, and with ``n_f > 1`` the FC workers' those of
        ``(n_f)`` of the FC gradient (``K`` = ``workload.batch_size``). AlexNet at batch 32
        with 4 CONV and 1 FC worker: 8 messages of 1.2 MB (activations and their
        gradients), 4 of 256 bytes (labels) and 8 of 9.9 MB (the CONV gradient): 4.4 MB on
        average.

        Raises:
            KeyError: unknown model.
        """
        roles = count_roles(processes)
        n_c, n_f = roles.get("worker", 0), roles.get("fc", 0)
        info = model_info(workload.model)
        split, K = info["split_index"], workload.batch_size
        if split is None or n_c == 0:  # no CONV/FC boundary: plan() refuses such a workload
            return super().message_bytes(workload, processes)
        conv = ELEMENT_BYTES * sum(info["layer_numels"][:split])
        fc = ELEMENT_BYTES * sum(info["layer_numels"][split:])
        act = ELEMENT_BYTES * K * math.prod(_split_shape(workload.model))
        msgs, sent = 3 * n_c, n_c * (2 * act + 8 * K)
        for n, nbytes in ((n_c, conv), (n_f, fc)):
            t = sum(len(r) for r in recursive_doubling.schedule(n)) if n > 1 else 0
            msgs, sent = msgs + t, sent + t * nbytes
        return sent / msgs

    @classmethod
    def min_sent_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float | None:
        """:meth:`Scheme.min_sent_bytes`: the CONV workers (role ``worker``) all-reduce the
        float32 gradient of the CONV layers (``[0, split_index)``) every iteration:
        :func:`~traffic.schemes.base.gradient_sync_bytes` of those layers. The activations
        sent to the FC workers and the FC workers' own allreduce are left out (a weaker,
        still sound, bound)."""
        split = model_info(workload.model)["split_index"]
        return None if split is None else gradient_sync_bytes(workload, processes, layers=slice(0, split))

    @classmethod
    def assignment(cls, workload, N: int, bw_bps: float) -> Assignment:
        """The node assignment of Stanza eq. (5) for ``N`` nodes at ``bw_bps`` bit/s with the
        constants of ``workload.compute.profile``
        (:func:`~traffic.schemes.stanza.assignment.node_assignment`).

        Raises:
            SpecError: the profile cannot be loaded for the model and batch size.
        """
        try:
            prof = load_profile(workload.compute.profile, workload.model, workload.batch_size)
        except TestbedError as e:
            raise SpecError(
                "workload.compute.profile",
                workload.compute.profile,
                f"a profile of {workload.model} at batch {workload.batch_size} for fc_workers: auto ({e})",
            ) from None
        return node_assignment(Constants.from_profile(workload.model, prof), N, bw_bps)

    @classmethod
    def plan(cls, workload, hosts) -> list[ProcessPlan]:
        """CONV workers (role ``worker``) on the first ``n_c`` worker hosts, FC workers
        (role ``fc``) on the next ``n_f``; one process per host.

        Raises:
            SpecError: see :meth:`counts`.
        """
        names = [h.name for h in hosts if h.kind == "worker"]
        n_c, n_f = cls.counts(workload, len(names))
        return [ProcessPlan("worker", i, names[i]) for i in range(n_c)] + [
            ProcessPlan("fc", j, names[n_c + j]) for j in range(n_f)
        ]

    # ---------------------------------------------------------------- common

    def _layout(self) -> None:
        ctx = self.ctx
        self.split = ctx.model.split_index
        if self.split is None:
            raise RuntimeError(f"model {ctx.model.name!r} has no split_index")
        self.conv_ranks, self.fc_ranks = ctx.ranks("worker"), ctx.ranks("fc")
        self.n_c, self.n_f = len(self.conv_ranks), len(self.fc_ranks)
        if not self.n_c or not self.n_f:
            raise RuntimeError(
                f"stanza needs CONV and FC workers; processes.json has {self.n_c} workers and {self.n_f} fc"
            )
        self.groups = fc_groups(self.n_c, self.n_f)
        self.K = ctx.workload.batch_size
        self.emulated = ctx.workload.compute.mode == "emulated"
        self.split_shape = split_shape(ctx.model)
        self.ckpt_every = self.opts.checkpoint_every
        self._ckpt_copies: list = []  # CONV worker: (fc index, iteration, Pending, buffer) in flight

    def _evaluates_after(self, it: int) -> bool:
        """True when CONV worker 0 evaluates after iteration ``it`` (intermediate evals)."""
        every = self.ctx.workload.eval_every
        return not self.emulated and every > 0 and (it + 1) % every == 0 and it + 1 < self.ctx.iterations

    def _state(self, lo: int, hi: int) -> dict:
        """State-dict entries of the full model's layers ``[lo, hi)`` (keys ``layers.<i>...``)."""
        keep = tuple(f"layers.{i}." for i in range(lo, hi))
        return {k: v for k, v in self.ctx.model.state_dict().items() if k.startswith(keep)}

    def _checkpoint_due(self, it: int) -> bool:
        return self.ckpt_every > 0 and (it + 1) % self.ckpt_every == 0

    def _save(self, name: str, doc: dict, it: int) -> None:
        d = self.ctx.run_dir / "checkpoints"
        d.mkdir(parents=True, exist_ok=True)
        with self.ctx.events.span("checkpoint", iteration=it, file=name):
            torch.save(doc, d / name)

    def _checkpoint(self, it: int, lo: int, hi: int, optimizer) -> None:
        """Write this process's layers ``[lo, hi)`` and optimizer state (§5.3)."""
        self._save(
            f"{self.ctx.name}-it{it}.pt",
            {"iteration": it, "params": self._state(lo, hi), "optimizer": optimizer.state_dict()},
            it,
        )

    def _fc_names_shapes(self) -> list[tuple[str, torch.Size]]:
        """Names (full model) and shapes of the FC parameters, in ``parameters()`` order."""
        L = len(self.ctx.model.layers)
        keep = tuple(f"layers.{i}." for i in range(self.split, L))
        return [(n, p.shape) for n, p in self.ctx.model.named_parameters() if n.startswith(keep)]

    def _post_checkpoint_copies(self, it: int) -> None:
        """CONV worker: post the receives of the FC checkpoint copies this worker keeps."""
        numel = sum(math.prod(sh) for _, sh in self._fc_names_shapes())
        for j in range(self.n_f):
            if checkpoint_holder(self.ctx.workload.seed, j, it, self.n_c) == self.ctx.index:
                buf = torch.empty(numel)
                pend = self.ctx.transport.irecv(buf, self.fc_ranks[j], tag=TAG_CKPT, kind="fc_checkpoint", iteration=it)
                self._ckpt_copies.append((j, it, pend, buf))

    def _store_checkpoint_copies(self) -> None:
        """CONV worker: wait for the copies in flight and write them."""
        for j, it, pend, buf in self._ckpt_copies:
            pend.wait()
            params, off = {}, 0
            for name, sh in self._fc_names_shapes():
                n = math.prod(sh)
                params[name] = buf[off : off + n].view(sh).clone()
                off += n
            self._save(f"{self.ctx.name}-fc{j}-it{it}.pt", {"iteration": it, "params": params}, it)
        self._ckpt_copies = []

    # ---------------------------------------------------------------- CONV worker

    def run_worker(self) -> None:
        """A CONV worker: the standard loop (:class:`ConvTrainer`) over the CONV layers."""
        ctx = self.ctx
        self._layout()
        s, model = self.split, ctx.model
        if self.emulated:
            for layer in model.layers[s:]:
                layer.to("meta")  # FC layers live on the FC workers only
        profile = ctx.profile
        if profile is not None:
            profile = dataclasses.replace(profile, layers=profile.layers[:s])
        conv_ctx = dataclasses.replace(ctx, model=_part(model, 0, s), profile=profile)
        ConvTrainer(conv_ctx, self, full_model=model).run()

    def setup(self) -> None:
        """CONV worker: its FC worker, optimizer over the CONV layers, message buffers."""
        ctx = self.ctx
        self.fc_index = fc_of(ctx.index, self.n_c, self.n_f)
        self.fc_rank = self.fc_ranks[self.fc_index]
        self.conv_params = _params(ctx.model.layers[: self.split])
        self.optimizer = make_optimizer(self.conv_params, ctx.workload.optimizer)
        self.grad_buf = torch.empty((self.K, *self.split_shape))
        if self.emulated:  # true-size stand-ins for the activations and labels
            gen = torch.Generator().manual_seed(ctx.workload.seed * 7919 + ctx.rank)
            self.fake_act = torch.randn((self.K, *self.split_shape), generator=gen)
            self.fake_labels = torch.zeros(self.K, dtype=torch.long)

    def exchange(self, it: int, act: torch.Tensor | None, labels: torch.Tensor | None) -> torch.Tensor:
        """push_activation then pull_fc (Stanza Table 4): send this batch's split-layer
        activations ``(K, *split_shape)`` and labels ``(K,)`` to the FC worker, block until the
        gradient of the activations (same shape) is back; returns it.

        ``act``/``labels`` ``None`` (emulated compute): send true-size stand-ins.
        """
        tr = self.ctx.transport
        if act is None:
            act, labels = self.fake_act, self.fake_labels
        f = {"iteration": it, "layer": self.split - 1}
        rx = tr.irecv(self.grad_buf, self.fc_rank, tag=TAG_GRAD, kind="activation_grad", **f)
        tx = [
            tr.isend(act.contiguous(), self.fc_rank, tag=TAG_ACT, kind="activation", **f),
            tr.isend(labels.contiguous(), self.fc_rank, tag=TAG_LABEL, kind="label", **f),
        ]
        tr.wait_all(tx)
        rx.wait()
        return self.grad_buf

    def on_backward_end(self, it: int) -> None:
        """CONV worker: allreduce the CONV gradients (recursive doubling, each local sum charged
        as host cost ``aggregate``), SGD step; worker 0 fetches the FC layers from FC worker 0
        before an evaluation."""
        ctx = self.ctx
        flat = _flat_grads(self.conv_params)
        recursive_doubling.allreduce(
            ctx.transport,
            flat,
            self.conv_ranks,
            tag=TAG_RD_CONV,
            kind="allreduce",
            costs=ctx.costs,
            iteration=it,
            members="conv",
        )
        _assign_grads(self.conv_params, flat)
        with ctx.events.span("update", iteration=it):
            self.optimizer.step()
        self._store_checkpoint_copies()  # copies of the previous checkpoint (arrived meanwhile)
        if self._checkpoint_due(it):
            self._checkpoint(it, 0, self.split, self.optimizer)
            self._post_checkpoint_copies(it)
        if ctx.index == 0 and self._evaluates_after(it):
            self._recv_fc(it)

    def _recv_fc(self, it: int) -> None:
        """CONV worker 0: receive FC worker 0's FC parameters into the full model."""
        tr = self.ctx.transport
        for p in _params(self.ctx.model.layers[self.split :]):
            tr.recv(p.data, self.fc_ranks[0], tag=TAG_SYNC, kind="fc_sync", iteration=it)

    def finish(self) -> None:
        """CONV worker: write the checkpoint copies still in flight; worker 0 (real compute)
        fetches the final FC layers (for the final evaluation)."""
        self._store_checkpoint_copies()
        if self.ctx.index == 0 and not self.emulated:
            self._recv_fc(self.ctx.iterations - 1)

    # ---------------------------------------------------------------- FC worker

    def run_fc(self) -> None:
        """An FC worker: ``workload.iterations`` rounds of receive activations, FC forward and
        backward, send activation gradients, FC allreduce (``n_f`` > 1), SGD step. Host costs
        (module docstring): emulated FC layers as ``compute``, each local sum of the FC
        allreduce as ``aggregate``, the step as ``optimizer`` of the FC parameters' bytes.

        Raises:
            RuntimeError / DistBackendError: a peer died or communication timed out.
        """
        self._layout()
        ctx = self.ctx
        s, model, K, tr, ev = self.split, ctx.model, self.K, ctx.transport, ctx.events
        group = [self.conv_ranks[i] for i in self.groups[ctx.index]]
        g = len(group)
        fc_layers = list(model.layers[s:])
        params = _params(fc_layers)
        fc_bytes = sum(p.numel() * p.element_size() for p in params)  # what the update touches
        opt = make_optimizer(params, ctx.workload.optimizer)
        acts = [torch.empty((K, *self.split_shape)) for _ in group]
        labels = [torch.empty(K, dtype=torch.long) for _ in group]
        em = None
        if self.emulated:
            for layer in model.layers[:s]:
                layer.to("meta")  # CONV layers live on the CONV workers only
            em = EmulatedCompute(
                _part(model, s, len(model.layers)),
                [t * g for t in ctx.profile.forward_s()[s:]],
                [t * g for t in ctx.profile.backward_s()[s:]],
                seed=ctx.workload.seed * 100_003 + ctx.rank,
                costs=ctx.costs,
            )
            gen = torch.Generator().manual_seed(ctx.workload.seed * 7919 + ctx.rank)
            fake_grad = torch.randn((g * K, *self.split_shape), generator=gen)
        ckpt = []
        for it in range(ctx.iterations):
            ctx.maybe_crash(it)
            with ev.span("fc_iteration", iteration=it, samples=g * K) as span:
                f = {"iteration": it, "layer": s - 1}
                rx = [tr.irecv(a, r, tag=TAG_ACT, kind="activation", **f) for a, r in zip(acts, group)]
                rx += [tr.irecv(y, r, tag=TAG_LABEL, kind="label", **f) for y, r in zip(labels, group)]
                tr.wait_all(rx)
                if em is None:
                    grad, loss = self._fc_step(it, fc_layers, acts, labels)
                    span["loss"] = loss
                else:
                    for l in range(len(fc_layers)):
                        ts, t0 = time.time(), time.perf_counter()
                        em.forward(l)
                        ev.record(
                            "forward",
                            ts,
                            time.perf_counter() - t0,
                            iteration=it,
                            layer=s + l,
                            requested_s=em.forward_s[l] * em.costs.scale,
                        )
                    for l in reversed(range(len(fc_layers))):
                        ts, t0 = time.time(), time.perf_counter()
                        em.backward(l, _params([fc_layers[l]]))
                        ev.record(
                            "backward",
                            ts,
                            time.perf_counter() - t0,
                            iteration=it,
                            layer=s + l,
                            requested_s=em.backward_s[l] * em.costs.scale,
                        )
                    grad = fake_grad
                rows = grad.split(K)
                tx = [tr.isend(rows[k], r, tag=TAG_GRAD, kind="activation_grad", **f) for k, r in enumerate(group)]
                if self.n_f > 1:  # overlaps the CONV workers' allreduce (§4.1.3)
                    flat = _flat_grads(params)
                    recursive_doubling.allreduce(
                        tr,
                        flat,
                        self.fc_ranks,
                        tag=TAG_RD_FC,
                        kind="allreduce",
                        costs=ctx.costs,
                        iteration=it,
                        members="fc",
                    )
                    _assign_grads(params, flat)
                with (
                    ev.span("update", iteration=it),
                    ctx.costs.charge("optimizer", nbytes=fc_bytes, iteration=it, members="fc"),
                ):
                    opt.step()
                tr.wait_all(tx)
                if ctx.index == 0 and self._evaluates_after(it):
                    self._send_fc(it, params)
                tr.wait_all(ckpt)  # the previous checkpoint's copy (sent while training)
                ckpt = []
                if self._checkpoint_due(it):
                    self._checkpoint(it, s, len(model.layers), opt)
                    holder = checkpoint_holder(ctx.workload.seed, ctx.index, it, self.n_c)
                    flat = torch.cat([p.detach().reshape(-1) for p in params])  # a copy: training goes on
                    ckpt = [tr.isend(flat, self.conv_ranks[holder], tag=TAG_CKPT, kind="fc_checkpoint", iteration=it)]
        tr.wait_all(ckpt)
        if ctx.index == 0 and not self.emulated:
            self._send_fc(ctx.iterations - 1, params)

    def _fc_step(self, it: int, fc_layers, acts, labels) -> tuple[torch.Tensor, float]:
        """Real compute on an FC worker: forward and backward of the FC layers over the
        group's activations; returns the activations' gradient ``(g*K, *split_shape)`` and the
        group's mean loss."""
        ctx, ev, s = self.ctx, self.ctx.events, self.split
        a = torch.cat(acts).requires_grad_(True)
        y = torch.cat(labels)
        for layer in fc_layers:
            layer.zero_grad(set_to_none=True)
        h = a
        for l, layer in enumerate(fc_layers):
            ts, t0 = time.time(), time.perf_counter()
            h = layer(h)
            ev.record("forward", ts, time.perf_counter() - t0, iteration=it, layer=s + l)
        loss = ctx.model.loss(h, y)
        with ev.span("backward", iteration=it, layer=s):
            (loss * (len(acts) / self.n_c)).backward()
        return a.grad, float(loss.detach())

    def _send_fc(self, it: int, params) -> None:
        """FC worker 0: send the FC parameters to CONV worker 0 (§5.3's copy of the FC
        parameters on a CONV worker; here also what worker 0 evaluates with)."""
        tr = self.ctx.transport
        for p in params:
            tr.send(p.data, self.conv_ranks[0], tag=TAG_SYNC, kind="fc_sync", iteration=it)

    # ---------------------------------------------------------------- results

    def final_state(self) -> dict | None:
        """CONV worker 0 in real compute: the whole model; other CONV workers: the CONV
        layers; FC workers: the FC layers (state-dict keys of the full model)."""
        L = len(self.ctx.model.layers)
        if self.ctx.role == "fc":
            return self._state(self.split, L)
        if self.ctx.index == 0 and not self.emulated:
            return self._state(0, L)
        return self._state(0, self.split)
