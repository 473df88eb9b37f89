#!/usr/bin/env bash
# One idempotent set-up for a Debian 12 machine (or the Vagrant VM), run as root.
# Installs the system tools the testbed drives and a virtual environment (.venv) holding
# torch==2.13.0 and this project. Safe to run again: it skips what is already in place.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
stamp="$venv/.setup-stamp"

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
  echo "setup: installing torch==2.13.0 and the project into $venv"
  # torch first and pinned, so that no dependency can pull another build of it
  pipq "torch==2.13.0"
  pipq -e "$here[test]"
  echo "$want" > "$stamp"
fi
