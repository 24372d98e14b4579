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
3. Validation times the pattern on hostile subjects of that length built from its own
   characters and refuses it when one takes longer than PROBE_BUDGET_S: this catches the
   polynomial shapes (`.*a.*b`) that rule 1 lets through.
"""

from __future__ import annotations

import re
import time
from typing import Iterator, List, Optional

try:  # Python 3.11 moved the parser; the old module name warns there
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse  # type: ignore[no-redef]

MAX_SUBJECT_CHARS = 512
PROBE_BUDGET_S = 0.005

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


def _probe_subjects(pattern: str) -> List[str]:
    """Long runs of the characters the pattern itself names, plus common title characters,
    each ending in one that nothing expects: the inputs that make backtracking try the most."""
    chars = {c for c in re.sub(r"\\.", "", pattern) if c.isprintable() and c not in "()[]{}?*+|^$.\\"}
    chars.update("a0 :/-")
    out = []
    for c in sorted(chars):
        out.append(c * (MAX_SUBJECT_CHARS - 1) + "\x01")
        out.append((c + " ") * (MAX_SUBJECT_CHARS // 2 - 1) + "\x01")
    return out


def slowest_probe_s(compiled: "re.Pattern") -> float:
    """The longest search over the probe subjects; the slowest one is timed three times and its
    fastest run counts, so a busy host does not make a good pattern look slow."""
    def timed(subject: str) -> float:
        start = time.perf_counter()
        compiled.search(subject)
        return time.perf_counter() - start

    slowest, worst = 0.0, ""
    for subject in _probe_subjects(compiled.pattern):
        took = timed(subject)
        if took > slowest:
            slowest, worst = took, subject
        if slowest > PROBE_BUDGET_S * 20:
            break  # far over: no need to wait for the rest
    if slowest > PROBE_BUDGET_S:
        slowest = min([slowest] + [timed(worst) for _ in range(2)])
    return slowest


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
    slowest = slowest_probe_s(compiled)
    if slowest > PROBE_BUDGET_S:
        return (f"a regular expression that matches a {MAX_SUBJECT_CHARS}-character title within "
                f"{PROBE_BUDGET_S * 1e3:g} ms (took {slowest * 1e3:.0f} ms on a hostile one; avoid several "
                f"unanchored .* in a row)")
    return None
