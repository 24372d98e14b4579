"""Shared fixtures."""

import pytest

from driven import DrivenProcess


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
