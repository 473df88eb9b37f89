"""PHub's key chunking and its mapping of chunks to interfaces and cores (PHub Sec. 3.2.3-3.2.4).

Every key (parameter tensor) is cut into *chunks* of at most ``chunk_bytes`` (the last
chunk of a key holding the rest); every chunk is given a server process (interface) and,
within it, a server thread, by Graham's longest-processing-time-first rule on the chunks'
bytes at each level (:func:`assign_chunks`, :func:`lpt`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from traffic.schemes.ps import Shard

__all__ = ["CHUNK_BYTES", "ELEMENT_BYTES", "Chunk", "lpt", "assign_chunks"]

CHUNK_BYTES = 32 * 1024  # PHub's default chunk size (Sec. 3.2.3)
ELEMENT_BYTES = 4  # float32


@dataclass(frozen=True)
class Chunk(Shard):
    """A chunk ``[lo, hi)`` of the flattened key ``key`` of job ``job``'s namespace.

    ``server`` is the chunk's interface (server process index: among all server processes
    in the flat scheme, among one PBox's processes with hierarchical reduction), ``thread``
    its server thread within that process, ``local`` its index within the namespace; ``id``
    (``job * chunks_per_job + local``) is the tag of its messages.
    """

    thread: int = 0
    job: int = 0
    local: int = 0


def lpt(sizes: Sequence[int], bins: int) -> list[int]:
    """Graham's longest-processing-time-first partition: item ``i`` (``sizes[i]``) -> bin.

    Items are taken largest first (ties: lower index first) and each goes to the bin with
    the least total so far (ties: lower bin). The largest bin total is at most 4/3 of the
    optimum (Graham 1969; the "4/3 approximation set partition algorithm" of PHub
    Sec. 3.2.4).

    Raises:
        ValueError: ``bins`` < 1.
    """
    if bins < 1:
        raise ValueError(f"need at least one bin, got {bins}")
    heap = [(0, b) for b in range(bins)]
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, b = heapq.heappop(heap)
        out[i] = b
        heapq.heappush(heap, (load + int(sizes[i]), b))
    return out


def assign_chunks(
    numels: Sequence[int],
    chunk_elems: int,
    interfaces: int,
    threads: int,
    names: Sequence[str] | None = None,
    jobs: int = 1,
) -> list[Chunk]:
    """Cut keys into chunks and map each chunk to an (interface, thread), PHub Sec. 3.2.4.

    Args:
        numels: elements of each key, in key order.
        chunk_elems: maximum elements per chunk (``chunk_bytes / 4``).
        interfaces: server processes to spread the chunks over (>= 1).
        threads: server threads per process (>= 1).
        names: the keys' names (default ``"key<i>"``).
        jobs: namespaces; every job has the same keys (the same model), cut the same way.

    Returns:
        Chunks ordered by job, key, offset (``id`` = position). Interfaces are balanced by
        bytes over all jobs' chunks with :func:`lpt`, then each interface's chunks over its
        threads with :func:`lpt`.

    Raises:
        ValueError: ``chunk_elems``, ``interfaces``, ``threads`` or ``jobs`` < 1.
    """
    if min(chunk_elems, interfaces, threads, jobs) < 1:
        raise ValueError(
            f"chunk_elems ({chunk_elems}), interfaces ({interfaces}), threads ({threads}) "
            f"and jobs ({jobs}) must be >= 1"
        )
    names = list(names) if names is not None else [f"key{k}" for k in range(len(numels))]
    cuts = [
        (k, lo, min(lo + chunk_elems, int(n))) for k, n in enumerate(numels) for lo in range(0, int(n), chunk_elems)
    ]
    n = len(cuts)
    sizes = [hi - lo for _, lo, hi in cuts] * jobs
    iface = lpt(sizes, interfaces)
    thread = [0] * len(sizes)
    for i in range(interfaces):
        idx = [j for j in range(len(sizes)) if iface[j] == i]
        for j, t in zip(idx, lpt([sizes[j] for j in idx], threads)):
            thread[j] = t
    return [
        Chunk(
            j,
            cuts[j % n][0],
            names[cuts[j % n][0]],
            iface[j],
            cuts[j % n][1],
            cuts[j % n][2],
            thread=thread[j],
            job=j // n,
            local=j % n,
        )
        for j in range(len(sizes))
    ]
