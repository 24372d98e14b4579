"""Refine a profile by measurement: a hill climb, one parameter of one thread group at a time.

From the profile in hand (the best so far) each neighbour changes one thing: a group's treatment
exclusive <-> latency, its cpu_fraction by a tenth, its nice by five, its slice_us (set or halved),
a yield group's policy idle <-> batch, a `busiest` group's N by one. A neighbour is measured against
the best so far (both arms bound, interleaved, as `train evaluate` does) and kept only when the
verdict rule calls it better; a kept change makes its profile the new best and the climb goes on
from there. It stops after max_trials measured neighbours, or when no neighbour is left untried.

Profiles are edited as text, group by group, so the evidence comments synthesize wrote stay; every
candidate is checked by the strict profile loader before it is measured.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Set, Tuple

from temperd.config.errors import ConfigError
from temperd.config.profile import GROUP_SPEC, ThreadGroup, parse_profile
from temperd.plan import EXCLUSIVE, LATENCY, YIELD
from temperd.training.verdicts import BETTER, Spread

NICE_STEP = 5
FRACTION_STEP = 0.1
DEFAULT_SHORT_SLICE_US = 1000  # the first slice_us tried where a group has none (the kernel's default is 3 ms)
MIN_SLICE_US = 100


@dataclass(frozen=True)
class Change:
    """One parameter of one group: key set to value (None: the key removed), plus what must go with it."""

    group: str
    key: str
    before: object
    after: object
    also: Tuple[Tuple[str, object], ...] = ()  # other keys of the same group, set (or removed: None) with it

    def describe(self) -> str:
        return f"group {self.group!r} {self.key} {_show(self.before)} -> {_show(self.after)}"

    def reverses(self, other: "Change") -> bool:
        return (self.group, self.key, self.before, self.after) == (other.group, other.key, other.after, other.before)


def _show(value: object) -> str:
    return "unset" if value is None else json.dumps(value) if isinstance(value, str) else f"{value:g}"


@dataclass
class Trial:
    number: int
    change: Change
    candidate: Spread
    best: Spread
    ratio: float
    verdict: str
    kept: bool

    def describe(self) -> str:
        return (f"trial {self.number}: {self.change.describe()}: {self.candidate.describe()} against "
                f"{self.best.describe()}, {self.ratio:.3f}x, {self.verdict}: " + ("kept" if self.kept else "dropped"))


@dataclass
class Refinement:
    text: str  # the best profile found (the starting one when nothing was kept)
    trials: List[Trial] = field(default_factory=list)

    @property
    def kept(self) -> List[Trial]:
        return [t for t in self.trials if t.kept]


# ---- neighbours -----------------------------------------------------------------------------------


def changes_of(group: ThreadGroup, declared: Set[str]) -> Iterator[Change]:
    """The neighbours of one group, the likelier gains first. declared: the keys its table sets."""
    name = group.name
    if group.treatment == EXCLUSIVE:
        if group.cpu_fraction > FRACTION_STEP + 1e-9:
            yield Change(name, "cpu_fraction", group.cpu_fraction, round(group.cpu_fraction - FRACTION_STEP, 3))
        if group.cpu_fraction < 1.0:
            yield Change(name, "cpu_fraction", group.cpu_fraction, round(min(1.0, group.cpu_fraction + FRACTION_STEP), 3))
        nice = GROUP_SPEC.default_for("nice", {"treatment": LATENCY}) if "nice" in declared else None
        yield Change(name, "treatment", EXCLUSIVE, LATENCY, also=(("cpu_fraction", None), ("nice", nice)))
    if group.treatment == LATENCY:
        if group.nice > -20:
            yield Change(name, "nice", group.nice, max(-20, group.nice - NICE_STEP))
        if group.nice < 0:
            yield Change(name, "nice", group.nice, min(0, group.nice + NICE_STEP))
        yield Change(name, "treatment", LATENCY, EXCLUSIVE, also=(("nice", None),))
    if group.treatment in (EXCLUSIVE, LATENCY):
        shorter = DEFAULT_SHORT_SLICE_US if group.slice_us is None else max(MIN_SLICE_US, group.slice_us // 2)
        if group.slice_us is None or shorter < group.slice_us:
            yield Change(name, "slice_us", group.slice_us, shorter)
    if group.treatment == YIELD:
        other = "batch" if group.yield_policy == "idle" else "idle"
        yield Change(name, "yield_policy", group.yield_policy, other)
    if group.busiest is not None:
        yield Change(name, "busiest", group.busiest, group.busiest + 1)
        if group.busiest > 1:
            yield Change(name, "busiest", group.busiest, group.busiest - 1)


def neighbours(text: str, file: str = "candidate") -> Iterator[Tuple[Change, str]]:
    """(change, the profile with it) for each neighbour the strict loader accepts."""
    profile = parse_profile(text, file)
    for group in profile.thread_groups:
        declared = set(_group_keys(text, group.name))
        for change in changes_of(group, declared):
            candidate = apply_change(text, change)
            try:
                parse_profile(candidate, file)
            except ConfigError:
                continue  # a neighbour the schema forbids (e.g. an exclusive catch-all): not measured
            yield change, candidate


# ---- editing one group's table, comments kept ---------------------------------------------------

_TABLE = re.compile(r"^\s*\[")
_GROUP = re.compile(r"^\s*\[\[\s*thread_groups\s*\]\]")


def _group_span(lines: List[str], group: str) -> Tuple[int, int]:
    """[start, end) of the lines of the [[thread_groups]] table named `group`."""
    starts = [i for i, line in enumerate(lines) if _GROUP.match(line)]
    for start in starts:
        end = next((i for i in range(start + 1, len(lines)) if _TABLE.match(lines[i])), len(lines))
        for line in lines[start + 1:end]:
            found = re.match(r"^\s*name\s*=\s*(\"(?:[^\"\\]|\\.)*\")", line)
            if found and json.loads(found.group(1)) == group:
                return start, end
    raise KeyError(f"no [[thread_groups]] named {group!r}")


def _key_line(key: str) -> re.Pattern:
    return re.compile(rf"^\s*{re.escape(key)}\s*=")


def _group_keys(text: str, group: str) -> List[str]:
    lines = text.splitlines()
    start, end = _group_span(lines, group)
    return [m.group(1) for m in (re.match(r"^\s*([A-Za-z_]+)\s*=", line) for line in lines[start + 1:end]) if m]


def set_key(text: str, group: str, key: str, value: object) -> str:
    """The profile with `key = value` in the named group's table (replaced in place, else added
    after its name); value None removes the key."""
    lines = text.splitlines()
    start, end = _group_span(lines, group)
    at = next((i for i in range(start + 1, end) if _key_line(key).match(lines[i])), None)
    if value is None:
        if at is not None:
            del lines[at]
    else:
        line = f"{key} = {json.dumps(value)}"
        if at is not None:
            lines[at] = line
        else:
            name_at = next(i for i in range(start + 1, end) if _key_line("name").match(lines[i]))
            lines.insert(name_at + 1, line)
    return "\n".join(lines) + "\n"


def apply_change(text: str, change: Change) -> str:
    text = set_key(text, change.group, change.key, change.after)
    for key, value in change.also:
        text = set_key(text, change.group, key, value)
    return text


# ---- the climb ----------------------------------------------------------------------------------

# (candidate text, best text) -> (candidate's spread, best's spread, ratio candidate/best, verdict)
Measure = Callable[[str, str], Tuple[Spread, Spread, float, str]]


def refine(text: str, measure: Measure, max_trials: int,
           progress: Callable[[Trial], None] = lambda trial: None) -> Refinement:
    """Hill-climb from `text`: measure neighbours of the best so far, keep a measured improvement."""
    result = Refinement(text)
    tried: List[Change] = []
    while len(result.trials) < max_trials:
        improved = False
        for change, candidate in neighbours(result.text):
            if any(change == old or change.reverses(old) for old in tried):
                continue
            tried.append(change)
            cand, best, ratio, verdict = measure(candidate, result.text)
            trial = Trial(len(result.trials) + 1, change, cand, best, ratio, verdict, kept=verdict == BETTER)
            result.trials.append(trial)
            progress(trial)
            if trial.kept:
                result.text = candidate
                improved = True
                break
            if len(result.trials) >= max_trials:
                break
        if not improved:
            break
    return result


def trial_log(refinement: Refinement, header: str) -> str:
    """The trials as comment lines to append to the refined profile."""
    lines = [f"# {header}"]
    lines += [f"#   {trial.describe()}" for trial in refinement.trials]
    kept = refinement.kept
    lines.append("# Kept: " + ("; ".join(t.change.describe() for t in kept) if kept else
                               "nothing (no neighbour measured better than the profile it started from)"))
    return "\n".join(lines) + "\n"
