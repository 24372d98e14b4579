#!/usr/bin/env bash
# Sets up temperd and runs the daemon in the foreground on this host with the builtin profiles
# (and any in /etc/temper/profiles.d). Logs go to the terminal; Ctrl-C stops it and restores
# every thread it changed. Extra arguments go to temperd (see `temperd --help`).
set -euo pipefail
. "$(dirname "$0")/as-root.sh" "$@"
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/temperd "$@"
