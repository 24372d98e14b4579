#!/usr/bin/env bash
# Sets up temperd and runs its main job in the foreground on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/temperctl profiles list "$@"
