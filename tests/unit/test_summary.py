"""The summary model (traffic.summary.RunSummary): every archived summary.json loads and is
written back key for key and value for value, unknown and absent keys included, and a
summary the analysis computes sets every key of the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import metrics
from common.provenance import PROVENANCE_FILE, collect
from tests.unit.test_analysis import make_run
from traffic.summary import RunSummary, Throughput

ROOT = Path(__file__).resolve().parents[2]
ARCHIVED = sorted((ROOT / "reproduction" / "runs").rglob("summary.json"))


def same_json(a, b, path="$") -> str | None:
    """Where ``a`` and ``b`` differ (a key, a value or a JSON type: ``1`` is not ``1.0``), or None."""
    if type(a) is not type(b):
        return f"{path}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(set(a) ^ set(b))} in one only"
        return next((d for k in a if (d := same_json(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := same_json(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def test_there_are_archived_summaries():
    assert len(ARCHIVED) > 10


@pytest.mark.parametrize("path", ARCHIVED, ids=lambda p: str(p.parent.relative_to(ROOT / "reproduction" / "runs")))
def test_every_archived_summary_loads_and_round_trips(path):
    s = RunSummary.load(path.parent)
    assert same_json(s.dump(), json.loads(path.read_text())) is None
    assert s.status == "ok" and s.throughput.mean > 0  # typed sections, not dicts
    # every link that carried training traffic was judged; a run with one worker and its server on
    # the same host (phub.fig15's 1-worker CS point) sends only a few KB of ARP and ND per iteration
    assert s.fidelity.rates.links or s.bytes_per_iteration.host_links < 10_000


def test_unknown_absent_and_null_keys_are_written_back_as_read(tmp_path):
    doc = {
        "status": "failed",
        "error": None,
        "run_id": "r",
        "analysis_errors": ["load: OSError: x"],
        "throughput": {"mean": 3.0, "from_a_newer_version": [1, 2]},
        "cpu": None,
        "extra": {"a": 1},
        "fidelity": {"rates": {"links": [{"iface": "tor1-eth1", "class": "host", "max_ratio": 0.5}]}},
    }
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    s = RunSummary.load(tmp_path)
    assert s.throughput.mean == 3.0 and s.cpu is None and s.bytes is None and s.segments == []
    assert s.fidelity.rates.links[0].link_class == "host"
    assert same_json(s.dump(), doc) is None
    again = tmp_path / "again"
    again.mkdir()
    assert s.write(again) == again / "summary.json"
    assert same_json(json.loads((again / "summary.json").read_text()), doc) is None


def test_a_computed_summary_sets_every_key_of_the_model(tmp_path):
    """Every field is written (null when it cannot be computed), except ``program`` (a
    researcher's program only), ``cpu.machines``/``cpu.worst_machine`` (a cluster run only) and
    ``throughput.ci95`` (read from older files only)."""
    s = metrics.summarize(make_run(tmp_path))
    doc = json.loads((tmp_path / "synthetic" / "summary.json").read_text())
    assert set(doc) == set(RunSummary.model_fields) - {"program"}
    read_only = {"throughput": {"ci95"}}  # the name of spread95 in older files: read, never written
    for section in ("throughput", "iteration_time_s", "bytes", "bytes_per_iteration", "fidelity"):
        model = type(getattr(s, section))
        assert set(doc[section]) == {f.alias or name for name, f in model.model_fields.items()} - read_only.get(
            section, set()
        ), section
    assert set(doc["cpu"]) == set(type(s.cpu).model_fields) - {"machines", "worst_machine"}
    assert set(doc["fidelity"]["rates"]["links"][0]) == {
        "iface",
        "class",
        "bw_mbps",
        "max_tx_mbps",
        "max_rx_mbps",
        "max_ratio",
    }
    assert same_json(RunSummary.load(tmp_path / "synthetic").dump(), doc) is None


def test_the_summary_records_the_congestion_control_the_hosts_used(tmp_path):
    """As each host read it back (``topology.json``), each once; None when no host says."""
    run = make_run(tmp_path)
    assert metrics.summarize(run).tcp_congestion_control == ["cubic"]
    topo = json.loads((run / "topology.json").read_text())
    topo["hosts"][1]["tcp_congestion_control"] = "bbr"
    (run / "topology.json").write_text(json.dumps(topo))
    assert metrics.summarize(run).tcp_congestion_control == ["bbr", "cubic"]
    for h in topo["hosts"]:
        del h["tcp_congestion_control"]
    (run / "topology.json").write_text(json.dumps(topo))
    assert metrics.summarize(run).tcp_congestion_control is None


def test_a_summary_with_ci95_reads_it_as_the_spread_and_writes_it_back(tmp_path):
    """A summary written before ``spread95`` had its name keeps ``ci95``; readers get it as
    :attr:`~traffic.summary.Throughput.spread`."""
    doc = {"status": "ok", "throughput": {"mean": 100.0, "ci95": 19.6, "std": 10.0}}
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    s = RunSummary.load(tmp_path)
    assert s.throughput.spread == 19.6 and s.throughput.spread95 is None and s.throughput.mean_ci95_low is None
    assert same_json(s.dump(), doc) is None
    assert Throughput(spread95=3.0, ci95=19.6).spread == 3.0


def test_the_provenance_section_round_trips(tmp_path):
    prov = collect(argv=["testbed", "run", "x.yaml"])
    s = RunSummary(status="ok", run_id="r", provenance=prov)
    s.write(tmp_path)
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["provenance"] == prov.dump() and doc["provenance"]["argv"] == ["testbed", "run", "x.yaml"]
    back = RunSummary.load(tmp_path)
    assert back.provenance == prov and isinstance(back.provenance.machine.cores_logical, int)
    assert same_json(back.dump(), doc) is None
    # a key a newer version adds is kept; an absent section reads as None
    doc["provenance"]["machine"]["gpu"] = "none"
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    assert same_json(RunSummary.load(tmp_path).dump(), doc) is None
    assert RunSummary.model_validate({"status": "ok"}).provenance is None


def test_a_summary_carries_the_run_s_provenance_json_also_when_killed(tmp_path):
    """The harness writes provenance.json first; the summary copies it, also the one
    ``testbed clean`` writes for a killed run (status ``killed``)."""
    run = make_run(tmp_path)
    prov = collect()
    (run / PROVENANCE_FILE).write_text(json.dumps(prov.dump()))
    s = metrics.summarize(run, status="killed", error="the runner died")
    assert s.status == "killed" and s.provenance == prov
    assert json.loads((run / "summary.json").read_text())["provenance"] == prov.dump()
    (run / PROVENANCE_FILE).unlink()
    assert metrics.summarize(run).provenance is None
    (run / PROVENANCE_FILE).write_text(json.dumps({"machine": {"cores_logical": "many"}}))
    s = metrics.summarize(run)  # an unreadable record is an analysis error, not a failed summary
    assert s.provenance is None and any(e.startswith("provenance:") for e in s.analysis_errors)
