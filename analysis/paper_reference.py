"""The paper's headline ratios that apply to a sweep, for drawing them on its figures.

    from analysis.paper_reference import paper_ratios
    for r in paper_ratios(["runs/p3_resnet50-<ts>"]):
        r.label, r.reference(y_of_p3_run)     # "paper: p3 1.26x baseline", (lo, hi)

A sweep directory belongs to a catalogue entry (:mod:`analysis.reproduction`) when
``testbed reproduce`` marked it (``reproduce.json`` names the entry) or, unmarked, when its
``sweep.yaml`` ``name`` is the stem of the entry's spec file (every spec under
``experiments/`` is named after its file). Each of the entry's headline ratios
(:class:`analysis.reproduction.Ratio`, the paper's number as ``[x]`` or ``[low, high]``)
applies when its numerator and its denominator each select exactly one ``ok`` row of the
sweep's ``sweep.csv`` (:func:`analysis.scoreboard.measure_ratio`), the rows restricted to the
headline run's own sweep point where its overrides fix one (``sweep={field: [value]}``) and
the sweep has that column: a full sweep of every bandwidth is read at the bandwidth the
paper's number is about. Ratios marked ``sensitivity`` (the headline at another value of a
setting the paper does not fix) are left out: they restate the same paper value.

A figure draws the paper's value where the numerator's value would be if its ratio to the
denominator were the paper's (:meth:`PaperRatio.reference`), in the figure's own units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from analysis.reproduction import Entry, Ratio, load_catalogue
from analysis.scoreboard import ScoreboardError, measure_ratio, read_marker
from traffic.rundir import is_sweep, read_sweep_spec

__all__ = ["PaperRatio", "paper_ratios", "sweep_entries"]


@dataclass(frozen=True)
class PaperRatio:
    """One headline ratio of the catalogue as it applies to one sweep."""

    entry: str
    """The catalogue entry's id, e.g. ``p3.fig7a``."""
    claim: str
    """The ratio in words (the catalogue's ``claim``)."""
    paper: tuple[float, float]
    """The paper's ratio as ``(low, high)``; ``low == high`` for one number."""
    numerator: str
    """The numerator's name: its selector's ``variant``, else its selected values joined."""
    denominator: str
    """The denominator's name, as :attr:`numerator`."""
    numerator_run: Path
    """The run directory of the numerator's row."""
    denominator_run: Path
    """The run directory of the denominator's row."""
    measured: float
    """The ratio measured in this sweep (``samples_per_s`` of the two rows), > 0."""
    setting_differs: bool = False
    """The catalogue says this setting differs from the paper's (the value is a comparison)."""

    @property
    def label(self) -> str:
        """The legend text: ``paper: p3 1.26x baseline`` (a range ``2-3.2x``), with ``(other
        setting)`` when :attr:`setting_differs`."""
        lo, hi = self.paper
        value = f"{lo:g}x" if lo == hi else f"{lo:g}-{hi:g}x"
        return f"paper: {self.numerator} {value} {self.denominator}" + (
            " (other setting)" if self.setting_differs else ""
        )

    def reference(self, numerator_value: float, inverse: bool = False) -> tuple[float, float]:
        """Where the numerator would be, in a figure's units, if its ratio were the paper's.

        Args:
            numerator_value: the numerator run's value in the figure (samples/s, a speedup, a
                time, ...).
            inverse: the figure's quantity falls as throughput rises (a time per iteration):
                the reference is ``value x measured / paper``; else ``value x paper / measured``.

        Returns:
            ``(low, high)`` in the figure's units, ``low <= high``.
        """
        ends = [numerator_value * (self.measured / p if inverse else p / self.measured) for p in self.paper]
        return min(ends), max(ends)


def _name(selector: dict) -> str:
    return str(selector["variant"]) if "variant" in selector else ", ".join(str(v) for v in selector.values())


@lru_cache(maxsize=1)
def _catalogue() -> tuple[Entry, ...]:
    return tuple(load_catalogue())


def _marker_id(sweep_dir: Path) -> str | None:
    """The catalogue id ``testbed reproduce`` marked ``sweep_dir`` with; None when unmarked
    or the marker is unreadable (the figure is then drawn without the paper's value)."""
    try:
        marker = read_marker(sweep_dir)
    except ScoreboardError:
        return None
    return None if marker is None else marker.id


def sweep_entries(sweep_dir: str | Path, entries: Iterable[Entry] | None = None) -> list[Entry]:
    """The catalogue entries with headline ratios that ``sweep_dir`` belongs to (see the
    module docstring); empty for a directory that is not a sweep."""
    sweep_dir = Path(sweep_dir)
    if not is_sweep(sweep_dir):
        return []
    entries = [e for e in (_catalogue() if entries is None else entries) if e.headline is not None]
    marked = _marker_id(sweep_dir)
    if marked is not None:
        return [e for e in entries if e.id == marked]
    name = read_sweep_spec(sweep_dir).get("name")
    return [e for e in entries if e.spec is not None and name is not None and Path(e.spec.path).stem == str(name)]


def _headline_point(entry: Entry, columns: Iterable[str]) -> dict:
    """The fields the entry's headline overrides sweep over a single value (``sweep={field:
    [value]}``), kept when ``sweep.csv`` has them as columns."""
    point, columns = {}, set(columns)
    for s in entry.headline.set:
        key, _, value = s.partition("=")
        if key.strip() != "sweep":
            continue
        try:
            axes = yaml.safe_load(value)
        except yaml.YAMLError:
            continue
        if isinstance(axes, dict):
            point.update({k: v[0] for k, v in axes.items() if isinstance(v, list) and len(v) == 1 and k in columns})
    return point


def _columns(sweep_dir: Path) -> list[str]:
    try:
        return (sweep_dir / "sweep.csv").read_text().splitlines()[0].split(",")
    except (OSError, IndexError):
        return []


def paper_ratios(paths: Iterable[str | Path], entries: Iterable[Entry] | None = None) -> list[PaperRatio]:
    """Every headline ratio of the catalogue that applies to a sweep among ``paths`` (run
    directories and sweeps without a catalogue entry give none).

    Args:
        paths: run or sweep directories, as given to a report.
        entries: the catalogue (default: the shipped one, loaded once).

    Returns:
        One :class:`PaperRatio` per (sweep, ratio) whose rows are found and whose measured
        ratio is a positive number, in the order of ``paths`` and of the catalogue.
    """
    out = []
    for d in map(Path, paths):
        columns = _columns(d)
        for entry in sweep_entries(d, entries):
            point = _headline_point(entry, columns)
            for ratio in entry.headline.ratios:
                if ratio.sensitivity:
                    continue
                got = _measure(ratio, point, d)
                if got is None:
                    continue
                m, num_run, den_run = got
                lo, hi = ratio.paper[0], ratio.paper[-1]
                out.append(
                    PaperRatio(
                        entry.id,
                        ratio.claim,
                        (lo, hi),
                        _name(ratio.numerator),
                        _name(ratio.denominator),
                        num_run,
                        den_run,
                        m,
                        bool(ratio.setting_differs),
                    )
                )
    return out


def _measure(ratio: Ratio, point: dict, sweep_dir: Path) -> tuple[float, Path, Path] | None:
    """The measured ratio and the two run directories, or None when a selector does not pick
    one row or a row is not ``ok``."""
    restricted = ratio.model_copy(
        update={"numerator": {**point, **ratio.numerator}, "denominator": {**point, **ratio.denominator}}
    )
    try:
        m = measure_ratio(restricted, sweep_dir)
    except ScoreboardError:
        return None
    if not (m.ok and math.isfinite(m.ratio) and m.ratio > 0):
        return None
    return m.ratio, m.run_dirs[0], m.run_dirs[1]
