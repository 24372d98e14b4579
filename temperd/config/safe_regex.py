"""Regular expressions from profiles run against text any local user chooses: a process's
command line and title. Python's `re` backtracks, so a pattern like `(a+)+$` takes time that
doubles with each character of a hostile title, and `.*a.*b` grows with the cube of its length.
temperd has no linear-time engine to use (Debian packages none for Python), so matching time is
bounded by three rules together:

1. Validation refuses the shapes that backtrack exponentially: an unbounded repeat inside
   another repeat (`(a+)+`, `(\\w*\\s?)*`), an alternation inside an unbounded repeat
   (`(a|ab)*`), and backreferences.
2. The matcher looks at the first MAX_SUBJECT_CHARS characters of a command line or title only
   (the titles profiles select on, like `postgres: app db 10.0.0.1(5432) idle`, are far shorter).
3. Validation times the pattern on hostile subjects built from what it matches (read from its
   parse, so `\x23` counts as `#` and `[0-9]` as `0`), at lengths growing to that bound, and
   refuses it when one takes longer than PROBE_BUDGET_S: this catches the polynomial shapes
   (`.*a.*b`) that rule 1 lets through. More than MAX_OPEN_REPEATS unbounded repeats are refused
   outright: each multiplies the time by the subject's length, and the probe could not grow its
   subject step by step without one step taking seconds.
4. The daemon times each search it makes (`search`: in wall time, and a search over the budget
   once more in CPU time, so a busy host does not count) and disables a pattern whose search takes
   longer than MATCH_BUDGET_S of CPU, saying so once: a pattern that slipped past the probe costs
   two slow searches, not one per process.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Dict, Iterator, List, Optional, Set

try:  # Python 3.11 moved the parser; the old module name warns there
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse  # type: ignore[no-redef]

log = logging.getLogger("temperd.regex")

MAX_SUBJECT_CHARS = 512
PROBE_BUDGET_S = 0.005
PROBE_LENGTHS = (16, 24, 36, 54, 81, 122, 183, 275, 412, MAX_SUBJECT_CHARS)  # x1.5: one step costs at most 1.5^k more
MAX_OPEN_REPEATS = 8
MATCH_BUDGET_S = 0.05

_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT}
if hasattr(sre_parse, "POSSESSIVE_REPEAT"):
    _REPEATS.add(sre_parse.POSSESSIVE_REPEAT)
_UNBOUNDED = sre_parse.MAXREPEAT
_LARGE_COUNT = 10  # `{n,m}` with m above this repeats like `*` for backtracking purposes


def bounded_subject(text: str) -> str:
    """What the matcher hands to a profile's pattern (rule 2)."""
    return text[:MAX_SUBJECT_CHARS]


def _children(op, av) -> Iterator[list]:
    if op == sre_parse.SUBPATTERN:
        yield av[-1]
    elif op == sre_parse.BRANCH:
        yield from av[1]
    elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        yield av[1]
    elif op in _REPEATS:
        yield av[2]
    elif hasattr(sre_parse, "ATOMIC_GROUP") and op == sre_parse.ATOMIC_GROUP:
        yield av
    elif op == sre_parse.GROUPREF_EXISTS:
        yield from (branch for branch in av[1:] if branch is not None)


def _contains(items, found) -> bool:
    """Whether found(op, av) holds for an item here or nested anywhere below."""
    return any(found(op, av) or any(_contains(child, found) for child in _children(op, av)) for op, av in items)


def _is_repeat(op, av) -> bool:
    return op in _REPEATS and (av[1] == _UNBOUNDED or av[1] > 1)


def _is_branch(op, _av) -> bool:
    return op == sre_parse.BRANCH


def _shape_problem(items) -> Optional[str]:
    for op, av in items:
        if op in (sre_parse.GROUPREF, sre_parse.GROUPREF_EXISTS):
            return "no backreference (matching with one can take exponential time)"
        if op in _REPEATS:
            _low, high, body = av
            repeats = high == _UNBOUNDED or high > _LARGE_COUNT
            if repeats and _contains(body, _is_repeat):
                return ("no repeat inside a repeated group, like (a+)+ (on a hostile title matching "
                        "takes time doubling with each character)")
            if repeats and _contains(body, _is_branch):
                return ("no alternation inside a repeated group, like (a|ab)* (on a hostile title "
                        "matching takes time doubling with each character)")
        for child in _children(op, av):
            problem = _shape_problem(child)
            if problem:
                return problem
    return None


_CATEGORY_CHARS = {"DIGIT": "0", "NOT_DIGIT": "a", "SPACE": " ", "NOT_SPACE": "a", "WORD": "a", "NOT_WORD": " ",
                   "LINEBREAK": "\n", "NOT_LINEBREAK": "a"}


def _matched_chars(items, out: Set[str]) -> None:
    """Characters that the pattern's parts match, read from its parse (escapes resolved)."""
    for op, av in items:
        if op == sre_parse.LITERAL:
            out.add(chr(av))
        elif op == sre_parse.NOT_LITERAL:
            out.add("a" if av != ord("a") else "b")
        elif op == sre_parse.IN:
            for item_op, item_av in av:
                if item_op == sre_parse.LITERAL:
                    out.add(chr(item_av))
                elif item_op == sre_parse.RANGE:
                    out.update((chr(item_av[0]), chr(item_av[1])))
                elif item_op == sre_parse.CATEGORY:
                    out.add(_CATEGORY_CHARS.get(getattr(item_av, "name", "").replace("CATEGORY_", ""), "a"))
        for child in _children(op, av):
            _matched_chars(child, out)


def _open_repeats(items) -> int:
    count = 0
    for op, av in items:
        if op in _REPEATS and (av[1] == _UNBOUNDED or av[1] > _LARGE_COUNT):
            count += 1
        count += sum(_open_repeats(child) for child in _children(op, av))
    return count


def _probe_subjects(parsed, length: int) -> List[str]:
    """Runs of each character the pattern matches, plus common title characters, alone and
    alternating with a space, each ending in one that nothing expects: the inputs that make
    backtracking try the most."""
    chars: Set[str] = set()
    _matched_chars(parsed, chars)
    chars = {c for c in chars if c != "\x01"}
    chars.update("a0 :/-")
    out = []
    for c in sorted(chars):
        out.append(c * (length - 1) + "\x01")
        out.append((c + " ") * (length // 2 - 1) + "\x01")
    return out


def slowest_probe_s(compiled: "re.Pattern", parsed) -> float:
    """The longest search over the probe subjects, at growing lengths up to MAX_SUBJECT_CHARS,
    stopping at the first length where it is over the budget. The slowest subject of a length is
    timed three times and its fastest run counts, so a busy host does not make a good pattern
    look slow (a pattern over the budget only by chance goes on to the next length)."""
    def timed(subject: str) -> float:
        start = time.perf_counter()
        compiled.search(subject)
        return time.perf_counter() - start

    slowest = 0.0
    for length in PROBE_LENGTHS:
        took, worst = max((timed(subject), subject) for subject in _probe_subjects(parsed, length))
        if took > PROBE_BUDGET_S:
            took = min([took] + [timed(worst) for _ in range(2)])
        slowest = max(slowest, took)
        if took > PROBE_BUDGET_S:
            break  # longer subjects only take longer
    return slowest


_disabled: Dict[str, str] = {}
_disabled_lock = threading.Lock()


def search(pattern: str, text: str) -> bool:
    """Whether the pattern is found in the bounded text (rule 2), timed (rule 4): a pattern whose
    search takes more than MATCH_BUDGET_S of CPU is disabled from then on, with one warning."""
    if pattern in _disabled:
        return False
    subject = bounded_subject(text)
    start = time.perf_counter()  # wall time first: a clock read without a system call
    found = re.search(pattern, subject) is not None
    if time.perf_counter() - start <= MATCH_BUDGET_S:
        return found  # no more CPU than wall time
    start = time.thread_time()  # the search again, its CPU time counted: preemption alone disables nothing
    found = re.search(pattern, subject) is not None
    took = time.thread_time() - start
    if took > MATCH_BUDGET_S:
        why = (f"took {took * 1e3:.0f} ms of CPU on a {min(len(text), MAX_SUBJECT_CHARS)}-character title, "
               f"over the {MATCH_BUDGET_S * 1e3:g} ms budget")
        with _disabled_lock:
            first = pattern not in _disabled
            _disabled[pattern] = why
        if first:
            log.warning("regular expression %r disabled: %s; it matches nothing until temperd restarts", pattern, why)
        return False
    return found


def disabled_patterns() -> Dict[str, str]:
    """The patterns search() disabled, with why: for status."""
    with _disabled_lock:
        return dict(_disabled)


def regex_problem(pattern: str) -> Optional[str]:
    """None when the pattern is safe to run on user-chosen text, else what was expected."""
    if not pattern:
        return "a non-empty regular expression"
    try:
        compiled = re.compile(pattern)
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"a valid regular expression ({exc})"
    data = parsed.data if hasattr(parsed, "data") else list(parsed)
    problem = _shape_problem(data)
    if problem:
        return f"a regular expression with {problem}"
    if _open_repeats(data) > MAX_OPEN_REPEATS:
        return (f"a regular expression with at most {MAX_OPEN_REPEATS} unbounded repeats (*, +, {{n,}}; each one "
                "multiplies matching time by the title's length)")
    slowest = slowest_probe_s(compiled, data)
    if slowest > PROBE_BUDGET_S:
        return (f"a regular expression that matches a {MAX_SUBJECT_CHARS}-character title within "
                f"{PROBE_BUDGET_S * 1e3:g} ms (took {slowest * 1e3:.0f} ms on a hostile one; avoid several "
                f"unanchored .* in a row)")
    return None
