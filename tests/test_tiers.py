"""tests/tiers.py: a test's tier comes from what it reaches, through the helpers it calls."""

import textwrap

import tiers

HELPER = '''
import subprocess

def start_worker():
    return subprocess.Popen(["true"])

def redis_server():
    return start_worker()

def parse(text):
    return text.split()
'''

TESTS = '''
import os
import time

import pytest

import helper
from helper import parse

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="root")


def _wait():
    time.sleep(1)


def test_pure():
    assert parse("a b") == ["a", "b"]


def test_through_a_helper_module():
    helper.start_worker()


def test_a_server():
    with helper.redis_server():
        pass


@needs_root
def test_root():
    pass


def test_sleeps_in_a_module_function():
    _wait()


class TestGroup:
    def test_one(self):
        _wait()
'''


def _reach(tmp_path):
    (tmp_path / "helper.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "test_x.py").write_text(textwrap.dedent(TESTS))
    return tiers.Reach(str(tmp_path)), str(tmp_path / "test_x.py")


def test_each_test_gets_the_tier_of_what_it_reaches(tmp_path):
    reach, path = _reach(tmp_path)

    def marks(root):
        return tiers.markers_for(reach.names(path, ["pytestmark", root]))

    assert marks("test_pure") == {"unit"}
    assert marks("test_through_a_helper_module") == {"slow"}
    assert marks("test_a_server") == {"servers", "slow"}
    assert marks("test_root") == {"root"}
    assert marks("test_sleeps_in_a_module_function") == {"slow"}
    assert marks("TestGroup") == {"slow"}


def test_fixtures_and_skip_reasons_count_too():
    assert tiers.markers_for(set(), fixtures=["tmp_path", "spawn"]) == {"slow"}
    assert tiers.markers_for(set(), skip_reasons=["needs root and tracefs"]) == {"root"}
    assert tiers.markers_for(set(), fixtures=["tmp_path"]) == {"unit"}


def test_a_test_counts_under_its_heaviest_tier():
    assert tiers.tier_of({"slow", "servers", "root"}) == "servers"
    assert tiers.tier_of({"slow"}) == "slow"
    assert tiers.tier_of({"unit"}) == "unit"


class _Config:
    def __init__(self, seed):
        self.seed = seed

    def getoption(self, name):
        assert name == "shuffle"
        return self.seed


def test_shuffle_repeats_its_order_for_a_seed_and_refuses_a_bad_one():
    import pytest

    import conftest

    def order(seed):
        items = list(range(50))
        conftest._shuffle(_Config(seed), items)
        return items

    assert order("7") == order("7") != list(range(50)) and sorted(order("7")) == list(range(50))
    assert order(None) == list(range(50))
    with pytest.raises(pytest.UsageError, match="--shuffle x: expected an integer seed"):
        order("x")
