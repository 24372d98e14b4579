#!/usr/bin/env bash
# Installs temperd's runtime dependencies from the distribution (the same packages the .deb
# depends on) and the project itself, editable, into .venv. Debian/Ubuntu, as root.
set -euo pipefail
. "$(dirname "$0")/as-root.sh" "$@"
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
packages=(python3 python3-venv python3-pip python3-setuptools python3-click python3-psutil python3-prometheus-client
          python3-watchdog python3-pyudev python3-sdnotify)
# bcc is the distribution's (python3-bpfcc); PyPI's "bcc" is an unrelated project.
apt-cache show python3-bpfcc >/dev/null 2>&1 || apt-get update -qq
packages+=(python3-bpfcc)
# temperctl train's report (the deb and rpm recommend it)
packages+=(python3-matplotlib)
if ! /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then packages+=(python3-tomli); fi
packages+=("$@")
missing=()
for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# System site packages: the venv uses the distribution's modules, as the installed package will.
[ -x .venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv
.venv/bin/pip install -q --no-deps --no-build-isolation -e .
