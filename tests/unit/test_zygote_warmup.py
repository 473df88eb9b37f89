"""The zygote's warm-up and preparation to fork: what it does once so that its forked children do not."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(code: str) -> None:
    """Run ``code`` in a fresh interpreter at the repository's root; fail with its stderr."""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_warm_up_imports_the_builtin_schemes():
    # in a fresh interpreter: the schemes' modules are imported by the warm-up, not by a child's first lookup
    code = (
        "from traffic import schemes\n"
        "from traffic.runtime.zygote import warm_up\n"
        "assert not schemes._builtins_loaded\n"
        "warm_up()\n"
        "assert schemes._builtins_loaded\n"
        "assert 'allreduce' in schemes._REGISTRY\n"
    )
    run_fresh(code)


def test_prepare_to_fork_freezes_the_objects_and_leaves_a_forkable_process():
    # in a fresh interpreter: the objects are frozen (a child's collections skip them) and a child still runs
    code = (
        "import gc, os\n"
        "from traffic.runtime.zygote import prepare_to_fork, warm_up\n"
        "warm_up()\n"
        "collapsed = prepare_to_fork()\n"
        "assert collapsed >= 0 and collapsed % (2 << 20) == 0\n"
        "assert gc.get_freeze_count() > 0\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    import torch\n"
        "    os._exit(0 if float(torch.ones(3).sum()) == 3.0 else 1)\n"
        "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n"
    )
    run_fresh(code)
