"""/proc/stat has one reader (sources/host_cpu): the host's times, each online CPU's by its
number (an offline CPU is absent from the file, not a shift of those after it), btime."""

from temperd.sources import host_cpu
from temperd.sources.procfs import CLOCK_TICKS

STAT = (b"cpu  10 1 5 400 20 0 2 7 0 0\n"
        b"cpu0 5 0 2 100 10 0 1 3 0 0\n"
        b"cpu2 5 1 3 300 10 0 1 4 0 0\n"
        b"intr 1234 0 0 9\n"
        b"ctxt 99\n"
        b"btime 1700000000\n"
        b"processes 42\n")


def test_the_cpu_lines_and_btime():
    stat = host_cpu.parse_stat(STAT)
    assert stat.total == (10, 1, 5, 400, 20, 0, 2, 7)
    assert sorted(stat.per_cpu) == [0, 2]
    assert stat.boot_time == 1700000000.0


def test_idle_seconds_are_indexed_by_cpu_number():
    idle = host_cpu.idle_seconds(host_cpu.parse_stat(STAT))
    assert idle == [110 / CLOCK_TICKS, 0.0, 310 / CLOCK_TICKS]  # CPU 1 offline: no idle to give


def test_a_file_without_btime_says_zero():
    assert host_cpu.parse_stat(b"cpu  1 2 3 4 5 6 7 8\n").boot_time == 0.0


def test_this_host():
    stat = host_cpu.read_stat()
    assert len(stat.total) == 8 and stat.per_cpu and stat.boot_time > 0



def test_idle_shares_are_a_window_of_idle_seconds(monkeypatch):
    """The learner's and the observer's reading of each CPU's idle share since their last sample."""
    readings = iter([host_cpu.parse_stat(STAT), host_cpu.parse_stat(STAT.replace(b"cpu2 5 1 3 300", b"cpu2 5 1 3 %d" % (300 + CLOCK_TICKS // 2))),
                     host_cpu.parse_stat(STAT)])
    monkeypatch.setattr(host_cpu, "read_stat", lambda: next(readings))
    times = iter([10.0, 11.0, 11.0])
    shares = host_cpu.IdleShares(clock=lambda: next(times))
    assert shares() is None  # no window yet
    second = shares()
    assert second == [0.0, 0.0, 0.5]  # CPU 2 idle half of the second between; CPU 1 is not online
    assert shares() is None  # no time passed: no window
