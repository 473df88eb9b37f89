"""The standard training loop of a worker, with the scheme's hooks (see traffic.schemes.base).

Per iteration ``it`` (``workload.iterations`` of them)::

    ctx.maybe_crash(it)
    span "iteration" (samples = batch_size, loss = local training loss)
        scheme.on_iteration_start(it)
        x, y = shard it of this worker
        forward, layer by layer:  scheme.before_forward(it, l); compute; event "forward"
        loss = model.loss(logits, y)  (mean over the local batch; see LayeredModel.loss)
        backward, last layer first: when all of layer l's parameter gradients are
            accumulated: event "backward"; scheme.after_backward(it, l)
        scheme.on_backward_end(it)
    worker 0, every workload.eval_every iterations (if > 0): event "eval"
    scheme.finish(); worker 0: final event "eval" (final = true)

The "backward" event of layer ``l`` spans from the moment the previous layer's
``after_backward`` returned (the start of ``backward()`` for the last layer, so it includes
the loss's backward) to the moment layer ``l``'s gradients are all accumulated; the
``forward`` event spans the layer's own compute, without the time spent in
``before_forward``.

The scheme's optimizer step is the scheme's business (``on_backward_end`` typically leaves
the updated parameters in the model); :meth:`Scheme.finish` must leave the final parameters
in the model, since the final evaluation and ``params/<proc>.pt`` read them.
"""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.nn.functional as F
from torch.optim.sgd import sgd

from traffic.runtime.emulation import EmulatedCompute

__all__ = ["Trainer", "evaluate", "make_optimizer", "TensorSGD"]


def make_optimizer(params, spec) -> torch.optim.SGD:
    """``torch.optim.SGD`` over ``params`` configured by ``spec`` (a ``testbed.spec.OptimizerSpec``:
    ``lr``, ``momentum``, ``weight_decay``). Every scheme and the reference use this, so
    they apply the same update rule."""
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


class TensorSGD:
    """:func:`make_optimizer`'s update on one tensor, for servers that step thousands of small
    keys or slices per iteration (a parameter server's shards, P3's slices).

    It calls torch's own functional SGD (``torch.optim.sgd.sgd``, the function
    ``torch.optim.SGD.step`` itself calls, on its CPU single-tensor path), so the values and
    the momentum buffer are bit-for-bit those of ``torch.optim.SGD``; it only skips
    ``Optimizer.step``'s per-call machinery (step hooks, profiler record, param-group
    bookkeeping, which ``benchmarks/optimizer_step.py`` measures against ``SGD.step``; figures
    in ``docs/host-model.md``). That overhead is Python's, not the emulated host's: a host
    model charges the step by its bytes (``optimizer``), and every microsecond of it spent
    here is real time that must fit the step's dilated budget.

    Args:
        param: the values (any shape, float32), updated in place.
        spec: a :class:`traffic.spec.OptimizerSpec` (``lr``, ``momentum``, ``weight_decay``).

    Attributes:
        momentum_buffer: the momentum buffer (None until the first step with momentum, as in
            ``torch.optim.SGD``'s state).
    """

    def __init__(self, param: torch.Tensor, spec):
        self.param = param
        self.lr, self.momentum, self.weight_decay = spec.lr, spec.momentum, spec.weight_decay
        self.momentum_buffer: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        """One update of :attr:`param` with ``grad`` (same shape)."""
        buffers = [self.momentum_buffer]
        sgd(
            [self.param],
            [grad],
            buffers,
            foreach=False,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        if self.momentum:
            self.momentum_buffer = buffers[0]


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024) -> tuple[float, float]:
    """Accuracy in [0, 1] and mean cross-entropy loss of ``model`` on ``(x, y)`` (per sample;
    per token for sequence models, whose logits are ``(n, seq_len, vocab)``).

    ``x``: ``(n, *input_shape)``, ``y``: ``(n,)`` int64. Runs in eval mode, restores the
    previous mode.
    """
    was_training = model.training
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    try:
        for i in range(0, len(x), batch):
            out = model(x[i : i + batch])
            yb = y[i : i + batch]
            if out.dim() == 3:  # sequence model: per-token accuracy and loss
                out, yb = out.reshape(-1, out.shape[-1]), yb.reshape(-1)
            loss_sum += float(F.cross_entropy(out, yb, reduction="sum"))
            correct += int((out.argmax(dim=1) == yb).sum())
            n += len(yb)
    finally:
        model.train(was_training)
    n = max(n, 1)
    return correct / n, loss_sum / n


class Trainer:
    """Runs the standard loop for one worker, in real or emulated compute.

    In emulated compute (``workload.compute.mode: emulated``) each layer's forward and
    backward are sleeps of the profiled time times ``scale`` (see
    :mod:`traffic.runtime.emulation`, times a straggler's slowdown); the hooks fire at the
    same points, ``forward`` and ``backward`` events carry ``requested_s`` (the real seconds
    asked for) next to the achieved ``dur``, and nothing is evaluated (there is no data).

    Args:
        ctx: the process context (its ``model``, ``batches``, ``events`` ...).
        scheme: the scheme whose hooks are called.
    """

    def __init__(self, ctx, scheme):  # a traffic.runtime.context.Context, a traffic.schemes.base.Scheme
        self.ctx, self.scheme = ctx, scheme
        self.model = ctx.model
        self.layers = list(self.model.layers)
        self.it: int | None = None
        self._active = False  # hooks act only during a training step (not during eval)
        self._handles = []
        self._fwd_start: tuple[float, float] | None = None
        self._bwd_mark: tuple[float, float] = (0.0, 0.0)
        # parameters of each layer that receive gradients (a shared tensor counts once,
        # in the first layer that has it)
        seen: set[int] = set()
        self._layer_params: list[list[torch.nn.Parameter]] = []
        for layer in self.layers:
            ps = [p for p in layer.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in ps)
            self._layer_params.append(ps)
        self._missing = [0] * len(self.layers)
        self.emulated = None
        if ctx.workload.compute.mode == "emulated":
            self.emulated = EmulatedCompute(
                self.model,
                ctx.profile.forward_s(),
                ctx.profile.backward_s(),
                seed=ctx.workload.seed * 100_003 + ctx.rank,
                costs=ctx.costs,
                gradients=not ctx.buffers.light,
            )

    # ---------------------------------------------------------------- hooks

    def _install(self) -> None:
        for l, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_pre_hook(partial(self._pre_forward, l)))
            self._handles.append(layer.register_forward_hook(partial(self._post_forward, l)))
            for p in self._layer_params[l]:
                self._handles.append(p.register_post_accumulate_grad_hook(partial(self._grad_ready, l)))

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre_forward(self, l: int, module, args) -> None:
        if not self._active:
            return
        self.scheme.before_forward(self.it, l)
        self._fwd_start = (time.time(), time.perf_counter())

    def _post_forward(self, l: int, module, args, out) -> None:
        if not self._active or self._fwd_start is None:
            return
        ts, t0 = self._fwd_start
        self.ctx.events.record("forward", ts, time.perf_counter() - t0, iteration=self.it, layer=l)

    def _grad_ready(self, l: int, param) -> None:
        if not self._active:
            return
        self._missing[l] -= 1
        if self._missing[l] == 0:
            self._layer_done(l)

    def _layer_done(self, l: int, **extra) -> None:
        ts, t0 = self._bwd_mark
        self.ctx.events.record("backward", ts, time.perf_counter() - t0, iteration=self.it, layer=l, **extra)
        self.scheme.after_backward(self.it, l)
        self._bwd_mark = (time.time(), time.perf_counter())

    # ---------------------------------------------------------------- loop

    def step(self, it: int) -> float | None:
        """One training iteration (forward, backward, the scheme's hooks); returns the local
        loss (``None`` in emulated compute, or when :meth:`backward_root` gives none)."""
        ctx, scheme = self.ctx, self.scheme
        self.it = it
        scheme.on_iteration_start(it)
        if self.emulated is not None:
            self._forward_emulated(it)
            self.backward_root(it, None, None)
            self._backward_emulated()
            scheme.on_backward_end(it)
            return None
        x, y = ctx.batches.shard(it, ctx.index)
        self.model.zero_grad(set_to_none=True)
        self._missing = [len(ps) for ps in self._layer_params]
        self._active = True
        try:
            out = self.model(x)
            root, grad, loss = self.backward_root(it, out, y)
            self._bwd_mark = (time.time(), time.perf_counter())
            root.backward(grad)
            # layers without trainable parameters: "ready" once backward is over
            for l in reversed(range(len(self.layers))):
                if not self._layer_params[l]:
                    self._layer_done(l)
        finally:
            self._active = False
        scheme.on_backward_end(it)
        return loss

    def backward_root(self, it: int, out: torch.Tensor | None, y: torch.Tensor | None):
        """What backward starts from, given the model's output ``out`` and labels ``y``.

        Returns ``(tensor, gradient, loss)``: backward runs ``tensor.backward(gradient)`` and
        ``step`` returns ``loss`` (a float or ``None``). Default: the model's loss, gradient
        ``None``. In emulated compute it is called with ``out = y = None`` between the
        forward and the backward sleeps and its result is ignored; a trainer whose model
        is part of a network split over processes (Stanza's CONV workers) overrides it to
        exchange activations for their gradients there.
        """
        if out is None:
            return None, None, None
        loss = self.model.loss(out, y)
        return loss, None, float(loss.detach())

    def _forward_emulated(self, it: int) -> None:
        """Forward of every layer as profiled sleeps (``before_forward`` hooks as in real compute)."""
        em, ev = self.emulated, self.ctx.events
        for l in range(len(self.layers)):
            self.scheme.before_forward(it, l)
            ts, t0 = time.time(), time.perf_counter()
            seconds = em.forward(l)
            ev.record(
                "forward", ts, time.perf_counter() - t0, iteration=it, layer=l, requested_s=seconds * em.costs.scale
            )

    def _backward_emulated(self) -> None:
        """Backward of every layer, last first, as profiled sleeps (``after_backward`` hooks)."""
        em = self.emulated
        self._active = True
        try:
            self._bwd_mark = (time.time(), time.perf_counter())
            for l in reversed(range(len(self.layers))):
                seconds = em.backward(l, self._layer_params[l])
                self._layer_done(l, requested_s=seconds * em.costs.scale)
        finally:
            self._active = False

    def eval_event(self, it: int, final: bool = False) -> tuple[float, float]:
        """Evaluate on the test set and write an ``eval`` event; returns (accuracy, loss)."""
        d = self.ctx.data
        with self.ctx.events.span("eval", iteration=it, final=final) as ev:
            acc, loss = evaluate(self.model, d.x_test, d.y_test)
            ev.update(accuracy=acc, loss=loss, samples=len(d.y_test))
        return acc, loss

    def run(self) -> None:
        """Run ``setup``, every iteration, ``finish``; worker 0 evaluates.

        Sets ``ctx.results`` ``final_accuracy``/``final_loss`` (worker 0; ``None`` elsewhere)
        and ``train_loss`` (this worker's last local loss).

        Raises:
            whatever a hook or the communication raises (the runtime reports it).
        """
        ctx, scheme = self.ctx, self.scheme
        n, b = ctx.iterations, ctx.workload.batch_size
        every = ctx.workload.eval_every
        evaluates = ctx.role == "worker" and ctx.index == 0 and self.emulated is None
        self._install()
        try:
            with ctx.events.span("setup"):
                scheme.setup()
            loss = None
            for it in range(n):
                ctx.maybe_crash(it)
                with ctx.events.span("iteration", iteration=it, samples=b) as ev:
                    loss = self.step(it)
                    ev["loss"] = loss
                ctx.comm.check()  # a failed background job fails the run now, not at the end
                if evaluates and every > 0 and (it + 1) % every == 0 and it + 1 < n:
                    self.eval_event(it)
            with ctx.events.span("finish"):
                scheme.finish()
        finally:
            self._remove()
        acc = final_loss = None
        if evaluates:
            acc, final_loss = self.eval_event(n - 1, final=True)
        ctx.results.update(final_accuracy=acc, final_loss=final_loss, train_loss=loss)
