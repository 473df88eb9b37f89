"""PHub's host costs: charged per logical chunk, shown on the timeline per batch of chunks.

PHub works chunk by chunk (Sec. 3.2.2: the thread that owns a chunk adds each
worker's copy as it arrives, and "the thread that aggregates a particular chunk also
optimizes that chunk"; Sec. 3.2.4: every message of a chunk is sent and received on its
core). So every such operation is charged as one operation of the accountant
(:meth:`traffic.hostmodel.costs.HostCosts.charge`): the counts, budgets and overruns of
``results/<proc>.json`` ``host_costs`` are per logical chunk.

The *real* work of a frame's chunks is done at once where the result is the same (one
addition of a whole copy whose chunks are all accepted, one optimizer step over a frame's
contiguous values, ``SGD`` being elementwise; :mod:`traffic.schemes.phub.frames`): at 32 KB
a real Python step per chunk costs more on this machine than the PBox's stated rate allows
(an overrun), while the emulated cost is still the sum of the chunks' costs
(``charge(nbytes, ops=k)``: ``k`` chunks' bytes, counted as ``k`` operations).

At 32 KB a model has thousands of chunks, so a span per charge would flood the event log;
each charge is made with ``span=False`` and :class:`ChargeBatch` records one event
``host_<kind>`` per batch (one copy's aggregation, one frame's optimizer steps, one frame's
messages), in the accountant's format plus ``ops`` (the chunk operations it stands for).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from traffic.hostmodel.costs import HostCosts

__all__ = ["ChargeBatch", "charges_messages", "charge_messages"]


class ChargeBatch:
    """Charges of one ``kind``, one per logical chunk, recorded as one span.

    Each :meth:`charge` is one operation of the accountant (``costs.charge(kind, nbytes=...,
    span=False)``); :meth:`close` (or leaving the ``with`` block) writes one event
    ``host_<kind>`` from the first charge's start to now, with ``emulated_s`` and ``real_s``
    (sums over the batch, seconds; a kind not modelled, or a zero cost, counts its real
    time / scale, as the accountant does), ``overrun`` (any charge of the batch took longer
    than its budget), ``bytes`` (sum), ``ops`` (the number of charges) and ``fields``; for a
    kind charged on the host's shared clock (:meth:`HostCosts.on_machine`, e.g. ``phub_pbox``'s
    aggregation and optimizer), also ``queued_s`` (sum of the time the charges queued behind
    the host's other operations). An empty batch writes nothing.

    Args:
        costs: the process's accountant; None: the blocks just run, nothing is charged.
        kind: a rate-based kind of :meth:`traffic.hostmodel.HostModel.cost_s` (``message``,
            ``aggregate``, ``optimizer`` ...).
        fields: extra event fields (``iteration``, ``frame`` ...).
    """

    def __init__(self, costs: HostCosts | None, kind: str, **fields):
        self.costs, self.kind, self.fields = costs, kind, fields
        self.count = 0
        self.nbytes = 0
        self.emulated_s = 0.0
        self.real_s = 0.0
        self.queued_s = 0.0
        self.overrun = False
        self._ts: float | None = None
        self._t0 = 0.0

    @contextmanager
    def charge(self, nbytes: int, ops: int = 1) -> Iterator[None]:
        """Run the block (the real work of ``ops`` chunks, ``nbytes`` bytes in all) as ``ops``
        charged operations (:meth:`~traffic.hostmodel.costs.HostCosts.charge`'s ``ops``).

        Raises:
            ValueError: an unknown kind (or ``compute``, which has no rate); ``ops`` < 1.
        """
        if self.costs is None:
            yield
            return
        if self._ts is None:
            self._ts, self._t0 = time.time(), time.perf_counter()
        with self.costs.charge(self.kind, nbytes=nbytes, span=False, ops=ops) as op:
            yield
        self.overrun = self.overrun or op.overrun
        self.count += ops
        self.nbytes += nbytes
        self.emulated_s += op.emulated_s
        self.real_s += op.real_s
        self.queued_s += op.queued_s

    def close(self) -> None:
        """Write the batch's span (nothing if no charge was made or there is no event log)."""
        events = self.costs.events if self.costs is not None else None
        if self.count and events is not None and self._ts is not None:
            shared = {"queued_s": self.queued_s} if self.costs.on_machine(self.kind) else {}
            events.record(
                f"host_{self.kind}",
                self._ts,
                time.perf_counter() - self._t0,
                emulated_s=self.emulated_s,
                real_s=self.real_s,
                overrun=self.overrun,
                bytes=self.nbytes or None,
                ops=self.count,
                **shared,
                **self.fields,
            )
        self._ts = None

    def __enter__(self) -> ChargeBatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def charges_messages(costs: HostCosts | None) -> bool:
    """True when ``costs`` states a per-message overhead (> 0): only then are messages charged
    (as :class:`traffic.runtime.transport.Transport` does: nothing charged, no statistics
    kept otherwise)."""
    return costs is not None and costs.model.message_overhead_s > 0


def charge_messages(costs: HostCosts | None, sizes, **fields) -> None:
    """Charge one ``message`` per logical chunk (``sizes``: each chunk message's bytes, its
    metadata included) of a frame sent or received as one transfer (``message=False`` to the
    transport), and record them as one span. The emulated system sends one message per chunk
    (PHub Sec. 3.2.4); the cost is the host model's per-message software overhead
    (``host.message_overhead_us``). Nothing when :func:`charges_messages` is false."""
    if not charges_messages(costs):
        return
    sizes = list(sizes)
    if sizes:
        with ChargeBatch(costs, "message", **fields) as batch:
            with batch.charge(sum(sizes), ops=len(sizes)):
                pass
