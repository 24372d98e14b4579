"""The learner's thread (observe/learner.py) outlives a pass that fails, and says so briefly."""

from __future__ import annotations

import errno
import logging
import time

from temperd.config.daemon_config import LearnerSettings
from temperd.observe.learner import WorkloadLearner


def _learner(tmp_path, current):
    settings = LearnerSettings(sample_interval_s=0.05, history_file=str(tmp_path / "history.json"))
    return WorkloadLearner(settings, host_cpus=2, current=current)


def _wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_running_out_of_descriptors_is_one_warning_without_a_traceback_and_sampling_goes_on(tmp_path, caplog):
    calls = []

    def current():
        calls.append(time.monotonic())
        if len(calls) <= 5:
            raise OSError(errno.EMFILE, "Too many open files")
        return [], None, {}

    watch = _learner(tmp_path, current)
    with caplog.at_level(logging.WARNING, logger="temperd.learner"):
        watch.start()
        try:
            assert _wait_for(lambda: watch.samples >= 1), "a sample once descriptors are back"
        finally:
            watch.stop()
    records = [r for r in caplog.records if r.name == "temperd.learner"]
    assert [r.getMessage() for r in records] == [
        "usage samples skipped while descriptors run short: Too many open files (logged at most once a minute)"]
    assert all(r.exc_info is None for r in records)


def test_an_unexpected_failure_is_logged_with_its_traceback_and_sampling_goes_on(tmp_path, caplog):
    calls = []

    def current():
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        return [], None, {}

    watch = _learner(tmp_path, current)
    with caplog.at_level(logging.WARNING, logger="temperd.learner"):
        watch.start()
        try:
            assert _wait_for(lambda: watch.samples >= 1)
        finally:
            watch.stop()
    failed = [r for r in caplog.records if r.getMessage() == "usage sample failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None
