"""End to end: temperd as a subprocess with a temporary config dir and a real memcached.

Matched and treated (read back from /proc), visible in `temperctl status --json` and /observe;
an edited profile is applied live; a broken one is reported while the previous plan stays;
stopping the daemon restores every thread it changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import servers as S
from temperd.daemon.control import request
from thread_children import wait_for

pytestmark = [pytest.mark.servers, pytest.mark.slow]

BINDIR = os.path.dirname(sys.executable)

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
        self.profiles.mkdir(parents=True)
        self.state_dir = tmp_path / "run"
        self.socket = str(self.state_dir / "temperd.sock")
        self.port = S.free_port()
        (self.config_dir / "temperd.toml").write_text(
            f'backend = "native"\nstate_dir = "{self.state_dir}"\nreconcile_interval_s = 2.0\n'
            f'[http]\nport = {self.port}\n[control]\nsocket = "{self.socket}"\n')
        self.log = open(tmp_path / "temperd.log", "w+")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([os.path.join(BINDIR, "temperd"), "--config", str(self.config_dir)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(self.socket) or self.proc.poll() is not None, 20, "the control socket")
        assert self.proc.poll() is None, self.logtext()

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


def test_daemon_matches_treats_reloads_and_restores(tmp_path, spawn):
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
        temperd_.profiles.joinpath("memcached.toml").write_text(PROFILE.format(nice=-7))
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
            wait_for(lambda: affinity(bystander.pid) == {0}, what="other threads kept off CPU 1")
            observe = temperd_.observe()
            assert any(layer["name"].endswith(".workers") and layer["cpus"] == [1] for layer in observe["layers"])
            # The daemon explains a thread from its own plan.
            reply = request(temperd_.socket, "explain", id=worker)
            assert reply["ok"], reply
            why = reply["explain"]
            assert (why["pid"], why["tid"], why["workload"]["profile_id"]) == (server.pid, worker, "memcached")
            (thread,) = why["threads"]
            assert thread["group"] == "workers" and why["layers"][thread["layer"]] == {"kind": "Confined", "cpus": [1]}
            assert not request(temperd_.socket, "explain", id=999999999)["ok"]

            # An edited profile is applied live.
            generation = status["generation"]
            temperd_.profiles.joinpath("memcached.toml").write_text(PROFILE.format(nice=-3))
            wait_for(lambda: task_stat(server.pid, main_tid)["nice"] == -3, 5, "edited profile applied")
            assert temperd_.status()["generation"] == generation + 1

            # A broken profile is reported; the running plan stays.
            temperd_.profiles.joinpath("broken.toml").write_text('schema_version = 1\nid = "broken"\n[[thread_groups]]\nname = "x"\n')
            status = wait_for(lambda: (s := temperd_.status()) and not s["last_reload"]["ok"] and s, 5, "reload refused")
            assert any("broken.toml" in p and "treatment" in p for p in status["last_reload"]["problems"])
            assert status["generation"] == generation + 1
            time.sleep(0.3)
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
