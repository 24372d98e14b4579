"""A signal the kernel hands to a thread other than the main one still wakes the main loop at once.

The kernel may deliver a process's SIGTERM to any thread that does not block it, and temperd has
several (the usage thread, the cgroup-moves worker, the scx stats client, the control server).
Python runs the handler on the main thread only, so without a wakeup fd a stop waited for the
main loop's poll() to time out (up to a watchdog interval)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, select, signal, sys, threading, time
from temperd.daemon.main_loop import Requests

requests = Requests()
requests.install_signal_handlers()
poller = select.poll()
poller.register(requests.fileno(), select.POLLIN)
main = threading.get_native_id()


def signal_from_another_thread():
    # only once the main thread sleeps in poll(): a signal before it would be handled between
    # bytecodes on the main thread, the case that always worked
    while "poll" not in open(f"/proc/self/task/{main}/wchan").read():
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIG)


threading.Thread(target=signal_from_another_thread, daemon=True).start()
started = time.monotonic()
ready = poller.poll(60 * 1000)  # the main loop's longest wait is far shorter; this is the bound
waited = time.monotonic() - started
requests.drain()
print(json.dumps({"ready": bool(ready), "waited_s": waited, "pending": requests.take()}))
"""


def run_child(sig: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    # the child stops on its own once poll() returns; the timeout only bounds a regression
    out = subprocess.run([sys.executable, "-c", CHILD.replace("signal.SIG)", f"signal.{sig})")],
                         env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    return json.loads(out)


def test_a_stop_signal_taken_by_another_thread_wakes_the_main_loop_at_once():
    result = run_child("SIGTERM")
    assert result["ready"], result
    assert result["pending"] == {"stop": "SIGTERM"}
    assert result["waited_s"] < 10, result


def test_a_reload_signal_taken_by_another_thread_wakes_the_main_loop_at_once():
    result = run_child("SIGHUP")
    assert result["ready"], result
    assert result["pending"] == {"reload": "SIGHUP"}
