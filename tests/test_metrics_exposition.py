"""What /metrics exposes beyond the values: no prometheus-client `_created` series, and promtool
accepts the whole exposition with every group filled."""

import shutil
import subprocess

import pytest

import status_sample
from temperd.observe.metrics import Metrics


class Result:
    applied = {"affinity": 3}
    failed = {}
    restored = {"affinity": 1}


def filled() -> Metrics:
    status = status_sample.status()  # the scx backend's metrics too
    metrics = Metrics(status=lambda: status)
    metrics.actions.update(Result())
    return metrics


def test_no_created_series():
    text = filled().exposition().decode()
    assert "_created" not in text, [line for line in text.splitlines() if "_created" in line]
    assert 'temperd_actions_applied_total{kind="affinity"} 3.0' in text
    assert 'temperd_drift_total{kind="nice"} 2.0' in text
    assert "# TYPE temperd_drift_total counter" in text


def test_promtool_accepts_the_filtered_exposition():
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    out = subprocess.run([promtool, "check", "metrics"], input=filled().exposition(), capture_output=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
