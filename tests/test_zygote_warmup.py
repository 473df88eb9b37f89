"""The zygote's warm-up: what it does once so that its forked children do not."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_warm_up_imports_the_builtin_schemes():
    # in a fresh interpreter: the schemes' modules are imported by the warm-up, not by a child's first lookup
    code = ("from traffic import schemes\n"
            "from traffic.runtime.zygote import warm_up\n"
            "assert not schemes._builtins_loaded\n"
            "warm_up()\n"
            "assert schemes._builtins_loaded\n"
            "assert 'allreduce' in schemes._REGISTRY\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
