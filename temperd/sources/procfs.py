"""Reading /proc: one function per fact.

Two things can keep a fact from being read, and they mean different things: the task is gone
(ENOENT, ESRCH: it exited between listing and reading, which is normal) — TaskGone — or the
fact is not ours to read (EACCES, EPERM: another user's process without privilege, a /proc
mounted with hidepid) — AccessDenied. `read_file` and the `*_strict` readers raise them; the
other readers return None for either, for callers to which both mean "not known now". Nothing
here logs: a vanished task is not an error. Reads use os.open/os.read on bytes because this runs for every thread of the
host on each reconcile and the buffered text layer costs more than the read itself.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

from temperd.files import kernel_lines
from temperd.sources.shape import parse_cpulist
from temperd.sources.facts import systemd_cgroup, unit_from_cgroup

PROC = "/proc"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of stat's times (USER_HZ)


def boot_ticks() -> int:
    """Now, in the clock of a task's start time in /proc/PID/stat (clock ticks after boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLOCK_TICKS)


# Errors that mean "the task is gone" (EINVAL: a file of a task being torn down) or "not ours to
# read": expected, silent.
_GONE = frozenset((errno.ENOENT, errno.ESRCH, errno.EINVAL))
_DENIED = frozenset((errno.EACCES, errno.EPERM))
_QUIET = _GONE | _DENIED


class ProcReadError(Exception):
    """A fact of a task that could not be read; `path` says which."""

    def __init__(self, path: str, err: int):
        super().__init__(f"{path}: {os.strerror(err)}")
        self.path = path
        self.errno = err


class TaskGone(ProcReadError):
    """The task exited (or its id was never a task's): normal, counted only."""


class AccessDenied(ProcReadError):
    """The task exists but this fact is not ours to read."""


def _read_error(path: str, exc: OSError) -> Optional[ProcReadError]:
    """TaskGone or AccessDenied for an expected error; None for any other (the caller raises it)."""
    if exc.errno in _GONE:
        return TaskGone(path, exc.errno)
    if exc.errno in _DENIED:
        return AccessDenied(path, exc.errno)
    return None

PF_KTHREAD = 0x00200000  # task flag (stat field 9): a kernel thread
KTHREADD_PID = 2


class TaskStat(NamedTuple):
    """The fields of /proc/PID/task/TID/stat (or /proc/PID/stat, a whole process) that temperd
    reads: the one parse of a stat line."""

    comm: str
    state: str
    ppid: int
    flags: int
    nice: int
    start_time: int  # clock ticks after boot: identity of the task across pid reuse
    last_cpu: int
    policy: int
    cpu_ticks: int = 0  # utime + stime (for /proc/PID/stat: every thread of the process, dead ones included)
    major_faults: int = 0
    blkio_ticks: int = 0  # delayacct_blkio_ticks: block I/O delay; 0 unless kernel.task_delayacct is on
    num_threads: int = 0  # the process's threads (a per-thread file says its process's too)


@dataclass(frozen=True)
class CgroupPaths:
    """A process's cgroup: the v2 path (`0::` line) and, on hybrid hosts, the name=systemd one;
    where the cpu controller is bound to a v1 hierarchy, the path in that one."""

    unified: Optional[str]
    systemd: Optional[str]
    cpu_v1: Optional[str] = None
    # Why the file was refused (a line that is not hierarchy:controllers:/path): then no path is
    # known, so the process has no unit rather than one a crafted line names.
    refused: Optional[str] = None

    @property
    def unit(self) -> Optional[str]:
        return unit_from_cgroup(systemd_cgroup(self.unified, self.systemd))


def read_file(path: str, size: int = 4096, single: bool = False) -> bytes:
    """Whole content of a small /proc file; TaskGone or AccessDenied where it cannot be read.

    single: the file is one record the kernel makes whole before the first read (a seq_file's
    single_open: stat, status, cgroup, schedstat), so a read that leaves room in the buffer
    returned all of it: no second read to see the end.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _read_error(path, exc) or exc from None
    try:
        chunk = os.read(fd, size)
        if not chunk or single and len(chunk) < size:
            return chunk
        chunks = [chunk]
        while True:
            chunk = os.read(fd, size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError as exc:
        raise _read_error(path, exc) or exc from None
    finally:
        os.close(fd)


def read_bytes(path: str, size: int = 4096, single: bool = False) -> Optional[bytes]:
    """read_file, None where the task is gone or the file is not ours to read."""
    try:
        return read_file(path, size, single)
    except ProcReadError:
        return None


def _int_entries(path: str) -> Optional[List[int]]:
    try:
        with os.scandir(path) as it:
            return [int(entry.name) for entry in it if entry.name.isdigit()]
    except OSError as exc:
        if exc.errno in _QUIET or exc.errno == errno.ENOTDIR:
            return None
        raise


def list_pids() -> List[int]:
    """Every process (thread group) id visible in /proc."""
    return _int_entries(PROC) or []


def list_tids(pid: int) -> Optional[List[int]]:
    """The thread ids of a process, or None if it is gone."""
    return _int_entries(f"{PROC}/{pid}/task")


def process_tree(root: int) -> List[int]:
    """root and every process descended from it, as /proc shows them now (sorted)."""
    children: Dict[int, List[int]] = {}
    for pid in list_pids():
        stat = read_process_stat(pid)
        if stat is not None:
            children.setdefault(stat.ppid, []).append(pid)
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return sorted(seen)


def split_stat(data: bytes) -> Tuple[str, List[bytes]]:
    """A stat line's comm and the fields after it. comm may hold spaces and parentheses, so the
    split is after the last ')'; fields[0] is field 3 (state): field N of proc(5) is fields[N - 3]."""
    open_paren = data.index(b"(")
    close_paren = data.rindex(b")")
    return data[open_paren + 1 : close_paren].decode("utf-8", "replace"), data[close_paren + 2 :].split()


def parse_stat(data: bytes) -> TaskStat:
    """ValueError or IndexError for a line that is not a stat line."""
    comm, fields = split_stat(data)
    # proc(5) field N is fields[N - 3]: state 3, ppid 4, flags 9, majflt 12, utime 14, stime 15,
    # nice 19, num_threads 20, starttime 22, processor 39, policy 41, delayacct_blkio_ticks 42.
    # Made from its fields in TaskStat's order (a keyword call costs a fifth of the parse).
    return TaskStat._make((
        comm,  # comm
        fields[0].decode("ascii", "replace"),  # state
        int(fields[1]),  # ppid
        int(fields[6]),  # flags
        int(fields[16]),  # nice
        int(fields[19]),  # start_time
        int(fields[36]),  # last_cpu
        int(fields[38]),  # policy
        int(fields[11]) + int(fields[12]),  # cpu_ticks
        int(fields[9]),  # major_faults
        int(fields[39]) if len(fields) > 39 else 0,  # blkio_ticks
        int(fields[17]),  # num_threads
    ))


def _read_stat(path: str) -> Optional[TaskStat]:
    """A stat file parsed; None if the task is gone, the file not ours to read or not a stat line."""
    try:
        return parse_stat(read_file(path, 2048, single=True))
    except (ProcReadError, ValueError, IndexError):
        return None


def read_process_stat(pid: int) -> Optional[TaskStat]:
    """/proc/PID/stat: the whole process (its CPU ticks count every thread, dead ones too; its
    state is the leader's)."""
    return _read_stat(f"{PROC}/{pid}/stat")


def read_thread_stat(tid: int) -> Optional[TaskStat]:
    """stat of a thread known only by its id (/proc/TID resolves any thread id)."""
    return _read_stat(f"{PROC}/{tid}/stat")


def read_task_stat(pid: int, tid: int) -> Optional[TaskStat]:
    """stat of one thread (the per-task file: /proc/PID/stat sums over all threads and costs more)."""
    return _read_stat(f"{PROC}/{pid}/task/{tid}/stat")


def read_thread_stats(pid: int) -> Optional[Dict[int, TaskStat]]:
    """stat of every thread of a process, keyed by tid; None if the process is gone.

    One handle on /proc/PID/task serves the listing and every open: the per-thread path lookup
    is the main cost of a scan at thousands of threads.
    """
    try:
        task_fd = os.open(f"{PROC}/{pid}/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _QUIET or exc.errno == errno.ENOTDIR:
            return None
        raise
    stats: Dict[int, TaskStat] = {}
    try:
        names = os.listdir(task_fd)
        for name in names:
            try:
                fd = os.open(name + "/stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=task_fd)
            except OSError as exc:
                if exc.errno in _QUIET:
                    continue
                raise
            try:
                data = os.read(fd, 2048)
            except OSError as exc:
                if exc.errno in _QUIET:
                    continue
                raise
            finally:
                os.close(fd)
            if data:
                stats[int(name)] = parse_stat(data)
    except OSError as exc:
        if exc.errno in _QUIET:
            return None
        raise
    finally:
        os.close(task_fd)
    return stats


class Schedstat(NamedTuple):
    """/proc/PID/task/TID/schedstat: the thread's time on a CPU and waiting on a runqueue."""

    run_ns: int
    wait_ns: int
    slices: int  # timeslices run


def parse_schedstat(data: bytes) -> Optional[Schedstat]:
    try:
        run, wait, slices = data.split()[:3]
        return Schedstat(int(run), int(wait), int(slices))
    except ValueError:
        return None


def read_schedstat(pid: int, tid: int) -> Optional[Schedstat]:
    """(ns on a CPU, ns waiting on a runqueue, timeslices) of one thread; None if gone."""
    data = read_bytes(f"{PROC}/{pid}/task/{tid}/schedstat", 256, single=True)
    return parse_schedstat(data) if data else None


def read_process_cpu_ticks(pid: int) -> Optional[int]:
    """utime + stime of the whole process in clock ticks (stat fields 14 and 15)."""
    stat = read_process_stat(pid)
    return stat.cpu_ticks if stat is not None else None


def read_resched_interrupts() -> Optional[int]:
    """Rescheduling IPIs taken so far, summed over the CPUs (/proc/interrupts, the row whose text is
    "Rescheduling interrupts": RES on x86, IPI0 on arm64); None where the kernel has no such row.
    The scheduler sends one to make another CPU reschedule: to preempt what it runs, or to wake it
    from an idle state that does not poll."""
    data = read_bytes(f"{PROC}/interrupts", 65536) or b""
    for line in kernel_lines(data):
        if line.rstrip().endswith(b"Rescheduling interrupts"):
            counts = line.split(b":", 1)[1].split()
            return sum(int(c) for c in counts if c.isdigit())
    return None


def read_children(pid: int) -> List[int]:
    """The children of a process's leader thread (none where it is gone)."""
    found = read_bytes(f"{PROC}/{pid}/task/{pid}/children") or b""
    return [int(x) for x in found.split()]


_pids_are_ours: Optional[bool] = None


def proc_pids_are_ours() -> bool:
    """Whether pids in /proc are the ones our syscalls take: false in a container whose pid
    namespace differs from the one /proc was mounted in."""
    global _pids_are_ours
    if _pids_are_ours is None:
        try:
            _pids_are_ours = os.readlink(f"{PROC}/self") == str(os.getpid())
        except OSError:
            _pids_are_ours = False
    return _pids_are_ours


def read_affinity(tid: int, pid: Optional[int] = None) -> Optional[FrozenSet[int]]:
    """The CPUs the thread may run on: one syscall where our pids are /proc's (cheaper than
    parsing Cpus_allowed_list, which is the way in a foreign pid namespace)."""
    if proc_pids_are_ours():
        try:
            return frozenset(os.sched_getaffinity(tid))
        except OSError as exc:
            if exc.errno in _QUIET:
                return None
            raise
    path = f"{PROC}/{pid if pid is not None else tid}/task/{tid}/status"
    cpus = status_fields(read_bytes(path)).get(b"Cpus_allowed_list")
    return frozenset(parse_cpulist(cpus.decode("ascii", "replace"))) if cpus is not None else None


def status_fields(data: Optional[bytes]) -> Dict[bytes, bytes]:
    """A status file's `Key:\tvalue` lines as {Key: value}; {} for None."""
    pairs = (line.split(b":", 1) for line in kernel_lines(data or b"") if b":" in line)
    return {key: value.strip() for key, value in pairs}


# The system calls that make a process or thread, by machine (the generic table: arm64, riscv64, ...).
_FORK_SYSCALLS = {"x86_64": frozenset({56, 57, 58, 435}), "i686": frozenset({2, 120, 190, 435}),
                  "i386": frozenset({2, 120, 190, 435})}
FORK_SYSCALLS = _FORK_SYSCALLS.get(os.uname().machine, frozenset({220, 435}))
RUNNING = "running"


def task_syscall(pid: int, tid: int):
    """What /proc/PID/task/TID/syscall says the thread is doing: the number of the system call it
    is blocked in (-1: blocked outside one), RUNNING (runnable or on a CPU: the kernel does not
    say where), or None where it is gone or cannot be read."""
    data = read_bytes(_task_path(pid, tid, "syscall"), single=True)
    word = data.split(None, 1)[0] if data else b""
    if word == b"running":
        return RUNNING
    try:
        return int(word)
    except ValueError:
        return None


def _task_path(pid: int, tid: Optional[int], name: str) -> str:
    # Through a thread: a process whose leader has exited (a zombie) still has an mm there.
    return f"{PROC}/{pid}/{name}" if tid is None else f"{PROC}/{pid}/task/{tid}/{name}"


def read_exe(pid: int, tid: Optional[int] = None, *, strict: bool = False) -> Optional[str]:
    """Executable path; None for kernel threads, zombies and, without privilege, others' processes
    (strict: TaskGone for the first two, AccessDenied for the last)."""
    path = _task_path(pid, tid, "exe")
    try:
        return os.readlink(path)
    except OSError as exc:
        error = _read_error(path, exc)
        if error is None:
            raise
        if strict:
            raise error from None
        return None


def read_uid(pid: int, tid: Optional[int] = None, *, strict: bool = False) -> Optional[int]:
    """The real uid (the Uid: line's first field of status): who started the program, even where
    a set-user-ID executable runs it with another effective uid. strict: TaskGone, AccessDenied."""
    path = _task_path(pid, tid, "status")
    data = read_file(path, 4096, single=True) if strict else read_bytes(path, 4096, single=True)
    if data is None:
        return None
    line = _line_starting(data, b"Uid:")
    if line is None:
        return None
    try:
        return int(line.split()[1])
    except (IndexError, ValueError):
        return None


def _line_starting(data: bytes, prefix: bytes) -> Optional[bytes]:
    """The first line of a kernel file (split on "\\n" alone, as kernel_lines) that starts with
    prefix; None if none does. Found in place: status has some fifty lines, one of them wanted."""
    if data.startswith(prefix):
        start = 0
    else:
        start = data.find(b"\n" + prefix) + 1
        if not start:
            return None
    end = data.find(b"\n", start)
    return data[start:end] if end >= 0 else data[start:]


def normalise_cmdline(data: bytes) -> Tuple[str, ...]:
    """Arguments from the NUL-separated cmdline.

    Servers that rewrite their process title (PostgreSQL: "postgres: checkpointer") write one
    string over the old argv area and pad the rest with NULs or spaces; that comes out as a
    single argument followed by empty ones, and is normalised to the single title.
    """
    data = data.rstrip(b"\0")
    if not data:
        return ()
    args = data.split(b"\0")
    if len(args) > 1 and not any(args[1:]):
        args = args[:1]
    if len(args) == 1:
        args = [args[0].rstrip(b" ")]
    return tuple(arg.decode("utf-8", "replace") for arg in args)


def read_cmdline(pid: int, tid: Optional[int] = None, *, strict: bool = False) -> Optional[Tuple[str, ...]]:
    """The arguments (strict: TaskGone, AccessDenied where they cannot be read)."""
    path = _task_path(pid, tid, "cmdline")
    data = read_file(path, 8192) if strict else read_bytes(path, 8192)
    if data is None:
        return None
    return normalise_cmdline(data)


@functools.lru_cache(maxsize=256)
def parse_cgroup(data: bytes) -> CgroupPaths:
    """/proc/PID/cgroup: one `hierarchy-id:controllers:/path` line per hierarchy. Split on "\\n"
    alone: a cgroup name may hold any other character (\\r, \\v, U+2028, ...), and one that ended
    a line could forge a name=systemd line and with it a system unit. A line of another form is
    refused, and with it the whole file: no path, no unit. The paths of a text seen lately are
    given again (frozen): a process's threads, and a fork storm's processes, share one text."""
    unified = None
    systemd = None
    cpu_v1 = None
    for line in kernel_lines(data.decode("utf-8", "replace")):
        hierarchy, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hierarchy.isdigit() and hierarchy.isascii() and path.startswith("/")):
            return CgroupPaths(None, None, None, refused=f"not hierarchy:controllers:/path: {line[:80]!r}")
        if hierarchy == "0" and controllers == "":
            unified = path
        elif controllers == "name=systemd":
            systemd = path
        elif "cpu" in controllers.split(","):
            cpu_v1 = path
    return CgroupPaths(unified=unified, systemd=systemd, cpu_v1=cpu_v1)


def read_cgroup(pid: int, tid: Optional[int] = None) -> Optional[CgroupPaths]:
    """The cgroups of a process, or of one of its threads (a cgroup v1 hierarchy places threads)."""
    data = read_bytes(_task_path(pid, tid, "cgroup"), single=True)
    if data is None:
        return None
    return parse_cgroup(data)


def read_environ_var(pid: int, name: str) -> Optional[str]:
    """One variable of the process's initial environment, read on demand only (it can be large)."""
    data = read_bytes(f"{PROC}/{pid}/environ", 65536)
    if not data:
        return None
    prefix = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "replace")
    return None


def missing_capabilities(needed: Sequence[Tuple[str, int]], status_path: str = "/proc/self/status",
                         covered_by: Optional[int] = None) -> List[str]:
    """The names of the `needed` (name, bit) capabilities that this process's effective set
    (CapEff) lacks; none when it holds the `covered_by` bit (CAP_SYS_ADMIN for what older
    kernels asked of it). An unreadable status lacks them all (assume the worst, say so)."""
    data = read_bytes(status_path, 8192)
    for line in kernel_lines(data or b""):
        if line.startswith(b"CapEff:"):
            effective = int(line.split()[1], 16)
            if covered_by is not None and effective >> covered_by & 1:
                return []
            return [name for name, bit in needed if not effective >> bit & 1]
    return [name for name, _ in needed]


def is_kernel_thread(pid: int, stat: TaskStat) -> bool:
    """kthreadd, its children, or any task flagged PF_KTHREAD: never treated."""
    return pid == KTHREADD_PID or stat.ppid == KTHREADD_PID or bool(stat.flags & PF_KTHREAD)
