"""An untrusted owner's flood does not hold up a trusted process's treatment (sources/tracking.py).

A process of `nobody` named like a profile's process makes a few thousand threads named like
one of its groups; meanwhile a root process of another profile starts, and is treated within a
second. The flood's tracked threads stay within the bound, and the bound is warned about once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from test_daemon_e2e import Temperd
from temperd.sources.tracking import OWNER_THREADS, PROCESS_THREADS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

FLOOD_THREADS = 3000

PROFILE = """schema_version = 1
id = "{id}"
description = "test: {name} processes' {prefix}* threads yield"
[fingerprint]
process_names = ["{name}"]
[[thread_groups]]
name = "workers"
thread_names = ["{prefix}*"]
treatment = "yield"
yield_policy = "batch"
nice = 5
"""

# Threads made as fast as the process can, each named at once, all kept alive until stdin closes.
FLOOD = f"""
import ctypes, sys, threading
libc = ctypes.CDLL(None)
libc.prctl(15, b"tmpd-flood", 0, 0, 0)
threading.stack_size(65536)
hold = threading.Event()
def worker(i):
    libc.prctl(15, b"fw-%d" % i, 0, 0, 0)
    hold.wait()
for i in range({FLOOD_THREADS}):
    threading.Thread(target=worker, args=(i,), daemon=True).start()
print("made", flush=True)
sys.stdin.read()
"""

TRUSTED = """
import ctypes, sys, threading
libc = ctypes.CDLL(None)
libc.prctl(15, b"tmpd-trusted", 0, 0, 0)
def worker():
    libc.prctl(15, b"tw-1", 0, 0, 0)
    sys.stdin.read()
threading.Thread(target=worker).start()
"""


def _nobody():
    os.setgid(65534)
    os.setuid(65534)


def _thread_named(pid: int, name: str):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as handle:
                if handle.read().strip() == name:
                    return int(tid)
        except OSError:
            continue
    return None


def test_a_trusted_process_is_treated_within_a_second_while_an_untrusted_flood_goes_on(tmp_path):
    daemon = Temperd(tmp_path)
    (daemon.profiles / "flood.toml").write_text(PROFILE.format(id="tmpd-flood", name="tmpd-flood", prefix="fw-"))
    (daemon.profiles / "trusted.toml").write_text(PROFILE.format(id="tmpd-trusted", name="tmpd-trusted", prefix="tw-"))
    daemon.start()
    flood = trusted = None
    try:
        flood = subprocess.Popen([sys.executable, "-c", FLOOD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 preexec_fn=_nobody, text=True)
        time.sleep(0.2)  # the flood under way
        started = time.monotonic()
        trusted = subprocess.Popen([sys.executable, "-c", TRUSTED], stdin=subprocess.PIPE)
        treated_after = None
        while time.monotonic() - started < 10:
            tid = _thread_named(trusted.pid, "tw-1")
            if tid is not None and os.sched_getscheduler(tid) == os.SCHED_BATCH:
                treated_after = time.monotonic() - started
                break
            time.sleep(0.01)
        assert flood.stdout.readline().strip() == "made"
        print(f"trusted process treated after {treated_after} s, beside a flood of {FLOOD_THREADS} threads")
        assert treated_after is not None and treated_after < 1.5, daemon.logtext()[-3000:]
        # the flood's tracked threads stay within the bound, said once in the log
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "is not trusted and reached the bound" not in daemon.logtext():
            time.sleep(0.1)
        flooded = [w for w in daemon.status()["workloads"] if flood.pid in w["pids"]]
        assert flooded and flooded[0]["threads"] <= min(PROCESS_THREADS, OWNER_THREADS)
        assert daemon.logtext().count("is not trusted and reached the bound") == 1
    finally:
        for proc in (flood, trusted):
            if proc is not None:
                proc.kill()
                proc.wait()
        daemon.stop()
