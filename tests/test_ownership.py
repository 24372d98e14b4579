"""Owned exclusive CPUs on real threads: the owner runs there first, others borrow the CPU while it
sleeps and give it up the moment it wakes; a fenced CPU keeps them off. Both are restored after
stop (here) and after kill -9 of the applier (test_native_backend.py, for both).

The wakeup test is the mechanism's own check with generous bounds for a noisy host: an owner's
wakeup-to-run latency (a 1 ms timer sleep, how late it runs) with a borrower spinning on its CPU,
p99 within 1.5x of the same with the CPU idle, measured in interleaved blocks. bench/isolation.py
carries the tight numbers on real servers.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from temperd.backends.native import sched
from temperd.backends.native.backend import scan_threads
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, OPEN, OWNED, YIELD, LayerPlan
from test_native_backend import EXCL_CPU, _rest, backends, layer  # noqa: F401 (backends: a fixture)
from thread_children import cpus_allowed, needs_two_cpus, policy_of, read_json_line, snapshot

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="changing other processes' scheduling needs root"),
    needs_two_cpus,
]

BLOCKS = 3  # interleaved idle / borrowed blocks of each kind
WAKEUPS = 800  # per block

# The owner: on "measure N", N rounds of 0.4 ms of work and a 1 ms timer sleep; prints how late
# each sleep woke (us), p50 and p99. The work matters: an owner that never runs has lag to spare
# and wakes first anyway; one that works relies on the mechanism (SCHED_IDLE for the background
# tier; for a fair borrower, the owners' short slice_us).
OWNER = r"""
import json, sys, time
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    n = int(line.split()[1])
    late = []
    for _ in range(n):
        busy = time.perf_counter()
        while time.perf_counter() - busy < 0.0004:
            pass
        start = time.perf_counter()
        time.sleep(0.001)
        late.append((time.perf_counter() - start - 0.001) * 1e6)
    late.sort()
    print(json.dumps({"p50": late[n // 2], "p99": late[int(n * 0.99)]}), flush=True)
"""

SPINNER = r"""
import time
end = time.monotonic() + 120
while time.monotonic() < end:
    pass
"""


def start(args, **kw):
    return subprocess.Popen([sys.executable, "-c", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            **kw)


def start_borrower(own_session=False):
    """A spinner allowed only on the owner's CPU from its first instruction on; with own_session,
    in a session (autogroup) of its own, as a service or another user's shell would be."""
    return start([SPINNER], preexec_fn=lambda: os.sched_setaffinity(0, {EXCL_CPU}), start_new_session=own_session)


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def measure(owner, n=WAKEUPS) -> dict:
    owner.stdin.write(f"measure {n}\n")
    owner.stdin.flush()
    return read_json_line(owner, 60)


# What a profile sets on an owned group whose CPU fair work borrows (temper-profile(5)): a
# waking owner with the shorter slice preempts the borrower.
OWNER_SLICE_US = 100


def owned_plan(owner_pid, borrower_pid=None, ownership=OWNED, slice_us=None) -> LayerPlan:
    layers = [layer("srv.owner", CONFINED, EXCLUSIVE, tids=[owner_pid], pids=[owner_pid], cpus=[EXCL_CPU],
                    protected=True, ownership=ownership, slice_us=slice_us)]
    if borrower_pid is not None:
        layers.append(layer("bg.spin", OPEN, YIELD, tids=[borrower_pid], pids=[borrower_pid], policy="idle",
                            tier="background"))
    return LayerPlan(layers=tuple(layers), reserve_cpus=(0,))


# A fair borrower, of the owners' session or another, runs out its slice before a waking owner
# that has used its share runs (3.5 ms p99 here at the base slice, docs/benchmarks.md); the
# owners' shorter slice_us is what makes it give way, so the fair cases set it.
@pytest.mark.parametrize("borrower", ["background (SCHED_IDLE)",
                                      "standard tier (SCHED_OTHER, nice 0), owners at slice_us 100",
                                      "standard tier of another session (SCHED_OTHER, nice 0), owners at slice_us 100"])
def test_owner_wakes_on_its_cpu_as_fast_with_a_borrower_spinning_there_as_when_it_idles(tmp_path, backends, borrower):
    fair = "slice_us" in borrower
    if fair and not sched.slice_support().supported:
        pytest.skip(f"the owners' slice is what makes a fair borrower give way: {sched.slice_support().reason}")
    owner = start([OWNER])
    spinner = None
    try:
        assert read_json_line(owner, 30)["ready"]
        background = borrower.startswith("background")
        other_session = "another session" in borrower
        backend = backends(tmp_path)

        def apply(with_spinner):
            pid = spinner.pid if (with_spinner and background) else None
            plan = owned_plan(owner.pid, pid, slice_us=OWNER_SLICE_US if fair else None)
            result = backend.apply(plan, scan_threads(
                [owner.pid] + ([spinner.pid] if with_spinner else [])))
            assert not result.failed and not result.errors, result.errors

        apply(False)
        assert cpus_allowed(owner.pid, owner.pid) == str(EXCL_CPU)
        measure(owner, 200)  # warm up
        idle, borrowed = [], []
        for _ in range(BLOCKS):
            idle.append(measure(owner)["p99"])
            spinner = start_borrower(own_session=other_session)
            apply(True)
            # Owned: the borrower keeps its own affinity (the owner's CPU) and, in the
            # background tier, runs at idle priority.
            assert cpus_allowed(spinner.pid, spinner.pid) == str(EXCL_CPU)
            if background:
                assert policy_of(spinner.pid, spinner.pid) == sched.SCHED_IDLE
            else:
                assert sched.get_sched(owner.pid).slice_ns == OWNER_SLICE_US * 1000
            borrowed.append(measure(owner)["p99"])
            stop(spinner)
            spinner = None
            apply(False)
        idle_p99, borrowed_p99 = sorted(idle)[BLOCKS // 2], sorted(borrowed)[BLOCKS // 2]
        print(f"owner wakeup p99 (median of {BLOCKS} blocks): CPU idle {idle_p99:.0f} us, "
              f"{borrower} spinning there {borrowed_p99:.0f} us; blocks {idle} / {borrowed}")
        assert borrowed_p99 <= 1.5 * idle_p99, (idle, borrowed)
    finally:
        stop(owner)
        if spinner is not None:
            stop(spinner)


def test_owned_cpu_stays_open_to_others_and_a_fenced_one_keeps_them_off(tmp_path, backends, children):
    owner = children.spawn(["owner"])
    other = children.spawn(["other-a", "other-b"])
    before = {k.pid: snapshot(k.pid) for k in (owner, other)}
    threads = scan_threads([owner.pid, other.pid])
    backend = backends(tmp_path)
    plan = owned_plan(owner.threads["owner"])
    result = backend.apply(plan, threads)
    assert not result.failed and not result.errors, result.errors
    assert cpus_allowed(owner.pid, owner.threads["owner"]) == str(EXCL_CPU)
    assert snapshot(other.pid) == before[other.pid], "owned: others keep their affinity"

    fenced = owned_plan(owner.threads["owner"], ownership=FENCED)
    result = backend.apply(fenced, threads)
    assert not result.failed and not result.errors, result.errors
    for tid in other.tids():
        assert cpus_allowed(other.pid, tid) == _rest(), "fenced: others kept off the CPU"

    result = backend.apply(plan, threads)  # back to owned: the fence is lifted at once
    assert snapshot(other.pid) == before[other.pid]
    stopped = backend.stop()
    assert not stopped.failed, stopped.errors
    assert {k.pid: snapshot(k.pid) for k in (owner, other)} == before
