"""Medians, ranges and verdicts over interleaved runs: whether a difference stands out of the
host's noise (compare), and whether the runs settle a goal's limit (bound, settled). The
measuring core (harness.py) shows these as part of its public face."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence, Tuple


@dataclass(frozen=True)
class Spread:
    """The median of some runs and their range."""

    median: float
    low: float
    high: float
    n: int

    def describe(self) -> str:
        return f"{self.median:g} (runs {self.low:g}..{self.high:g})"


def spread(values: Iterable[float]) -> Spread:
    found = [v for v in values if v == v]  # NaN is a missing value
    if not found:
        return Spread(float("nan"), float("nan"), float("nan"), 0)
    return Spread(statistics.median(found), min(found), max(found), len(found))


def median(values: Iterable[float]) -> float:
    return spread(values).median


BETTER, WORSE, WITHIN_NOISE = "better", "worse", "within noise"


@dataclass(frozen=True)
class Comparison:
    """candidate / baseline by their medians, and whether the difference stands out of the noise."""

    ratio: float
    verdict: str  # BETTER, WORSE or WITHIN_NOISE

    def describe(self) -> str:
        return f"{self.ratio:.2f}x ({self.verdict})"


def compare(candidate: Spread, baseline: Spread, higher_is_better: bool, min_effect: float = 0.05) -> Comparison:
    """A difference counts only when each side has at least two runs, their ranges do not overlap
    and the medians differ by at least min_effect (5 %): with 3 runs an arm, overlapping ranges
    say the host's noise could explain it, and one run has no range to judge by."""
    ratio = candidate.median / baseline.median if baseline.median else float("nan")
    if candidate.n < 2 or baseline.n < 2 or ratio != ratio:
        return Comparison(ratio, WITHIN_NOISE)
    separated = candidate.low > baseline.high or candidate.high < baseline.low
    if not separated or abs(ratio - 1.0) < min_effect:
        return Comparison(ratio, WITHIN_NOISE)
    higher = candidate.median > baseline.median
    return Comparison(ratio, BETTER if higher == higher_is_better else WORSE)


@dataclass(frozen=True)
class Bound:
    """candidate / baseline against a goal's limit (ratio <= limit, or >= where at_least), and
    whether the runs settle it: firm where every ratio the ranges allow is on the same side of
    the limit, not where the limit lies between the lowest and the highest of them."""

    ratio: float
    low: float  # the lowest ratio the ranges allow
    high: float  # the highest
    limit: float
    at_least: bool

    @property
    def met(self) -> bool:
        return self.ratio >= self.limit if self.at_least else self.ratio <= self.limit

    @property
    def firm(self) -> bool:
        return not self.low <= self.limit <= self.high


def bound(candidate: Spread, baseline: Spread, limit: float, at_least: bool = False,
          resolution: float = 1.0) -> Bound:
    """The ratio of the medians and its range. `resolution` is the factor by which a reported value
    may overstate the true one: 2 for a log2 histogram's bucket bound (the true value lies above
    half of it). One run on either side has no range: never firm."""
    ratio = candidate.median / baseline.median if baseline.median else float("nan")
    if candidate.n < 2 or baseline.n < 2 or ratio != ratio:
        return Bound(ratio, float("-inf"), float("inf"), limit, at_least)
    low = candidate.low / resolution / baseline.high
    high = candidate.high / (baseline.low / resolution) if baseline.low else float("inf")
    return Bound(ratio, low, high, limit, at_least)


def settled(bounds: Sequence[Bound]) -> Tuple[bool, bool]:
    """(every bound met, the runs settle it): a pass is firm when every bound is met firmly, a
    miss when one bound is missed firmly."""
    met = all(b.met for b in bounds)
    firm = all(b.firm for b in bounds) if met else any(b.firm for b in bounds if not b.met)
    return met, firm
