"""Iteration marks for a researcher's own program (``workload.program``), import-only.

A program run by the testbed may, optionally, mark its training iterations so that the run
gets the iteration-level figures the schemes get (iteration times, samples/s, the progress
bar, ``at_iteration`` events)::

    from traffic import marks               # the testbed puts the project on PYTHONPATH

    for step, (x, y) in enumerate(loader):
        with marks.iteration(step, samples=len(x)):
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()

Each mark is one ``iteration`` event in ``events/<process>.jsonl`` (the format of
:mod:`traffic.runtime.events`), written where ``TESTBED_EVENTS`` says; outside the testbed
(the variable unset) every call does nothing, so the program runs unchanged elsewhere. This
module needs only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from traffic.runtime.events import EventLog

__all__ = ["iteration", "event", "enabled"]

_log: EventLog | None = None


def _events() -> EventLog | None:
    global _log
    path = os.environ.get("TESTBED_EVENTS")
    if not path:
        return None
    if _log is None or str(_log.path) != path:
        _log = EventLog(path, os.environ.get("TESTBED_PROC", "worker0"), "worker", int(os.environ.get("RANK", "0")))
    return _log


def enabled() -> bool:
    """True when running under the testbed (``TESTBED_EVENTS`` set)."""
    return bool(os.environ.get("TESTBED_EVENTS"))


@contextlib.contextmanager
def iteration(index: int, samples: int | None = None, **fields) -> Iterator[dict]:
    """Mark the ``with`` body as training iteration ``index`` (0-based, as the schemes count)
    that processed ``samples`` samples on this process; ``fields`` are written too (``loss``
    ...; JSON values). Yields the event's fields (the body may add some). Does nothing
    outside the testbed."""
    log = _events()
    if log is None:
        yield dict(fields)
        return
    with log.span("iteration", iteration=int(index), samples=samples, **fields) as ev:
        yield ev


def event(kind: str, **fields) -> None:
    """Write an instant event of ``kind`` now (e.g. ``event("eval", accuracy=0.97)``)."""
    log = _events()
    if log is not None:
        log.record(kind, time.time(), 0.0, **fields)
