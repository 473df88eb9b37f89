"""What the figures say: smoothed rates over the raw samples and the shaped rate, short labels
of runs side by side, a metric against a swept parameter, the paper's value on the reports'
figures. Behaviour (the data drawn, labels, errors), not pixels.

``make_rate_run`` writes a run directory whose bwm-ng trace has the sampling jitter of real
10 ms samples: the bytes of each interval are what the shaped link carried between two reads,
and the timestamps bwm-ng wrote are each off by up to 3 ms, so that single samples read up to
about 1.5 times the shaped rate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import analysis
from analysis import p3_report, paper_reference, phub_report, pipe_sgd_report, plots, stanza_report
from analysis import traces as tr
from testbed.cli import main as cli_main
from tests.unit.test_analysis import bwm_line
from tests.unit.test_reports import P3_POINTS, build_p3, build_pipe_sgd

T0 = 1_700_000_000.0
ARCHIVE = Path(__file__).resolve().parents[2] / "reproduction" / "runs"
P3_ARCHIVED = ARCHIVE / "p3_resnet50-20261126-225332"  # a marked headline sweep of p3.fig7a
PHUB_ARCHIVED = ARCHIVE / "phub_pbox-20261126-231800"  # a marked headline sweep of phub.fig12


def make_rate_run(
    root: Path,
    name: str = "rates",
    seconds: float = 60.0,
    bw_mbps: float = 100.0,
    change_at: float | None = 30.0,
    change_to: float = 50.0,
    scale: float = 1.0,
    seed: int = 0,
) -> Path:
    """A run of two hosts on one switch (h1 on s1-eth1): h1 sends at the shaped rate for the
    first 0.6 s of every second and receives a tenth of it; the kernel read the link back at
    ``bw_mbps`` / ``scale`` and a scheduled ``link_rate`` event read it back at ``change_to``
    / ``scale`` at ``change_at`` s. bwm-ng reads every 10 ms; its timestamps are off by 0-3 ms."""
    rng = np.random.default_rng(seed)
    d = root / name
    for sub in ("events", "results", "logs", "traces"):
        (d / sub).mkdir(parents=True)
    spec = {
        "name": name,
        "scale": scale,
        "topology": {"kind": "rack"},
        "workload": {"scheme": "ps", "model": "digits_mlp", "warmup_iterations": 0},
        "capture": {"interval_ms": 10},
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    shaped = {"qdisc": "htb", "rate_mbps": bw_mbps / scale, "leaf": "pfifo"}
    topo = {
        "kind": "rack",
        "scale": scale,
        "switches": [{"name": "s1", "role": "tor", "rack": 0}],
        "hosts": [{"name": "h1", "rack": 0}, {"name": "h2", "rack": 0}],
        "links": [
            {
                "class": "host",
                "node1": h,
                "intf1": f"{h}-eth0",
                "node2": "s1",
                "intf2": f"s1-eth{i + 1}",
                "rack": 0,
                "bw_mbps": bw_mbps,
                "shaped_mbps": bw_mbps / scale,
                "shaping": {f"{h}-eth0": shaped, f"s1-eth{i + 1}": shaped},
            }
            for i, h in enumerate(("h1", "h2"))
        ],
    }
    (d / "topology.json").write_text(json.dumps(topo))
    (d / "processes.json").write_text(
        json.dumps(
            {
                "processes": [
                    {"name": "worker0", "role": "worker", "rank": 0, "host": "h1"},
                    {"name": "worker1", "role": "worker", "rank": 1, "host": "h2"},
                ]
            }
        )
    )
    reads = T0 + np.arange(0.0, seconds + 1e-9, 0.01) * scale  # when bwm-ng read the counters
    stamps = reads + rng.uniform(0.0, 0.003, len(reads)) * scale  # when it wrote they were read
    lines = []
    for k in range(len(reads)):
        t = (reads[k] - T0) / scale
        rate = change_to if change_at is not None and t >= change_at else bw_mbps
        busy = (t % 1.0) < 0.6
        sent = int(rate * 1e6 / 8 * 0.01 / scale) if busy and k else 0  # bytes h1 sent in the interval
        lines.append(bwm_line(stamps[k], "s1-eth1", sent, sent // 10))
        lines.append(bwm_line(stamps[k], "s1-eth2", sent // 10, sent))
    (d / "traces" / "bwm-ng.csv").write_text("".join(lines))
    if change_at is not None:
        rec = {
            "index": 0,
            "kind": "link_rate",
            "target": "h1",
            "at_s": change_at,
            "applied": True,
            "ts": T0 + change_at * scale,
            "bw_mbps": change_to,
            "shaped_mbps": change_to / scale,
            "readback_mbps": {"s1-eth1": change_to / scale, "h1-eth0": change_to / scale},
        }
        (d / "schedule.jsonl").write_text(json.dumps(rec) + "\n")
    return d


@pytest.fixture
def figures(monkeypatch):
    """Every figure analysis saves, kept open for the test to read (still written)."""
    kept = []

    def keep(fig, path):
        kept.append(fig)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        return Path(path)

    monkeypatch.setattr(plots, "save_figure", keep)
    yield kept
    for fig in kept:
        plots.plt.close(fig)


def _labels(ax) -> list[str]:
    return [a.get_label() for a in ax.lines + ax.collections + ax.patches]


# ----------------------------------------------------------------------------- rates over time


def test_smoothed_rates_are_a_rolling_mean_of_the_raw_samples(tmp_path):
    run = analysis.load(make_rate_run(tmp_path, seconds=5.0, change_at=None))
    smooth = tr.smoothed_rates(run.rates, 0.1)
    assert len(smooth) == len(run.rates)
    for iface in ("s1-eth1", "s1-eth2"):
        raw = run.rates[run.rates["iface"] == iface].sort_values("time")
        got = smooth[smooth["iface"] == iface].sort_values("time")
        t, dt = raw["time"].to_numpy(), raw["dt_s"].to_numpy()
        inner = (t > t[0] + 0.1) & (t < t[-1] - 0.1)  # interior samples: a whole window each ...
        inner &= [np.abs(np.abs(t - ti) - 0.05).min() > 1e-6 for ti in t]  # ... and none on its edge
        for col in ("tx_bps", "rx_bps"):
            v = raw[col].to_numpy()
            # the mean of the samples within 50 ms either side, weighted by their intervals
            near = [(t > ti - 0.05) & (t <= ti + 0.05) for ti in t]
            want = np.array([np.average(v[m], weights=dt[m]) for m in near])
            np.testing.assert_allclose(got[col].to_numpy()[inner], want[inner], rtol=1e-9)
    h1_tx = run.rates[run.rates["iface"] == "s1-eth1"]["rx_bps"] / 1e6
    assert h1_tx.max() > 120  # the jitter alone puts single samples far above the shaped 100
    assert (smooth[smooth["iface"] == "s1-eth1"]["rx_bps"] / 1e6).max() < 105


def test_shaped_rate_is_the_kernels_read_back_in_emulated_units(tmp_path):
    run = analysis.load(make_rate_run(tmp_path, scale=4.0))
    shaped = run.shaped_rate("s1-eth1")
    assert list(shaped.to_numpy()) == pytest.approx([100.0, 50.0])
    assert shaped.index[0] == run.t0 and shaped.index[1] - run.t0 == pytest.approx(30.0, abs=0.01)
    assert run.shaped_rate("s1-eth2").to_numpy() == pytest.approx([100.0])
    assert run.shaped_rate("nowhere").empty


def test_rate_plot_smoothed_over_faint_samples_with_the_shaped_rate(tmp_path, figures):
    run = analysis.load(make_rate_run(tmp_path))
    plots.plot_interface_rates(run, path=tmp_path / "r.png", span=(20.0, 40.0))
    ax = figures[-1].axes[0]
    lines = {ln.get_label(): ln for ln in ax.lines}
    tx = lines["h1 tx (100 ms mean)"]  # the smoothed series, labelled; the raw one drawn faint, unlabelled
    smooth = tr.smoothed_rates(run.rates, plots.SMOOTH_S)
    want = smooth[smooth["iface"] == "s1-eth1"]["rx_bps"].to_numpy() / 1e6
    np.testing.assert_allclose(tx.get_ydata(), want)
    faint = [ln for ln in ax.lines if ln.get_label().startswith("_") and ln.get_alpha() is not None]
    assert faint and all(ln.get_alpha() < 0.5 for ln in faint)
    shaped = lines["shaped rate (read back)"]
    assert shaped.get_linestyle() == "--" and set(np.round(shaped.get_ydata(), 6)) == {100.0, 50.0}
    assert ax.get_xlim() == pytest.approx((20.0, 40.0))
    assert "Mbit/s" in ax.get_ylabel() and "(s" in figures[-1].axes[-1].get_xlabel()
    assert "10 ms samples" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_rate_plot_without_read_back_draws_the_configured_rate(tmp_path, figures):
    d = make_rate_run(tmp_path, change_at=None)
    topo = json.loads((d / "topology.json").read_text())
    for link in topo["links"]:
        link["shaping"] = {}
    (d / "topology.json").write_text(json.dumps(topo))
    plots.plot_interface_rates(d, path=tmp_path / "r.png", smooth_s=None)
    assert "configured 100 Mbit/s" in _labels(figures[-1].axes[0])


def test_testbed_plot_window_zooms_and_refuses_a_bad_one(tmp_path, capsys, figures):
    d = make_rate_run(tmp_path)
    assert cli_main(["plot", str(d), "--window", "10:12", "--smooth-ms", "50"]) == 0
    assert figures[0].axes[0].get_xlim() == pytest.approx((10.0, 12.0))
    assert (d / "plots" / "rates-h1.png").is_file()
    for bad in ("12:10", "10", "a:b", ":"):
        with pytest.raises(SystemExit) as e:
            cli_main(["plot", str(d), "--window", bad])
        assert e.value.code == 2
        assert "START:END" in capsys.readouterr().err


# ----------------------------------------------------------------------------- runs side by side


def test_run_labels_name_the_variant_and_only_what_varies(tmp_path):
    sweep = build_p3(tmp_path)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    labels, groups, kind = plots.run_labels(runs)
    assert kind == "variant"
    want = [f"{v}, host_bw_mbps={bw}" for (bw, v) in P3_POINTS]
    assert labels == want and groups == [v for (_, v) in P3_POINTS]
    assert not any(r.name in label for r, label in zip(runs, labels))


def test_run_labels_without_a_sweep_use_the_spec_fields_that_differ(tmp_path):
    a = make_rate_run(tmp_path, "a", bw_mbps=100.0)
    b = make_rate_run(tmp_path, "b", bw_mbps=100.0)
    spec = yaml.safe_load((b / "spec.yaml").read_text())
    spec["workload"]["scheme"] = "ring"
    spec["topology"]["host_bw_mbps"] = 400.0
    (b / "spec.yaml").write_text(yaml.safe_dump(spec))
    labels, groups, kind = plots.run_labels([a, b])
    assert labels == ["scheme=ps", "scheme=ring, host_bw_mbps=400"] and (groups, kind) == (["ps", "ring"], "scheme")


def test_throughput_bars_coloured_per_variant_with_a_legend(tmp_path, figures):
    sweep = build_p3(tmp_path)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    plots.plot_throughput(runs, tmp_path / "tp.png")
    ax = figures[-1].axes[0]
    colours = [tuple(b.get_facecolor()) for b in ax.patches]
    by_variant = {}
    for (_, v), c in zip(P3_POINTS, colours):
        by_variant.setdefault(v, set()).add(c)
    assert all(len(c) == 1 for c in by_variant.values()) and len({next(iter(c)) for c in by_variant.values()}) == 3
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["baseline", "slicing", "p3"] and ax.get_legend().get_title().get_text() == "variant"
    assert "error bars: +-1.96 sd of the measured iterations (samples_per_s_spread95)" in ax.get_title()
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "baseline\nhost_bw_mbps=2000"  # one parameter a line


def test_testbed_plot_draws_an_archived_sweeps_bars_from_its_small_files(tmp_path, capsys, figures):
    """Archived runs keep only spec.yaml and summary.json: no rates, no iterations, but the
    side-by-side chart has what it needs (written where --out says, not into the archive)."""
    out = tmp_path / "tp.png"
    assert cli_main(["plot", str(P3_ARCHIVED), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    ticks = [t.get_text() for t in figures[-1].axes[0].get_xticklabels()]
    assert ticks == ["baseline", "p3", "baseline-lowat-default", "p3-lowat-default"]


def test_error_bars_prefer_the_interval_of_the_mean_then_the_spread():
    df = pd.DataFrame(
        {
            "samples_per_s": [100.0, 200.0],
            "samples_per_s_spread95": [10.0, 20.0],
            "samples_per_s_mean_ci95_low": [98.0, None],
            "samples_per_s_mean_ci95_high": [103.0, None],
        }
    )
    yerr, words = plots.error_bars(df, "samples_per_s")
    assert yerr.tolist() == [[2.0, 0.0], [3.0, 0.0]]  # uneven bounds; a row without them: no bar
    assert words == ("95 % confidence interval of the mean (samples_per_s_mean_ci95_low, samples_per_s_mean_ci95_high)")
    yerr, words = plots.error_bars(df.drop(columns=["samples_per_s_mean_ci95_low"]), "samples_per_s")
    assert yerr.tolist() == [[10.0, 20.0], [10.0, 20.0]]
    assert words == "+-1.96 sd of the measured iterations (samples_per_s_spread95)"
    assert plots.error_bars(df[["samples_per_s"]], "samples_per_s") is None


# ----------------------------------------------------------------------------- a metric against a parameter


def test_testbed_plot_x_draws_one_line_per_variant(tmp_path, capsys, figures):
    sweep = build_p3(tmp_path)
    assert cli_main(["plot", str(sweep), "--x", "host_bw_mbps"]) == 0
    assert f"wrote {sweep / 'plots' / 'sweep-host_bw_mbps.png'}" in capsys.readouterr().out
    ax = figures[-1].axes[0]
    variants = [c.get_label() for c in ax.containers]
    assert variants == ["baseline", "slicing", "p3"]
    p3_line = ax.containers[2][0]
    assert list(p3_line.get_ydata()) == [130.0, 225.0, 300.0]
    assert p3_line.get_xdata() == pytest.approx([2000, 4000, 8000], abs=0.15 * 2000)  # set apart a little
    assert "error bars: +-1.96 sd of the measured iterations (samples_per_s_spread95)" in ax.get_title()
    assert ax.get_ylabel() == "throughput (samples/s)" and ax.get_xlabel() == "topology.host_bw_mbps"


def test_testbed_plot_y_takes_another_metric_and_a_ci_column(tmp_path, figures):
    sweep = build_p3(tmp_path)
    df = pd.read_csv(sweep / "sweep.csv")
    df["iter_mean_s_spread95"] = 0.5
    df["iter_mean_s_mean_ci95_low"] = df["iter_mean_s"] - 0.01
    df["iter_mean_s_mean_ci95_high"] = df["iter_mean_s"] + 0.03
    df.to_csv(sweep / "sweep.csv", index=False)
    out = tmp_path / "it.png"
    assert cli_main(["plot", str(sweep), "--x", "topology.host_bw_mbps", "--y", "iter_mean_s", "--out", str(out)]) == 0
    ax = figures[-1].axes[0]
    assert out.is_file() and ax.get_ylabel() == "mean iteration time (s)"
    bars = ax.containers[0].lines[2][0].get_segments()
    assert all(seg[1][1] - seg[0][1] == pytest.approx(0.04) for seg in bars)  # -0.01 +0.03: the CI, not the spread
    assert "error bars: 95 % confidence interval of the mean (iter_mean_s_mean_ci95_low" in ax.get_title()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--x", "bandwidth"], "allowed: topology.host_bw_mbps"),
        (
            ["--x", "host_bw_mbps", "--y", "speed"],
            "allowed: samples_per_s, iter_mean_s, iter_p95_s, core_bytes, accuracy",
        ),
        (["--y", "iter_mean_s"], "--x PARAM"),
    ],
)
def test_testbed_plot_x_names_the_allowed_columns(tmp_path, capsys, args, says):
    sweep = build_p3(tmp_path)
    assert cli_main(["plot", str(sweep), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_testbed_plot_x_refuses_a_run_directory(tmp_path, capsys):
    run = sorted(p for p in build_p3(tmp_path).iterdir() if p.is_dir())[0]
    assert cli_main(["plot", str(run), "--x", "host_bw_mbps"]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the paper's value


def test_paper_ratios_of_a_marked_headline_sweep():
    (r,) = paper_reference.paper_ratios([P3_ARCHIVED])
    df = pd.read_csv(P3_ARCHIVED / "sweep.csv").set_index("variant")
    assert r.entry == "p3.fig7a" and r.paper == (1.26, 1.26) and r.label == "paper: p3 1.26x baseline"
    assert r.measured == pytest.approx(df.at["p3", "samples_per_s"] / df.at["baseline", "samples_per_s"])
    assert r.reference(df.at["p3", "samples_per_s"]) == pytest.approx((1.26 * df.at["baseline", "samples_per_s"],) * 2)


def test_paper_ratios_read_a_full_sweep_at_the_headlines_point(tmp_path):
    """An unmarked sweep of the spec the entry names: read at the headline's 4 Gbit/s."""
    (r,) = paper_reference.paper_ratios([build_p3(tmp_path)])
    assert r.numerator_run.name == "005_host_bw_mbps=4000_p3" and r.measured == pytest.approx(225.0 / 180.0)
    assert paper_reference.paper_ratios([tmp_path / "p3_resnet50" / "000_host_bw_mbps=2000_baseline"]) == []


def test_p3_report_figure_has_the_paper_line(tmp_path, figures):
    p3_report.plots([build_p3(tmp_path)], tmp_path / "out")
    ax = figures[0].axes[0]
    (paper,) = [ln for ln in ax.lines if ln.get_label().startswith("paper")]
    assert list(paper.get_ydata()) == pytest.approx([1.26 * 180.0] * 2)  # the baseline at 4 Gbit/s x the ratio
    x0, x1 = paper.get_xdata()
    assert x0 < 4000 < x1 and x1 - x0 < 2000  # drawn at the 4 Gbit/s point only


def test_phub_report_figure_has_the_paper_line_on_the_speedup(tmp_path, figures):
    phub_report.plots([PHUB_ARCHIVED], tmp_path / "out")
    ax = figures[0].axes[0]
    (paper,) = [ln for ln in ax.lines if ln.get_label() == "paper: pbox 2.7x mxnet-cs"]
    assert list(paper.get_ydata()) == pytest.approx([2.7, 2.7])  # the speedup axis: the ratio itself


def test_pipe_sgd_report_figure_has_the_papers_ranges_as_bands(tmp_path, figures):
    sweep = build_pipe_sgd(tmp_path)
    pipe_sgd_report.plots([sweep], tmp_path / "out")
    ax = [f for f in figures if f.axes and f.axes[0].get_ylabel() == "ms per iteration"][0].axes[0]
    bands = {p.get_label(): p for p in ax.patches if p.get_label().startswith("paper")}
    assert set(bands) == {"paper: Pipe-SGD+T 2-3.2x D-Sync", "paper: Pipe-SGD+T 4-5.4x PS-Sync"}
    band = bands["paper: Pipe-SGD+T 2-3.2x D-Sync"]
    # D-Sync's period is 200 ms: 2-3.2x its throughput is a period of 62.5-100 ms
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((200 / 3.2, 200 / 2.0), rel=0.02)


def test_pipe_sgd_report_writes_no_accuracy_plot_for_a_sweep_without_evaluations(tmp_path, figures):
    """A timing sweep evaluates nothing: only the breakdown is written, with no empty legend."""
    written = pipe_sgd_report.plots([build_pipe_sgd(tmp_path / "timing", evaluations=False)], tmp_path / "out")
    assert [p.name for p in written] == ["breakdown.png"]
    assert not (tmp_path / "out" / "accuracy.png").exists() and (tmp_path / "out" / "breakdown.png").is_file()
    # with eval events, both
    written = pipe_sgd_report.plots([build_pipe_sgd(tmp_path / "eval")], tmp_path / "both")
    assert [p.name for p in written] == ["accuracy.png", "breakdown.png"] and all(p.is_file() for p in written)
    acc = [f for f in figures if f.axes and f.axes[0].get_ylabel() == "top-1 test accuracy"]
    assert len(acc) == 1 and acc[0].axes[0].get_legend() is not None


def test_stanza_report_draws_each_ratio_at_its_pair_with_one_legend_entry(tmp_path, figures):
    """The archived AlexNet sweep, its compute profiles renamed to the ones the catalogue's
    current headline selects (the two ends of the band): the paper's 13.9x on each pair."""
    sweep = tmp_path / "stanza"
    shutil.copytree(ARCHIVE / "stanza_speedup_alexnet-20261123-050327", sweep)
    for f in [sweep / "sweep.csv", *sweep.glob("*/spec.yaml")]:
        f.write_text(
            f.read_text()
            .replace("profiles/alexnet-v100-b128", "profiles/alexnet-v100fig8low-b128")
            .replace("profiles/alexnet-v100table1-b128", "profiles/alexnet-v100fig8high-b128")
        )
    stanza_report.plots([sweep], tmp_path / "out")
    ax = figures[0].axes[0]
    paper = [ln for ln in ax.lines if "stanza 13.9x ps" in ln.get_label()]
    assert len(paper) == 2 and sum(not c.get_label().startswith("_") for c in paper) == 1
    speedups = [b.get_height() for b in ax.patches if not b.get_label().startswith("paper")]
    df = pd.read_csv(sweep / "sweep.csv").set_index(["variant", "workload.compute.profile"])["samples_per_s"]
    for c, bar, profile in zip(paper, speedups, ("fig8low", "fig8high")):
        key = f"experiments/stanza_profiles/alexnet-v100{profile}-b128.json"
        measured = df[("stanza", key)] / df[("ps", key)]
        assert c.get_ydata()[0] == pytest.approx(bar * 13.9 / measured)


def test_a_sweep_without_a_catalogue_entry_draws_no_paper_line(tmp_path, figures):
    sweep = build_p3(tmp_path)
    spec = yaml.safe_load((sweep / "sweep.yaml").read_text())
    spec["name"] = "my_own_sweep"
    (sweep / "sweep.yaml").write_text(yaml.safe_dump(spec))
    p3_report.plots([sweep], tmp_path / "out")
    assert not any(label.startswith("paper") for label in _labels(figures[0].axes[0]))
