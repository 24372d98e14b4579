"""The trace parser on hand-built traces: exact runtimes, wakeup edges, interrupt wakeups,
awkward thread names, kernel lines as printed, gzip input, speed and memory that does not grow
with the number of events."""

from __future__ import annotations

import gzip
import tracemalloc
from typing import Dict, Iterable, Tuple

from temperd.trace import format as fmt
from temperd.trace.format import format_line, header
from temperd.trace.parse import parse_trace


def ev(comm, tid, tgid, cpu, us, event, fields, flags="d..2"):
    return format_line(comm, tid, tgid, cpu, flags, f"{us // 1_000_000}.{us % 1_000_000:06d}", event, fields)


def switch(cpu, us, prev, prev_tid, state, nxt, next_tid, tgid=None):
    return ev(prev, prev_tid, tgid, cpu, us, "sched_switch",
              f"prev_comm={prev} prev_pid={prev_tid} prev_prio=120 prev_state={state} ==> "
              f"next_comm={nxt} next_pid={next_tid} next_prio=120")


def waking(comm, tid, tgid, cpu, us, wakee, wakee_tid, flags="d..2"):
    return ev(comm, tid, tgid, cpu, us, "sched_waking", f"comm={wakee} pid={wakee_tid} prio=120 target_cpu=001",
              flags)


def test_runtime_switches_and_edges_are_exact():
    lines = [header({"test": "yes"}),
             # cpu 0: pool-1-thread-2 (a name with dashes) runs 1.000100 .. 1.000400, blocks
             switch(0, 1_000_100, "swapper/0", 0, "R", "pool-1-thread-2", 501),
             waking("pool-1-thread-2", 501, 500, 0, 1_000_200, "db writer", 601),
             switch(0, 1_000_400, "pool-1-thread-2", 501, "S", "swapper/0", 0),
             # cpu 1: "db writer" (a name with a space) runs 1.000250 .. 1.000750, preempted
             switch(1, 1_000_250, "swapper/1", 0, "R", "db writer", 601),
             waking("db writer", 601, 600, 1, 1_000_300, "pool-1-thread-2", 501),
             switch(1, 1_000_750, "db writer", 601, "R+", "pool-1-thread-2", 501),
             # an interrupt wakes 601: a wakeup, but no waker thread
             waking("pool-1-thread-2", 501, 500, 1, 1_000_800, "db writer", 601, flags="d.h2"),
             ev("pool-1-thread-2", 501, 500, 1, 1_000_900, "sched_migrate_task",
                "comm=db writer pid=601 prio=120 orig_cpu=1 dest_cpu=0"),
             # 501 still runs on cpu 1 when the trace ends at 1.001000
             ev("pool-1-thread-2", 501, 500, 1, 1_001_000, "task_rename",
                "pid=501 oldcomm=pool-1-thread-2 newcomm=renamed oom_score_adj=0")]
    summary = parse_trace("".join(lines).splitlines(True))
    a, b = summary.threads[501], summary.threads[601]
    assert (a.tgid, b.tgid) == (500, 600)
    assert a.runtime_ns == 300_000 + 250_000  # cpu 0 interval + cpu 1 until the end
    assert b.runtime_ns == 500_000
    assert (a.switches_in, a.blocked, a.preempted) == (2, 1, 0)
    assert (b.switches_in, b.blocked, b.preempted) == (1, 0, 1)
    assert summary.edges == {(501, 601): 1, (601, 501): 1}
    assert (b.wakeups, b.irq_wakeups, b.softirq_wakeups, a.wakeups) == (1, 1, 0, 1)
    assert b.migrations == 1
    assert a.comm == "renamed" and b.comm == "db writer"
    assert 0 not in summary.threads
    assert summary.events == 9 and summary.by_event["sched_switch"] == 4
    assert summary.duration_ns == 900_000
    assert summary.unparsed_lines == 0


def test_bursts_runqueue_wait_d_sleeps_and_cpu_per_second():
    lines = [header({"test": "yes"}),
             # 700 woken at 1.0 s, switched in 100 us later, runs 300 us, sleeps in D
             waking("swapper/0", 0, 0, 0, 1_000_000, "reader", 700, flags="d.s2"),
             switch(0, 1_000_100, "swapper/0", 0, "R", "reader", 700),
             switch(0, 1_000_400, "reader", 700, "D", "spinner", 800),
             # 800 runs from 1.000400 across a second boundary, preempted at 2.500400, back at 2.500500
             switch(0, 2_500_400, "spinner", 800, "R", "reader", 700),
             switch(0, 2_500_500, "reader", 700, "S", "spinner", 800)]
    summary = parse_trace("".join(lines).splitlines(True))
    reader, spinner = summary.threads[700], summary.threads[800]
    assert (reader.blocked_d, reader.blocked) == (1, 2)
    assert (reader.irq_wakeups, reader.softirq_wakeups) == (1, 1)  # woken from a softirq (network receive)
    assert (reader.wait_ns, reader.waits) == (100_000, 1)  # its second switch-in had no wakeup: not counted
    assert (spinner.wait_ns, spinner.waits) == (100_000, 1)  # preempted at 2.500400, in again at 2.500500
    # bursts: 300 us (bucket 8: 256..512), 100 us (bucket 6: 64..128); 1.5 s (bucket 20)
    assert reader.bursts[8] == 1 and reader.bursts[6] == 1 and sum(reader.bursts) == 2
    assert spinner.bursts[20] == 1
    # seconds counted from the first event (1.000000): 0.9996 s in second 0, 0.5004 s in second 1
    assert spinner.cpu_by_second == {0: 999_600_000, 1: 500_400_000}
    assert sum(spinner.cpu_by_second.values()) == spinner.runtime_ns


def test_kernel_lines_as_printed_and_gzip_input(tmp_path):
    # five flag characters and no tgid column, as trace_pipe prints without record-tgid
    text = ("# tracer: nop\n"
            "          <idle>-0       [001] d..2.   301.000001: sched_switch: prev_comm=swapper/1 prev_pid=0 "
            "prev_prio=120 prev_state=R ==> next_comm=kworker/1:1 next_pid=77 next_prio=120\n"
            "     kworker/1:1-77      [001] d..2.   301.000031: sched_waking: comm=sshd pid=900 prio=120 "
            "target_cpu=000\n"
            "     kworker/1:1-77      [001] d..2.   301.000051: sched_switch: prev_comm=kworker/1:1 prev_pid=77 "
            "prev_prio=120 prev_state=I ==> next_comm=swapper/1 next_pid=0 next_prio=120\n"
            "CPU:1 [LOST 3 EVENTS]\n")
    path = tmp_path / "k.trace.gz"
    with gzip.open(path, "wt") as out:
        out.write(text)
    summary = parse_trace(str(path))
    assert summary.threads[77].runtime_ns == 50_000 and summary.threads[77].comm == "kworker/1:1"
    assert summary.edges == {(77, 900): 1}
    assert summary.threads[77].tgid is None
    assert summary.events == 3 and summary.unparsed_lines == 1


def test_sched_wakeup_counts_only_without_sched_waking():
    lines = [ev("a", 10, 10, 0, 1_000_000, "sched_wakeup", "comm=b pid=11 prio=120 target_cpu=000"),
             ev("a", 10, 10, 0, 1_000_001, "sched_wakeup", "comm=b pid=11 prio=120 target_cpu=000")]
    assert parse_trace(lines).threads[11].wakeups == 2
    lines.insert(0, waking("a", 10, 10, 0, 999_999, "b", 11))
    assert parse_trace(lines).threads[11].wakeups == 1  # waking and its wakeup are one wakeup


def synthetic(events, threads=50):
    """A stream of switch/waking lines among `threads` threads on 4 CPUs."""
    us = 5_000_000
    n = 0
    cur = [0, 0, 0, 0]
    while n < events:
        for cpu in range(4):
            nxt = 1000 + (n * 7 + cpu) % threads
            us += 3
            yield waking(f"t{cur[cpu]}", cur[cpu], 1000, cpu, us, f"t{nxt}", nxt)
            yield switch(cpu, us + 1, f"t{cur[cpu]}", cur[cpu], "S", f"t{nxt}", nxt, 1000)
            cur[cpu] = nxt
            n += 2


def peak_bytes(events):
    tracemalloc.start()
    summary = parse_trace(synthetic(events))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert summary.events >= events
    return peak


def test_memory_does_not_grow_with_events():
    # 15 000 events more: a leak of one pointer per event (8 bytes, a list append) passes the bound.
    small, large = peak_bytes(5_000), peak_bytes(20_000)
    assert large < small * 1.3 + 64 * 1024, (small, large)


def test_parses_100k_events(tmp_path):
    """How fast is bench/trace_parse.py's to say (a timed test fails by chance on a crowded host)."""
    path = tmp_path / "100k.trace"
    with open(path, "w") as out:
        out.write(header({}))
        out.writelines(synthetic(100_000))
    summary = parse_trace(str(path))
    assert summary.events == 100_000 and len(summary.threads) == 50


def process_dump(lines: Iterable[str]) -> Dict[int, Tuple[str, str]]:
    """pid -> (name, command line) from the PROCESS DUMP section of an HTML trace."""
    out: Dict[int, Tuple[str, str]] = {}
    in_dump = False
    for line in lines:
        if line.startswith(fmt.PROCESS_DUMP_TITLE):
            in_dump = True
        elif in_dump and line.startswith(fmt.SECTION_END):
            break
        elif in_dump:
            tokens = line.split(None, 9)
            if len(tokens) >= 10 and tokens[1].isdigit():
                out[int(tokens[1])] = (tokens[8], tokens[9].rstrip("\n"))
    return out


def test_writer_output_is_the_html_container_with_a_process_dump_and_parses_the_same(tmp_path):
    import os

    from temperd.trace.format import TraceWriter, event_lines, open_text

    me = os.getpid()
    raw = [f"          python-{me}    ({me:>7}) [000] d..2.   10.000001: sched_waking: comm=x pid=5 prio=120 "
           "target_cpu=000",
           "          <idle>-0       [001] d..2.   10.000002: sched_switch: prev_comm=swapper/1 prev_pid=0 "
           "prev_prio=120 prev_state=R ==> next_comm=x next_pid=5 next_prio=120"]
    writer = TraceWriter(str(tmp_path / "t.html"), {"filter": "test"}, compress=False)
    for line in raw:
        writer.feed(line)
    writer.close()
    assert sorted(os.listdir(tmp_path)) == ["t.html"]  # body and partial files gone
    with open_text(str(tmp_path / "t.html")) as handle:
        text = handle.read()
    assert text.startswith("<!DOCTYPE html>\n") and text.index("PROCESS DUMP") < text.index("TASK-PID")
    with open(f"/proc/{me}/comm") as handle:
        assert process_dump(text.splitlines())[me][0] == handle.read().strip()
    events = [line for line in event_lines(text.splitlines()) if not line.startswith("#")]
    assert len(events) == 2 and all("</script>" not in line for line in events)
    plain = parse_trace(events)
    wrapped = parse_trace(str(tmp_path / "t.html"))
    assert wrapped.edges == plain.edges == {(me, 5): 1} and wrapped.unparsed_lines == 0


def test_the_writer_escapes_control_characters_of_thread_names(tmp_path):
    """A thread may name itself with ESC and OSC sequences: they reach the trace file escaped, so
    a terminal showing the file (cat, less -R) is not driven by them."""
    from temperd.trace.format import TraceWriter, event_lines, open_text

    hostile = "x\x1b]0;owned\x07\x1b[2J"
    raw = [f"   {hostile}-5       (      5) [000] d..2.   10.000001: sched_waking: comm={hostile} pid=5 prio=120 "
           "target_cpu=000"]
    writer = TraceWriter(str(tmp_path / "t.html"), {"filter": "test"}, compress=False)
    for line in raw:
        writer.feed(line)
    writer.close()
    with open_text(str(tmp_path / "t.html")) as handle:
        text = handle.read()
    assert "\x1b" not in text and "\x07" not in text
    (event,) = [line for line in event_lines(text.splitlines()) if not line.startswith("#")]
    assert "x\\x1b]0;owned\\x07\\x1b[2J-5" in event and "comm=x\\x1b]0;owned" in event
