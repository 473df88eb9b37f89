"""Merge the traces of several machines into one run's ``traces/`` on the controller's clock.

A run spread over several machines (:mod:`testbed.cluster`) captures on each
machine its own switch ports (:mod:`testbed.capture.agent`, one :class:`~testbed.capture.Capture`
per machine), so each machine ends with its own ``bwm-ng.csv``, ``qdisc.csv``, ``cpu.csv``
and ``memory.csv`` stamped by its own clock. :func:`merge_traces` writes one file of each, in
the formats :mod:`analysis.traces` reads, with every timestamp moved to the controller's clock:

* ``t_controller = t_machine - offset_s``, where ``offset_s`` is the machine's clock minus
  the controller's (:func:`testbed.cluster.clock_offset`, measured as NTP does, uncertain by
  half the round trip). The offset is applied rounded to the microsecond; times are computed
  in integer microseconds, so a time written ``1795238073.520410`` with offset 0 comes out
  unchanged, and every time is written with 6 decimals (the files' own precision).
* ``bwm-ng.csv``: bwm-ng's raw lines, kept as text (only the time field is rewritten).
  Every per-interface line is kept; the ``total`` lines are dropped (each sums one
  machine's ports at one machine's instant: a merged file would interleave unrelated
  totals; :func:`analysis.traces.parse_bwm_ng` drops them anyway). Malformed lines (not
  21 fields, or 16 for bwm-ng 0.6.1/0.6.2; a field that is not a number where bwm-ng writes
  one) and a truncated last line are dropped. When 16- and 21-field lines are merged
  together the 16-field ones get 5 empty fields, so that every line has 21 (pandas skips
  lines longer than the file's first one).
* ``qdisc.csv`` (header :data:`~testbed.capture.qdisc.QDISC_FIELDS`) and ``cpu.csv``
  (:data:`~testbed.capture.cpu.CPU_FIELDS`): values kept as text, time shifted. In
  ``cpu.csv`` the rows that describe a *machine* rather than a training process get their
  ``id`` prefixed ``"<machine>:"`` for remote parts, so that machines do not collide:
  ``core`` rows (``0`` becomes ``10.0.0.2:0``) and the capture's own processes ``bwm-ng``
  and ``harness`` (each machine has its own). Training processes keep their names (they
  are unique across the run). Interfaces are not prefixed: switch port names are unique
  across the topology.
* ``memory.csv`` (:data:`~testbed.capture.memory.MEMORY_FIELDS`): values kept as text, time
  shifted, and every row of a remote part has its ``id`` prefixed ``"<machine>:"``
  (``used`` becomes ``10.0.0.2:used``, ``worker3`` ``10.0.0.2:worker3``): the machine a
  process's memory was taken on is kept.

All lines/rows are sorted by corrected time; the sort is stable (equal times keep the order
of the parts, then of the file). A file missing from a part is skipped; a file missing from
every part is not created. Files are read completely before any is written, and each is
written to a temporary file then renamed, so the output directory may be one of the
parts' own directories (the controller's ``traces/``).
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from testbed.capture.cpu import CPU_FIELDS
from testbed.capture.memory import MEMORY_FIELDS
from testbed.capture.qdisc import QDISC_FIELDS

__all__ = ["TracePart", "merge_traces", "MERGED_FILES", "MACHINE_PROCS"]

log = logging.getLogger(__name__)

#: the files merge_traces writes
MERGED_FILES = ("bwm-ng.csv", "qdisc.csv", "cpu.csv", "memory.csv")

#: ``cpu.csv`` process rows that each machine's capture writes about itself (prefixed like cores)
MACHINE_PROCS = frozenset({"bwm-ng", "harness"})

_US = 1_000_000
_NUM = r"-?\d+(?:\.\d+)?"
# time ; iface ; 14 numbers (bwm-ng 0.6.1/0.6.2: 16 fields) or 19 numbers (0.6.3: 21 fields)
_BWM_LINE = re.compile(rf"(\d+)(?:\.(\d+))?;([^;\s]+);({_NUM}(?:;{_NUM}){{13}}((?:;{_NUM}){{5}})?)")
_TIME = re.compile(r"(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class TracePart:
    """The traces of one machine.

    Attributes:
        machine: the machine's name (its SSH address), used as the ``cpu.csv`` and
            ``memory.csv`` id prefix; None for the controller's own traces (no prefix).
        traces_dir: the directory holding its ``bwm-ng.csv``, ``qdisc.csv``, ``cpu.csv``,
            ``memory.csv`` (any of them may be missing).
        offset_s: the machine's clock minus the controller's, seconds (normally 0 for the
            controller itself).

    Raises:
        ValueError: ``machine`` is an empty string, or ``offset_s`` is not a finite number.
    """

    machine: str | None
    traces_dir: Path
    offset_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "traces_dir", Path(self.traces_dir))
        if self.machine is not None and not self.machine:
            raise ValueError("TracePart.machine: a machine name, or None for the controller")
        if not isinstance(self.offset_s, (int, float)) or not math.isfinite(self.offset_s):
            raise ValueError(f"TracePart.offset_s: a finite number of seconds, not {self.offset_s!r}")


def merge_traces(out_traces_dir: str | Path, parts: list[TracePart]) -> dict[str, int]:
    """Merge the parts' ``bwm-ng.csv``, ``qdisc.csv``, ``cpu.csv`` and ``memory.csv`` into
    ``out_traces_dir`` (created if missing and there is something to write) on the controller's
    clock (see module doc).

    Args:
        out_traces_dir: where the merged files go; may be one of the parts' ``traces_dir``.
        parts: the machines' traces, in the order that breaks ties of equal times.

    Returns:
        ``{file name: lines or rows written (headers excluded)}`` for each file written (a
        file no part has is absent).

    Raises:
        ValueError: two parts name the same machine (their cpu ids would collide).
        OSError: a file cannot be read or written.
    """
    out = Path(out_traces_dir)
    names = [p.machine for p in parts]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"merge_traces: machine(s) {sorted(dup, key=str)} given in more than one part")
    bwm = _read_bwm_parts(parts)
    tables = {
        name: _read_table_parts(parts, name, fields)
        for name, fields in (("qdisc.csv", QDISC_FIELDS), ("cpu.csv", CPU_FIELDS), ("memory.csv", MEMORY_FIELDS))
    }
    written: dict[str, int] = {}
    if bwm is not None or any(df is not None for df in tables.values()):
        out.mkdir(parents=True, exist_ok=True)
    if bwm is not None:
        _write_atomic(out / "bwm-ng.csv", "".join(bwm))
        written["bwm-ng.csv"] = len(bwm)
    for name, df in tables.items():
        if df is not None:
            buf = io.StringIO()
            df.to_csv(buf, index=False)
            _write_atomic(out / name, buf.getvalue())
            written[name] = len(df)
    return written


# ----------------------------------------------------------------------------- time


def _offset_us(offset_s: float) -> int:
    return int(round(offset_s * _US))


def _to_us(whole: str, frac: str | None) -> int:
    """Integer microseconds of the decimal ``whole.frac`` (rounded half up beyond 6 decimals)."""
    frac = frac or ""
    if len(frac) <= 6:
        return int(whole) * _US + int(frac.ljust(6, "0"))
    q, r = divmod(int(frac), 10 ** (len(frac) - 6))
    return int(whole) * _US + q + (2 * r >= 10 ** (len(frac) - 6))


def _fmt_us(t_us: int) -> str:
    sign = "-" if t_us < 0 else ""
    s, us = divmod(abs(t_us), _US)
    return f"{sign}{s}.{us:06d}"


def _time_us(text: str) -> int | None:
    m = _TIME.fullmatch(text.strip())
    return _to_us(m.group(1), m.group(2)) if m else None


# ----------------------------------------------------------------------------- bwm-ng


def _complete_lines(path: Path) -> list[str]:
    """The file's complete lines, without their ``\\n`` or ``\\r\\n`` (a last line without its
    ``\\n`` was cut mid-write). Read as bytes: universal newlines would take a lone ``\\r``
    for the end of a line."""
    lines = path.read_bytes().decode(errors="replace").split("\n")
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines[:-1]]  # after the last "\n": "" or a cut line


def _read_bwm_parts(parts: list[TracePart]) -> list[str] | None:
    """Every valid per-interface line of every part, time-corrected and sorted, each
    ending in a newline; None when no part has a ``bwm-ng.csv``."""
    found = False
    rows: list[tuple[int, str, bool]] = []  # (corrected time, rest of the line from its first ';', short)
    dropped = 0
    for part in parts:
        path = part.traces_dir / "bwm-ng.csv"
        if not path.is_file():
            continue
        found = True
        off = _offset_us(part.offset_s)
        for line in _complete_lines(path):
            m = _BWM_LINE.fullmatch(line)
            if m is None:
                dropped += bool(line.strip())
                continue
            if m.group(3) == "total":
                continue
            rows.append((_to_us(m.group(1), m.group(2)) - off, line[line.index(";") :], m.group(5) is None))
    if not found:
        return None
    if dropped:
        log.warning("merge_traces: %d malformed bwm-ng line(s) dropped", dropped)
    rows.sort(key=lambda r: r[0])
    mixed = any(r[2] for r in rows) and not all(r[2] for r in rows)
    pad = ";;;;;" if mixed else ""
    return [f"{_fmt_us(t)}{rest}{pad if short else ''}\n" for t, rest, short in rows]


# ----------------------------------------------------------------------------- qdisc.csv, cpu.csv, memory.csv


def _read_table_parts(parts: list[TracePart], name: str, fields: list[str]) -> pd.DataFrame | None:
    """The rows of file ``name`` of every part as text columns ``fields``, time-corrected,
    cpu and memory ids prefixed for remote machines, stably sorted by time; None when no part has it."""
    frames = []
    for part in parts:
        path = part.traces_dir / name
        if not path.is_file():
            continue
        lines = _complete_lines(path)
        if lines and lines[0].strip():
            df = pd.read_csv(
                io.StringIO("\n".join(lines) + "\n"), dtype=str, keep_default_na=False, on_bad_lines="skip"
            )
        else:  # empty file (the writer died before its header)
            df = pd.DataFrame({c: pd.Series(dtype=object) for c in fields})
        df = df.reindex(columns=fields, fill_value="")
        us = df["time"].map(_time_us) if len(df) else pd.Series(dtype=object)
        bad = us.isna()
        if bad.any():
            log.warning("merge_traces: %d row(s) of %s with a malformed time dropped", int(bad.sum()), path)
            df, us = df[~bad], us[~bad]
        df = df.assign(_t=us.astype("int64") - _offset_us(part.offset_s))
        if name == "cpu.csv" and part.machine is not None:
            own = (df["kind"] == "core") | ((df["kind"] == "proc") & df["id"].isin(MACHINE_PROCS))
            df.loc[own, "id"] = part.machine + ":" + df.loc[own, "id"]
        if name == "memory.csv" and part.machine is not None:
            df["id"] = part.machine + ":" + df["id"]
        frames.append(df)
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True).sort_values("_t", kind="stable")
    df["time"] = [_fmt_us(t) for t in df["_t"]]
    return df[fields].reset_index(drop=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.merging")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
