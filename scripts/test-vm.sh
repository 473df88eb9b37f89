#!/usr/bin/env bash
# The whole VM pass, in one command, as root on a Debian 12 machine: build (or reuse) the local
# box, boot it with vagrant-libvirt (KVM where usable, else TCG), provision it with
# scripts/setup.sh, run the quickstart, the netem end-to-end tests and the suite's tests that
# need the VM's full kernel, then destroy the VM. Prints each step's time and each figure, and
# leaves no libvirt domain, network, volume or pool of its own behind, whatever fails.
#
#   sudo bash scripts/test-vm.sh           the whole pass
#   sudo bash scripts/test-vm.sh --keep    the same, but leave the VM up (passed or not) for a look (vagrant
#                                          ssh with VAGRANT_DOTFILE_PATH=.vagrant/test-vm; run
#                                          the script again, or `vagrant destroy -f`, to end it)
#
# Its VM is apart from a `vagrant up` of yours: its own Vagrant state (.vagrant/test-vm) and
# domain name (dl-netbed-test-vm-default). It has TESTBED_VM_CPUS (2) CPUs and
# TESTBED_VM_MEMORY_MB (6144) MB unless these say otherwise, and TESTBED_VM_BOX (local) as its
# box. What it caches between uses: ${TESTBED_CACHE:-~/.cache/dl-netbed}/boxes (the box, built by
# scripts/build-box.sh) and .../wheels (the VM's Python packages, scripts/vm-wheels.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
keep=0
case "${1:-}" in
  "") ;;
  --keep) keep=1 ;;
  *) echo "test-vm.sh: unknown argument '$1': none or --keep" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
  echo "test-vm.sh: must run as root (libvirt's system daemon, debootstrap): sudo bash scripts/test-vm.sh" >&2
  exit 1
fi

export TESTBED_CACHE="${TESTBED_CACHE:-$HOME/.cache/dl-netbed}"
export VAGRANT_DOTFILE_PATH="$here/.vagrant/test-vm"
export TESTBED_VM_PREFIX="dl-netbed-test-vm-"
export TESTBED_VM_BOX="${TESTBED_VM_BOX:-local}"
export TESTBED_VM_CPUS="${TESTBED_VM_CPUS:-2}"
export TESTBED_VM_MEMORY_MB="${TESTBED_VM_MEMORY_MB:-6144}"
export VAGRANT_DEFAULT_PROVIDER=libvirt VAGRANT_CHECKPOINT_DISABLE=1 LIBVIRT_DEFAULT_URI=qemu:///system
domain="${TESTBED_VM_PREFIX}default"
local_box="dl-netbed/bookworm64-local"
log="$TESTBED_CACHE/test-vm"
mkdir -p "$log"
cd "$here"

t_all=$SECONDS
say() { echo "test-vm: $*"; }
# step NAME CMD...: run it, its output into $log/NAME.log and on the terminal; say its time
step() {
  local name="$1" t=$SECONDS rc=0
  shift
  say "$name ..."
  # Vagrant's progress bars (carriage returns) left out; pipefail: the command's status
  "$@" 2>&1 | tr '\r' '\n' | sed -u '/Progress: /d' | tee "$log/$name.log" || rc=$?
  say "$name: $((SECONDS - t)) s$([ "$rc" -ne 0 ] && echo ", FAILED (exit $rc; log $log/$name.log)")"
  return "$rc"
}
in_vm() { vagrant ssh -c "$1" -- -o LogLevel=ERROR; }

# --- the host's tools -------------------------------------------------------------------
pkgs=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils dnsmasq-base
      iptables rsync debootstrap extlinux syslinux-common fdisk e2fsprogs)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  # no daemon started by the packages' scripts (machines without systemd): a policy-rc.d that
  # refuses, where none is in place; libvirtd is started below
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

# libvirt's daemons, by hand where no service manager started them; stopped again at the end
started_daemons=()
for d in virtlogd libvirtd; do
  if ! pgrep -x "$d" >/dev/null; then
    "$d" -d
    started_daemons+=("$d")
  fi
done
for _ in $(seq 50); do virsh version >/dev/null 2>&1 && break; sleep 0.2; done

# what libvirt and Vagrant hold before: only what this script adds is removed afterwards
had_net=$(virsh net-info vagrant-libvirt >/dev/null 2>&1 && echo 1 || echo 0)
had_pool=$(virsh pool-info default >/dev/null 2>&1 && echo 1 || echo 0)
had_box=$(vagrant box list 2>/dev/null | grep -q "^$local_box " && echo 1 || echo 0)
# libvirt's NAT turns on forwarding: this machine's own setting is put back afterwards
forward_before="$(sysctl -n net.ipv4.ip_forward)"
vols_before="$(virsh vol-list default 2>/dev/null | awk 'NR>2 && $1 {print $1}' | sort || true)"

cleanup() {
  local rc=$? v
  set +e
  if [ "$keep" = 1 ]; then
    say "the VM is left up (--keep): VAGRANT_DOTFILE_PATH=$VAGRANT_DOTFILE_PATH vagrant ssh"
    exit "$rc"
  fi
  local t=$SECONDS
  vagrant destroy -f >"$log/destroy.log" 2>&1
  # whatever vagrant destroy did not remove
  if virsh dominfo "$domain" >/dev/null 2>&1; then
    virsh destroy "$domain" >/dev/null 2>&1
    virsh undefine "$domain" --remove-all-storage --nvram >/dev/null 2>&1 || virsh undefine "$domain" --remove-all-storage >/dev/null 2>&1
  fi
  if [ "$had_net" = 0 ] && virsh net-info vagrant-libvirt >/dev/null 2>&1; then
    virsh net-destroy vagrant-libvirt >/dev/null 2>&1; virsh net-undefine vagrant-libvirt >/dev/null 2>&1
  fi
  # the box's image that vagrant-libvirt uploaded into the pool, and the VM's own disk
  for v in $(virsh vol-list default 2>/dev/null | awk 'NR>2 && $1 {print $1}' | sort | comm -13 <(echo "$vols_before") -); do
    virsh vol-delete --pool default "$v" >/dev/null 2>&1
  done
  if [ "$had_pool" = 0 ] && virsh pool-info default >/dev/null 2>&1; then
    virsh pool-destroy default >/dev/null 2>&1; virsh pool-undefine default >/dev/null 2>&1
  fi
  [ "$had_box" = 0 ] && vagrant box remove -f "$local_box" >/dev/null 2>&1
  rm -rf "$VAGRANT_DOTFILE_PATH"
  sysctl -qw net.ipv4.ip_forward="$forward_before"
  local left=()
  virsh dominfo "$domain" >/dev/null 2>&1 && left+=("domain $domain")
  [ "$had_net" = 0 ] && virsh net-info vagrant-libvirt >/dev/null 2>&1 && left+=("network vagrant-libvirt")
  for v in $(virsh vol-list default 2>/dev/null | awk 'NR>2 && $1 {print $1}' | sort | comm -13 <(echo "$vols_before") -); do
    left+=("volume $v")
  done
  pgrep -f "qemu-system-x86_64.*guest=$domain" >/dev/null && left+=("qemu process of $domain")
  for d in "${started_daemons[@]}"; do
    [ -f "/run/$d.pid" ] && kill "$(cat "/run/$d.pid")" 2>/dev/null
  done
  # the empty LIBVIRT_* chains a libvirtd started here hooks into INPUT, FORWARD, OUTPUT and
  # POSTROUTING (bridged emulations cross FORWARD where bridge-nf-call-iptables is 1)
  if [ "${#started_daemons[@]}" -gt 0 ]; then
    local ipt tab chain rule
    for ipt in iptables ip6tables; do
      for tab in filter nat mangle; do
        "$ipt" -t "$tab" -S 2>/dev/null | grep -E '^-A [A-Z]+ -j LIBVIRT_' | sed 's/^-A/-D/' |
          while read -r rule; do "$ipt" -t "$tab" $rule; done
        for chain in $("$ipt" -t "$tab" -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^LIBVIRT_/ {print $2}'); do
          [ "$("$ipt" -t "$tab" -S "$chain" | wc -l)" -eq 1 ] && "$ipt" -t "$tab" -X "$chain"
        done
      done
    done
  fi
  say "destroy: $((SECONDS - t)) s; left behind: ${left[*]:-nothing}"
  say "total: $((SECONDS - t_all)) s$([ "$rc" -ne 0 ] && echo ", FAILED (exit $rc)")"
  [ "${#left[@]}" -eq 0 ] || rc=1
  exit "$rc"
}
trap cleanup EXIT

# a VM of an earlier, interrupted pass
if virsh dominfo "$domain" >/dev/null 2>&1 || [ -d "$VAGRANT_DOTFILE_PATH" ]; then
  say "removing the VM of an earlier pass"
  vagrant destroy -f >/dev/null 2>&1 || true
  virsh destroy "$domain" >/dev/null 2>&1 || true
  virsh undefine "$domain" --remove-all-storage >/dev/null 2>&1 || true
  rm -rf "$VAGRANT_DOTFILE_PATH"
fi

# --- the pass -----------------------------------------------------------------------------
if [ "$TESTBED_VM_BOX" = local ]; then step box-build bash scripts/build-box.sh; fi
step wheels bash scripts/vm-wheels.sh
if [ "$TESTBED_VM_BOX" = local ] && ! vagrant box list 2>/dev/null | grep -q "^$local_box "; then
  step box-add vagrant box add --name "$local_box" "$(bash scripts/build-box.sh --path)"
fi
step boot vagrant up --provider=libvirt --no-provision
in_vm 'uname -r; nproc; free -m | sed -n 2p' | sed 's/^/test-vm: guest: /'
step provision vagrant provision
in_vm 'cd /vagrant && sudo .venv/bin/testbed check' > "$log/check.log" 2>&1 || true
grep -E "qdisc (htb|netem)|torch " "$log/check.log" | sed 's/^/test-vm: check: /'

step quickstart in_vm 'cd /vagrant && sudo bash scripts/quickstart.sh'
ok_points=$(grep -cE '^runs/.*: ok, ' "$log/quickstart.log" || true)
grep -E '^runs/.*: ' "$log/quickstart.log" | sed 's/^/test-vm: quickstart: /'
if [ "$ok_points" -ne 2 ]; then
  say "quickstart: $ok_points of 2 points ok"
  exit 1
fi

step netem-tests in_vm 'cd /vagrant && sudo .venv/bin/python -m pytest -q -s -rs -p no:cacheprovider tests/e2e/test_netem_vm.py'
grep -E '^netem: ' "$log/netem-tests.log" | sed 's/^/test-vm: /'
if grep -qE '[0-9]+ skipped' "$log/netem-tests.log"; then
  say "netem-tests: some were skipped in the VM (reasons above)"
  exit 1
fi

# The suite's tests of real networks on the VM's kernel: every link built, shaped and read back,
# and netem's refusal where it is missing (which the VM skips: it has netem). On the development
# machine, whose kernel lacks netem, the suite skips no test for its kernel; these are the ones
# whose outcome depends on it.
step kernel-tests in_vm 'cd /vagrant && sudo .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/e2e/test_network.py'
