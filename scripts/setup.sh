#!/usr/bin/env bash
# One idempotent set-up for a Debian 12 machine (or the Vagrant VM), run as root.
# Installs the system tools the testbed drives and a virtual environment (.venv) holding
# torch==2.13.0 and this project. Safe to run again: it skips what is already in place.
#
#   bash scripts/setup.sh                  set up (as root)
#   bash scripts/setup.sh --torch-source   only print where torch would come from, and why
#
# Where torch comes from: TESTBED_TORCH_INDEX, a package index URL (the Vagrantfile sets PyTorch's
# CPU-only index) or "pip" (pip's own configuration, as is). Unset: pip's own configuration when
# it can install torch==2.13.0 without an index (a local wheel, or torch already in .venv) or the
# machine has an NVIDIA GPU (PyPI's torch is the CUDA build); else PyTorch's CPU-only index,
# which spares a machine without a GPU the CUDA libraries' gigabytes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
stamp="$venv/.setup-stamp"
torch_req="torch==2.13.0"
cpu_index="https://download.pytorch.org/whl/cpu"

# Sets torch_args (pip's arguments naming the index; empty: pip's configuration) and torch_why.
torch_source() {
  local choice="${TESTBED_TORCH_INDEX:-}"
  torch_args=()
  if [ "$choice" = "pip" ]; then
    torch_why="pip's configuration (TESTBED_TORCH_INDEX=pip)"
  elif [ -n "$choice" ]; then
    case "$choice" in
      http://*|https://*|file://*) ;;
      *) echo "setup.sh: TESTBED_TORCH_INDEX=$choice is not allowed: a package index URL" \
              "(http://, https://, file://), e.g. $cpu_index, or 'pip' for pip's configuration" >&2
         exit 2 ;;
    esac
    torch_args=(--index-url "$choice")
    torch_why="$choice (TESTBED_TORCH_INDEX)"
  elif [ -x "$venv/bin/pip" ] && "$venv/bin/pip" install -q --dry-run --no-index --no-deps "$torch_req" >/dev/null 2>&1; then
    torch_why="pip's configuration (it finds $torch_req without an index)"
  elif command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia/version ]; then
    torch_why="pip's configuration (an NVIDIA GPU: PyPI's CUDA build)"
  else
    torch_args=(--index-url "$cpu_index")
    torch_why="$cpu_index (no local wheel, no NVIDIA GPU)"
  fi
}

case "${1:-}" in
  "") ;;
  --torch-source) torch_source; echo "$torch_req from $torch_why"; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1': none, or --torch-source" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: must run as root (Mininet needs network namespaces): sudo bash scripts/setup.sh" >&2
  exit 1
fi

apt_pkgs=(mininet bwm-ng iperf3 bridge-utils iputils-ping ethtool tcpdump iproute2 procps openssh-client openssh-server
          python3 python3-venv python3-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # no recommends: Debian's mininet recommends openvswitch-switch, which the testbed does not use
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's python3 sees Debian's mininet module through --system-site-packages.
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi

# pip quietly; its output is shown only on failure (this machine's local indexes warn a lot)
pipq() {
  local out
  if ! out=$("$venv/bin/pip" install -q "$@" 2>&1); then echo "$out" >&2; exit 1; fi
}

# Reinstall the project only when its metadata changed (the install is editable).
want="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  torch_source
  echo "setup: installing $torch_req (from $torch_why) and the project into $venv"
  # torch first and pinned, so that no dependency can pull another build of it
  pipq "${torch_args[@]}" "$torch_req"
  pipq -e "$here[test]"
  # the extra 'chakra' (Chakra execution traces, docs/chakra.md), without mlc-chakra's declared
  # dependencies: HolisticTraceAnalysis and its Jupyter stack serve only chakra_trace_link, and
  # graphviz, networkx and pydot only its visualizers; the testbed uses its protobuf classes
  pipq --no-deps "mlc-chakra==1.0.0" protobuf
  echo "$want" > "$stamp"
fi
