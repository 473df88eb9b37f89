"""PHub's tall aggregation on a server thread (phub.txt Sec. 3.2.2, Fig. 7).

Each server thread owns its chunks; it adds a worker's copy of a chunk into the chunk's
aggregation buffer as soon as the copy is in (copies already received are added first)
(:func:`tall_aggregate`). A thread keeps the receives of its next chunks posted ahead
(``RECV_WINDOW_BYTES`` of copies, :func:`recv_window`), so a push rarely waits for its
receive while the server's memory stays bounded.
"""
from __future__ import annotations

from typing import Callable

import torch

from traffic.runtime.transport import Pending
from traffic.schemes.phub.chunks import ELEMENT_BYTES
from traffic.schemes.phub.tenancy import META, meta_value

__all__ = ["RECV_WINDOW_BYTES", "recv_window", "tall_aggregate"]

RECV_WINDOW_BYTES = 64 << 20  # receive buffers a server thread keeps posted ahead (all workers' copies)


def recv_window(chunk_elems: int, senders: int, jobs_here: int) -> int:
    """Chunks whose receives a server thread keeps posted ahead: as many as fit in
    ``RECV_WINDOW_BYTES`` with ``senders`` copies of ``chunk_elems`` elements (+ metadata)
    each, the window shared by the ``jobs_here`` jobs the thread serves; at least 2."""
    return max(2, RECV_WINDOW_BYTES // (jobs_here * senders * (chunk_elems + META) * ELEMENT_BYTES))


def tall_aggregate(pending: list[tuple[int, torch.Tensor, Pending]], numel: int, token: int | None,
                   on_reject: Callable[[int], None]) -> tuple[torch.Tensor | None, list[int], list[int]]:
    """Sum the copies of one chunk as they arrive.

    Args:
        pending: ``(sender rank, buffer, posted receive)`` per copy; each buffer holds the
            chunk's ``numel`` elements then the sender's token in the ``META`` slots. The
            list is emptied.
        numel: elements of the chunk.
        token: the job's token (None: no job registered, every copy is refused).
        on_reject: called with the sender's rank for each copy with a wrong token (not added).

    Returns:
        ``(sum, accepted, refused)``: the sum of the accepted copies (a view into the first
        accepted copy's buffer, added to in place; None if none was accepted), and the
        senders accepted and refused, in the order their copies were taken.

    Raises:
        RuntimeError / DistBackendError: a receive failed.
    """
    agg: torch.Tensor | None = None
    accepted: list[int] = []
    refused: list[int] = []
    while pending:  # tall aggregation: add each copy as soon as it is in
        ready = [x for x in pending if x[2].is_completed()] or [pending[0]]
        for x in ready:
            pending.remove(x)
            r, buf, p = x
            p.wait()
            if meta_value(buf) != token:
                refused.append(r)
                on_reject(r)
                continue
            accepted.append(r)
            if agg is None:
                agg = buf[:numel]
            else:
                agg.add_(buf[:numel])
    return agg, accepted, refused
