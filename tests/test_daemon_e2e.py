"""End to end: temperd as a subprocess with a temporary config dir and a real memcached.

Matched and treated (read back from /proc), visible in `temperctl status --json` and /observe;
an edited profile is applied live; a broken one is reported while the previous plan stays;
stopping the daemon restores every thread it changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import servers as S
from test_metrics_http import hold_idle
from temperd.control.client import request
from temperd.daemon.main_loop import STARVED_RETRY_S
from thread_children import holds, steady, wait_for

pytestmark = [pytest.mark.servers, pytest.mark.slow]

BINDIR = os.path.dirname(sys.executable)
STARVED_PASSES = 3  # starved passes through which the plan in force must stay

PROFILE = """schema_version = 1
id = "memcached"
description = "test override of the builtin"
[fingerprint]
process_names = ["memcached"]
[[thread_groups]]
name = "workers"
thread_names = ["mc-worker"]
treatment = "exclusive"
[[thread_groups]]
name = "dispatch"
thread_names = ["memcached"]
treatment = "latency"
nice = {nice}
[[thread_groups]]
name = "maintenance"
catch_all = true
treatment = "yield"
yield_policy = "batch"
nice = 15
"""


def task_stat(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return {"nice": int(fields[16]), "policy": int(fields[38])}


def affinity(tid):
    return set(os.sched_getaffinity(tid))


def threads_by_name(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as handle:
            out.setdefault(handle.read().strip(), []).append(int(tid))
    return out


class Temperd:
    def __init__(self, tmp_path):
        self.config_dir = tmp_path / "etc"
        self.profiles = self.config_dir / "profiles.d"
        self.profiles.mkdir(parents=True, exist_ok=True)
        self.state_dir = tmp_path / "run"
        self.socket = str(self.state_dir / "temperd.sock")
        self.port = S.free_port()
        self.write_config()
        self.log = open(tmp_path / "temperd.log", "w+")
        self.proc = None

    def write_config(self, port=None, listen="127.0.0.1", socket=None, history=True):
        """history: name a rightsizing history file in the test's directory (False: the caller's
        own [rightsizing] table names one); never the host's, which other tests' daemons share."""
        (self.config_dir / "temperd.toml").write_text(
            f'backend = "native"\nstate_dir = "{self.state_dir}"\nreconcile_interval_s = 2.0\n'
            + (f'[rightsizing]\nhistory_file = "{self.state_dir.parent / "history.json"}"\n' if history else "")
            + f'[http]\nlisten = "{listen}"\nport = {self.port if port is None else port}\n'
            f'[control]\nsocket = "{socket or self.socket}"\n')  # [control] last: tests add to it

    def start(self, nofile=None):
        """nofile: RLIMIT_NOFILE of the daemon (systemd's LimitNOFILE)."""
        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen([os.path.join(BINDIR, "temperd"), "--config", str(self.config_dir)],
                                     stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=limit if nofile else None)
        wait_for(lambda: os.path.exists(self.socket) or self.proc.poll() is not None, 20, "the control socket")
        assert self.proc.poll() is None, self.logtext()

    def temperctl(self, *args):
        return subprocess.run([os.path.join(BINDIR, "temperctl"), *args, "--socket", self.socket],
                              capture_output=True, text=True, timeout=60)

    def open_fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def status(self):
        out = subprocess.run([os.path.join(BINDIR, "temperctl"), "status", "--json", "--socket", self.socket],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def observe(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/observe", timeout=10) as reply:
            return json.load(reply)

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def memcached():
    try:
        with S.memcached_server(threads=1) as server:
            yield server
    except S.ServerUnavailable as exc:
        pytest.skip(str(exc))


def memcached_profile(nice, ownership):
    """PROFILE with the workers' CPUs fenced where asked (owned is the default)."""
    text = PROFILE.format(nice=nice)
    if ownership == "fenced":
        text = text.replace('treatment = "exclusive"\n', 'treatment = "exclusive"\nownership = "fenced"\n', 1)
    return text


@pytest.mark.parametrize("ownership", ["owned", "fenced"])
def test_daemon_matches_treats_reloads_and_restores(tmp_path, spawn, ownership):
    bystander = spawn("tmpd-bystander")
    bystander.wait_ready()
    before_bystander = affinity(bystander.pid)
    with memcached() as server:
        names = threads_by_name(server.pid)
        (worker,) = names["mc-worker"]
        main_tid = server.pid
        lru = names["mc-lrumaint"][0]
        original = {tid: (task_stat(server.pid, tid), affinity(tid)) for tid in (worker, main_tid, lru)}
        temperd_ = Temperd(tmp_path)
        temperd_.profiles.joinpath("memcached.toml").write_text(memcached_profile(-7, ownership))
        temperd_.start()
        try:
            status = wait_for(lambda: (s := temperd_.status()) and any(w["profile"] == "memcached" for w in s["workloads"]) and s,
                              what="memcached matched in status")
            (workload,) = [w for w in status["workloads"] if w["profile"] == "memcached"]
            assert server.pid in workload["pids"]
            assert status["backend"]["active"] == "native"
            assert status["profiles"]["failed"] == []
            # Treated, as read back from the kernel.
            wait_for(lambda: task_stat(server.pid, main_tid)["nice"] == -7, what="dispatch nice -7")
            assert affinity(worker) == {1}, "the exclusive worker owns CPU 1"
            assert task_stat(server.pid, lru) == {"nice": 15, "policy": 3}, "maintenance is SCHED_BATCH nice 15"
            if ownership == "fenced":
                wait_for(lambda: affinity(bystander.pid) == {0}, what="other threads kept off CPU 1")
            observe = temperd_.observe()
            (workers,) = [layer for layer in observe["layers"] if layer["name"].endswith(".workers")]
            assert workers["cpus"] == [1] and workers["ownership"] == ownership, workers
            if ownership == "owned":  # the plan is applied (nice -7 above): others may still borrow CPU 1
                assert affinity(bystander.pid) == before_bystander
            # The daemon explains a thread from its own plan.
            reply = request(temperd_.socket, "explain", id=worker)
            assert reply["ok"], reply
            why = reply["explain"]
            assert (why["pid"], why["tid"], why["workload"]["profile_id"]) == (server.pid, worker, "memcached")
            (thread,) = why["threads"]
            explained = why["layers"][thread["layer"]]
            assert thread["group"] == "workers", thread
            assert (explained["kind"], explained["cpus"], explained["ownership"]) == ("Confined", [1], ownership)
            assert not request(temperd_.socket, "explain", id=999999999)["ok"]

            # An edited profile is applied live.
            generation = status["generation"]
            temperd_.profiles.joinpath("memcached.toml").write_text(memcached_profile(-3, ownership))
            wait_for(lambda: task_stat(server.pid, main_tid)["nice"] == -3, 5, "edited profile applied")
            assert temperd_.status()["generation"] == generation + 1

            # A broken profile is reported; the running plan stays.
            temperd_.profiles.joinpath("broken.toml").write_text('schema_version = 1\nid = "broken"\n[[thread_groups]]\nname = "x"\n')
            status = wait_for(lambda: (s := temperd_.status()) and not s["last_reload"]["ok"] and s, 5, "reload refused")
            assert any("broken.toml" in p and "treatment" in p for p in status["last_reload"]["problems"])
            assert status["generation"] == generation + 1  # the refused reload is done: no new plan
            assert task_stat(server.pid, main_tid)["nice"] == -3 and affinity(worker) == {1}
        finally:
            code = temperd_.stop()
        log = temperd_.logtext()
        assert code == 0, log
        # Everything restored.
        for tid, (stat, cpus) in original.items():
            assert task_stat(server.pid, tid) == stat, (tid, log)
            assert affinity(tid) == cpus
        assert affinity(bystander.pid) == before_bystander


# ---- trust and resilience: start-up failures, reloads that move HTTP, idle connections, EMFILE ----

YIELDER = """schema_version = 1
id = "fdtest"
description = "every thread of the tmpd-fd* test processes yields"
[fingerprint]
process_names = ["tmpd-fd1", "tmpd-fd2", "tmpd-fd3"]
[[thread_groups]]
name = "all"
catch_all = true
treatment = "yield"
yield_policy = "batch"
nice = 12
"""
YIELDED = {"nice": 12, "policy": 3}  # SCHED_BATCH


def yielded(pid):
    return task_stat(pid, pid) == YIELDED


def get(port, path, timeout=10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
        return reply.status


NAMED = "import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); time.sleep(600)"


@pytest.fixture
def named():
    """named(NAME): a process whose comm is NAME (started without select(): the test may hold
    more than FD_SETSIZE descriptors), killed afterwards."""
    started = []

    def start(name):
        proc = subprocess.Popen([sys.executable, "-c", NAMED, name], stdin=subprocess.DEVNULL)
        started.append(proc)
        wait_for(lambda: open(f"/proc/{proc.pid}/comm").read().strip() == name, 10, f"{name} named")
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_port_taken_at_start_fails_in_one_line_before_anything_changes(tmp_path, named):
    workload = named("tmpd-fd1")
    before = task_stat(workload.pid, workload.pid)
    temperd_ = Temperd(tmp_path)
    temperd_.profiles.joinpath("fdtest.toml").write_text(YIELDER)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", temperd_.port))
        taken.listen(1)
        out = subprocess.run([os.path.join(BINDIR, "temperd"), "--config", str(temperd_.config_dir), "--log-level",
                              "error"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr == (f"error: cannot listen on 127.0.0.1:{temperd_.port}: Address already in use ([http] listen "
                          f"and port in {temperd_.config_dir / 'temperd.toml'}, or --http-port)\n"), out.stderr
    assert task_stat(workload.pid, workload.pid) == before
    assert not os.path.exists(temperd_.socket)
    assert not os.path.exists(temperd_.state_dir / "native-state.json")


def test_a_failure_after_the_first_apply_restores_and_removes_the_socket(tmp_path, named, monkeypatch):
    """Anything failing once threads are changed: put back, the socket removed, one line, exit 1."""
    from click.testing import CliRunner

    from temperd.daemon import main as temperd_main
    from temperd.daemon.daemon import Daemon
    from temperd.daemon.services import Services

    workload = named("tmpd-fd1")
    before = task_stat(workload.pid, workload.pid)
    temperd_ = Temperd(tmp_path)
    temperd_.profiles.joinpath("fdtest.toml").write_text(YIELDER)
    seen = {}

    def serve_fails(self, *args):
        seen["treated"] = yielded(workload.pid)
        seen["socket"] = os.path.exists(temperd_.socket)
        seen["state"] = os.path.exists(temperd_.state_dir / "native-state.json")
        raise RuntimeError("the hotplug watcher could not start")

    monkeypatch.setattr(Services, "serve", serve_fails)
    monkeypatch.setattr(Daemon, "install_signal_handlers", lambda self: None)
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    result = runner.invoke(temperd_main.main, ["--config", str(temperd_.config_dir), "--log-level", "error"])
    assert seen == {"treated": True, "socket": True, "state": True}  # it failed after the first apply
    assert result.exit_code == 1, (result.stderr, result.exception)
    assert result.stderr == "error: cannot start: RuntimeError: the hotplug watcher could not start\n"
    assert task_stat(workload.pid, workload.pid) == before
    assert not os.path.exists(temperd_.socket)
    assert not os.path.exists(temperd_.state_dir / "native-state.json")


def test_missing_or_file_config_dir_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    for config in (tmp_path / "missing", tmp_path / "file"):
        for extra in ([], ["--check"]):
            out = subprocess.run([os.path.join(BINDIR, "temperd"), "--config", str(config), "--http-port", "0",
                                  "--state-dir", str(tmp_path / "run"), "--socket", str(tmp_path / "s.sock"), *extra],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
            assert out.stderr.startswith(f"error: {config}: ") and "expected the directory of temperd.toml" in out.stderr


def test_a_reload_moves_http_or_refuses_and_says_so(tmp_path):
    temperd_ = Temperd(tmp_path)
    temperd_.start()
    try:
        first = temperd_.port
        second = S.free_port()
        temperd_.write_config(port=second)
        out = temperd_.temperctl("reload")
        assert out.returncode == 0, out.stdout + out.stderr
        status = json.loads(temperd_.temperctl("status", "--json").stdout)
        # 2, or 3 where the config watcher also reloaded the edited file
        generation = status["generation"]
        assert status["http"] == f"http://127.0.0.1:{second}" and generation >= 2
        assert get(second, "/metrics") == 200
        with pytest.raises(OSError):
            get(first, "/metrics", timeout=2)

        # A port that is taken: refused, the old listener keeps serving, status says so. The port
        # stays taken until the checks are done: the config watcher reloads the edited file by
        # itself too, and would succeed once the port is free.
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            temperd_.write_config(port=port)
            out = temperd_.temperctl("reload")
            assert out.returncode == 1
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use; http://127.0.0.1:{second} keeps " \
                "serving" in out.stdout, out.stdout
            status = json.loads(temperd_.temperctl("status", "--json").stdout)
            # The refusal kept the generation in force. (The watcher's reload of the earlier edit
            # may land after `generation` was read, as a generation of its own: compared with
            # what the refusal says it kept, not with that number.)
            assert status["http"] == f"http://127.0.0.1:{second}" and status["generation"] >= generation
            last = status["last_reload"]
            assert not last["ok"] and last["generation"] == status["generation"] and get(second, "/metrics") == 200

        # What only a start takes is refused, not reported as done.
        temperd_.write_config(port=second, socket=str(tmp_path / "elsewhere.sock"))
        out = temperd_.temperctl("reload")
        assert out.returncode == 1 and "[control] socket changed from" in out.stdout and "restart" in out.stdout
        last = json.loads(temperd_.temperctl("status", "--json").stdout)["last_reload"]
        assert not last["ok"] and any("[control] socket changed from" in p for p in last["problems"])

        temperd_.write_config(port=0)
        assert temperd_.temperctl("reload").returncode == 0
        assert json.loads(temperd_.temperctl("status", "--json").stdout)["http"] is None
        with pytest.raises(OSError):
            get(second, "/metrics", timeout=2)
    finally:
        code = temperd_.stop()
    assert code == 0, temperd_.logtext()
    assert "Traceback" not in temperd_.logtext()


def test_idle_connections_and_running_out_of_descriptors_do_not_stop_temperd(tmp_path, named):
    """Any local user can open connections to /metrics. Under systemd's default LimitNOFILE=1024,
    1100 idle ones: temperd holds no more than its cap, still answers and still treats. With a
    limit its own connections reach (EMFILE), a main-loop pass is skipped, logged once, and the
    plan in force stays; once the connections are gone, new processes are treated again."""
    from temperd.observe.http import MAX_CONNECTIONS

    first = named("tmpd-fd1")
    temperd_ = Temperd(tmp_path)
    temperd_.profiles.joinpath("fdtest.toml").write_text(YIELDER)
    temperd_.start(nofile=1024)
    try:
        wait_for(lambda: yielded(first.pid), 20, "tmpd-fd1 treated")
        base = steady(temperd_.open_fds, "temperd's open descriptors")
        held = hold_idle(temperd_.port, 1100)
        try:
            assert len(held) >= MAX_CONNECTIONS + 500, len(held)
            assert temperd_.open_fds() <= base + MAX_CONNECTIONS + 4
            second = named("tmpd-fd2")
            wait_for(lambda: yielded(second.pid), 20, "tmpd-fd2 treated while 1100 connections are held")
            assert temperd_.temperctl("status").returncode == 0
            assert temperd_.proc.poll() is None
        finally:
            for sock in held:
                sock.close()
        assert get(temperd_.port, "/metrics") == 200
    finally:
        assert temperd_.stop() == 0, temperd_.logtext()

    # A limit that the HTTP connections alone exhaust.
    starved = Temperd(tmp_path)
    starved.profiles.joinpath("fdtest.toml").write_text(YIELDER)
    starved.start(nofile=base + 8)
    try:
        assert starved.temperctl("status").returncode == 0  # started: it serves
        assert yielded(first.pid)
        held = hold_idle(starved.port, 200)
        try:
            wait_for(lambda: "out of file descriptors" in starved.logtext(), 30,
                     f"a pass skipped for EMFILE (limit {base + 8}, {starved.open_fds()} open): {starved.logtext()}")
            third = named("tmpd-fd3")
            # Starved, temperd retries every STARVED_RETRY_S: what must stay true is checked all through
            # STARVED_PASSES retries, and the log's count below says that they were skipped passes.
            holds(lambda: starved.proc.poll() is None and yielded(first.pid), STARVED_PASSES * STARVED_RETRY_S,
                  f"temperd alive and the plan in force kept: {starved.logtext()}")
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: yielded(third.pid), 30, "tmpd-fd3 treated once descriptors are back")
        assert starved.temperctl("status").returncode == 0
        assert get(starved.port, "/metrics") == 200
        log = starved.logtext()
        assert log.count("out of file descriptors") == 1, log
        skipped = int(log.split("file descriptors available again after ")[1].split()[0])
        assert skipped >= STARVED_PASSES, log
        assert "file descriptors available again" in log and "Traceback" not in log, log
    finally:
        assert starved.stop() == 0, starved.logtext()
    assert task_stat(first.pid, first.pid) != YIELDED
