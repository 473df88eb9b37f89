"""Benchmark: measure this machine's cost model (what ``testbed profile --machine`` runs).

The measurement, its steps and the file it writes: :mod:`testbed.machine_costs.measure`.
This script adds the options a developer measuring the model needs: ``--only STEP``
(repeatable) measures only those steps and merges them into an existing ``OUT``;
``--resume`` keeps the steps a failed invocation finished (``OUT.partial.json``);
``--quiet-flag FILE`` measures only while ``FILE`` exists; ``--seconds`` sets the length of
each CPU measurement; ``--force`` replaces an existing ``OUT``. Exit status: 0 written, 1 a
measurement failed, 2 a usage error (``OUT`` exists, not root, ...).

    sudo .venv/bin/python benchmarks/machine_costs.py OUT.yaml [--quiet-flag FILE] [--seconds 10] [--resume]
    .venv/bin/python benchmarks/machine_costs.py OUT.yaml --only message
    .venv/bin/python benchmarks/machine_costs.py OUT.yaml --only scheme
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.errors import RunFailed, TestbedError  # noqa: E402
from testbed.machine_costs import STEP_NAMES  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "out", help="YAML file to write (must not exist unless --force; with --only: must exist, merged into)"
    )
    ap.add_argument("--quiet-flag", help="wait until this file exists before every measurement")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each CPU measurement, s")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the values of OUT.partial.json (the steps a failed invocation finished)",
    )
    ap.add_argument("--force", action="store_true", help="replace an existing OUT once every value is measured")
    ap.add_argument(
        "--only",
        action="append",
        choices=STEP_NAMES,
        metavar="STEP",
        help="measure only this step (repeatable: "
        + ", ".join(STEP_NAMES)
        + ") and merge its values into the existing OUT",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from testbed.machine_costs.measure import measure  # lazy: torch and Mininet, after --help

    exe = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else "python"
    command = f"{exe} benchmarks/machine_costs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        measure(
            args.out,
            command=command,
            only=args.only or (),
            resume=args.resume,
            replace=args.force,
            seconds=args.seconds,
            quiet_flag=args.quiet_flag,
        )
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
