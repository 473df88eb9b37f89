#!/usr/bin/env bash
# Set up if needed, then run the built-in default experiment (experiments/quickstart.yaml):
# PS against ring allreduce on a 2-rack, 2:1 oversubscribed emulated network. Prints the
# comparison table and writes plots into the sweep directory under runs/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/testbed" run experiments/quickstart.yaml --plot "$@"
