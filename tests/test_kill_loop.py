"""temperd killed with SIGKILL at moments of start-up and apply, a dozen times over, while the
workload keeps forking children (which inherit whatever treatment their creator had) — then one
clean start and stop. Afterwards every thread on the host has its original affinity, policy and
nice again, and temperd's state directory holds no leftover file.

Each kill comes at a stage of the run that the test sees happen (STAGES), in an order shuffled by
the seed: while the interpreter starts, as the backend starts (the last run's record restored and
the first plan applied next), once it runs, and while it handles the workload's next fork."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from test_daemon_e2e import Temperd, task_stat, threads_by_name
from thread_children import wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

KILLS = 12
SEED = int(os.environ.get("TMPD_KILL_SEED", "20261123"))

# One thread in the exclusive group: a group of two would get no CPU of its own on a 2-CPU host
# (a Grouped layer, which moves nothing), and the forker's children are to inherit a real pinning.
PROFILE = """schema_version = 1
id = "tmpd-kill9"
description = "test: every kind of treatment"
[fingerprint]
process_names = ["tmpd-kill9"]
[[thread_groups]]
name = "hot"
thread_names = ["kw-fork"]
treatment = "exclusive"
[[thread_groups]]
name = "wake"
thread_names = ["kl-*"]
treatment = "latency"
nice = -5
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
yield_policy = "batch"
nice = 10
"""

# The workload: named threads of each group, and a forker (in the yield group, and one in the
# exclusive group) that starts a child process every 0.2 s; children live 3 s.
WORKLOAD = textwrap.dedent("""
    import ctypes, os, sys, threading, time
    libc = ctypes.CDLL(None)
    def name(text):
        libc.prctl(15, text.encode(), 0, 0, 0)
    name("tmpd-kill9")
    end = time.monotonic() + float(sys.argv[1])
    def sleeper(comm):
        name(comm)
        while time.monotonic() < end:
            time.sleep(0.2)
    def forker(comm):
        name(comm)
        while time.monotonic() < end:
            pid = os.fork()
            if pid == 0:
                time.sleep(3)
                os._exit(0)
            time.sleep(0.2)
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
    for comm in ("kw-0", "kl-0", "bg-0"):
        threading.Thread(target=sleeper, args=(comm,), daemon=True).start()
    threading.Thread(target=forker, args=("kw-fork",), daemon=True).start()
    threading.Thread(target=forker, args=("bg-fork",), daemon=True).start()
    print("ready", flush=True)
    while time.monotonic() < end:
        time.sleep(0.2)
""")


def settings_of_every_thread():
    """(affinity, policy, nice) of every thread on the host, keyed by (tid, start time)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                    data = handle.read()
                fields = data[data.rindex(b")") + 2:].split()
                key = (int(tid), int(fields[19]))
                out[key] = (frozenset(os.sched_getaffinity(int(tid))), int(fields[38]), int(fields[16]),
                            int(pid), data[data.index(b"(") + 1:data.rindex(b")")].decode(errors="replace"))
            except (OSError, ValueError):
                continue
    return out


def matched(daemon) -> bool:
    try:
        return any(w["profile"] == "tmpd-kill9" for w in daemon.status()["workloads"])
    except AssertionError:  # not answering yet
        return False


def applied(pid: int) -> bool:
    """The profile in force on the workload: its latency thread at nice -5, the rest at nice 10."""
    names = threads_by_name(pid)
    return ("kl-0" in names and "bg-0" in names and all(task_stat(pid, tid)["nice"] == -5 for tid in names["kl-0"])
            and all(task_stat(pid, tid)["nice"] == 10 for tid in names["bg-0"]))


def children_of(pid: int) -> set:
    """The pids of the processes that pid's threads forked and that still run."""
    found = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.update(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


class Run:
    """One temperd run: its process, and the lines it logged (those after its start)."""

    def __init__(self, proc: subprocess.Popen, log_path, workload_pid: int):
        self.proc, self.log_path, self.workload_pid = proc, log_path, workload_pid
        self.offset = os.path.getsize(log_path)
        self.started = time.monotonic()
        self.children_at_run: set = set()

    def logged(self, text: str) -> bool:
        with open(self.log_path, "rb") as handle:
            handle.seek(self.offset)
            return text.encode() in handle.read()

    def handling_a_fork(self) -> bool:
        """Running, and the workload forked a child since: the kill comes as temperd takes it in."""
        if not self.logged("running: "):
            return False
        now = children_of(self.workload_pid)
        if not self.children_at_run:
            self.children_at_run = now or {0}
            return False
        return bool(now - self.children_at_run)


# Where a kill comes, each seen happen: (name, reached(run)).
STAGES = (
    ("interpreter start", lambda run: True),
    ("backend start", lambda run: run.logged("backend native: ")),  # recovery and the first apply follow
    ("running", lambda run: run.logged("running: ")),
    ("a fork after the start", Run.handling_a_fork),
)


def test_kill_9_during_start_and_apply_then_a_clean_run_leaves_every_thread_as_it_was(tmp_path):
    rng = random.Random(SEED)
    online = frozenset(os.sched_getaffinity(0))
    before = settings_of_every_thread()
    workload = subprocess.Popen([sys.executable, "-c", WORKLOAD, "60"], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    daemon = Temperd(tmp_path)
    daemon.profiles.joinpath("kill9.toml").write_text(PROFILE)
    try:
        assert workload.stdout.readline().strip() == "ready"
        stages = [STAGES[i % len(STAGES)] for i in range(KILLS)]
        rng.shuffle(stages)
        log_path = tmp_path / "temperd.log"
        kill_times = []
        for stage, reached in stages:
            daemon.log.flush()
            run = Run(subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "temperd"), "--config",
                                        str(daemon.config_dir)], stdout=daemon.log, stderr=subprocess.STDOUT),
                      log_path, workload.pid)
            daemon.proc = run.proc
            wait_for(lambda: reached(run) or run.proc.poll() is not None, 30,
                     f"temperd's run to reach the stage {stage!r} (kills so far: {kill_times})")
            assert run.proc.poll() is None, f"temperd ended before {stage!r}: " + daemon.logtext()[-3000:]
            kill_times.append(f"{stage} at {time.monotonic() - run.started:.2f} s")
            run.proc.send_signal(signal.SIGKILL)
            run.proc.wait()
            forked = children_of(workload.pid)
            wait_for(lambda: children_of(workload.pid) - forked, 10,
                     "the workload to fork a child while no temperd runs")
        daemon.start()  # a killed run's socket file may still be there: wait for an answer
        wait_for(lambda: matched(daemon), 20, "the workload matched after the kills")
        wait_for(lambda: applied(workload.pid), 20, "the clean run's treatment on the workload's threads")
        assert daemon.stop() == 0, daemon.logtext()[-3000:]
        after = settings_of_every_thread()
        ours = {key for key, value in after.items()
                if value[4] in ("tmpd-kill9", "kw-0", "kl-0", "bg-0", "kw-fork", "bg-fork")}
        wrong = []
        for key in ours:
            affinity, policy, nice, pid, comm = after[key]
            if (affinity, policy, nice) != (online, 0, 0):
                wrong.append(f"{comm} {key[0]} (pid {pid}): cpus {sorted(affinity)}, policy {policy}, nice {nice}")
        for key, value in before.items():
            now = after.get(key)
            if now is not None and now[:3] != value[:3]:
                wrong.append(f"{value[4]} {key[0]}: was {value[:3]}, now {now[:3]}")
        assert not wrong, f"kills {kill_times} (seed {SEED}):\n" + "\n".join(wrong[:20])
        left = sorted(name for name in os.listdir(daemon.state_dir) if name != "temperd.lock")
        assert left == [], f"files left in the state directory: {left}"
        assert len(ours) > 6  # the workload's threads and some children were there to check
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
        os.killpg(workload.pid, signal.SIGKILL)
        workload.wait()
