"""`temperctl bind` / `unbind` against a running temperd and a real memcached: a bound profile
takes over from the fingerprint at once, unbind and stop put every thread back, a bad profile or
pid is one line, and a binding raises nothing for a process the host does not trust."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from temperd.config.profile import parse_profile
from test_daemon_e2e import Temperd, memcached, task_stat, threads_by_name
from thread_children import wait_for

pytestmark = [pytest.mark.servers, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="temperd changes other processes' scheduling: root")]

BOUND = """schema_version = 1
id = "bound-test"
[[thread_groups]]
name = "workers"
thread_names = ["mc-worker"]
treatment = "yield"
yield_policy = "batch"
nice = 7
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "latency"
nice = -3
"""

SCHED_BATCH = 3


@pytest.fixture
def temperd(tmp_path):
    daemon = Temperd(tmp_path)
    daemon.start()
    yield daemon
    daemon.stop()


def test_bind_takes_over_unbind_and_stop_put_threads_back(tmp_path):
    profile = tmp_path / "bound.toml"
    profile.write_text(BOUND)
    with memcached() as server:
        (worker,) = threads_by_name(server.pid)["mc-worker"]
        # Read before temperd starts: a running daemon may already have applied the builtin profile.
        original = task_stat(server.pid, worker)
        temperd = Temperd(tmp_path)
        temperd.start()
        try:
            wait_for(lambda: "memcached" in str(temperd.status()), 10, "the builtin memcached profile applied")
            out = temperd.temperctl("bind", "--pid", str(server.pid), "--profile", str(profile))
            assert out.returncode == 0, out.stderr
            assert "bound-test-bound-" in out.stdout
            wait_for(lambda: task_stat(server.pid, worker) == {"nice": 7, "policy": SCHED_BATCH}, 10, "the bound treatment")
            assert task_stat(server.pid, server.pid)["nice"] == -3  # the main thread: the bound catch-all
            listed = temperd.temperctl("bindings")
            assert listed.returncode == 0 and f"pid {server.pid}" in listed.stdout
            out = temperd.temperctl("unbind", "--pid", str(server.pid))
            assert out.returncode == 0, out.stderr
            wait_for(lambda: task_stat(server.pid, worker)["policy"] != SCHED_BATCH, 10, "the builtin profile again")
            assert temperd.temperctl("bind", "--pid", str(server.pid), "--profile", str(profile)).returncode == 0
            wait_for(lambda: task_stat(server.pid, worker)["nice"] == 7, 10, "bound again")
            assert temperd.stop() == 0
            assert task_stat(server.pid, worker) == original  # stop restores what the binding changed
        finally:
            temperd.stop()


def test_bad_profile_or_pid_is_one_line(temperd, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BOUND.replace('treatment = "yield"', 'treatment = "fast"'))
    out = temperd.temperctl("bind", "--pid", str(os.getpid()), "--profile", str(bad))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "bad.toml" in out.stderr and "treatment" in out.stderr
    good = tmp_path / "good.toml"
    good.write_text(BOUND)
    out = temperd.temperctl("bind", "--pid", "4194303", "--profile", str(good))
    assert out.returncode == 1 and "no such process" in out.stderr
    out = temperd.temperctl("unbind", "--pid", str(os.getpid()))
    assert out.returncode == 1 and "has no runtime binding" in out.stderr


def test_binding_raises_nothing_for_an_untrusted_process(temperd, tmp_path):
    profile = tmp_path / "raise.toml"
    profile.write_text(BOUND)
    user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], user=54321, group=54321)
    try:
        wait_for(lambda: temperd.temperctl("explain", str(user.pid)).returncode == 0, 10, "the process known")
        out = temperd.temperctl("bind", "--pid", str(user.pid), "--profile", str(profile))
        assert out.returncode == 0, out.stderr
        # explain answers from the plan in force: once it says "not granted" the binding was applied
        wait_for(lambda: "not granted" in temperd.temperctl("explain", str(user.pid)).stdout, 10,
                 "the binding applied, its raise not granted")
        assert task_stat(user.pid, user.pid)["nice"] == 0  # latency (nice -3) is not granted
    finally:
        user.kill()
        user.wait()


def test_train_through_temperd_writes_the_profile(temperd, tmp_path):
    """temperctl train asks the running temperd to observe (the host's one capture) and analyzes
    the reply itself."""
    with memcached() as server:
        load = f"memcaslap -s 127.0.0.1:{server.port} -T 1 -c 4 -t 10s"
        out = temperd.temperctl("train", "--pid", str(server.pid), "--duration", "2s", "--load", load,
                                "-o", str(tmp_path / "mc.toml"), "--no-report", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["via"] == "temperd"
    assert {t["comm"] for t in result["threads"]} >= {"memcached", "mc-worker"}
    assert (tmp_path / "mc.toml").exists() and os.path.exists(result["trace"])


YIELD_ALL = """schema_version = 1
id = "yield-all"
[[thread_groups]]
name = "all"
catch_all = true
treatment = "yield"
yield_policy = "batch"
nice = 13
"""


@contextlib.contextmanager
def nice_reader(temperd):
    """A sleeping process temperd knows, and a benchmark whose metric is its nice value + 20."""
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        wait_for(lambda: temperd.temperctl("explain", str(workload.pid)).returncode == 0, 10, "the process known")
        yield workload, f"awk '{{print \"nice=\" $19 + 20}}' /proc/{workload.pid}/stat"
    finally:
        workload.kill()
        workload.wait()


def test_evaluate_runs_both_arms_interleaved_and_judges_beyond_the_noise(temperd, tmp_path):
    """The benchmark reads the workload's nice value: 20 + 13 while bound, 20 without, so the arms
    are told apart (ranges apart, medians 65 % apart) and the log lands in the output profile."""
    profile = tmp_path / "yield.toml"
    profile.write_text(YIELD_ALL)
    with nice_reader(temperd) as (workload, bench):
        out = temperd.temperctl("train", "evaluate", str(profile), "--pid", str(workload.pid), "--bench", bench,
                                "--metric", r"nice=(\d+)", "--higher-is-better", "--background", "1",
                                "-o", str(tmp_path / "evaluated.toml"), "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["verdict"] == "better" and result["with"]["median"] == 33 and result["without"]["median"] == 20
        assert "ranges" in result["rule"] and len(result["runs"]) == 10
        arms = [r["arm"] for r in sorted(result["runs"], key=lambda r: r["rep"])]
        assert arms[:4] == ["without", "with", "with", "without"]  # interleaved, reversed every other repetition
        evaluated = (tmp_path / "evaluated.toml").read_text()
        assert "# Verdict:" in evaluated and "# Rule:" in evaluated
        assert temperd.temperctl("bindings").stdout.strip() == "no runtime bindings"
        assert task_stat(workload.pid, workload.pid)["nice"] == 0


FAVOURED = """schema_version = 1
id = "favoured"
[[thread_groups]]
name = "all"
catch_all = true
treatment = "latency"
nice = -3
"""


def test_refine_keeps_a_measured_improvement_and_writes_the_trial_log(temperd, tmp_path):
    """The benchmark reads the workload's nice value (lower is better): the first neighbour, nice
    -3 -> -8, measures better and is kept; the climb goes on from it (-8 -> -13, kept) and stops at
    --max-trials 2. Every candidate is bound through temperd and unbound after its runs."""
    profile = tmp_path / "favoured.toml"
    profile.write_text(FAVOURED)
    with nice_reader(temperd) as (workload, bench):
        out = temperd.temperctl("train", "evaluate", str(profile), "--pid", str(workload.pid), "--bench", bench,
                                "--metric", r"nice=(\d+)", "--refine", "--max-trials", "2",
                                "-o", str(tmp_path / "refined.toml"), "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["verdict"] == "better" and result["with"]["median"] == 17
        assert [(t["change"], t["kept"]) for t in result["trials"]] == [
            ("group 'all' nice -3 -> -8", True), ("group 'all' nice -8 -> -13", True)]
        assert [t["candidate"]["median"] for t in result["trials"]] == [12, 7]
        refined = (tmp_path / "refined.toml").read_text()
        assert "nice = -13" in refined and "#   trial 2: group 'all' nice -8 -> -13" in refined
        assert "# Kept: group 'all' nice -3 -> -8; group 'all' nice -8 -> -13" in refined
        assert parse_profile(refined, "refined.toml").thread_groups[0].nice == -13  # the strict loader takes it
        assert temperd.temperctl("bindings").stdout.strip() == "no runtime bindings"
        assert task_stat(workload.pid, workload.pid)["nice"] == 0


def test_refine_without_an_output_file_is_a_usage_error(temperd, tmp_path):
    profile = tmp_path / "favoured.toml"
    profile.write_text(FAVOURED)
    out = temperd.temperctl("train", "evaluate", str(profile), "--pid", str(os.getpid()), "--bench", "true",
                            "--metric", "(x)", "--refine")
    assert out.returncode == 2 and "--refine writes the profile it finds: give -o OUT.toml" in out.stderr


def test_temperd_its_ancestors_pid_1_and_kernel_threads_cannot_be_bound(temperd, tmp_path):
    """A binding covers the process's descendants, and SCHED_IDLE starves a thread beside any busy
    one: temperd, PID 1 (every process's ancestor), temperd's other ancestors (this test runs
    it) and kernel threads are refused, in one line each, and nothing is bound."""
    profile = tmp_path / "yield.toml"
    profile.write_text(BOUND.replace('nice = -3', 'nice = 0').replace('treatment = "latency"', 'treatment = "yield"\n'
                                                                      'yield_policy = "idle"'))
    for pid, why in ((temperd.proc.pid, "temperd itself"), (1, "init process"), (os.getpid(), "an ancestor of temperd"),
                     (2, "kernel thread")):
        out = temperd.temperctl("bind", "--pid", str(pid), "--profile", str(profile))
        assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert why in out.stderr and "refused" in out.stderr
    assert temperd.status()["state"] == "running"
    assert temperd.temperctl("bindings").stdout.strip() == "no runtime bindings"


@pytest.fixture
def binders():
    """A group whose members may use the control socket, as `temper` is on a packaged host."""
    name = "tmpd-binders"
    subprocess.run(["groupdel", name], capture_output=True)
    if subprocess.run(["groupadd", name], capture_output=True).returncode != 0:
        pytest.skip("cannot create a group (groupadd)")
    import grp

    yield name, grp.getgrnam(name).gr_gid
    subprocess.run(["groupdel", name], capture_output=True)


def test_a_member_of_the_socket_group_binds_only_its_own_processes(tmp_path, binders):
    group, gid = binders
    shared = pathlib.Path(tempfile.mkdtemp(prefix="tmpd-bind-", dir="/tmp"))  # the member reaches it; not tmp_path
    os.chmod(shared, 0o755)
    profile = shared / "bound.toml"
    profile.write_text(BOUND)
    os.chmod(profile, 0o644)
    daemon = Temperd(tmp_path)
    daemon.socket = str(shared / "temperd.sock")
    daemon.write_config(socket=daemon.socket)
    with open(daemon.config_dir / "temperd.toml", "a") as config:
        config.write(f'group = "{group}"\n')  # the [control] table is the last one written
    member = dict(user=54321, group=gid, extra_groups=[])
    theirs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # root's
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **member)
    daemon.start()
    try:
        def bind(pid):
            return subprocess.run([os.path.join(os.path.dirname(sys.executable), "temperctl"), "bind", "--pid", str(pid),
                                   "--profile", str(profile), "--socket", daemon.socket],
                                  capture_output=True, text=True, timeout=60, **member)

        wait_for(lambda: daemon.temperctl("explain", str(mine.pid)).returncode == 0, 10, "the processes known")
        refused = bind(theirs.pid)
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "belongs to uid 0, not to you (uid 54321)" in refused.stderr
        allowed = bind(mine.pid)
        assert allowed.returncode == 0, allowed.stderr
        listed = daemon.temperctl("bindings", "--json")
        assert "uid 54321" in listed.stdout and f'"pid": {mine.pid}' in listed.stdout, listed.stdout
    finally:
        daemon.stop()
        for proc in (theirs, mine):
            proc.kill()
            proc.wait()
        shutil.rmtree(shared, ignore_errors=True)
