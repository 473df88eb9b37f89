"""Per-process event log: ``events/<proc>.jsonl`` (format in :mod:`traffic.rundir`).

One JSON object per line with the fields ``proc, role, rank, thread, kind, ts, dur,
iteration, layer`` always present (``iteration``/``layer`` may be null), ``bytes`` and
``peer`` on communication events, plus any extra fields the caller gives (``samples``,
``accuracy``, ``loss``, ``key``, ``dir`` ...). ``ts`` is the start in unix seconds
(``time.time()``), ``dur`` the duration in seconds measured with ``time.perf_counter()``.

Every event is written and flushed as soon as it ends, under a lock, so the log is
complete up to the moment a process crashes and lines from several threads never mix.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["EventLog", "thread_name"]


def thread_name() -> str:
    """Timeline track of the calling thread: ``main`` for the main thread, else its name."""
    t = threading.current_thread()
    return "main" if t is threading.main_thread() else t.name


def _jsonable(o):
    """numpy/torch scalars -> Python numbers, small arrays -> lists, anything else -> str."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


class EventLog:
    """Thread-safe writer of one process's events.

    Args:
        path: the ``.jsonl`` file (created, or appended to).
        proc: process name, e.g. ``worker0``.
        role: process role.
        rank: torch.distributed rank.

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | Path, proc: str, role: str, rank: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.proc, self.role, self.rank = proc, role, rank
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")  # line buffered
        self._lock = threading.Lock()
        self.count = 0

    def record(
        self,
        kind: str,
        ts: float,
        dur: float = 0.0,
        *,
        iteration: int | None = None,
        layer: int | None = None,
        thread: str | None = None,
        **fields,
    ) -> None:
        """Write one event that started at unix time ``ts`` and lasted ``dur`` seconds.

        ``fields`` become extra keys (``bytes``, ``peer``, ``samples`` ...); values should be
        JSON types (numbers, strings, lists, dicts, None); numpy/torch values are converted
        with ``tolist()``, anything else is written as its ``str``. Writing to a closed log
        is a no-op (events of a thread still running during shutdown are dropped).
        """
        ev = {
            "proc": self.proc,
            "role": self.role,
            "rank": self.rank,
            "thread": thread or thread_name(),
            "kind": kind,
            "ts": ts,
            "dur": dur,
            "iteration": iteration,
            "layer": layer,
        }
        ev.update(fields)
        line = json.dumps(ev, separators=(",", ":"), default=_jsonable) + "\n"
        with self._lock:
            if self._f.closed:
                return
            self._f.write(line)
            self.count += 1

    def instant(self, kind: str, **fields) -> None:
        """Write an event of duration 0 happening now."""
        self.record(kind, time.time(), 0.0, **fields)

    @contextmanager
    def span(self, kind: str, **fields) -> Iterator[dict]:
        """Time the ``with`` body as one event, written when the body ends.

        Yields a dict of the event's fields; the body may add or change fields (e.g. set
        ``bytes`` once known). If the body raises, the event is still written, with
        ``error`` set to the exception's type name, and the exception propagates.
        """
        ts, t0 = time.time(), time.perf_counter()
        fields = dict(fields)
        try:
            yield fields
        except BaseException as e:
            fields["error"] = type(e).__name__
            raise
        finally:
            self.record(kind, ts, time.perf_counter() - t0, **fields)

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        with self._lock:
            if not self._f.closed:
                self._f.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_events(path: str | Path) -> list[dict]:
    """All events of one ``.jsonl`` file, in file order (for tests and quick looks).

    Raises:
        ValueError: a line is not valid JSON.
    """
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
    return out
