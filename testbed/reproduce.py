"""``testbed reproduce ID [--quick]``: run one figure or table of the papers' evaluations and
print the paper's numbers beside the measured ones.

    from testbed.reproduce import reproduce
    status = reproduce(get_entry(load_catalogue(), "p3.fig7a"), quick=True)

For a catalogue entry (:class:`analysis.reproduction.Entry`) with a spec it prints the entry
(id, title, the paper's values with where the paper states them), runs the spec with the
entry's ``--set`` overrides (and, with ``quick``, its quick version's after them) through
:func:`testbed.runner.run_experiment`, then the entry's ``testbed report`` command
in-process on what the run wrote (``SWEEP`` -> the sweep directory, or the run directory of
a single run; ``--plots DIR`` -> its ``plots/``) under the heading :data:`MEASURED_HEADING`,
and the paper's values again in a compact block headed :data:`PAPER_HEADING` right after, so
that the two are side by side.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from analysis.report import get_report
from analysis.reproduction import MARKER, REPO_ROOT, Entry
from common.errors import TestbedError
from common.provenance import PROJECT_DIR, code_digest
from traffic.rundir import read_spec

__all__ = [
    "CHECK_FACTOR",
    "MEASURED_HEADING",
    "NotRunnable",
    "PAPER_HEADING",
    "describe",
    "paper_block",
    "report_argv",
    "reproduce",
    "reproduce_once",
    "run_code_digest",
    "steadiness_lines",
]

#: the heading of the report's output
MEASURED_HEADING = "measured (this run) and the paper model's prediction"
#: the heading of the compact block of the paper's values printed after it
PAPER_HEADING = "paper"
#: a headline's dilation check runs it again at this many times its dilation: a ratio the
#: emulation carries does not move with the dilation; one the machine's own speed leaks into does
CHECK_FACTOR = 2


class NotRunnable(TestbedError):
    """The entry cannot be run as asked: it has no spec (the message gives its status and
    reason), or ``--quick`` was asked for and it has no quick version."""


def _check_runnable(entry: Entry, quick: bool) -> None:
    if entry.spec is None:
        raise NotRunnable(
            f"{entry.id} has no spec to run (status: {entry.status}; reason: {' '.join((entry.reason or '').split())})"
        )
    if quick and entry.quick is None:
        raise NotRunnable(
            f"{entry.id} has no quick version (no 'quick' section in its catalogue entry): "
            f"run it without --quick ({entry.run_minutes:g} min here)"
        )


def describe(entry: Entry, quick: bool = False, headline: bool = False) -> str:
    """The entry as printed before its run: id and title, the ``testbed run`` command with the
    overrides used (and with ``quick`` what is reduced), then every paper value with where
    the paper states it (``paper_values_note`` when there are none)."""
    lines = [f"{entry.id}: {entry.title}"]
    if entry.spec is not None:
        cmd = " ".join(
            ["testbed run", shlex.quote(entry.spec.path)]
            + [f"--set {shlex.quote(s)}" for s in entry.overrides(quick, headline)]
        )
        lines.append(f"spec: {cmd}")
        if headline:
            lines.append(f"headline run ({entry.headline.minutes:g} min here): {' '.join(entry.headline.note.split())}")
        if quick:
            lines.append(
                f"quick version ({entry.quick.minutes:g} min here, the full run {entry.run_minutes:g} min): "
                f"{' '.join(entry.quick.note.split())}"
            )
    lines.append(f"status: {entry.status}")
    lines.append(
        "the paper states:"
        if entry.paper_values
        else f"the paper states no value: {' '.join((entry.paper_values_note or '').split())}"
    )
    lines += [f"  - {pv.value}  ({pv.where})" for pv in entry.paper_values]
    return "\n".join(lines)


def paper_block(entry: Entry) -> str:
    """The compact block of the paper's values printed after the measured ones: the heading
    :data:`PAPER_HEADING`, then one line per value, ``<where>: <value>``."""
    lines = [f"## {PAPER_HEADING} ({entry.id})"]
    lines += [f"{pv.where}: {pv.value}" for pv in entry.paper_values] or [
        f"no value stated: {' '.join((entry.paper_values_note or '').split())}"
    ]
    return "\n".join(lines)


def report_argv(entry: Entry, target: Path) -> tuple[str, list[str]]:
    """The report's name and its arguments for the entry's ``report`` command run on
    ``target`` (a sweep or run directory): ``SWEEP`` -> ``target``, ``DIR`` (the value of
    ``--plots``) -> ``target/plots``; the leading ``testbed report PAPER`` is dropped.

    Raises:
        NotRunnable: the entry has no report command.
    """
    if entry.report is None:
        raise NotRunnable(f"{entry.id} has no report command to compare its runs with the paper")
    words = shlex.split(entry.report)[2:]
    name, args = words[0], words[1:]
    out = []
    for i, w in enumerate(args):
        if w == "SWEEP":
            out.append(str(target))
        elif w == "DIR" and i > 0 and args[i - 1] == "--plots":
            out.append(str(target / "plots"))
        else:
            out.append(w)
    return name, out


def _target(results) -> Path:
    """The sweep directory of ``results`` (the runs of a sweep), or its one run's directory."""
    parent = results[0].run_dir.parent
    return parent if len(results) > 1 or (parent / "sweep.csv").is_file() else results[0].run_dir


def _write_marker(
    target: Path,
    entry: Entry,
    mode: str,
    overrides: list[str],
    repeat: int,
    repeats: int,
    started: str,
    dilation: int = 1,
    code: str | None = None,
) -> None:
    """Record in ``target`` (the sweep or run directory) which catalogue entry it reproduces
    (:data:`analysis.reproduction.MARKER`, read by :mod:`analysis.scoreboard`); ``dilation``:
    1 for a run at the headline's dilation, :data:`CHECK_FACTOR` for its dilation check;
    ``code``: :func:`run_code_digest` of its runs."""
    marker = {
        "id": entry.id,
        "mode": mode,
        "spec": entry.spec.path,
        "overrides": overrides,
        "repeat": repeat,
        "repeats": repeats,
        "dilation": dilation,
        "started": started,
        "finished": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "code": code,
    }
    (target / MARKER).write_text(json.dumps(marker, indent=1) + "\n")


def run_code_digest(entry: Entry, run_dirs: list[Path]) -> str:
    """:func:`common.provenance.code_digest` of what ``run_dirs`` (the runs of one sweep of
    ``entry``) executed: the runtime packages, ``entry``'s spec file, and each compute profile
    file a run's resolved spec names by path.

    Raises:
        OSError: a file cannot be read.
    """
    spec = _spec_path(entry)
    extra = {spec}
    for d in run_dirs:
        try:
            ref = str(((read_spec(d).get("workload") or {}).get("compute") or {}).get("profile") or "")
        except TestbedError:
            continue
        for base in (REPO_ROOT, Path.cwd()):
            if ref.endswith(".json") and (base / ref).is_file():
                extra.add((base / ref).resolve())
                break
    return code_digest(sorted(extra), PROJECT_DIR)


def reproduce(
    entry: Entry,
    quick: bool = False,
    runs_dir: str | Path | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    say: Callable[[str], None] | None = None,
    headline: bool = False,
    repeat: int = 1,
    dilation_check: bool = False,
    first_repeat: int = 1,
    stop_when_unsteady: bool = False,
) -> int:
    """Run ``entry``'s spec ``repeat`` times and print its report beside the paper after each;
    with ``headline``, then its headline ratios over the repeats (median and range).

    A campaign too long for one sitting goes on another day with ``first_repeat``: repeats
    ``first_repeat`` to ``repeat`` run (each with its dilation check), marked as repeats of
    ``repeat``, and the ratios printed pool them with the earlier repeats in the same runs
    directory. The scoreboard pools a campaign from its last first repeat on, and flags one
    whose repeats ran different code (:func:`run_code_digest`) or ran a repeat twice.

    A headline run compares its variants at one dilation: under ``scale: auto`` every point
    runs at the largest dilation the capacity model picks for any of them
    (:func:`headline_scale`). With ``dilation_check``, each repeat is followed by the same run
    at :data:`CHECK_FACTOR` times that dilation, marked as its dilation check (the scoreboard
    flags a ratio that moves by more than
    :data:`analysis.scoreboard.DILATION_TOLERANCE` between the two).

    After each headline sweep, every run's steadiness is printed (:func:`steadiness_lines`): a
    ratio counts only when every run it compares had settled, so a campaign with a run that
    had not cannot count, and ``stop_when_unsteady`` ends it there rather than spend the
    remaining repeats.

    Args:
        entry: a catalogue entry with a spec and a report command.
        quick: run the reduced version (the entry's ``quick`` overrides after the spec's).
        headline: run the headline run instead (the entry's ``headline`` overrides).
        repeat: how many times to run it (>= 1); each run's directory is marked as one
            repeat of the entry (``reproduce.json``) for ``testbed reproduce --scoreboard``.
        dilation_check: with ``headline``, run each repeat again at :data:`CHECK_FACTOR`
            times its dilation (the run takes about three times as long).
        first_repeat: the first repeat to run (1 to ``repeat``; above 1 only with
            ``headline``): the earlier ones ran before, into the same runs directory.
        stop_when_unsteady: with ``headline``, run no further sweep once a run of one had not
            settled (the ratios are still printed, over the sweeps that ran).
        runs_dir, progress, out, say: as :func:`reproduce_once`.

    Returns:
        0 if every run of every repeat was ``ok`` (and, with ``stop_when_unsteady``, the
        campaign ran to its end), else 1.

    Raises:
        NotRunnable: no spec, no such version, both ``quick`` and ``headline``, no report
            command, or ``dilation_check`` or ``stop_when_unsteady`` without ``headline``.
        ValueError: ``repeat`` < 1, or ``first_repeat`` not within 1 to ``repeat``.
        TestbedError: as :func:`reproduce_once`.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1 (got {repeat})")
    if not 1 <= first_repeat <= repeat:
        raise ValueError(f"the first repeat must be within 1 to {repeat}, the number of repeats (got {first_repeat})")
    if first_repeat > 1 and not headline:
        raise NotRunnable("--from-repeat continues a headline campaign: give --headline too")
    if quick and headline:
        raise NotRunnable("--quick or --headline, not both")
    if dilation_check and not headline:
        raise NotRunnable("--dilation-check checks a headline ratio: give --headline too")
    if stop_when_unsteady and not headline:
        raise NotRunnable("--stop-when-unsteady ends a headline campaign: give --headline too")
    if headline and entry.headline is None:
        raise NotRunnable(f"{entry.id} has no headline run (no 'headline' section in its catalogue entry)")
    _check_runnable(entry, quick)
    scale = headline_scale(entry) if headline else None
    runs = [(i, f) for i in range(first_repeat, repeat + 1) for f in ((1, CHECK_FACTOR) if dilation_check else (1,))]
    status, targets = 0, []
    for i, factor in runs:
        if repeat > 1 or dilation_check:
            at = f" at {factor}x the dilation (scale {scale * factor:g}): the dilation check" if factor > 1 else ""
            print(f"\n# {entry.id}: repeat {i} of {repeat}{at}", file=out or sys.stdout, flush=True)
        rc, target = reproduce_once(
            entry,
            quick=quick,
            headline=headline,
            runs_dir=runs_dir,
            progress=progress,
            out=out,
            say=say,
            repeat=(i, repeat),
            scale=None if scale is None else scale * factor,
            dilation=factor,
        )
        status, targets = max(status, rc), targets + [target]
        if headline:
            lines, settled = steadiness_lines(target)
            print("\n" + "\n".join(lines), file=out or sys.stdout, flush=True)
            if stop_when_unsteady and not settled and (i, factor) != runs[-1]:
                print(
                    f"\nstopping the campaign after repeat {i}{' (its dilation check)' if factor > 1 else ''}: "
                    f"a ratio counts only when every run it compares had settled",
                    file=out or sys.stdout,
                )
                status = 1
                break
    if headline:
        from analysis.scoreboard import find_marked, headline_table, last_campaign  # lazy: pandas

        pooled = (
            targets
            if first_repeat == 1
            else [  # with the earlier sittings' repeats
                m.path for m in last_campaign([m for m in find_marked(targets[0].parent) if m.is_headline_of(entry)])
            ]
        )
        print("\n## headline ratios over the repeats\n", file=out or sys.stdout)
        print(headline_table(entry, pooled), file=out or sys.stdout, flush=True)
    return status


def steadiness_lines(target: Path) -> tuple[list[str], bool]:
    """Whether each run of the sweep (or run) directory ``target`` had settled by the
    protocol's rule, as the scoreboard judges it (:func:`analysis.scoreboard.settled`).

    Returns:
        (a heading and one line per run: its name, how far its iteration time moved within
        its measured iterations, its noise, and the verdict; whether every run is known to
        have settled).
    """
    from analysis.metrics import STEADY_TOLERANCE  # lazy: pandas
    from analysis.scoreboard import settled as run_settled

    runs = [target] if (target / "summary.json").is_file() else sorted(p.parent for p in target.glob("*/summary.json"))
    lines = [
        f"steadiness (the later half of the measured iterations against the earlier: within "
        f"{STEADY_TOLERANCE:.0%} or the run's noise):"
    ]
    settled = bool(runs)
    for run in runs:
        try:
            moved, verdict = run_settled(run)
        except (TestbedError, OSError, ValueError) as e:
            settled = False
            lines.append(f"  {run.name}: its files are unreadable ({type(e).__name__})")
            continue
        settled = settled and bool(verdict)
        if moved is not None:
            lines.append(
                f"  {run.name}: moved {moved[0]:+.1%} (noise {moved[1]:.1%}): {'steady' if verdict else 'NOT steady'}"
            )
        elif verdict:
            lines.append(
                f"  {run.name}: steady (no iteration times to test; every measured iteration's samples/s "
                f"within {STEADY_TOLERANCE:.0%} of every other's)"
            )
        else:
            lines.append(
                f"  {run.name}: not known (no iteration times, or under 4 measured iterations, and "
                f"samples/s spread over {STEADY_TOLERANCE:.0%})"
            )
    return lines, settled


def _spec_path(entry: Entry) -> Path:
    root = REPO_ROOT if (REPO_ROOT / "experiments").is_dir() else Path.cwd()  # as load_catalogue's spec paths
    return root / entry.spec.path


def headline_scale(entry: Entry) -> float:
    """The one dilation at which ``entry``'s headline run compares its variants: the spec's
    ``scale`` when it is a number, else (``auto``) the largest scale the capacity model picks
    for any of its points (:func:`testbed.runner.plan_experiment`; nothing is built), so that
    no variant runs at a dilation the model finds too small for it.

    Raises:
        NotRunnable: no spec, or no headline run.
        TestbedError: as :func:`testbed.runner.plan_experiment`.
    """
    _check_runnable(entry, False)
    if entry.headline is None:
        raise NotRunnable(f"{entry.id} has no headline run (no 'headline' section in its catalogue entry)")
    from testbed.runner import plan_experiment  # lazy: Mininet, torch
    from testbed.spec import load_spec  # lazy: torch (the model registry)

    return max(
        float(p.exp.scale)
        for p in plan_experiment(load_spec(_spec_path(entry), overrides=entry.overrides(headline=True)))
    )


def reproduce_once(
    entry: Entry,
    quick: bool = False,
    runs_dir: str | Path | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    say: Callable[[str], None] | None = None,
    headline: bool = False,
    repeat: tuple[int, int] = (1, 1),
    scale: float | None = None,
    dilation: int = 1,
) -> tuple[int, Path]:
    """Run ``entry``'s spec (every point of its sweep) and print its report beside the paper.

    Args:
        entry: a catalogue entry with a spec and a report command.
        quick: run the reduced version (the entry's ``quick`` overrides after the spec's).
        runs_dir: where the run (or sweep) directory goes; default the spec's ``run.runs_dir``.
        progress: show the progress bar as ``testbed run`` does.
        out: where the entry, the runs' lines, the report and the paper block are printed
            (default stdout); ``say`` gets the capacity estimate (default: stderr, prefixed
            ``testbed:``).
        scale: run every point at this dilation (``--set scale=...`` after the entry's
            overrides); None: as the spec says.
        dilation: what the marker records: 1, or :data:`CHECK_FACTOR` for a dilation check.

    Returns:
        (0 if every run's status is ``ok``, else 1 (the report is still attempted; if it
        then finds nothing to report its message is printed instead of the tables); the
        sweep directory, or the run directory of a single run). The directory is marked
        with :data:`analysis.reproduction.MARKER` (entry, mode, overrides, ``repeat`` =
        (this one, of how many), ``dilation``, times).

    Raises:
        NotRunnable: no spec, ``quick`` without a quick version, or no report command.
        TestbedError: what :func:`testbed.spec.load_spec` and
            :func:`testbed.runner.run_experiment` raise (a bad override, a point that does not
            fit, another run holding the network, ...), and the report's errors when every
            run was ok.
    """
    _check_runnable(entry, quick)
    if headline and entry.headline is None:
        raise NotRunnable(f"{entry.id} has no headline run (no 'headline' section in its catalogue entry)")
    if entry.report is None:
        raise NotRunnable(f"{entry.id} has no report command to compare its runs with the paper")
    from testbed.runner import one_line, run_experiment  # lazy: Mininet, torch
    from testbed.spec import load_spec  # lazy: torch (the model registry)

    out = out or sys.stdout
    say = say or (lambda line: print(f"testbed: {line}", file=sys.stderr))
    print(describe(entry, quick, headline), file=out, flush=True)
    overrides = entry.overrides(quick, headline) + ([] if scale is None else [f"scale={scale:.10g}"])
    exp = load_spec(_spec_path(entry), overrides=overrides)
    if runs_dir is not None:
        exp.run.runs_dir = str(runs_dir)
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = run_experiment(exp, progress=progress, say=say)
    target = _target(results)
    _write_marker(
        target,
        entry,
        "quick" if quick else "headline" if headline else "full",
        overrides,
        *repeat,
        started=started,
        dilation=dilation,
        code=run_code_digest(entry, [r.run_dir for r in results]),
    )
    if not progress or target == results[0].run_dir:  # else the runner wrote them as the sweep went
        print("\n".join(one_line(r) for r in results), file=out)
    ok = all(r.ok for r in results)
    name, argv = report_argv(entry, target)
    print(
        f"\n## {MEASURED_HEADING}\n(testbed report {name} {' '.join(shlex.quote(a) for a in argv)})\n",
        file=out,
        flush=True,
    )
    try:
        get_report(name).main(argv, prog=f"testbed report {name}", out=out)
    except TestbedError as e:
        if ok:
            raise
        print(f"no report: {e}", file=out)
    print("\n" + paper_block(entry), file=out, flush=True)
    if not ok:
        bad = sum(not r.ok for r in results)
        print(f"\n{bad} of {len(results)} runs did not finish ok (see their lines above)", file=out)
    return (0 if ok else 1), target
