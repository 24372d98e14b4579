"""The journal's lines (temperd/observe/journal.py): one per workload and event, rate-limited,
never one per thread; and, where the daemon calls it, a real memcached's start -> matched ->
treated -> stopped -> left cycle in the daemon's log without tracebacks or per-thread noise."""

from __future__ import annotations

import inspect
import logging
import re

import pytest

from temperd.decide.matcher import MatchResult, ThreadMatch, Workload
from temperd.observe.journal import Journal, describe_layer
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, LATENCY, OPEN, OWNED, YIELD, Layer, LayerPlan, MemberSelector


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Result:
    def __init__(self, restored=None, drift=None):
        self.restored = restored or {}
        self.drift = drift or {}
        self.applied = {}
        self.failed = {}


def workload(key="memcached.service", threads=4):
    members = [ThreadMatch(100 + i, 100, "mc-worker", "workers", "name") for i in range(threads)]
    members.append(ThreadMatch(100, 100, "memcached", "dispatch", "name"))
    return Workload(key=key, profile_id="memcached", tier="critical", budget=None, budget_reason="", source="binding",
                    reason="unit memcached.service", unit="memcached.service", cgroup=None, pids=(100,),
                    threads=tuple(members))


def plan_for(w, cpus=(1,)):
    workers = tuple(t.tid for t in w.threads if t.group == "workers")
    return LayerPlan(layers=(
        Layer(name=f"{w.key}.workers", kind=CONFINED, treatment=EXCLUSIVE, tier=w.tier, workload=w.key, group="workers",
              selector=MemberSelector(tids=workers), cpus=cpus, ownership=FENCED),
        Layer(name=f"{w.key}.dispatch", kind=OPEN, treatment=LATENCY, tier=w.tier, workload=w.key, group="dispatch",
              selector=MemberSelector(tids=(100,)), nice=-7),
    ), reserve_cpus=(0,))


def test_describe_layer():
    sel = MemberSelector()
    assert describe_layer(Layer("a", CONFINED, EXCLUSIVE, "critical", "w", "g", sel, cpus=(2, 3, 4, 7), ownership=FENCED)) == \
        "exclusive, CPUs 2-4,7, fenced"
    assert describe_layer(Layer("a", CONFINED, EXCLUSIVE, "critical", "w", "g", sel, cpus=(1,), ownership=OWNED,
                                idle_resume_us=0)) == "exclusive, CPUs 1, owned, polling while idle"
    assert describe_layer(Layer("a", CONFINED, EXCLUSIVE, "critical", "w", "g", sel, cpus=(1,), ownership=FENCED,
                                idle_resume_us=20)).endswith("fenced, idle exit within 20 us")
    assert "idle" not in describe_layer(Layer("a", OPEN, LATENCY, "critical", "w", "g", sel, nice=-5, idle_resume_us=0))
    assert describe_layer(Layer("a", OPEN, LATENCY, "critical", "w", "g", sel, nice=-7, slice_us=500)) == \
        "latency, nice -7, slice 500 us"
    assert describe_layer(Layer("a", OPEN, YIELD, "critical", "w", "g", sel, policy="batch", nice=15)) == \
        "yield (batch, nice 15)"


def test_matched_treated_changed_left(caplog):
    clock = Clock()
    journal = Journal(clock=clock)
    w = workload()
    with caplog.at_level(logging.INFO, logger="temperd"):
        first = journal.applied(MatchResult([w]), plan_for(w), Result(), "start")
        again = journal.applied(MatchResult([w]), plan_for(w), Result(), "events")  # new threads only: nothing new
        clock.now += 120
        moved = journal.applied(MatchResult([w]), plan_for(w, cpus=(1, 2)), Result(), "reload")
        left = journal.applied(MatchResult([]), LayerPlan(layers=(), reserve_cpus=(0,)),
                               Result(restored={"affinity": 4, "nice": 1}), "events")
    assert first[0] == ("workload memcached.service matched: profile memcached, tier critical, by binding "
                        "(unit memcached.service); 1 process, 5 threads")
    assert first[1] == ("workload memcached.service treated: workers: 4 threads exclusive, CPUs 1, fenced; "
                        "dispatch: 1 thread latency, nice -7")
    assert len(first) == 2  # the matched and treated lines say which layers came: no plan line
    assert again == []
    assert moved[0] == ("workload memcached.service treatment changed: workers: 4 threads exclusive, CPUs 1-2, fenced; "
                        "dispatch: 1 thread latency, nice -7")
    assert "memcached.service.workers CPUs 1 -> 1-2" in moved[1]
    assert left[0] == ("workload memcached.service left (its processes ended or no longer match): "
                       "4 affinity, 1 nice setting(s) restored")
    assert len(left) == 1  # nor when it leaves
    assert [r.getMessage() for r in caplog.records] == first + moved + left
    # A layer that comes or goes without its workload matching or leaving is a plan change of its own.
    other = workload("redis.service")
    both = MatchResult([w, other])
    journal.applied(both, LayerPlan(layers=plan_for(w).layers + plan_for(other).layers, reserve_cpus=(0,)), Result())
    clock.now += 120
    lines = journal.applied(both, LayerPlan(layers=plan_for(w).layers + plan_for(other).layers[1:], reserve_cpus=(0,)),
                            Result(), "events")
    assert any(line.startswith("plan changed (events): removed redis.service.workers") for line in lines), lines


def test_threads_arriving_after_their_process_are_said_at_once():
    clock = Clock()
    journal = Journal(clock=clock)
    w = workload(threads=0)
    alone = LayerPlan(layers=plan_for(w).layers[1:], reserve_cpus=(0,))
    assert journal.applied(MatchResult([w]), alone, Result())[1] == \
        "workload memcached.service treated: dispatch: 1 thread latency, nice -7"
    clock.now += 0.2
    w = workload(threads=4)
    assert journal.applied(MatchResult([w]), plan_for(w), Result())[0] == (
        "workload memcached.service treatment changed: workers: 4 threads exclusive, CPUs 1, fenced; "
        "dispatch: 1 thread latency, nice -7")
    clock.now += 0.2
    w = workload(threads=5)  # one more thread, same shape: rate-limited
    assert journal.applied(MatchResult([w]), plan_for(w), Result()) == []


def test_never_a_line_per_thread_and_rate_limited():
    clock = Clock()
    journal = Journal(clock=clock, lines_per_minute=5)
    lines = []
    for n in range(1, 200):  # threads come and go every call
        w = workload(threads=n)
        lines += journal.applied(MatchResult([w]), plan_for(w), Result(drift={"nice": 1} if n % 2 else {}), "events")
        clock.now += 0.1
    assert len(lines) <= 5, lines
    assert sum("drift" in line or "someone else" in line for line in lines) == 1


def test_reload_and_stop_lines():
    journal = Journal()
    assert journal.reloaded(True, 3, "SIGHUP", "2 profiles") == ["reload (SIGHUP) adopted: generation 3, 2 profiles"]
    assert journal.reloaded(False, 3, "file change", problems=["broken.toml: line 3: treatment missing"]) == [
        "reload (file change) refused: 1 problem(s), generation 3 keeps running; first: broken.toml: line 3: "
        "treatment missing"]
    assert journal.stopped() == ["stopped: every changed thread restored"]


def _daemon_journals() -> bool:
    from temperd.daemon import daemon

    return "Journal" in inspect.getsource(daemon)


EVERY_GROUP = (r" (treated|treatment changed): workers: \d+ threads? exclusive.*; dispatch: 1 thread latency, nice -7; "
               r"maintenance: \d+ threads yield \(batch, nice 15\)")


@pytest.mark.servers
@pytest.mark.slow
def test_daemon_log_tells_a_memcached_cycle(tmp_path):
    """memcached started -> matched -> treated -> stopped -> left; then temperd stops and restores."""
    if not _daemon_journals():
        pytest.skip("the daemon does not call temperd.observe.journal yet")
    from test_daemon_e2e import PROFILE, Temperd, memcached, task_stat, threads_by_name
    from thread_children import wait_for

    daemon = Temperd(tmp_path)
    daemon.profiles.joinpath("memcached.toml").write_text(PROFILE.format(nice=-7))
    daemon.start()
    try:
        with memcached() as server:
            lru = threads_by_name(server.pid)["mc-lrumaint"][0]
            wait_for(lambda: task_stat(server.pid, lru)["nice"] == 15, 20, "memcached treated")
            # its key: the unit where it runs in one, else "memcached:pid<pid>" (other memcacheds on a
            # shared host are other workloads, with lines of their own)
            me = rf"workload memcached:pid{server.pid}"
            # memcached makes its threads over the first moments: the line with every group may
            # come a batch after the first "treated" one; it is waited for before memcached stops
            wait_for(lambda: re.search(me + EVERY_GROUP, daemon.logtext()), 10, "the line with every group")
        wait_for(lambda: re.search(me + " left ", daemon.logtext()), 15, "the left line")
    finally:
        code = daemon.stop()
    log = daemon.logtext()
    assert code == 0, log
    lines = log.splitlines()

    def one(pattern):
        found = [line for line in lines if re.search(pattern, line)]
        assert len(found) == 1, (pattern, found, log)
        return found[0]

    one(me + r" matched: profile memcached, tier \w+, by \w+ \(")
    # memcached's threads come after its process: the line with every group may be a "treatment
    # changed" right after the first "treated"
    one(me + r" treated: ")
    one(me + EVERY_GROUP)
    one(me + r" left ")
    one(r"stopped: ")
    one(r"telemetry: (schedstat \(bcc: [^)]+\)|bpf)")
    assert "Traceback" not in log and "No such process" not in log, log
    assert not [line for line in lines if re.search(r"\btid\b|thread \d+", line)], log


def test_only_workloads_or_layers_that_are_other_objects_are_looked_at(monkeypatch):
    """A match and a plan hand back the very objects they did not rebuild: the journal describes
    again only the workloads that are new objects or whose layers are (a fork storm's batches
    come ten a second, over hundreds of workloads)."""
    from temperd.observe import journal as journal_module
    described = []
    real = journal_module._treatment
    monkeypatch.setattr(journal_module, "_treatment", lambda w, layers: described.append(w.key) or real(w, layers))
    journal = Journal(logging.getLogger("test-journal"), clock=Clock())
    a, b = workload("a.service"), workload("b.service")
    layer_a, layer_b = plan_for(a).layers[0], plan_for(b).layers[0]
    journal.applied(MatchResult(workloads=[a, b]), LayerPlan(layers=(layer_a, layer_b), reserve_cpus=(0,)), Result())
    assert sorted(described) == ["a.service", "b.service"]
    described.clear()
    journal.applied(MatchResult(workloads=[a, b]), LayerPlan(layers=(layer_a, layer_b), reserve_cpus=(0,)), Result())
    assert described == []
    b2 = workload("b.service", threads=6)
    journal.applied(MatchResult(workloads=[a, b2]), LayerPlan(layers=(layer_a, plan_for(b2).layers[0]), reserve_cpus=(0,)), Result())
    assert described == ["b.service"]


class _Unwalked(list):
    """A match's workloads that must not be walked over (the match says what it built again)."""

    def __iter__(self):
        raise AssertionError("the journal walked every workload")


def test_a_match_that_says_what_it_built_again_gives_the_lines_of_a_full_comparison():
    """Where a match follows the one of the last apply (its `since`), the journal reads its
    `updated` and `ended` instead of every workload, and says exactly what comparing every one says."""
    import random

    draw = random.Random(3)
    by_delta = Journal(logging.getLogger("test-journal-delta"), clock=Clock())
    by_walk = Journal(logging.getLogger("test-journal-walk"), clock=Clock())
    live, layers_of, listed = {}, {}, None
    for step in range(300):
        updated, ended = [], []
        for key in sorted(live):
            roll = draw.random()
            if roll < 0.1:
                del live[key], layers_of[key]
                ended.append(key)
            elif roll < 0.25:
                live[key] = workload(key, threads=draw.randrange(1, 5))
                layers_of[key] = plan_for(live[key], cpus=(draw.randrange(1, 3),)).layers
                updated.append(live[key])
            elif roll < 0.3:
                updated.append(live[key])  # built again into the very object it was
        for _ in range(draw.randrange(0, 3)):
            key = f"w{draw.randrange(40)}.service"
            if key not in live:
                live[key] = workload(key, threads=draw.randrange(1, 5))
                layers_of[key] = plan_for(live[key]).layers
                updated.append(live[key])
                if key in ended:
                    ended.remove(key)
        workloads = [live[key] for key in sorted(live)]
        plan = LayerPlan(layers=tuple(layer for key in sorted(live) for layer in layers_of[key]), reserve_cpus=(0,))
        restored = Result(restored={"nice": 1} if ended else None)
        delta = MatchResult(workloads=_Unwalked(workloads) if listed is not None else workloads,
                            since=listed, updated=tuple(updated), ended=tuple(ended))
        said = by_delta.applied(delta, plan, restored)
        assert said == by_walk.applied(MatchResult(workloads=list(workloads)), plan, restored), step
        listed = delta.workloads
        by_delta.clock.now += 7
        by_walk.clock.now += 7
