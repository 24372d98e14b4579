"""A name printed escaped reads as one name only: the backslash is escaped too, so a thread named
with the four characters \\x1b does not read as one holding ESC. A trained selector for a name
holding a control character matches the real name: `?` for the character, and the name taken
from /proc, not from the trace text, which a newline in a name breaks."""

from __future__ import annotations

import io
import logging

import pytest

from temperctl.output import PrintableStream, print_table
from temperd.config.profile import parse_profile
from temperd.config.schema import glob_match
from temperd.text import PrintableFormatter, printable, printable_data, printable_lines
from temperd.trace.format import format_line
from temperd.trace.parse import parse_trace
from temperd.training import analyze as A
from temperd.training.features import workload_features
from temperd.training.names import name_key
from temperd.training.samples import ProcessInfo, Samples, ThreadSample, ThreadSeries
from temperd.training.synthesize import synthesize
from test_training import SHAPE, thread, workload

LITERAL = "f\\x1b[31m"  # backslash, x, 1, b: what a terminal shows of nothing
REAL = "f\x1b[31m"
FORGING = "b\r\nFAKE LINE"


def test_a_backslash_is_escaped_so_a_literal_escape_reads_apart_from_a_real_one():
    assert printable(REAL) == "f\\x1b[31m"
    assert printable(LITERAL) == "f\\\\x1b[31m" != printable(REAL)
    assert printable("C:\\dir") == "C:\\\\dir" and printable("plain") == "plain"
    assert printable_data({"a\\b": [LITERAL]}) == {"a\\\\b": ["f\\\\x1b[31m"]}
    record = logging.LogRecord("temperd", logging.INFO, __file__, 1, "thread %s and %s", (LITERAL, REAL), None)
    assert PrintableFormatter("%(message)s").format(record) == "thread f\\\\x1b[31m and f\\x1b[31m"


def test_output_already_escaped_is_not_escaped_twice():
    """temperctl's streams guard whole output whose names printable() escaped: they keep its
    backslashes (and newlines), escaping only a control character that got past."""
    assert printable_lines(printable(LITERAL) + "\n") == "f\\\\x1b[31m\n"
    out = io.StringIO()
    PrintableStream(out).write(printable(REAL) + " " + printable(LITERAL) + "\x1b\n")
    assert out.getvalue() == "f\\x1b[31m f\\\\x1b[31m\\x1b\n"


def test_a_table_of_a_reply_shows_each_name_escaped_once(capsys):
    reply = printable_data({"threads": [[1, LITERAL], [2, REAL]]})  # what temperctl makes of a reply
    print_table(("TID", "NAME"), reply["threads"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split(None, 1)[1] for row in rows] == ["f\\\\x1b[31m", "f\\x1b[31m"]


@pytest.mark.parametrize("name", [FORGING, REAL, "a\x0bb", "a\u2028b", "a\x85b", "tab\tname", "x\x7f"])
def test_a_trained_glob_matches_the_real_name_and_carries_no_control_character(name):
    key = name_key(name)
    assert glob_match(key, name), key
    assert printable(key) == key  # nothing to escape: no control character, no backslash
    assert not glob_match(key, "FAKE LINE")


def _trace_with(name: str) -> str:
    """What the kernel writes: the name raw, a newline in it included."""
    return "".join(format_line(name, 101, 100, 0, "d..2", f"10.{us:06d}", "sched_waking",
                               "comm=loop pid=102 prio=120 target_cpu=000") for us in (1, 2, 3))


def test_a_name_the_trace_text_breaks_is_taken_from_proc(tmp_path):
    path = tmp_path / "t.trace"
    path.write_bytes(_trace_with(FORGING).encode())
    summary = parse_trace(str(path))
    assert summary.threads[101].comm == "FAKE LINE"  # the trace alone cannot say the name
    samples = Samples(root_pid=100, unit=None, interval_s=0.1, duration_s=1.0,
                      processes={100: ProcessInfo(pid=100, ppid=1, name="srv", exe="/usr/bin/srv", titles=["srv"],
                                                  unit=None, cgroup=None, cpu_quota=None)},
                      threads={101: ThreadSeries(101, 100, FORGING, [ThreadSample(0.0, "S", 0, 0),
                                                                      ThreadSample(1.0, "S", 10**6, 0)])})
    got = workload_features(summary, samples).threads[101]
    assert got.comm == FORGING and glob_match(got.key, FORGING) and not glob_match(got.key, "FAKE LINE")


def test_a_carriage_return_in_a_traced_name_ends_no_line(tmp_path):
    path = tmp_path / "t.trace"
    path.write_bytes(_trace_with("a\rb").encode())
    summary = parse_trace(str(path))
    assert summary.threads[101].comm == "a\rb" and summary.unparsed_lines == 0


def test_a_synthesized_profile_selects_the_real_thread():
    """test_training's JVM, whose yield group is selected by name, with a hostile name in it."""
    handlers = [thread(i, f"req-handler-{i}", 0.25, network=1000, wakees={j: 400 for j in (1, 2, 3, 4) if j != i})
                for i in (1, 2, 3, 4)]
    wf = workload(*handlers, thread(5, "HTTP-Dispatcher", 0.05, network=30000),
                  thread(10, "VM Thread", 0.003, timer=200, wakers={11: 100, 12: 100},
                         wakees={1: 30, 2: 30, 3: 30, 4: 30, 5: 60, 11: 270, 12: 270}),
                  thread(11, "GC Thread#0", 0.004, wakers={10: 270}, wakees={10: 100}),
                  thread(12, "GC Thread#1", 0.004, wakers={10: 270}, wakees={10: 100}),
                  thread(20, FORGING, 0.5, timer=500, p50=20000, wakees={1: 20, 2: 20}),
                  thread(21, "Service Thread", 0.0, timer=12, wakees={1: 2}))
    analysis = A.analyze(wf, 2.0, "host")
    background = analysis.cluster_of(20)
    assert background.selector == "thread_names"
    text = synthesize(analysis, None, SHAPE)
    assert "\r" not in text and "\nFAKE LINE" not in text
    group = next(g for g in parse_profile(text, "jvm.toml").thread_groups if g.name == background.name)
    assert any(glob_match(p, FORGING) for p in group.thread_names), group.thread_names
    assert all(printable(p) == p for p in group.thread_names)  # no control character in a selector
