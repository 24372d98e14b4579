"""Classification of real workloads, each in a cgroup of its own and bound in temperd.toml, all
run at once for RUN_S (half a minute): a CPU burner (compute, high), a memory hog held below its working set
(memory), an fsync-heavy writer (io), a mostly sleeping service (low) and a burner beside a writer
(mixed); each reason names the signals that decided it, and the confidence says what the host
could not measure. /metrics carries the classes under bounded labels."""

from __future__ import annotations

import os
import re
import shutil
import sys
import urllib.request

import pytest

import cgroup_fixtures as F
from test_rightsize_fixtures import WatchTemperd, bindings
from thread_children import wait_for

pytestmark = [pytest.mark.slow]

RUN_S = 30.0
SLEEPER = "import time\nwhile True:\n    sum(range(2000))\n    time.sleep(0.5)\n"


@pytest.fixture
def io_dir():
    """On the root file system (a tmpfs /tmp would make fsync free)."""
    path = f"/var/tmp/temperd-classify-{os.getpid()}"
    os.makedirs(path, exist_ok=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def classified_after(daemon, cgroups, run_s: float) -> dict:
    """`temperctl classify` once the fixtures have run for run_s and each one's window covers it."""
    paths = [c.path for c in cgroups]

    def classified():
        got = daemon.ask("classify")
        return got if all(p in got and got[p]["window_s"] >= run_s - 2 for p in paths) else None
    # Asked once a second: each question is a command that takes CPU from what it measures.
    return wait_for(classified, run_s + 60, f"a {run_s:g} s classification of {paths}", step=1.0)


def stress(*args: str):
    return ["stress-ng", *args, "--timeout", f"{RUN_S + 30:g}", "--quiet"]


@pytest.mark.skipif(F.needs("stress-ng") is not None, reason=str(F.needs("stress-ng")))
@pytest.mark.parametrize("spinners", [0, 2])
def test_fixtures_are_classified_with_reasons_naming_their_signals(tmp_path, io_dir, spinners):
    """All at once, and again with `spinners` CPU spinners beside them in a cgroup of their own
    (not tracked): each class still comes from the fixture's own signals."""
    with F.cgroup_parent("temperd-classify") as make, F.temporary_swap("/var/tmp") as swap:
        compute, memory, io, sleeper, mix = (make(n) for n in ("compute", "memory", "io", "sleeper", "mix"))
        if spinners:
            make("spinners").spawn(stress("--cpu", str(spinners)))
        bound_by = memory.memory_bound(96 * 2**20)
        daemon = WatchTemperd(tmp_path, f'[classify]\nwindow_s = {RUN_S:g}\n[rightsizing]\n'
                                             f'history_file = "{tmp_path}/history.json"\n'
                                             + bindings(compute, memory, io, sleeper, mix))
        daemon.start()
        try:
            compute.spawn(stress("--cpu", "1"))
            memory.spawn(stress("--vm", "1", "--vm-bytes", "192M"))
            io.spawn(stress("--hdd", "1", "--hdd-opts", "fsync", "--hdd-bytes", "4M", "--temp-path", io_dir))
            sleeper.spawn([sys.executable, "-c", SLEEPER])
            mix.spawn(stress("--cpu", "1", "--hdd", "1", "--hdd-opts", "fsync", "--hdd-bytes", "4M",
                             "--temp-path", io_dir))
            got = classified_after(daemon, (compute, memory, io, sleeper, mix), RUN_S)
            print(f"\nmemory bounded by {bound_by}" + (f", temporary swap {swap}" if swap else ""))
            print(daemon.temperctl("classify").stdout)
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10) as reply:
                metrics = reply.read().decode()
        finally:
            daemon.stop()

    c = {name: got[cg.path] for name, cg in (("compute", compute), ("memory", memory), ("io", io),
                                             ("sleeper", sleeper), ("mix", mix))}
    assert (c["compute"]["cpu"]["intensity"], c["compute"]["cpu"]["bound"]) == ("high", "compute")
    assert "util" in c["compute"]["classificationReason"] and "hot thread" in c["compute"]["classificationReason"]
    assert c["memory"]["cpu"]["bound"] == "memory", c["memory"]["classificationReason"]
    assert re.search(r"memory pressure|paging", c["memory"]["classificationReason"])
    assert c["io"]["cpu"]["bound"] == "io"
    assert re.search(r"io pressure|D state", c["io"]["classificationReason"])
    assert c["sleeper"]["cpu"]["intensity"] == "low"
    assert c["mix"]["cpu"]["bound"] == "mixed"
    assert "compute: " in c["mix"]["classificationReason"] and "io: " in c["mix"]["classificationReason"]
    for item in c.values():
        assert item["window_s"] >= RUN_S - 2
        missing = [s["name"] for s in item["signals"] if "missing" in s]
        if missing:  # a host without a PMU, RAPL, ... says so, and its confidence is below 1
            assert item["confidence"] < 1 and "without " + missing[0] in item["classificationReason"]
    info = [line for line in metrics.splitlines() if line.startswith("temperd_workload_class_info{")]
    assert any(f'workload="{compute.path}"' in line and 'cpu_bound="compute"' in line for line in info)
    assert not any(re.search(r'pid\d', line) for line in info)  # labels name cgroups, never a pid


@pytest.mark.skipif(F.needs("stress-ng") is not None, reason=str(F.needs("stress-ng")))
def test_an_fsync_writer_in_another_cgroup_makes_no_fixture_io_bound(tmp_path, io_dir):
    """A spinner and a sleeper, each in a cgroup of its own, while an fsync writer runs in a third
    cgroup that temperd does not track: the host's io pressure is named as context, and the
    classes come from the fixtures' own signals: the spinner compute/high, the sleeper low, not io."""
    run_s = 30.0
    with F.cgroup_parent("temperd-classify-alone") as make:
        compute, sleeper, writer = make("compute"), make("sleeper"), make("writer")
        daemon = WatchTemperd(tmp_path, f'[classify]\nwindow_s = {run_s:g}\n[rightsizing]\n'
                                             f'history_file = "{tmp_path}/history.json"\n' + bindings(compute, sleeper))
        daemon.start()
        try:
            writer.spawn(stress("--hdd", "1", "--hdd-opts", "fsync", "--hdd-bytes", "4M", "--temp-path", io_dir))
            compute.spawn(stress("--cpu", "1"))
            sleeper.spawn([sys.executable, "-c", SLEEPER])
            got = classified_after(daemon, (compute, sleeper), run_s)
            print(daemon.temperctl("classify").stdout)
        finally:
            daemon.stop()
    spinner, resting = got[compute.path], got[sleeper.path]
    print("\n" + spinner["classificationReason"] + "\n" + resting["classificationReason"])
    assert (spinner["cpu"]["intensity"], spinner["cpu"]["bound"]) == ("high", "compute"), spinner["classificationReason"]
    assert resting["cpu"]["intensity"] == "low" and resting["cpu"]["bound"] != "io", resting["classificationReason"]
    assert "(paging)" not in resting["classificationReason"]
