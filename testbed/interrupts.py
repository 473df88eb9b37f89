"""Ctrl-C and SIGTERM held back while a process is started and recorded.

A process started with ``Popen`` exists as soon as the fork returns, but the harness knows
it only once ``Popen`` has returned and its pid is in the run's ledger. A KeyboardInterrupt
raised between the two would leave a process that nobody kills (a training process, a host
shell, bwm-ng). :func:`deferred_signals` makes that window atomic: a SIGINT or SIGTERM that
arrives inside it is delivered, to the handler that was in place, when the block ends.
Python-level handlers are swapped (not the signal mask), so the started process inherits
nothing unusual: exec resets handled signals to their defaults.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["deferred_signals"]

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_signals():
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver the ones that came,
    in order, to the previous handlers (which may raise, e.g. KeyboardInterrupt).

    Outside the main thread (where Python cannot set handlers) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in _HELD}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for s in got:
            signal.raise_signal(s)
