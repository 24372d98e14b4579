#!/usr/bin/env bash
# Sets up everything the test suite needs (real servers from Debian packages included) and runs it:
# every tier; at the end the time each tier took and the slowest tests. Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "$0")/as-root.sh" "$@"
cd "$(dirname "$0")/.."
bash scripts/setup.sh python3-pytest python3-hypothesis \
  memcached libmemcached-tools redis-server redis-tools postgresql mariadb-server mariadb-client \
  sysbench stress-ng prometheus default-jdk-headless util-linux systemd
# The ONNX Runtime training test needs onnxruntime, onnx and numpy, which no Debian package has: from
# PyPI, into a virtual environment of their own (if that fails, the one test says SKIP and why).
# $TEMPERD_ML_PYTHON: a Python that has them already (CI keeps one outside the clone).
if [ -n "${TEMPERD_ML_PYTHON:-}" ] && ! "$TEMPERD_ML_PYTHON" -c 'import onnxruntime, onnx, numpy' 2>/dev/null; then
  echo "scripts/test.sh: TEMPERD_ML_PYTHON=$TEMPERD_ML_PYTHON lacks onnxruntime, onnx or numpy: using .venv-ml" >&2
  unset TEMPERD_ML_PYTHON
fi
if [ -z "${TEMPERD_ML_PYTHON:-}" ] && ! .venv-ml/bin/python -c 'import onnxruntime, onnx, numpy' 2>/dev/null; then
  { /usr/bin/python3 -m venv .venv-ml && .venv-ml/bin/pip install -q --disable-pip-version-check onnxruntime onnx numpy; } ||
    echo "scripts/test.sh: onnxruntime from PyPI not installed: the ONNX Runtime training test will be skipped" >&2
fi
exec .venv/bin/python -m pytest -q -ra --durations=15 "$@"
