"""The reproduction scoreboard (analysis.scoreboard, ``testbed reproduce --scoreboard/--archive``,
``--headline --repeat``): headline ratios from marked sweeps, their median, range and
tolerance, the archive that never overwrites, and REPRODUCTION.md equal, byte for byte, to
what the documented command prints from the archived runs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from analysis.reproduction import MARKER, REPO_ROOT, get_entry, load_catalogue
from analysis.scoreboard import (
    ScoreboardError,
    archive,
    find_marked,
    headline_table,
    headlines,
    measure_ratio,
    ratio_result,
    scoreboard,
)
from testbed.cli import main as cli_main

ENTRIES = load_catalogue()
PIPE = get_entry(
    ENTRIES, "pipe_sgd.fig4_resnet18_timing"
)  # ratios: Pipe-SGD+T / D-Sync [2.0, 3.2], / PS-Sync [4.0, 5.4]
COLUMNS = [
    "variant",
    "workload.scheme",
    "workload.model",
    "scheme",
    "status",
    "samples_per_s",
    "samples_per_s_ci95",
    "iter_mean_s",
    "iter_p95_s",
    "core_bytes",
    "accuracy",
    "cpu_starved",
    "host_cost_overrun",
    "run_dir",
]


def _sweep(
    root: Path,
    name: str,
    rates: dict[str, float],
    entry_id: str = PIPE.id,
    mode: str = "headline",
    repeat: int = 1,
    repeats: int = 3,
    status: dict[str, str] | None = None,
    starved: tuple[str, ...] = (),
    ci: float = 1.0,
    finished: str = "2026-11-23T05:00:00Z",
    dilation: int = 1,
    overrides: list[str] | None = None,
) -> Path:
    """A sweep directory as the runner writes it: sweep.csv, sweep.yaml, one run directory
    per variant (spec.yaml, summary.json, a trace file the archive must leave out), and the
    marker ``testbed reproduce`` writes (``overrides``: default the headline's of the
    catalogue's Pipe-SGD entry)."""
    d = root / name
    d.mkdir(parents=True)
    with open(d / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for i, (variant, rate) in enumerate(rates.items()):
            run = d / f"{i:03d}_{variant}_model=resnet18"
            (run / "traces").mkdir(parents=True)
            (run / "traces" / "bwm.csv").write_text("t,bytes\n0,0\n")
            spec = {
                "name": "pipe_sgd_timing",
                "scale": 10.0 * dilation,
                "topology": {"host_bw_mbps": 10000.0},
                "host": {"profile": "pipe_sgd_node"},
                "workload": {"model": "resnet18", "compute": {"mode": "emulated", "profile": "titanxp"}},
            }
            (run / "spec.yaml").write_text(yaml.safe_dump(spec))
            (run / "summary.json").write_text(json.dumps({"status": "ok", "throughput": {"mean": rate}}))
            st = (status or {}).get(variant, "ok")
            w.writerow(
                [
                    variant,
                    "pipe_sgd",
                    "resnet18",
                    "pipe_sgd",
                    st,
                    rate if st == "ok" else "",
                    ci,
                    0.1,
                    0.1,
                    0,
                    "",
                    variant in starved,
                    False,
                    f"runs/{name}/{run.name}",
                ]
            )
    (d / "sweep.yaml").write_text("name: pipe_sgd_timing\n")
    (d / MARKER).write_text(
        json.dumps(
            {
                "id": entry_id,
                "mode": mode,
                "spec": "experiments/pipe_sgd_timing.yaml",
                "overrides": PIPE.overrides(headline=True) if overrides is None else overrides,
                "repeat": repeat,
                "repeats": repeats,
                "started": finished,
                "finished": finished,
                "dilation": dilation,
            }
        )
    )
    return d


def _three(root: Path, ratios=(1.9, 2.1, 2.4)) -> list[Path]:
    return [
        _sweep(
            root,
            f"pipe_sgd_timing-2026112{i}-050000",
            {"PS-Sync": 100.0, "D-Sync": 200.0, "Pipe-SGD+T": 200.0 * r},
            repeat=i + 1,
        )
        for i, r in enumerate(ratios)
    ]


def test_a_ratio_is_the_metric_of_one_row_over_another(tmp_path):
    d = _sweep(tmp_path, "s", {"PS-Sync": 50.0, "D-Sync": 120.0, "Pipe-SGD+T": 240.0})
    m = measure_ratio(PIPE.headline.ratios[0], d)
    assert m.ok and m.ratio == pytest.approx(2.0) and (m.numerator, m.denominator) == (240.0, 120.0)
    assert m.run_dirs == (d / "002_Pipe-SGD+T_model=resnet18", d / "001_D-Sync_model=resnet18")
    assert measure_ratio(PIPE.headline.ratios[1], d).ratio == pytest.approx(4.8)


def test_a_run_with_iteration_times_is_read_by_the_current_definitions(tmp_path):
    """A run archived with its iterations.csv: its samples/s computed again from it
    (analysis.metrics.refigured_summary), whatever sweep.csv says; the others as sweep.csv."""
    d = _sweep(tmp_path, "s", {"PS-Sync": 50.0, "D-Sync": 120.0, "Pipe-SGD+T": 240.0})
    _iterations(d / "001_D-Sync_model=resnet18", [0.4] * 8)  # 64 samples every 0.4 s: 160 samples/s
    m = measure_ratio(PIPE.headline.ratios[0], d)
    assert (m.numerator, m.denominator, m.denominator_spread95) == (240.0, pytest.approx(160.0), pytest.approx(0.0))
    assert m.ratio == pytest.approx(1.5)
    assert "D-Sync@model=resnet18 160.0; Pipe-SGD+T@model=resnet18 240.0" in scoreboard(tmp_path, ENTRIES)


def test_median_range_tolerance_and_distinguishability_over_repeats(tmp_path):
    _three(tmp_path / "a")
    marked = find_marked(tmp_path / "a")
    assert [m.repeat for m in marked] == [1, 2, 3]
    over_d, over_ps = (ratio_result(PIPE, r, marked) for r in PIPE.headline.ratios)
    assert over_d.values == pytest.approx([1.9, 2.1, 2.4])
    assert over_d.median == pytest.approx(2.1)
    assert over_d.to_paper == 1.0 and over_d.within and over_d.distinguishable  # inside the paper's 2.0-3.2
    assert over_ps.median == pytest.approx(4.2) and over_ps.to_paper == 1.0
    _three(tmp_path / "low", (0.9, 1.4, 1.45))
    low = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path / "low"))
    assert low.median == pytest.approx(1.4) and low.to_paper == pytest.approx(0.7)  # the nearer end: 2.0
    assert not low.within and low.distinguishable is False  # 0.9-1.45 spans 1.0


def test_one_run_is_distinguishable_by_its_spread_bands(tmp_path):
    """With one run, by the rows' mean +- 1.96 sd bands: read from ``samples_per_s_spread95``,
    or ``samples_per_s_ci95`` in an older sweep.csv (the one :func:`_sweep` writes)."""
    apart = _sweep(tmp_path, "a", {"PS-Sync": 50.0, "D-Sync": 100.0, "Pipe-SGD+T": 110.0}, ci=4.0)
    close = _sweep(tmp_path, "b", {"PS-Sync": 50.0, "D-Sync": 100.0, "Pipe-SGD+T": 110.0}, ci=6.0)
    r = PIPE.headline.ratios[0]
    assert ratio_result(PIPE, r, find_marked(tmp_path)[:1]).distinguishable is True
    assert ratio_result(PIPE, r, [m for m in find_marked(tmp_path) if m.path == close]).distinguishable is False
    m = measure_ratio(r, apart)
    assert (m.numerator_spread95, m.denominator_spread95) == (4.0, 4.0)
    for d in (apart, close):  # the same sweeps as the runner writes them now
        csv_path = d / "sweep.csv"
        csv_path.write_text(csv_path.read_text().replace("samples_per_s_ci95", "samples_per_s_spread95", 1))
    assert measure_ratio(r, apart) == m
    assert ratio_result(PIPE, r, find_marked(tmp_path)[:1]).distinguishable is True
    assert ratio_result(PIPE, r, [x for x in find_marked(tmp_path) if x.path == close]).distinguishable is False


def test_failed_and_flagged_runs_are_counted_not_hidden(tmp_path):
    _sweep(tmp_path, "s1", {"PS-Sync": 50.0, "D-Sync": 100.0, "Pipe-SGD+T": 250.0}, starved=("Pipe-SGD+T",))
    _sweep(tmp_path, "s2", {"PS-Sync": 50.0, "D-Sync": 100.0, "Pipe-SGD+T": 0.0}, status={"Pipe-SGD+T": "error"})
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path))
    assert res.values == pytest.approx([2.5]) and [m.flagged for m in res.measurements] == [True, False]
    assert math.isnan(res.measurements[1].ratio)
    table = headline_table(PIPE, [tmp_path / "s1", tmp_path / "s2"])
    assert "| 2.50, 1 run, 1 flagged |" in table


@pytest.mark.parametrize(
    "rates, says",
    [
        (
            {"PS-Sync": 1.0, "D-Sync": 2.0},
            "the numerator {'variant': 'Pipe-SGD+T'} matches 0 rows of sweep.csv, not one",
        ),
    ],
)
def test_a_selector_must_pick_exactly_one_row(tmp_path, rates, says):
    d = _sweep(tmp_path, "s", rates)
    with pytest.raises(ScoreboardError, match="matches 0 rows") as e:
        measure_ratio(PIPE.headline.ratios[0], d)
    assert says in str(e.value) and str(d) in str(e.value)


def test_a_bad_marker_or_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ScoreboardError, match="not a directory"):
        find_marked(tmp_path / "nowhere")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / MARKER).write_text('{"id": "p3.fig7a"}')
    with pytest.raises(ScoreboardError, match=f"{MARKER}: not a readable marker"):
        find_marked(tmp_path)


def test_the_protocol_names_what_a_measurement_lacks(tmp_path):
    from analysis.scoreboard import counted, protocol_problems

    dirs = _three(tmp_path / "a")
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path / "a"))
    # the synthetic runs state no warm-up, measured no iteration and recorded no iteration times
    unknown = "steadiness of 6 runs not known (no iteration times to test, samples/s spread over 5%)"
    assert protocol_problems(res) == [
        "0 warm-up iterations (at least 2)",
        "0 measured iterations (at least 5)",
        unknown,
        "no dilation check",
    ]
    for d in dirs:
        for run in d.glob("0*"):
            spec = yaml.safe_load((run / "spec.yaml").read_text())
            spec["workload"]["warmup_iterations"] = 2
            spec["scale"] = 20.0 if run.name.startswith("002") else 10.0  # Pipe-SGD+T at another dilation
            (run / "spec.yaml").write_text(yaml.safe_dump(spec))
            s = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**s, "measured_iterations": 6}))
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path / "a"))
    assert protocol_problems(res) == ["variants at different dilations (20 and 10)", unknown, "no dilation check"]
    assert res.within and not counted(res)
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path / "a")[:2])
    assert protocol_problems(res)[0] == "2 repeats (at least 3)"


def _iterations(run: Path, times: list[float], workers: int = 2) -> None:
    """Write ``run``'s iterations.csv: iteration i takes ``times[i]`` s on every worker."""
    rows, t = ["iteration,worker,start,end,duration_s,samples"], 1000.0
    for i, dt in enumerate(times):
        rows += [f"{i},worker{w},{t},{t + dt},{dt},32" for w in range(workers)]
        t += dt
    (run / "iterations.csv").write_text("\n".join(rows) + "\n")


def _protocol_runs(dirs: list[Path], times: list[float] = (1.0,) * 8) -> None:
    """Give the synthetic runs of ``dirs`` the protocol's warm-up and measured iterations:
    2 of warm-up, then 6 measured, taking ``times`` x (2 x 32 samples / the run's samples/s)
    each (default steady, at the run's samples/s)."""
    for d in dirs:
        for run in d.glob("0*"):
            spec = yaml.safe_load((run / "spec.yaml").read_text())
            spec["workload"]["warmup_iterations"] = 2
            (run / "spec.yaml").write_text(yaml.safe_dump(spec))
            s = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**s, "measured_iterations": 6}))
            _iterations(run, _at_rate(run, times))


def _at_rate(run: Path, times) -> list[float]:
    """``times`` x (2 x 32 samples / the samples/s of ``run``'s summary): iteration times at
    which :func:`_iterations` keeps the run's samples/s (for relative times of mean 1)."""
    rate = json.loads((run / "summary.json").read_text())["throughput"]["mean"] or 1.0
    return [t * 64 / rate for t in times]


def test_a_run_whose_iteration_time_still_moves_is_not_steady(tmp_path):
    from analysis.scoreboard import counted, protocol_problems

    base = _three(tmp_path)
    checks = [
        _sweep(
            tmp_path,
            f"pipe_sgd_timing-2026112{i}-060000",
            {"PS-Sync": 100.0, "D-Sync": 200.0, "Pipe-SGD+T": 200.0 * r},
            repeat=i + 1,
            dilation=2,
        )
        for i, r in enumerate((1.9, 2.1, 2.4))
    ]
    _protocol_runs(base + checks)
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path))
    assert protocol_problems(res) == [] and counted(res)
    run = next(base[1].glob("002*"))
    # warm-up (1.5 s) is left out; the measured iterations settle from 1.0 to 0.9 s, beyond their noise
    _iterations(run, _at_rate(run, [1.5, 1.5, 1.0, 1.0, 1.0, 0.9, 0.9, 0.9]))
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path))
    # (its samples/s, from these times, moves the ratio too: the dilation check may say so)
    assert (
        "1 run not steady (the iteration time moved -10.0% within the measured iterations)" in protocol_problems(res)
    ) and not counted(res)
    # the same move inside the run's own noise is steady
    _iterations(run, _at_rate(run, [1.5, 1.5, 1.3, 0.8, 1.0, 0.9, 1.2, 0.7]))
    assert not [
        p
        for p in protocol_problems(ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path)))
        if "steady" in p
    ]
    # without iteration times: steady when no two iterations' samples/s differ by more than 5 %
    (run / "iterations.csv").unlink()
    s = json.loads((run / "summary.json").read_text())
    for spread, problems in (
        (1.04, []),
        (1.2, ["steadiness of 1 run not known (no iteration times to test, samples/s spread over 5%)"]),
    ):
        (run / "summary.json").write_text(
            json.dumps({**s, "throughput": {"mean": 420.0, "min": 400.0, "max": 400.0 * spread}})
        )
        assert protocol_problems(ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path))) == problems


@pytest.mark.parametrize("check_ratios, moved", [((1.95, 2.15, 2.3), None), ((2.4, 2.5, 2.6), "+19.0%")])
def test_a_dilation_check_holds_or_names_how_far_the_ratio_moved(tmp_path, check_ratios, moved):
    from analysis.scoreboard import counted, protocol_problems

    base = _three(tmp_path)
    checks = [
        _sweep(
            tmp_path,
            f"pipe_sgd_timing-2026112{i}-060000",
            {"PS-Sync": 100.0, "D-Sync": 200.0, "Pipe-SGD+T": 200.0 * r},
            repeat=i + 1,
            dilation=2,
        )
        for i, r in enumerate(check_ratios)
    ]
    _protocol_runs(base + checks)
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path))
    assert res.values == pytest.approx([1.9, 2.1, 2.4]) and res.check_values == pytest.approx(list(check_ratios))
    assert [m.path for m in res.marked] == base and [m.path for m in res.check_marked] == checks
    if moved is None:
        assert protocol_problems(res) == [] and res.moved == pytest.approx(2.15 / 2.1 - 1)
    else:
        assert protocol_problems(res) == [f"the ratio moves {moved} at twice the dilation (at most 5%)"]
    # on the paper's setting (batch 64, truncation): it counts exactly when the check holds
    assert counted(res) == (moved is None)
    row = next(
        line
        for line in scoreboard(tmp_path, ENTRIES).splitlines()
        if line.startswith(f"| `{PIPE.id}` | Pipe-SGD with truncation over D-Sync")
    )
    cell = f"{sorted(check_ratios)[1]:.2f} ({min(check_ratios):.2f}-{max(check_ratios):.2f}), 3 runs, "
    assert cell in row and f"`{checks[0].name}` (2x the dilation)" in row
    # a check whose variants ran at different dilations is named as such
    run = next(checks[0].glob("002*"))
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    (run / "spec.yaml").write_text(yaml.safe_dump({**spec, "scale": 30.0}))
    res = ratio_result(PIPE, PIPE.headline.ratios[0], find_marked(tmp_path))
    assert "variants at different dilations in the dilation check (30 and 20)" in protocol_problems(res)


def test_the_scoreboard_is_deterministic_and_counts_the_headlines(tmp_path):
    _three(tmp_path)
    text = scoreboard(tmp_path, ENTRIES)
    assert text == scoreboard(tmp_path, ENTRIES)
    heads = headlines(
        [ratio_result(e, r, []) for e in ENTRIES if e.headline for r in e.headline.ratios if not r.sensitivity]
    )
    bands = sum(len(g) > 1 for g in heads)
    assert bands >= 1  # Stanza Fig. 6a's compute band
    # both of Pipe-SGD's ratios are within, on the paper's setting (batch 64, truncation)
    # none counts: measured without the protocol's warm-up and dilation check
    assert (
        f"**0 of {len(heads)} headlines count: within +-25 % of the paper's, on its setting, by the "
        f"protocol.** 2 of {len(heads)} are within +-25 % as measured (2 measured; {bands} of the {len(heads)} "
        "a band, two rows); the column"
    ) in text
    row = next(
        line for line in text.splitlines() if line.startswith(f"| `{PIPE.id}` | Pipe-SGD with truncation over D-Sync")
    )
    assert "| 2.00-3.20 | 2.10 (1.90-2.40), 3 runs | 1.00 | yes | yes |" in row
    assert "host pipe_sgd_node, compute emulated titanxp, scale 10, 10 Gbit/s, TCP the machine's default" in row
    for e in ENTRIES:  # every figure and table has its row, with the catalogue's status
        assert f"| `{e.id}` | {e.title} |" in text
    assert "Pipe-SGD+T@model=resnet18 480.0" in text  # the last headline sweep's rates


def _band_entry(paper: float):
    """PIPE with one headline measured as a band: over D-Sync (ratio r) at its low end, over
    PS-Sync (2 r) at its high end, both against the paper's ``paper``."""
    over_d, over_ps = PIPE.headline.ratios
    ratios = [
        over_d.model_copy(update={"paper": [paper], "band": "low"}),
        over_ps.model_copy(update={"paper": [paper], "where": over_d.where, "band": "high"}),
    ]
    return PIPE.model_copy(update={"headline": PIPE.headline.model_copy(update={"ratios": ratios})})


@pytest.mark.parametrize("paper, within", [(3.0, True), (5.5, True), (6.0, False), (1.5, False)])
def test_a_band_is_one_headline_within_when_its_range_reaches_the_paper(tmp_path, paper, within):
    from analysis.scoreboard import counted, headline_counted, headline_within

    base = _three(tmp_path)  # the band's ends: 2.1 (1.9-2.4) over D-Sync, 4.2 (3.8-4.8) over PS-Sync
    checks = [
        _sweep(
            tmp_path,
            f"pipe_sgd_timing-2026112{i}-060000",
            {"PS-Sync": 100.0, "D-Sync": 200.0, "Pipe-SGD+T": 200.0 * r},
            repeat=i + 1,
            dilation=2,
        )
        for i, r in enumerate((1.9, 2.1, 2.4))
    ]
    _protocol_runs(base + checks)
    entry = _band_entry(paper)
    low, high = (ratio_result(entry, r, find_marked(tmp_path)) for r in entry.headline.ratios)
    (group,) = headlines([low, high])
    # 4.2 reaches 5.5 within 25 % (4.125) but not 6.0 (4.5); 2.1 is above 1.5 x 1.25
    assert headline_within(group) is within and headline_counted(group) is within
    assert (counted(low), counted(high)) == (False, paper == 5.5)  # alone, only 4.2 of 5.5 is within
    others = _band_entry(paper).model_copy(update={"id": "pipe_sgd.other"})
    assert len(headlines([low, ratio_result(others, others.headline.ratios[1], [])])) == 2  # ends of one entry only
    text = scoreboard(tmp_path, [entry] + [e for e in ENTRIES if e.id != PIPE.id])
    n = (
        len(
            headlines(
                [ratio_result(e, r, []) for e in ENTRIES if e.headline for r in e.headline.ratios if not r.sensitivity]
            )
        )
        - 1
    )  # the two Pipe-SGD ratios are one headline here
    assert f"**{int(within)} of {n} headlines count: within +-25 % of the paper's" in text
    rows = [line for line in text.splitlines() if line.startswith(f"| `{PIPE.id}` | Pipe-SGD with truncation over")]
    verdict = (
        f"{'yes' if within else 'no'} (one headline with the other end of the band: 2.10-4.20 "
        f"{'reaches' if within else 'does not reach'} within +-25 % of the paper's)"
    )
    assert len(rows) == 2 and all(f"| {verdict} |" in r for r in rows)
    # an end with no run leaves the band unjudged: not within
    (lone,) = headlines([low, ratio_result(entry, entry.headline.ratios[1], [])])
    assert not headline_within(lone) and not headline_counted(lone)


@pytest.mark.parametrize(
    "bands, says",
    [
        (("high", "low"), "band: low then band: high"),
        (("low", None), "band: low then band: high"),
        (("low", "high", "other where"), "the same paper and where"),
    ],
)
def test_a_band_is_two_adjacent_ends_of_one_ratio(bands, says):
    from pydantic import ValidationError

    from analysis.reproduction import Headline

    doc = PIPE.headline.model_dump(exclude_none=True)
    for r, b in zip(doc["ratios"], bands[:2]):
        r["paper"] = [3.0]
        r["where"] = "Fig. 4"
        if b:
            r["band"] = b
    if len(bands) > 2:
        doc["ratios"][1]["where"] = bands[2]
    with pytest.raises(ValidationError, match=says):
        Headline.model_validate(doc)
    for r, b in zip(doc["ratios"], ("low", "high")):
        r.update(band=b, where="Fig. 4")
    assert [r.band for r in Headline.model_validate(doc).ratios] == ["low", "high"]


def test_the_setting_names_the_congestion_control_the_runs_asked_for(tmp_path):
    sweeps = _three(tmp_path)
    for run in sweeps[0].glob("00*"):
        spec = yaml.safe_load((run / "spec.yaml").read_text())
        spec["topology"]["tcp_congestion_control"] = "cubic"
        (run / "spec.yaml").write_text(yaml.safe_dump(spec))
    row = next(
        line
        for line in scoreboard(tmp_path, ENTRIES).splitlines()
        if line.startswith(f"| `{PIPE.id}` | Pipe-SGD with truncation over D-Sync")
    )
    # one sweep with cubic, two with the machine's default (null or absent): both listed
    assert (
        "scale 10, 10 Gbit/s, TCP cubic; host pipe_sgd_node, compute emulated titanxp, scale 10, 10 Gbit/s, "
        "TCP the machine's default"
    ) in row


def test_a_headline_sweep_with_other_overrides_is_left_out_of_the_ratios(tmp_path):
    _three(tmp_path)
    _sweep(
        tmp_path,
        "pipe_sgd_timing-20261130-050000",
        {"PS-Sync": 100.0, "D-Sync": 200.0, "Pipe-SGD+T": 2000.0},
        overrides=["workload.iterations=3"],
        finished="2026-11-30T05:00:00Z",
    )
    marked = find_marked(tmp_path)
    assert marked[-1].overrides == ("workload.iterations=3",) and not marked[-1].is_headline_of(PIPE)
    assert all(m.is_headline_of(PIPE) for m in marked[:3])
    # testbed reproduce puts every point of a headline at one dilation: a last scale= is its own
    from dataclasses import replace

    assert replace(marked[0], overrides=marked[0].overrides + ("scale=10",)).is_headline_of(PIPE)
    assert not replace(marked[0], overrides=marked[0].overrides + ("workload.iterations=3",)).is_headline_of(PIPE)
    text = scoreboard(tmp_path, ENTRIES)
    row = next(
        line for line in text.splitlines() if line.startswith(f"| `{PIPE.id}` | Pipe-SGD with truncation over D-Sync")
    )
    assert "| 2.10 (1.90-2.40), 3 runs |" in row and "20261130" not in row
    # listed apart among what the entry's directories hold
    assert (
        "headline with other overrides than the catalogue's headline (`pipe_sgd_timing-20261130-050000`, "
        "2026-11-30): samples/s: PS-Sync@model=resnet18 100.0; D-Sync@model=resnet18 200.0; "
        "Pipe-SGD+T@model=resnet18 2000.0"
    ) in text
    # with none of the catalogue's overrides, the ratio says so
    only = tmp_path / "only"
    _sweep(only, "s", {"PS-Sync": 1.0, "D-Sync": 1.0, "Pipe-SGD+T": 1.0}, overrides=[])
    row = next(
        line
        for line in scoreboard(only, ENTRIES).splitlines()
        if line.startswith(f"| `{PIPE.id}` | Pipe-SGD with truncation over D-Sync")
    )
    assert "| not run with the catalogue's headline overrides | - | - | - |" in row


def test_archive_keeps_the_small_files_and_never_overwrites(tmp_path):
    runs, dest = tmp_path / "runs", tmp_path / "archive"
    _three(runs)
    (runs / "unmarked-20261123-000000").mkdir()
    made = archive(runs, dest)
    assert sorted(p.name for p in made) == sorted(p.name for p in runs.iterdir() if (p / MARKER).exists())
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert not any("traces" in f for f in files) and len(files) == 3 * (3 + 3 * 2)
    assert scoreboard(dest, ENTRIES, command="c") == scoreboard(runs, ENTRIES, command="c").replace(
        str(runs), str(dest)
    )
    assert archive(runs, dest) == []  # the same files again: nothing new
    first = next(dest.rglob("summary.json"))
    first.write_text("{}")
    before = sorted(dest.rglob("*"))
    _sweep(runs, "pipe_sgd_timing-20261129-000000", {"PS-Sync": 1.0, "D-Sync": 1.0, "Pipe-SGD+T": 1.0})
    with pytest.raises(ScoreboardError, match="differ from the runs' and would be overwritten"):
        archive(runs, dest)
    assert sorted(dest.rglob("*")) == before and first.read_text() == "{}"


def test_reproduction_md_is_what_the_documented_command_prints(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    md = REPO_ROOT / "REPRODUCTION.md"
    assert md.read_text() == scoreboard("reproduction/runs")
    assert "testbed reproduce --scoreboard reproduction/runs > REPRODUCTION.md" in md.read_text()
    assert (
        "testbed reproduce --scoreboard reproduction/runs > REPRODUCTION.md"
        in (REPO_ROOT / "docs" / "reproduction.md").read_text()
    )


def test_every_headline_run_plans_and_its_ratios_name_its_variants():
    from testbed.runner import plan_experiment  # lazy: Mininet
    from testbed.spec import load_spec  # lazy: torch

    for e in (e for e in ENTRIES if e.headline is not None):
        exp = load_spec(REPO_ROOT / e.spec.path, overrides=e.overrides(headline=True))
        names = {v.get("name") for v in exp.variants}
        for r in e.headline.ratios:
            assert {r.numerator["variant"], r.denominator["variant"]} <= names, (e.id, r.claim)
        assert plan_experiment(exp)


def test_cli_scoreboard_archive_and_bad_arguments(tmp_path, capsys):
    _three(tmp_path / "runs")
    assert cli_main(["reproduce", "--scoreboard", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out == scoreboard(tmp_path / "runs", ENTRIES)
    assert cli_main(["reproduce", "--archive", str(tmp_path / "a"), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert cli_main(["reproduce", PIPE.id, "--repeat", "0"]) == 2
    assert "--repeat must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["reproduce", PIPE.id, "--quick", "--headline"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert cli_main(["reproduce", "--scoreboard", str(tmp_path / "none")]) == 2
    assert "not a directory" in capsys.readouterr().err


def _fake_runs(monkeypatch, truncated=lambda n: 100.0 + 100 * n, stop_at: int | None = None, times=None) -> list:
    """Make ``testbed reproduce`` run no network: each run_experiment call writes a sweep of
    PS-Sync 50, D-Sync 100 and Pipe-SGD+T ``truncated(n)`` samples/s (``n``: the calls so far,
    this one included) and returns its results; the call after ``stop_at`` calls raises, as a
    sitting that ends. With ``times``, every run of sweep ``n`` warms up 2 iterations and
    takes ``times(n)`` s per iteration (its iterations.csv). Returns the list of the
    experiments run."""
    import testbed.runner  # lazy: Mininet

    calls = []

    def fake_run(exp, progress=True, say=None):
        if stop_at is not None and len(calls) == stop_at:
            raise RuntimeError("the sitting ended")
        calls.append(exp)
        d = _sweep(
            Path(exp.run.runs_dir),
            f"pipe_sgd_timing-x{len(calls)}",
            {"PS-Sync": 50.0, "D-Sync": 100.0, "Pipe-SGD+T": truncated(len(calls))},
        )
        (d / MARKER).unlink()
        if times is not None:
            _protocol_runs([d], times(len(calls)))
        return [testbed.runner.RunResult(p.parent, json.loads(p.read_text())) for p in sorted(d.glob("*/summary.json"))]

    monkeypatch.setattr(testbed.runner, "run_experiment", fake_run)
    monkeypatch.setattr("testbed.reproduce.get_report", lambda name: type("R", (), {"main": lambda *a, **k: 0})())
    return calls


def test_headline_repeats_mark_each_sweep_and_print_the_ratios(tmp_path, monkeypatch, capsys):
    from testbed.reproduce import reproduce  # lazy: the runner

    calls = _fake_runs(monkeypatch)
    assert reproduce(PIPE, headline=True, repeat=3, runs_dir=tmp_path, progress=False) == 0
    assert [len(c.variants) for c in calls] == [3, 3, 3] and calls[0].workload.iterations == 11  # the headline's
    marks = find_marked(tmp_path)
    assert [(m.id, m.mode, m.repeat, m.repeats) for m in marks] == [(PIPE.id, "headline", i, 3) for i in (1, 2, 3)]
    assert json.loads((marks[0].path / MARKER).read_text())["overrides"] == PIPE.overrides(headline=True) + ["scale=40"]
    out = capsys.readouterr().out
    assert "# pipe_sgd.fig4_resnet18_timing: repeat 3 of 3" in out
    assert len({c.scale for c in calls}) == 1 and isinstance(calls[0].scale, float)  # one dilation for every variant
    assert (
        "| Pipe-SGD with truncation over D-Sync, ResNet-18, samples/s | 2.00-3.20 | 3.00 (2.00-4.00), 3 runs |" in out
    )


def test_a_dilation_check_runs_each_repeat_again_at_twice_the_dilation(tmp_path, monkeypatch, capsys):
    from testbed.reproduce import CHECK_FACTOR, NotRunnable, headline_scale, reproduce  # lazy: the runner

    calls = _fake_runs(monkeypatch, truncated=lambda n: 250.0)
    with pytest.raises(NotRunnable, match="--headline"):
        reproduce(PIPE, dilation_check=True, runs_dir=tmp_path, progress=False)
    assert calls == []
    assert reproduce(PIPE, headline=True, repeat=2, dilation_check=True, runs_dir=tmp_path, progress=False) == 0
    base = headline_scale(PIPE)
    assert [c.scale for c in calls] == [base, CHECK_FACTOR * base] * 2  # interleaved: each repeat, then its check
    marks = find_marked(tmp_path)
    assert [(m.repeat, m.dilation) for m in marks] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    out = capsys.readouterr().out
    assert f"# {PIPE.id}: repeat 2 of 2 at 2x the dilation (scale {CHECK_FACTOR * base:g}): the dilation check" in out
    assert "| 2.50 (2.50-2.50), 2 runs, +0.0% |" in out
    assert cli_main(["reproduce", PIPE.id, "--dilation-check"]) == 2
    assert "give --headline too" in capsys.readouterr().err


def test_a_headline_campaign_says_which_runs_had_not_settled_and_can_stop_at_the_first(tmp_path, monkeypatch, capsys):
    from testbed.reproduce import reproduce  # lazy: the runner

    # sweep 2's runs settle from 1.0 to 0.9 s within their measured iterations, beyond their noise
    settling = [1.5, 1.5, 1.0, 1.0, 1.0, 0.9, 0.9, 0.9]
    calls = _fake_runs(monkeypatch, times=lambda n: settling if n == 2 else [1.0] * 8)
    assert reproduce(PIPE, headline=True, repeat=3, runs_dir=tmp_path / "all", progress=False) == 0
    out = capsys.readouterr().out
    assert len(calls) == 3 and out.count("steadiness (the later half of the measured iterations") == 3
    assert out.count(": moved +0.0% (noise 0.0%): steady") == 6  # 3 runs in each of sweeps 1 and 3
    assert out.count(": moved -10.0% (noise 6.1%): NOT steady") == 3
    assert "stopping the campaign" not in out and "3 runs |" in out
    calls.clear()
    assert (
        reproduce(PIPE, headline=True, repeat=3, runs_dir=tmp_path / "stop", progress=False, stop_when_unsteady=True)
        == 1
    )
    out = capsys.readouterr().out
    assert len(calls) == 2 and [m.repeat for m in find_marked(tmp_path / "stop")] == [1, 2]
    assert "stopping the campaign after repeat 2: a ratio counts only when every run it compares had settled" in out
    assert "2 runs |" in out  # the ratios over the sweeps that ran
    # runs without iteration times are not known to have settled
    calls.clear()
    monkeypatch.undo()
    calls = _fake_runs(monkeypatch)
    assert (
        reproduce(PIPE, headline=True, repeat=2, runs_dir=tmp_path / "unknown", progress=False, stop_when_unsteady=True)
        == 1
    )
    out = capsys.readouterr().out
    assert len(calls) == 1 and "000_PS-Sync_model=resnet18: not known (no iteration times" in out
    assert cli_main(["reproduce", PIPE.id, "--stop-when-unsteady"]) == 2
    assert "give --headline too" in capsys.readouterr().err


def test_a_campaign_judges_a_run_without_iteration_times_as_the_scoreboard_does(tmp_path):
    """By the spread of its measured iterations' samples/s (as the scoreboard's protocol
    column, tested above): within 5 % it is steady, wider it is not known."""
    from testbed.reproduce import steadiness_lines  # lazy: the runner

    for top, verdict, settled in (
        (104.0, ": steady (no iteration times to test", True),
        (110.0, ": not known (no iteration times", False),
    ):
        d = _sweep(tmp_path / str(top), "pipe_sgd_timing-x", {"PS-Sync": 100.0})
        run = next(d.glob("*/summary.json")).parent
        (run / "summary.json").write_text(
            json.dumps({"status": "ok", "throughput": {"mean": 102.0, "min": 100.0, "max": top}})
        )
        lines, ok = steadiness_lines(d)
        assert ok is settled and any(verdict in line for line in lines), lines


def test_a_campaign_goes_on_in_another_sitting_and_pools_only_runs_of_the_same_code(tmp_path, monkeypatch, capsys):
    from analysis.scoreboard import last_campaign, protocol_problems
    from testbed.reproduce import reproduce  # lazy: the runner

    calls = _fake_runs(monkeypatch, stop_at=2)
    with pytest.raises(RuntimeError, match="sitting ended"):
        reproduce(PIPE, headline=True, repeat=3, runs_dir=tmp_path, progress=False)
    assert [m.repeat for m in find_marked(tmp_path)] == [1, 2]
    calls.append(None)  # the next sitting: one more sweep
    with pytest.raises(ValueError, match="within 1 to 3"):
        reproduce(PIPE, headline=True, repeat=3, first_repeat=4, runs_dir=tmp_path, progress=False)
    assert reproduce(PIPE, headline=True, repeat=3, first_repeat=3, runs_dir=tmp_path, progress=False) == 0
    out = capsys.readouterr().out
    assert "# pipe_sgd.fig4_resnet18_timing: repeat 3 of 3" in out and "| 3.00 (2.00-5.00), 3 runs |" in out
    marks = last_campaign([m for m in find_marked(tmp_path) if m.is_headline_of(PIPE)])
    assert [(m.repeat, m.repeats) for m in marks] == [(1, 3), (2, 3), (3, 3)]
    assert len({m.code for m in marks}) == 1 and len(marks[0].code) == 64
    res = ratio_result(PIPE, PIPE.headline.ratios[0], marks)
    assert res.values == pytest.approx([2.0, 3.0, 5.0])  # Pipe-SGD+T 200, 300, 500 over D-Sync 100
    assert not any("code" in p or "more than once" in p for p in protocol_problems(res))
    # a repeat that ran other code, or a repeat run twice, does not make a campaign
    other = json.loads((marks[2].path / MARKER).read_text()) | {"code": "0" * 64}
    (marks[2].path / MARKER).write_text(json.dumps(other))
    again = _sweep(tmp_path, "pipe_sgd_timing-x9", {"PS-Sync": 50.0, "D-Sync": 100.0, "Pipe-SGD+T": 300.0}, repeat=2)
    marks = last_campaign([m for m in find_marked(tmp_path) if m.is_headline_of(PIPE)])
    assert again in [m.path for m in marks]
    problems = protocol_problems(ratio_result(PIPE, PIPE.headline.ratios[0], marks))
    assert "the code of some runs is not recorded" in problems and "repeat 2 run more than once" in problems
    (again / MARKER).unlink()
    marks = last_campaign([m for m in find_marked(tmp_path) if m.is_headline_of(PIPE)])
    assert "its runs executed 2 versions of the code" in protocol_problems(
        ratio_result(PIPE, PIPE.headline.ratios[0], marks)
    )
    assert cli_main(["reproduce", PIPE.id, "--headline", "--repeat", "3", "--from-repeat", "4"]) == 2
    assert "--from-repeat must be within 1 to --repeat (3) (got 4)" in capsys.readouterr().err
    assert cli_main(["reproduce", PIPE.id, "--repeat", "3", "--from-repeat", "2"]) == 2
    assert "give --headline too" in capsys.readouterr().err


def test_only_the_last_set_of_repeats_is_pooled(tmp_path):
    from analysis.scoreboard import last_campaign

    old = _three(tmp_path, ratios=(1.0, 1.0, 1.0))
    new = [
        _sweep(
            tmp_path,
            f"pipe_sgd_timing-2026113{i}-050000",
            {"PS-Sync": 100.0, "D-Sync": 200.0, "Pipe-SGD+T": 200.0 * r},
            repeat=i + 1,
        )
        for i, r in enumerate((2.0, 2.2, 2.4))
    ]
    marked = find_marked(tmp_path)
    assert [m.path for m in last_campaign(marked)] == new and last_campaign(marked[:3]) == marked[:3]
    row = next(line for line in scoreboard(tmp_path, ENTRIES).splitlines() if line.startswith(f"| `{PIPE.id}` | "))
    assert "2.20 (2.00-2.40), 3 runs" in row and old[0].name not in row


def test_a_full_run_counts_for_every_entry_with_the_same_command(tmp_path):
    """A full sweep marked for one entry gives its values to every entry whose spec and
    overrides are the same; a headline sweep, or another command, does not."""
    alexnet = get_entry(ENTRIES, "pipe_sgd.fig4_alexnet_timing")
    same = [
        e
        for e in ENTRIES
        if e.spec is not None
        and e.id != PIPE.id
        and e.spec.path == PIPE.spec.path
        and e.overrides() == PIPE.overrides()
    ]
    assert alexnet.overrides() != PIPE.overrides()
    _sweep(
        tmp_path,
        "pipe_sgd_timing-20261124-050000",
        {"PS-Sync": 100.0, "D-Sync": 200.0},
        mode="full",
        overrides=PIPE.overrides(),
    )
    (full,) = find_marked(tmp_path)
    assert full.spec == "experiments/pipe_sgd_timing.yaml" and full.measures(PIPE) and not full.measures(alexnet)
    assert all(full.measures(e) for e in same)
    from dataclasses import replace

    assert not replace(full, id=alexnet.id, mode="headline").measures(PIPE)
    assert not replace(full, id=alexnet.id, spec="experiments/other.yaml").measures(PIPE)
    assert replace(full, id=alexnet.id).measures(PIPE)
    text = scoreboard(tmp_path, ENTRIES)
    assert f"{1 + len(same)} of {len(ENTRIES)} carry values measured here" in text
    # the entry whose command it shares lists it, naming whose run it is
    shared = replace(full, id=alexnet.id)
    (tmp_path / "pipe_sgd_timing-20261124-050000" / MARKER).write_text(
        json.dumps(
            {
                "id": alexnet.id,
                "mode": "full",
                "spec": shared.spec,
                "overrides": list(shared.overrides),
                "repeat": 1,
                "repeats": 1,
                "started": shared.started,
                "finished": shared.finished,
            }
        )
    )
    text = scoreboard(tmp_path, ENTRIES)
    row = next(line for line in text.splitlines() if line.startswith(f"| `{PIPE.id}` | {PIPE.title} |"))
    assert f"full (the run of `{alexnet.id}`, the same command) (`pipe_sgd_timing-20261124-050000`" in row
    # a sweep in which no run finished ok carries no value
    failed = tmp_path / "failed"
    _sweep(failed, "s", {"PS-Sync": 1.0}, mode="full", overrides=PIPE.overrides(), status={"PS-Sync": "failed"})
    assert f"0 of {len(ENTRIES)} carry values measured here" in scoreboard(failed, ENTRIES)
