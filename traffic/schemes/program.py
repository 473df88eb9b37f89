"""``workload.program``: a researcher's own training program in place of a scheme.

The harness starts ``workload.program.command`` unmodified, ``processes_per_host`` times on
each worker host (the first ``workload.workers`` hosts of kind ``worker``, all when 0), with
the environment ``torchrun`` would give (:func:`torchrun_env`). Nothing of this project runs
inside those processes: the runtime (:mod:`traffic.runtime`) is not used, so this class
only plans. A program may mark its iterations with :mod:`traffic.marks` for iteration-level
figures; without marks the run's summary still has bytes per link, CPU and duration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from traffic.schemes import register
from traffic.schemes.base import ProcessPlan, Scheme, worker_hosts
from traffic.spec import PROGRAM_SCHEME

__all__ = ["Program", "torchrun_env"]


@register(PROGRAM_SCHEME)
class Program(Scheme):
    """The researcher's program (``workload.program``): workers only, several per host."""

    @classmethod
    def plan(cls, workload, hosts) -> list[ProcessPlan]:
        """``processes_per_host`` workers on each worker host, host by host (ranks follow:
        a host's processes have consecutive ranks, as with ``torchrun --nnodes``).

        Raises:
            SpecError: more workers asked for than there are worker hosts.
        """
        per_host = workload.program.processes_per_host
        return [
            ProcessPlan("worker", i * per_host + j, h.name)
            for i, h in enumerate(worker_hosts(workload, hosts))
            for j in range(per_host)
        ]

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Unknown for a program: ``math.inf`` (the capacity model counts no per-message CPU;
        its per-byte terms still apply)."""
        return math.inf

    def main(self) -> None:  # pragma: no cover - the runtime never runs a program's processes
        raise RuntimeError("a workload.program runs its own command; the runtime does not run it")


def torchrun_env(info: dict, doc: dict, processes_per_host: int) -> dict[str, str]:
    """The variables ``torchrun`` sets for one process, on the emulated network.

    Args:
        info: the process's ``processes.json`` entry (``rank``, ``index``, ``ip``, ``iface``).
        doc: the whole ``processes.json`` (``world_size``, ``master_addr``, ``master_port``).
        processes_per_host: ``workload.program.processes_per_host``.

    Returns:
        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
        ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``,
        ``MASTER_ADDR`` (rank 0's address on the emulated network), ``MASTER_PORT``,
        ``TORCHELASTIC_RUN_ID``, and ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` (the host's
        emulated interface, which gloo binds to).
    """
    world = doc["world_size"]
    return {
        "RANK": str(info["rank"]),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(info["index"] % processes_per_host),
        "LOCAL_WORLD_SIZE": str(processes_per_host),
        "GROUP_RANK": str(info["index"] // processes_per_host),
        "GROUP_WORLD_SIZE": str(math.ceil(world / processes_per_host)),
        "ROLE_RANK": str(info["rank"]),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "MASTER_ADDR": str(doc["master_addr"]),
        "MASTER_PORT": str(doc["master_port"]),
        "TORCHELASTIC_RUN_ID": "testbed",
        "GLOO_SOCKET_IFNAME": info["iface"],
        "TP_SOCKET_IFNAME": info["iface"],
    }
