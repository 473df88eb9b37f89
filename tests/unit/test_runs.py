"""The harness's refusals before anything is built: a run directory that exists, a missing tool,
a bad spec named by the CLI. The runs that build networks are tests/e2e/test_runs_e2e.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import MissingRequirement, TestbedError
from testbed.runner import run_experiment, run_one
from tests.small_runs import small_spec

ROOT = Path(__file__).resolve().parents[2]


def test_existing_run_directory_is_never_overwritten(tmp_path):
    (tmp_path / "fixed").mkdir()
    (tmp_path / "fixed" / "summary.json").write_text('{"keep": true}')
    exp = small_spec(tmp_path)
    with pytest.raises(TestbedError, match="never overwritten"):
        run_one(exp, tmp_path, "fixed")
    assert json.loads((tmp_path / "fixed" / "summary.json").read_text()) == {"keep": True}


@pytest.mark.parametrize(
    "missing, remedy", [("mnexec", "apt-get install mininet"), ("bwm-ng", "apt-get install bwm-ng")]
)
def test_missing_tool_is_refused_before_anything_is_made(tmp_path, monkeypatch, missing, remedy):
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == missing else real(name, *a, **k))
    monkeypatch.setattr(os, "access", lambda p, m: False if p.endswith(missing) else os.path.exists(p))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(MissingRequirement, match=remedy):
        run_experiment(small_spec(tmp_path / "runs"), progress=False)
    assert not (tmp_path / "runs").exists()


def test_bad_spec_is_named_by_the_cli(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "experiments/quickstart.yaml",
            "--set",
            "topology.host_bw_mbps=-3",
            "--runs-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "topology.host_bw_mbps" in out.stderr and "-3" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()
