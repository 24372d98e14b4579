#!/usr/bin/env bash
# Makes (or reuses) a directory with Debian trixie's glibc (libc6, libgcc-s1), through which the
# real scx_layered (built for glibc >= 2.38) runs on an older host: tests/real_scx_layered.py
# calls DIR/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path ... scx_layered.
# `mmdebstrap --variant=extract` only unpacks the two packages (about 14 MB, seconds); no chroot,
# no root needed to use the result. Prints the directory on stdout.
#
# usage: trixie-glibc.sh CACHE_DIR
# env:   E2E_MIRROR (default http://deb.debian.org/debian)
set -euo pipefail
cache="${1:?usage: trixie-glibc.sh CACHE_DIR}"
mirror="${E2E_MIRROR:-http://deb.debian.org/debian}"
key="$( { cat "$0"; echo "$mirror"; } | sha256sum | cut -c1-16)"
dir="$cache/trixie-glibc-$key"
if [ -f "$dir/ready" ] && [ -x "$dir/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$cache"
find "$cache" -maxdepth 1 -name 'trixie-glibc-*' ! -name "trixie-glibc-$key" -exec rm -rf {} +
rm -rf "$dir" "$dir.tmp"
mmdebstrap --quiet --variant=extract --include=libc6,libgcc-s1 --aptopt='Acquire::Languages "none"' \
  trixie "$dir.tmp" "$mirror" >&2
test -x "$dir.tmp/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
date -u +%FT%TZ >"$dir.tmp/ready"
mv "$dir.tmp" "$dir"
echo "$dir"
