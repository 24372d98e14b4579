"""The main loop's event batching (main_loop.EVENT_BATCH_S) on a real inventory with real
process events: the first events after a quiet spell are handled at once, the next ones wait for
the batch, and while they wait the loop sleeps — a title recheck falling due inside the batch
must not make it poll with a zero timeout over and over."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from temperd.daemon import main_loop
from temperd.daemon.main_loop import MainLoop, Requests
from temperd.sources.inventory import Inventory

pytestmark = pytest.mark.skipif(not Inventory().start_events(), reason="needs the netlink process connector (root)")


class _Config:
    @staticmethod
    def scan_interval(events_active: bool) -> float:
        return 120.0


class _Notifier:
    watchdog_interval_s = None


class _DaemonSide:
    """What the loop asks of the daemon, recorded: the replans it is told to make."""

    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        self.lock = threading.RLock()
        self.config = _Config()
        self.notifier = _Notifier()
        self.requests = Requests()
        self.observe_interval_s = 60.0
        self.replans = []

    def replan(self, trigger, changes=None):
        self.replans.append((trigger, list(changes or ())))


_started = []


@pytest.fixture
def loop():
    inventory = Inventory()
    inventory.start()
    side = _DaemonSide(inventory)
    loop_ = MainLoop(side)
    loop_.next_watchdog = loop_.next_observe = float("inf")  # run()'s and the sampler's deadlines, not these tests'
    yield loop_, side
    inventory.stop_events()
    for proc in _started:
        proc.kill()
        proc.wait(10)
    _started.clear()


def _fork_one():
    """A process that lives on while the loop reads it (a process gone by then changes nothing)."""
    _started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))


def _wait_readable(loop_, limit_s=5.0):
    fds, _timeout = loop_._what_to_wait_for()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if loop_.daemon.inventory.fileno() in main_loop._wait(fds, 0.1):
            return
    raise AssertionError("no process event arrived")


def test_the_wait_for_the_next_batch_grows_with_what_the_last_pass_cost_up_to_the_batch():
    assert main_loop.batch_wait(0.0) == 0.0
    assert main_loop.batch_wait(0.004) == pytest.approx(main_loop.BATCH_WAIT_PER_CPU * 0.004)
    assert main_loop.batch_wait(10.0) == main_loop.EVENT_BATCH_S


def test_under_a_steady_stream_handling_events_takes_at_most_its_share_of_a_core():
    """A cycle is a pass (its CPU about its wall time) and the wait after it: the pass's CPU over
    the cycle stays within EVENT_PATH_SHARE until the batch or the treatment bound cuts the wait."""
    for cpu in (0.0005, 0.002, 0.008, main_loop.EVENT_BATCH_S / main_loop.BATCH_WAIT_PER_CPU):
        cycle = cpu + main_loop.batch_wait(cpu, cpu)
        assert cpu / cycle <= main_loop.EVENT_PATH_SHARE + 1e-9
        assert cpu / cycle == pytest.approx(main_loop.EVENT_PATH_SHARE)
    assert main_loop.EVENT_PATH_SHARE <= 0.2  # bench/churn.py's goal of a quarter of a core, with room


def test_the_wait_leaves_room_for_two_passes_within_the_treatment_bound():
    """An event that came just after a batch was taken waits out that pass, the wait and its own
    pass: slow passes cut the wait, down to none (back-to-back passes)."""
    within = main_loop.TREAT_WITHIN_S
    assert main_loop.batch_wait(10.0, 0.005) == main_loop.EVENT_BATCH_S  # fast passes: the whole batch
    assert main_loop.batch_wait(10.0, 0.03) == pytest.approx(within - 0.06)
    assert 0.03 + main_loop.batch_wait(10.0, 0.03) + 0.03 <= within + 1e-9
    assert main_loop.batch_wait(10.0, within) == 0.0
    assert main_loop.batch_wait(0.001, 0.03) == pytest.approx(main_loop.BATCH_WAIT_PER_CPU * 0.001)  # cheap: shorter still


def test_the_cost_that_sets_the_wait_is_smoothed_so_a_cheap_pass_after_a_dear_one_does_not_cut_the_batch():
    assert main_loop.smoothed(None, 0.02) == 0.02
    cost = None
    for pass_cpu in [0.02, 0.004] * 10:  # what passes cost when their waits take turns
        cost = main_loop.smoothed(cost, pass_cpu)
    assert 0.008 < cost < 0.016
    assert main_loop.batch_wait(cost) > 3 * main_loop.batch_wait(0.004) / 2


def test_within_a_stream_a_pass_costs_what_the_whole_daemon_used_since_the_last_one_ended():
    """The idle cgroup's moves are made on a worker thread after the pass that asked for them:
    within a stream of events the wait follows the process's CPU over the whole cycle, so that
    work counts; the first pass after a quiet spell counts its own main-thread CPU."""
    cost = main_loop.cycle_cost
    assert cost(None, (5.0, 100.0), 0.004) == 0.004
    assert cost((4.990, 99.95), (5.0, 100.0), 0.004) == pytest.approx(0.010)  # 6 ms beside the pass
    assert cost((4.0, 100.0 - main_loop.CYCLE_S), (5.0, 100.0), 0.004) == 0.004  # a quiet spell between


def test_events_after_a_quiet_spell_are_handled_at_once_and_the_next_wait_for_the_batch(loop, monkeypatch):
    monkeypatch.setattr(main_loop, "BATCH_WAIT_PER_CPU", 1e6)  # a dear pass: the whole batch
    loop_, side = loop
    _fork_one()
    _wait_readable(loop_)
    loop_._pass()
    assert [trigger for trigger, _ in side.replans] == ["events"]
    assert loop_.events_not_before > time.monotonic()

    _fork_one()  # inside the batch: its events are not read yet
    fds, timeout = loop_._what_to_wait_for()
    assert side.inventory.fileno() not in fds
    assert 0 < timeout <= main_loop.EVENT_BATCH_S
    loop_._pass()
    assert len(side.replans) == 1
    time.sleep(max(0.0, loop_.events_not_before - time.monotonic()))
    _wait_readable(loop_)
    loop_._pass()
    assert len(side.replans) == 2


def test_a_title_recheck_due_inside_the_batch_does_not_make_the_loop_spin(loop, monkeypatch):
    monkeypatch.setattr(main_loop, "BATCH_WAIT_PER_CPU", 1e6)
    monkeypatch.setattr(main_loop, "EVENT_BATCH_S", 0.2)  # outlasts the first recheck
    monkeypatch.setattr(main_loop, "TREAT_WITHIN_S", 1.0)
    loop_, side = loop
    _fork_one()
    _wait_readable(loop_)
    loop_._pass()  # the new process schedules title rechecks, the first 0.05 s on
    time.sleep(main_loop.EVENT_BATCH_S / 2 + 0.01)
    assert side.inventory.poll_timeout() == 0.0  # a recheck is due ...
    fds, timeout = loop_._what_to_wait_for()
    assert timeout > 0.01 and side.inventory.fileno() not in fds  # ... and waits for the batch


def test_the_loop_freezes_start_ups_objects_and_collects_young_garbage_less_often():
    """In a process of its own: the collector's settings are the whole interpreter's."""
    code = ("import gc; from temperd.daemon.main_loop import GC_YOUNG_THRESHOLD, settle_garbage_collector; "
            "before = gc.get_threshold(); settle_garbage_collector(); after = gc.get_threshold(); "
            "assert after == (GC_YOUNG_THRESHOLD,) + before[1:] and GC_YOUNG_THRESHOLD > before[0], (before, after); "
            "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_after_a_pass_that_changed_nothing_the_next_events_wait_for_a_batch_within_the_treatment_bound():
    """An unmatched program's fork, exec and exit then come in one batch (no read of its exec)."""
    assert main_loop.batch_wait(0.0001, 0.0001, quiet=True) == main_loop.QUIET_BATCH_S
    assert main_loop.batch_wait(0.0001, 0.0001) == pytest.approx(main_loop.BATCH_WAIT_PER_CPU * 0.0001)
    within = main_loop.TREAT_WITHIN_S
    assert main_loop.batch_wait(0.0001, 0.03, quiet=True) == pytest.approx(within - 0.06)
    assert main_loop.batch_wait(0.0001, within, quiet=True) == 0.0
