"""--refine's hill climb (temperd/training/refine.py): the neighbours of a profile, edited as text
with its comments kept and checked by the strict loader, and a climb that keeps a change only when
the verdict rule calls it better. The measurement here is a model of a workload (a metric computed
from the candidate's parameters, five runs an arm with a spread), so the climb's choices can be
checked; `temperctl train evaluate --refine` against a running temperd is tested in test_bind.py."""

from __future__ import annotations

from temperd.config.profile import parse_profile
from temperd.training.refine import Change, apply_change, neighbours, refine, set_key, trial_log
from temperd.training.verdicts import BETTER, WITHIN_NOISE, compare, spread

PROFILE = """schema_version = 1
id = "svc-trained"

# workers: 4 threads, 71 % of the workload's CPU, bursts p50 40 us
[[thread_groups]]
name = "workers"
thread_names = ["worker"]
treatment = "exclusive"
cpu_fraction = 0.5

# io: 2 threads woken by the network
[[thread_groups]]
name = "io"
busiest = 2
treatment = "latency"
nice = -5

# rest
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
"""


def test_each_neighbour_changes_one_parameter_and_keeps_the_evidence_comments():
    found = {change.describe(): text for change, text in neighbours(PROFILE)}
    assert set(found) == {
        "group 'workers' cpu_fraction 0.5 -> 0.4", "group 'workers' cpu_fraction 0.5 -> 0.6",
        "group 'workers' treatment \"exclusive\" -> \"latency\"", "group 'workers' slice_us unset -> 1000",
        "group 'io' nice -5 -> -10", "group 'io' nice -5 -> 0", "group 'io' treatment \"latency\" -> \"exclusive\"",
        "group 'io' slice_us unset -> 1000", "group 'io' busiest 2 -> 3", "group 'io' busiest 2 -> 1",
        "group 'rest' yield_policy \"idle\" -> \"batch\""}
    for text in found.values():
        assert "# workers: 4 threads, 71 % of the workload's CPU, bursts p50 40 us" in text
        parse_profile(text, "candidate")
    to_latency = parse_profile(found["group 'workers' treatment \"exclusive\" -> \"latency\""], "c")
    workers = next(g for g in to_latency.thread_groups if g.name == "workers")
    assert (workers.treatment, workers.cpu_fraction, workers.nice) == ("latency", 1.0, -10)  # cpu_fraction dropped
    to_exclusive = parse_profile(found["group 'io' treatment \"latency\" -> \"exclusive\""], "c")
    io = next(g for g in to_exclusive.thread_groups if g.name == "io")
    assert (io.treatment, io.nice, io.busiest) == ("exclusive", 0, 2)


def test_set_key_replaces_in_place_adds_after_the_name_and_removes():
    text = set_key(PROFILE, "io", "nice", -9)
    assert "nice = -9" in text and "nice = -5" not in text
    text = set_key(text, "rest", "yield_policy", "batch")
    lines = text.splitlines()
    assert lines[lines.index('name = "rest"') + 1] == 'yield_policy = "batch"'
    assert "cpu_fraction" not in set_key(PROFILE, "workers", "cpu_fraction", None)


def test_neighbours_the_schema_forbids_are_not_offered():
    at_the_limit = PROFILE.replace("busiest = 2", "busiest = 1024")  # the schema's maximum
    offered = [change.describe() for change, _ in neighbours(at_the_limit)]
    assert "group 'io' busiest 1024 -> 1023" in offered and "group 'io' busiest 1024 -> 1025" not in offered


def _model(text: str) -> float:
    """p99 in microseconds of a model workload: best at io nice -15 and workers at cpu_fraction 0.7."""
    groups = {g.name: g for g in parse_profile(text, "model").thread_groups}
    io, workers = groups["io"], groups["workers"]
    p99 = 100.0 + 6.0 * abs(io.nice + 15) if io.treatment == "latency" else 400.0
    p99 += 300.0 * abs(workers.cpu_fraction - 0.7) if workers.treatment == "exclusive" else 250.0
    return p99


def _measure(candidate: str, best: str):
    jitter = (-1.0, -0.5, 0.0, 0.5, 1.0)  # five runs an arm, a spread of 2 us
    cand, base = spread(_model(candidate) + j for j in jitter), spread(_model(best) + j for j in jitter)
    comparison = compare(cand, base, higher_is_better=False, min_effect=0.05)
    return cand, base, comparison.ratio, comparison.verdict


def test_the_climb_keeps_measured_improvements_only_and_never_undoes_a_kept_change():
    result = refine(PROFILE, _measure, max_trials=30)
    groups = {g.name: g for g in parse_profile(result.text, "refined").thread_groups}
    assert groups["io"].nice == -15 and groups["io"].treatment == "latency"
    assert groups["workers"].cpu_fraction == 0.7
    assert all(t.verdict == BETTER for t in result.kept) and all(not t.kept for t in result.trials if t.verdict != BETTER)
    kept = [t.change for t in result.kept]
    assert not any(a.reverses(b) for a in kept for b in kept)
    assert _model(result.text) < _model(PROFILE)
    assert [t.number for t in result.trials] == list(range(1, len(result.trials) + 1))


def test_the_climb_stops_at_max_trials_and_the_log_says_what_was_kept():
    result = refine(PROFILE, _measure, max_trials=3)
    assert len(result.trials) == 3
    log = trial_log(result, "Refined from svc.toml")
    assert log.startswith("# Refined from svc.toml\n") and log.count("#   trial ") == 3
    assert "# Kept: " in log and all(line.startswith("#") for line in log.splitlines())


def test_nothing_better_leaves_the_profile_as_it_was():
    def flat(candidate, best):
        same = spread([100.0, 101.0, 99.0, 100.5, 99.5])
        return same, same, 1.0, WITHIN_NOISE

    result = refine(PROFILE, flat, max_trials=50)
    assert result.text == PROFILE and not result.kept
    assert len(result.trials) == len(list(neighbours(PROFILE)))  # every neighbour once, then it stops
    assert "# Kept: nothing" in trial_log(result, "x")


def test_a_change_and_its_reverse_are_recognised():
    there = Change("io", "nice", -5, -10)
    assert Change("io", "nice", -10, -5).reverses(there) and not Change("io", "nice", -10, -15).reverses(there)
    assert "nice = -10" in apply_change(PROFILE, there)
