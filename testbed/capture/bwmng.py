"""The bwm-ng recorder: ``traces/bwm-ng.csv``, every switch port every ``capture.interval_ms``.

bwm-ng itself, unmodified output, started as::

    bwm-ng -o csv -T rate -t <interval_ms> -I <port,port,...> -a 0 -c 0 -F traces/bwm-ng.csv

``-o csv`` CSV output; ``-T rate`` the per-interval type (the only one whose counters
are per-interval); ``-t`` the period in ms; ``-I`` the interfaces, matched by exact name;
``-a 0`` is required for ``-I`` to restrict the output: with the default ``-a 1`` bwm-ng
prints *every* interface that is up, and ``-a 2`` every interface, whatever ``-I`` says
(``-a 0`` prints only selected interfaces that are up; an unknown name is silently
ignored, which is why :meth:`testbed.capture.Capture.start` checks the names first); ``-c 0``
prints until killed; ``-F`` writes the file itself and flushes after every line.

Facts verified on bwm-ng 0.6.3 (Debian 0.6.3-2+b1) with veth pairs in private
namespaces (tests/e2e/test_capture_netns.py repeats the check, tests/data/bwm-ng-veth.csv is such a
capture):

* 21 ``;``-separated fields per line: ``time;iface;bytes_out/s;bytes_in/s;
  bytes_total/s;bytes_in;bytes_out;packets_out/s;packets_in/s;packets_total/s;
  packets_in;packets_out;errors_out/s;errors_in/s;errors_in;errors_out;bits_out/s;
  bits_in/s;bits_total/s;bits_in;bits_out`` (the README of 0.6.3 documents the same
  order), then a ``total`` line summing the selected interfaces.
* ``time`` is gettimeofday() at the moment the line is printed, microsecond resolution.
* ``bytes_in``/``bytes_out`` are **per-interval deltas**, not cumulative: 200 UDP
  datagrams of 1000 payload bytes sent through a bridge port showed up as lines of
  8336 = 8 x 1042 and 9378 = 9 x 1042 bytes (1042 = 1000 + 8 UDP + 20 IP + 14 Ethernet),
  summing to exactly 200 x 1042 = 208400 bytes, equal to the /proc/net/dev difference.
  The first line of an interface is the delta since bwm-ng's start-up read (not zero when
  traffic flows at start-up).
* the ``/s`` columns are delta x 1000 / (elapsed ms truncated to an integer): a line
  10.375 ms after the previous one showed 9378 B and 937800 B/s where the true rate is
  903904 B/s (+3.7 %). Analysis therefore recomputes rates from the deltas and the
  timestamps (:func:`analysis.traces.rates`).
* ``bits_in``/``bits_out`` = 8 x bytes; ``in``/``out`` are from the interface's point of
  view (a switch port's ``out`` is what the switch sends on that link).
* the period drifts: ``-t 10`` gives ~10.4 ms between lines of an interface.

Its CPU is a row of ``cpu.csv`` (measured cost: ``docs/scaling.md``, "What the capture costs").
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from common.errors import MissingRequirement, TestbedError
from testbed.interrupts import deferred_signals
from testbed.lifetime import tied_preexec
from traffic.rundir import open_private

log = logging.getLogger(__name__)


def bwm_ng_command(ports: list[str], interval_ms: int, out_file: str | Path, binary: str = "bwm-ng") -> list[str]:
    """The bwm-ng command line that samples exactly ``ports`` every ``interval_ms`` into ``out_file``."""
    return [
        binary,
        "-o",
        "csv",
        "-T",
        "rate",
        "-t",
        str(int(interval_ms)),
        "-I",
        ",".join(ports),
        "-a",
        "0",
        "-c",
        "0",
        "-F",
        str(out_file),
    ]


def find_bwm_ng() -> str:
    """Path of the bwm-ng binary.

    Raises:
        MissingRequirement: bwm-ng is not installed (the message gives the remedy).
    """
    path = shutil.which("bwm-ng") or ("/usr/bin/bwm-ng" if os.access("/usr/bin/bwm-ng", os.X_OK) else None)
    if not path:
        raise MissingRequirement(
            "bwm-ng is not installed; the testbed records every switch port with it. "
            "Install it with `apt-get install bwm-ng` (scripts/setup.sh does this)."
        )
    return path


class BwmNgRecorder:
    """One bwm-ng process sampling ``ports`` every ``interval_ms`` into ``out_file``.

    Args:
        ports: interfaces of this network namespace, matched by exact name (bwm-ng ignores
            an unknown name: check them first).
        interval_ms: bwm-ng's period, ms.
        out_file: the CSV bwm-ng writes (its parent must exist).
        log_file: bwm-ng's own messages (appended; the command line is its first line).
        errors: problems found at :meth:`stop` are appended here.
        on_pid: called as ``on_pid(pid, "bwm-ng")`` once bwm-ng runs.
        binary: the bwm-ng executable (:func:`find_bwm_ng`).

    :meth:`start` returns once bwm-ng wrote its first line (a start that fails stops what it
    started); :meth:`stop` is idempotent and safe without a :meth:`start`. ``proc`` is the
    bwm-ng process (None before :meth:`start`).
    """

    def __init__(
        self,
        ports: list[str],
        interval_ms: int,
        out_file: str | Path,
        log_file: str | Path,
        errors: list[str],
        on_pid: Callable[[int, str], None] | None = None,
        binary: str = "bwm-ng",
    ):
        self.ports = list(ports)
        self.interval_ms = interval_ms
        self.out_file, self.log_file = Path(out_file), Path(log_file)
        self.errors = errors
        self.on_pid = on_pid
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._stopped = False

    def start(self) -> BwmNgRecorder:
        """Start bwm-ng and wait for its first line, so that the capture covers what the
        caller starts next (a warning, not an error, if nothing comes within
        max(2 s, 20 periods)).

        Raises:
            TestbedError: bwm-ng exited at once (its message is included).
        """
        cmd = bwm_ng_command(self.ports, self.interval_ms, self.out_file, self.binary)
        try:
            self._log = open_private(self.log_file)
            self._log.write((" ".join(cmd) + "\n").encode())
            self._log.flush()
            with deferred_signals():  # recorded before a Ctrl-C can interrupt
                self.proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=tied_preexec(),
                )  # ends with the harness
                if self.on_pid:
                    self.on_pid(self.proc.pid, "bwm-ng")
            self._wait_first_line()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_first_line(self) -> None:
        wait_s = max(2.0, 20 * self.interval_ms / 1000)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                msg = self.log_file.read_text(errors="replace")[-2000:]
                raise TestbedError(f"bwm-ng exited at once with code {self.proc.returncode}: {msg.strip()}")
            try:
                if self.out_file.stat().st_size > 0:
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.005)
        log.warning("bwm-ng wrote nothing within %.1f s of its start", wait_s)

    def stop(self) -> None:
        """Stop bwm-ng (SIGTERM, then SIGKILL; idempotent). A bwm-ng that had already ended
        is reported in ``errors``."""
        if self._stopped:
            return
        self._stopped = True
        p = self.proc
        if p is not None and p.poll() is not None:
            self.errors.append(
                f"bwm-ng ended before the capture was stopped (exit code {p.returncode}); see {self.log_file}"
            )
        elif p is not None:
            for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> BwmNgRecorder:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __del__(self):  # last resort: never leave a bwm-ng behind
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
        except Exception:  # noqa: BLE001
            pass
