#!/usr/bin/env bash
# Sets up everything the test suite needs (real servers from Debian packages included) and runs it.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh python3-pytest python3-hypothesis \
  memcached libmemcached-tools redis-server redis-tools postgresql mariadb-server mariadb-client \
  sysbench stress-ng prometheus default-jdk-headless util-linux systemd
exec .venv/bin/python -m pytest -q -ra "$@"
