"""The skeleton of every paper's report, and the registry of reports.

    testbed report PAPER RUN_OR_SWEEP... [--plots DIR] [the paper's own options]
    python -m analysis.<paper>_report ...      (each paper's own command line, kept as an alias)

A report turns run directories (a sweep directory stands for its runs, one per point) into
markdown tables on stdout and, with ``--plots DIR``, PNG figures. Each paper's module
(``analysis/<paper>_report.py``) keeps only its own columns, predictions and figures and
builds on the pieces here:

* finding runs: :func:`traffic.rundir.find_runs` (run and sweep directories, in order) and
  :func:`traffic.rundir.read_spec` (a run's resolved spec as a plain mapping); for a sweep
  whose table starts from the runner's ``sweep.csv`` (the point's swept values, variant and
  headline figures), :func:`sweep_rows` pairs every run directory with its row;
* loading each run's row: :func:`load_rows` (one dict per run -> one frame, runs that cannot
  be read noted and left out);
* ratios to a baseline variant *per point*: :func:`per_point` (a point = the runs that share
  every swept value except the variant);
* fidelity flags: every table row that comes from runs carries a ``flags`` column,
  :func:`fidelity_flags` of its run (from ``summary.json``) or :func:`row_flags` of its
  ``sweep.csv`` row, :func:`union_flags` for a row that compares several runs; a table with
  a flagged row is printed by :func:`flagged_markdown`, which adds :data:`FLAGS_NOTE` under it;
* rendering: :func:`markdown` (``tabulate``'s pipe format, what ``DataFrame.to_markdown``
  gives);
* figures: written by :func:`analysis.plots.save_figure` (the paper modules import
  :mod:`analysis.plots` inside their plotting functions only: it loads matplotlib);
* the registry: :class:`Report` (``table(paths, **opts) -> str``, optional ``plots(paths,
  out_dir, **opts) -> [PNG]``, the paper's own command-line options) and :data:`REPORTS`,
  :func:`get_report`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from analysis.load import read_sweep_csv
from analysis.metrics import MIN_IDLE_PCT
from common.errors import TestbedError
from common.validation import did_you_mean
from traffic.hostmodel.costs import OVERRUN_THRESHOLD
from traffic.rundir import find_runs, is_run
from traffic.summary import SUMMARY_FILE, RunSummary

__all__ = [
    "FLAGS",
    "FLAGS_NOTE",
    "REPORTS",
    "Report",
    "ReportError",
    "UnknownReport",
    "alias",
    "fidelity_flags",
    "flagged_markdown",
    "get_report",
    "load_rows",
    "markdown",
    "per_point",
    "baseline_rows",
    "row_flags",
    "sweep_dirs",
    "sweep_rows",
    "union_flags",
]

#: Every paper's report: name -> the module that defines its ``REPORT`` (a :class:`Report`).
REPORTS = {
    "p3": "analysis.p3_report",
    "phub": "analysis.phub_report",
    "ibatch": "analysis.ibatch_report",
    "stanza": "analysis.stanza_report",
    "pipe_sgd": "analysis.pipe_sgd_report",
}


class UnknownReport(TestbedError):
    """No report of that name (the message lists the known ones)."""


class ReportError(TestbedError):
    """The directories given hold nothing the report can use (e.g. a sweep without ``sweep.csv``,
    no run of the paper's scheme)."""


@dataclass(frozen=True)
class Report:
    """One paper's report.

    Attributes:
        name: its name on the command line (``testbed report NAME``).
        description: one line for ``--help``.
        table: ``table(paths, **opts) -> str``: the text to print (markdown tables and notes)
            for the run and sweep directories ``paths``.
        plots: ``plots(paths, out_dir, **opts) -> list[Path]``: writes the report's figures
            into ``out_dir`` and returns the PNGs; ``None`` if the report has none.
        options: ``options(parser)`` adds the report's own command-line options; their
            values are passed to ``table`` and ``plots`` as keyword arguments (each gets the
            ones its signature names).
        inputs: what the paths are, for ``--help`` (``SWEEP`` for a report per sweep).
        standalone: the ``dest`` of report options that need no run: with one of them set the
            paths may be left out (``table`` and ``plots`` then get ``[]``); without any
            (the default) a report needs at least one path.
    """

    name: str
    description: str
    table: Callable[..., str]
    plots: Callable[..., list] | None = None
    options: Callable[[argparse.ArgumentParser], None] | None = None
    inputs: str = "RUN_OR_SWEEP"
    standalone: tuple[str, ...] = ()

    def _standalone_flags(self) -> str:
        """The :attr:`standalone` options as typed: ``--fig8`` or ``--a-b``."""
        return " or ".join("--" + d.replace("_", "-") for d in self.standalone)

    def parser(self, prog: str | None = None) -> argparse.ArgumentParser:
        """``RUN_OR_SWEEP... [--plots DIR]`` and the report's own options (the paths optional
        when the report has :attr:`standalone` options)."""
        ap = argparse.ArgumentParser(prog=prog or f"testbed report {self.name}", description=self.description)
        what = "sweep directories" if self.inputs == "SWEEP" else "run directories or sweep directories"
        if self.standalone:
            what += f" (none needed with {self._standalone_flags()})"
        ap.add_argument("paths", nargs="*" if self.standalone else "+", metavar=self.inputs, help=what)
        if self.plots is not None:
            ap.add_argument("--plots", metavar="DIR", help="write the report's figures (PNG) into DIR")
        if self.options is not None:
            self.options(ap)
        return ap

    def main(self, argv: Sequence[str], prog: str | None = None, out=None) -> int:
        """Parse ``argv`` with :meth:`parser`, print :attr:`table`, then draw :attr:`plots`
        into ``--plots DIR`` and print ``plot: <png>`` for each.

        Raises:
            TestbedError: a path that is not a run or sweep directory, or nothing to report.
            SystemExit: (status 2, argparse's usage message) bad arguments, or no path and
                none of the :attr:`standalone` options.
        """
        ap = self.parser(prog)
        opts = vars(ap.parse_args(list(argv)))
        paths, plots_dir = opts.pop("paths"), opts.pop("plots", None)
        if not paths and not any(opts.get(d) for d in self.standalone):
            ap.error(f"give {self.inputs} directories or {self._standalone_flags()}")
        print(self.table(paths, **_named(self.table, opts)), file=out or sys.stdout)
        if plots_dir:
            for png in self.plots(paths, Path(plots_dir), **_named(self.plots, opts)):
                print(f"plot: {png}", file=out or sys.stdout)
        return 0


def alias(main: Callable[[], int]) -> int:
    """Run a paper module's own ``main`` (``python -m analysis.<paper>_report``): an error the
    user can cause is printed as one line on stderr, without a traceback, exit status 2 (as
    ``testbed`` does)."""
    try:
        return main()
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _named(fn: Callable, opts: dict) -> dict:
    """The entries of ``opts`` that ``fn`` takes as keyword arguments."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(opts)
    return {k: v for k, v in opts.items() if k in params}


def get_report(name: str) -> Report:
    """The :class:`Report` registered as ``name``.

    The paper's module is imported by name, like a scheme plugin: it builds on this module
    (so this one cannot import it back), and loading it is what pulls in the paper's own
    dependencies (its analytic model; ``traffic.models``, hence torch, for stanza and
    pipe_sgd) only when that report is asked for.

    Raises:
        UnknownReport: no report of that name.
    """
    if name not in REPORTS:
        raise UnknownReport(f"no report {name!r}; the reports are: {', '.join(REPORTS)}{did_you_mean(name, REPORTS)}")
    return importlib.import_module(REPORTS[name]).REPORT


# ----------------------------------------------------------------------------- runs and rows


def sweep_dirs(paths: Iterable) -> list[Path]:
    """``paths`` as sweep directories, for a report whose tables are per sweep.

    Raises:
        ReportError: a run directory (the report compares the points of a sweep).
        NotARunError: a path that is neither a run nor a sweep directory.
    """
    out = []
    for p in map(Path, paths):
        if is_run(p):
            raise ReportError(
                f"{p} is a run directory; this report compares the points of a sweep: "
                f"give the sweep directory (the one with sweep.yaml and sweep.csv)"
            )
        find_runs([p])  # NotARunError, saying why, unless p is a run or a sweep
        out.append(p)
    return out


def sweep_rows(sweep_dir: str | Path) -> list[tuple[Path, pd.Series]]:
    """Every run directory of a sweep (:func:`traffic.rundir.find_runs` order) with its row of
    the sweep's ``sweep.csv`` (the runner's record of the point: the swept values, variant,
    scheme, status and headline figures; see :mod:`traffic.rundir`).

    A row is matched to its run directory by the directory's name (``sweep.csv``'s
    ``run_dir`` is the path the runner used, relative to where it ran). A run directory
    without a row (its point is still running) is left out.

    Raises:
        ReportError: the sweep has no ``sweep.csv`` (no point has finished).
        NotARunError: ``sweep_dir`` is not a sweep directory.
    """
    sweep_dir = Path(sweep_dir)
    runs = find_runs([sweep_dir])
    csv = sweep_dir / "sweep.csv"
    if not csv.is_file():
        raise ReportError(f"{sweep_dir} has no sweep.csv: no point of the sweep has finished yet")
    df = read_sweep_csv(csv)
    by_name = {Path(str(r["run_dir"])).name: r for _, r in df.iterrows()}
    return [(run, by_name[run.name]) for run in runs if run.name in by_name]


def throughput_cells(row: Mapping) -> dict:
    """A run's throughput cells of a report's table, from its ``sweep.csv`` row
    (:func:`sweep_rows`): ``samples_per_s`` (the mean), ``spread95`` (1.96 sd of the
    iterations) and ``mean_ci95_low``/``mean_ci95_high`` (the 95 % confidence interval of the
    mean; None in a file without them), samples/s."""
    return {
        "samples_per_s": row.get("samples_per_s"),
        "spread95": row.get("samples_per_s_spread95"),
        "mean_ci95_low": row.get("samples_per_s_mean_ci95_low"),
        "mean_ci95_high": row.get("samples_per_s_mean_ci95_high"),
    }


def load_rows(
    runs: Iterable[Path], row: Callable[[Path], dict], skip: tuple[type[BaseException], ...] = ()
) -> tuple[list[dict], list[str]]:
    """``row(run)`` for every run.

    Args:
        runs: run directories.
        row: one run's figures as a dict (a paper module's function).
        skip: exceptions that leave a run out (noted) instead of ending the report.

    Returns:
        ``(rows, notes)``: the dicts, and ``"skipped <run>: <error>"`` for each run left out.
    """
    rows, notes = [], []
    for r in runs:
        try:
            rows.append(row(r))
        except skip as e:
            notes.append(f"skipped {r}: {e}")
    return rows, notes


# ----------------------------------------------------------------------------- ratios per point


def _point_keys(table: pd.DataFrame, point: Sequence[str]) -> pd.Series:
    """One string per row naming its point (the values of the ``point`` columns)."""
    if not point:
        return pd.Series([""] * len(table), index=table.index)
    return table[list(point)].astype(str).agg("|".join, axis=1)


def baseline_rows(table: pd.DataFrame, baseline, point: Sequence[str], variant: str = "variant") -> list:
    """For every row, the index label of the baseline's row at its point, or ``None``.

    Args:
        table: one row per run.
        baseline: the baseline variant's name (its rows are those whose ``variant`` column
            equals it), or a boolean mask of the baseline rows.
        point: the columns that identify a point apart from the variant (the swept values).
        variant: the column naming each row's variant.

    When a point has several baseline rows, the last one counts.
    """
    mask = (table[variant] == baseline) if isinstance(baseline, str) else pd.Series(baseline, index=table.index)
    key = _point_keys(table, point)
    ref = dict(zip(key[mask], table.index[mask.to_numpy()]))
    return [ref.get(k) for k in key]


def per_point(
    table: pd.DataFrame,
    value: str,
    baseline,
    point: Sequence[str],
    variant: str = "variant",
    inverse: bool = False,
    reduce: str = "last",
) -> list[float]:
    """``value`` of every row over ``value`` of the baseline at the same point.

    A point is the set of runs that share every swept value except the variant (the
    ``point`` columns). ``inverse`` gives baseline over row, for times: a speedup is the
    baseline's time over the variant's.

    Args:
        table: one row per run.
        value: the column compared (samples/s, seconds, bytes ...).
        baseline: the baseline variant's name, or a boolean mask of the baseline rows.
        point: the columns that identify a point apart from the variant.
        variant: the column naming each row's variant.
        inverse: ratio baseline / row instead of row / baseline.
        reduce: ``last``: the last baseline row of the point counts; ``mean``: the mean of
            the point's baseline rows (NaNs left out).

    Returns:
        One float per row, NaN where the point has no baseline, a value is missing, or the
        divisor is 0.
    """
    mask = (table[variant] == baseline) if isinstance(baseline, str) else pd.Series(baseline, index=table.index)
    key = _point_keys(table, point)
    vals = pd.to_numeric(table[value], errors="coerce")
    if reduce == "last":
        ref = dict(zip(key[mask], vals[mask]))
    elif reduce == "mean":
        ref = {k: float(g.mean()) for k, g in vals[mask].groupby(key[mask], sort=False)}
    else:
        raise ValueError(f"reduce must be 'last' or 'mean', got {reduce!r}")
    out = []
    for k, v in zip(key, vals):
        b = ref.get(k)
        num, den = (b, v) if inverse else (v, b)
        out.append(
            float(num) / float(den)
            if num is not None and den is not None and den != 0 and not (math.isnan(num) or math.isnan(den))
            else math.nan
        )
    return out


# ----------------------------------------------------------------------------- fidelity flags

#: The fidelity flags a row can carry: the key in ``summary.json``'s ``fidelity`` (and the
#: column of ``sweep.csv``) -> the marker printed in the ``flags`` column.
FLAGS = {"cpu_starved": "cpu-starved", "host_cost_overrun": "host-overrun"}

#: The line printed under a table with a flagged row.
FLAGS_NOTE = (
    f"flags: cpu-starved = the emulation's mean CPU idle was below {MIN_IDLE_PCT:g} % "
    f"(summary.json fidelity.idle_pct_mean), so link rates and times may be off; "
    f"host-overrun = the real work of a process's modelled host costs exceeded their dilated budgets "
    f"by more than {100 * OVERRUN_THRESHOLD:g} % of the process's time (see summary.json host_costs), so "
    f"the run is slower than the host model says. A row's flags are its run's; a row of a table comparing runs "
    f"(a pairing, speed-ups) has those of every run compared; a ratio to a baseline in a table of runs "
    f"rests on the baseline's row too, flagged there."
)


def _is_set(v) -> bool:
    """A flag's value as recorded (JSON true/false/null, or a ``sweep.csv`` cell: a bool, NaN for
    an empty cell, the strings ``True``/``False`` in a column pandas could not type)."""
    if isinstance(v, str):
        return v.strip().lower() == "true"
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and bool(v)


def row_flags(fields: Mapping) -> str:
    """The markers of :data:`FLAGS` set in ``fields``, joined with ``+`` (``""`` when none).

    Args:
        fields: a mapping with the keys of :data:`FLAGS`: ``summary.json``'s ``fidelity``
            section, or a row of ``sweep.csv`` (a :class:`pandas.Series`); a missing key (a
            ``sweep.csv`` written before the column existed) or an unknown value (null, an empty
            cell) counts as not set.

    Returns:
        e.g. ``""``, ``"cpu-starved"``, ``"cpu-starved+host-overrun"`` (in :data:`FLAGS` order).
    """
    return "+".join(marker for key, marker in FLAGS.items() if _is_set(fields.get(key)))


def fidelity_flags(run_dir: str | Path) -> str:
    """:func:`row_flags` of a run's ``summary.json`` ``fidelity`` section; ``""`` for a run
    without a summary (still running, or killed before the harness wrote it).

    Raises:
        ValueError: ``summary.json`` exists but is not JSON, or not a summary.
    """
    p = Path(run_dir) / SUMMARY_FILE
    if not p.is_file():
        return ""
    f = RunSummary.load(p).fidelity
    return row_flags(f.model_dump() if f else {})


def union_flags(*flags: str) -> str:
    """The flags of a row that compares several runs (a ratio, a pairing): every marker set in
    any of ``flags`` (each a :func:`row_flags` string; ``None`` or NaN count as ``""``), once, in
    :data:`FLAGS` order."""
    have = {m for f in flags if isinstance(f, str) for m in f.split("+") if m}
    return "+".join(m for m in FLAGS.values() if m in have)


def flagged_markdown(table: pd.DataFrame, column: str = "flags", **kw) -> str:
    """:func:`markdown` of ``table`` (``kw`` passed on), followed by a blank line and
    :data:`FLAGS_NOTE` when any cell of its flags column (``column``, :func:`row_flags`
    strings) is set.

    Raises:
        KeyError: ``table`` has no column ``column``.
    """
    text = markdown(table, **kw)
    if any(isinstance(f, str) and f for f in table[column]):
        text += "\n\n" + FLAGS_NOTE
    return text


# ----------------------------------------------------------------------------- rendering


def markdown(
    table: pd.DataFrame,
    floatfmt: str | Sequence[str] = "g",
    preformatted: bool = False,
    colalign: Sequence[str] | None = None,
) -> str:
    """``table`` as a markdown (pipe) table, without its index: ``tabulate``, as
    ``DataFrame.to_markdown(index=False, floatfmt=...)`` gives it.

    Args:
        floatfmt: format of float cells (one for all columns, or one per column).
        preformatted: the cells are strings already formatted: print them as they are
            (no number parsing).
        colalign: ``left``/``right``/``center`` per column (default: numbers right, text left).
    """
    kw = {"disable_numparse": True} if preformatted else {}
    if colalign is not None:
        kw["colalign"] = tuple(colalign)
    return tabulate(table, headers="keys", tablefmt="pipe", showindex=False, floatfmt=floatfmt, **kw)
