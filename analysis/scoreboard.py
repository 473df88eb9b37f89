"""The reproduction scoreboard: ``REPRODUCTION.md``, generated from the run
directories that ``testbed reproduce`` marked, never typed by hand.

    testbed reproduce ID --headline --repeat 3            # runs, each sweep marked reproduce.json
    testbed reproduce --archive reproduction/runs          # keep their small files in the repository
    testbed reproduce --scoreboard reproduction/runs > REPRODUCTION.md

    from analysis.scoreboard import scoreboard, archive, headline_table
    text = scoreboard("reproduction/runs")                 # the markdown, deterministic

A *marked* directory is a sweep (or run) directory with :data:`analysis.reproduction.MARKER`
in it: the catalogue entry it reproduces, the mode (``full``, ``quick``, ``headline``), the
``--set`` overrides, which repeat of how many, the dilation (1, or 2 for a headline's
dilation check: the same run at twice its dilation), and when. Everything the scoreboard prints
comes from those directories (their ``sweep.csv``, each run's ``spec.yaml``) and from the
catalogue (the paper's values, the status and reason of entries not run here).

A marked headline sweep measures its entry's headline ratios only when its recorded overrides
are the entry's headline overrides as the catalogue states them now
(:meth:`analysis.reproduction.Entry.overrides`): a sweep run with other overrides measured
another setting, whose rows the ratios may not even select. The scoreboard leaves such a
sweep out of the ratios and lists it, labelled, among what the entry's directories hold.

A headline ratio (:class:`analysis.reproduction.Ratio`) is, in each marked headline sweep of
its entry, ``samples_per_s`` of the one ``sweep.csv`` row matching its numerator over that of
the row matching its denominator: the throughput of the row's run, computed again from its
``iterations.csv`` by the current definition (:func:`analysis.metrics.refigured_summary`),
or ``sweep.csv``'s figure for a run archived without one. Over the repeats the scoreboard gives the median and the
range; *measured / paper* is the median over the paper's ratio, or over the nearer end of a
range the paper gives (1.0 inside it); *within* is ``|measured / paper - 1| <= 0.25``
(:data:`analysis.reproduction.TOLERANCE`). The two variants are *distinguishable* when the
ratio's range over the repeats excludes 1.0 (with one run: when the two rows' bands of
samples/s, mean +- 1.96 sd of the iterations (``samples_per_s_spread95``), do not overlap).

A *headline* is one ratio, or the two ends of a band (:attr:`analysis.reproduction.Ratio.band`:
a setting the paper does not print but bounds through its own statements, such as Stanza's
compute time): a band is within when the medians of its two ends span a range that reaches
within the tolerance of the paper's ratio (:func:`headline_within`).
A headline *counts* toward the verdict only when it is within, on the paper's own
setting (no ``setting_differs`` in the catalogue), and each of its ratios measured by the protocol
(:func:`protocol_problems`): at least :data:`MIN_REPEATS` repeats, every compared run with at
least :data:`MIN_WARMUP` warm-up and :data:`MIN_MEASURED` measured iterations and steady (its
iteration time settled: :func:`analysis.metrics.iteration_drift` and
:func:`analysis.metrics.steady` on its ``iterations.csv``), the two variants
of a repeat at one dilation, and a dilation check: the median ratio over the repeats at
twice the dilation (``testbed reproduce ID --headline --dilation-check``) within
:data:`DILATION_TOLERANCE` of the median at the headline's dilation. A ratio the emulated
network and host model carry does not move with the dilation; one that moves shows this
machine's own speed in the result. A campaign too long for one sitting goes on with
``testbed reproduce ID --headline --repeat 3 --from-repeat K``; the repeats pool from the last
first repeat on, and hold only when every run executed the same code (the marker's ``code``)
and each repeat ran once.
"""

from __future__ import annotations

import filecmp
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import pandas as pd

from analysis.load import measured_span, read_sweep_csv
from analysis.metrics import (
    STEADY_TOLERANCE,
    global_iterations,
    iteration_drift,
    measured_iterations,
    refigured_summary,
    steady,
)
from analysis.reproduction import MARKER, PAPERS, STATUSES, TOLERANCE, Entry, Ratio, load_catalogue
from common.errors import TestbedError
from traffic.rundir import SWEEP_FIGURES, SWEEP_RENAMED, read_spec
from traffic.summary import RunSummary

__all__ = [
    "ARCHIVED_FILES",
    "Marked",
    "RatioResult",
    "ScoreboardError",
    "archive",
    "band_range",
    "counted",
    "find_marked",
    "headline_counted",
    "headline_table",
    "headline_within",
    "headlines",
    "read_marker",
    "last_campaign",
    "measure_ratio",
    "ratio_result",
    "scoreboard",
    "steadiness",
]

#: the measurement protocol of a headline ratio (see the module doc): repeats, warm-up and
#: measured iterations of every compared run, and how far the ratio may move at twice the dilation
MIN_REPEATS, MIN_WARMUP, MIN_MEASURED, DILATION_TOLERANCE = 3, 2, 5, 0.05
PROTOCOL = (
    f"at least {MIN_REPEATS} repeats; every compared run with at least {MIN_WARMUP} warm-up and "
    f"{MIN_MEASURED} measured iterations, and steady (the median iteration time of the later half of its "
    f"measured iterations within {STEADY_TOLERANCE:.0%} of the earlier half's, or within the 95 % confidence "
    f"half-width of its mean; a run that warms up until steady, workload.max_warmup_iterations, is measured "
    f"over the first window that had); the variants of a repeat at one dilation; the ratio at twice the "
    f"dilation within {DILATION_TOLERANCE:.0%} (the dilation check); a campaign run over several sittings "
    f"executing the same code, each repeat once"
)

#: what :func:`archive` keeps of a marked sweep (its own files, then each run's)
ARCHIVED_FILES = (MARKER, "sweep.csv", "sweep.yaml")
ARCHIVED_RUN_FILES = ("spec.yaml", "summary.json", "iterations.csv")


class ScoreboardError(TestbedError):
    """A marked directory cannot be read, a headline selector does not pick exactly one row,
    or :func:`archive` would overwrite a different earlier copy."""


@dataclass(frozen=True)
class Marked:
    """One directory ``testbed reproduce`` made: ``path`` and its marker's fields."""

    path: Path
    id: str
    mode: str
    repeat: int
    repeats: int
    started: str
    finished: str
    dilation: int = 1
    overrides: tuple[str, ...] | None = None
    """The ``--set`` overrides it was run with (None: the marker records none)."""
    spec: str | None = None
    """The spec it ran, relative to the repository root (None: the marker records none)."""
    code: str | None = None
    """The digest of the code and inputs its runs executed (``testbed.reproduce.run_code_digest``;
    None: the marker records none)."""

    @property
    def date(self) -> str:
        return self.finished[:10]

    def is_headline_of(self, entry: Entry) -> bool:
        """Whether this is a headline sweep of ``entry`` run with the entry's headline
        overrides as the catalogue states them now (then, as ``testbed reproduce`` adds it,
        possibly one ``scale=`` override: the one dilation of all its points)."""
        if self.id != entry.id or self.mode != "headline" or entry.headline is None or self.overrides is None:
            return False
        over, want = list(self.overrides), entry.overrides(headline=True)
        return over == want or (over[:-1] == want and over[-1].startswith("scale="))

    def measures(self, entry: Entry) -> bool:
        """Whether this directory holds ``entry``'s values: it was marked for ``entry``, or it
        is a full run of ``entry``'s own command (the same spec and the same overrides) marked
        for another entry. One sweep draws every figure of its command: Stanza's speed-up sweep
        gives Fig. 6a, 6b, 6c and 7 alike."""
        if self.id == entry.id:
            return True
        return (
            self.mode == "full"
            and entry.spec is not None
            and self.spec == entry.spec.path
            and self.overrides is not None
            and list(self.overrides) == entry.overrides()
        )


def find_marked(root: str | Path) -> list[Marked]:
    """The marked directories under ``root`` (``root`` itself and its subdirectories, one
    level), sorted by name (the runner's names sort by time).

    Raises:
        ScoreboardError: ``root`` is not a directory, or a marker is unreadable or lacks a field.
    """
    root = Path(root)
    if not root.is_dir():
        raise ScoreboardError(f"{root}: not a directory (give the runs directory, or reproduction/runs)")
    return [m for m in map(read_marker, [root] + sorted(p for p in root.iterdir() if p.is_dir())) if m is not None]


def read_marker(d: str | Path) -> Marked | None:
    """The marker of directory ``d``, or None when ``d`` has none.

    Raises:
        ScoreboardError: the marker is unreadable or lacks a field.
    """
    d = Path(d)
    f = d / MARKER
    if not f.is_file():
        return None
    try:
        m = json.loads(f.read_text())
        over = m.get("overrides")
        return Marked(
            d,
            m["id"],
            m["mode"],
            int(m["repeat"]),
            int(m["repeats"]),
            m["started"],
            m["finished"],
            int(m.get("dilation", 1)),
            None if over is None else tuple(str(o) for o in over),
            None if m.get("spec") is None else str(m["spec"]),
            None if m.get("code") is None else str(m["code"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ScoreboardError(f"{f}: not a readable marker ({type(e).__name__}: {e})") from None


def _rows(sweep_dir: Path) -> pd.DataFrame:
    f = sweep_dir / "sweep.csv"
    if not f.is_file():
        raise ScoreboardError(f"{sweep_dir}: no sweep.csv (a headline run is a sweep of its variants)")
    return read_sweep_csv(f, dtype=str, keep_default_na=False)


def _text(v) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _pick(rows: pd.DataFrame, selector: dict, sweep_dir: Path, what: str) -> pd.Series:
    mask = pd.Series(True, index=rows.index)
    for col, want in selector.items():
        if col not in rows.columns:
            raise ScoreboardError(
                f"{sweep_dir}: the {what} selects on column {col!r}, which sweep.csv lacks "
                f"(columns: {', '.join(rows.columns)})"
            )
        mask &= rows[col].map(lambda c: _same(c, want))
    hit = rows[mask]
    if len(hit) != 1:
        raise ScoreboardError(f"{sweep_dir}: the {what} {selector} matches {len(hit)} rows of sweep.csv, not one")
    return hit.iloc[0]


def _same(cell: str, want) -> bool:
    if cell == _text(want):
        return True
    try:
        return float(cell) == float(want)
    except (TypeError, ValueError):
        return False


def _float(row: pd.Series, col: str) -> float:
    try:
        return float(row[col])
    except (KeyError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Measurement:
    """One headline ratio in one marked sweep."""

    ratio: float
    numerator: float
    denominator: float
    numerator_spread95: float
    """1.96 sd of the numerator's iterations (``{metric}_spread95``; NaN without it)."""
    denominator_spread95: float
    """The same of the denominator's."""
    flagged: bool
    ok: bool
    run_dirs: tuple[Path, Path]


def _summary(run_dir: Path) -> RunSummary:
    """The run's summary as the current definitions give it (:func:`analysis.metrics.refigured_summary`).

    Raises:
        FileNotFoundError: no ``summary.json``; TestbedError, OSError, ValueError: as
        :func:`~analysis.metrics.refigured_summary`.
    """
    s = refigured_summary(run_dir)
    if s is None:
        raise FileNotFoundError(f"{run_dir / 'summary.json'}: no such file")
    return s


def _samples_per_s(row: pd.Series, run_dir: Path) -> tuple[float, float]:
    """A sweep row's samples/s and its spread95: recomputed from the run's ``iterations.csv``
    by the current definition (:func:`_summary`) when the run has one, else ``sweep.csv``'s."""
    if (run_dir / "iterations.csv").is_file():
        try:
            tp = _summary(run_dir).throughput
        except (TestbedError, OSError, ValueError):
            return math.nan, math.nan
        if tp is None or tp.mean is None:
            return math.nan, math.nan
        return float(tp.mean), math.nan if tp.spread95 is None else float(tp.spread95)
    return _float(row, "samples_per_s"), _float(row, "samples_per_s_spread95")


def measure_ratio(ratio: Ratio, sweep_dir: str | Path) -> Measurement:
    """``ratio`` in one marked sweep: its metric of the numerator's row over the denominator's
    (each from the run's ``iterations.csv`` when it has one, :func:`_samples_per_s`).

    Raises:
        ScoreboardError: no ``sweep.csv``, a selector that does not match exactly one row.
    """
    sweep_dir = Path(sweep_dir)
    rows = _rows(sweep_dir)
    num = _pick(rows, ratio.numerator, sweep_dir, "numerator")
    den = _pick(rows, ratio.denominator, sweep_dir, "denominator")
    dirs = tuple(sweep_dir / Path(str(r.get("run_dir", ""))).name for r in (num, den))
    (a, a95), (b, b95) = (_samples_per_s(r, d) for r, d in zip((num, den), dirs))
    flagged = any(str(r.get(c, "")).lower() == "true" for r in (num, den) for c in ("cpu_starved", "host_cost_overrun"))
    ok = all(r.get("status", "ok") == "ok" for r in (num, den)) and b > 0 and math.isfinite(a)
    return Measurement(a / b if ok else math.nan, a, b, a95, b95, flagged, ok, dirs)


@dataclass(frozen=True)
class RatioResult:
    """A headline ratio over the marked sweeps of its entry: ``measurements`` at the
    headline's dilation, ``checks`` at twice it (its dilation check; empty when not run)."""

    entry: Entry
    ratio: Ratio
    marked: list[Marked]
    measurements: list[Measurement]
    checks: tuple[Measurement, ...] = ()
    check_marked: tuple[Marked, ...] = ()

    @property
    def values(self) -> list[float]:
        return [m.ratio for m in self.measurements if m.ok]

    @property
    def median(self) -> float:
        return median(self.values) if self.values else math.nan

    @property
    def check_values(self) -> list[float]:
        return [m.ratio for m in self.checks if m.ok]

    @property
    def moved(self) -> float:
        """How far the median ratio at twice the dilation is from the one at the headline's
        dilation (``check / base - 1``); NaN without both."""
        if not self.values or not self.check_values:
            return math.nan
        return median(self.check_values) / self.median - 1

    @property
    def to_paper(self) -> float:
        """The median over the paper's ratio (over the nearer end of its range; 1.0 inside it)."""
        lo, hi = self.ratio.paper[0], self.ratio.paper[-1]
        m = self.median
        return 1.0 if lo <= m <= hi else m / (lo if m < lo else hi)

    @property
    def within(self) -> bool:
        return bool(self.values) and abs(self.to_paper - 1) <= TOLERANCE

    @property
    def distinguishable(self) -> bool | None:
        v = self.values
        if not v:
            return None
        if len(v) > 1:
            return min(v) > 1 or max(v) < 1
        m = next(m for m in self.measurements if m.ok)
        if math.isnan(m.numerator_spread95) or math.isnan(m.denominator_spread95):
            return None
        return (
            m.numerator - m.numerator_spread95 > m.denominator + m.denominator_spread95
            or m.numerator + m.numerator_spread95 < m.denominator - m.denominator_spread95
        )


def steadiness(run_dir: str | Path, span: tuple[int, int | None] | None = None) -> tuple[float, float] | None:
    """How far the iteration time of the run in ``run_dir`` moved within its measured
    iterations, and its noise: :func:`analysis.metrics.iteration_drift` over the iterations of
    its ``iterations.csv`` in ``span`` (default: the run's, :func:`analysis.load.measured_span`
    of its ``spec.yaml`` and ``summary.json``); the run is steady when
    :func:`analysis.metrics.steady` holds for the pair.

    Returns:
        ``(drift, noise)``, fractions; None without ``iterations.csv`` or with under 4
        measured iterations in it.

    Raises:
        TestbedError: ``spec.yaml`` unreadable (only when ``span`` is not given).
        OSError, ValueError: ``iterations.csv`` or ``summary.json`` unreadable.
    """
    run_dir = Path(run_dir)
    f = run_dir / "iterations.csv"
    if not f.is_file():
        return None
    if span is None:
        s = run_dir / "summary.json"
        span = measured_span(read_spec(run_dir), refigured_summary(run_dir) if s.is_file() else None)
    first, stop = span
    return iteration_drift(
        measured_iterations(global_iterations(pd.read_csv(f)), first, None if stop is None else stop - first)
    )


def _settled_by_spread(summary: RunSummary) -> bool | None:
    """Whether a run with no iteration times to test had settled, from its summary alone:
    True when the samples/s of every measured iteration is within
    :data:`analysis.metrics.STEADY_TOLERANCE` of every other's (then no drift can exceed it);
    None (not known) otherwise: a wider spread may be noise or drift."""
    t = summary.throughput
    spread = None if t is None or not t.min or t.max is None else (t.max - t.min) / t.min
    return True if spread is not None and spread <= STEADY_TOLERANCE else None


def settled(
    run_dir: str | Path, spec: dict | None = None, summary: RunSummary | None = None
) -> tuple[tuple[float, float] | None, bool | None]:
    """Whether the run in ``run_dir`` had settled by the protocol's rule.

    From its ``iterations.csv`` (:func:`steadiness` over :func:`analysis.load.measured_span`
    of ``spec`` and ``summary``, read from the run when not given); without one, or with under
    4 measured iterations in it, from the spread of its measured iterations' samples/s (steady
    within :data:`analysis.metrics.STEADY_TOLERANCE`, else not known).

    Returns:
        ``(moved, verdict)``: :func:`steadiness`'s ``(drift, noise)`` or None when there were
        no iteration times to test; True (steady), False (not) or None (not known).

    Raises:
        TestbedError: ``spec.yaml`` unreadable; OSError, ValueError: ``summary.json`` or
        ``iterations.csv`` unreadable.
    """
    run_dir = Path(run_dir)
    spec = read_spec(run_dir) if spec is None else spec
    summary = _summary(run_dir) if summary is None else summary
    moved = steadiness(run_dir, measured_span(spec, summary))
    if moved is not None:
        return moved, steady(*moved)
    return None, _settled_by_spread(summary)


def _run_problems(ms, what: str) -> tuple[list[str], list[int], list[int]]:
    """The compared runs of ``ms`` (ok measurements): unreadable ones, variants of one
    repeat at different dilations, runs that had not settled and runs whose steadiness is not
    known (phrases naming ``what``), with every run's warm-up and measured iterations."""
    out, warm, measured, mixed, moved, unknown = [], [], [], set(), [], 0
    for m in ms:
        scales = []
        for d in m.run_dirs:
            try:
                spec, summary = read_spec(d), _summary(d)
                span = measured_span(spec, summary)
                found, verdict = settled(d, spec, summary)
            except (TestbedError, OSError, ValueError):
                out.append(f"{d.name} unreadable")
                continue
            warm.append(span[0])
            measured.append(int(summary.measured_iterations or 0))
            scales.append(spec.get("scale"))
            if verdict is None:
                unknown += 1
            elif not verdict:
                moved.append(found[0])
        if len(set(map(str, scales))) > 1:
            mixed.add(" and ".join(f"{s:g}" if isinstance(s, (int, float)) else str(s) for s in scales))
    if mixed:
        out.append(f"variants at different dilations{what} ({'; '.join(sorted(mixed))})")
    if moved:
        worst = max(moved, key=abs)
        out.append(
            f"{len(moved)} run{'s' if len(moved) != 1 else ''}{what} not steady (the iteration time moved "
            f"{worst:+.1%} within the measured iterations)"
        )
    if unknown:
        out.append(
            f"steadiness of {unknown} run{'s' if unknown != 1 else ''}{what} not known (no iteration times to "
            f"test, samples/s spread over {STEADY_TOLERANCE:.0%})"
        )
    return out, warm, measured


def _campaign_problems(res: RatioResult) -> list[str]:
    """A campaign pooled from several sittings (``testbed reproduce --from-repeat``) holds only
    when every run executed the same code and each repeat ran once: phrases for what does not."""
    out = []
    runs = list(res.marked) + list(res.check_marked)
    codes = {m.code for m in runs}
    if len(codes) > 1:
        out.append(
            f"its runs executed {len(codes)} versions of the code"
            if None not in codes
            else "the code of some runs is not recorded"
        )
    for what, ms in (("", res.marked), (" in the dilation check", res.check_marked)):
        twice = sorted({m.repeat for m in ms if sum(o.repeat == m.repeat for o in ms) > 1})
        if twice:
            out.append(f"repeat {', '.join(map(str, twice))} run more than once{what}")
    return out


def protocol_problems(res: RatioResult) -> list[str]:
    """Where the measurement of ``res`` falls short of :data:`PROTOCOL`, one phrase each
    (empty: it holds), from each compared run's ``spec.yaml`` and ``summary.json`` (those of
    its dilation check too)."""
    ok = [m for m in res.measurements if m.ok]
    out = []
    if len(ok) < MIN_REPEATS:
        out.append(f"{len(ok)} repeat{'s' if len(ok) != 1 else ''} (at least {MIN_REPEATS})")
    problems, warm, measured = _run_problems(ok, "")
    checked, cwarm, cmeasured = _run_problems([m for m in res.checks if m.ok], " in the dilation check")
    warm, measured = warm + cwarm, measured + cmeasured
    if warm and min(warm) < MIN_WARMUP:
        out.append(f"{min(warm)} warm-up iteration{'s' if min(warm) != 1 else ''} (at least {MIN_WARMUP})")
    if measured and min(measured) < MIN_MEASURED:
        out.append(f"{min(measured)} measured iterations (at least {MIN_MEASURED})")
    out += problems + checked + _campaign_problems(res)
    if not res.checks:
        out.append("no dilation check")
    elif not res.check_values:
        out.append("no ok run in the dilation check")
    else:
        n = len(res.check_values)
        if n < MIN_REPEATS:
            out.append(f"{n} repeat{'s' if n != 1 else ''} in the dilation check (at least {MIN_REPEATS})")
        if abs(res.moved) > DILATION_TOLERANCE:
            out.append(f"the ratio moves {res.moved:+.1%} at twice the dilation (at most {DILATION_TOLERANCE:.0%})")
    return out


def counted(res: RatioResult) -> bool:
    """Whether ``res``, a headline of its own, counts toward the verdict (:func:`headline_counted`)."""
    return headline_counted((res,))


def headlines(results: list[RatioResult]) -> list[tuple[RatioResult, ...]]:
    """``results`` grouped into headlines, in order: the two ends of a band
    (:attr:`analysis.reproduction.Ratio.band`, ``low`` then ``high`` of one entry) one
    headline, every other ratio one of its own."""
    out, i = [], 0
    while i < len(results):
        r = results[i]
        nxt = results[i + 1] if i + 1 < len(results) else None
        if r.ratio.band == "low" and nxt is not None and nxt.entry is r.entry and nxt.ratio.band == "high":
            out.append((r, nxt))
            i += 2
        else:
            out.append((r,))
            i += 1
    return out


def band_range(group: tuple[RatioResult, ...]) -> tuple[float, float] | None:
    """The lowest and the highest median of a headline's ratios; None unless every one was measured."""
    if not all(r.values for r in group):
        return None
    meds = [r.median for r in group]
    return min(meds), max(meds)


def headline_within(group: tuple[RatioResult, ...]) -> bool:
    """Whether a headline (:func:`headlines`) is within tolerance: one ratio as
    :attr:`RatioResult.within`; a band when both ends were measured and the range of their
    medians reaches within :data:`analysis.reproduction.TOLERANCE` of the paper's ratio (of
    its range): ``high >= paper_low * (1 - TOLERANCE)`` and ``low <= paper_high * (1 +
    TOLERANCE)``, the rule of one ratio applied to a range."""
    if len(group) == 1:
        return group[0].within
    span = band_range(group)
    if span is None:
        return False
    paper = group[0].ratio.paper
    return span[1] >= paper[0] * (1 - TOLERANCE) and span[0] <= paper[-1] * (1 + TOLERANCE)


def headline_counted(group: tuple[RatioResult, ...]) -> bool:
    """Whether a headline counts toward the verdict: within (:func:`headline_within`), on the
    paper's own setting, and every ratio of it measured by the protocol."""
    return (
        headline_within(group) and not group[0].ratio.setting_differs and not any(protocol_problems(r) for r in group)
    )


def ratio_result(entry: Entry, ratio: Ratio, marked: list[Marked]) -> RatioResult:
    """``ratio`` measured in each of ``marked`` (the entry's headline sweeps: those at
    dilation 1 are its measurements, the others its dilation check)."""
    base = [m for m in marked if m.dilation == 1]
    check = [m for m in marked if m.dilation != 1]
    return RatioResult(
        entry,
        ratio,
        base,
        [measure_ratio(ratio, m.path) for m in base],
        tuple(measure_ratio(ratio, m.path) for m in check),
        tuple(check),
    )


def _paper(r: Ratio) -> str:
    return f"{r.paper[0]:.2f}" if len(r.paper) == 1 else f"{r.paper[0]:.2f}-{r.paper[1]:.2f}"


def _setting(res: RatioResult) -> str:
    """The host and compute profiles, scale, host link rate and TCP congestion control of the
    runs compared (each distinct value once, in order). A spec whose
    ``topology.tcp_congestion_control`` is null or absent ran under the machine's default."""
    seen: dict[str, None] = {}
    for m in res.measurements:
        for d in m.run_dirs:
            try:
                s = read_spec(d)
            except TestbedError:
                continue
            comp = s.get("workload", {}).get("compute", {}) or {}
            prof = comp.get("profile")
            prof = Path(prof).stem if isinstance(prof, str) and prof.endswith(".json") else prof
            host = (s.get("host") or {}).get("profile")
            topo = s.get("topology") or {}
            bw, cc = topo.get("host_bw_mbps"), topo.get("tcp_congestion_control")
            scale = s.get("scale")
            parts = [
                f"host {host}",
                f"compute {comp.get('mode')}" + (f" {prof}" if prof else ""),
                f"scale {scale:g}" if isinstance(scale, (int, float)) else f"scale {scale}",
                f"{bw / 1000:g} Gbit/s" if isinstance(bw, (int, float)) else "host link ?",
                f"TCP {cc}" if isinstance(cc, str) and cc else "TCP the machine's default",
            ]
            seen[", ".join(parts)] = None
    return "; ".join(seen) or "?"


def _band_within(group: tuple[RatioResult, ...]) -> str:
    """The *within* cell of a band's ends: the band's verdict, with the range it is judged by."""
    span = band_range(group)
    if span is None:
        return "no (one headline with the other end of the band, which has no ok run)"
    return (
        f"{'yes' if headline_within(group) else 'no'} (one headline with the other end of the band: "
        f"{span[0]:.2f}-{span[1]:.2f} {'reaches' if headline_within(group) else 'does not reach'} "
        f"within +-{TOLERANCE * 100:.0f} % of the paper's)"
    )


def _cells(res: RatioResult, group: tuple[RatioResult, ...] | None = None) -> list[str]:
    """The cells of ``res``'s row after the paper's ratio; ``group``: the headline it belongs
    to (:func:`headlines`; default: itself alone)."""
    v = res.values
    group = group or (res,)
    if not res.marked:
        measured, to_paper, within, dist = "not run with the catalogue's headline overrides", "-", "-", "-"
    elif not v:
        measured, to_paper, within, dist = "no ok run", "-", "-", "-"
    else:
        spread = f" ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else ""
        measured = f"{res.median:.2f}{spread}, {len(v)} run{'s' if len(v) > 1 else ''}"
        to_paper = f"{res.to_paper:.2f}"
        within = ("yes" if res.within else "no") if len(group) == 1 else _band_within(group)
        if res.ratio.setting_differs:
            within += f" (a comparison, not counted: the setting differs: {res.ratio.setting_differs})"
        d = res.distinguishable
        dist = "?" if d is None else "yes" if d else "no"
    flagged = sum(m.flagged for m in res.measurements)
    if flagged:
        measured += f", {flagged} flagged"
    dates = sorted({m.date for m in res.marked + list(res.check_marked)})
    date = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else "-"
    runs = "<br>".join(f"`{m.path.name}`" for m in res.marked) + "".join(
        f"<br>`{m.path.name}` ({m.dilation}x the dilation)" for m in res.check_marked
    )
    protocol = "holds" if not protocol_problems(res) else "; ".join(protocol_problems(res))
    return [
        measured,
        to_paper,
        within,
        dist,
        _check_cell(res),
        protocol,
        _setting(res) if res.marked else "-",
        runs,
        date,
    ]


def _check_cell(res: RatioResult) -> str:
    """The dilation check: the median (range) at twice the dilation, and how far it moved."""
    v = res.check_values
    if not v:
        return "not run" if not res.checks else "no ok run"
    spread = f" ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else ""
    moved = f", {res.moved:+.1%}" if math.isfinite(res.moved) else ""
    return f"{median(v):.2f}{spread}, {len(v)} run{'s' if len(v) > 1 else ''}{moved}"


_HEAD = [
    "paper's ratio",
    "measured: median (range), runs",
    "measured / paper",
    "within +-25 %",
    "distinguishable",
    "at twice the dilation: median (range), runs, moved",
    "protocol (what falls short)",
    "setting (host, compute, scale, host link, TCP)",
    "run directories",
    "date",
]


def _table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def _results(entries: list[Entry], marked: list[Marked]) -> list[RatioResult]:
    out = []
    for e in entries:
        if e.headline is None:
            continue
        mine = last_campaign([m for m in marked if m.is_headline_of(e)])
        out += [ratio_result(e, r, mine) for r in e.headline.ratios]
    return out


def last_campaign(marked: list[Marked]) -> list[Marked]:
    """The last set of repeats among ``marked`` (one entry's headline sweeps, in time order):
    from its last first repeat at the headline's dilation on. An earlier set was run by other
    code or another host model, so its runs are not pooled with the new ones."""
    firsts = [i for i, m in enumerate(marked) if m.repeat == 1 and m.dilation == 1]
    return marked[firsts[-1] :] if firsts else list(marked)


def headline_table(entry: Entry, sweep_dirs: list[str | Path]) -> str:
    """The markdown table of ``entry``'s headline ratios over ``sweep_dirs`` (what
    ``testbed reproduce ID --headline --repeat N`` prints after its runs).

    Raises:
        ScoreboardError: as :func:`measure_ratio`; ``entry`` has no headline.
    """
    if entry.headline is None:
        raise ScoreboardError(f"{entry.id} has no headline ratios")
    dirs = [Path(d) for d in sweep_dirs]
    marked = [m for d in dirs for m in find_marked(d) if m.path == d] or [
        Marked(d, entry.id, "headline", 1, 1, "", "") for d in dirs
    ]
    results = [ratio_result(entry, r, marked) for r in entry.headline.ratios]
    rows = [
        [
            res.ratio.claim + (f" (sensitivity: {res.ratio.sensitivity})" if res.ratio.sensitivity else ""),
            _paper(res.ratio),
        ]
        + _cells(res, g)
        for g in headlines(results)
        for res in g
    ]
    return _table(["ratio"] + _HEAD, rows)


def _paper_text(e: Entry) -> str:
    if not e.paper_values:
        return "(states no value: " + " ".join((e.paper_values_note or "").split()) + ")"
    return "<br>".join(f"{pv.value} ({pv.where})" for pv in e.paper_values)


def _short(value: str) -> str:
    """A swept value as the table shows it: a file path by its name without suffix."""
    return Path(value).stem if value.endswith((".json", ".yaml")) else value


def _has_values(m: Marked) -> bool:
    """Whether a marked directory holds a value: some run of it finished ok with a throughput."""
    try:
        rows = _rows(m.path)
    except ScoreboardError:
        return False
    return any(r.get("status") == "ok" and math.isfinite(_float(r, "samples_per_s")) for _, r in rows.iterrows())


def _sweep_summary(m: Marked) -> str:
    """samples/s of every row of a marked sweep (:func:`_samples_per_s`), ``variant@point: value``."""
    try:
        rows = _rows(m.path)
    except ScoreboardError:
        return "(no sweep.csv)"
    fixed = {"variant", *SWEEP_FIGURES, *SWEEP_RENAMED}
    swept = [
        c
        for c in rows.columns
        if c not in fixed
        and not c.startswith("workload.scheme")
        and not c.startswith("workload.options")
        and not c.startswith("workload.servers")
        and not c.startswith("host.")
    ]
    parts = []
    for _, r in rows.iterrows():
        point = ",".join(f"{c.split('.')[-1]}={_short(r[c])}" for c in swept if r[c] != "")
        name = r.get("variant", "") or "run"
        val = _samples_per_s(r, m.path / Path(str(r.get("run_dir", ""))).name)[0]
        parts.append(
            f"{name}{'@' + point if point else ''} {val:.1f}"
            if r.get("status") == "ok" and math.isfinite(val)
            else f"{name}{'@' + point if point else ''} {r.get('status')}"
        )
    return "samples/s: " + "; ".join(parts)


def scoreboard(root: str | Path, entries: list[Entry] | None = None, command: str | None = None) -> str:
    """``REPRODUCTION.md``: the headline table (each paper's headline first), the sensitivity
    table, then one row per catalogue entry, all from the marked directories under ``root``.

    Deterministic: the same directories give the same bytes (no clock is read; directories
    and entries in sorted or catalogue order).

    Raises:
        ScoreboardError: as :func:`find_marked` and :func:`measure_ratio`.
        CatalogueError: the catalogue is malformed (``entries`` not given).
    """
    entries = load_catalogue() if entries is None else entries
    marked = find_marked(root)
    command = command or f"testbed reproduce --scoreboard {root} > REPRODUCTION.md"
    results = _results(entries, marked)
    groups = headlines([r for r in results if not r.ratio.sensitivity])
    sens = [r for r in results if r.ratio.sensitivity]
    within = sum(headline_within(g) for g in groups)
    differs = sum(headline_within(g) and bool(g[0].ratio.setting_differs) for g in groups)
    measured = sum(all(r.values for r in g) for g in groups)
    n_counted = sum(headline_counted(g) for g in groups)
    bands = sum(len(g) > 1 for g in groups)
    out = [
        "# Reproduction scoreboard",
        "",
        f"Generated by `{command}` from the run directories that `testbed reproduce` marked "
        f"(`{MARKER}`) under `{root}`, and from the catalogue (`analysis/data/reproduction.yaml`). "
        "Do not edit it by hand: re-run the command.",
        "",
        f"A measured ratio is within tolerance when it lies within +-{TOLERANCE * 100:.0f} % of the paper's "
        "(of the nearer end when the paper gives a range). Each ratio is the median over the repeats of its "
        "headline run (`testbed reproduce ID --headline --repeat 3`), with the range over the repeats. "
        "Two variants are distinguishable when the range excludes 1.0. A flagged run was CPU-starved or overran "
        "its host-cost model: its figure is not trustworthy.",
        "",
        "A headline is one ratio, or the two ends of a band: a setting the paper does not print but bounds "
        "through its own statements, measured at both ends; a band is within when the range of its two "
        "medians reaches within the tolerance of the paper's ratio.",
        "",
        f"The measurement protocol: {PROTOCOL}. A headline counts only when it is within, on the paper's own "
        "setting, and each of its ratios measured by the protocol.",
        "",
        f"**{n_counted} of {len(groups)} headlines count: within +-{TOLERANCE * 100:.0f} % of the paper's, on "
        f"its setting, by the protocol.** {within} of {len(groups)} are within +-{TOLERANCE * 100:.0f} % as "
        f"measured ({measured} measured"
        + (f"; {differs} of the {within} on a setting that differs from the paper's, see the row" if differs else "")
        + (f"; {bands} of the {len(groups)} a band, two rows" if bands else "")
        + "); the column *protocol* says what each measurement lacks.",
        "",
        "## Headlines",
        "",
        _table(
            ["entry", "headline"] + _HEAD,
            [
                [f"`{r.entry.id}`", r.ratio.claim + f" ({r.ratio.where})", _paper(r.ratio)] + _cells(r, g)
                for g in groups
                for r in g
            ],
        ),
        "",
    ]
    if sens:
        out += [
            "## Sensitivity to settings the paper does not fix",
            "",
            _table(
                ["entry", "ratio", "setting changed"] + _HEAD,
                [[f"`{r.entry.id}`", r.ratio.claim, r.ratio.sensitivity, _paper(r.ratio)] + _cells(r) for r in sens],
            ),
            "",
        ]
    out += ["## Headline runs: what they keep of the paper's setting", ""]
    out += [f"- `{e.id}`: " + " ".join(e.headline.note.split()) for e in entries if e.headline is not None]
    out += [
        "",
        "## Every figure and table",
        "",
        "Status and reason are the catalogue's; *measured here* lists what the marked directories hold "
        "(the last marked sweep of each mode; a headline sweep run with other overrides than the "
        "catalogue's headline run apart, and left out of the headline ratios).",
        "",
    ]
    rows, carrying = [], 0
    for e in entries:
        mine = [m for m in marked if m.measures(e)]
        carrying += any(_has_values(m) for m in mine)
        if mine:
            last = {}
            for m in mine:
                other = m.mode == "headline" and not m.is_headline_of(e)
                shared = f" (the run of `{m.id}`, the same command)" if m.id != e.id else ""
                last[m.mode + (" with other overrides than the catalogue's headline" if other else "") + shared] = m
            meas = "<br>".join(
                f"{mode} (`{m.path.name}`, {m.date}): {_sweep_summary(m)}" for mode, m in sorted(last.items())
            )
        else:
            meas = "not run under " + f"`{root}`"
        why = "" if e.status == "reproduced" else " ".join((e.reason or "").split())
        rows.append([f"`{e.id}`", e.title, _paper_text(e), meas, e.status, why])
    out.append(
        _table(["id", "what it shows", "the paper states", "measured here", "status", "why not (further)"], rows)
    )
    counts = {s: sum(e.status == s for e in entries) for s in STATUSES}
    per_paper = ", ".join(f"{p} {sum(e.paper == p for e in entries)}" for p in PAPERS)
    out += [
        "",
        f"{len(entries)} figures and tables ({per_paper}); status: "
        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        + f". {carrying} of {len(entries)} carry values "
        "measured here (a marked directory of their own, or of an entry with the same command, with at least one "
        "run that finished ok).",
        "",
    ]
    return "\n".join(out)


def archive(runs_dir: str | Path, dest: str | Path) -> list[Path]:
    """Copy the small files of every marked directory under ``runs_dir`` into ``dest`` (the
    marker, ``sweep.csv``, ``sweep.yaml``, and each run's ``spec.yaml``, ``summary.json`` and
    ``iterations.csv``),
    keeping the directory names, so that :func:`scoreboard` gives the same result from
    ``dest``. Never overwrites: a file already in ``dest`` with the same content is left, one
    with other content is an error (nothing is copied then).

    Returns:
        the directories created or completed under ``dest``.

    Raises:
        ScoreboardError: as :func:`find_marked`; a different file is already in ``dest``.
    """
    runs_dir, dest = Path(runs_dir), Path(dest)
    plan: list[tuple[Path, Path]] = []
    for m in find_marked(runs_dir):
        if m.path == runs_dir:
            continue
        files = [m.path / f for f in ARCHIVED_FILES if (m.path / f).is_file()]
        for run in sorted(p for p in m.path.iterdir() if p.is_dir()):
            files += [run / f for f in ARCHIVED_RUN_FILES if (run / f).is_file()]
        plan += [(f, dest / f.relative_to(runs_dir)) for f in files]
    clash = [str(d) for s, d in plan if d.exists() and not filecmp.cmp(s, d, shallow=False)]
    if clash:
        raise ScoreboardError(
            f"{len(clash)} files in {dest} differ from the runs' and would be overwritten "
            f"(nothing copied): {', '.join(clash[:5])}"
        )
    made = []
    for s, d in plan:
        if d.exists():
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)
        top = dest / s.relative_to(runs_dir).parts[0]
        if top not in made:
            made.append(top)
    return made
