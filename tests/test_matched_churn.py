"""Matched churn against a real temperd: threads made, threads renamed into a group and processes
matched by command line, each kind at a steady rate (bench/churn.py's generator). Every one is
treated, the events come in batches (fewer passes than things made) and the daemon's CPU per
thing made stays within a generous bound; bench/churn.py carries the tight numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from test_daemon_e2e import Temperd
from thread_children import wait_for
from temperd.sources import procfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

CHURN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "churn.py")
sys.path.insert(0, os.path.dirname(CHURN))
import churn  # noqa: E402  (the generator and its profiles)

RATE = 30  # of each kind a second
SECONDS = 4


def test_matched_churn_is_treated_in_batches_at_a_bounded_cost(tmp_path):
    daemon = Temperd(tmp_path)
    (daemon.profiles / "tmpd-churn.toml").write_text(churn.THREAD_PROFILE)
    (daemon.profiles / "tmpd-churn-proc.toml").write_text(churn.PROCESS_PROFILE)
    daemon.start()
    try:
        wait_for(lambda: daemon.temperctl("status").returncode == 0, 30, "the first plan")
        before = daemon.status()
        ticks0 = procfs.read_process_cpu_ticks(daemon.proc.pid)
        out = subprocess.run([sys.executable, CHURN, "--generate", "--rate", str(RATE), "--duration", str(SECONDS)],
                             capture_output=True, text=True, timeout=SECONDS + 60, check=True)
        ticks1 = procfs.read_process_cpu_ticks(daemon.proc.pid)
        after = daemon.status()
        made = json.loads(out.stdout)
        results = made["results"]
        things = sum(made["counts"].values())
        for kind, firsts in results.items():
            assert firsts and all(ms is not None for ms in firsts), f"{kind}: not all treated: {firsts}"
            within = sum(1 for ms in firsts if ms <= 500) / len(firsts)
            assert within >= 0.95, f"{kind}: {within:.0%} treated within 500 ms"
        replans = after["replans"] - before["replans"]
        cpu_ms = 1000.0 * (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK")
        print(f"{things} things made: {replans} replans, {cpu_ms / things:.2f} ms of temperd CPU each")
        assert replans < things / 2, "events are not batched"
        assert cpu_ms / things < 5.0, daemon.logtext()[-2000:]  # bench/churn.py: 0.5-1.3 ms
        assert after["inventory"]["events_lost"] == before["inventory"]["events_lost"]
        # The event path's own count (temperctl status, /metrics): the passes that handled events,
        # batched as the replans are, and a share of the process's CPU (the observer's is not in it).
        passes = after["event_path"]["passes"] - before["event_path"]["passes"]
        path_ms = 1000.0 * (after["event_path"]["cpu_s"] - before["event_path"]["cpu_s"])
        assert 0 < passes < things / 2
        assert 0 < path_ms <= cpu_ms + 1000.0 / os.sysconf("SC_CLK_TCK"), (path_ms, cpu_ms)
    finally:
        daemon.stop()
