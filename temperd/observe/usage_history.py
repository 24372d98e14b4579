"""The rightsizing history: per workload, a decaying usage histogram (observe/histogram.py) for
each of its busiest threads, one for the sum of every thread that is not hot (the shared
remainder), one per thread group for the same, and one for the whole workload (the
container-average view). Kept across restarts in one JSON file (state directory, atomic writes).

Bounded: at most keep_threads threads per workload individually (the usage sampler picks the
busiest), the rest aggregated; a thread known only from the file (the workload restarted while
temperd was down: new thread ids) hands its history to the first thread of the same name and group; the least busy entries go
first when there are more than keep_threads. Workloads are keyed by their label
(observe/workload_labels.py: no pid), so the history outlives processes and temperd's restarts.
An interval in which a thread was starved (usage_tracker.demand) stays out of its histogram:
its demand is unknown then; the intervals and what it got in them are counted beside."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from temperd.config.errors import ConfigError
from temperd.config.tomlsource import read_config_bytes
from temperd.decide.classify import HOT_THREAD_CPUS
from temperd.decide.rightsize import ThreadUsage, UsageSummary
from temperd.files import remove_unfinished_writes, write_atomically
from temperd.text import printable
from temperd.observe.histogram import DecayingHistogram

log = logging.getLogger("temperd.rightsizing")

FORMAT_VERSION = 1
MAX_WORKLOADS = 256  # histories kept, those of stopped workloads included (they come back)
OTHER_THREADS = "(other threads)"  # the group of usage not attributed to a kept thread
# Bound on the file read at start: the fullest history (256 workloads of 16 threads, every
# histogram's ~200 buckets filled) takes about 22 MiB; a larger file is not one temperd wrote.
MAX_FILE_BYTES = 32 << 20


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} out of range")
    return value


def _short_int(text: str) -> int:
    if len(text) > 20:
        raise ValueError(f"number of {len(text)} digits, expected at most 20")
    return int(text)


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number")


def _number(value, key: str) -> Optional[float]:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{key}: expected a number, found {type(value).__name__}")
    return value


@dataclass(frozen=True)
class ThreadSample:
    """One kept thread's usage over one sampling interval."""

    tid: int
    start_time: int
    comm: str
    group: Optional[str]
    cpus: float  # the share of a CPU it wanted (usage_tracker.demand), at most 1; what it got where starved
    starved: bool = False  # runnable all along, kept waiting while the host had no CPU to spare


class ThreadHistory:
    def __init__(self, tid: int, start_time: int, comm: str, group: Optional[str], hist: DecayingHistogram):
        self.tid, self.start_time, self.comm, self.group, self.hist = tid, start_time, comm, group, hist
        self.hot = False
        self.from_file = False  # loaded and not sampled since: its thread may be gone (new ids)
        self.starved_samples = 0  # intervals it was starved: not in hist (its demand is unknown then)
        self.starved_got_s = 0.0  # CPU-seconds it got in them

    @property
    def key(self) -> str:
        return f"{self.tid}:{self.start_time}"

    def to_json(self) -> dict:
        return {"tid": self.tid, "start_time": self.start_time, "comm": self.comm, "group": self.group,
                "hist": self.hist.to_json(), "starved_samples": self.starved_samples,
                "starved_got_s": self.starved_got_s}


class WorkloadHistory:
    def __init__(self, label: str, half_life_s: float):
        self.label = label
        self.half_life_s = half_life_s
        self.threads: Dict[str, ThreadHistory] = {}
        self.rest = DecayingHistogram(half_life_s)
        self.total = DecayingHistogram(half_life_s)
        self.group_rest: Dict[str, DecayingHistogram] = {}
        self.first_at: Optional[float] = None
        self.last_at: Optional[float] = None
        self.samples = 0
        self.idle_at: List[Tuple[float, int]] = []  # idle looks not yet added (record_idle): (at, intervals)
        self.starved_samples = 0  # intervals in which one of its kept threads was starved
        self.starved_got = DecayingHistogram(half_life_s)  # what the workload got in those intervals

    def record_idle(self, at: float, intervals: int = 1) -> None:
        """A look that found none of its processes ran for `intervals` sampling intervals: counted
        now, added to every histogram at once when it next runs (or is summarised), so an idle
        workload costs nothing."""
        self.idle_at.append((at, intervals))

    def _flush_idle(self) -> None:
        if not self.idle_at:
            return
        looks, self.idle_at = self.idle_at, []
        for hist in [e.hist for e in self.threads.values()] + [self.rest, self.total, *self.group_rest.values()]:
            for at, intervals in looks:
                hist.add(0.0, at, intervals)
        self.first_at = looks[0][0] if self.first_at is None else self.first_at
        self.last_at = looks[-1][0]
        self.samples += sum(intervals for _at, intervals in looks)

    def record(self, at: float, threads: Iterable[ThreadSample], unattributed_cpus: float, keep: int,
               intervals: int = 1) -> None:
        """One look: each kept thread's usage, and what the rest of the workload used, averaged over
        `intervals` sampling intervals (more than one after a look at a resting workload)."""
        self._flush_idle()
        rest = max(0.0, unattributed_cpus)
        total = rest
        group_rest: Dict[str, float] = {OTHER_THREADS: rest}
        hungry = False
        for sample in threads:
            entry = self._entry(sample)
            if sample.starved:  # its demand is unknown: counted apart, what it got is in the sums below
                hungry = True
                entry.starved_samples += intervals
                entry.starved_got_s += sample.cpus * intervals
            else:
                entry.hist.add(sample.cpus, at, intervals)
            if entry.hot or sample.cpus >= HOT_THREAD_CPUS:  # only a busy sample can make it hot, a hot one cool
                entry.hot = entry.hist.percentile(0.95) >= HOT_THREAD_CPUS
            total += sample.cpus
            if not entry.hot and not sample.starved:  # a starved thread's demand is bounded apart (rightsize)
                rest += sample.cpus
                group = sample.group or "-"
                group_rest[group] = group_rest.get(group, 0.0) + sample.cpus
        self.rest.add(rest, at, intervals)
        self.total.add(total, at, intervals)
        if hungry:
            self.starved_samples += intervals
            self.starved_got.add(total, at, intervals)
        for group, cpus in group_rest.items():
            self.group_rest.setdefault(group, DecayingHistogram(self.half_life_s)).add(cpus, at, intervals)
        self.first_at = at if self.first_at is None else self.first_at
        self.last_at = at
        self.samples += intervals
        self._bound(keep)

    def _entry(self, sample: ThreadSample) -> ThreadHistory:
        key = f"{sample.tid}:{sample.start_time}"
        entry = self.threads.get(key)
        if entry is not None:
            entry.comm, entry.from_file = sample.comm, False
            return entry
        heir = self._departed_namesake(sample)
        if heir is not None:  # the same thread of a restarted workload (or of a restarted temperd's lost ids)
            del self.threads[heir.key]
            entry = ThreadHistory(sample.tid, sample.start_time, sample.comm, sample.group, heir.hist)
        else:
            entry = ThreadHistory(sample.tid, sample.start_time, sample.comm, sample.group,
                                  DecayingHistogram(self.half_life_s))
        self.threads[key] = entry
        return entry

    def _departed_namesake(self, sample: ThreadSample) -> Optional[ThreadHistory]:
        """A thread of the same name and group known only from the file (before a restart)."""
        for entry in self.threads.values():
            if entry.from_file and entry.comm == sample.comm and entry.group == sample.group:
                return entry
        return None

    def _bound(self, keep: int) -> None:
        if len(self.threads) <= keep:
            return
        ranked = sorted(self.threads.values(), key=lambda e: (e.hist.percentile(0.95), e.hist.total), reverse=True)
        self.threads = {e.key: e for e in ranked[:keep]}

    def summary(self) -> UsageSummary:
        self._flush_idle()
        threads = tuple(ThreadUsage(e.tid, e.comm, e.group, min(1.0, e.hist.percentile(0.5)),
                                    min(1.0, e.hist.percentile(0.95)), e.hist.total > 0, e.starved_samples,
                                    e.starved_got_s / e.starved_samples if e.starved_samples else 0.0)
                        for e in sorted(self.threads.values(), key=lambda e: e.tid))
        span = (self.last_at - self.first_at) if self.first_at is not None and self.last_at is not None else 0.0
        return UsageSummary(self.label, threads, self.rest.percentile(0.95), self.total.percentile(0.5),
                            self.total.percentile(0.9), self.total.percentile(0.95), span, self.samples,
                            {g: h.percentile(0.95) for g, h in self.group_rest.items() if h.total > 0},
                            self.starved_samples, self.starved_got.percentile(0.95) if self.starved_samples else 0.0)

    def to_json(self) -> dict:
        self._flush_idle()
        return {"first_at": self.first_at, "last_at": self.last_at, "samples": self.samples,
                "starved_samples": self.starved_samples, "starved_got": self.starved_got.to_json(),
                "threads": [e.to_json() for e in self.threads.values()], "rest": self.rest.to_json(),
                "total": self.total.to_json(), "group_rest": {g: h.to_json() for g, h in self.group_rest.items()}}

    @classmethod
    def from_json(cls, label: str, data: dict, half_life_s: float) -> "WorkloadHistory":
        history = cls(label, half_life_s)
        history.first_at, history.last_at = _number(data.get("first_at"), "first_at"), _number(data.get("last_at"), "last_at")
        history.samples = int(_number(data.get("samples", 0), "samples"))
        history.starved_samples = int(_number(data.get("starved_samples", 0), "starved_samples"))
        history.starved_got = DecayingHistogram.from_json(data.get("starved_got", {}), half_life_s)
        for item in data.get("threads", []):
            group = item.get("group")
            if group is not None and not isinstance(group, str):
                raise ValueError(f"group: expected a name, found {type(group).__name__}")
            entry = ThreadHistory(int(item["tid"]), int(item["start_time"]), str(item["comm"]), group,
                                  DecayingHistogram.from_json(item["hist"], half_life_s))
            entry.from_file = True
            entry.starved_samples = int(_number(item.get("starved_samples", 0), "starved_samples"))
            entry.starved_got_s = float(_number(item.get("starved_got_s", 0.0), "starved_got_s"))
            history.threads[entry.key] = entry
        history.rest = DecayingHistogram.from_json(data.get("rest", {}), half_life_s)
        history.total = DecayingHistogram.from_json(data.get("total", {}), half_life_s)
        history.group_rest = {g: DecayingHistogram.from_json(h, half_life_s)
                              for g, h in data.get("group_rest", {}).items()}
        return history


class UsageHistory:
    """Every workload's history, and its file."""

    def __init__(self, path: str, half_life_s: float, keep_threads: int):
        self.path = path
        self.half_life_s = half_life_s
        self.keep_threads = keep_threads
        self.workloads: Dict[str, WorkloadHistory] = {}
        self.loaded_from: Optional[str] = None  # what load() found, for the log and status

    def of(self, label: str) -> WorkloadHistory:
        if label not in self.workloads:
            if len(self.workloads) >= MAX_WORKLOADS:  # the workload gone longest makes room
                stale = min(self.workloads.values(), key=lambda h: h.last_at or 0.0)
                del self.workloads[stale.label]
            self.workloads[label] = WorkloadHistory(label, self.half_life_s)
        return self.workloads[label]

    def load(self) -> str:
        """Read the file if there is one, and say what was found in one log line. Checked like a
        configuration file (a regular file, root's when temperd runs as root, bounded in size;
        never a link, FIFO or device) and parsed with finite numbers and bounded nesting. A file
        that fails is set aside as NAME.bad, never trusted or overwritten, and temperd starts
        without it. Temp files of a write a killed run left unfinished are removed."""
        remove_unfinished_writes(self.path)
        try:
            if not os.path.lexists(self.path):
                self.loaded_from = f"{self.path}: none yet"
            else:
                self.workloads = self._read()
                self.loaded_from = f"{self.path}: {len(self.workloads)} workload(s)"
        except ConfigError as exc:
            self._set_aside(exc.problems[0].message)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            self._set_aside("nested too deeply" if isinstance(exc, RecursionError) else str(exc) or type(exc).__name__)
        else:
            log.info("rightsizing history %s", self.loaded_from)
        return self.loaded_from

    def _read(self) -> Dict[str, "WorkloadHistory"]:
        raw = read_config_bytes(self.path, require_trusted=os.geteuid() == 0, limit=MAX_FILE_BYTES,
                                follow_symlinks=False)
        data = json.loads(raw, parse_float=_finite_float, parse_int=_short_int, parse_constant=_no_constant)
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            found = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"version {found!r}, expected {FORMAT_VERSION}")
        workloads = data.get("workloads", {})
        if not isinstance(workloads, dict) or len(workloads) > MAX_WORKLOADS:
            raise ValueError(f"workloads: expected a table of at most {MAX_WORKLOADS}")
        return {str(label): WorkloadHistory.from_json(str(label), item, self.half_life_s)
                for label, item in workloads.items()}

    def _set_aside(self, why: str) -> None:
        self.workloads = {}
        try:
            os.replace(self.path, self.path + ".bad")
            kept = f"set aside as {os.path.basename(self.path)}.bad"
        except OSError as exc:
            kept = f"could not be set aside ({exc.strerror or exc})"
        self.loaded_from = f"{self.path}: unreadable ({printable(why)}); {kept}, starting without it"
        log.warning("rightsizing history %s", self.loaded_from)

    def save(self) -> int:
        """Write the whole history atomically; its size in bytes."""
        data = json.dumps({"version": FORMAT_VERSION, "half_life_s": self.half_life_s,
                           "workloads": {label: h.to_json() for label, h in sorted(self.workloads.items())}},
                          separators=(",", ":")).encode()
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o750, exist_ok=True)
        write_atomically(self.path, data, mode=0o640)
        return len(data)
