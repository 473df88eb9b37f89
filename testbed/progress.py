"""What a run shows while it runs: its phase, then its iterations with the live samples/s
and the busiest link's utilization; a sweep's points; with ``-v``, the harness's log.

Phases: ``building network``, ``starting N processes``, ``training``, ``analysing``,
``tearing down``. While training, the count is of global iterations (the fewest any worker
has finished) from the ``iteration`` events the processes already write
(``events/<worker>.jsonl``, read incrementally), the samples/s of the last iterations as the
summary counts it (the mean over iterations of the global batch over the iteration's span,
in the emulated network's time: real time divided by ``scale``), and the busiest switch port's
transmit rate as a share of the rate shaped on its link (psutil's interface counters of the
root namespace, where the switch ports are).

On a terminal (stderr a TTY) this is a tqdm bar redrawn in place. Elsewhere (``nohup``,
``| tee``, CI) it is plain lines on stderr, each ``testbed: <run>: <what>``: one per phase,
one per sweep point, and while training one when the count has moved, at most every
:data:`LINE_PERIOD_S` seconds. Nothing is shown under ``--quiet``. The display reads files
and counters once a second and never affects the run.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import psutil
from tqdm import tqdm

from analysis.metrics import global_iterations

__all__ = ["RunProgress", "SweepProgress", "EventTail", "LINE_PERIOD_S", "say", "echo_log"]

#: without a terminal, the least time between two lines of a run's iteration count, seconds
LINE_PERIOD_S = 10.0


def say(text: str) -> None:
    """One plain progress line on stderr (``testbed: <text>``), written between tqdm's bars."""
    tqdm.write(f"testbed: {text}", file=sys.stderr)
    sys.stderr.flush()


class EventTail:
    """Reads the events the processes of a run append to ``events/<proc>.jsonl``
    incrementally: each :meth:`read` returns what was written since the last one (whole
    lines only; a line still being written waits for the next read).

    Args:
        events_dir: the run's ``events/`` directory (it may not exist yet).
        names: only these processes' files; None: every ``*.jsonl`` there, as they appear.
        kinds: only events of these kinds (matched on the raw line before it is parsed,
            which keeps a poll cheap on logs full of per-layer events); None: every event.
    """

    def __init__(self, events_dir: Path, names: list[str] | None = None, kinds: tuple[str, ...] | None = None):
        self.dir = Path(events_dir)
        self.names = list(names) if names is not None else None
        self.kinds = None if kinds is None else set(kinds)
        self._pattern = (
            None
            if kinds is None
            else re.compile(rb'"kind":\s*"(?:' + b"|".join(re.escape(k.encode()) for k in kinds) + rb')"')
        )
        self._offsets: dict[Path, int] = {}
        if self.names is not None:
            self._offsets = {self.dir / f"{n}.jsonl": 0 for n in self.names}

    def read(self) -> list[dict]:
        """The new events (JSON objects) of every file, file by file in the order written;
        unreadable files and lines that are not JSON objects are skipped."""
        if self.names is None:
            try:
                for p in sorted(self.dir.glob("*.jsonl")):
                    self._offsets.setdefault(p, 0)
            except OSError:
                pass
        out = []
        for path, offset in self._offsets.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only
            self._offsets[path] = offset + end
            for line in data[:end].splitlines():
                if self._pattern is not None and not self._pattern.search(line):
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict) and (self.kinds is None or ev.get("kind") in self.kinds):
                    out.append(ev)
        return out


class RunProgress:
    """The live display of one run (a no-op when ``enabled`` is false): a tqdm bar when stderr
    is a terminal (:attr:`terminal`), else plain lines (see the module doc).

    Args:
        enabled: show anything at all (false under ``--quiet``).
        label: what the bar or the lines are named (the run directory's name).
        iterations: iterations each worker runs (the bar's total).
        scale: the run's time dilation (rates are shown in emulated time).
        position: the bar's line (1 under a sweep's bar).
    """

    def __init__(self, enabled: bool, label: str, iterations: int, scale: float = 1.0, position: int = 0):
        self.enabled = enabled
        self.terminal = sys.stderr.isatty()
        self.label, self.iterations, self.scale, self.position = label, iterations, scale, position
        self.bar: tqdm | None = None
        self._tail: EventTail | None = None
        self._done: dict[str, list[dict]] = {}  # worker -> its iterations' rows (iteration_table's columns)
        self._ports: dict[str, float] = {}  # switch port -> shaped rate, bit/s
        self._last_counters: tuple[float, dict] | None = None
        self._next_poll = 0.0
        self._line_at: tuple[float, int] = (0.0, 0)  # (monotonic s, count) of the last iteration line

    def phase(self, text: str) -> None:
        """Show the current phase."""
        if not self.enabled:
            return
        if not self.terminal:
            say(f"{self.label}: {text}")
            return
        if self.bar is None:
            self.bar = tqdm(
                total=self.iterations,
                desc=self.label,
                unit="it",
                position=self.position,
                leave=self.position == 0,
                dynamic_ncols=True,
                bar_format="{desc}{postfix}",
            )
        self.bar.set_postfix_str(text)

    def training(self, run_dir: Path, workers: list[str], topology: dict) -> None:
        """Switch to the iteration count: ``workers`` are the worker process names,
        ``topology`` the run's ``topology.json`` (switch ports and their shaped rates)."""
        if not self.enabled:
            return
        self._tail = EventTail(Path(run_dir) / "events", workers, kinds=("iteration",))
        self._done = {w: [] for w in workers}
        switches = {s["name"] for s in topology.get("switches", [])}
        for link in topology.get("links", []):
            rate = (link.get("shaped_mbps") or link.get("bw_mbps") or 0) * 1e6
            for end in ("1", "2"):
                if link.get(f"node{end}") in switches and rate > 0:
                    self._ports[link[f"intf{end}"]] = rate
        if not self.terminal:
            self._line_at = (time.monotonic(), 0)
            say(f"{self.label}: training ({self.iterations} iterations)")
            return
        if self.bar is not None:
            self.bar.close()
        self.bar = tqdm(
            total=self.iterations,
            desc=self.label,
            unit="it",
            position=self.position,
            leave=self.position == 0,
            dynamic_ncols=True,
        )
        self.bar.set_postfix_str("training")

    def poll(self) -> None:
        """Read what is new (at most once a second) and redraw the bar, or, without a
        terminal, write a line when the count has moved and :data:`LINE_PERIOD_S` has passed
        since the last one."""
        if not self.enabled or self._tail is None or time.monotonic() < self._next_poll:
            return
        self._next_poll = time.monotonic() + 1.0
        done, parts = self._read()
        if not self.terminal:
            at, count = self._line_at
            if done > count and time.monotonic() - at >= LINE_PERIOD_S:
                self._line_at = (time.monotonic(), done)
                say(f"{self.label}: iteration {done}/{self.iterations}" + "".join(f", {p}" for p in parts))
            return
        self.bar.n = done
        self.bar.set_postfix_str(", ".join(parts) or "training", refresh=False)
        self.bar.refresh()

    def _read(self) -> tuple[int, list[str]]:
        """The global iterations done and the figures to show (samples/s, busiest link)."""
        for ev in self._tail.read():
            if ev.get("kind") == "iteration" and ev.get("proc") in self._done:
                rows = self._done[ev["proc"]]
                rows.append(
                    {
                        "iteration": len(rows),
                        "worker": ev["proc"],
                        "start": ev["ts"],
                        "end": ev["ts"] + ev.get("dur", 0.0),
                        "samples": ev.get("samples") or 0,
                    }
                )
        done = min(len(v) for v in self._done.values()) if self._done else 0
        parts = []
        if done >= 2:
            # the summary's throughput (analysis.metrics.global_iterations) over the last (up to)
            # 10 global iterations after the first, their mean, in emulated time (each one's time
            # from the completion of the one before: read one more and drop it)
            k = min(10, done - 1)
            recent = pd.DataFrame([r for v in self._done.values() for r in v[done - k - 1 : done]])
            rate = global_iterations(recent)["samples_per_s"].iloc[1:].mean() * self.scale
            if rate == rate:  # not NaN: some iteration took time
                parts.append(f"{rate:.1f} samples/s")
        busiest = self._busiest_port()
        if busiest:
            parts.append(f"busiest link {busiest[0]} {busiest[1]:.0%}")
        return done, parts

    def _busiest_port(self) -> tuple[str, float] | None:
        if not self._ports:
            return None
        now = time.monotonic()
        counters = psutil.net_io_counters(pernic=True)
        cur = {p: (counters[p].bytes_sent, counters[p].bytes_recv) for p in self._ports if p in counters}
        prev, self._last_counters = self._last_counters, (now, cur)
        if prev is None or now <= prev[0]:
            return None
        dt = now - prev[0]
        util = {
            p: 8 * max(b[0] - prev[1].get(p, b)[0], b[1] - prev[1].get(p, b)[1]) / dt / self._ports[p]
            for p, b in cur.items()
        }  # the busier direction of each link
        return max(util.items(), key=lambda kv: kv[1]) if util else None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class SweepProgress:
    """A sweep's display: a bar of its points on a terminal, else a line on stderr per point
    as it starts (``testbed: sweep <name>: point 2/6: <label>``); each point's result line
    goes to stdout as it ends.

    Args:
        enabled: show anything at all (false under ``--quiet``).
        name: the sweep directory's name.
        total: the number of points.
    """

    def __init__(self, enabled: bool, name: str, total: int):
        self.enabled, self.name, self.total = enabled, name, total
        self.terminal = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=f"sweep {name}", unit="run", disable=not (enabled and self.terminal))

    def start(self, index: int, label: str) -> None:
        """Point ``index`` (from 0), labelled ``label``, starts."""
        if self.enabled and not self.terminal:
            say(f"sweep {self.name}: point {index + 1}/{self.total}: {label}")
        self.bar.set_postfix_str(label)

    def end(self, line: str) -> None:
        """The point that started last ended; ``line`` is its result (:func:`testbed.runner.one_line`)."""
        self.bar.update()
        if self.enabled:
            tqdm.write(line)  # on stdout (below the bars), as the table that follows the sweep

    def close(self) -> None:
        self.bar.close()


class _TqdmStderr(logging.Handler):
    """A log handler that writes each record as a line on stderr through ``tqdm.write`` (the
    bars are redrawn below it)."""

    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
            self.handleError(record)


@contextmanager
def echo_log(logger: str = "testbed"):
    """While inside, every record of ``logger`` (the harness's: what ``logs/harness.log`` gets)
    is also written to stderr, ``testbed: LEVEL message`` (``testbed run -v``)."""
    handler = _TqdmStderr()
    handler.setFormatter(logging.Formatter("testbed: %(levelname)s %(message)s"))
    lg = logging.getLogger(logger)
    lg.addHandler(handler)
    try:
        yield handler
    finally:
        lg.removeHandler(handler)
