"""The reproduction catalogue (analysis/data/reproduction.yaml, analysis.reproduction) and
``testbed reproduce --list``: the shipped catalogue is complete and consistent with the specs
and the papers; a malformed catalogue is refused with errors naming the entry and the field."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from analysis.reproduction import (
    CATALOGUE,
    PAPERS,
    QUICK_MAX_MINUTES,
    REPO_ROOT,
    STATUSES,
    CatalogueError,
    UnknownEntry,
    find_quote,
    format_list,
    get_entry,
    load_catalogue,
    missing_quotes,
)
from testbed.cli import main as cli_main
from testbed.reproduce import MEASURED_HEADING, PAPER_HEADING, describe, paper_block, report_argv, reproduce
from testbed.spec import expand_sweep, load_spec

#: the directory holding the five papers' texts (p3.txt, phub.txt, ...), which the repository
#: does not ship: given by the environment, e.g. TESTBED_PAPERS_DIR=DIR bash scripts/test.sh
PAPERS_DIR = Path(os.environ.get("TESTBED_PAPERS_DIR", "/nonexistent"))

ENTRIES = load_catalogue()


def test_the_shipped_catalogue_covers_the_five_papers():
    ids = [e.id for e in ENTRIES]
    assert len(ids) >= 40
    assert len(set(ids)) == len(ids)
    counts = {p: sum(e.paper == p for e in ENTRIES) for p in PAPERS}
    assert all(n >= 5 for n in counts.values()), counts
    assert {e.status for e in ENTRIES} <= set(STATUSES)
    # figures that lack a spec or a run are listed, each with a spec or a reason why it has none
    for ident in [
        "p3.fig7b",
        "p3.fig7d",
        "p3.fig10a",
        "p3.fig12_resnet50",
        "ibatch.fig5_vgg19_22k",
        "ibatch.fig7",
        "phub.fig13",
        "phub.fig15",
        "phub.fig20_left",
        "phub.table5",
        "stanza.table1",
        "stanza.table7",
        "stanza.fig8",
        "pipe_sgd.fig4_cifar100_accuracy",
    ]:
        e = get_entry(ENTRIES, ident)
        assert e.status != "reproduced" and e.reason
        assert e.spec is not None or e.status in ("not", "not possible here") or e.report is not None, ident


def test_the_catalogue_file_is_package_data():
    assert CATALOGUE == Path(__file__).resolve().parents[2] / "analysis" / "data" / "reproduction.yaml"
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert "[tool.setuptools.package-data]" in text and 'analysis = ["data/*.yaml"]' in text


SPECCED = [e for e in ENTRIES if e.spec is not None]


@pytest.mark.parametrize("entry", SPECCED, ids=[e.id for e in SPECCED])
def test_every_spec_validates_with_its_overrides(entry):
    exp = load_spec(REPO_ROOT / entry.spec.path, overrides=entry.spec.set)
    points = expand_sweep(exp)
    assert points, entry.id
    assert entry.run_minutes > 0 and entry.run_minutes_source
    assert entry.report is None or entry.report.startswith(f"testbed report {entry.paper}")


def test_statuses_are_backed_by_what_was_measured():
    for e in ENTRIES:
        if e.status == "reproduced":
            assert e.paper_values and e.measured, e.id
        else:
            assert e.reason and e.reason.strip(), e.id
        if not e.paper_values:
            assert e.paper_values_note, e.id
    assert sum(e.status == "reproduced" for e in ENTRIES) < len(ENTRIES) / 2


@pytest.mark.skipif(not PAPERS_DIR.is_dir(), reason="TESTBED_PAPERS_DIR names no directory of the papers' texts")
def test_every_quoted_paper_value_is_in_the_paper():
    assert missing_quotes(ENTRIES, PAPERS_DIR) == []


def test_find_quote_needs_every_fragment_in_order():
    text = "At 4Gbps, P3 provides 26% more throughput 404\nthan the baseline. For InceptionV3, 18%."
    assert find_quote(text, "At 4Gbps, P3 provides 26% more throughput ... than the baseline") is None
    assert find_quote(text, "P3   provides\n26%") is None
    assert find_quote(text, "than the baseline ... At 4Gbps") == "At 4Gbps"
    assert find_quote(text, "27% more") == "27% more"


def test_a_changed_quote_is_reported(tmp_path):
    entries = [get_entry(ENTRIES, "p3.fig7c")]
    bad = entries[0].model_copy(deep=True)
    bad.paper_values[1].quote = "much as 67% at 15Gbps"
    (tmp_path / "p3.txt").write_text(
        (PAPERS_DIR / "p3.txt").read_text()
        if PAPERS_DIR.is_dir()
        else "30Gbps, parameter slicing can provide 49% speedup on VGG-19 much as 66% at 15Gbps"
    )
    assert missing_quotes(entries, tmp_path) == []
    assert missing_quotes([bad], tmp_path) == [
        "p3.fig7c: paper_values[1].quote: 'much as 67% at 15Gbps' is not in p3.txt"
    ]


# ------------------------------------------------------------------ a malformed catalogue


def _entry(**over) -> dict:
    e = {
        "id": "p3.fig7c",
        "title": "VGG-19 throughput against bandwidth",
        "paper_values": [{"value": "+66 %", "where": "Sec. 5.2, Fig. 7(c)", "quote": "much as 66% at 15Gbps"}],
        "spec": {"path": "experiments/quickstart.yaml", "set": ["sweep={}"]},
        "report": "testbed report p3 SWEEP",
        "status": "partly",
        "reason": "one point only",
        "measured": [{"value": "+41 %", "source": "runs/x"}],
        "run_minutes": 3,
        "run_minutes_source": "measured",
    }
    e.update(over)
    return e


def _load(tmp_path, entries) -> list:
    f = tmp_path / "catalogue.yaml"
    f.write_text(yaml.safe_dump(entries, sort_keys=False, allow_unicode=True))
    return load_catalogue(f, root=REPO_ROOT)


def _errors(tmp_path, entries) -> list[str]:
    with pytest.raises(CatalogueError) as ei:
        _load(tmp_path, entries)
    return ei.value.errors


def test_a_valid_small_catalogue_loads(tmp_path):
    es = _load(tmp_path, [_entry(), _entry(id="p3.fig7a", status="reproduced", reason=None)])
    assert [e.id for e in es] == ["p3.fig7c", "p3.fig7a"]
    assert es[0].spec.command() == "testbed run experiments/quickstart.yaml --set 'sweep={}'"


@pytest.mark.parametrize(
    "over, field, allowed",
    [
        ({"colour": "red"}, "colour", "a field of an entry: id, title, paper_values"),
        ({"status": "done"}, "status", "'not possible here'"),
        ({"reason": None}, "reason", "a reason (required when status is 'partly')"),
        ({"reason": "   "}, "reason", "a reason"),
        ({"id": "P3.Fig7c"}, "id", "lowercase id"),
        ({"id": "p3.speedup"}, "id", "<fig|table>"),
        ({"report": "testbed report phub SWEEP"}, "report", "'testbed report p3 ...'"),
        ({"spec": {"path": "../elsewhere/x.yaml"}}, "spec.path", "relative path experiments/"),
        ({"spec": {"path": "experiments/quickstart.yaml", "set": ["no-equals"]}}, "spec.set", "FIELD=VALUE"),
        ({"run_minutes": None}, "run_minutes", "required with a spec"),
        ({"run_minutes": -1}, "run_minutes", "> 0"),
        ({"run_minutes_source": None}, "run_minutes_source", "required with run_minutes"),
        ({"spec": None}, "run_minutes", "null (there is no spec to run)"),
        ({"paper_values": []}, "paper_values_note", "why paper_values is empty"),
        ({"paper_values": [], "paper_values_note": "a trace", "status": "reproduced"}, "status", "other than"),
        ({"status": "reproduced", "measured": []}, "measured", "at least one measurement"),
        ({"paper_values": [{"value": "+66 %", "where": "Fig. 7"}]}, "paper_values[0].quote", "required"),
        ({"title": 7}, "title", "a string"),
    ],
)
def test_a_malformed_entry_is_named_with_its_field(tmp_path, over, field, allowed):
    errors = _errors(tmp_path, [_entry(id="p3.fig7a"), _entry(**over)])
    assert len(errors) == 1, errors
    ident = over.get("id", "p3.fig7c")
    assert errors[0].startswith(f"entry 2 ({ident}): field '{field}': got "), errors[0]
    assert allowed in errors[0], errors[0]


def test_every_problem_is_reported_at_once(tmp_path):
    entries = [
        _entry(),
        _entry(status="done"),
        _entry(id="p3.fig7b", reason=None),
        _entry(id="p3.fig7d", spec={"path": "experiments/no_such_spec.yaml"}),
        "not a mapping",
    ]
    with pytest.raises(CatalogueError) as ei:
        _load(tmp_path, entries)
    errs = ei.value.errors
    assert errs[0].startswith("entry 2 (p3.fig7c): field 'status'")
    assert errs[1].startswith("entry 3 (p3.fig7b): field 'reason'")
    assert errs[2].startswith("entry 4 (p3.fig7d): field 'spec.path': got 'experiments/no_such_spec.yaml'")
    assert errs[3].startswith("entry 5: got 'not a mapping'; allowed: a mapping")
    assert len(errs) == 4
    assert str(ei.value).startswith(f"{tmp_path / 'catalogue.yaml'}: 4 problems in the reproduction catalogue:")


def test_a_duplicate_id_names_both_entries(tmp_path):
    errors = _errors(tmp_path, [_entry(), _entry(id="p3.fig7a"), _entry()])
    assert errors == [
        "entry 3 (p3.fig7c): field 'id': got 'p3.fig7c'; allowed: an id no other entry has (entry 1 has it)"
    ]


@pytest.mark.parametrize(
    "text, says", [("", "a non-empty list"), ("{a: 1}", "a non-empty list"), ("[unclosed", "not valid YAML")]
)
def test_a_file_that_is_not_a_list_of_entries_is_refused(tmp_path, text, says):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(CatalogueError, match=says):
        load_catalogue(f, root=REPO_ROOT)
    with pytest.raises(CatalogueError, match="cannot read"):
        load_catalogue(tmp_path / "missing.yaml", root=REPO_ROOT)


def test_the_shipped_entries_stay_valid_when_copied(tmp_path):
    # the shipped file round-trips through the validator unchanged: the same entries
    data = yaml.safe_load(CATALOGUE.read_text())
    again = _load(tmp_path, copy.deepcopy(data))
    assert again == ENTRIES


# ------------------------------------------------------------------ listing and the CLI


def test_format_list_has_every_entry_its_reason_and_the_counts():
    text = format_list(ENTRIES)
    for e in ENTRIES:
        assert e.id in text
    assert "testbed run experiments/p3_vgg19.yaml" in text
    unrun = next(e for e in ENTRIES if e.status == "not" and e.reason.startswith("Spec written, not run here yet"))
    assert "why: " + unrun.reason[:60] in text
    n = {s: sum(e.status == s for e in ENTRIES) for s in STATUSES}
    assert f"{len(ENTRIES)} figures and tables: p3 " in text
    assert "status: " + ", ".join(f"{s} {n[s]}" for s in STATUSES if n[s]) in text


def test_get_entry_names_the_closest_ids():
    assert get_entry(ENTRIES, "phub.fig12").paper == "phub"
    with pytest.raises(UnknownEntry, match="closest: .*p3.fig7c"):
        get_entry(ENTRIES, "p3.fig7e")


def test_cli_reproduce_list_prints_every_id(capsys):
    assert cli_main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    lines_with_ids = [line for line in out.splitlines() if line.startswith("| ") and "." in line.split("|")[1]]
    printed = {line.split("|")[1].strip() for line in lines_with_ids} - {""}
    assert printed == {e.id for e in ENTRIES}


# ------------------------------------------------------------------ quick versions and reproduce ID

QUICK = [e for e in ENTRIES if e.quick is not None]


def test_every_paper_with_a_spec_has_a_quick_entry():
    assert {e.paper for e in QUICK} == {e.paper for e in SPECCED} == set(PAPERS)
    assert all(e.spec is not None and e.report is not None for e in QUICK)


@pytest.mark.parametrize("entry", QUICK, ids=[e.id for e in QUICK])
def test_every_quick_version_loads_plans_and_is_smaller(entry):
    from testbed.runner import plan_experiment  # lazy: Mininet

    full = load_spec(REPO_ROOT / entry.spec.path, overrides=entry.spec.set)
    quick = load_spec(REPO_ROOT / entry.spec.path, overrides=entry.overrides(quick=True))
    assert entry.overrides(quick=True) == entry.spec.set + entry.quick.set
    planned = plan_experiment(quick)
    assert planned
    assert 0 < entry.quick.minutes <= QUICK_MAX_MINUTES and entry.quick.minutes < entry.run_minutes
    n_full, n_quick = len(expand_sweep(full)), len(planned)
    fewer_iterations = quick.workload.iterations < full.workload.iterations
    assert n_quick <= n_full and (n_quick < n_full or fewer_iterations), (n_quick, n_full)


def test_overrides_without_a_quick_version_are_refused():
    e = get_entry(ENTRIES, "p3.fig7c")
    assert e.quick is None and e.overrides() == e.spec.set
    with pytest.raises(ValueError, match="p3.fig7c has no quick version"):
        e.overrides(quick=True)


_QUICK = {"set": ["workload.iterations=3"], "minutes": 1.5, "note": "3 iterations"}


@pytest.mark.parametrize(
    "over, field, allowed",
    [
        ({"quick": {**_QUICK, "set": ["iterations"]}}, "quick.set", "FIELD=VALUE"),
        ({"quick": {**_QUICK, "set": []}}, "quick.set", "at least one --set override"),
        ({"quick": {**_QUICK, "minutes": 6}}, "quick.minutes", "<= 5"),
        ({"quick": {**_QUICK, "note": " "}}, "quick.note", "a non-empty text"),
        ({"quick": {**_QUICK, "colour": 1}}, "quick.colour", "a known field of quick: set, minutes, note"),
        (
            {"spec": None, "run_minutes": None, "run_minutes_source": None, "quick": _QUICK},
            "quick",
            "null (there is no spec to reduce)",
        ),
    ],
)
def test_a_malformed_quick_section_is_named_with_its_field(tmp_path, over, field, allowed):
    errors = _errors(tmp_path, [_entry(id="p3.fig7a", quick=_QUICK), _entry(**over)])
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"entry 2 (p3.fig7c): field '{field}': got "), errors[0]
    assert allowed in errors[0], errors[0]


def test_report_argv_puts_the_run_in_place_of_sweep_and_its_plots_dir(tmp_path):
    e = get_entry(ENTRIES, "p3.fig7a")
    assert report_argv(e, tmp_path / "s") == ("p3", [str(tmp_path / "s"), "--plots", str(tmp_path / "s" / "plots")])
    e = get_entry(ENTRIES, "phub.fig19")
    assert report_argv(e, tmp_path) == ("phub", [str(tmp_path), "--flat", "phub_flat"])


def test_describe_and_the_paper_block_give_every_paper_value_with_where():
    e = get_entry(ENTRIES, "p3.fig7a")
    text = describe(e, quick=True)
    assert text.splitlines()[0] == f"p3.fig7a: {e.title}"
    assert "--set workload.iterations=3" in text and "quick version (0.7 min here, the full run 18 min)" in text
    block = paper_block(e)
    assert block.splitlines()[0] == f"## {PAPER_HEADING} (p3.fig7a)"
    for pv in e.paper_values:
        assert f"  - {pv.value}  ({pv.where})" in text
        assert f"{pv.where}: {pv.value}" in block
    assert "no value stated: " in paper_block(get_entry(ENTRIES, "p3.fig8_resnet50"))


def test_cli_reproduce_refuses_what_it_cannot_run(capsys):
    assert cli_main(["reproduce", "p3.fig99"]) == 2
    assert "no figure or table 'p3.fig99'" in capsys.readouterr().err
    assert cli_main(["reproduce", "p3.fig7e", "--quick"]) == 2
    assert "closest: " in capsys.readouterr().err
    assert cli_main(["reproduce"]) == 2
    assert "needs an ID, --list, --scoreboard DIR or --archive DEST" in capsys.readouterr().err
    # no spec: its status and reason
    nospec = next(e for e in ENTRIES if e.spec is None)
    assert cli_main(["reproduce", nospec.id]) == 2
    captured = capsys.readouterr()
    assert (
        f"{nospec.id} has no spec to run (status: {nospec.status}; reason: {' '.join(nospec.reason.split())[:60]}"
        in captured.err
    )
    assert captured.out == ""
    # --quick without a quick section
    assert cli_main(["reproduce", "p3.fig7c", "--quick"]) == 2
    captured = capsys.readouterr()
    assert "p3.fig7c has no quick version (no 'quick' section in its catalogue entry)" in captured.err
    assert captured.out == ""


def test_reproduce_exits_1_and_still_prints_the_paper_when_a_run_fails(tmp_path, monkeypatch, capsys):
    import testbed.runner  # lazy: Mininet

    seen = {}

    def failing_run(exp, progress=True, say=None):
        seen["exp"] = exp
        run_dir = Path(exp.run.runs_dir) / "stanza_accuracy-x" / "000"
        run_dir.mkdir(parents=True)
        return [testbed.runner.RunResult(run_dir, {"status": "error", "error": "the network failed\nmore"})]

    monkeypatch.setattr(testbed.runner, "run_experiment", failing_run)
    e = get_entry(ENTRIES, "stanza.table6")
    assert reproduce(e, quick=True, runs_dir=tmp_path, progress=False) == 1
    assert seen["exp"].workload.iterations == 50 and seen["exp"].run.runs_dir == str(tmp_path)
    out = capsys.readouterr().out
    assert f"{tmp_path}/stanza_accuracy-x/000: error: the network failed" in out
    assert out.index(MEASURED_HEADING) < out.index("no report: ") < out.index("## paper (stanza.table6)")
    assert out.rstrip().endswith("1 of 1 runs did not finish ok (see their lines above)")
    for pv in e.paper_values:
        assert out.count(pv.value) == 2


_RATIO = {
    "claim": "P3 over the baseline",
    "paper": [1.26],
    "where": "Fig. 7(a)",
    "numerator": {"variant": "p3"},
    "denominator": {"variant": "baseline"},
}
_HEADLINE = {"set": ["workload.iterations=10"], "minutes": 4, "note": "the 4 Gbit/s point", "ratios": [_RATIO]}


def test_a_headline_section_loads_and_adds_its_overrides(tmp_path):
    e = _load(tmp_path, [_entry(headline=_HEADLINE)])[0]
    assert e.overrides(headline=True) == ["sweep={}", "workload.iterations=10"]
    assert e.headline.ratios[0].sensitivity is None and e.headline.ratios[0].band is None
    with pytest.raises(ValueError, match="quick or headline, not both"):
        e.overrides(quick=True, headline=True)
    with pytest.raises(ValueError, match="p3.fig7c has no headline run"):
        _load(tmp_path, [_entry()])[0].overrides(headline=True)


@pytest.mark.parametrize(
    "over, field, allowed",
    [
        ({"headline": {**_HEADLINE, "ratios": []}}, "headline.ratios", "at least 1 item"),
        ({"headline": {**_HEADLINE, "set": ["x"]}}, "headline.set", "FIELD=VALUE"),
        ({"headline": {**_HEADLINE, "minutes": 0}}, "headline.minutes", "> 0"),
        (
            {"headline": {**_HEADLINE, "ratios": [{**_RATIO, "paper": [3.2, 2.0]}]}},
            "headline.ratios[0].paper",
            "[ratio] or [low, high] with 0 < low <= high",
        ),
        (
            {"headline": {**_HEADLINE, "ratios": [{**_RATIO, "paper": []}]}},
            "headline.ratios[0].paper",
            "at least 1 item",
        ),
        (
            {"headline": {**_HEADLINE, "ratios": [{**_RATIO, "numerator": {}}]}},
            "headline.ratios[0].numerator",
            "at least one sweep.csv column",
        ),
        (
            {"headline": {**_HEADLINE, "ratios": [{**_RATIO, "metric": "bytes"}]}},
            "headline.ratios[0].metric",
            "a known field of headline.ratios: claim, paper, where, numerator, denominator",
        ),
        (
            {"spec": None, "run_minutes": None, "run_minutes_source": None, "headline": _HEADLINE},
            "headline",
            "null (there is no spec to run)",
        ),
    ],
)
def test_a_malformed_headline_section_is_named_with_its_field(tmp_path, over, field, allowed):
    errors = _errors(tmp_path, [_entry(id="p3.fig7a"), _entry(**over)])
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"entry 2 (p3.fig7c): field '{field}': got "), errors[0]
    assert allowed in errors[0], errors[0]
