"""The VM test's guest helper (stdlib only, runs on the guest's Python): the p99 it compares two
layers by is interpolated within its log2 bucket as Prometheus' histogram_quantile does, so two
layers whose tails fall in one bucket are still told apart; the mean comes from the _sum series."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HELPER = Path(__file__).resolve().parent / "guest_helper.py"
NAME = "temperd_layer_runqueue_latency_seconds"


def snapshot(path: Path, layer: str, cumulative: dict, total_s: float) -> Path:
    lines = [f'{NAME}_bucket{{layer="{layer}",le="{le}",source="bpf"}} {n}' for le, n in cumulative.items()]
    lines.append(f'{NAME}_sum{{layer="{layer}",source="bpf"}} {total_s}')
    path.write_text("\n".join(lines) + "\n")
    return path


def p99(layer: str, before: Path, after: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HELPER), "p99", layer, str(before), str(after)],
                          capture_output=True, text=True, timeout=30)


def test_p99_is_interpolated_within_its_bucket_over_the_growth_between_snapshots(tmp_path):
    before = snapshot(tmp_path / "before", "a", {"0.016": 10, "0.032": 10, "+Inf": 10}, 0.05)
    # 100 more wakeups: 50 up to 16 ms, 50 in (16, 32] ms; the 99th falls 49/50 of the way up that bucket
    after = snapshot(tmp_path / "after", "a", {"0.016": 60, "0.032": 110, "+Inf": 110}, 2.05)
    out = p99("a", before, after)
    quantile, count, mean = out.stdout.split()
    assert out.returncode == 0
    assert abs(float(quantile) - (0.016 + 0.016 * 49 / 50)) < 1e-6
    assert int(count) == 100 and abs(float(mean) - 0.02) < 1e-9


def test_a_layer_that_did_not_grow_is_an_error_not_a_zero(tmp_path):
    same = snapshot(tmp_path / "same", "a", {"0.016": 10, "+Inf": 10}, 0.05)
    out = p99("a", same, same)
    assert out.returncode == 1 and "no scheduling delay measured" in out.stdout
