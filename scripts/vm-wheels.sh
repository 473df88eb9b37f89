#!/usr/bin/env bash
# Fill a wheel folder with every Python package the VM's provisioning installs (torch==2.13.0,
# the project's dependencies and its 'test' extra, mlc-chakra and protobuf, and the build
# backend of its editable install), taken by this machine's own pip, as it is configured here
# (`pip config list`: a local wheel folder, local indexes, or the public index). The Vagrantfile
# copies the folder into the VM and provisions from it alone, so that the VM needs no route to a
# Python package index of its own (nor PyTorch's index, which some machines do not reach).
#
#   bash scripts/vm-wheels.sh          fill ${TESTBED_CACHE:-~/.cache/dl-netbed}/wheels
#   bash scripts/vm-wheels.sh --path   only print the folder
#
# The wheels suit the VM's Python (Debian 12: CPython 3.11, x86_64); this machine's pip must run
# CPython 3.11 on x86_64 (checked). Done again only when pyproject.toml or this script changes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TESTBED_CACHE:-$HOME/.cache/dl-netbed}"
wheels="$cache/wheels"
stamp="$wheels/.stamp"
python="${TESTBED_HOST_PYTHON:-python3}"

case "${1:-}" in
  "") ;;
  --path) echo "$wheels"; exit 0 ;;
  *) echo "vm-wheels.sh: unknown argument '$1': none or --path" >&2; exit 2 ;;
esac

tag="$("$python" -c 'import platform, sys; print(f"{sys.implementation.name}{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')"
if [ "$tag" != "cpython311-x86_64" ]; then
  echo "vm-wheels.sh: $python is $tag; the VM's Python is CPython 3.11 on x86_64: name one with TESTBED_HOST_PYTHON=..." >&2
  exit 2
fi

want="$(cat "$here/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && ls "$wheels"/torch-2.13.0*.whl >/dev/null 2>&1; then
  echo "vm-wheels: $wheels is up to date ($(ls "$wheels"/*.whl | wc -l) wheels)"
  exit 0
fi

mkdir -p "$wheels"
reqs="$(mktemp)"
trap 'rm -f "$reqs"' EXIT
# the project's dependencies and its 'test' extra, from pyproject.toml; the editable install's
# build backend (its build runs in an isolated environment that pip fills from this folder too)
"$python" - "$here/pyproject.toml" > "$reqs" <<'EOF'
import sys, tomllib
doc = tomllib.load(open(sys.argv[1], "rb"))
reqs = doc["project"]["dependencies"] + doc["project"]["optional-dependencies"]["test"]
reqs += doc["build-system"]["requires"] + ["wheel", "protobuf"]
print("\n".join(reqs))
EOF
t0=$SECONDS
echo "vm-wheels: taking $(wc -l < "$reqs") requirements and their dependencies into $wheels"
# pip wheel: wheels are copied as they are, a package published only as source is built once here
out="$("$python" -m pip wheel -q -w "$wheels" -r "$reqs" 2>&1)" || { echo "$out" >&2; exit 1; }
# mlc-chakra without its declared dependencies, as scripts/setup.sh installs it
out="$("$python" -m pip wheel -q --no-deps -w "$wheels" "mlc-chakra==1.0.0" 2>&1)" || { echo "$out" >&2; exit 1; }
echo "$want" > "$stamp"
echo "vm-wheels: $(ls "$wheels"/*.whl | wc -l) wheels, $(du -sm "$wheels" | cut -f1) MB, in $((SECONDS - t0)) s"
