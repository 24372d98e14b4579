"""A local user cannot raise their own processes through temperd: a real unprivileged account,
created here, runs a process that looks like memcached in every way a user controls (its name,
a thread named mc-worker, TEMPER_WORKLOAD_PROFILE in its environment, the real memcached
executable). The match is made and explained, but nothing that raises standing is applied:
no exclusive CPU, no negative nice, no critical tier — unless temperd.toml's [trust] names the
user. Yield treatment (a lowering) still applies."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import servers as S
from thread_children import wait_for
from temperd.config.daemon_config import DaemonConfig, config_from_document
from temperd.config.tomlsource import parse_toml
from temperd.decide.hostview import decide, load_host_view, make_matcher
from temperd.decide.trust import TrustPolicy, trust_policy
from temperd.plan import EXCLUSIVE
from temperd.sources.facts import ProcessFacts
from temperd.sources.inventory import Inventory

pytestmark = pytest.mark.root
USER = "tmpd-hostile"
SCHED_OTHER, SCHED_BATCH = 0, 3

CHILD = textwrap.dedent("""
    import ctypes, sys, threading, time
    libc = ctypes.CDLL(None)
    def name(text):
        libc.prctl(15, text.encode(), 0, 0, 0)  # PR_SET_NAME: the calling thread's comm
    name("memcached")
    named = threading.Barrier(3, timeout=5)
    def thread(comm):
        name(comm)
        named.wait()
        time.sleep(120)
    for comm in ("mc-worker", "mc-lrumaint"):
        threading.Thread(target=thread, args=(comm,), daemon=True).start()
    named.wait()
    print("ready", flush=True)
    time.sleep(120)
""")


@pytest.fixture(scope="module")
def hostile_user():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create an unprivileged account")
    subprocess.run(["userdel", USER], capture_output=True)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    entry = pwd.getpwnam(USER)
    assert entry.pw_uid >= 1000, "useradd gave a system uid; the test needs a person's"
    yield entry
    subprocess.run(["userdel", USER], capture_output=True)


@pytest.fixture
def untrusted_cgroup():
    """A cgroup that is no systemd unit: where the test's processes go so that the pytest run's
    own cgroup (a system unit on some CI runners) does not lend them trust."""
    root = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
    path = os.path.join(root, f"tmpd-untrusted-{os.getpid()}")
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup: {exc}")
    yield path
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as handle:
                for pid in handle.read().split():
                    with open(os.path.join(root, "cgroup.procs"), "w") as out:
                        out.write(pid)
            os.rmdir(path)
            break
        except OSError:
            time.sleep(0.1)


def run_as(user, argv, cgroup, env=None):
    """argv as the user, moved into the cgroup before it runs anything."""
    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=enter, start_new_session=True)


@pytest.fixture
def lookalike(hostile_user, untrusted_cgroup):
    env = {"PATH": "/usr/bin:/bin", "TEMPER_WORKLOAD_PROFILE": "memcached"}
    proc = run_as(hostile_user, [sys.executable, "-c", CHILD], untrusted_cgroup, env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def threads_by_name(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as handle:
            out[handle.read().strip()] = int(tid)
    return out


def host_view(tmp_path, toml=""):
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "temperd.toml").write_text('backend = "native"\n' + toml)
    return load_host_view(str(etc), require_trusted=True)


def match_pid(view, pid):
    inventory = Inventory()  # not started: a scan, no process events
    inventory.reconcile()
    match, plan = decide(view, make_matcher(view), inventory.processes.values())
    return match.workload_of(pid), plan


def test_trust_policy_of_a_person_a_system_account_root_and_nobody(hostile_user):
    policy = trust_policy(DaemonConfig())

    def P(uid, unit=None, cgroup=None):
        return ProcessFacts(pid=4242, start_time=1, name="p", exe=None, cmdline=(), cgroup=cgroup, cgroup_systemd=None,
                            unit=unit, is_kernel_thread=False, ppid=1, threads={}, uid=uid)

    assert policy.distrust(P(0)) is None
    assert policy.distrust(P(pwd.getpwnam("daemon").pw_uid)) is None
    assert "not trusted" in policy.distrust(P(hostile_user.pw_uid))
    assert USER in policy.distrust(P(hostile_user.pw_uid))
    assert "not trusted" in policy.distrust(P(pwd.getpwnam("nobody").pw_uid))
    assert "owner unknown" in policy.distrust(P(None))
    # a system unit is the administrator's choice, whatever User= it runs as
    assert policy.distrust(P(hostile_user.pw_uid, "app.service", "/system.slice/app.service")) is None
    # a user's own systemd runs units too, under user.slice: those are not system units
    assert policy.distrust(P(hostile_user.pw_uid, "app.service",
                             f"/user.slice/user-{hostile_user.pw_uid}.slice/user@{hostile_user.pw_uid}.service/app.service"))
    trusted = trust_policy(config_from_document(parse_toml(f'[trust]\nusers = ["{USER}"]\n', "t.toml")))
    assert trusted.distrust(P(hostile_user.pw_uid)) is None
    group = pwd.getpwnam(USER).pw_name
    by_group = trust_policy(config_from_document(parse_toml(f'[trust]\ngroups = ["{group}"]\n', "t.toml")))
    assert isinstance(by_group, TrustPolicy) and by_group.distrust(P(hostile_user.pw_uid)) is None


def test_environment_binding_of_an_untrusted_user_does_not_raise(tmp_path, lookalike):
    names = threads_by_name(lookalike.pid)
    workload, plan = match_pid(host_view(tmp_path), lookalike.pid)
    assert workload is not None and workload.profile_id == "memcached" and workload.source == "env"
    by_tid = {t.tid: t for t in workload.threads}
    worker = by_tid[names["mc-worker"]]
    assert worker.group is None and "exclusive not granted" in worker.reason and USER in worker.reason
    main = by_tid[names["memcached"]]
    assert main.group is None and "latency not granted" in main.reason
    assert by_tid[names["mc-lrumaint"]].group == "maintenance"  # yielding is a lowering: applied
    exclusive = [layer for layer in plan.layers if layer.treatment == EXCLUSIVE]
    assert all(names["mc-worker"] not in layer.selector.tids for layer in exclusive)


def test_a_critical_binding_of_an_untrusted_process_gets_standard(tmp_path, lookalike, untrusted_cgroup):
    cgroup = "/" + os.path.basename(untrusted_cgroup)
    view = host_view(tmp_path, f'[[binding]]\ncgroup = "{cgroup}"\ntier = "critical"\n')
    workload, _plan = match_pid(view, lookalike.pid)
    assert workload.tier == "standard"
    assert "tier critical not granted, standard instead" in workload.reason and "not trusted" in workload.reason


def test_trust_section_lets_the_user_be_raised(tmp_path, lookalike):
    names = threads_by_name(lookalike.pid)
    workload, _plan = match_pid(host_view(tmp_path, f'[trust]\nusers = ["{USER}"]\n'), lookalike.pid)
    by_tid = {t.tid: t for t in workload.threads}
    assert by_tid[names["mc-worker"]].group == "workers"
    assert by_tid[names["memcached"]].group == "dispatch"


SYSTEMD_HIERARCHY = "/sys/fs/cgroup/systemd"  # name=systemd on legacy and hybrid hosts


@pytest.fixture
def systemd_placed(hostile_user):
    """place(PATH): the lookalike, run by the unprivileged user, in PATH of the name=systemd
    hierarchy only: its cgroup v2 path stays the test's own ("/" here), as every process's is on a
    hybrid host whose systemd keeps its units in the named hierarchy."""
    if not os.path.exists(os.path.join(SYSTEMD_HIERARCHY, "cgroup.procs")):
        pytest.skip("no name=systemd hierarchy: not a legacy or hybrid cgroup host")
    made, started = [], []

    def place(path):
        directory = SYSTEMD_HIERARCHY
        for part in path.strip("/").split("/"):
            directory = os.path.join(directory, part)
            if not os.path.isdir(directory):
                os.mkdir(directory)
                made.append(directory)
        proc = run_as(hostile_user, [sys.executable, "-c", CHILD], directory,
                      {"PATH": "/usr/bin:/bin", "TEMPER_WORKLOAD_PROFILE": "memcached"})
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        with open(f"/proc/{proc.pid}/cgroup") as handle:
            assert f"name=systemd:{path}\n" in handle.read()
        return proc

    yield place
    for proc in started:
        proc.kill()
        proc.wait()
    for directory in reversed(made):
        wait_for(lambda: _try_rmdir(directory), 5, f"{directory} empty")


def _try_rmdir(directory):
    try:
        os.rmdir(directory)
        return True
    except OSError:
        return False


def test_a_login_session_on_a_hybrid_host_is_not_a_system_unit(tmp_path, hostile_user, systemd_placed):
    """A process in user.slice/user-UID.slice/session-N.scope of the name=systemd hierarchy, with its
    cgroup v2 path at the root: the unit is the session's scope, and it is not raised."""
    uid = hostile_user.pw_uid
    proc = systemd_placed(f"/user.slice/user-{uid}.slice/session-9{os.getpid() % 1000}.scope")
    names = threads_by_name(proc.pid)
    workload, plan = match_pid(host_view(tmp_path), proc.pid)
    assert workload is not None and workload.profile_id == "memcached"
    assert workload.key == f"session-9{os.getpid() % 1000}.scope/memcached"  # the unit: its session's scope
    by_tid = {t.tid: t for t in workload.threads}
    assert by_tid[names["mc-worker"]].group is None and "exclusive not granted" in by_tid[names["mc-worker"]].reason
    assert by_tid[names["memcached"]].group is None and "latency not granted" in by_tid[names["memcached"]].reason
    assert not any(layer.treatment == EXCLUSIVE and names["mc-worker"] in layer.selector.tids for layer in plan.layers)


def test_a_system_unit_on_a_hybrid_host_is_raised_whatever_its_user(tmp_path, hostile_user, systemd_placed):
    proc = systemd_placed(f"/system.slice/tmpd-trust-{os.getpid()}.service")
    names = threads_by_name(proc.pid)
    workload, _plan = match_pid(host_view(tmp_path), proc.pid)
    assert workload is not None and workload.key == f"tmpd-trust-{os.getpid()}.service/memcached"
    by_tid = {t.tid: t for t in workload.threads}
    assert by_tid[names["mc-worker"]].group == "workers" and by_tid[names["memcached"]].group == "dispatch"


def test_the_real_memcached_executable_run_by_a_user_is_not_raised(tmp_path, hostile_user, untrusted_cgroup):
    binary = shutil.which("memcached")
    if binary is None:
        pytest.skip("memcached is not installed")
    port = S.free_port()
    proc = run_as(hostile_user, [binary, "-t", "2", "-l", "127.0.0.1", "-p", str(port), "-U", "0"],
                  untrusted_cgroup, {"PATH": "/usr/bin:/bin"})
    try:
        wait_for(lambda: "mc-worker" in threads_by_name(proc.pid), 10, "memcached's worker threads")
        workload, plan = match_pid(host_view(tmp_path), proc.pid)
        assert workload is not None and workload.profile_id == "memcached" and workload.source == "fingerprint"
        workers = [t for t in workload.threads if t.comm == "mc-worker"]
        assert workers and all(t.group is None and "not granted" in t.reason for t in workers)
        assert not any(layer.treatment == EXCLUSIVE and layer.selector.tids for layer in plan.layers
                       if layer.workload == workload.key)
    finally:
        proc.kill()
        proc.wait()


def test_a_memcached_run_by_nobody_keeps_its_workers_and_yields_only_its_maintenance(tmp_path, untrusted_cgroup):
    """Declining to raise must not lower: the workers and the main thread stay as they were, the
    maintenance threads (the catch-all yield group, a lowering for anyone) yield, and explain
    says exactly that."""
    from test_daemon_e2e import Temperd, task_stat
    binary = shutil.which("memcached")
    if binary is None:
        pytest.skip("memcached is not installed")

    def enter():
        with open(os.path.join(untrusted_cgroup, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
    port = S.free_port()
    proc = subprocess.Popen([binary, "-u", "nobody", "-t", "4", "-l", "127.0.0.1", "-p", str(port), "-U", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=enter,
                            start_new_session=True)
    temperd = Temperd(tmp_path)
    try:

        def comms():
            out = {}
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                with open(f"/proc/{proc.pid}/task/{tid}/comm") as handle:
                    out[int(tid)] = handle.read().strip()
            return out
        wait_for(lambda: len(comms()) >= 10, 10, "memcached's ten threads")  # 4 workers, main, 5 maintenance
        tids = comms()
        maintenance = {tid for tid, comm in tids.items() if comm not in ("mc-worker", "memcached")}
        assert len([c for c in tids.values() if c == "mc-worker"]) == 4 and maintenance, tids
        temperd.start()
        wait_for(lambda: all(task_stat(proc.pid, tid)["policy"] == SCHED_BATCH for tid in maintenance), 15,
                 "the maintenance threads yielded")
        out = temperd.temperctl("explain", str(proc.pid), "--json")
        assert out.returncode == 0, out.stderr
        explained = {t["tid"]: t for t in json.loads(out.stdout)["threads"]}
        assert set(explained) == set(tids)
        for tid, comm in tids.items():
            stat = task_stat(proc.pid, tid)
            if tid in maintenance:
                assert explained[tid]["group"] == "maintenance" and explained[tid]["layer"], (comm, explained[tid])
                assert stat["policy"] == SCHED_BATCH and stat["nice"] > 0, (comm, stat)
            else:
                assert explained[tid]["group"] is None and explained[tid]["layer"] is None, (comm, explained[tid])
                assert "not granted" in explained[tid]["reason"]
                assert stat == {"nice": 0, "policy": SCHED_OTHER}, (comm, stat)
    finally:
        temperd.stop()
        proc.kill()
        proc.wait()
