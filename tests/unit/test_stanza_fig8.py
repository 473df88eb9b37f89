"""Stanza Fig. 8 from the performance models (``testbed report stanza --fig8``), no emulation.

The printed numbers are checked against the equations written out here again (eqs. (2)-(4)
for Stanza, (6)-(7) for PS, Stanza §4.2.1 and §7.1) on the constants read straight from
the profile files, and the node assignments against an exhaustive search written here; a
profile whose FC layers are slow makes the search pick several FC workers, so the check is
not only of the ``n_f = 1`` corner.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis import report as skeleton
from analysis import stanza_report
from analysis.paper_models import stanza as sm
from common.errors import TestbedError
from testbed.cli import main as cli_main
from tests.markdown import tables as _tables
from tests.profile_scripts import assert_shipped, load_script
from traffic.compute_profiles import DATA_DIR, load_profile, profile_filename

ALEXNET = stanza_report.FIG8_PROFILES["alexnet"]  # experiments/stanza_profiles/alexnet-v100-b128.json
BITS = 32  # a float32 value on the wire


def _rounds(n: int) -> int:
    """Recursive doubling rounds of §4.1.2 as eq. (3) counts them."""
    return int(math.log2(n)) if n & (n - 1) == 0 else math.floor(math.log2(n)) + 2


def _t_stanza(c, n_c: int, n_f: int, bw_bps: float) -> float:
    """Eq. (3) with eq. (2): T_c + n_c/n_f T_f + 2 n_c A K / (n_f B) + P_c R(n_c) / B."""
    return (
        c.T_c + n_c / n_f * c.T_f + 2 * n_c * c.A * c.K * BITS / (n_f * bw_bps) + c.P_c * _rounds(n_c) * BITS / bw_bps
    )


def _t_ps(c, n_w: int, n_s: int, bw_bps: float) -> float:
    """Eq. (6): 2 n_w P / (n_s B) + T_ps."""
    return 2 * n_w * c.P * BITS / (n_s * bw_bps) + c.T_ps


def _best(N: int, time_s) -> int:
    """Exhaustive search over a + b = N of the highest a / time_s(a, b) (throughput up to
    the constant K), ties to the larger a; returns a."""
    return max(range(1, N), key=lambda a: (a / time_s(a, N - a), a))


def _constants_from_file(path: Path, split: int):
    """Table 3's compute constants summed straight from a profile file (not through
    ``Constants.from_profile``), the sizes from the model."""
    doc = json.loads(path.read_text())
    t = [l["forward_s"] + l["backward_s"] for l in doc["layers"]]
    c = sm.Constants.from_profile(doc["model"], load_profile(str(path), doc["model"], doc["batch_size"]))
    assert c.T_c == pytest.approx(sum(t[:split]), rel=1e-12) and c.T_f == pytest.approx(sum(t[split:]), rel=1e-12)
    return c


def test_printed_fig8_equals_the_equations(capsys):
    c = _constants_from_file(ALEXNET, split=5)  # AlexNet: conv1-conv5, then fc6-fc8
    assert c.K == 128 and c.A == 9216  # Stanza Table 5's batch; §3.2's 9216 activations per sample
    argv = ["report", "stanza", "--fig8", "alexnet", "--fig8-gbps", "40", "25", "--fig8-nodes", "80", "10"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "The paper's T_ps, T_c and T_f come from its EC2 runs (Tesla V100, §7.1) and are not printed" in flat
    assert "the compute profiles below stand in for them" in flat
    assert f"T_c {1e3 * c.T_c:.2f} ms, T_f {1e3 * c.T_f:.2f} ms, T_ps {1e3 * c.T_ps:.2f} ms" in flat
    assert "experiments/stanza_profiles/alexnet-v100-b128.json" in out
    assert "paper (§7.2, alexnet, its own T_ps, T_c, T_f): 80 nodes at 40G 1.79x" in out
    (rows,) = _tables(out)
    # bandwidths and node counts ascending, whatever order they were given in
    assert [(r["Gbit/s"], r["N"]) for r in rows] == [("25", "10"), ("25", "80"), ("40", "10"), ("40", "80")]
    prev = {}
    for r in rows:
        N, B = int(r["N"]), float(r["Gbit/s"]) * 1e9
        n_c, n_w = _best(N, lambda a, b: _t_stanza(c, a, b, B)), _best(N, lambda a, b: _t_ps(c, a, b, B))
        assert (r["n_c"], r["n_f"], r["n_w"], r["n_s"]) == (str(n_c), str(N - n_c), str(n_w), str(N - n_w))
        ts, tp = _t_stanza(c, n_c, N - n_c, B), _t_ps(c, n_w, N - n_w, B)
        thr_s, thr_p = n_c * c.K / ts, n_w * c.K / tp  # eqs. (4), (7)
        assert r["Stanza ms"] == f"{1e3 * ts:.2f}" and r["PS ms"] == f"{1e3 * tp:.2f}"
        assert r["Stanza 10^3/s"] == f"{thr_s / 1e3:.3f}" and r["PS 10^3/s"] == f"{thr_p / 1e3:.3f}"
        assert r["speedup"] == f"{thr_s / thr_p:.3f}"
        if r["Gbit/s"] in prev:
            s0, p0 = prev[r["Gbit/s"]]
            assert r["Stanza scale"] == f"{thr_s / s0:.3f}" and r["PS scale"] == f"{thr_p / p0:.3f}"
        else:
            assert r["Stanza scale"] == r["PS scale"] == "-"
        prev[r["Gbit/s"]] = (thr_s, thr_p)


def _slow_fc_profile(tmp_path: Path) -> Path:
    """AlexNet at batch 128 with the FC layers 20 times slower: FC compute then outweighs the
    CONV-FC transfer, so eq. (5) picks several FC workers."""
    doc = json.loads(ALEXNET.read_text())
    for layer in doc["layers"][5:]:
        layer["forward_s"] *= 20
        layer["backward_s"] *= 20
    p = tmp_path / "alexnet-slowfc-b128.json"
    p.write_text(json.dumps(doc))
    return p


def test_node_assignment_equals_an_exhaustive_search(tmp_path):
    prof = _slow_fc_profile(tmp_path)
    c = _constants_from_file(prof, split=5)
    df = stanza_report.fig8_rows([str(prof)], gbps=[10, 100], nodes=range(2, 17))
    assert len(df) == 2 * 15
    for r in df.itertuples():
        B = r.gbps * 1e9
        n_c = _best(r.N, lambda a, b: _t_stanza(c, a, b, B))
        n_w = _best(r.N, lambda a, b: _t_ps(c, a, b, B))
        assert (r.n_c, r.n_f, r.n_w, r.n_s) == (n_c, r.N - n_c, n_w, r.N - n_w), r
        assert r.stanza_sps == pytest.approx(n_c * c.K / _t_stanza(c, n_c, r.N - n_c, B), rel=1e-12)
        assert r.ps_sps == pytest.approx(n_w * c.K / _t_ps(c, n_w, r.N - n_w, B), rel=1e-12)
    assert (df["n_f"] > 1).any() and (df["n_s"] > 1).any()  # not only the corner n_f = n_s = 1


def test_fig8_models_are_at_table5_batch_and_another_batch_says_so():
    assert "## Fig. 8: vgg19, K = 64 per node:" in stanza_report.fig8_text(["vgg19"], gbps=[100], nodes=[5])
    assert "K = 128 per node:" in stanza_report.fig8_text(["alexnet"], gbps=[100], nodes=[5])
    at32 = str(DATA_DIR / profile_filename("vgg19", "v100", 32))
    text = stanza_report.fig8_text([at32], gbps=[100], nodes=[5])
    assert "## Fig. 8: vgg19, K = 32 per node (Stanza Table 5 trains vgg19 with 64 per worker)" in text


def _profile(tmp_path: Path, name: str, doc) -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def test_bad_fig8_input_is_refused_clearly(tmp_path):
    with pytest.raises(skeleton.ReportError, match=r"'resnet' is neither a model of Fig. 8 \(alexnet, vgg16, vgg19\)"):
        stanza_report.fig8_text(["resnet"])
    with pytest.raises(skeleton.ReportError, match="every node count must be at least 2.*got 1"):
        stanza_report.fig8_text(["alexnet"], nodes=[5, 1])
    with pytest.raises(skeleton.ReportError, match="every bandwidth must be a finite number of Gbit/s > 0, got -1, 40"):
        stanza_report.fig8_text(["alexnet"], gbps=[40, -1])
    with pytest.raises(skeleton.ReportError, match="give at least one model"):
        stanza_report.fig8_rows([])
    with pytest.raises(
        skeleton.ReportError, match="is a directory, not a compute profile; give run or sweep directories before --fig8"
    ):
        stanza_report.fig8_constants(str(tmp_path))
    with pytest.raises(skeleton.ReportError, match="cannot read compute profile"):
        stanza_report.fig8_constants(str(tmp_path / "nope.json"))
    with pytest.raises(skeleton.ReportError, match="is not JSON"):
        stanza_report.fig8_constants(str(_profile(tmp_path, "text.json", "conv1 1 ms")))
    with pytest.raises(skeleton.ReportError, match="is not a compute profile"):
        stanza_report.fig8_constants(str(_profile(tmp_path, "nomodel.json", {"batch_size": 32, "layers": []})))
    layer = {"forward_s": 0.0, "backward_s": 0.0, "flops_forward": None, "flops_backward": None}
    lstm = {
        "model": "sockeye_lstm",
        "device": "x",
        "batch_size": 32,
        "source": "test",
        "method": "zero",
        "derived": False,
        "layers": [{"index": i, "name": f"l{i}", **layer} for i in range(4)],
    }
    with pytest.raises(skeleton.ReportError, match="has no CONV/FC split_index; Stanza's model needs a CONV/FC"):
        stanza_report.fig8_constants(str(_profile(tmp_path, "lstm.json", lstm)))
    short = dict(json.loads(ALEXNET.read_text()))
    short["layers"] = short["layers"][:3]
    with pytest.raises(TestbedError, match="has 3 layers but model 'alexnet' has 8"):
        stanza_report.fig8_constants(str(_profile(tmp_path, "short.json", short)))


def test_testbed_report_stanza_fig8_needs_no_run_but_something(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["report", "stanza"])
    assert e.value.code == 2
    assert "give RUN_OR_SWEEP directories or --fig8" in capsys.readouterr().err
    assert cli_main(["report", "stanza", "--fig8", "vgg16", "--fig8-nodes", "1"]) == 2
    assert "testbed: error: --fig8-nodes: every node count must be at least 2" in capsys.readouterr().err
    # a report without standalone options still needs its paths
    with pytest.raises(SystemExit):
        cli_main(["report", "ibatch"])
    capsys.readouterr()
    assert (
        cli_main(
            [
                "report",
                "stanza",
                "--fig8",
                "alexnet",
                "vgg16",
                "--fig8-nodes",
                "5",
                "10",
                "20",
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert len(_tables(out)) == 2 and "run figures" not in out
    pngs = [line.split("plot: ", 1)[1] for line in out.splitlines() if line.startswith("plot: ")]
    assert pngs == [str(tmp_path / "plots" / "stanza_fig8.png")] and Path(pngs[0]).stat().st_size > 5_000
    # the module's own command line
    assert stanza_report.main(["--fig8", "alexnet", "--fig8-gbps", "40", "--fig8-nodes", "80"]) == 0
    (rows,) = _tables(capsys.readouterr().out)
    assert [(r["Gbit/s"], r["N"]) for r in rows] == [("40", "80")]


def _derive_fig8():
    return load_script("derive_fig8")


def test_the_fig8_band_gives_the_papers_ratios_and_ships_as_derived_profiles():
    d = _derive_fig8()
    b = d.band()
    for st, s in zip(d.STATEMENTS, b.factors):
        # the equations written out here, on the shape of alexnet-v100-b128.json x s
        c = d.scaled_constants(b.c0, s)
        B = st.gbps * 1e9
        n_c = _best(st.nodes, lambda a, k: _t_stanza(c, a, k, B))
        n_w = _best(st.nodes, lambda a, k: _t_ps(c, a, k, B))
        ratio = (n_c / _t_stanza(c, n_c, st.nodes - n_c, B)) / (n_w / _t_ps(c, n_w, st.nodes - n_w, B))
        assert ratio == pytest.approx(st.ratio, rel=1e-9), st
    assert [round(b.c0.T_c * s, 4) for s in b.factors] == [0.1600, 0.1340, 0.1006, 0.0990]
    assert (b.low[1].ratio, b.low[1].nodes, b.high[1].ratio, b.high[1].nodes) == (1.55, 80, 1.79, 80)
    speedups = []
    for which in ("low", "high"):
        want = d.end_profile(b, which)
        path = ALEXNET.parent / f"alexnet-v100fig8{which}-b128.json"
        assert_shipped(path, want, rel=1e-9)
        assert "experiments/stanza_profiles/derive_fig8.py" in want.method
        c = _constants_from_file(path, split=5)
        B = 10e9  # Fig. 6a: 10 CONV + 1 FC against 10 workers + 1 server at 10 Gbit/s
        speedups.append(_t_ps(c, 10, 1, B) / _t_stanza(c, 10, 1, B))
        assert d.fig6a(c)["speedup"] == pytest.approx(speedups[-1], rel=1e-12)
    assert [round(x, 2) for x in speedups] == [13.14, 9.65]
