"""What a scheme's process gets from the runtime: :class:`Context`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topologies.spec import TopologySpec
from traffic.data import Dataset, GlobalBatches
from traffic.hostmodel.costs import HostCosts
from traffic.models import LayeredModel
from traffic.runtime.buffers import Buffers
from traffic.runtime.comm import CommThread
from traffic.runtime.events import EventLog
from traffic.runtime.transport import Transport
from traffic.spec import WorkloadSpec

__all__ = ["Context", "InjectedCrash", "CRASH_ENV", "parse_crash_at"]

CRASH_ENV = "TESTBED_CRASH_AT"


class InjectedCrash(RuntimeError):
    """Raised on purpose by :meth:`Context.maybe_crash` (debug option ``TESTBED_CRASH_AT``)."""


def parse_crash_at(value: str | None) -> dict[str, int]:
    """Parse ``TESTBED_CRASH_AT``: ``<proc>:<iteration>[,<proc>:<iteration>...]``.

    Returns ``{proc: iteration}``; empty for ``None``/``""``.

    Raises:
        ValueError: a malformed entry.
    """
    out: dict[str, int] = {}
    for part in (value or "").split(","):
        part = part.strip()
        if not part:
            continue
        proc, sep, it = part.rpartition(":")
        if not sep or not proc or not it.strip().lstrip("-").isdigit():
            raise ValueError(f"{CRASH_ENV}: expected <proc>:<iteration>, got {part!r}")
        out[proc] = int(it)
    return out


@dataclass
class Context:
    """Everything one process of a run knows and uses.

    Attributes:
        run_dir: the run directory.
        workload: the spec's ``workload`` section; ``topology``: its ``topology`` section
            (the emulated network, before dilation); ``scale``: the time dilation factor.
        name: process name (``worker0``, ``server1`` ...); ``role`` and ``index`` within it.
        rank / world_size: torch.distributed global rank and number of processes.
        processes: the entries of ``processes.json`` (rank order), each a dict with name,
            role, index, rank, host, rack, ip, iface.
        model: this process's model, initialised from ``workload.seed`` (identical in every
            process at start).
        data: the dataset; ``batches``: the global batches and shards of this run
            (``workers`` = number of worker processes). Both None in emulated compute.
        profile: the compute profile (``traffic.compute_profiles.Profile``) in emulated compute,
            else None.
        transport: logged torch.distributed communication; ``events``: the event log;
            ``comm``: the background communication thread (FIFO, started on first use; a
            scheme that needs another order may replace it in ``setup``, e.g. with a
            ``PriorityCommThread``; the runtime closes whatever ``ctx.comm`` is at the end).
        costs: the host-cost accountant (:mod:`traffic.hostmodel.costs`): every
            non-network operation (aggregation, optimizer, codec, per-message and per-request
            work, emulated compute) is charged through it at the spec's ``host`` rates.
        results: extra fields for ``results/<proc>.json`` (the trainer sets
            ``final_accuracy``, ``final_loss``; a scheme may add its own).
        buffers: where the process's large tensors live (:class:`~traffic.runtime.buffers.Buffers`:
            the model's own in ``workload.compute.memory: full``, shared zeros and scratch in
            ``light``, where ``model`` is on the meta device).
        slowdown: this host's straggler schedule (:class:`traffic.event_spec.ComputeSlowdown`,
            from the spec's ``events``) or None; :meth:`maybe_crash` tells it where each
            iteration starts, and ``costs`` takes its factor.
    """

    run_dir: Path
    workload: WorkloadSpec
    topology: TopologySpec
    scale: float
    name: str
    role: str
    index: int
    rank: int
    world_size: int
    processes: list[dict]
    model: LayeredModel
    data: Dataset | None
    batches: GlobalBatches | None
    transport: Transport
    events: EventLog
    comm: CommThread
    costs: HostCosts = field(default_factory=HostCosts)
    results: dict[str, Any] = field(default_factory=dict)
    crash_at: int | None = None
    profile: Any = None
    slowdown: Any = None
    buffers: Buffers = field(default_factory=Buffers)

    @property
    def iterations(self) -> int:
        """``workload.iterations``."""
        return self.workload.iterations

    def ranks(self, role: str) -> list[int]:
        """Global ranks of the processes of ``role``, ordered by their index (empty if none)."""
        procs = sorted((p for p in self.processes if p["role"] == role), key=lambda p: p["index"])
        return [p["rank"] for p in procs]

    def count(self, role: str) -> int:
        """Number of processes of ``role``."""
        return sum(1 for p in self.processes if p["role"] == role)

    @property
    def workers(self) -> int:
        """Number of worker processes ``W``."""
        return self.count("worker")

    def rank_of(self, role: str, index: int) -> int:
        """Global rank of process ``<role><index>``.

        Raises:
            KeyError: no such process.
        """
        for p in self.processes:
            if p["role"] == role and p["index"] == index:
                return p["rank"]
        raise KeyError(f"no process {role}{index} in this run")

    def proc_of(self, rank: int) -> dict:
        """The ``processes.json`` entry of global rank ``rank``."""
        return self.processes[rank]

    def maybe_crash(self, it: int) -> None:
        """Debug hook: raise :class:`InjectedCrash` at iteration ``it`` if asked to.

        Set the environment variable ``TESTBED_CRASH_AT=<proc>:<iteration>`` (comma-separated
        for several) in the environment of the launcher; process ``<proc>`` then fails at
        the start of that iteration, as a crashing worker or server would. The training loop
        and every role loop call this once per iteration, at its start: it also tells the
        straggler schedule (:attr:`slowdown`) that iteration ``it`` starts.

        Raises:
            InjectedCrash: this process was asked to crash at ``it``.
        """
        if self.slowdown is not None:
            self.slowdown.iteration_started(it)
        if self.crash_at is not None and it == self.crash_at:
            raise InjectedCrash(f"{CRASH_ENV}: {self.name} crashes at iteration {it} as asked")

    @staticmethod
    def crash_iteration(name: str) -> int | None:
        """Iteration at which ``name`` must crash according to ``TESTBED_CRASH_AT`` (or None)."""
        return parse_crash_at(os.environ.get(CRASH_ENV)).get(name)
