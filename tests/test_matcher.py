"""The matcher on real processes and threads: profile, tier and thread group follow the host live."""

import os
import subprocess
import select
import time
import uuid

import pytest

from driven import spawn_at_pid
from temperd.config.daemon_config import config_from_document
from temperd.config.tomlsource import parse_toml
from temperd.sources.inventory import Inventory
from temperd.decide.matcher import Matcher
from temperd.config.profile import parse_profile

PROFILE = parse_profile("""
schema_version = 1
id = "tmpd-demo"
[fingerprint]
process_names = ["tmpd-match*"]
[[thread_groups]]
name = "workers"
thread_names = ["wrk-*"]
treatment = "exclusive"
[[thread_groups]]
name = "io"
thread_names = ["io-*"]
treatment = "latency"
[[thread_groups]]
name = "backends"
process_titles = ['^tmpd: backend \\d+']
treatment = "latency"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
""", "tmpd-demo.toml")

HOT = parse_profile("""
schema_version = 1
id = "tmpd-hot"
[fingerprint]
process_names = ["tmpd-hot"]
[[thread_groups]]
name = "hot"
busiest = 1
treatment = "exclusive"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
""", "tmpd-hot.toml")


def matcher(config_text="", profiles=(PROFILE, HOT)):
    return Matcher(config_from_document(parse_toml(config_text, "temperd.toml")), {p.id: p for p in profiles})


@pytest.fixture
def inventory():
    inv = Inventory()
    inv.start()
    yield inv
    inv.close()


def settle(inv, m, condition, timeout=3.0):
    """Pump events (or scan where events are off) until the match satisfies condition."""
    deadline = time.monotonic() + timeout
    while True:
        if inv.events_active:
            select.select([inv], [], [], 0.02)
            inv.handle_events()
        else:
            inv.reconcile()
        result = m.match(inv.processes.values())
        if condition(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.01)


def group_of(result, tid):
    for workload in result.workloads:
        for thread in workload.threads:
            if thread.tid == tid:
                return thread.group
    return "unmatched"


def test_new_process_new_thread_rename_and_exit_move_threads_between_groups(inventory, spawn):
    m = matcher()
    child = spawn("tmpd-match1")
    child.wait_ready()
    result = settle(inventory, m, lambda r: r.workload_of(child.pid) is not None)
    workload = result.workload_of(child.pid)
    assert workload.profile_id == "tmpd-demo" and workload.source == "fingerprint"
    assert "process name 'tmpd-match1' matches 'tmpd-match*'" in workload.reason
    assert group_of(result, child.pid) == "rest"

    tid = int(child.command("thread wrk-0"))
    result = settle(inventory, m, lambda r: group_of(r, tid) == "workers")
    assert group_of(result, tid) == "workers"
    (match,) = [t for t in result.workload_of(child.pid).threads if t.tid == tid]
    assert match.reason == "thread name 'wrk-0' matches 'wrk-*' of group workers"

    assert child.command(f"rename {tid} io-0") == "0"
    result = settle(inventory, m, lambda r: group_of(r, tid) == "io")
    assert group_of(result, tid) == "io"

    assert child.command(f"stop {tid}") == "ok"
    result = settle(inventory, m, lambda r: group_of(r, tid) == "unmatched")
    assert group_of(result, tid) == "unmatched"

    child.close()
    result = settle(inventory, m, lambda r: r.workload_of(child.pid) is None)
    assert result.workload_of(child.pid) is None


def test_process_title_selects_a_group(inventory, spawn):
    m = matcher()
    child = spawn("tmpd-match2")
    child.wait_ready()
    assert child.command("title tmpd: backend 42 idle") == "ok"
    inventory.reconcile()  # a title rewrite sends no event; scans and title rechecks see it
    result = settle(inventory, m, lambda r: group_of(r, child.pid) == "backends")
    assert group_of(result, child.pid) == "backends"


def test_environment_variable_wins_over_fingerprints(inventory, spawn):
    m = matcher()
    child = spawn("unrelated-name", env=dict(os.environ, TEMPER_WORKLOAD_PROFILE="tmpd-demo"))
    child.wait_ready()
    result = settle(inventory, m, lambda r: r.workload_of(child.pid) is not None)
    workload = result.workload_of(child.pid)
    assert (workload.profile_id, workload.source) == ("tmpd-demo", "env")
    assert "TEMPER_WORKLOAD_PROFILE=tmpd-demo" in workload.reason


def test_unknown_profile_in_environment_is_reported_not_guessed(inventory, spawn):
    m = matcher()
    child = spawn("tmpd-match3", env=dict(os.environ, TEMPER_WORKLOAD_PROFILE="no-such"))
    child.wait_ready()
    result = settle(inventory, m, lambda r: r.workload_of(child.pid) is not None)
    workload = result.workload_of(child.pid)
    assert workload.profile_id is None and "names no loaded profile" in workload.reason


@pytest.fixture
def cgroup_dir():
    root = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
    if not os.path.exists(os.path.join(root, "cgroup.procs")):
        pytest.skip("no cgroup v2 hierarchy here")
    name = f"temperd-test-{uuid.uuid4().hex[:8]}"
    path = os.path.join(root, name)
    os.mkdir(path)
    yield "/" + name, path
    with open(os.path.join(path, "cgroup.procs")) as handle:
        pids = handle.read().split()
    with open(os.path.join(root, "cgroup.procs"), "w") as handle:
        for pid in pids:
            try:
                handle.write(pid)
                handle.flush()
            except OSError:
                pass
    os.rmdir(path)


def test_binding_by_cgroup_sets_tier_profile_and_budget(inventory, spawn, cgroup_dir):
    rel, path = cgroup_dir
    m = matcher(f'[[binding]]\ncgroup = "{rel}"\ntier = "critical"\nprofile = "tmpd-hot"\ncpus = 1.5\n')
    child = spawn("tmpd-bound")
    child.wait_ready()
    with open(os.path.join(path, "cgroup.procs"), "w") as handle:
        handle.write(str(child.pid))
    inventory.reconcile()  # a cgroup move sends no proc event: the scan sees it
    result = settle(inventory, m, lambda r: r.workload_of(child.pid) is not None)
    workload = result.workload_of(child.pid)
    assert (workload.profile_id, workload.tier, workload.budget, workload.source) == ("tmpd-hot", "critical", 1.5, "binding")
    assert "binding[0] (cgroup " + rel + ")" in workload.reason
    assert workload.cgroup == rel


def test_busiest_group_takes_the_thread_that_burns_cpu(inventory, spawn):
    m = matcher()
    child = spawn("tmpd-hot")
    child.wait_ready()
    idle = int(child.command("thread idler"))
    inventory.reconcile()
    m.match(inventory.processes.values())  # the baseline for "recent" runtime
    spinner = int(child.command("spin spinner"))
    inventory.reconcile()
    inventory.refresh_runtime([child.pid])
    result = m.match(inventory.processes.values())
    assert group_of(result, spinner) == "hot"
    assert group_of(result, idle) == "rest"
    (hot,) = [t for t in result.workload_of(child.pid).threads if t.group == "hot"]
    assert "busiest #1 of 1" in hot.reason


def test_a_foreign_process_leaves_a_workload_as_built_and_its_own_new_thread_rebuilds_it(inventory, spawn):
    """A process that matches nothing, coming and going, must not rebuild every workload's
    thread list (thousands of threads each time); a change of the workload's own process must."""
    m = matcher()
    child = spawn("tmpd-match-kept")
    child.wait_ready()
    built = settle(inventory, m, lambda r: r.workload_of(child.pid) is not None).workload_of(child.pid)
    foreign = spawn("tmpd-foreign")
    foreign.wait_ready()
    result = settle(inventory, m, lambda r: foreign.pid in {p.pid for p in inventory.processes.values()})
    assert result.workload_of(foreign.pid) is None
    assert result.workload_of(child.pid) is built
    tid = int(child.command("thread wrk-0"))
    result = settle(inventory, m, lambda r: group_of(r, tid) == "workers")
    assert group_of(result, tid) == "workers" and result.workload_of(child.pid) is not built


def test_reused_pid_is_matched_afresh(inventory, spawn):
    m = matcher()
    old = spawn("tmpd-match-old")
    old.wait_ready()
    result = settle(inventory, m, lambda r: r.workload_of(old.pid) is not None)
    pid = old.pid
    assert result.workload_of(pid).profile_id == "tmpd-demo"
    old.close()
    time.sleep(0.03)
    new = spawn_at_pid(spawn, pid, "plain-process")
    new.wait_ready()
    result = settle(inventory, m, lambda r: r.workload_of(pid) is None)
    assert result.workload_of(pid) is None
    assert "no fingerprint" in m.explain_unmatched(inventory.process(pid))


def test_kernel_threads_are_never_workloads(inventory):
    m = matcher('[[binding]]\ncgroup = "/"\ntier = "critical"\n')
    result = m.match(inventory.processes.values())
    assert result.workload_of(2) is None
    assert m.explain_unmatched(inventory.process(2)) == "kernel thread: never treated"


def test_an_exec_that_brings_the_environment_binding_is_matched_without_a_reload(inventory):
    """`exec env TEMPER_WORKLOAD_PROFILE=... prog` keeps the pid and its start time: what was
    read from the environment before the exec must not stand for the program after it."""
    m = matcher()
    script = "sleep 0.6; exec env TEMPER_WORKLOAD_PROFILE=tmpd-hot sleep 30"
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        before = settle(inventory, m, lambda r: proc.pid in inventory.processes, 2.0)
        assert before.workload_of(proc.pid) is None  # sh, without the variable
        after = settle(inventory, m, lambda r: r.workload_of(proc.pid) is not None, 5.0)
        workload = after.workload_of(proc.pid)
        assert workload is not None and workload.profile_id == "tmpd-hot" and workload.source == "env"
        assert inventory.processes[proc.pid].execs >= 1
    finally:
        proc.kill()
        proc.wait()
