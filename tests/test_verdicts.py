"""temperd.training.verdicts: whether interleaved runs settle a goal's limit on a ratio, or leave
it within the host's noise (or within a coarse histogram's resolution)."""

from temperd.training.verdicts import Spread, bound, settled, spread


def test_ranges_wholly_below_the_limit_settle_a_pass():
    got = bound(spread([0.90, 0.95, 1.00]), spread([1.50, 1.60, 1.70]), 1.1)
    assert got.met and got.firm
    assert abs(got.ratio - 0.95 / 1.60) < 1e-9 and abs(got.low - 0.90 / 1.70) < 1e-9 and abs(got.high - 1.00 / 1.50) < 1e-9


def test_a_limit_inside_the_ranges_is_within_noise_either_way():
    passing = bound(spread([1.0, 1.05, 1.3]), spread([0.9, 1.0, 1.1]), 1.1)
    assert passing.met and not passing.firm
    missing = bound(spread([1.1, 1.2, 1.3]), spread([0.9, 1.0, 1.1]), 1.1)
    assert not missing.met and not missing.firm


def test_ranges_wholly_past_the_limit_settle_a_miss():
    got = bound(spread([2.0, 2.1, 2.2]), spread([1.0, 1.05, 1.1]), 1.1)
    assert not got.met and got.firm


def test_an_at_least_goal_is_judged_the_other_way():
    """Throughput >= 0.95x: a candidate at 0.80-0.85x of a tight baseline misses firmly."""
    got = bound(spread([80, 82, 85]), spread([99, 100, 101]), 0.95, at_least=True)
    assert not got.met and got.firm
    assert bound(spread([96, 100, 104]), spread([99, 100, 101]), 0.95, at_least=True).met


def test_one_log2_bucket_apart_is_not_a_settled_miss():
    """A log2 histogram reports a bucket's upper bound: 0.512 against 0.256 ms may be 1.0x or 4.0x."""
    bucket = bound(spread([0.512, 0.512, 0.512]), spread([0.256, 0.256, 0.256]), 1.1, resolution=2.0)
    assert bucket.ratio == 2.0 and not bucket.met and not bucket.firm
    assert (bucket.low, bucket.high) == (1.0, 4.0)
    exact = bound(spread([0.512, 0.512, 0.512]), spread([0.256, 0.256, 0.256]), 1.1)
    assert exact.firm  # the same numbers read as exact values do settle it


def test_one_run_on_a_side_settles_nothing():
    one = Spread(2.0, 2.0, 2.0, 1)
    assert not bound(one, spread([1.0, 1.0, 1.0]), 1.1).firm
    assert not bound(spread([1.0, 1.0]), Spread(float("nan"), float("nan"), float("nan"), 0), 1.1).firm


def test_settled_passes_only_when_every_bound_is_firm_and_misses_when_one_firm_bound_fails():
    firm_pass = bound(spread([1.0, 1.0]), spread([2.0, 2.0]), 1.1)
    noisy_pass = bound(spread([1.0, 1.3]), spread([1.0, 1.1]), 1.2)
    firm_miss = bound(spread([3.0, 3.0]), spread([1.0, 1.0]), 1.1)
    noisy_miss = bound(spread([1.2, 1.3]), spread([1.0, 1.2]), 1.1)
    assert settled([firm_pass, firm_pass]) == (True, True)
    assert settled([firm_pass, noisy_pass]) == (True, False)
    assert settled([noisy_pass, noisy_miss]) == (False, False)
    assert settled([noisy_miss, firm_miss, firm_pass]) == (False, True)
