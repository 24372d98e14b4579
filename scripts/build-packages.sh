#!/usr/bin/env bash
# Builds temperd's packages from a copy of this tree into dist/:
#   - the Debian source and binary packages with dpkg-buildpackage (packaging/deb/debian), then lintian;
#   - the source and noarch RPMs with rpmbuild (packaging/rpm/temperd.spec), then rpmlint.
# Prints the linters' output and fails on a build failure, a lintian error or warning, or an
# rpmlint error. Debian/Ubuntu host with:
#   dpkg-dev debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools lintian rpm rpmlint
#
# usage: scripts/build-packages.sh [--deb-only | --rpm-only] [--no-lint] [--out DIR]   (default DIR: dist)
set -euo pipefail
# Only the distribution's tools and Python: the packages are built the way a buildd builds them.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C.UTF-8
unset PYTHONPATH VIRTUAL_ENV

want_deb=1 want_rpm=1 lint=1 dist=
while [ $# -gt 0 ]; do
  case "$1" in
    --deb-only) want_rpm=0 ;;
    --rpm-only) want_deb=0 ;;
    --no-lint) lint=0 ;;
    --out) dist="${2:?--out needs a directory}"; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-packages.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

[ -z "$dist" ] || { mkdir -p "$dist" && dist="$(cd "$dist" && pwd)"; }
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml | head -n1)"
[ -n "$version" ] || { echo "build-packages.sh: no version in pyproject.toml" >&2; exit 1; }
dist="${dist:-$root/dist}"
mkdir -p "$dist"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0

# The upstream tree: what a clean clone has (tracked files, and new files not ignored), without
# the packaging metadata; both package formats build from this one tarball.
src="$tmp/temperd-$version"
mkdir -p "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$root" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
else
  tar -C "$root" --exclude=./.git --exclude=./.venv --exclude=./dist --exclude=./build --exclude=./.cache \
    --exclude='__pycache__' --exclude='*.egg-info' --exclude=.pytest_cache -cf - . | tar -C "$src" -xf -
fi
tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -czf "$tmp/temperd_$version.orig.tar.gz" "temperd-$version"

step() { printf '\n=== %s\n' "$*"; }

if [ "$want_deb" = 1 ]; then
  step "dpkg-buildpackage (temperd $version)"
  cp -a packaging/deb/debian "$src/debian"
  deb_version="$(cd "$src" && dpkg-parsechangelog -S Version)"
  if [ "${deb_version%-*}" != "$version" ]; then
    echo "packaging/deb/debian/changelog is at $deb_version, pyproject.toml at $version: add a changelog entry" >&2
    exit 1
  fi
  t=$SECONDS
  if (cd "$src" && dpkg-buildpackage -us -uc -sa) >"$tmp/deb-build.log" 2>&1; then
    echo "built in $((SECONDS - t)) s"
    changes="$tmp/temperd_${deb_version}_$(dpkg --print-architecture).changes"
    for f in $(sed -n '/^Files:/,/^[^ ]/s/^ [0-9a-f]\{32\} [0-9]* [^ ]* [^ ]* //p' "$changes"); do
      cp "$tmp/$f" "$dist/"
      echo "$dist/$f"
    done
    cp "$changes" "$dist/"
    if [ "$lint" = 1 ]; then
      step "lintian"
      # -I: info tags too; --show-overrides: every override is listed with its reason in the source.
      lintian -I -E --show-overrides --pedantic "$changes" 2>&1 | tee "$tmp/lintian.out" || true
      if grep -qE '^[EW]: ' "$tmp/lintian.out"; then
        echo "lintian: errors or warnings above" >&2
        failed=1
      else
        echo "lintian: no errors or warnings"
      fi
    fi
  else
    tail -n 60 "$tmp/deb-build.log"
    echo "dpkg-buildpackage failed (log above)" >&2
    failed=1
  fi
fi

if [ "$want_rpm" = 1 ]; then
  step "rpmbuild (temperd $version)"
  top="$tmp/rpmbuild"
  mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}
  cp "$tmp/temperd_$version.orig.tar.gz" "$top/SOURCES/temperd-$version.tar.gz"
  cp packaging/rpm/temperd.sysusers "$top/SOURCES/"
  cp packaging/rpm/temperd.spec "$top/SPECS/"
  t=$SECONDS
  # --nodeps: BuildRequires name Fedora packages, which a Debian host cannot check.
  if rpmbuild -ba --nodeps --define "_topdir $top" "$top/SPECS/temperd.spec" >"$tmp/rpm-build.log" 2>&1; then
    echo "built in $((SECONDS - t)) s"
    for f in "$top"/RPMS/noarch/*.rpm "$top"/SRPMS/*.rpm; do
      cp "$f" "$dist/"
      echo "$dist/${f##*/}"
    done
    if [ "$lint" = 1 ]; then
      step "rpmlint"
      if command -v rpmlint >/dev/null; then
        rc=0
        rpmlint -r packaging/rpm/temperd.rpmlintrc "$top/SPECS/temperd.spec" "$top"/RPMS/noarch/*.rpm "$top"/SRPMS/*.rpm 2>&1 || rc=$?
        # rpmlint: 0 clean, 66 warnings only (badness under the threshold), 64 errors.
        if [ "$rc" -ne 0 ] && [ "$rc" -ne 66 ]; then echo "rpmlint: errors above" >&2; failed=1; fi
      else
        echo "rpmlint not installed (Debian package rpmlint): skipped"
      fi
    fi
  else
    tail -n 60 "$tmp/rpm-build.log"
    echo "rpmbuild failed (log above)" >&2
    failed=1
  fi
fi

exit "$failed"
