"""A real process that tests drive over stdin: it names itself and its threads at the OS level,
renames threads, rewrites its process title, forks, and exits on command."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

# A process the test drives over stdin: it names itself and its threads with prctl(PR_SET_NAME)
# from inside each thread, renames threads from outside with pthread_setname_np, and can rewrite
# its process title over the argv area the way PostgreSQL does.
WORKLOAD = r"""
import ctypes, os, signal, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.pthread_setname_np.argtypes = [ctypes.c_ulong, ctypes.c_char_p]
threading.stack_size(256 * 1024)

def set_name(name):
    libc.prctl(15, name.encode(), 0, 0, 0)

class Worker(threading.Thread):
    def __init__(self, name, spin_s=0.0):
        super().__init__(daemon=True)
        self.os_name, self.spin_s = name, spin_s
        self.stop, self.ready = threading.Event(), threading.Event()
    def run(self):
        set_name(self.os_name)
        self.tid = threading.get_native_id()
        deadline = time.monotonic() + 3
        while time.thread_time() < self.spin_s and time.monotonic() < deadline:
            pass
        self.ready.set()
        self.stop.wait()

def rewrite_title(title):
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end = int(fields[45]), int(fields[46])
    data = title.encode()[: arg_end - arg_start - 1]
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(arg_start)
        mem.write(data + b"\0" * (arg_end - arg_start - len(data)))

set_name(sys.argv[1])
workers = {}
print("ready", flush=True)
for line in sys.stdin:
    cmd, *args = line.split(None, 1)
    args = args[0].split() if args and cmd not in ("title", "fork") else args
    if cmd == "thread" or cmd == "spin":
        w = Worker(args[0], 0.05 if cmd == "spin" else 0.0)
        w.start()
        w.ready.wait()
        workers[w.tid] = w
        print(w.tid, flush=True)
    elif cmd == "burst":
        tids = []
        for i in range(int(args[0])):
            w = Worker("%s%d" % (args[1], i))
            w.start()
            w.ready.wait()
            workers[w.tid] = w
            tids.append(w.tid)
        print(" ".join(map(str, tids)), flush=True)
    elif cmd == "rename":
        print(libc.pthread_setname_np(workers[int(args[0])].ident, args[1].encode()), flush=True)
    elif cmd == "stop":
        w = workers.pop(int(args[0]))
        w.stop.set()
        w.join()
        print("ok", flush=True)
    elif cmd == "title":
        rewrite_title(args[0].strip())
        print("ok", flush=True)
    elif cmd == "fork":
        # A prefork server's child: no exec; sets its title when told (SIGUSR1).
        child = os.fork()
        if child == 0:
            libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGKILL when the parent goes
            signal.signal(signal.SIGUSR1, lambda *_: rewrite_title(args[0].strip()))
            set_name("tmpd-forked")  # ready for the signal
            time.sleep(10)
            os._exit(0)
        print(child, flush=True)
    elif cmd == "leader-exit":
        def survivor():
            set_name("tmpd-survivor")
            print(threading.get_native_id(), flush=True)
            sys.stdin.readline()
            os._exit(0)
        threading.Thread(target=survivor).start()
        libc.pthread_exit(None)  # the main (leader) thread ends; the process lives on
    elif cmd == "exit":
        break
"""


class DrivenProcess:
    def __init__(self, name: str, env=None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD, name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        self.pid = self.proc.pid

    def wait_ready(self) -> None:
        assert self._readline() == "ready"

    def _readline(self, timeout: float = 10.0) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the workload process did not answer"
        return self.proc.stdout.readline().strip()

    def command(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._readline()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def spawn_at_pid(spawn, pid: int, name: str) -> DrivenProcess:
    """Really reuse `pid`: set the kernel's last allocated pid just below it and fork."""
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"{NS_LAST_PID} is not writable (needs CAP_SYS_ADMIN in the initial pid namespace)")
    for _ in range(50):
        if os.path.exists(f"/proc/{pid}"):
            break  # another process took it
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        workload = spawn(name)
        if workload.pid == pid:
            return workload
        workload.close()
    pytest.skip(f"could not have pid {pid} reused: the host forks too fast")
