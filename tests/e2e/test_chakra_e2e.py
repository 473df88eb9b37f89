"""Chakra traces on the emulated network: the quickstart's allreduce run exported, read by
mlc-chakra's ``chakra_jsonizer`` and replayed moves the same bytes over the core and keeps its
iteration time; the trace made by PyTorch's profiler (tests/data/chakra, from
scripts/make_chakra_trace.py) replays to the end. Needs root and mlc-chakra; slow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.runner import run_experiment
from testbed.spec import from_dict, load_spec
from tests.leftovers import needs_root
from tests.link_payload import core_payload

pytest.importorskip("chakra", reason="needs mlc-chakra (the extra 'chakra')")

from traffic.chakra.export import export_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
root_only = pytest.mark.skipif(needs_root, reason="needs root")


def _jsonizer() -> str:
    return shutil.which("chakra_jsonizer") or str(Path(sys.executable).parent / "chakra_jsonizer")


def _replay(prefix: Path, topology: dict, runs: Path, iterations: int | None = None, scale=None):
    workload = {"trace": {"path": str(prefix)}}
    if iterations is not None:
        workload["iterations"] = iterations
    spec = {
        "name": "replay",
        "topology": topology,
        "workload": workload,
        "capture": {"interval_ms": 10},
        "run": {"runs_dir": str(runs), "timeout_s": 240},
    }
    if scale is not None:  # the original's dilation: the same compute and link times
        spec["scale"] = scale
    exp = from_dict(spec)
    (res,) = run_experiment(exp, progress=False)
    return res


@pytest.mark.slow
@root_only
def test_an_exported_quickstart_allreduce_run_replays_the_same_bytes_and_time(tmp_path):
    exp = load_spec(
        ROOT / "experiments" / "quickstart.yaml",
        overrides=["workload.scheme=allreduce", f"run.runs_dir={tmp_path / 'runs'}"],
    )
    (orig,) = run_experiment(exp, progress=False)
    assert orig.ok, orig.summary.error
    files = export_run(orig.run_dir, tmp_path / "out")
    assert len(files) == 8
    for f in files:  # mlc-chakra's own tool reads every file
        out = tmp_path / f"{f.stem}.json"
        subprocess.run(
            [_jsonizer(), "--input_filename", str(f), "--output_filename", str(out)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        assert "comm_size" in out.read_text()
    res = _replay(
        tmp_path / "out" / "trace", exp.topology.model_dump(mode="python"), tmp_path / "runs", scale=orig.summary.scale
    )
    assert res.ok, res.summary.error
    assert res.summary.scheme == "trace" and res.summary.iterations == orig.summary.iterations
    core, core0 = core_payload(res.run_dir), core_payload(orig.run_dir)
    assert core0 > 1e6 and core == pytest.approx(core0, rel=0.02), (core, core0)
    it, it0 = res.summary.iteration_time_s.mean, orig.summary.iteration_time_s.mean
    assert it == pytest.approx(it0, rel=0.05), (it, it0)


@pytest.mark.slow
@root_only
def test_the_pytorch_made_trace_replays_to_the_end(tmp_path):
    prefix = ROOT / "tests" / "data" / "chakra" / "ddp"
    topology = {"kind": "rack", "racks": 1, "hosts_per_rack": 2, "host_bw_mbps": 100}
    res = _replay(prefix, topology, tmp_path / "runs", iterations=4)
    assert res.ok, res.summary.error
    assert res.summary.scheme == "trace" and res.summary.iterations == 4
    assert res.summary.bytes.core is None or res.summary.bytes.core >= 0
