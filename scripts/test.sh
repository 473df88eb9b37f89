#!/usr/bin/env bash
# Set up if needed, then run the test suite (all of it; pass pytest arguments to narrow it,
# e.g. -m "not slow" to skip the end-to-end runs that build Mininet networks).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
cd "$here"
# --durations: the slowest cases are printed at the end, to keep the suite short
exec "$here/.venv/bin/python" -m pytest -q -rs --durations=25 "$@"
