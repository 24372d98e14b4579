"""The main loop's event batching (main_loop.TREAT_WITHIN_S) on a real inventory with real
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
        self.event_passes = 0
        self.event_cpu_s = 0.0

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


def test_under_a_steady_stream_a_pass_comes_once_a_batch_however_cheap_it_is():
    """The per-pass costs are paid about 1 / TREAT_WITHIN_S times a second: a cheaper pass
    lowers the daemon's CPU, rather than making passes come more often."""
    within = main_loop.TREAT_WITHIN_S
    for wall in (0.0001, 0.001, 0.005):
        assert main_loop.batch_wait(wall) + wall >= within - wall
    assert main_loop.batch_wait(0.0) == within <= 0.08


def test_the_wait_leaves_room_for_two_passes_within_the_treatment_bound():
    """An event that came just after a batch was taken waits out that pass, the wait and its own
    pass: slow passes cut the wait, down to none (back-to-back passes)."""
    within = main_loop.TREAT_WITHIN_S
    assert main_loop.batch_wait(0.03) == pytest.approx(within - 0.06)
    assert 0.03 + main_loop.batch_wait(0.03) + 0.03 <= within + 1e-9
    assert main_loop.batch_wait(within) == 0.0


def test_a_pass_whose_events_changed_nothing_sets_the_wait_too(loop, monkeypatch):
    """An unmatched exec loop's events: one wakeup a batch (each costs the poll and a cold pass),
    and a matched program among them still treated within TREAT_WITHIN_S."""
    loop_, side = loop
    inventory = side.inventory

    def nothing_changed():
        inventory._events_received += 3  # an unmatched program's fork, exec and exit
        return []

    monkeypatch.setattr(inventory, "handle_events", nothing_changed)
    started = time.monotonic()
    loop_._pass()
    assert side.replans == [] and side.event_passes == 1  # events that changed nothing cost a pass too
    assert main_loop.TREAT_WITHIN_S / 2 < loop_.events_not_before - started <= main_loop.TREAT_WITHIN_S + 0.002


def test_the_wall_time_that_cuts_the_wait_is_smoothed_so_one_slow_pass_does_not_cut_the_batch():
    assert main_loop.smoothed(None, 0.02) == 0.02
    wall = main_loop.smoothed(0.002, 0.04)
    assert wall < 0.02
    assert main_loop.batch_wait(wall) > main_loop.batch_wait(0.04)


def test_events_after_a_quiet_spell_are_handled_at_once_and_the_next_wait_for_the_batch(loop):
    loop_, side = loop
    _fork_one()
    _wait_readable(loop_)
    loop_._pass()
    assert [trigger for trigger, _ in side.replans] == ["events"]
    assert loop_.events_not_before > time.monotonic()
    assert side.event_passes == 1 and side.event_cpu_s > 0  # the pass read the new process

    _fork_one()  # inside the batch: its events are not read yet
    fds, timeout = loop_._what_to_wait_for()
    assert side.inventory.fileno() not in fds
    assert 0 < timeout <= main_loop.TREAT_WITHIN_S
    loop_._pass()
    assert len(side.replans) == 1 and side.event_passes == 1  # a pass that handled no events is not counted
    time.sleep(max(0.0, loop_.events_not_before - time.monotonic()))
    _wait_readable(loop_)
    loop_._pass()
    assert len(side.replans) == 2


def test_a_title_recheck_due_inside_the_batch_does_not_make_the_loop_spin(loop, monkeypatch):
    monkeypatch.setattr(main_loop, "TREAT_WITHIN_S", 0.2)  # outlasts the first recheck
    loop_, side = loop
    _fork_one()
    _wait_readable(loop_)
    loop_._pass()  # the new process schedules title rechecks, the first 0.05 s on
    time.sleep(main_loop.TREAT_WITHIN_S / 2 + 0.01)
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
