#!/usr/bin/env bash
# Set up if needed, check the code with ruff (lint and format), then run the test suite.
#
#   bash scripts/test.sh            ruff, then both tiers: tests/unit, then tests/e2e
#   bash scripts/test.sh unit       ruff, then tests/unit alone (no network is built)
#   bash scripts/test.sh e2e        ruff, then tests/e2e alone (cases that build networks, as root)
#
# Any further arguments go to pytest (e.g. -k NAME, -x).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
cd "$here"
case "${1:-}" in
  unit|e2e) paths=("tests/$1"); shift ;;
  *) paths=(tests/unit tests/e2e) ;;
esac
echo "ruff: lint and format check"
"$here/.venv/bin/ruff" check --quiet "$here"
"$here/.venv/bin/ruff" format --check --quiet "$here"
# --durations: the slowest cases are printed at the end, to keep the suite short
exec "$here/.venv/bin/python" -m pytest -q -rs --durations=25 "${paths[@]}" "$@"
