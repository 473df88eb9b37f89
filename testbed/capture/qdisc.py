"""The qdisc sampler: ``traces/qdisc.csv``, the root qdisc of chosen interfaces.

A thread (:class:`testbed.capture.periodic.SampledCsv`) reads the root qdisc of each
interface in ``qdisc_ifaces`` every ``capture.qdisc_interval_ms`` (default 50 ms) with
pyroute2 (:class:`QdiscSampler`: one RTM_GETQDISC dump of the root namespace per sample, on
one socket kept open for the whole capture). An htb root's counters include its leaf queue
(verified: the htb root's backlog and drops follow the leaf under overload), so the root row
is the queue of the link. Columns: ``time`` (unix s at which the dump was requested; all rows
of a sample share it), ``iface``, ``qdisc`` (kind), ``backlog_bytes``, ``backlog_packets``
(gauges), ``drops``, ``overlimits``, ``sent_bytes``, ``sent_packets`` (cumulative kernel
counters since the qdisc was created).

Its cost is pyroute2 decoding every qdisc of the root namespace, so it grows with the qdiscs
there, not with the interfaces sampled, and it is all in the harness process (the ``harness``
row of ``cpu.csv``); hence the default period of 50 ms (measured costs: ``docs/scaling.md``,
"What the capture costs").
"""

from __future__ import annotations

import asyncio

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import TC_H_ROOT

from common.errors import TestbedError

QDISC_FIELDS = [
    "time",
    "iface",
    "qdisc",
    "backlog_bytes",
    "backlog_packets",
    "drops",
    "overlimits",
    "sent_bytes",
    "sent_packets",
]


class QdiscSampler:
    """Counters of the root qdisc of chosen interfaces of this network namespace, via pyroute2.

    :meth:`read` sends one ``RTM_GETQDISC`` dump (what ``tc -s qdisc show`` sends) and keeps
    the root qdisc of each chosen interface. The kernel has no per-interface qdisc dump (a
    request naming one interface still returns every qdisc), so one dump per sample is the
    cheapest. One pyroute2 ``AsyncIPRoute`` socket and a private event loop are opened by
    :meth:`open` and kept until :meth:`close`; pyroute2 ties both to the thread that opened
    them, so call all three methods from one thread. (``AsyncIPRoute`` because the
    synchronous ``IPRoute`` runs the event loop once per message, ~25 % more CPU.)

    Args:
        ifaces: ``{ifindex: name}`` of the interfaces to report.
    """

    def __init__(self, ifaces: dict[int, str]):
        self.ifaces = dict(ifaces)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ipr: AsyncIPRoute | None = None

    def open(self) -> QdiscSampler:
        """Open the netlink socket (raises OSError if it cannot)."""
        self._loop = asyncio.new_event_loop()
        self._ipr = self._loop.run_until_complete(self._connect())
        return self

    @staticmethod
    async def _connect() -> AsyncIPRoute:
        ipr = AsyncIPRoute()  # made inside the loop: pyroute2 uses it and leaves closing it to us
        await ipr.setup_endpoint()
        return ipr

    def close(self) -> None:
        """Close the socket and the event loop (idempotent)."""
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        if self._loop is not None:
            self._loop.run_until_complete(asyncio.sleep(0))  # let the aborted transport finish closing
            self._loop.close()
            self._loop = None

    def __enter__(self) -> QdiscSampler:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self) -> list[tuple]:
        """One row per chosen interface that has a root qdisc: ``(iface, qdisc kind,
        backlog_bytes, backlog_packets, drops, overlimits, sent_bytes, sent_packets)``, the
        ``qdisc.csv`` columns after ``time``. Backlogs are gauges, the rest cumulative since
        the qdisc was created.

        Raises:
            pyroute2.NetlinkError: the kernel refused the dump.
        """
        if self._loop is None:
            raise TestbedError("QdiscSampler.read() before open()")
        return self._loop.run_until_complete(self._read())

    async def _read(self) -> list[tuple]:
        rows = []
        async for msg in await self._ipr.get_qdiscs():
            name = self.ifaces.get(msg["index"])
            if name is not None and msg["parent"] == TC_H_ROOT:
                rows.append((name, msg.get_attr("TCA_KIND"), *_qdisc_counters(msg)))
        return rows


def _qdisc_counters(msg) -> tuple:
    """``(backlog_bytes, backlog_packets, drops, overlimits, sent_bytes, sent_packets)`` of a
    pyroute2 qdisc message: from ``TCA_STATS2`` (``TCA_STATS_QUEUE``, ``TCA_STATS_BASIC``),
    else from the legacy ``TCA_STATS``; Nones if the kernel sent neither."""
    stats2 = msg.get_attr("TCA_STATS2")
    if stats2 is not None:
        basic, queue = stats2.get_attr("TCA_STATS_BASIC"), stats2.get_attr("TCA_STATS_QUEUE")
        if basic is not None and queue is not None:
            return (
                queue["backlog"],
                queue["qlen"],
                queue["drops"],
                queue["overlimits"],
                basic["bytes"],
                basic["packets"],
            )
    st = msg.get_attr("TCA_STATS")
    if st is not None:
        return st["backlog"], st["qlen"], st["drop"], st["overlimits"], st["bytes"], st["packets"]
    return (None,) * 6
