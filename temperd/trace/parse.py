"""Reading a captured ftrace text trace back into per-thread facts: CPU time from sched_switch,
how often each thread was switched in, preempted, blocked, woken and migrated, and who woke whom
(waker -> wakee edges from sched_waking, which runs in the waker's context), and what training
reads of each thread's behaviour: on-CPU burst lengths (a log2 histogram), sleeps in D state,
runqueue wait (woken or preempted until switched in) and CPU time per second of the trace.

It streams: one pass over the lines, memory proportional to the threads and the distinct
waker/wakee pairs seen, never to the number of events. Plain or gzip input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, IO, Iterable, List, Optional, Tuple, Union

from temperd.trace.format import FORK_FIELDS, LINE_HEAD, RENAME_FIELDS, SWITCH_FIELDS, WAKE_FIELDS, event_lines, open_text

_MIGRATE_FIELDS = re.compile(r"comm=.* pid=(\d+) prio=-?\d+ orig_cpu=(\d+) dest_cpu=(\d+)")
# Third flag character: the event ran in hard or soft interrupt (or NMI) context.
_IRQ_FLAGS = frozenset("hHsSzZ")
_RUNNABLE_STATES = ("R", "R+")
BURST_BUCKETS = 32
_NS_PER_S = 1_000_000_000


def burst_bucket_bounds_us(index: int) -> Tuple[float, float]:
    """The burst lengths (microseconds) ThreadStats.bursts[index] counts."""
    return (0.0 if index == 0 else float(2 ** index), float(2 ** (index + 1)))


def _ran(stats: "ThreadStats", start: int, end: int, first: int) -> None:
    """Book an on-CPU stretch: runtime, its burst bucket, and its time per second of the trace."""
    length = end - start
    stats.runtime_ns += length
    stats.bursts[min(BURST_BUCKETS - 1, max(0, (length // 1000).bit_length() - 1))] += 1
    by_second = stats.cpu_by_second
    second, offset = divmod(start - first, _NS_PER_S)
    while length > 0:
        part = min(length, _NS_PER_S - offset)
        by_second[second] = by_second.get(second, 0) + part
        length -= part
        second += 1
        offset = 0


@dataclass
class ThreadStats:
    tid: int
    comm: str
    tgid: Optional[int] = None
    runtime_ns: int = 0
    switches_in: int = 0
    preempted: int = 0  # switched out while still runnable
    blocked: int = 0  # switched out to sleep (S, D, ...)
    wakeups: int = 0  # woken by a task
    irq_wakeups: int = 0  # woken from interrupt context (no waker thread)
    softirq_wakeups: int = 0  # of irq_wakeups: from a softirq (network receive, loopback included)
    migrations: int = 0
    blocked_d: int = 0  # of `blocked`: asleep uninterruptibly (D), usually on I/O
    wait_ns: int = 0  # runnable but not running: woken or preempted until switched in
    waits: int = 0  # switch-ins that `wait_ns` covers
    # bursts[i]: on-CPU stretches of 2**i to 2**(i+1) microseconds (i = 0 also holds shorter ones)
    bursts: List[int] = field(default_factory=lambda: [0] * BURST_BUCKETS)
    cpu_by_second: Dict[int, int] = field(default_factory=dict)  # second of the trace -> on-CPU ns


@dataclass
class TraceSummary:
    events: int = 0
    by_event: Dict[str, int] = field(default_factory=dict)
    duration_ns: int = 0  # from the first event to the last
    threads: Dict[int, ThreadStats] = field(default_factory=dict)
    edges: Dict[Tuple[int, int], int] = field(default_factory=dict)  # (waker tid, wakee tid) -> count
    unparsed_lines: int = 0


def parse_trace(source: Union[str, Iterable[str]]) -> TraceSummary:
    """Parse a trace file (path, plain or gzip) or any iterable of lines."""
    if isinstance(source, str):
        with open_text(source) as handle:
            return _parse(handle)
    return _parse(source)


def _parse(lines: Union[IO[str], Iterable[str]]) -> TraceSummary:
    """One pass: each line's head read here, its event's fields by the _Parser's handler."""
    parser = _Parser()
    switch, waking, wakeup, lifecycle = parser.switch, parser.waking, parser.wakeup, parser.lifecycle
    head_match = LINE_HEAD.match
    by_event, threads = parser.summary.by_event, parser.threads
    scale_for: Dict[int, int] = {}
    events = 0
    unparsed = 0
    ts = 0
    for line in event_lines(lines):
        if line[:1] == "#":
            continue
        m = head_match(line)
        if m is None:
            if line.strip():
                unparsed += 1
            continue
        comm, tid_s, tgid_s, cpu_s, flags, sec, frac, event = m.groups()
        scale = scale_for.get(len(frac))
        if scale is None:
            scale = scale_for[len(frac)] = 10 ** (9 - len(frac))
        ts = int(sec + frac) * scale
        if parser.first is None:
            parser.first = ts
        events += 1
        by_event[event] = by_event.get(event, 0) + 1
        tid = int(tid_s)
        if tid and tgid_s and tgid_s[0] != "-":
            me = threads.get(tid) or parser.thread(tid, comm)
            if me.tgid is None:
                me.tgid = int(tgid_s)
        fields = line[m.end():]
        if event == "sched_switch":
            parsed = switch(fields, int(cpu_s), ts)
        elif event == "sched_waking":
            parsed = waking(fields, tid, flags, ts)
        elif event == "sched_wakeup" or event == "sched_wakeup_new":
            parsed = wakeup(fields, event == "sched_wakeup_new", ts)
        else:
            parsed = lifecycle(event, fields, tid, comm)
        if not parsed:
            unparsed += 1
    return parser.finish(events, unparsed, ts)


class _Parser:
    """What one pass keeps between lines, and a handler per kind of event; a handler returns
    False for fields it cannot read (the line counts as unparsed)."""

    def __init__(self) -> None:
        self.summary = TraceSummary()
        self.threads = self.summary.threads
        self.running: Dict[int, Tuple[int, int]] = {}  # cpu -> (tid, since ns)
        self.ready_since: Dict[int, int] = {}  # tid -> when it became runnable (woken or preempted)
        self.first: Optional[int] = None
        # With sched_waking in the trace it alone counts wakeups (sched_wakeup repeats it later,
        # from the target CPU); older kernels only have sched_wakeup.
        self.wakeup_only: Dict[int, int] = {}
        self.saw_waking = False

    def thread(self, tid: int, comm: str) -> ThreadStats:
        stats = self.threads.get(tid)
        if stats is None:
            stats = self.threads[tid] = ThreadStats(tid, comm)
        return stats

    def switch(self, fields: str, cpu: int, ts: int) -> bool:
        """sched_switch: the thread switched out (its stretch on the CPU booked; runnable or
        asleep) and the one switched in (its wait since it became runnable)."""
        s = SWITCH_FIELDS.match(fields)
        if s is None:
            return False
        threads, running, ready_since, first = self.threads, self.running, self.ready_since, self.first
        prev = int(s.group(2))
        nxt = int(s.group(6))
        if prev:
            p = threads.get(prev) or self.thread(prev, s.group(1))
            current = running.get(cpu)
            if current is None:
                _ran(p, first, ts, first)  # ran since before the trace began
            elif current[0] == prev:
                _ran(p, current[1], ts, first)
            state = s.group(4)
            if state in _RUNNABLE_STATES:
                p.preempted += 1
                ready_since[prev] = ts
            else:
                p.blocked += 1
                ready_since.pop(prev, None)  # a wakeup seen while it still ran is no wait
                if state[:1] == "D":
                    p.blocked_d += 1
        if nxt:
            n = threads.get(nxt)
            if n is None:
                n = threads[nxt] = ThreadStats(nxt, s.group(5))
            else:
                n.comm = s.group(5)  # the name it runs under now (after exec or rename)
            n.switches_in += 1
            since = ready_since.pop(nxt, None)
            if since is not None:
                n.wait_ns += ts - since
                n.waits += 1
        running[cpu] = (nxt, ts)
        return True

    def waking(self, fields: str, tid: int, flags: Optional[str], ts: int) -> bool:
        """sched_waking, in the waker's context: tid is the waker (0: the idle task)."""
        self.saw_waking = True
        w = WAKE_FIELDS.match(fields)
        if w is None:
            return False
        wakee = int(w.group(2))
        target = self.threads.get(wakee) or self.thread(wakee, w.group(1))
        self.ready_since.setdefault(wakee, ts)
        if (flags and len(flags) > 2 and flags[2] in _IRQ_FLAGS) or tid == 0:
            target.irq_wakeups += 1
            if flags and len(flags) > 2 and flags[2] == "s":
                target.softirq_wakeups += 1
        else:
            target.wakeups += 1
            edges = self.summary.edges
            key = (tid, wakee)
            edges[key] = edges.get(key, 0) + 1
        return True

    def wakeup(self, fields: str, new: bool, ts: int) -> bool:
        """sched_wakeup (new: sched_wakeup_new), on the target CPU."""
        w = WAKE_FIELDS.match(fields)
        if w is None:
            return False
        wakee = int(w.group(2))
        self.thread(wakee, w.group(1))
        if not self.saw_waking or new:
            self.ready_since.setdefault(wakee, ts)
        if not self.saw_waking:
            self.wakeup_only[wakee] = self.wakeup_only.get(wakee, 0) + 1
        return True

    def lifecycle(self, event: str, fields: str, tid: int, comm: str) -> bool:
        """Migrations and renames; a forked or exiting thread is recorded; other events are counted only."""
        if event == "sched_migrate_task":
            g = _MIGRATE_FIELDS.match(fields)
            if g is not None and g.group(2) != g.group(3):
                self.thread(int(g.group(1)), comm).migrations += 1
        elif event == "sched_process_fork":
            f = FORK_FIELDS.match(fields)
            if f is not None:
                self.thread(int(f.group(4)), f.group(3))
        elif event == "sched_process_exit":
            self.thread(tid, comm)
        elif event == "task_rename":
            r = RENAME_FIELDS.match(fields)
            if r is not None:
                self.thread(int(r.group(1)), r.group(3)).comm = r.group(3)
        return True

    def finish(self, events: int, unparsed: int, ts: int) -> TraceSummary:
        """The summary once the lines are read (ts: the last event's time): who still ran is
        booked up to the last event."""
        threads, first = self.threads, self.first
        for tid, since in self.running.values():
            if tid:
                _ran(threads[tid], since, ts, first)  # still running when the trace ended
        if not self.saw_waking:
            for wakee, count in self.wakeup_only.items():
                threads[wakee].wakeups += count
        summary = self.summary
        summary.events = events
        summary.unparsed_lines = unparsed
        summary.duration_ns = ts - first if first is not None else 0
        return summary
