"""``testbed reproduce ID --quick`` end to end: the reduced run on a real Mininet network, then
the paper's report, the paper's values beside it, and nothing left on the machine. One
paper's entry (Stanza's, the shortest) proves the command; every paper's quick entry is run
and timed by ``benchmarks/reproduce_quick.py``.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.reproduction import load_catalogue
from testbed.reproduce import MEASURED_HEADING, PAPER_HEADING
from testbed.spec import expand_sweep, load_spec
from tests.leftovers import leftovers, needs_root

ROOT = Path(__file__).resolve().parents[2]

QUICK = {}

for _e in load_catalogue():  # the first entry of each paper that has a quick version
    if _e.quick is not None:
        QUICK.setdefault(_e.paper, _e)


@pytest.mark.slow
@pytest.mark.skipif(needs_root, reason="needs root")
def test_reproduce_quick_prints_the_paper_beside_the_measured(tmp_path):
    entry = QUICK["stanza"]
    assert leftovers() == []
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "reproduce", entry.id, "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert MEASURED_HEADING in out
    assert f"## {PAPER_HEADING} ({entry.id})" in out
    report_at = out.index(MEASURED_HEADING)
    for pv in entry.paper_values:
        # printed before the run, and again in the paper block after the report
        assert out.count(pv.value) >= 2, pv.value
        assert out.rindex(pv.value) > report_at, pv.value
    # every point of the reduced sweep ran, ok, under the runs directory given
    points = expand_sweep(load_spec(ROOT / entry.spec.path, overrides=entry.overrides(quick=True)))
    runs = [line for line in out.splitlines() if line.startswith(str(tmp_path)) and ": ok, " in line]
    assert len(runs) == len(points), out
    assert leftovers() == []
