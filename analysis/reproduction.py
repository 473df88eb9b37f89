"""The reproduction catalogue: every figure and table of the five papers' evaluations, the
spec that reproduces each here, and how far it does.

    from analysis.reproduction import load_catalogue, format_list
    entries = load_catalogue()        # validated, in the file's order
    print(format_list(entries))       # what `testbed reproduce --list` prints

The catalogue is the data file ``analysis/data/reproduction.yaml`` (shipped as package data;
its header comment documents every field). One :class:`Entry` per figure or table: its id
(``p3.fig7c``, ``phub.table2``, ...), what it shows, the numbers the paper states for it with
where and how it states them (:class:`PaperValue`), the experiment spec with its ``--set``
overrides (:class:`SpecRef`), the ``testbed report`` command that compares its runs, its
status (one of :data:`STATUSES`) with the reason, what was measured for it
(:class:`Measured`), and the wall minutes its spec takes on this machine with how that was
estimated, and optionally a reduced version (:class:`Quick`: more ``--set``
overrides, its minutes, what it reduces) that ``testbed reproduce ID --quick`` runs.

:func:`load_catalogue` validates the file as a whole: every entry's fields (unknown fields
are errors), unique ids, spec files that exist under the repository root, a reason for every
status but ``reproduced``, a measurement for every ``reproduced``. Every problem found is
reported at once in one :class:`CatalogueError` that names the entry and the field.
:func:`missing_quotes` checks that every quoted paper value is in the paper's text.

Status rule (the tolerance :data:`TOLERANCE`): ``reproduced`` when every paper value
of the entry was measured here, on the setting the spec states, within +-25 % of the paper's
ratio; ``arithmetic checked`` when the entry's values follow from the paper's own formulas and
figures and were recomputed here, with no measurement (a check of the paper's arithmetic, not
a reproduction); ``partly`` when some of it was measured or matches; ``not`` when nothing was
measured yet (e.g. no spec); ``not possible here`` when this testbed cannot produce it at all.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator
from tabulate import tabulate

from analysis.report import REPORTS
from common.errors import TestbedError, show_value
from common.validation import SpecModel, field_errors, load_yaml

__all__ = [
    "MARKER",
    "CATALOGUE",
    "PAPERS",
    "QUICK_MAX_MINUTES",
    "REPO_ROOT",
    "STATUSES",
    "TOLERANCE",
    "CatalogueError",
    "Entry",
    "Headline",
    "Measured",
    "PaperValue",
    "Quick",
    "Ratio",
    "SpecRef",
    "UnknownEntry",
    "find_quote",
    "format_list",
    "get_entry",
    "load_catalogue",
    "missing_quotes",
]

#: the shipped catalogue
CATALOGUE = Path(__file__).resolve().parent / "data" / "reproduction.yaml"
#: the repository this package sits in: spec paths (``experiments/...``) are relative to it
REPO_ROOT = Path(__file__).resolve().parents[1]
#: id prefix -> the name of the paper's text file in the directory given to :func:`missing_quotes`
#: (the papers' texts are not part of the repository)
PAPERS = {
    "p3": "p3.txt",
    "phub": "phub.txt",
    "ibatch": "ibatch.txt",
    "stanza": "stanza.txt",
    "pipe_sgd": "pipe-sgd.txt",
}
#: the file ``testbed reproduce`` writes into each sweep (or run) directory it makes: which
#: entry, run mode (full / quick / headline), overrides and repeat it is (JSON)
MARKER = "reproduce.json"
#: the allowed statuses, from best to worst
STATUSES = ("reproduced", "arithmetic checked", "partly", "not", "not possible here")
#: a measured ratio within this fraction of the paper's counts as reproduced
TOLERANCE = 0.25
#: the longest a ``quick`` version may take here, wall minutes (a few minutes)
QUICK_MAX_MINUTES = 5

_ID = re.compile(r"({})\.(fig|table)[0-9]+[a-z0-9_]*".format("|".join(PAPERS)))
_ID_ALLOWED = (
    "a lowercase id '<paper>.<fig|table><number>[suffix]' (e.g. p3.fig7c, phub.table2, "
    f"pipe_sgd.fig4_mnist_timing), paper one of {', '.join(PAPERS)}"
)
_REPORT = re.compile(r"testbed report (\S+)(?: .*)?")


class CatalogueError(TestbedError):
    """The catalogue file is unreadable or malformed. ``errors`` lists every problem, each
    naming the entry (position and id) and the field; ``str()`` shows them all."""

    def __init__(self, path: Path, errors: list[str]):
        self.path, self.errors = path, list(errors)
        head = f"{path}: " + (
            f"{len(self.errors)} problems in the reproduction catalogue:" if len(self.errors) > 1 else ""
        )
        body = "\n".join(f"  - {e}" for e in self.errors) if len(self.errors) > 1 else self.errors[0]
        super().__init__(head + ("\n" if len(self.errors) > 1 else "") + body)


class UnknownEntry(TestbedError):
    """No catalogue entry has that id (the message names the closest ones)."""


def _nonblank(value: str) -> str:
    if not value.strip():
        raise ValueError("a non-empty text")
    return value


Text = Annotated[str, AfterValidator(_nonblank)]


class PaperValue(SpecModel):
    """One number (or statement) as the paper gives it."""

    value: Text
    """The value as the paper states it, e.g. ``+26 % (P3 over the baseline at 4 Gbit/s)``."""
    where: Text
    """Section and figure or table, e.g. ``Sec. 5.2, Fig. 7(a)``."""
    quote: Text
    """The paper's words (or a table's or figure's labels), whitespace-normalised; ``...``
    separates fragments that follow each other in the text (:func:`find_quote`)."""


class Measured(SpecModel):
    """One thing measured for the entry on this testbed."""

    value: Text
    """What was measured, with units."""
    source: Text
    """Where it is recorded: a run directory under ``runs/`` or ``reproduction/runs/`` (``not
    kept`` when the directory was deleted after its numbers were recorded), or the command that
    prints it."""


def _check_overrides(v: list[str]) -> list[str]:
    for s in v:
        if "=" not in s or not s.split("=", 1)[0].strip():
            raise ValueError(f"--set overrides of the form FIELD=VALUE (got {s!r})")
    return v


class SpecRef(SpecModel):
    """The experiment spec that reproduces an entry: ``testbed run PATH --set S ...``."""

    path: str
    """The spec file, relative to the repository root, under ``experiments/``."""
    set: list[str] = []
    """``--set`` overrides in order, each ``FIELD=VALUE`` as given on the command line."""

    @field_validator("path")
    @classmethod
    def _relative_spec(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != "experiments" or p.suffix != ".yaml":
            raise ValueError("a relative path experiments/<name>.yaml (relative to the repository root, no '..')")
        return v

    @field_validator("set")
    @classmethod
    def _overrides(cls, v: list[str]) -> list[str]:
        return _check_overrides(v)

    def command(self) -> str:
        """The ``testbed run`` command line, shell-quoted (a string to copy into a shell)."""
        return " ".join(["testbed run", shlex.quote(self.path)] + [f"--set {shlex.quote(s)}" for s in self.set])


class Quick(SpecModel):
    """A reduced version of an entry's run (``testbed reproduce ID --quick``): fewer
    iterations, sweep points or variants, keeping what the figure compares."""

    set: list[str]
    """``--set`` overrides applied after the spec's own (:attr:`SpecRef.set`), in order, each
    ``FIELD=VALUE``; at least one."""
    minutes: float = Field(gt=0, le=QUICK_MAX_MINUTES)
    """Wall minutes of the reduced run measured on this machine (at most :data:`QUICK_MAX_MINUTES`)."""
    note: Text
    """What is reduced against the full run, one line."""

    @field_validator("set")
    @classmethod
    def _overrides(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one --set override (what the quick version reduces)")
        return _check_overrides(v)


class Ratio(SpecModel):
    """One ratio a headline run measures: the samples/s of the sweep row matching
    ``numerator`` over that of the row matching ``denominator`` (higher is better, so a
    ratio > 1 favours the numerator), set against the paper's."""

    claim: Text
    """What the ratio is, one line, e.g. ``P3 over the baseline at 4 Gbit/s, samples/s``."""
    paper: list[float] = Field(min_length=1, max_length=2)
    """The paper's ratio: one number, or ``[low, high]`` when the paper gives a range."""
    where: Text
    """Section and figure or table of the paper's number."""
    numerator: dict[str, str | int | float | bool]
    """``sweep.csv`` column -> value picking exactly one row of each headline sweep (e.g.
    ``{variant: p3}``); values are compared as text."""
    denominator: dict[str, str | int | float | bool]
    """The same for the row it is divided by."""
    setting_differs: str | None = None
    """Set when the headline run cannot take the paper's setting for this ratio: how it
    differs (e.g. ``8 nodes here, 30 in the paper``). The scoreboard then counts the ratio
    apart from those measured on the paper's setting."""
    sensitivity: str | None = None
    """Set for a ratio that is not the headline itself but the headline at another value of
    a setting the paper does not fix: what differs (e.g. ``tcp_notsent_lowat at the kernel
    default``)."""
    band: Literal["low", "high"] | None = None
    """Set on the two ratios of a headline whose setting the paper does not print but bounds
    through its own statements (e.g. Stanza's compute time, from its Fig. 8 ratios; the
    headline's note gives the derivation): the end of that band this ratio is measured at.
    The two ends, adjacent in ``ratios`` (``low`` first) with the same ``paper`` and
    ``where``, are one headline: the paper's ratio is reproduced when the band they measure
    reaches within the tolerance of it, each end measured by the protocol."""

    @field_validator("paper")
    @classmethod
    def _paper(cls, v: list[float]) -> list[float]:
        if any(not x > 0 for x in v) or (len(v) == 2 and v[0] > v[1]):
            raise ValueError("[ratio] or [low, high] with 0 < low <= high")
        return v

    @field_validator("numerator", "denominator")
    @classmethod
    def _selector(cls, v: dict) -> dict:
        if not v:
            raise ValueError("at least one sweep.csv column -> value (e.g. {variant: p3})")
        return v


class Headline(SpecModel):
    """The headline run of an entry (``testbed reproduce ID --headline [--repeat N]``): the
    points its ratios need, run with enough iterations to count, and the ratios themselves."""

    set: list[str]
    """``--set`` overrides applied after the spec's own, in order, each ``FIELD=VALUE``."""
    minutes: float = Field(gt=0)
    """Wall minutes of one headline run measured on this machine."""
    note: Text
    """What the headline run keeps and drops of the full spec, and how its setting differs
    from the paper's, if it does."""
    ratios: list[Ratio] = Field(min_length=1)
    """What it measures; the first is the headline (with :attr:`Ratio.band`, the first two)."""

    @field_validator("set")
    @classmethod
    def _overrides(cls, v: list[str]) -> list[str]:
        return _check_overrides(v)

    @field_validator("ratios")
    @classmethod
    def _bands(cls, v: list[Ratio]) -> list[Ratio]:
        i = 0
        while i < len(v):
            r = v[i]
            if r.band is None:
                i += 1
                continue
            nxt = v[i + 1] if i + 1 < len(v) else None
            if r.band != "low" or nxt is None or nxt.band != "high":
                raise ValueError(f"ratio {i + 1}: a band's ends are two adjacent ratios, band: low then band: high")
            if (r.paper, r.where) != (nxt.paper, nxt.where):
                raise ValueError(f"ratios {i + 1} and {i + 2}: the ends of a band have the same paper and where")
            if r.sensitivity or nxt.sensitivity or r.setting_differs != nxt.setting_differs:
                raise ValueError(
                    f"ratios {i + 1} and {i + 2}: the ends of a band are one headline: no sensitivity, "
                    "the same setting_differs"
                )
            i += 2
        return v


class Entry(SpecModel):
    """One figure or table of a paper's evaluation and how far it is reproduced here.
    Fields are checked in order; a check that depends on an earlier field is skipped when
    that field is itself malformed (its own error is reported)."""

    id: str
    """``<paper>.<fig|table><n>[suffix]``, lowercase; the paper is one of :data:`PAPERS`."""
    title: Text
    """What it shows, one line."""
    paper_values: list[PaperValue]
    """The numbers the paper states for it; empty when the paper states none."""
    paper_values_note: str | None = Field(default=None, validate_default=True)
    """Why ``paper_values`` is empty (required then)."""
    spec: SpecRef | None
    """The spec that reproduces it, or null."""
    report: str | None
    """The ``testbed report <paper> ...`` command that compares its runs, or null."""
    status: Literal["reproduced", "arithmetic checked", "partly", "not", "not possible here"]
    """One of :data:`STATUSES`."""
    reason: str | None = Field(default=None, validate_default=True)
    """Why not (further): required unless ``status`` is ``reproduced``."""
    measured: list[Measured] = Field(default=[], validate_default=True)
    """What was measured for it here (at least one item when ``reproduced``)."""
    run_minutes: float | None = Field(default=None, validate_default=True, gt=0)
    """Wall minutes of the spec with its overrides on this machine; required with a spec,
    null without."""
    run_minutes_source: str | None = Field(default=None, validate_default=True)
    """How ``run_minutes`` was estimated (required with it)."""
    quick: Quick | None = Field(default=None, validate_default=True)
    """The reduced version ``--quick`` runs, or null (only with a spec)."""
    headline: Headline | None = Field(default=None, validate_default=True)
    """The run that measures the paper's headline ratios (``--headline``), or null (only with
    a spec)."""

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.fullmatch(v):
            raise ValueError(_ID_ALLOWED)
        return v

    @field_validator("paper_values_note")
    @classmethod
    def _note(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("paper_values") == [] and (v is None or not v.strip()):
            raise ValueError("a note saying why paper_values is empty (required when it is)")
        return v

    @field_validator("report")
    @classmethod
    def _report(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        m = _REPORT.fullmatch(v)
        paper = info.data.get("id", "").split(".")[0]
        if not m or m.group(1) not in REPORTS or (paper in PAPERS and m.group(1) != paper):
            want = f"'testbed report {paper} ...'" if paper in PAPERS else "'testbed report PAPER ...'"
            raise ValueError(f"null or a command {want} (reports: {', '.join(REPORTS)})")
        return v

    @field_validator("status")
    @classmethod
    def _status(cls, v: str, info: ValidationInfo) -> str:
        if v == "reproduced" and info.data.get("paper_values") == []:
            raise ValueError("a status other than 'reproduced' when the paper states no value to compare with")
        return v

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str | None, info: ValidationInfo) -> str | None:
        status = info.data.get("status")
        if status is not None and status != "reproduced" and (v is None or not v.strip()):
            raise ValueError(f"a reason (required when status is {status!r})")
        return v

    @field_validator("measured")
    @classmethod
    def _measured(cls, v: list[Measured], info: ValidationInfo) -> list[Measured]:
        if info.data.get("status") == "reproduced" and not v:
            raise ValueError("at least one measurement (required when status is 'reproduced')")
        return v

    @field_validator("run_minutes")
    @classmethod
    def _minutes(cls, v: float | None, info: ValidationInfo) -> float | None:
        if "spec" not in info.data:
            return v
        if info.data["spec"] is not None and v is None:
            raise ValueError("the spec's wall minutes on this machine (required with a spec)")
        if info.data["spec"] is None and v is not None:
            raise ValueError("null (there is no spec to run)")
        return v

    @field_validator("run_minutes_source")
    @classmethod
    def _minutes_source(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("run_minutes") is not None and (v is None or not v.strip()):
            raise ValueError("how run_minutes was estimated (required with run_minutes)")
        return v

    @field_validator("quick", "headline")
    @classmethod
    def _needs_spec(cls, v: Quick | Headline | None, info: ValidationInfo) -> Quick | Headline | None:
        if v is not None and "spec" in info.data and info.data["spec"] is None:
            raise ValueError("null (there is no spec to " + ("reduce)" if info.field_name == "quick" else "run)"))
        return v

    def overrides(self, quick: bool = False, headline: bool = False) -> list[str]:
        """The ``--set`` overrides of its run: the spec's, then with ``quick`` the quick
        version's, or with ``headline`` the headline run's (empty without a spec).

        Raises:
            ValueError: ``quick`` and ``headline`` both, or the entry has no such version.
        """
        if quick and headline:
            raise ValueError("quick or headline, not both")
        if quick and self.quick is None:
            raise ValueError(f"{self.id} has no quick version")
        if headline and self.headline is None:
            raise ValueError(f"{self.id} has no headline run")
        extra = list(self.quick.set) if quick else list(self.headline.set) if headline else []
        return ([] if self.spec is None else list(self.spec.set)) + extra

    @property
    def paper(self) -> str:
        """The paper's key (the id's prefix), one of :data:`PAPERS`."""
        return self.id.split(".", 1)[0]


def _where(n: int, item) -> str:
    ident = item.get("id") if isinstance(item, dict) else None
    return f"entry {n}" + (f" ({ident})" if isinstance(ident, str) else "")


def load_catalogue(path: str | Path | None = None, root: str | Path | None = None) -> list[Entry]:
    """The catalogue's entries, validated, in the file's order.

    Args:
        path: the YAML file (a list of entries); default :data:`CATALOGUE`.
        root: the directory spec paths are relative to; default :data:`REPO_ROOT` (the
            checkout this package is in) if it has an ``experiments`` directory, else the
            current directory (a package installed outside its checkout, run from one).

    Raises:
        CatalogueError: the file is missing, unreadable or not YAML, is not a list of
            mappings, or has malformed entries (unknown or missing fields, bad values, a
            status without its reason, a duplicate id, a spec file that does not exist under
            ``root``): every problem, each naming the entry (position from 1 and id) and the
            field. Ids and spec files are checked for the entries whose fields are valid.
    """
    path = Path(path) if path is not None else CATALOGUE
    if root is None:
        root = REPO_ROOT if (REPO_ROOT / "experiments").is_dir() else Path.cwd()
    root = Path(root)
    try:
        data = load_yaml(path.read_text(), source=str(path))
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogueError(path, [f"cannot read the catalogue ({type(e).__name__}: {e})"]) from None
    except yaml.YAMLError as e:
        raise CatalogueError(path, [f"not valid YAML ({e})"]) from None
    if not isinstance(data, list) or not data:
        raise CatalogueError(path, [f"got {show_value(data)}; allowed: a non-empty list of entries (mappings)"])
    entries: list[Entry] = []
    errors: list[str] = []
    first_at: dict[str, int] = {}
    for n, item in enumerate(data, start=1):
        where = _where(n, item)
        if not isinstance(item, dict):
            errors.append(
                f"{where}: got {show_value(item)}; allowed: a mapping with fields {', '.join(Entry.model_fields)}"
            )
            continue
        try:
            entry = Entry.model_validate(item)
        except ValidationError as e:
            errors.extend(
                f"{where}: field '{fe.field}': got {show_value(fe.value)}; allowed: {fe.allowed}"
                for fe in field_errors(e, Entry, what="a field of an entry")
            )
            continue
        if entry.id in first_at:
            errors.append(
                f"{where}: field 'id': got {entry.id!r}; allowed: an id no other entry has "
                f"(entry {first_at[entry.id]} has it)"
            )
            continue
        first_at[entry.id] = n
        if entry.spec is not None and not (root / entry.spec.path).is_file():
            errors.append(
                f"{where}: field 'spec.path': got {entry.spec.path!r}; allowed: a spec file that exists "
                f"under {root} (spec paths are relative to the repository root: run from the checkout "
                f"when the package is installed outside it)"
            )
            continue
        entries.append(entry)
    if errors:
        raise CatalogueError(path, errors)
    return entries


def get_entry(entries: list[Entry], ident: str) -> Entry:
    """The entry with id ``ident``.

    Raises:
        UnknownEntry: no entry has it; the message names the closest ids and how to list them.
    """
    for e in entries:
        if e.id == ident:
            return e
    close = difflib.get_close_matches(ident, [e.id for e in entries], n=5, cutoff=0.5)
    hint = f"; the closest: {', '.join(close)}" if close else ""
    raise UnknownEntry(
        f"no figure or table {ident!r} in the reproduction catalogue{hint} (testbed reproduce --list shows every id)"
    )


def _minutes(m: float | None) -> str:
    return "-" if m is None else f"{m:g}"


def format_list(entries: list[Entry], spec_width: int = 70, title_width: int = 44) -> str:
    """The table ``testbed reproduce --list`` prints, then the counts per paper and status.

    One row per entry, in order: id, status, minutes (``-`` without a spec), the spec's
    ``testbed run`` command (``no spec`` without one) with, unless the status is
    ``reproduced``, the reason under it, and the title. Long cells are wrapped at
    ``spec_width`` and ``title_width`` characters.
    """
    rows = []
    for e in entries:
        cell = e.spec.command() if e.spec is not None else "no spec"
        if e.status != "reproduced" and e.reason:
            cell += "\nwhy: " + " ".join(e.reason.split())
        rows.append([e.id, e.status, _minutes(e.run_minutes), cell, e.title])
    table = tabulate(
        rows,
        headers=["id", "status", "min", "spec / reason", "title"],
        tablefmt="grid",
        maxcolwidths=[None, None, None, spec_width, title_width],
        disable_numparse=True,
    )
    by_paper = Counter(e.paper for e in entries)
    by_status = Counter(e.status for e in entries)
    lines = [
        table,
        "",
        f"{len(entries)} figures and tables: " + ", ".join(f"{p} {by_paper[p]}" for p in PAPERS if by_paper[p]),
        "status: " + ", ".join(f"{s} {by_status[s]}" for s in STATUSES if by_status[s]),
    ]
    return "\n".join(lines)


def _norm(text: str) -> str:
    return " ".join(text.split())


def find_quote(text: str, quote: str) -> str | None:
    """Whether ``quote`` is in ``text``, whitespace-normalised: its fragments (separated by
    ``...``) must appear in that order. Returns ``None`` if it is, else the first fragment
    not found."""
    hay, pos = _norm(text), 0
    for frag in (_norm(f) for f in quote.split("...")):
        if not frag:
            continue
        i = hay.find(frag, pos)
        if i < 0:
            return frag
        pos = i + len(frag)
    return None


def missing_quotes(entries: list[Entry], papers_dir: str | Path) -> list[str]:
    """Every paper value whose quote is not in its paper's text (``papers_dir`` /
    :data:`PAPERS` [paper]), one line each naming the entry and the fragment not found;
    empty if all are there.

    Raises:
        FileNotFoundError: a paper's text file is missing from ``papers_dir``.
    """
    texts: dict[str, str] = {}
    out = []
    for e in entries:
        if e.paper not in texts:
            texts[e.paper] = (Path(papers_dir) / PAPERS[e.paper]).read_text()
        for i, pv in enumerate(e.paper_values):
            frag = find_quote(texts[e.paper], pv.quote)
            if frag is not None:
                out.append(f"{e.id}: paper_values[{i}].quote: {frag!r} is not in {PAPERS[e.paper]}")
    return out
