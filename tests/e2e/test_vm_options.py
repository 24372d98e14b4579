"""run-vm-test.sh's options that need no VM: --bench names are checked before anything is built,
and the guest runs a benchmark step only when it was asked for (CI asks for none)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "run-vm-test.sh"


def test_an_unknown_benchmark_is_refused_before_anything_runs():
    out = subprocess.run(["bash", str(SCRIPT), "--bench", "isolation bogus"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "unknown benchmark bogus (isolation, overhead)" in out.stderr, out.stderr
    usage = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--bench" in usage and "--bench-out DIR" in usage


def test_benchmark_steps_run_only_when_asked_and_ci_asks_for_none():
    steps = (HERE / "guest-steps.sh").read_text()
    for name in ("isolation", "overhead"):
        guarded = re.search(rf"^if bench_asked {name}; then\n  run_step bench_{name} ", steps, re.M)
        assert guarded, f"bench_{name} must run only under run-vm-test.sh --bench {name}"
    assert "--bench" not in (HERE.parent.parent / ".ci" / "run").read_text()
