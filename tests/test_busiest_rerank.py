"""A `busiest` group follows the threads that become busy after temperd planned the process.

The order of a process's threads by recent CPU was read only at a process event or a scan that
found a change: for a server idle when temperd planned it (an inference server before its first
request), the group kept the threads that happened to rank first, however busy others became.
temperd reads the order again at each observation sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_daemon_e2e import Temperd
from thread_children import nice_of, wait_for

pytestmark = [pytest.mark.slow]

PROFILE = """schema_version = 1
id = "rerank"
[fingerprint]
process_names = ["rerank-child"]
[[thread_groups]]
name = "hot"
busiest = 1
treatment = "latency"
nice = -7
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "latency"
nice = -2
"""

# Three idle threads; "go" on stdin makes the last one spin (bounded). No thread is made or
# renamed after the start, so no process event tells temperd that the order changed.
CHILD = r"""
import ctypes, json, os, sys, threading, time
libc = ctypes.CDLL(None)
libc.prctl(15, b"rerank-child", 0, 0, 0)
go = threading.Event()
tids = []
def worker(spins):
    tids.append(threading.get_native_id())
    go.wait(60) if spins else time.sleep(60)
    end = time.monotonic() + 30
    while spins and time.monotonic() < end:
        pass
    time.sleep(60)
for spins in (False, False, True):
    threading.Thread(target=worker, args=(spins,), daemon=True).start()
while len(tids) < 3:
    time.sleep(0.01)
print(json.dumps({"pid": os.getpid(), "spinner": tids[-1]}), flush=True)
if sys.stdin.readline().strip() == "go":
    go.set()
time.sleep(60)
"""


def test_a_thread_that_turns_busy_after_the_plan_joins_the_busiest_group(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    daemon = Temperd(tmp_path)
    try:
        started = json.loads(child.stdout.readline())
        pid, spinner = started["pid"], started["spinner"]
        (daemon.profiles / "rerank.toml").write_text(PROFILE)
        config = daemon.config_dir / "temperd.toml"  # the default scan interval: no scan re-reads the order here
        config.write_text(config.read_text().replace("reconcile_interval_s = 2.0", "reconcile_interval_s = 120.0"))
        daemon.start()
        wait_for(lambda: nice_of(pid, spinner) == -2, 20, "the idle spinner thread in the rest group")
        child.stdin.write("go\n")
        child.stdin.flush()
        # the observation sample comes every 5 s; the replan it asks for, at once
        wait_for(lambda: nice_of(pid, spinner) == -7, 20, "the spinning thread in the busiest group")
        assert nice_of(pid, pid) == -2, "the main thread (idle) left the group of one"
    finally:
        daemon.stop()
        child.kill()
        child.wait()
