"""The matcher and the planner as pure functions of facts and configuration: processes built in
memory (facts_builder), no root, no real process, nothing read from /proc."""

import pytest

from facts_builder import FactsHost, profile, thread
from fixture_shapes import load_fixture_shape

from temperd.config.daemon_config import DaemonConfig, config_from_document
from temperd.config.tomlsource import parse_toml
from temperd.decide.matcher import ENV_PROFILE, Matcher
from temperd.decide.planner import PlanMemo, PlannerSettings, plan
from temperd.decide.trust import TrustPolicy
from temperd.backends.native.membership import Membership, ThreadRef
from temperd.plan import CONFINED, OPEN, TidLayers, carry_members, moved_members, treatment

DB = profile("db", 'executables = ["/usr/sbin/dbd"]',
              'name = "conn"\nthread_names = ["conn-*"]\ntreatment = "exclusive"',
              'name = "io"\nprocess_titles = ["^dbd: io"]\ntreatment = "latency"\nnice = -5',
              'name = "rest"\ncatch_all = true\ntreatment = "yield"\nyield_policy = "batch"\nnice = 5')
BUILD = profile("build", 'process_names = ["cc1*"]\ncmdline = ["^make "]',
                'name = "all"\ncatch_all = true\ntreatment = "yield"')
HOT = profile("hot", 'process_names = ["hot"]', 'name = "compute"\nbusiest = 1\ntreatment = "exclusive"',
              'name = "rest"\ncatch_all = true\ntreatment = "yield"')
PROFILES = {p.id: p for p in (DB, BUILD, HOT)}
TRUST = TrustPolicy(uid_min=1000)
SHAPE = load_fixture_shape("gcp-c2-standard-8")


def matcher(config: str = "", profiles=PROFILES) -> Matcher:
    return Matcher(config_from_document(parse_toml(config, "temperd.toml")) if config else DaemonConfig(), profiles,
                   trust=TRUST)


def groups(result, proc):
    workload = result.workload_of(proc.pid)
    assert workload is not None, result.notes
    return {t.comm: t.group for t in workload.threads if t.pid == proc.pid}


def test_executable_fingerprint_and_thread_groups_by_name_title_and_catch_all():
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "conn-2", "flusher"],
                      cmdline=("dbd: io worker",), unit="dbd.service", cgroup="/system.slice/dbd.service")
    result = matcher().match(host.processes)
    workload = result.workload_of(db.pid)
    assert (workload.profile_id, workload.source, workload.key) == ("db", "fingerprint", "dbd.service")
    assert "executable /usr/sbin/dbd matches" in workload.reason
    # thread names first, then the process title (every remaining thread of the process), catch-all never reached
    assert groups(result, db) == {"conn-1": "conn", "conn-2": "conn", "dbd": "io", "flusher": "io"}


def test_catch_all_takes_what_no_selector_claims():
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "flusher"])
    assert groups(matcher().match(host.processes), db) == {"dbd": "rest", "conn-1": "conn", "flusher": "rest"}


def test_process_name_and_command_line_fingerprints():
    host = FactsHost()
    cc = host.process("cc1plus", exe="/usr/lib/gcc/cc1plus")
    make = host.process("make", exe="/usr/bin/make", cmdline=("make ", "-j8"))
    other = host.process("vim", exe="/usr/bin/vim", cmdline=("vim", "make "))
    result = matcher().match(host.processes)
    assert result.workload_of(cc.pid).profile_id == "build"
    assert "command line matches" in result.workload_of(make.pid).reason
    assert result.workload_of(other.pid) is None


def test_environment_binding_wins_over_fingerprints_and_an_unknown_name_is_said():
    host = FactsHost()
    bound = host.process("dbd", exe="/usr/sbin/dbd", environ={ENV_PROFILE: "build"})
    unknown = host.process("dbd", exe="/usr/sbin/dbd", environ={ENV_PROFILE: "nope"})
    result = matcher().match(host.processes)
    assert (result.workload_of(bound.pid).profile_id, result.workload_of(bound.pid).source) == ("build", "env")
    workload = result.workload_of(unknown.pid)
    assert workload.profile_id is None and "names no loaded profile" in workload.reason


def test_binding_by_cgroup_sets_tier_and_the_budget_comes_from_the_quota_in_the_facts():
    config = '[[binding]]\ncgroup = "/system.slice/dbd.service"\ntier = "critical"\n'
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", cgroup="/system.slice/dbd.service", quota=2.5)
    workload = matcher(config).match(host.processes).workload_of(db.pid)
    assert workload.tier == "critical"
    assert workload.budget == 2.5 and "CPU quota 2.5 of cgroup /system.slice/dbd.service" in workload.budget_reason


def test_untrusted_owner_is_matched_but_not_raised():
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "misc"], uid=1002)
    result = matcher().match(host.processes)
    by_comm = {t.comm: t for t in result.workload_of(db.pid).threads}
    assert by_comm["conn-1"].group is None and "not granted" in by_comm["conn-1"].reason
    assert by_comm["misc"].group == "rest"  # yielding is always allowed


def test_a_process_tree_without_a_unit_is_one_workload_and_kernel_threads_are_none():
    host = FactsHost()
    parent = host.process("make", cmdline=("make ", "all"))
    child = host.process("cc1", ppid=parent.pid)
    kthread = host.process("kworker/0:1", kernel=True, ppid=2, uid=0)
    result = matcher().match(host.processes)
    assert result.workload_of(parent.pid) is result.workload_of(child.pid)
    assert result.workload_of(parent.pid).key == f"build:pid{parent.pid}"
    assert result.workload_of(kthread.pid) is None


def test_an_untouched_workload_is_reused_and_a_changed_one_rebuilt():
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1"], unit="dbd.service")
    cc = host.process("cc1", exe="/usr/lib/gcc/cc1")
    m = matcher()
    first = m.match(host.processes)
    host.add_threads(cc, ["cc1-helper"])
    second = m.match(host.processes)
    assert second.workload_of(db.pid) is first.workload_of(db.pid)
    assert second.workload_of(cc.pid) is not first.workload_of(cc.pid)
    assert len(second.workload_of(cc.pid).threads) == 2


def test_a_changed_workloads_unchanged_threads_keep_their_matches_and_a_new_title_matches_again():
    """A fork storm's creator gains a few threads per pass: its other threads' matches are reused,
    not made again; a renamed thread and a new title are matched anew."""
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "x"], unit="dbd.service")
    m = matcher()
    first = {t.tid: t for t in m.match(host.processes).workload_of(db.pid).threads}
    x = host.tids(db, "x")[0]
    grown = host.add_threads(host.rename_thread(db, x, "conn-2"), ["conn-3"])
    second = {t.tid: t for t in m.match(host.processes).workload_of(db.pid).threads}
    assert second[db.pid] is first[db.pid] and second[db.pid + 1] is first[db.pid + 1]
    assert second[x].group == "conn" and first[x].group == "rest"
    assert second[max(grown.threads)].group == "conn"
    titled = host.replace(grown, cmdline=("dbd: io writer",))
    third = {t.tid: t for t in m.match(host.processes).workload_of(db.pid).threads}
    assert third[db.pid] is not second[db.pid] and third[db.pid].group == "io"


def test_an_untrusted_process_keeps_no_raising_group_when_its_matches_are_reused():
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1"], uid=5000)
    m = matcher()
    m.match(host.processes)
    host.add_threads(db, ["conn-2"])
    got = groups(m.match(host.processes), db)
    assert got == {"dbd": "rest", "conn-1": None, "conn-2": None}


def test_busiest_takes_the_thread_whose_runtime_grew_most():
    host = FactsHost()
    proc = host.process("hot", threads=["hot", "w1", "w2"])
    m = matcher()
    m.match(host.processes)
    threads = {tid: t for tid, t in proc.threads.items()}
    w1, w2 = host.tids(proc, "w1")[0], host.tids(proc, "w2")[0]
    threads[w1] = thread(w1, "w1", pid=proc.pid, runtime_ns=10_000_000)
    threads[w2] = thread(w2, "w2", pid=proc.pid, runtime_ns=90_000_000)
    host.replace(proc, threads=threads)
    got = groups(m.match(host.processes), proc)
    assert got == {"hot": "rest", "w1": "rest", "w2": "compute"}


def test_planner_gives_exclusive_cores_from_the_budget_and_demotes_what_does_not_fit():
    config = '[[binding]]\nunit = "dbd.service"\ncpus = 2.0\n'
    host = FactsHost()
    host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "conn-2"], unit="dbd.service",
                 cgroup="/system.slice/dbd.service")
    result = matcher(config).match(host.processes)
    layer_plan = plan(SHAPE, result.workloads, PROFILES, PlannerSettings(reserve_cpus=1))
    conn = layer_plan.layer("dbd.service.conn")
    assert conn.kind == CONFINED and len(conn.cpus) == 2
    big = plan(SHAPE, result.workloads, PROFILES, PlannerSettings(reserve_cpus=7))
    assert big.layer("dbd.service.conn").kind != CONFINED
    assert any("dbd.service group conn: demoted" in d for d in big.decisions)
    assert layer_plan.layer("dbd.service.rest").kind == OPEN


def test_a_new_member_moves_only_itself_and_a_new_confined_layer_moves_everyone():
    host = FactsHost()
    cc = host.process("cc1", exe="/usr/lib/gcc/cc1", threads=["cc1", "a"])
    m = matcher()
    before = plan(SHAPE, m.match(host.processes).workloads, PROFILES)
    grown = host.add_threads(cc, ["b"])
    other = host.process("cc1", exe="/usr/lib/gcc/cc1")
    after = plan(SHAPE, m.match(host.processes).workloads, PROFILES)
    assert before.host_wide == after.host_wide
    assert moved_members(before, after, *carry_members(before, after)) == frozenset({max(grown.threads), other.pid})
    host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1"])
    with_db = plan(SHAPE, m.match(host.processes).workloads, PROFILES)
    assert moved_members(after, with_db, *carry_members(after, with_db)) is None  # Confined CPUs: every other thread is kept off them


@pytest.mark.parametrize("rename", ["conn-9", "flusher"])
def test_a_renamed_thread_moves_between_groups(rename):
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "x"], unit="dbd.service")
    m = matcher()
    m.match(host.processes)
    tid = host.tids(db, "x")[0]
    renamed = host.rename_thread(db, tid, rename)
    assert groups(m.match(host.processes), renamed)[rename] == ("conn" if rename.startswith("conn") else "rest")


def test_an_unmatched_process_says_which_facts_were_denied():
    host = FactsHost()
    hidden = host.process("tool", uid=0)
    hidden = host.replace(hidden, unreadable=("exe",))
    text = matcher().explain_unmatched(hidden)
    assert "exe not readable (permission denied)" in text
    assert "exe -" in matcher().explain_unmatched(host.process("plain"))


def _shown(result):
    return [(w.key, w.pids, w.tier, w.profile_id, w.reason, w.instance,
             tuple((t.tid, t.comm, t.group, t.reason) for t in w.threads)) for w in result.workloads]


@pytest.mark.parametrize("seed", range(6))
def test_a_match_that_keeps_its_grouping_equals_a_fresh_match_after_every_change(seed):
    """The matcher builds again only the workloads whose processes changed (grouping.py): after
    each of a random sequence of forks, exits, execs, renames, new threads and reparentings, its
    result is the one a matcher that never saw the host before makes."""
    import random
    rng = random.Random(seed)
    host = FactsHost(first_pid=1000, stride=10)
    kinds = [dict(name="dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1", "x"]),
             dict(name="make", cmdline=("make ", "all")), dict(name="cc1"), dict(name="bash")]

    def spawn():
        parents = [p.pid for p in host.processes] + [1]
        facts = dict(rng.choice(kinds))
        unit = rng.choice([None, None, "a.service", "b.service"])
        return host.process(facts.pop("name"), ppid=rng.choice(parents), unit=unit,
                            uid=rng.choice([0, 0, 5000]), **facts)

    for _ in range(12):
        spawn()
    m = matcher('[[binding]]\nunit = "b.service"\ntier = "critical"\n')
    memo = PlanMemo()
    previous = plan(SHAPE, m.match(host.processes).workloads, PROFILES, memo=memo)
    previous.members  # in force: built in full once, derived from then on
    membership = Membership(previous)
    for step in range(60):
        procs = host.processes
        victim = rng.choice(procs)
        action = rng.choice(["spawn", "exit", "exec", "rename", "threads", "reparent", "none"])
        if action == "spawn":
            spawn()
        elif action == "exit" and len(procs) > 3:
            host.remove(victim)
            for child in [p for p in host.processes if p.ppid == victim.pid]:
                host.replace(child, ppid=1)
        elif action == "exec":
            host.replace(victim, name="cc1", cmdline=("cc1", str(step)), execs=victim.execs + 1)
        elif action == "rename":
            tid = rng.choice(sorted(victim.threads))
            host.rename_thread(victim, tid, rng.choice(["conn-7", "y", "make"]))
        elif action == "threads":
            host.add_threads(victim, ["conn-9", "z"], first_tid=max(victim.threads) + 1)
        elif action == "reparent":  # to a process outside its own subtree, as the kernel does
            below = {victim.pid}
            while True:
                more = {p.pid for p in procs if p.ppid in below} - below
                if not more:
                    break
                below |= more
            host.replace(victim, ppid=rng.choice([p.pid for p in procs if p.pid not in below] + [1]))
        fresh = matcher('[[binding]]\nunit = "b.service"\ntier = "critical"\n').match(host.processes)
        kept = m.match(host.processes)
        assert _shown(kept) == _shown(fresh), (seed, step, action)
        current = plan(SHAPE, kept.workloads, PROFILES, memo=memo)
        assert current == plan(SHAPE, fresh.workloads, PROFILES), (seed, step)
        _check_moved_members(previous, current, (seed, step, action))
        membership = Membership(current, membership)
        _check_membership(membership, Membership(current), host, (seed, step, action))
        previous = current


def _check_membership(derived, fresh, host, where):
    """A membership that took over the last one's index places every thread, the plan's members
    and threads new to it (by the layers' rules), where one built from nothing does."""
    for proc in host.processes:
        newcomers = [ThreadRef(10 ** 7 + proc.pid * 2 + i, proc.pid, 1, comm) for i, comm in enumerate(("conn-42", "zz"))]
        for thread in [*proc.threads.values(), *newcomers]:
            assert derived.layer_for(thread) is fresh.layer_for(thread), (where, thread)


def _check_moved_members(old, new, where):
    """carry_members derives the new plan's members from the old one's layers that changed, and
    moved_members then finds the same tids as comparing every member of both plans."""
    moved = moved_members(old, new, *carry_members(old, new))
    assert "members" in new.__dict__ and new.members.by_tid == TidLayers.build(new).by_tid, where
    if old.host_wide != new.host_wide:
        assert moved is None, where
        return
    before, after = TidLayers.build(old).by_tid, TidLayers.build(new).by_tid
    every = {tid for tid in {*before, *after} if treatment(before.get(tid)) != treatment(after.get(tid))}
    assert moved == frozenset(every), where


def test_members_named_by_two_layers_go_to_the_first_and_are_derived_in_full():
    """A tid that two layers name belongs to the first (the order of layers decides): a plan
    derived from one where that happens, or where an added layer names a member of another, is
    built in full, and moved_members still finds every member whose treatment changed."""
    from dataclasses import replace
    host = FactsHost()
    host.process("cc1", exe="/usr/lib/gcc/cc1", threads=["cc1", "a"])
    host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1"], unit="dbd.service")
    base = plan(SHAPE, matcher().match(host.processes).workloads, PROFILES)
    first, second = base.layers[0], base.layers[-1]
    stolen = first.selector.tids[0]
    thief = replace(second, selector=replace(second.selector, tids=(stolen, *second.selector.tids)))
    shared = replace(base, layers=(*base.layers[:-1], thief))
    assert shared.members.shared and shared.members.by_tid[stolen] is first
    base.members
    _check_moved_members(base, shared, "a layer takes another's member")
    ahead = replace(base, layers=(thief, *base.layers[:-1]))
    _check_moved_members(shared, ahead, "the thief first")
    assert ahead.members.by_tid[stolen] is thief
    _check_moved_members(ahead, base, "back")


@pytest.mark.parametrize("patterns,text", [
    (("/usr/bin/a*", "/usr/sbin/db[dx]", "/usr/sbin/*"), "/usr/sbin/dbd"),
    (("cc1*", "[!c]c1", "?c1"), "xc1"),
    (("a.b", "a?b"), "a+b"),
    (("*[*", "*\\\\*"), "x[y"),
    (("postgres", "postgres:*"), "postgres: writer"),
    (("x",), ""),
])
def test_one_expression_per_pattern_list_finds_the_first_pattern_fnmatch_finds(patterns, text):
    """A profile's shell patterns are checked in one expression; the reason still names the first
    pattern that matches, as fnmatchcase over the list in order would."""
    import fnmatch
    from temperd.decide.matcher import _first_glob
    expected = next((p for p in patterns if fnmatch.fnmatchcase(text, p)), None)
    assert _first_glob(patterns, text) == expected


def test_a_remembered_layer_name_gives_way_when_the_workload_that_took_it_first_is_gone():
    """Two workloads whose keys make the same layer name: the later one's layer is suffixed, named
    plainly once the first is gone, and suffixed again when another takes the name back; with
    the plan's memo as without it."""
    host = FactsHost()
    host.process("cc1", pid=1000)
    first = host.process("cc1", pid=2000, unit="build-pid1000")  # its key sorts first: "-" before ":"
    m, memo = matcher(), PlanMemo()
    both = plan(SHAPE, m.match(host.processes).workloads, PROFILES, memo=memo)
    assert [(layer.workload, layer.name) for layer in both.layers] == [
        ("build-pid1000", "build-pid1000.all"), ("build:pid1000", "build-pid1000.all-2")]
    host.remove(first)
    alone = plan(SHAPE, m.match(host.processes).workloads, PROFILES, memo=memo)
    assert [layer.name for layer in alone.layers] == ["build-pid1000.all"]
    assert alone == plan(SHAPE, matcher().match(host.processes).workloads, PROFILES)
    host.process("cc1", pid=3000, unit="build-pid1000")  # takes the name back: the remembered layer may not keep it
    again = plan(SHAPE, m.match(host.processes).workloads, PROFILES, memo=memo)
    assert [layer.name for layer in again.layers] == ["build-pid1000.all", "build-pid1000.all-2"]
    assert again == plan(SHAPE, matcher().match(host.processes).workloads, PROFILES)


def test_a_match_cut_short_by_an_error_is_made_whole_by_the_next_one(monkeypatch):
    host = FactsHost()
    db = host.process("dbd", exe="/usr/sbin/dbd", threads=["dbd", "conn-1"], unit="dbd.service")
    m = matcher()
    m.match(host.processes)
    host.add_threads(db, ["conn-2"])
    real = m._keyed_workload
    monkeypatch.setattr(m, "_keyed_workload", lambda *a: (_ for _ in ()).throw(OSError("cut short")))
    with pytest.raises(OSError):
        m.match(host.processes)
    monkeypatch.setattr(m, "_keyed_workload", real)
    assert _shown(m.match(host.processes)) == _shown(matcher().match(host.processes))
