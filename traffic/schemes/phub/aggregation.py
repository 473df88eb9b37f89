"""PHub's tall aggregation on a server thread (PHub Sec. 3.2.2, Fig. 7).

Each server thread owns its chunks; it adds a worker's copy of a chunk into the chunk's
aggregation buffer as soon as the copy is in (copies already received are added first)
(:func:`tall_aggregate`). Copies travel in frames (:mod:`~traffic.schemes.phub.frames`):
a frame's copy from one worker is taken as soon as it is in, and each of its logical chunks
is checked and added on its own. A thread keeps the receives of its next frames posted
ahead (``RECV_WINDOW_BYTES`` of copies, :func:`recv_window`), so a push rarely waits for its
receive while the server's memory stays bounded.

Host costs (:mod:`~traffic.schemes.phub.charges`): each logical chunk of an arriving copy is
one received message (``message``, when the host model states a per-message overhead) and,
if its token is right, one aggregation of the chunk's bytes (``aggregate``: PHub Sec.
3.2.2, "Aggregation is simply vector addition: we read two floats and write one back.").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from traffic.hostmodel.costs import HostCosts
from traffic.runtime.transport import Pending
from traffic.schemes.phub.charges import ChargeBatch, charge_messages
from traffic.schemes.phub.chunks import ELEMENT_BYTES
from traffic.schemes.phub.frames import Frame
from traffic.schemes.phub.tenancy import META

__all__ = ["RECV_WINDOW_BYTES", "recv_window", "tall_aggregate"]

RECV_WINDOW_BYTES = 64 << 20  # receive buffers a server thread keeps posted ahead (all workers' copies)


def recv_window(frame_size: int, senders: int, jobs_here: int) -> int:
    """Frames whose receives a server thread keeps posted ahead: as many as fit in
    ``RECV_WINDOW_BYTES`` with ``senders`` copies of ``frame_size`` elements (payload and
    metadata, the largest frame's :attr:`Frame.size`) each, the window shared by the
    ``jobs_here`` jobs the thread serves; at least 2."""
    return max(2, RECV_WINDOW_BYTES // (jobs_here * senders * frame_size * ELEMENT_BYTES))


def tall_aggregate(
    pending: list[tuple[int, torch.Tensor, Pending]],
    frame: Frame,
    token: int | None,
    on_reject: Callable[[int, int], None],
    costs: HostCosts | None = None,
    fields: dict | None = None,
) -> tuple[torch.Tensor, list[list[int]], list[list[int]]]:
    """Sum the copies of a frame's chunks as they arrive.

    Args:
        pending: ``(sender rank, buffer, posted receive)`` per copy of ``frame``; each buffer
            is laid out as :class:`Frame` says (payloads, then each chunk's sender token in
            its ``META`` slots). The list is emptied.
        frame: the frame.
        token: the job's token (None: no job registered, every copy is refused).
        on_reject: called with the sender's rank and the chunk's index in the frame for each
            chunk copy with a wrong token (not added).
        costs: the accountant: per copy, one ``message`` per chunk (:func:`charge_messages`)
            and one ``aggregate`` of the chunk's bytes per accepted chunk, each copy's charges
            one span (:class:`ChargeBatch`); None: nothing charged. A copy whose chunks are
            all accepted is added with one real addition, charged as its chunks' operations.
        fields: extra fields of those spans (``iteration``, ``frame`` ...).

    Returns:
        ``(sum, accepted, refused)``: the sum of the accepted copies of every chunk
        (``frame.numel`` elements, chunk ``j`` at ``frame.offsets[j]``; zeros where no copy
        was accepted), and per chunk the senders accepted and refused, in the order their
        copies were taken.

    Raises:
        RuntimeError / DistBackendError: a receive failed.
    """
    k = len(frame.chunks)
    fields = fields or {}
    agg = torch.zeros(frame.numel)
    accepted: list[list[int]] = [[] for _ in range(k)]
    refused: list[list[int]] = [[] for _ in range(k)]
    sizes = [(c.numel + META) * ELEMENT_BYTES for c in frame.chunks]
    while pending:  # tall aggregation: add each copy as soon as it is in
        ready = [x for x in pending if x[2].is_completed()] or [pending[0]]
        for x in ready:
            pending.remove(x)
            r, buf, p = x
            p.wait()
            charge_messages(costs, sizes, peer=r, **fields)
            ok = [frame.meta(buf, j) == token for j in range(k)]
            with ChargeBatch(costs, "aggregate", peer=r, **fields) as batch:
                if all(ok):  # the common case: the copy's payloads are contiguous, one real addition
                    for j in range(k):
                        accepted[j].append(r)
                    with batch.charge(frame.numel * ELEMENT_BYTES, ops=k):
                        agg.add_(buf[: frame.numel])
                    continue
                for j, c in enumerate(frame.chunks):
                    if not ok[j]:
                        refused[j].append(r)
                        on_reject(r, j)
                        continue
                    accepted[j].append(r)
                    with batch.charge(c.numel * ELEMENT_BYTES):
                        frame.payload(agg, j).add_(frame.payload(buf, j))
    return agg, accepted, refused
