"""Training's pure parts on hand-built inputs: name keys, title keys, sizing (cpu_fraction from
measured demand), the request path and classes, clustering into groups, and the synthesized
profile (valid, evidence above each group, fingerprint of the workload)."""

from __future__ import annotations

import re
import time

from temperd.config.profile import parse_profile
from temperd.config.safe_regex import regex_problem
from temperd.decide.planner import exclusive_cores
from temperd.plan import EXCLUSIVE, LATENCY, YIELD
from temperd.training import analyze as A
from temperd.training.features import INTERRUPT, NETWORK, OUTSIDE, SAME_PROCESS, WORKLOAD, ThreadFeatures, WorkloadFeatures
from temperd.training.names import name_key
from temperd.training.samples import ProcessInfo
from temperd.training.synthesize import ShapeFacts, fingerprint, fraction_for, synthesize

SHAPE = ShapeFacts(cores=4, threads_per_core=2, cpus=8, description="4 cores x 2 threads")


def thread(tid, comm, cpu=0.0, *, pid=100, network=0, timer=0, wakers=None, wakees=None, p50=20.0, d=0.0,
           process_name="server", title="server --port 1"):
    wakers = wakers or {}
    woken = {INTERRUPT: timer, NETWORK: network, SAME_PROCESS: sum(wakers.values()), WORKLOAD: 0, OUTSIDE: 0}
    return ThreadFeatures(tid=tid, pid=pid, comm=comm, key=name_key(comm), process_name=process_name, title=title,
                          cpu_share=cpu, demand=cpu, burst_p50_us=p50, burst_p99_us=p50 * 4,
                          wakeups_per_s=sum(woken.values()) / 10.0, woken_by=woken, wakers=wakers,
                          wakees=wakees or {}, d_share=d, cpu_per_second=[cpu] * 10)


def workload(*threads, titles=None):
    return WorkloadFeatures(10.0, {t.tid: t for t in threads}, titles or {100: "server --port 1"})


def test_name_keys_drop_numbers_and_mark_truncation():
    assert name_key("io_thd_1") == "io_thd_*"
    assert name_key("GC Thread#3") == "GC Thread#*"
    assert name_key("order-handler-1") == "order-handler-*"  # order-handler-17, cut to 15 bytes
    assert name_key("http-nio-8080-e") == "http-nio-8080-e*"
    assert name_key("mc-worker") == "mc-worker"
    assert name_key("a[b]*") == "a?b??"  # glob characters never reach a pattern


def test_title_keys_generalise_digits_and_cut_command_lines():
    d = A.DIGIT_RUN
    key = A.title_key(["postgres: 15/main: app shop 10.0.0.7(51234) idle",
                       "postgres: 15/main: app shop 10.0.0.7(51234) SELECT"])
    assert key == rf"postgres: {d}/main: app shop {d}\.{d}\.{d}\.{d}\({d}\)"
    assert regex_problem(A.title_regex([key, key + " evidence"])) is None, "a trained title passes the profile checks"
    assert A.title_key(["/usr/lib/postgresql/15/bin/postgres -D /var/lib/x -p 5432"]) == \
        rf"/usr/lib/postgresql/{d}/bin/postgres"
    regex = A.title_regex([rf"postgres: {d}/main: checkpointer", rf"postgres: {d}/main: walwriter"])
    assert re.search(regex, "postgres: 16/main: walwriter") and not re.search(regex, "postgres: 16/main: walwriterx")


def test_cpu_fraction_covers_the_hot_threads_and_no_more():
    assert exclusive_cores(2.25, fraction_for(2, 2.25)) == 2  # 0.9 would round up to a third core
    assert fraction_for(2, 2.25) <= 0.889
    assert exclusive_cores(8, fraction_for(3, 8)) == 3
    assert fraction_for(4, 4) == 1.0


def test_an_idle_pool_is_not_one_core_per_thread():
    pool = [thread(i, f"worker-{i}", 0.0) for i in range(10, 210)] + [thread(1, "worker-1", 0.9), thread(2, "worker-2", 0.85)]
    assert A.cores_needed(pool) == 2
    assert A.cores_needed([thread(1, "w", 0.2), thread(2, "w", 0.2), thread(3, "w", 0.2)]) == 1


def test_request_path_seeds_chains_and_background():
    wf = workload(
        thread(1, "loop", 0.6, network=3000, wakees={2: 40}),  # serves clients, hands work to io threads
        thread(2, "io_thd_1", 0.5, wakers={1: 40}, p50=400),  # driven by the loop, busy
        thread(3, "bio_lazy_free", 0.0, wakers={1: 2}),  # rarely handed a job: background
        thread(4, "compactor", 0.7, timer=5000, p50=2000),  # busy on its own timer: background
        thread(5, "wal", 0.01, wakers={1: 300}, wakees={1: 300}, d=0.6),  # the loop waits on it; sleeps in D
    )
    path, seeds = A.request_path(wf)
    assert seeds == (1,) and set(path) == {1, 2, 5}
    analysis = A.analyze(wf, 8.0, "host")
    classes = {tid: (v.cls, v.treatment) for tid, v in analysis.verdicts.items()}
    assert classes[1] == (A.LATENCY_CRITICAL, EXCLUSIVE)
    assert classes[2] == (A.SYNC_COMPUTE, EXCLUSIVE)
    assert classes[5] == (A.IO_WAKE_CHAIN, LATENCY)
    assert classes[3][1] == classes[4][1] == YIELD


def test_self_driven_workload_seeds_at_its_busiest_threads():
    wf = workload(thread(1, "main", 0.9, p50=5000, wakees={3: 100}), thread(2, "intra-op", 0.8),
                  thread(3, "helper", 0.1, wakers={1: 100}), thread(4, "idle", 0.0))
    path, seeds = A.request_path(wf)
    assert seeds == (1, 2) and 3 in path and 4 not in path


def test_a_thread_that_never_sleeps_but_wants_a_cpu_polls_for_the_path():
    wf = workload(thread(1, "loop", 0.2, network=900), thread(2, "io_thd_1", 0.2))
    wf.threads[2].demand = 1.0  # runnable the whole window, never woken: spinning for work
    path, _ = A.request_path(wf)
    assert "polls" in path[2]


def test_a_spinning_companion_under_half_the_busiest_threads_cpu_still_serves():
    """ONNX Runtime, seen in one window: the main thread at 0.99 CPUs and its spinning intra-op thread
    at 0.48, never woken: under half the busiest, so not a seed, yet polling for work on the path and
    hot. A never-woken thread that wanted little is not polling."""
    wf = workload(thread(1, "python", 0.99, p50=5000), thread(2, "python", 0.48, p50=5000),
                  thread(3, "python", 0.12), thread(4, "python", 0.0))
    wf.threads[2].demand, wf.threads[3].demand = 0.49, 0.2
    path, seeds = A.request_path(wf)
    assert seeds == (1,) and "polls" in path[2] and 3 not in path and 4 not in path
    verdicts = {t: A.classify_thread(wf.threads[t], path.get(t), t in seeds) for t in wf.threads}
    assert verdicts[2].treatment == EXCLUSIVE and verdicts[3].treatment == YIELD


def test_threads_named_like_the_process_split_into_busiest_and_catch_all():
    wf = workload(*[thread(i, "server", 0.4, network=500) for i in (1, 2, 3)],
                  *[thread(i, "server", 0.0) for i in (4, 5, 6, 7)], thread(8, "logger", 0.0))
    analysis = A.analyze(wf, 8.0, "host")
    busiest = [c for c in analysis.clusters if c.selector == "busiest"]
    assert len(busiest) == 1 and busiest[0].busiest == 3 and busiest[0].treatment == EXCLUSIVE
    catch_all = [c for c in analysis.clusters if c.selector == "catch_all"]
    assert len(catch_all) == 1 and set(catch_all[0].tids) == {4, 5, 6, 7}
    assert analysis.clusters[-1].selector == "catch_all"  # tried last


def test_a_peer_just_under_the_hot_mark_stays_in_its_pool():
    """Four connection threads of one unnamed pool at 0.31, 0.30, 0.33 and 0.29 CPUs (MariaDB under
    sysbench --threads=4): one busiest group of four, and the idle rest yields."""
    wf = workload(*[thread(i, "server", cpu, network=500) for i, cpu in ((1, 0.31), (2, 0.30), (3, 0.33), (4, 0.29))],
                  *[thread(i, "server", 0.0) for i in (5, 6, 7)])
    analysis = A.analyze(wf, 8.0, "host")
    busiest = [c for c in analysis.clusters if c.selector == "busiest"]
    assert len(busiest) == 1 and busiest[0].busiest == 4 and set(busiest[0].tids) == {1, 2, 3, 4}
    catch_all = [c for c in analysis.clusters if c.selector == "catch_all"]
    assert len(catch_all) == 1 and set(catch_all[0].tids) == {5, 6, 7} and catch_all[0].treatment == YIELD


def test_unnamed_connection_threads_are_one_pool_however_the_load_fell_on_them():
    """Two MariaDB connection threads that split sysbench's load 0.60 / 0.28 in one training and
    0.42 / 0.60 in the next (measured in CI), beside idle threads of the same name: the same busiest
    group of two with the same treatment both times, and the idle threads yield. Before, the lighter
    one fell out of the group and took the idle threads into a latency catch-all (Jaccard 0.04)."""
    def trained(first: float, second: float):
        wf = workload(thread(1, "server", first, network=500), thread(2, "server", second, network=500),
                      *[thread(i, "server", 0.0) for i in range(3, 15)])
        clusters = A.analyze(wf, 8.0, "host").clusters
        return {(c.selector, c.busiest, c.treatment, tuple(sorted(c.tids))) for c in clusters}

    uneven, even = trained(0.60, 0.28), trained(0.42, 0.60)
    assert uneven == even
    assert ("busiest", 2, EXCLUSIVE, (1, 2)) in uneven
    assert ("catch_all", None, YIELD, tuple(range(3, 15))) in uneven
    light = trained(0.20, 0.25)  # neither hot: the pool is latency
    assert ("busiest", 2, LATENCY, (1, 2)) in light


def test_a_named_pool_is_treated_as_its_typical_member_not_its_busiest():
    """Four request handlers at about 0.2 CPUs, one of which crossed the hot mark in this window
    (the JVM service under one client): a latency pool, in this training and the next. With three
    of four hot the pool is hot, and gets exclusive cores."""
    handlers = ((1, 0.20), (2, 0.21), (3, 0.22), (4, 0.31))
    wf = workload(*[thread(i, f"req-handler-{i}", cpu, network=500) for i, cpu in handlers])
    clusters = A.analyze(wf, 8.0, "host").clusters
    assert [(c.treatment, c.tids) for c in clusters] == [(LATENCY, (1, 2, 3, 4))]
    hot = workload(*[thread(i, f"req-handler-{i}", cpu, network=500) for i, cpu in ((1, 0.2), (2, 0.35), (3, 0.4), (4, 0.31))])
    clusters = A.analyze(hot, 8.0, "host").clusters
    assert [(c.treatment, c.tids) for c in clusters] == [(EXCLUSIVE, (1, 2, 3, 4))]


def test_near_idle_threads_the_path_waits_on_now_and_then_are_left_untreated():
    """A JVM under load (the shape measured on tests/jvm/TrainingService.java): the VM Thread ends
    each safepoint by waking the handlers (12/s, 3 % of their wakeups: too few to join the path)
    and waits for the GC workers. Both near idle: untreated, not yielded at nice 19. The busy
    report-builder, which the handlers also wait on for a lock now and then, still yields; an idle
    thread the path never waits on yields; the yield group is then selected by name, since a
    catch-all would select the untreated threads too."""
    handlers = [thread(i, f"req-handler-{i}", 0.25, network=1000, wakees={j: 400 for j in (1, 2, 3, 4) if j != i})
                for i in (1, 2, 3, 4)]
    dispatcher = thread(5, "HTTP-Dispatcher", 0.05, network=30000)  # its many wakeups must not hide the handlers' 3 %
    wf = workload(*handlers, dispatcher,
                  thread(10, "VM Thread", 0.003, timer=200, wakers={11: 100, 12: 100},
                         wakees={1: 30, 2: 30, 3: 30, 4: 30, 5: 60, 11: 270, 12: 270}),
                  thread(11, "GC Thread#0", 0.004, wakers={10: 270}, wakees={10: 100}),
                  thread(12, "GC Thread#1", 0.004, wakers={10: 270}, wakees={10: 100}),
                  thread(20, "report-builder", 0.5, timer=500, p50=20000, wakees={1: 20, 2: 20}),
                  thread(21, "Service Thread", 0.0, timer=12, wakees={1: 2}))
    analysis = A.analyze(wf, 2.0, "host")
    assert analysis.untreated == (10, 11, 12)
    assert "waits on it now and then: it wakes such threads 18.0 times a second, 3.0% of req-handler-1's" in analysis.verdicts[10].why
    assert "of VM Thread's wakeups, which the request path waits on" in analysis.verdicts[11].why
    treatment = {t: (c.treatment if c else "none") for t in wf.threads for c in [analysis.cluster_of(t)]}
    assert treatment[20] == treatment[21] == YIELD and treatment[1] in (LATENCY, EXCLUSIVE)
    background = analysis.cluster_of(20)
    assert background.selector == "thread_names" and set(background.patterns) == {"report-builder", "Service Thread"}
    text = synthesize(analysis, None, SHAPE)
    profile = parse_profile(text, "jvm.toml")
    assert not any(g.catch_all for g in profile.thread_groups)
    assert "# Left untreated (3 threads: GC Thread#*, VM Thread)" in text


def test_a_catch_all_that_would_select_an_untreated_thread_is_untreated_too():
    """Unnamed threads (all called like the process): the two busiest serve; of the rest one wakes a
    serving thread twice a second. The rest is selected only as the catch-all, which cannot leave
    that thread out: the rest stays untreated rather than yield a thread requests wait on."""
    wf = workload(thread(1, "server", 0.4, network=500), thread(2, "server", 0.4, network=500),
                  thread(3, "server", 0.001, wakees={1: 20}), thread(4, "server", 0.0), thread(5, "server", 0.05))
    analysis = A.analyze(wf, 8.0, "host")
    assert [c.selector for c in analysis.clusters] == ["busiest"]
    assert analysis.untreated == (3, 4, 5)
    rarely = workload(thread(1, "server", 0.4, network=500), thread(2, "server", 0.4, network=500),
                      thread(3, "server", 0.001, wakees={1: 9}), thread(4, "server", 0.0))  # 9 in 10 s: chance
    assert [c.selector for c in A.analyze(rarely, 8.0, "host").clusters] == ["busiest", "catch_all"]
    serving_rest = workload(thread(1, "server", 0.4, network=500), thread(2, "server", 0.4, network=500),
                            thread(3, "server", 0.01, network=500),  # serves now and then: idle, not in the pool
                            thread(4, "server", 0.001, wakees={1: 20}), thread(5, "VM Thread", 0.003, wakees={2: 20}))
    analysis = A.analyze(serving_rest, 8.0, "host")
    rest = analysis.clusters[-1]  # a latency catch-all may take an untreated thread: favouring it is no harm
    assert (rest.selector, rest.treatment, set(rest.tids)) == ("catch_all", LATENCY, {3, 4, 5})
    assert analysis.untreated == ()  # as the matcher will place them


def test_processes_named_alike_split_by_title():
    titles = {101: "db: 15/main: app shop 10.0.0.1(5001) idle", 102: "db: 15/main: app shop 10.0.0.1(5002) SELECT",
              103: "db: 15/main: checkpointer"}
    wf = WorkloadFeatures(10.0, {t.tid: t for t in (
        thread(101, "db", 0.3, pid=101, network=900, process_name="db", title=titles[101]),
        thread(102, "db", 0.3, pid=102, network=900, process_name="db", title=titles[102]),
        thread(103, "db", 0.05, pid=103, timer=10, process_name="db", title=titles[103]))}, titles)
    analysis = A.analyze(wf, 8.0, "host", {p: [t] for p, t in titles.items()})
    by_title = {c.name: c for c in analysis.clusters if c.selector == "process_titles"}
    serving = [c for c in by_title.values() if c.treatment == EXCLUSIVE]
    assert len(serving) == 1 and set(serving[0].tids) == {101, 102}
    assert re.search(serving[0].patterns[0], "db: 15/main: app shop 10.0.0.9(7777) UPDATE")
    assert not re.search(serving[0].patterns[0], titles[103])


def test_synthesized_profile_validates_with_evidence_and_fingerprint():
    wf = workload(thread(1, "loop", 0.6, network=3000), thread(2, "bio_close_file", 0.0))
    analysis = A.analyze(wf, 2.25, "the CPU quota of cgroup /x")
    root = ProcessInfo(pid=100, ppid=1, name="server", exe="/usr/bin/server", titles=["server --port 1"],
                       unit="server.service", cgroup="/system.slice/server.service", cpu_quota=2.25)
    text = synthesize(analysis, root, SHAPE, load="bench --connections 8")
    profile = parse_profile(text, "server-trained.toml")
    assert profile.id == "server-trained"
    assert profile.fingerprint.executables == ("/usr/bin/server",) and profile.fingerprint.units == ("server.service",)
    assert (profile.machine_shape.cores, profile.machine_shape.threads_per_core) == (4, 2)
    assert profile.traits.criticality == "performance"
    exclusive = [g for g in profile.thread_groups if g.treatment == EXCLUSIVE]
    assert len(exclusive) == 1 and exclusive_cores(2.25, exclusive[0].cpu_fraction) == 1
    for group in profile.thread_groups:  # a comment with the evidence right above each group
        head = text.split(f'name = "{group.name}"')[0].rsplit("[[thread_groups]]", 1)[0]
        assert "#  CPU:" in head.split("\n\n")[-1] and "wakeups" in head.split("\n\n")[-1]


def test_a_program_run_through_a_link_is_fingerprinted_by_its_name_too():
    root = ProcessInfo(pid=7, ppid=1, name="redis-server", exe="/usr/bin/redis-check-rdb", titles=["redis-server *:6379"],
                       unit=None, cgroup=None, cpu_quota=None)
    assert fingerprint(root) == {"executables": ["/usr/bin/redis-check-rdb"], "process_names": ["redis-server"]}
    plain = ProcessInfo(pid=8, ppid=1, name="memcached", exe="/usr/bin/memcached", titles=["memcached"],
                        unit=None, cgroup=None, cpu_quota=None)
    assert fingerprint(plain) == {"executables": ["/usr/bin/memcached"]}


def test_an_interpreter_is_fingerprinted_by_its_program():
    root = ProcessInfo(pid=7, ppid=1, name="python3", exe="/usr/bin/python3.11", titles=["python3 -u serve_model.py --port 9"],
                       unit=None, cgroup=None, cpu_quota=None)
    found = fingerprint(root)
    assert "executables" not in found and re.search(found["cmdline"][0], "python3 -u /srv/serve_model.py --port 9")


def test_evaluate_reads_the_metric_and_refuses_fewer_than_five_repetitions():
    import pytest

    from temperd.training.evaluate import EvaluationError, Request, evaluate, metric_of

    assert metric_of("requests: 10\np99 = 1.25 ms\n", r"p99 = ([0-9.]+)") == 1.25
    with pytest.raises(EvaluationError, match="found no capture group"):
        metric_of("nothing here", r"p99 = ([0-9.]+)")
    with pytest.raises(EvaluationError, match="not a number"):
        metric_of("p99 = fast", r"p99 = (\w+)")
    with pytest.raises(EvaluationError, match="at least 5 repetitions"):
        evaluate(Request(pid=1, profile_text="", bench="true", metric="(x)", reps=3), lambda *a: None, lambda p: None)


def test_evaluation_counts_the_busy_workload_as_its_own_not_as_host_noise():
    """The workload under evaluation runs beside the benchmark (a busy server): its CPU must not
    make every run look noisy. A spinning process named eval-spin is the workload here."""
    import os
    import signal
    import subprocess
    import sys

    from temperd.training.evaluate import WITH, WITHOUT, Request, measure_arms

    spin = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'eval-spin', 0, 0, 0)\n"
            "end = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n")
    # Started by a parent that exits at once, as a service is: not a descendant of this process.
    launcher = ("import subprocess, sys\n"
                "print(subprocess.Popen([sys.executable, '-c', sys.argv[1]], start_new_session=True,\n"
                "                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)\n")
    pid = int(subprocess.run([sys.executable, "-c", launcher, spin], capture_output=True, text=True,
                             timeout=30).stdout)
    try:
        from thread_children import wait_for

        def named():
            with open(f"/proc/{pid}/comm") as handle:
                return handle.read().strip() == "eval-spin"
        wait_for(named, 10, "the workload started (named eval-spin)")
        request = Request(pid=pid, profile_text="", bench="sleep 0.2; echo v=1", metric=r"v=(\d)")
        spreads, runs = measure_arms(request, {WITHOUT: None, WITH: "profile"}, lambda *a: None, lambda pid: None)
    finally:
        os.kill(pid, signal.SIGKILL)
    assert spreads[WITH].n == spreads[WITHOUT].n == 5
    assert all("eval-spin" not in run.window.foreign_top for run in runs), [r.window.describe() for r in runs]
