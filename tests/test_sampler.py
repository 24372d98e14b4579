"""The daemon's observation samples are taken on the sampler's own thread: a sample reads three
files of every watched thread (50-90 ms of a fork storm's thousand threads), and process events
waited behind it on the main loop. Checked with an observer that holds each sample until the
test lets it go: the caller is back at once, a second sample is not started while the first
runs, and a sample taken where the caller waits (the first /observe) still waits its turn."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from temperd.backends.status import NATIVE, BackendStatus
from temperd.daemon.daemon import Daemon
from temperd.decide.matcher import MatchResult
from temperd.observe.metrics import Metrics
from temperd.observe.observer import Observer
from temperd.observe.sampler import Sampler
from temperd.plan import LayerPlan
from temperd.sources.runqlat import Telemetry
from temperd.sources.shape import read_shape

WAIT_S = 30.0  # a bound, never the expected time: each wait ends on an event


class HeldObserver:
    """A real observer whose every sample waits until `release` is set."""

    def __init__(self, shape):
        self.inner = Observer(shape)
        self.release = threading.Event()
        self.started = threading.Event()
        self.threads = []

    def sample(self, plan, processes, match, now=None):
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(WAIT_S)
        return self.inner.sample(plan, processes, match, now)


def _sampler():
    shape = read_shape()
    sampler = Sampler(shape, Metrics(), telemetry=Telemetry(want_bpf=False))
    held = sampler.observer = HeldObserver(shape)
    return sampler, held


ARGS = (LayerPlan(layers=(), reserve_cpus=()), {}, MatchResult(), BackendStatus(carried_by=NATIVE), None)


class NotedLock:
    """The sampler's lock, noting who asked for it: `second` is set when a second caller waits."""

    def __init__(self):
        self.lock = threading.Lock()
        self.asked = []
        self.second = threading.Event()

    def __enter__(self):
        self.asked.append(threading.current_thread().name)
        if len(self.asked) >= 2:
            self.second.set()
        self.lock.acquire()
        return self

    def __exit__(self, *exc):
        self.lock.release()


def test_a_background_sample_leaves_the_caller_at_once_and_lands_when_done():
    sampler, held = _sampler()
    try:
        assert sampler.sample_in_background(*ARGS) is True
        assert held.started.wait(WAIT_S)
        assert sampler.observation is None  # the caller is back while the sample is held
        assert sampler.sample_in_background(*ARGS) is False  # one at a time: this one is skipped
        held.release.set()
        sampler._pending.result(WAIT_S)
        assert sampler.observation is not None
        assert held.threads == ["temperd-observe_0"]
        assert sampler.sample_in_background(*ARGS) is True  # the next one is taken again
        sampler._pending.result(WAIT_S)
        assert len(held.threads) == 2
    finally:
        held.release.set()
        sampler.close()


def test_a_sample_the_caller_waits_for_does_not_run_beside_a_background_one():
    sampler, held = _sampler()
    try:
        lock = sampler._one_at_a_time = NotedLock()
        sampler.sample_in_background(*ARGS)
        assert held.started.wait(WAIT_S)
        waited = threading.Thread(target=sampler.sample, args=ARGS, name="caller")
        waited.start()
        assert lock.second.wait(WAIT_S)
        assert held.threads == ["temperd-observe_0"]  # the caller waits behind the held sample
        held.release.set()
        waited.join(WAIT_S)
        assert not waited.is_alive()
        assert held.threads == ["temperd-observe_0", "caller"]
        assert sampler.observation is not None
    finally:
        held.release.set()
        sampler.close()


def test_a_failed_background_sample_is_said_and_the_next_one_runs(caplog):
    sampler, held = _sampler()
    held.release.set()
    broken = (None,) + ARGS[1:]  # no plan: the observer fails
    try:
        assert sampler.sample_in_background(*broken) is True
        assert sampler._pending.exception(WAIT_S) is not None
        assert any("observation sample failed" in record.getMessage() for record in caplog.records)
        assert sampler.sample_in_background(*ARGS) is True
        sampler._pending.result(WAIT_S)
        assert sampler.observation is not None
    finally:
        sampler.close()


def test_the_daemons_main_loop_sample_returns_while_the_sample_is_held():
    """Daemon.observe() (what the main loop calls every few seconds) hands the sample over;
    observe(wait=True) (the first /observe) takes it where it is called."""
    sampler, held = _sampler()
    daemon = SimpleNamespace(
        sampler=sampler, plan=ARGS[0], match=ARGS[2], backend=SimpleNamespace(layer_cpus=lambda: None),
        backend_status=lambda: ARGS[3], _notify_status=lambda: None,
        inventory=SimpleNamespace(snapshot=lambda: SimpleNamespace(processes={})))
    try:
        Daemon.observe(daemon)
        assert held.started.wait(WAIT_S)
        assert sampler.observation is None and held.threads == ["temperd-observe_0"]
        held.release.set()
        sampler._pending.result(WAIT_S)
        Daemon.observe(daemon, wait=True)
        assert held.threads == ["temperd-observe_0", threading.current_thread().name]
    finally:
        held.release.set()
        sampler.close()
