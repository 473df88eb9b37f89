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
tiers=(unit e2e)
case "${1:-}" in
  unit|e2e) tiers=("$1"); shift ;;
esac
echo "ruff: lint and format check"
"$here/.venv/bin/ruff" check --quiet "$here"
"$here/.venv/bin/ruff" format --check --quiet "$here"
# The unit tier runs on every core (pytest-xdist; its cases build no network and share nothing
# but their own loopback ports); the end-to-end tier builds one network at a time. Both tiers
# run even when the first fails; the status is the first failure's.
status=0
for tier in "${tiers[@]}"; do
  if [ "$tier" = unit ]; then parallel=(-n auto); else parallel=(); fi
  # --durations: the slowest cases are printed at the end, to keep the suite short
  "$here/.venv/bin/python" -m pytest -q -rs --durations=25 "${parallel[@]}" "tests/$tier" "$@" || {
    rc=$?; [ "$rc" -eq 5 ] || [ "$status" -ne 0 ] || status=$rc; }  # 5: the arguments selected none here
done
exit "$status"
