#!/usr/bin/env bash
# Build a Vagrant box for the libvirt provider from Debian's own packages, for machines that do
# not reach Vagrant's box catalogue: debootstrap bookworm, Debian's kernel (linux-image-amd64),
# the extlinux boot loader, a `vagrant` user with Vagrant's insecure public key (Vagrant
# replaces it at the first `vagrant up`), packed as a qcow2 image in a libvirt .box. Run as root.
#
#   bash scripts/build-box.sh            build the box unless the cached one is up to date
#   bash scripts/build-box.sh --force    build it again
#   bash scripts/build-box.sh --path     only print where the box is (or would be)
#
# The box is cached in ${TESTBED_CACHE:-~/.cache/dl-netbed}/boxes/bookworm64-local.box, with a
# stamp of this script; it is built again only when this script changes. The .debs debootstrap
# fetched stay in .../debootstrap-debs for the next build. The Vagrantfile uses it
# when TESTBED_VM_BOX=local, or when Vagrant's catalogue is out of reach (see docs/vm.md).
# Debian's packages come from TESTBED_DEBIAN_MIRROR, else the host's own apt sources.
# Needs: debootstrap, qemu-utils, extlinux, syslinux-common, fdisk, e2fsprogs (installed if missing).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TESTBED_CACHE:-$HOME/.cache/dl-netbed}"
box="$cache/boxes/bookworm64-local.box"
stamp="$box.stamp"
disk_gb=20          # the guest's disk (sparse: the qcow2 holds only what is written)
suite=bookworm

case "${1:-}" in
  "") force=0 ;;
  --force) force=1 ;;
  --path) echo "$box"; exit 0 ;;
  *) echo "build-box.sh: unknown argument '$1': none, --force or --path" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "build-box.sh: must run as root (debootstrap, loop devices, mount): sudo bash scripts/build-box.sh" >&2
  exit 1
fi

want="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [ "$force" = 0 ] && [ -f "$box" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "build-box: $box is up to date"
  exit 0
fi

# Debian's mirror: the one this host's apt uses for $suite main (deb822 .sources or one-line lists).
mirror() {
  if [ -n "${TESTBED_DEBIAN_MIRROR:-}" ]; then echo "$TESTBED_DEBIAN_MIRROR"; return; fi
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri="$(awk -v s="$suite" 'BEGIN{RS=""} /Types:[^\n]*deb/ && $0 ~ "Suites:[^\n]*(^| )"s"( |\n|$)" && /Components:[^\n]*main/ {
            if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { u=substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", u); print u; exit } }' "$f")"
    case "$uri" in */debian|*/debian/) echo "${uri%/}"; return ;; esac
  done
  uri="$(awk -v s="$suite" '$1=="deb" && $3==s && / main/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
  if [ -n "$uri" ]; then echo "${uri%/}"; return; fi
  echo "http://deb.debian.org/debian"
}

need=()
for pair in debootstrap:debootstrap qemu-img:qemu-utils extlinux:extlinux sfdisk:fdisk mkfs.ext4:e2fsprogs; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
[ -f /usr/lib/syslinux/mbr/mbr.bin ] || need+=(syslinux-common)
if [ "${#need[@]}" -gt 0 ]; then
  echo "build-box: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Vagrant's insecure public key: the one shipped with the vagrant installed here, if any.
pubkey=""
for k in /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub /opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub; do
  [ -f "$k" ] && pubkey="$k"
done
if [ -z "$pubkey" ]; then
  echo "build-box.sh: Vagrant's insecure public key (keys/vagrant.pub of the vagrant gem) was not found:" \
       "apt-get install vagrant" >&2
  exit 1
fi

url="$(mirror)"
work="$(mktemp -d "${TMPDIR:-/tmp}/dl-netbed-box.XXXXXX")"
root="$work/root"
loop=""
cleanup() {
  set +e
  for m in dev/pts dev proc sys; do mountpoint -q "$root/$m" && umount -l "$root/$m"; done
  mountpoint -q "$root" && umount "$root"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -rf "$work"
}
trap cleanup EXIT

t0=$SECONDS
echo "build-box: building a $suite box from $url in $work"
raw="$work/disk.raw"
truncate -s "${disk_gb}G" "$raw"
# one bootable Linux partition from 1 MiB; extlinux's MBR code boots it
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$raw"
offset=$((2048 * 512))
loop="$(losetup --find --show --offset "$offset" "$raw")"
# without 64bit and metadata_csum: extlinux reads an ext4 without them
mkfs.ext4 -q -L root -O ^64bit,^metadata_csum "$loop"
mkdir -p "$root"
mount "$loop" "$root"

pkgs=linux-image-amd64,systemd-sysv,udev,dbus,kmod,ifupdown,isc-dhcp-client,openssh-server,sudo,rsync,ca-certificates,iproute2,procps,less
echo "build-box: debootstrap (minbase + $pkgs)"
mkdir -p "$cache/debootstrap-debs"
debootstrap --variant=minbase --include="$pkgs" --cache-dir="$cache/debootstrap-debs" "$suite" "$root" "$url" > "$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2; echo "build-box.sh: debootstrap failed (log above)" >&2; exit 1; }
echo "build-box: debootstrap done in $((SECONDS - t0)) s"

cat > "$root/etc/apt/sources.list" <<EOF
deb $url $suite main
deb $url $suite-updates main
EOF
echo testbed > "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\ttestbed\n' > "$root/etc/hosts"
echo 'LABEL=root / ext4 errors=remount-ro 0 1' > "$root/etc/fstab"
# net.ifnames=0 on the kernel's command line: the NIC is eth0 whatever the machine's bus layout
cat > "$root/etc/network/interfaces" <<'EOF'
source /etc/network/interfaces.d/*
auto lo
iface lo inet loopback
allow-hotplug eth0
iface eth0 inet dhcp
EOF
# every VM gets its own machine id and SSH host keys at its first boot
: > "$root/etc/machine-id"
rm -f "$root"/etc/ssh/ssh_host_*
mkdir -p "$root/etc/systemd/system/ssh.service.d"
printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
  > "$root/etc/systemd/system/ssh.service.d/host-keys.conf"
echo 'UseDNS no' > "$root/etc/ssh/sshd_config.d/vagrant.conf"

# the vagrant user: password vagrant, sudo without a password, Vagrant's insecure key
chroot "$root" useradd -m -s /bin/bash -U vagrant
echo 'vagrant:vagrant' | chroot "$root" chpasswd
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' > "$root/etc/sudoers.d/vagrant"
chmod 0440 "$root/etc/sudoers.d/vagrant"
install -d -m 0700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
install -m 0600 -o 1000 -g 1000 "$pubkey" "$root/home/vagrant/.ssh/authorized_keys"

# boot loader: extlinux in /boot/extlinux, the kernel and initrd Debian installed
kver="$(ls "$root/lib/modules" | sort -V | tail -n 1)"
mkdir -p "$root/boot/extlinux"
extlinux --install "$root/boot/extlinux" >/dev/null 2>&1
cat > "$root/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
TIMEOUT 1
LABEL debian
  LINUX /boot/vmlinuz-$kver
  INITRD /boot/initrd.img-$kver
  APPEND root=LABEL=root ro net.ifnames=0 console=tty0 console=ttyS0,115200
EOF
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$raw" bs=440 count=1 conv=notrunc status=none

chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/tmp/*
used_mb="$(df -m --output=used "$root" | tail -n 1 | tr -d ' ')"
umount "$root"
losetup -d "$loop"; loop=""

echo "build-box: packing the qcow2 image (${used_mb} MB used of ${disk_gb} GB)"
mkdir -p "$work/box"
qemu-img convert -c -O qcow2 "$raw" "$work/box/box.img"
rm -f "$raw"
cat > "$work/box/metadata.json" <<EOF
{"provider": "libvirt", "format": "qcow2", "virtual_size": $disk_gb}
EOF
cat > "$work/box/Vagrantfile" <<'EOF'
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.disk_bus = "virtio"
  end
end
EOF
cat > "$work/box/info.json" <<EOF
{"built_by": "dl-netbed scripts/build-box.sh", "suite": "$suite", "kernel": "$kver", "built": "$(date -u +%FT%TZ)"}
EOF
mkdir -p "$(dirname "$box")"
tar -C "$work/box" -cf "$box.tmp" metadata.json Vagrantfile info.json box.img
mv "$box.tmp" "$box"
echo "$want" > "$stamp"
echo "build-box: wrote $box ($(du -m "$box" | cut -f1) MB, kernel $kver) in $((SECONDS - t0)) s"
