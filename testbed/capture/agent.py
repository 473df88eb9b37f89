"""The capture of one machine of a cluster run: ``python -m testbed.capture.agent``.

A run spread over several machines (:mod:`testbed.cluster`) has switch ports on
every machine, and bwm-ng, the qdisc sampler and the CPU sampler can only read the machine
they run on. So the controller starts, over SSH, one agent per remote machine; each runs one
:class:`~testbed.capture.Capture` there, writing into a staging directory of that machine
(``RUN_DIR/traces/``, bwm-ng's messages and sampler problems in ``RUN_DIR/logs/``). The
controller copies the files back when the run ends and merges them on its own clock
(:func:`testbed.capture.merge.merge_traces`)::

    python -m testbed.capture.agent RUN_DIR --ports tor2-eth1,tor2-eth2 [--qdisc tor2-eth1] \\
        --capture '{"interval_ms": 10, ...}' [--match STAGE_DIR]

``--capture`` is the experiment's ``capture`` section as JSON (:class:`testbed.spec.CaptureSpec`);
the agent turns off ``pcap`` and ``endpoints`` (the controller's own business). The CPU
sampler reports, besides the cores, ``bwm-ng`` and ``harness`` (the agent), the training
processes of this machine: those started as ``... -m traffic.runtime RUN_DIR NAME`` whose
command line contains ``--match`` (default: ``RUN_DIR`` as given), by ``NAME``
(:func:`runtime_pids`; rescanned once a second). It also records ``memory.csv``
(:mod:`testbed.capture.memory`): this machine's used memory and the USS of those training
processes, from the agent's start (the network is built by then; the controller reads each
machine's used memory before the build, :meth:`testbed.site.cluster.ClusterSite.start_memory`).

Protocol, on stdout (one line each, flushed; nothing else is written there, logs go to
stderr):

* ``ready {"pid": <agent pid>, "bwm_ng_pid": <pid>}`` once the capture runs (bwm-ng wrote
  its first line);
* ``error <message>`` when the capture cannot start (unknown interface, bwm-ng missing,
  an invalid ``--capture``): exit status 1 (2 for a malformed command line);
* ``stopped`` once the capture is stopped: exit status 0.

The agent stops when its stdin reaches end of file (the SSH session closed, or the
controller closed it) or when SIGTERM, SIGHUP or SIGINT arrives; a signal that arrives
while the capture is starting stops it right after the start, before ``ready``. Stopping
kills bwm-ng (SIGTERM, then SIGKILL) and joins the samplers (:meth:`Capture.stop`). A
SIGKILL of the agent cannot be handled: bwm-ng (in its own session) would then be left
running, and ``testbed clean`` on that machine removes it (a bwm-ng writing into a
``traces/`` directory).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from testbed.capture import Capture
from testbed.spec import CaptureSpec

__all__ = ["runtime_pids", "RuntimePids", "main"]

log = logging.getLogger(__name__)

#: the signals that stop the agent
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def runtime_pids(match: str) -> dict[str, int]:
    """The training processes of this machine: ``{NAME: pid}`` of the processes whose argv
    ends with ``-m traffic.runtime RUN_DIR NAME`` and whose command line (argv joined by
    spaces) contains ``match``.

    Processes forked by a training process without an exec (same argv) are not reported
    separately: a name maps to the matching process whose parent is not a match of the
    same name (the oldest, if several). The CPU sampler counts descendants anyway.

    Args:
        match: a non-empty string, normally the run's staging directory.

    Returns:
        ``{process name: pid}`` (empty when none runs). Processes that vanish or cannot be
        read during the scan are left out.

    Raises:
        ValueError: ``match`` is empty (it would match every run on the machine).
    """
    if not match:
        raise ValueError("runtime_pids: an empty match would select the processes of every run")
    found: dict[int, tuple[str, int, float]] = {}  # pid -> (name, ppid, create time)
    for p in psutil.process_iter(["cmdline", "ppid", "create_time"]):
        cmd = p.info["cmdline"]
        if not cmd or len(cmd) < 4 or cmd[-4:-2] != ["-m", "traffic.runtime"]:
            continue
        if match not in " ".join(cmd):
            continue
        found[p.pid] = (cmd[-1], p.info["ppid"], p.info["create_time"] or 0.0)
    out: dict[str, tuple[float, int]] = {}
    for pid, (name, ppid, created) in found.items():
        if ppid in found and found[ppid][0] == name:
            continue  # a fork of a training process: its root is reported
        if name not in out or (created, pid) < out[name]:
            out[name] = (created, pid)
    return {name: pid for name, (_, pid) in sorted(out.items())}


class RuntimePids:
    """:func:`runtime_pids` for the CPU sampler, which asks at every sample: a scan of
    ``/proc`` (every process's command line) at most every ``every_s`` seconds, the last
    answer otherwise. A callable. (A scan is too costly for every sample: ``docs/scaling.md``,
    "What the capture costs".)"""

    def __init__(self, match: str, every_s: float = 1.0, scan: Callable[[str], dict[str, int]] = runtime_pids):
        if not match:
            raise ValueError("RuntimePids: an empty match would select the processes of every run")
        self.match, self.every_s, self.scan = match, every_s, scan
        self._last: dict[str, int] = {}
        self._at: float | None = None

    def __call__(self) -> dict[str, int]:
        now = time.monotonic()
        if self._at is None or now - self._at >= self.every_s:
            self._last = self.scan(self.match)
            self._at = now
        return dict(self._last)


class _Usage(Exception):
    """A malformed command line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # the controller reads stdout: report there, in the protocol's form
        raise _Usage(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m testbed.capture.agent",
        description="Capture this machine's switch ports for a cluster run until stdin closes.",
    )
    ap.add_argument("run_dir", type=Path, help="staging directory (traces/ and logs/ are written there)")
    ap.add_argument("--ports", required=True, help="switch ports bwm-ng samples, comma-separated")
    ap.add_argument("--qdisc", default="", help="interfaces whose root qdisc is sampled, comma-separated")
    ap.add_argument("--capture", required=True, help="the experiment's capture section as JSON")
    ap.add_argument(
        "--match", default=None, help="training processes are those whose command line contains this (default: RUN_DIR)"
    )
    return ap


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _capture_spec(text: str) -> CaptureSpec:
    """The ``--capture`` JSON as a CaptureSpec with pcap and the endpoint sampler off.

    Raises:
        ValueError: not JSON, not an object, or not a valid capture section
            (pydantic.ValidationError is a ValueError).
    """
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"--capture: a JSON object (the capture section), not {type(data).__name__}")
    data = {**data, "pcap": None, "endpoints": False}
    return CaptureSpec.model_validate(data)


def _say(line: str) -> None:
    """One protocol line on stdout, flushed. A closed stdout (the controller went away) is
    ignored: the agent must still stop its capture."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        try:  # further writes, and the flush at exit, go nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


class _StopWatch:
    """The agent's stop conditions: STOP_SIGNALS (recorded by handlers that never raise, and
    written to a wakeup pipe) and end of file on stdin."""

    def __init__(self):
        self.signal: int | None = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        self._old_wakeup = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}

    def _handler(self, signum, frame):
        if self.signal is None:
            self.signal = signum

    def wait(self) -> str:
        """Block until stdin reaches end of file or a stop signal came; say which."""
        stdin = sys.stdin.fileno() if sys.stdin is not None else -1
        watch = [self._r] + ([stdin] if stdin >= 0 else [])
        while self.signal is None:
            if stdin < 0:
                return "stdin closed"
            try:
                ready, _, _ = select.select(watch, [], [])
            except (OSError, ValueError):  # stdin is not a readable descriptor
                return "stdin closed"
            if self._r in ready:
                try:
                    os.read(self._r, 512)
                except BlockingIOError:
                    pass
            if stdin in ready:
                try:
                    if not os.read(stdin, 65536):
                        return "end of stdin"
                except OSError:
                    return "stdin closed"
        return f"signal {signal.Signals(self.signal).name}"

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_wakeup)
        for s, h in self._old.items():
            signal.signal(s, h)
        os.close(self._r)
        os.close(self._w)


def main(argv: list[str] | None = None) -> int:
    """Run the agent (see module doc); returns the exit status: 0 stopped, 1 the capture
    could not start, 2 a malformed command line."""
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="capture agent %(levelname)s %(name)s: %(message)s"
    )
    watch = _StopWatch()  # before anything starts: a stop asked for during the start is kept
    try:
        try:
            args = _parser().parse_args(argv)
        except _Usage as e:
            _say(f"error {_one_line(e)}")
            return 2
        capture = None
        try:
            spec = _capture_spec(args.capture)
            match = str(args.run_dir) if args.match is None else args.match
            capture = Capture(
                args.run_dir, _names(args.ports), _names(args.qdisc), pids=RuntimePids(match), spec=spec, memory=True
            )
            capture.start()
        except Exception as e:  # noqa: BLE001 -- every failure to start is reported in the protocol
            if capture is not None:
                capture.stop()
            log.error("capture could not start: %s", e)
            _say(f"error {_one_line(e)}")
            return 1
        try:
            if watch.signal is None:
                _say("ready " + json.dumps({"pid": os.getpid(), "bwm_ng_pid": capture.bwm.pid}))
                why = watch.wait()
            else:
                why = f"signal {signal.Signals(watch.signal).name} during the start"
            log.info("stopping: %s", why)
        finally:
            capture.stop()
        _say("stopped")
        return 0
    finally:
        watch.close()


if __name__ == "__main__":
    sys.exit(main())
