"""Shared fixtures, and the test tiers (tests/tiers.py) applied to every collected test."""

import importlib.abc
import importlib.util
import os
import random
import sys
import time
from collections import defaultdict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class _SourceLayout(importlib.abc.MetaPathFinder):
    """Imports the package pyproject.toml maps from another directory (the builtin profiles from
    profiles/) straight from a checkout, where the project is not installed."""

    PACKAGES = {"temperd.builtin_profiles": "profiles"}

    def find_spec(self, fullname, path=None, target=None):
        for package, directory in self.PACKAGES.items():
            if fullname == package or fullname.startswith(package + "."):
                rest = fullname[len(package):].lstrip(".")
                base = os.path.join(ROOT, directory, *(rest.split(".") if rest else []))
                if os.path.isdir(base):
                    return importlib.util.spec_from_file_location(
                        fullname, os.path.join(base, "__init__.py"), submodule_search_locations=[base])
                if os.path.isfile(base + ".py"):
                    return importlib.util.spec_from_file_location(fullname, base + ".py")
        return None


if importlib.util.find_spec("temperd") is None:
    sys.path.insert(0, ROOT)
if importlib.util.find_spec("temperd.builtin_profiles") is None:
    sys.meta_path.append(_SourceLayout())

import tiers  # noqa: E402  (after the layout above: the helpers import temperd)
from driven import DrivenProcess  # noqa: E402
from thread_children import Children  # noqa: E402
from temperd.sources.shape import online_cpus  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--shuffle", metavar="SEED", default=None,
                     help="run the tests in an order shuffled by SEED (an integer, or 'random': "
                          "the seed is printed): finds tests that pass only after another")


def pytest_configure(config):
    # Tests compare affinities with "every CPU". A test process started from a shell that a running
    # temperd confined (its exclusive cores fence other threads out) inherits that confinement:
    # widen it back, and say so in the header.
    config._confined = None
    own, online = os.sched_getaffinity(0), set(online_cpus())
    if own != online:
        try:
            os.sched_setaffinity(0, online)
            config._confined = (f"the test process was confined to CPUs {sorted(own)} (inherited: does a "
                                f"temperd run on this host?); widened to {sorted(online)}")
        except OSError as exc:
            config._confined = f"the test process is confined to CPUs {sorted(own)}: {exc}"
    config._tier_seconds = defaultdict(float)
    config._tier_counts = defaultdict(int)
    config._leaked = []


def _reach_roots(item):
    """The module's top-level names a test starts from: its class, or its function, and pytestmark."""
    cls = getattr(item, "cls", None)
    roots = ["pytestmark", cls.__name__ if cls is not None else getattr(item, "originalname", item.name)]
    return roots


def _fixture_names(item, reach):
    names = set()
    for name, defs in getattr(item, "_fixtureinfo").name2fixturedefs.items():
        if name == "_unit_tier_guard":  # every test's, and not a use of what it refuses
            continue
        for fixturedef in defs:
            func = getattr(fixturedef, "func", None)
            path = getattr(getattr(func, "__code__", None), "co_filename", "")
            if path.startswith(HERE + os.sep):
                names |= reach.names(path, [func.__name__])
    return names


def _shuffle(config, items):
    seed = config.getoption("shuffle")
    if seed is None:
        return
    if seed == "random":
        seed = str(random.SystemRandom().randrange(1 << 32))
    if not seed.isdigit():
        raise pytest.UsageError(f"--shuffle {seed}: expected an integer seed or 'random'")
    config._shuffle_seed = seed
    random.Random(int(seed)).shuffle(items)


def pytest_report_header(config):
    lines = []
    if config.getoption("shuffle") is not None:
        lines.append("tests shuffled: the seed is printed at the end (--shuffle SEED repeats the order)")
    if config._confined:
        lines.append(config._confined)
    return lines


def pytest_collection_modifyitems(config, items):
    _shuffle(config, items)
    reach = tiers.Reach(HERE)
    for item in items:
        path = str(getattr(item, "path", None) or item.fspath)
        names = reach.names(path, _reach_roots(item)) | _fixture_names(item, reach)
        reasons = [str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")]
        have = {m.name for m in item.iter_markers()} & set(tiers.TIERS)
        marks = (tiers.markers_for(names, item.fixturenames, reasons) | have) - {"unit"} or {"unit"}
        for mark in marks - have:
            item.add_marker(mark)
        item._tier = tiers.tier_of(marks)


def _refuse(what):
    def refused(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: tests/tiers.py should have put it in another tier "
                             f"(add the name it reached this through to the tier's names there)")
    return refused


@pytest.fixture(autouse=True)
def _unit_tier_guard(request, monkeypatch):
    """Under `-m unit`, a test that sleeps, starts a process or opens a network connection fails and
    says so: the unit tier stays what it promises even when the names in tests/tiers.py miss a use."""
    if request.config.getoption("markexpr", "") != "unit":
        yield
        return
    import socket
    import subprocess
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: real_sleep(s) if s <= 0 else _refuse(f"slept {s} s")())
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
    monkeypatch.setattr(os, "fork", _refuse("forked"))
    real_connect = socket.socket.connect

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            _refuse(f"connected to {address}")()
        return real_connect(sock, address)
    monkeypatch.setattr(socket.socket, "connect", connect)
    yield


def _own_scheduling():
    """This process's main-thread affinity, policy and nice: what every child it starts inherits."""
    return os.sched_getaffinity(0), os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)


def _put_back(scheduling):
    affinity, policy, nice = scheduling
    for step in (lambda: os.sched_setaffinity(0, affinity),
                 lambda: os.sched_setscheduler(0, policy, os.sched_param(0)),
                 lambda: os.setpriority(os.PRIO_PROCESS, 0, nice)):
        try:
            step()
        except OSError:
            pass  # a user cannot lower nice again; the summary names the test all the same


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    config = item.config
    before = _own_scheduling()
    started = time.monotonic()
    yield
    config._tier_seconds[getattr(item, "_tier", "unit")] += time.monotonic() - started
    config._tier_counts[getattr(item, "_tier", "unit")] += 1
    # A test that leaves the test process treated would hand that to every later test's children:
    # put it back, and name the test at the end.
    after = _own_scheduling()
    if after != before:
        config._leaked.append(f"{item.nodeid}: {before} -> {after}")
        _put_back(before)


def pytest_terminal_summary(terminalreporter, config):
    if config._leaked:
        terminalreporter.write_sep("-", "tests that left the test process's scheduling changed (put back)")
        for line in config._leaked:
            terminalreporter.write_line(line)
    if getattr(config, "_shuffle_seed", None) is not None:
        terminalreporter.write_line(f"tests shuffled with --shuffle {config._shuffle_seed}")
    if not config._tier_counts:
        return
    terminalreporter.write_sep("-", "time per tier")
    for tier in tiers.TIERS:
        if config._tier_counts[tier]:
            terminalreporter.write_line(f"{tier:8} {config._tier_counts[tier]:5d} tests "
                                        f"{config._tier_seconds[tier]:8.1f} s")


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
