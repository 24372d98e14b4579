"""The observer's per-process CPU ticks (observe/process_cpu.py): a many-threaded process, whose
/proc/PID/stat makes the kernel walk every thread, is read again only when its cgroup ran."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from temperd.observe import process_cpu
from temperd.observe.process_cpu import MANY_THREADS, ProcessTicks, domain_usage_us
from temperd.sources import procfs

pytestmark = pytest.mark.unit


class _Host:
    """Processes' stat lines, their cgroups and the cgroups' CPU time, as the tests set them."""

    def __init__(self, monkeypatch):
        self.stats = {}  # pid -> (ticks, threads, start_time)
        self.cgroup = {}  # pid -> cgroup path
        self.usage = {}  # cgroup -> usage_usec (None: threaded)
        self.stat_reads = []
        monkeypatch.setattr(process_cpu.procfs, "read_process_stat", self._stat)
        self.ticks = ProcessTicks(usage_us=lambda cgroup: self.usage.get(cgroup), cgroup_of=self.cgroup.get)

    def _stat(self, pid):
        self.stat_reads.append(pid)
        if pid not in self.stats:
            return None
        ticks, threads, start = self.stats[pid]
        return procfs.TaskStat("p", "S", 1, 0, 0, start, 0, 0, cpu_ticks=ticks, num_threads=threads)

    def sample(self, pids, planned=(), now=None):
        self.stat_reads.clear()
        processes = {pid: SimpleNamespace(start_time=self.stats.get(pid, (0, 0, 7))[2]) for pid in pids}
        self.read = self.ticks.read(processes, planned, now)
        return {pid: ticks for pid, (ticks, _used) in self.read.items()}


@pytest.fixture
def host(monkeypatch):
    return _Host(monkeypatch)


def test_a_many_threaded_process_is_not_read_while_its_cgroup_has_not_run(host):
    host.stats[10] = (500, 20000, 7)
    host.cgroup[10], host.usage["/idle.slice"] = "/idle.slice", 1000
    assert host.sample([10]) == {10: 500} and host.stat_reads == [10]  # its threads learnt: usage read after it
    assert host.sample([10]) == {10: 500} and host.stat_reads == [10]  # the usage read before the stat
    assert host.sample([10]) == {10: 500} and host.stat_reads == []  # unchanged: not read
    assert host.ticks.skipped == 1

    host.stats[10], host.usage["/idle.slice"] = (530, 20000, 7), 1300  # a thread ran
    assert host.sample([10]) == {10: 530} and host.stat_reads == [10]
    assert host.sample([10]) == {10: 530} and host.stat_reads == []


def test_a_move_to_another_cgroup_a_threaded_cgroup_or_a_reused_pid_is_read(host):
    host.stats[10] = (500, 20000, 7)
    host.cgroup[10], host.usage["/a"], host.usage["/b"] = "/a", 1000, 5
    host.sample([10])
    host.sample([10])
    host.cgroup[10] = "/b"  # moved, and ran there: /a did not move
    host.stats[10] = (520, 20000, 7)
    assert host.sample([10]) == {10: 520} and host.stat_reads == [10]

    host.usage["/b"] = None  # the cgroup became threaded: its threads may be in sibling cgroups
    for _ in range(3):
        host.sample([10], planned={10})
        assert host.stat_reads == [10]

    host.usage["/b"] = 5
    host.sample([10])
    host.stats[10] = (3, 20000, 99)  # the pid is another process's now
    assert host.sample([10]) == {10: 3} and host.stat_reads == [10]


def test_a_process_of_few_threads_is_read_each_sample_and_one_gone_is_left_out(host):
    host.stats[10] = (1, MANY_THREADS - 1, 7)
    host.cgroup[10], host.usage["/a"] = "/a", 1000
    for _ in range(3):
        assert host.sample([10, 11]) == {10: 1}
        assert host.stat_reads == [10, 11]


def test_domain_usage_is_the_cgroups_cpu_time_but_none_for_a_threaded_one(tmp_path):
    for name, kind in (("svc", "domain"), ("pool", "threaded")):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "cgroup.procs").write_text("")
        (directory / "cgroup.type").write_text(kind + "\n")
        (directory / "cpu.stat").write_text("usage_usec 4242\nuser_usec 4000\nsystem_usec 242\n")
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    assert domain_usage_us("/svc", str(tmp_path)) == 4242
    assert domain_usage_us("/pool", str(tmp_path)) is None
    assert domain_usage_us("/gone", str(tmp_path)) is None


def test_where_the_cgroup_cannot_vouch_a_still_process_outside_the_plan_is_read_every_few_samples(host):
    """The root cgroup of a host without a cgroup per service always runs: a still pool of
    thousands of threads is read every STILL_EVERY-th sample, and the read that finds it running
    spreads its CPU over the time since the read before."""
    host.stats[10] = (500, 20000, 7)
    host.cgroup[10] = "/"
    host.usage["/"] = 0
    reads = []
    for sample in range(2 + 2 * process_cpu.STILL_EVERY):
        host.usage["/"] += 1000  # the rest of the host runs
        host.sample([10], now=5.0 * sample)
        reads.append(bool(host.stat_reads))
    assert reads[:2] == [True, True]  # first seen, then still
    assert reads[2:] == ([False] * (process_cpu.STILL_EVERY - 1) + [True]) * 2

    host.stats[10] = (500 + 30 * procfs.CLOCK_TICKS, 20000, 7)  # 30 CPU seconds since the last read, 30 s ago
    for sample in range(2 + 2 * process_cpu.STILL_EVERY, 3 * process_cpu.STILL_EVERY + 2):
        host.usage["/"] += 1000
        host.sample([10], now=5.0 * sample)
    assert host.stat_reads == [10] and host.read[10][1] == pytest.approx(1.0)
    host.usage["/"] += 1000
    host.sample([10], now=5.0 * (3 * process_cpu.STILL_EVERY + 2))
    assert host.stat_reads == [10]  # it ran at its last read: read again

    host.stats[11] = (1, 20000, 7)
    host.cgroup[11] = "/"
    for _ in range(3):  # a process with a thread in the plan: read each sample
        host.usage["/"] += 1000
        host.sample([11], planned={11})
        assert host.stat_reads == [11]
