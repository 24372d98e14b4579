"""A decaying usage histogram, as the Kubernetes VPA recommender keeps one: buckets that grow by
5 % from 0.01 CPU, each sample weighted 2^(age / half-life) relative to a reference time (so older
samples count less without ever being rewritten), percentiles read as a bucket's upper end.
Sparse: only the buckets that hold weight are stored."""

from __future__ import annotations

import math
from typing import Dict, Optional

FIRST_BUCKET_CPUS = 0.01
BUCKET_RATIO = 1.05
MAX_CPUS = 4096.0
_LOG_RATIO = math.log(BUCKET_RATIO)
_MAX_INDEX = int(math.log1p(MAX_CPUS * (BUCKET_RATIO - 1) / FIRST_BUCKET_CPUS) / _LOG_RATIO)
_RESCALE_ABOVE = 2.0 ** 40  # weights are renormalised before floats lose precision
_NEGLIGIBLE = 1e-9


def bucket_of(value: float) -> int:
    if value < FIRST_BUCKET_CPUS:
        return 0
    return min(_MAX_INDEX, int(math.log1p(value * (BUCKET_RATIO - 1) / FIRST_BUCKET_CPUS) / _LOG_RATIO))


def bucket_start(index: int) -> float:
    return FIRST_BUCKET_CPUS * (BUCKET_RATIO ** index - 1) / (BUCKET_RATIO - 1)


class DecayingHistogram:
    def __init__(self, half_life_s: float, reference: Optional[float] = None):
        self.half_life_s = half_life_s
        self.reference = reference  # wall-clock time at which a sample weighs 1
        self.buckets: Dict[int, float] = {}
        self.total = 0.0

    def add(self, value: float, at: float, count: float = 1.0) -> None:
        """count: how many samples this one stands for (an interval that many sampling intervals long)."""
        if self.reference is None:
            self.reference = at
        weight = 2.0 ** ((at - self.reference) / self.half_life_s)
        if weight > _RESCALE_ABOVE:
            self._rescale(at)
            weight = 1.0
        index = bucket_of(max(0.0, value))
        self.buckets[index] = self.buckets.get(index, 0.0) + weight * count
        self.total += weight * count

    def _rescale(self, at: float) -> None:
        factor = 2.0 ** (-(at - (self.reference or at)) / self.half_life_s)
        self.buckets = {i: w * factor for i, w in self.buckets.items() if w * factor > _NEGLIGIBLE * self.total * factor}
        self.total = sum(self.buckets.values())
        self.reference = at

    def percentile(self, fraction: float) -> float:
        """The upper end of the bucket where the cumulative weight reaches fraction; 0 when empty."""
        if self.total <= 0:
            return 0.0
        goal = fraction * self.total
        running = 0.0
        for index in sorted(self.buckets):
            running += self.buckets[index]
            if running >= goal * (1 - 1e-12):
                return bucket_start(index + 1)
        return bucket_start(max(self.buckets) + 1)

    def to_json(self) -> dict:
        return {"reference": self.reference, "buckets": {str(i): round(w, 9) for i, w in sorted(self.buckets.items())}}

    @classmethod
    def from_json(cls, data: dict, half_life_s: float) -> "DecayingHistogram":
        """From to_json's form; ValueError (TypeError) for a reference that is no finite number,
        a bucket outside the histogram's range or a weight that is not a finite number."""
        reference = data.get("reference")
        if reference is not None and (isinstance(reference, bool) or not math.isfinite(float(reference))):
            raise ValueError(f"reference: expected a time, found {reference!r}")
        hist = cls(half_life_s, reference)
        hist.buckets = {int(i): float(w) for i, w in data.get("buckets", {}).items() if float(w) > 0}
        if any(not 0 <= i <= _MAX_INDEX or not math.isfinite(w) for i, w in hist.buckets.items()):
            raise ValueError(f"buckets: expected indexes from 0 to {_MAX_INDEX} with finite weights")
        hist.total = sum(hist.buckets.values())
        return hist
