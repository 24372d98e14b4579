"""The scx_layered supervisor and sched_ext detection.

The supervisor tests run tests/standins/fake_scx_layered.py, a STAND-IN for scx_layered: the
real binary needs a kernel with sched_ext (CONFIG_SCHED_CLASS_EXT) and root. The stand-in
behaves as the reference describes scx_layered from the outside: `f:PATH` config, the
scx_stats protocol on a Unix socket, exit 0 with `EXIT: unregistered from user space` on
SIGTERM/SIGINT/SIGHUP, and (when told) a crash with a non-zero exit after a delay.
The real scx_layered 1.1.2 runs where it can: tests/test_scx_real_binary.py (its config
checks, on this host through trixie's glibc) and the VM test's scx_* steps (loaded for real);
what it did there that the stand-in does differently is in the stand-in's docstring.
"""

import json
import os
import shutil
import signal
import tempfile
import time

import pytest
from thread_children import holds

from temperd.backends.scx.detect import detect_sched_ext
from temperd.backends.scx.backend import restart_policy
from temperd.backends.scx.restarts import RestartPolicy
from temperd.backends.scx.stats import StatsClient, StatsError, SysStats, stats_view
from temperd.backends.scx.status import BACKOFF, IDLE, REFUSED, RUNNING, SAFE_MODE, STOPPED
from temperd.backends.scx.supervisor import ScxConfigError, ScxSupervisor
from temperd.config.daemon_config import ScxSettings
from temperd.control.status import ScxStatsView
from temperd.control.typed_json import to_json

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins", "fake_scx_layered.py")
WAIT_S = 10.0  # upper bound for anything these tests wait for


def config(*names, cpus=2):
    layers = [{"name": n, "matches": [[{"CgroupPrefix": f"system.slice/{n}.service/"}]],
               "kind": {"Confined": {"util_range": [0.0, 1.0], "cpus_range": [cpus, cpus], "protected": True}}}
              for n in names]
    return layers + [{"name": "rest", "matches": [[]], "kind": {"Open": {}}}]


def fake_sysfs(root, state, ops=None):
    base = os.path.join(root, "kernel", "sched_ext")
    os.makedirs(os.path.join(base, "root"), exist_ok=True)
    with open(os.path.join(base, "state"), "w") as handle:
        handle.write(state + "\n")
    ops_path = os.path.join(base, "root", "ops")
    if ops:
        with open(ops_path, "w") as handle:
            handle.write(ops + "\n")
    elif os.path.exists(ops_path):
        os.unlink(ops_path)
    return root


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split(")")[-1].split()[0] != "Z"


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Env:
    """A sysfs tree, a state dir and a short socket path (Unix socket paths are limited to 108 bytes)."""

    def __init__(self, tmp_path):
        self.short = tempfile.mkdtemp(prefix="scx", dir="/tmp")
        self.socket = os.path.join(self.short, "root", "stats")
        self.sysfs = fake_sysfs(str(tmp_path / "sys"), "disabled")
        self.state_dir = str(tmp_path / "state")
        self.record = str(tmp_path / "record.jsonl")
        self.supervisors = []

    def supervisor(self, clock=None, policy=None, **env):
        child_env = {"FAKE_SCX_STATS_SOCKET": self.socket, "FAKE_SCX_SYSFS": self.sysfs, "FAKE_SCX_RECORD": self.record,
                     **{k: str(v) for k, v in env.items()}}
        sup = ScxSupervisor(STANDIN, self.state_dir, self.socket, sysfs_root=self.sysfs,
                            clock=clock or time.monotonic, policy=policy or RestartPolicy(), env=child_env,
                            on_safe_mode=self.safe_modes.append)
        self.supervisors.append(sup)
        return sup

    safe_modes: list

    def events(self, kind=None):
        if not os.path.exists(self.record):
            return []
        with open(self.record) as handle:
            events = [json.loads(line) for line in handle]
        return [e for e in events if kind is None or e["event"] == kind]

    def close(self):
        for sup in self.supervisors:
            sup.stop()
        for event in self.events("attach"):  # nothing a test started may outlive it
            if alive(event["pid"]):
                os.kill(event["pid"], signal.SIGKILL)
        shutil.rmtree(self.short, ignore_errors=True)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    e.safe_modes = []
    yield e
    e.close()


def until(predicate, sup=None, timeout=WAIT_S):
    """Wait (ticking `sup` by hand if given) until predicate() holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sup is not None:
            sup.tick()
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


# ---- detection -----------------------------------------------------------------------------------

def test_this_host_without_sched_ext():
    if os.path.isdir("/sys/kernel/sched_ext"):
        pytest.skip("this kernel has sched_ext")
    found = detect_sched_ext("/sys")
    assert not found.kernel_supported and not found.usable
    assert found.reason == "no /sys/kernel/sched_ext: kernel without CONFIG_SCHED_CLASS_EXT"


def test_detect_disabled_state_is_usable(tmp_path):
    found = detect_sched_ext(fake_sysfs(str(tmp_path), "disabled"), binary=STANDIN)
    assert found.kernel_supported and found.state == "disabled" and found.loaded_ops is None and found.usable


def test_detect_enabled_state_names_the_loaded_scheduler(tmp_path):
    found = detect_sched_ext(fake_sysfs(str(tmp_path), "enabled", "rustland_1.0.3"), binary=STANDIN)
    assert found.kernel_supported and not found.usable
    assert (found.state, found.loaded_ops) == ("enabled", "rustland_1.0.3")
    assert "sched_ext scheduler 'rustland_1.0.3' is loaded" in found.reason


def test_detect_offline_cpus_make_scx_unusable(tmp_path):
    root = fake_sysfs(str(tmp_path), "disabled")
    cpu_dir = tmp_path / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "possible").write_text("0-63\n")
    (cpu_dir / "online").write_text("0-3\n")
    found = detect_sched_ext(root, binary=STANDIN)
    assert not found.usable and "possible CPUs 0-63 differ from online CPUs 0-3" in found.reason
    (cpu_dir / "possible").write_text("0-3\n")
    assert detect_sched_ext(root, binary=STANDIN).usable


# ---- supervisor against the stand-in -------------------------------------------------------------

def test_start_writes_config_and_reads_stats_over_one_connection(env):
    sup = env.supervisor(policy=RestartPolicy(stats_interval_s=0.1))
    wanted = config("db")
    assert sup.apply(wanted)
    sup.start()
    until(lambda: sup.status().stats_reads >= 5)
    status = sup.status()
    assert status.state == RUNNING and status.starts == 1 and status.crashes == 0
    (attach,) = env.events("attach")
    assert attach["pid"] == status.pid and attach["argv"] == [f"f:{sup.config_path}"]
    assert attach["specs"] == wanted
    with open(sup.config_path) as handle:
        assert json.load(handle) == wanted
    assert [f for f in os.listdir(env.state_dir) if f.startswith(".tmp")] == []
    stats = sup.stats()
    assert set(stats.layers) == {"db", "rest"} and stats.layers["db"].cur_nr_cpus == 2
    # one connection, kept open: counters are deltas since the previous read, not since start
    assert len(env.events("stats-connect")) == 1
    assert 0 <= stats.total < 1000
    assert status.stats_age_s < 5
    summary = stats_view(stats)
    assert summary.system["busy"] == stats.busy and summary.layers["db"]["cur_nr_cpus"] == 2
    assert "l_runq_lat_hist" not in summary.layers["db"]  # lists are not metrics
    assert summary.layers["db"]["cpus"] == sorted(stats.layers["db"].cpus)


def test_stats_reply_tolerates_missing_and_unknown_fields():
    assert stats_view(None) == ScxStatsView({}, {})
    stats = SysStats.from_json({"busy": 1.5, "new_field": 3, "antistall": True, "layers": {"a": {"tasks": 4, "x": 1}}})
    assert stats_view(stats) == ScxStatsView({"busy": 1.5}, {"a": {"tasks": 4, "cpus": []}})
    assert stats.antistall is None and stats.layers["a"].cpus is None  # a bool is not a count; no mask: unknown
    assert SysStats.from_json("garbage") == SysStats() and SysStats.from_json({"layers": []}).layers == {}


def test_status_as_json_keeps_the_keys_temperctl_shows(env):
    """`temperctl status --json` and /observe show it as backend.scx_layered; scripts read these keys."""
    data = to_json(env.supervisor().status())
    assert list(data) == ["state", "pid", "binary", "args", "config_path", "log_path", "stats_socket", "uptime_s",
                          "pending_change", "next_restart_in_s", "safe_mode", "safe_mode_reason", "crashes_in_window",
                          "last_exit", "default_scheduler_gap_s", "stats_age_s", "stats_error", "starts", "restarts",
                          "crash_restarts", "crashes", "outside_stops", "coalesced_changes", "refusals", "stats_reads", "stats_errors",
                          "safe_mode_entries"]
    assert data["state"] == IDLE and data["default_scheduler_gap_s"] == {"last": None, "total": 0.0}
    assert json.loads(json.dumps(data)) == data


def test_restart_policy_defaults_are_those_of_the_scx_table():
    settings, policy = ScxSettings(), RestartPolicy()
    assert (policy.min_interval_s, policy.crash_limit, policy.crash_window_s) == (
        settings.min_restart_interval_s, settings.crash_limit, settings.crash_window_s)
    assert restart_policy(settings) == policy


def test_stop_sends_sigterm_and_scx_exits_cleanly(env):
    sup = env.supervisor()
    sup.apply(config("db"))
    sup.start()
    until(lambda: sup.state == RUNNING)
    pid = sup.pid
    with open(os.path.join(env.sysfs, "kernel", "sched_ext", "root", "ops")) as handle:
        assert handle.read().startswith("layered")
    assert sup.stop() == 0
    assert not alive(pid)
    status = sup.status()
    assert status.state == STOPPED and status.crashes == 0
    assert status.last_exit.requested and status.last_exit.reason == "EXIT: unregistered from user space"
    assert detect_sched_ext(env.sysfs, binary=STANDIN).state == "disabled"


def test_restart_on_plan_change_is_batched_and_rate_limited(env):
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(min_interval_s=30, batch_s=2))
    sup.apply(config("a"))
    until(lambda: sup.state == RUNNING, sup)
    first = sup.pid

    clock.now += 5
    assert sup.apply(config("b"))
    sup.tick()
    assert sup.pid == first and sup.status().next_restart_in_s == 25  # 30 s after the start
    clock.now += 5
    assert sup.apply(config("c"))  # supersedes b: one restart for both
    sup.tick()
    assert sup.pid == first and sup.status().coalesced_changes == 1

    clock.now += 20  # 30 s after the first start
    until(lambda: sup.state == RUNNING and sup.pid != first, sup)
    assert not alive(first)
    attaches = env.events("attach")
    assert [e["specs"] for e in attaches] == [config("a"), config("c")]
    status = sup.status()
    assert (status.starts, status.restarts, status.crashes) == (2, 1, 0)
    assert status.last_exit.requested and status.default_scheduler_gap_s.last is not None
    assert not status.pending_change

    assert not sup.apply(config("c"))  # unchanged: nothing to do
    clock.now += 1
    assert sup.apply(config("a"))
    clock.now += 5  # the batch delay is over, the rate limit is not
    sup.tick()
    assert sup.pid == attaches[1]["pid"] and sup.status().next_restart_in_s == 24
    clock.now += 24
    until(lambda: sup.state == RUNNING and sup.pid != attaches[1]["pid"], sup)
    assert sup.status().restarts == 2 and env.events("attach")[-1]["specs"] == config("a")


def test_the_options_a_config_was_rendered_for_are_on_its_command_line(env):
    """--allow-partial-core comes with the config that needs it (render.py): the same layers with
    other options are another run, and a restart."""
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(min_interval_s=0, batch_s=0))
    sup.apply(config("a"), ("--allow-partial-core",))
    until(lambda: sup.state == RUNNING, sup)
    first = sup.pid
    assert env.events("attach")[0]["argv"] == ["--allow-partial-core", f"f:{sup.config_path}"]
    assert sup.status().args == ("--allow-partial-core",)
    assert not sup.apply(config("a"), ("--allow-partial-core",))
    assert sup.apply(config("a"))
    until(lambda: sup.state == RUNNING and sup.pid != first, sup)
    assert env.events("attach")[-1]["argv"] == [f"f:{sup.config_path}"] and sup.status().args == ()


def test_change_back_to_the_running_config_cancels_the_restart(env):
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(min_interval_s=10, batch_s=1))
    sup.apply(config("a"))
    until(lambda: sup.state == RUNNING, sup)
    sup.apply(config("b"))
    assert sup.status().pending_change
    sup.apply(config("a"))
    assert not sup.status().pending_change
    clock.now += 60
    sup.tick()
    assert sup.status().starts == 1 and len(env.events("attach")) == 1


def test_unrequested_exit_is_a_crash_and_scx_comes_back_after_backoff(env):
    sup = env.supervisor(policy=RestartPolicy(crash_backoff_s=0.2, crash_limit=3))
    attaches = []
    sup.on_attach = attaches.append  # whoever carries the plan meanwhile is told each way
    sup.apply(config("db"))
    sup.start()
    until(lambda: sup.state == RUNNING)
    until(lambda: attaches == [True])
    first = sup.pid
    os.kill(first, signal.SIGKILL)
    fake_sysfs(env.sysfs, "disabled")  # what the kernel does when a scheduler's process dies
    until(lambda: sup.status().crashes == 1)
    assert sup.status().last_exit.reason == "killed by signal 9"
    until(lambda: sup.state == RUNNING and sup.pid != first)
    until(lambda: attaches == [True, False, True])
    status = sup.status()
    assert (status.starts, status.crash_restarts, status.safe_mode) == (2, 1, False)
    assert env.safe_modes == []


def test_a_clean_stop_from_outside_is_not_a_crash(env):
    """Stand-in (the real one needs sched_ext and root; the VM test saw it): `systemctl stop temperd`
    signals the whole unit, so the real scx_layered got SIGTERM before temperd's own stop and exited
    0 with `EXIT: unregistered from user space`. That counted as a crash and put the backend in safe
    mode as it stopped. Such an exit is counted apart; scx_layered comes back after the backoff."""
    sup = env.supervisor(policy=RestartPolicy(crash_backoff_s=0.2, crash_limit=1))
    sup.apply(config("db"))
    sup.start()
    until(lambda: sup.state == RUNNING)
    first = sup.pid
    os.kill(first, signal.SIGTERM)
    try:
        until(lambda: sup.status().outside_stops == 1)
    finally:
        print("after SIGTERM:", sup.status())  # what it was taken for, if not an outside stop
    status = sup.status()
    assert (status.crashes, status.safe_mode) == (0, False)
    assert status.last_exit.code == 0 and "unregistered from user space" in status.last_exit.reason
    assert not os.path.exists(os.path.join(env.state_dir, "scx_layered.crash.log"))
    until(lambda: sup.state == RUNNING and sup.pid != first)
    assert env.safe_modes == []


def test_crash_loop_enters_safe_mode(env):
    policy = RestartPolicy(crash_limit=3, crash_window_s=60, crash_backoff_s=0.05)
    sup = env.supervisor(policy=policy, FAKE_SCX_CRASH_AFTER=0.2, FAKE_SCX_CRASH_CODE=1)
    sup.apply(config("db"))
    sup.start()
    until(lambda: sup.safe_mode)
    status = sup.status()
    assert status.state == SAFE_MODE and status.pid is None
    assert (status.starts, status.crashes, status.crash_restarts) == (3, 3, 2)
    reason = sup.safe_mode_reason
    assert reason.startswith("scx_layered exited 3 times within 60 s (last: EXIT: runnable task stall (stand-in crash))")
    assert env.safe_modes == [reason]
    assert status.last_exit.code == 1 and not status.last_exit.requested
    with open(os.path.join(env.state_dir, "scx_layered.crash.log")) as handle:
        assert "DEBUG DUMP" in handle.read()
    assert not any(alive(e["pid"]) for e in env.events("attach"))
    sup.apply(config("db", "web"))  # safe mode: no more starts
    holds(lambda: sup.status().starts == 3, 0.3, "no start in safe mode")


def test_first_crash_waits_its_backoff(env):
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(crash_backoff_s=4), FAKE_SCX_CRASH_AFTER=0.1)
    sup.apply(config("db"))
    until(lambda: sup.status().crashes == 1, sup)
    assert sup.state == BACKOFF
    clock.now += 3.9
    sup.tick()
    assert sup.status().starts == 1
    clock.now += 0.2
    sup.tick()
    assert sup.status().starts == 2


def test_refuses_to_start_beside_another_scheduler(env):
    fake_sysfs(env.sysfs, "enabled", "rustland_1.0.3")
    sup = env.supervisor()
    sup.apply(config("db"))
    sup.tick()
    assert sup.state == REFUSED and sup.safe_mode and sup.pid is None
    assert "sched_ext scheduler 'rustland_1.0.3' is loaded" in sup.safe_mode_reason
    assert env.safe_modes == [sup.safe_mode_reason] and env.events("attach") == []
    fake_sysfs(env.sysfs, "disabled")
    sup.clear_safe_mode()
    until(lambda: sup.state == RUNNING, sup)
    assert not sup.safe_mode


def test_no_attach_within_the_timeout_counts_as_a_crash(env):
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(attach_timeout_s=5), FAKE_SCX_ATTACH_DELAY=30)
    sup.apply(config("db"))
    sup.tick()
    pid = sup.pid
    assert pid is not None and sup.state != RUNNING
    clock.now += 6
    sup.tick()
    assert not alive(pid) and sup.status().crashes == 1
    assert "did not attach" in sup.status().last_exit.reason


def test_invalid_config_is_rejected_before_anything_starts(env):
    sup = env.supervisor()
    bad = config("db")
    bad[0]["kind"]["Confined"]["cpus_pct"] = [0.1, 0.2]
    with pytest.raises(ScxConfigError, match=r"renamed-key"):
        sup.apply(bad)
    sup.tick()
    assert sup.pid is None and env.events("attach") == []


def test_stats_client_reports_errors(env):
    sup = env.supervisor()
    sup.apply(config("db"))
    until(lambda: sup.state == RUNNING, sup)
    client = StatsClient(env.socket)
    try:
        assert "layers" in client.request({"req": "stats", "args": {"target": "top"}})
        with pytest.raises(StatsError, match="Invalid argument"):
            client.request({"req": "bogus"})
    finally:
        client.close()


def test_own_scheduler_still_unloading_is_waited_for_not_refused(env):
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(crash_backoff_s=1, busy_grace_s=5))
    sup.apply(config("db"))
    until(lambda: sup.state == RUNNING, sup)
    os.kill(sup.pid, signal.SIGKILL)  # the fake sysfs keeps saying "enabled", as the kernel briefly does
    until(lambda: sup.status().crashes == 1, sup)
    clock.now += 1.5
    sup.tick()
    assert not sup.safe_mode and sup.status().starts == 1
    fake_sysfs(env.sysfs, "disabled")
    clock.now += 1
    until(lambda: sup.state == RUNNING, sup)
    assert sup.status().starts == 2


def test_a_scheduler_that_stays_loaded_is_refused_after_the_grace(env):
    clock = FakeClock()
    sup = env.supervisor(clock=clock, policy=RestartPolicy(crash_backoff_s=1, busy_grace_s=5))
    sup.apply(config("db"))
    until(lambda: sup.state == RUNNING, sup)
    os.kill(sup.pid, signal.SIGKILL)
    until(lambda: sup.status().crashes == 1, sup)
    clock.now += 1.5
    sup.tick()
    clock.now += 5
    sup.tick()
    assert sup.state == REFUSED and "'layered_1.1.2_stand-in' is loaded" in sup.safe_mode_reason


DAEMON = """
import sys, time
from temperd.backends.scx.supervisor import ScxSupervisor
sup = ScxSupervisor(sys.argv[1], sys.argv[2], sys.argv[3], sysfs_root=sys.argv[4],
                    env={"FAKE_SCX_STATS_SOCKET": sys.argv[3], "FAKE_SCX_RECORD": sys.argv[5]})
sup.apply(%r)
sup.start()
while sup.state != "running":
    time.sleep(0.02)
print(sup.pid, flush=True)
time.sleep(60)
"""


def test_scx_layered_does_not_outlive_a_killed_daemon(env):
    import subprocess
    import sys

    daemon = subprocess.Popen([sys.executable, "-c", DAEMON % (config("db"),), STANDIN, env.state_dir, env.socket,
                               env.sysfs, env.record], stdout=subprocess.PIPE)
    try:
        child = int(daemon.stdout.readline())
        assert alive(child)
        daemon.kill()
        daemon.wait(WAIT_S)
        until(lambda: not alive(child))
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        daemon.stdout.close()


@pytest.mark.parametrize("owner, mode, expected", [
    (65534, 0o755, "owned by uid 65534, expected root"),
    (0, 0o777, "writable by others"),
])
def test_an_untrusted_binary_is_never_run(env, tmp_path, owner, mode, expected):
    """temperd runs scx_layered as root: a binary (or a directory holding it) that someone else
    can replace is refused, with the reason, and nothing is started. (The stand-in is copied.)"""
    directory = tmp_path / "bin"
    directory.mkdir()
    binary = directory / "scx_layered"
    shutil.copy(STANDIN, binary)
    os.chown(binary, owner, 0)
    os.chmod(binary, mode)
    sup = ScxSupervisor(str(binary), env.state_dir, env.socket, sysfs_root=env.sysfs, env={
        "FAKE_SCX_STATS_SOCKET": env.socket, "FAKE_SCX_SYSFS": env.sysfs, "FAKE_SCX_RECORD": env.record},
        on_safe_mode=env.safe_modes.append)
    env.supervisors.append(sup)
    sup.apply(config("db"))
    sup.start()
    until(lambda: sup.safe_mode)
    assert expected in sup.safe_mode_reason and str(binary) in sup.safe_mode_reason
    assert sup.status().starts == 0 and env.events("attach") == []
    os.chown(binary, 0, 0)
    os.chmod(binary, 0o755)
    directory.chmod(0o777)  # the file is fine now, its directory is not
    from temperd.backends.scx.detect import binary_trust_problem
    assert "writable by others" in binary_trust_problem(str(binary))


def test_a_config_asked_for_while_scx_layered_starts_waits_for_its_restart():
    from temperd.backends.scx.restarts import PlanChanges, RestartPolicy

    changes = PlanChanges(RestartPolicy())
    assert changes.ask("A", process_runs=False, now=0.0)
    starting = changes.desired  # the start reads the config to run ...
    assert changes.ask("B", process_runs=False, now=0.5)  # ... and a newer one comes before it has started
    changes.started(starting, now=1.0)
    assert changes.running == "A" and changes.pending
    assert changes.restart_due(last_start=1.0) >= 1.0
    changes.started("B", now=9.0)
    assert not changes.pending
