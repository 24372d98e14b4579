"""Shared fixtures."""

import pytest

from driven import DrivenProcess
from thread_children import Children


@pytest.fixture
def spawn():
    started = []

    def start(name: str = "tmpd-test", env=None) -> DrivenProcess:
        workload = DrivenProcess(name, env)
        started.append(workload)
        return workload

    yield start
    for workload in started:
        workload.close()


@pytest.fixture
def children():
    """Child processes with named threads (tests/thread_children.py), killed afterwards."""
    kids = Children()
    yield kids
    kids.kill_all()
