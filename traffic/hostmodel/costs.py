"""Host costs: every non-network operation of an emulated host charged at its stated rate.

One mechanism for every such cost (the emulated host is modelled, not borrowed:
``docs/architecture.md``): :meth:`HostCosts.charge` wraps the real work (values stay exact),
then waits until ``scale x`` the operation's emulated cost has passed since the work began. The real
work is only the floor of the emulated cost: when it alone takes longer than the budget,
the operation is an *overrun*, counted and reported (``results/<proc>.json`` and
``summary.json``: ``host_costs``), never silently folded into the result. A kind the host
model does not state (a zero overhead, or a rate left None in a bare :class:`HostModel`; a
spec's never is: :meth:`~traffic.hostmodel.HostSpec.resolve` gives every rate a number) takes
its real time and is reported as not modelled.

Emulated compute (:class:`traffic.runtime.emulation.EmulatedCompute`) is the kind
``compute``: no real work, a stated time per layer.

Usage in a scheme::

    with self.ctx.costs.charge("aggregate", nbytes=grad.numel() * 4, iteration=it, key=k):
        acc += grad                     # the real summation
    with self.ctx.costs.charge("optimizer", nbytes=shard_bytes, iteration=it):
        optimizer.step()

Waits are precise on average without burning CPU (a per-thread :class:`PreciseSleeper`). Thread-safe: a scheme's comm
and server
threads charge concurrently, each operation on its own clock, except the kinds whose rate is
the whole host's (``HostModel.machine_kinds``, scope ``machine``): given the host's
:class:`~traffic.hostmodel.machine.HostMachine`, each such operation reserves its budget on
that one clock, shared by every process and thread of the host, and waits until the
reservation ends; the time it queued behind the others is reported as ``queued_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from traffic.hostmodel import HostModel
from traffic.hostmodel.machine import HostMachine

__all__ = ["HostCosts", "Charge", "PreciseSleeper", "KINDS", "OVERRUN_THRESHOLD"]

#: Overshoot carried over is capped at this (seconds): a long stall (e.g. a blocking
#: before_forward hook that itself overshot) must not erase many later layers.
MAX_DEBT_S = 0.005


class PreciseSleeper:
    """``sleep(d)`` sleeps ``d`` seconds minus the overshoot owed from earlier sleeps.

    Attributes:
        debt_s: overshoot (achieved - requested) carried into the next request, seconds.
    """

    def __init__(self):
        self.debt_s = 0.0

    def sleep(self, seconds: float) -> float:
        """Sleep about ``seconds``; returns the time actually slept (seconds)."""
        if seconds <= 0:
            return 0.0
        want = seconds - self.debt_s
        if want <= 0:
            self.debt_s = -want
            return 0.0
        t0 = time.perf_counter()
        time.sleep(want)
        slept = time.perf_counter() - t0
        self.debt_s = min(max(slept - want, 0.0), MAX_DEBT_S)
        return slept


#: the kinds of cost (``compute`` is emulated compute; the rest are :meth:`HostModel.cost_s`'s)
KINDS = ("compute", "message", "request_startup", "aggregate", "optimizer", "codec")

#: a process whose overruns (every modelled kind's real seconds beyond its budgets) add up to
#: more than this fraction of its wall time flags the run (:func:`analysis.metrics.host_cost_overrun`):
#: then the run's times are, by that share or more, the real work's and not the host model's
OVERRUN_THRESHOLD = 0.05


@dataclass
class Charge:
    """What one :meth:`HostCosts.charge` came to, filled in when its block has run.

    Attributes:
        emulated_s: the emulated seconds charged (a kind not modelled: real / scale).
        real_s: the real seconds the block's work took.
        overrun: the work took longer than its budget (``scale x emulated_s``; a machine-scoped
            kind: it ended after its reservation on the host's clock).
        queued_s: real seconds it waited for the host's clock before its own budget began
            (machine-scoped kinds; 0 otherwise).
    """

    emulated_s: float = 0.0
    real_s: float = 0.0
    overrun: bool = False
    queued_s: float = 0.0


class HostCosts:
    """Charges operations their emulated cost, dilated by ``scale``.

    Args:
        model: the resolved host rates (:meth:`traffic.hostmodel.HostSpec.resolve`).
        scale: the time dilation factor (every budget is ``scale x`` the emulated cost).
        events: an event log to record each operation as a span (kind ``host_<kind>``), or None.
        machine: the clock of this process's emulated host
            (:meth:`HostMachine.for_host`), on which the kinds of ``model.machine_kinds``
            are charged; None: every kind is charged on the process's own clocks.

    Attributes:
        compute_slowdown: None, or a callable giving the factor on this process's emulated
            compute at this moment (a straggler: :class:`traffic.event_spec.ComputeSlowdown`);
            :class:`~traffic.runtime.emulation.EmulatedCompute` multiplies each per-layer
            time by :meth:`compute_factor`.
        stats: per kind, ``{count, modelled, emulated_s, budget_s, real_s, overruns,
            overrun_s}``: operations, whether the kind has a stated cost, the emulated
            seconds charged (for a kind not modelled: real seconds / scale), the real seconds
            budgeted (``scale x emulated``), the real seconds the work took, and how many
            operations, and how many real seconds, went beyond their budget. A kind charged
            on the host's clock (:meth:`on_machine`) also has ``queued_s``: the real seconds
            its operations waited behind other operations of the host, beyond their budgets.
    """

    def __init__(
        self, model: HostModel | None = None, scale: float = 1.0, events=None, machine: HostMachine | None = None
    ):
        self.model = model or HostModel()
        self.scale = float(scale)
        self.events = events
        self.machine = machine
        self.compute_slowdown = None
        self.stats: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def _sleeper(self) -> PreciseSleeper:
        s = getattr(self._local, "sleeper", None)
        if s is None:
            s = self._local.sleeper = PreciseSleeper()
        return s

    def on_machine(self, kind: str) -> bool:
        """True when ``kind`` is charged on the host's shared clock (its rate is the whole
        host's and a :class:`HostMachine` was given)."""
        return self.machine is not None and kind in self.model.machine_kinds

    @contextmanager
    def charge(
        self, kind: str, *, nbytes: int = 0, seconds: float | None = None, span: bool = True, ops: int = 1, **fields
    ) -> Iterator[Charge]:
        """Run the block (the real work), then wait out ``scale x`` the emulated cost. Yields
        a :class:`Charge` that holds the outcome once the block has run.

        Args:
            kind: one of :data:`KINDS`.
            nbytes: bytes the operation handles (for the rate-based kinds; with ``ops`` > 1,
                the sum over the operations).
            seconds: the emulated cost itself, overriding the host model (``compute``).
            span: record the operation as an event ``host_<kind>`` (``emulated_s``,
                ``real_s``, ``overrun``; plus ``fields``, e.g. ``iteration``).
            ops: how many operations of the emulated system the block's real work stands
                for (>= 1), e.g. the optimizer steps of several chunks done as one real step.
                They are charged together: ``ops x`` the cost of one operation on
                ``nbytes / ops`` bytes (for a rate, the cost of ``nbytes``; for a per-message
                or per-request overhead, ``ops`` overheads), counted as ``ops`` operations;
                if the block overruns the budget, all ``ops`` count as overruns.

        A kind charged on the host's clock (:meth:`on_machine`) reserves its budget there when
        the block starts, and the wait ends when the reservation does (the budget plus the
        time queued behind the host's other operations); the span also has ``queued_s``.

        Raises:
            ValueError: an unknown kind, or ``ops`` < 1.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown host cost kind {kind!r}; one of {', '.join(KINDS)}")
        if ops < 1:
            raise ValueError(f"ops must be >= 1, got {ops}")
        if seconds is not None:
            cost = seconds
        else:
            one = self.model.cost_s(kind, nbytes / ops if ops > 1 else nbytes)
            cost = None if one is None else one * ops
        # a zero cost (a per-message or per-request overhead left at 0) states nothing to
        # wait for: the work is reported at its real time, like a kind not modelled, not as
        # an overrun of a zero budget
        modelled = cost is not None and cost > 0
        shared = modelled and self.on_machine(kind)
        ts, t0 = time.time(), time.perf_counter()
        slot = self.machine.reserve(cost * self.scale) if shared else None
        outcome = Charge()
        yield outcome
        real = time.perf_counter() - t0
        overrun = 0.0
        if slot is not None:  # the host's clock: done when the reservation ends
            budget = cost * self.scale
            late = time.monotonic() - slot.end
            if late < 0:
                self._sleeper().sleep(-late)
            else:
                overrun = late
            outcome.queued_s = slot.queued_s
        elif modelled:
            budget = cost * self.scale
            if real < budget:
                self._sleeper().sleep(budget - real)
            else:
                overrun = real - budget
        else:
            cost, budget = real / self.scale, real
        outcome.emulated_s, outcome.real_s, outcome.overrun = cost, real, overrun > 0
        with self._lock:
            s = self.stats.setdefault(
                kind,
                {
                    "count": 0,
                    "modelled": modelled,
                    "emulated_s": 0.0,
                    "budget_s": 0.0,
                    "real_s": 0.0,
                    "overruns": 0,
                    "overrun_s": 0.0,
                },
            )
            s["count"] += ops
            s["modelled"] = s["modelled"] and modelled
            s["emulated_s"] += cost
            s["budget_s"] += budget
            s["real_s"] += real
            if overrun > 0:
                s["overruns"] += ops
                s["overrun_s"] += overrun
            if slot is not None:
                s["queued_s"] = s.get("queued_s", 0.0) + slot.queued_s
        if span and self.events is not None:
            self.events.record(
                f"host_{kind}",
                ts,
                time.perf_counter() - t0,
                emulated_s=cost,
                real_s=real,
                overrun=overrun > 0,
                bytes=nbytes or None,
                **({"ops": ops} if ops > 1 else {}),
                **({"queued_s": slot.queued_s} if slot is not None else {}),
                **fields,
            )

    def compute_factor(self) -> float:
        """The factor on emulated compute now: 1, or :attr:`compute_slowdown`'s."""
        return 1.0 if self.compute_slowdown is None else float(self.compute_slowdown())

    def wait(self, kind: str, seconds: float, **fields) -> None:
        """An operation with no real work that takes ``seconds`` of emulated time (``compute``)."""
        with self.charge(kind, seconds=seconds, **fields):
            pass

    def summary(self) -> dict[str, dict]:
        """A copy of :attr:`stats` with ``overrun_fraction`` (overrun / budgeted real seconds)."""
        with self._lock:
            return {
                k: {**v, "overrun_fraction": (v["overrun_s"] / v["budget_s"]) if v["budget_s"] > 0 else 0.0}
                for k, v in self.stats.items()
            }
