#!/usr/bin/env bash
# Builds (or reuses) the VM image of the end-to-end test: Debian trixie with systemd as PID 1,
# the trixie-backports kernel (Debian's 6.12 lacks CONFIG_SCHED_CLASS_EXT) and its headers (for
# bcc), memcached, redis (its unit disabled: the steps start it when they need it), stress-ng, bcc,
# bpftool and a prebuilt minimal sched_ext scheduler. Prints the image directory on stdout.
#
# usage: build-image.sh CACHE_DIR
# env:   E2E_MIRROR (default http://deb.debian.org/debian), E2E_IMAGE_MAX_AGE_DAYS (default 7:
#        the backports kernel moves, so an older image is rebuilt), E2E_REBUILD=1 forces a rebuild.
# Needs root (mmdebstrap in root mode) and: mmdebstrap e2fsprogs zstd.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:?usage: build-image.sh CACHE_DIR}"
mirror="${E2E_MIRROR:-http://deb.debian.org/debian}"
max_age_days="${E2E_IMAGE_MAX_AGE_DAYS:-7}"

log() { echo "[image] $*" >&2; }

# Everything that decides the image's content goes into its key.
key="$( { cat "$here/build-image.sh" "$here/scx_minimal.bpf.c"; echo "$mirror"; } | sha256sum | cut -c1-16)"
image="$cache/image-$key"

if [ -z "${E2E_REBUILD:-}" ] && [ -f "$image/ready" ] &&
   [ -z "$(find "$image/ready" -mtime +"$max_age_days" 2>/dev/null)" ]; then
  log "reusing $image (built $(cat "$image/ready"))"
  echo "$image"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "build-image.sh: building the image needs root (mmdebstrap root mode)" >&2
  exit 1
fi

mkdir -p "$cache"
# Older images of this cache are replaced, not accumulated.
find "$cache" -maxdepth 1 -name 'image-*' ! -name "image-$key" -exec rm -rf {} +
work="$image.tmp"
rm -rf "$work" "$image"
mkdir -p "$work"
rootfs="$work/rootfs"

started=$SECONDS
log "mmdebstrap trixie (+ trixie-backports kernel) from $mirror"
# Guest configuration, applied from the host side into the finished tree ($1).
cat >"$work/prep.sh" <<'PREP'
#!/bin/sh
set -eu
root="$1"
printf '%s\n' '/dev/vda / ext4 rw,noatime 0 1' \
  'host /mnt/host 9p trans=virtio,version=9p2000.L,msize=262144,nofail 0 0' >"$root/etc/fstab"
mkdir -p "$root/mnt/host"
echo temperd-e2e >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 temperd-e2e\n' >"$root/etc/hosts"
# slirp's DNS; no resolver daemon in the image.
echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en*\n\n[Network]\nDHCP=yes\n' >"$root/etc/systemd/network/20-wired.network"
# The harness: wait for boot, run the test script from the 9p share, power off.
cat >"$root/usr/local/sbin/e2e-harness" <<'EOF'
#!/bin/sh
state=$(systemctl is-system-running --wait)
echo "$state" >/mnt/host/boot-state
if [ -x /mnt/host/run.sh ]; then
  /mnt/host/run.sh >/mnt/host/out.log 2>&1
  echo $? >/mnt/host/rc
fi
sync
systemctl poweroff
EOF
chmod 755 "$root/usr/local/sbin/e2e-harness"
# Type=simple: a oneshot inside the boot transaction would keep the system "starting".
printf '%s\n' '[Unit]' 'Description=temperd end-to-end test harness' 'After=multi-user.target' \
  '[Service]' 'Type=simple' 'ExecStart=/usr/local/sbin/e2e-harness' 'StandardOutput=journal+console' \
  '[Install]' 'WantedBy=multi-user.target' >"$root/etc/systemd/system/e2e-harness.service"
PREP
chmod 755 "$work/prep.sh"

# Boot time under software emulation is CPU time on one host thread: what a boot of this image
# need not do is left out. Masked: binfmt_misc and the DRM module (nothing here uses them, 20-30 s
# each); /etc/.updated and /var/.updated written (systemd-update-done): otherwise every boot of the
# fresh image runs ldconfig.service and systemd-journal-catalog-update.service (15-30 s each).
# The package's dependencies are preinstalled, so the guest's `apt install ./temperd_*.deb` needs no
# network when the mirror is slow or unreachable. Their .debs stay in /var/cache/apt/archives (every
# other downloaded .deb is dropped): the deps_purged step purges them, and `apt install` must pull
# them again from the archive, as on a fresh host, still without the network. The apt lists and
# apt's binary caches are kept: without pkgcache.bin/srcpkgcache.bin each apt command in the guest
# parses trixie's 56 MB Packages list first (30-40 s under software emulation).
deb_deps=python3-click,python3-prometheus-client,python3-psutil,python3-pyudev,python3-sdnotify,python3-watchdog
keep_debs="$(echo "$deb_deps" | sed "s/[^,]*/-name '&_*.deb'/g; s/,/ -o /g")"
attempt=0
until rm -rf "$rootfs" && timeout 1200 mmdebstrap --variant=minbase --mode=root --skip=cleanup/apt \
  --include=systemd-sysv,udev,dbus,kmod,initramfs-tools,zstd,python3,iproute2,procps,util-linux,bsdextrautils,memcached,redis-server,redis-tools,stress-ng,passwd,$deb_deps \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --aptopt='Acquire::Languages "none"' --aptopt='APT::Install-Recommends "false"' \
  --chrooted-customize-hook='apt-get install -y -t trixie-backports linux-image-amd64 linux-headers-amd64' \
  --chrooted-customize-hook='apt-get install -y -t trixie-backports python3-bpfcc clang-19 bpftool' \
  --customize-hook="upload $here/scx_minimal.bpf.c /usr/local/lib/scx_minimal.bpf.c" \
  --chrooted-customize-hook='clang-19 --target=bpf -O2 -g -c /usr/local/lib/scx_minimal.bpf.c -o /usr/local/lib/scx_minimal.bpf.o' \
  --customize-hook="$work/prep.sh \"\$1\"" \
  --chrooted-customize-hook='passwd -d root; systemctl enable e2e-harness.service systemd-networkd.service; systemctl disable redis-server.service; systemctl mask apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount modprobe@drm.service 2>/dev/null || true' \
  --chrooted-customize-hook="echo $deb_deps | tr , ' ' >/usr/local/lib/e2e-deb-deps" \
  --chrooted-customize-hook="find /var/cache/apt/archives -maxdepth 1 -name '*.deb' ! \\( $keep_debs \\) -delete && apt-get install -y -q --reinstall --download-only $(echo "$deb_deps" | tr , ' ') && apt-cache gencaches && ls -l /var/cache/apt/archives/*.deb /var/cache/apt/*.bin" \
  --chrooted-customize-hook='/usr/lib/systemd/systemd-update-done && ls -l /etc/.updated /var/.updated' \
  trixie "$rootfs" \
  "deb $mirror trixie main" "deb $mirror trixie-backports main" >"$work/mmdebstrap.log" 2>&1; do
  attempt=$((attempt + 1))
  tail -n 30 "$work/mmdebstrap.log" >&2
  # One retry: a mirror or network hiccup should not fail the run.
  [ "$attempt" -lt 2 ] || { log "mmdebstrap failed twice (its output above)"; exit 1; }
  log "mmdebstrap failed (its output above); retrying once in 10 s"
  sleep 10
done
log "rootfs: $((SECONDS - started)) s, $(du -sh "$rootfs" | cut -f1)"

kernel="$(ls "$rootfs"/boot/vmlinuz-* | sort -V | tail -n1)"
initrd="$rootfs/boot/initrd.img-${kernel##*/vmlinuz-}"
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"
echo "${kernel##*/vmlinuz-}" >"$work/kernel-version"

t=$SECONDS
truncate -s 8G "$work/img.raw"
mke2fs -q -F -t ext4 -L root -d "$rootfs" "$work/img.raw"
rm -rf "$rootfs"
log "image: $((SECONDS - t)) s (kernel $(cat "$work/kernel-version"))"
date -u +%Y-%m-%dT%H:%M:%SZ >"$work/ready"
mv "$work" "$image"
echo "$image"
