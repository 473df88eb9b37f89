"""Benchmark: ``testbed reproduce ID --quick`` for the first quick entry of every paper.

Prints, per paper, the entry, its reduced sweep's points, how many ended ``ok`` and the wall
time of the whole command (the runs, the report, the paper's values). The end-to-end test
``tests/e2e/test_reproduce_e2e.py`` checks the command's output on one paper's entry; this
runs them all. Run it alone on an idle machine, as root::

    sudo .venv/bin/python benchmarks/reproduce_quick.py [--papers stanza,p3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.reproduction import load_catalogue  # noqa: E402
from testbed.spec import expand_sweep, load_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--papers", default="", help="comma-separated papers (default: every paper with a quick entry)")
    a = ap.parse_args()
    quick = {}
    for e in load_catalogue():
        if e.quick is not None:
            quick.setdefault(e.paper, e)
    papers = [p for p in a.papers.split(",") if p] or list(quick)
    print(f"{'paper':10s} {'entry':34s} {'points':>6s} {'ok':>3s} {'wall_s':>7s}  status")
    failed = 0
    for paper in papers:
        entry = quick[paper]
        points = expand_sweep(load_spec(ROOT / entry.spec.path, overrides=entry.overrides(quick=True)))
        with tempfile.TemporaryDirectory(prefix="reproduce-quick-") as runs:
            t0 = time.time()
            cmd = [sys.executable, "-m", "testbed.cli", "reproduce", entry.id, "--quick", "--runs-dir", runs]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
            wall = time.time() - t0
        ok = sum(1 for line in proc.stdout.splitlines() if line.startswith(runs) and ": ok, " in line)
        status = "ok" if proc.returncode == 0 and ok == len(points) else f"exit {proc.returncode}"
        failed += status != "ok"
        print(f"{paper:10s} {entry.id:34s} {len(points):6d} {ok:3d} {wall:7.1f}  {status}", flush=True)
        if status != "ok":
            print((proc.stdout[-2000:] + proc.stderr[-2000:]).rstrip())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
