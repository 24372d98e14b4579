"""Per-thread scheduler controls: affinity, policy, nice and the EEVDF custom slice.

Every function takes a thread id (the kernel's pid of one task): sched_setaffinity,
sched_setattr and setpriority(PRIO_PROCESS, tid) all act on that one thread, not its process.
Failures raise OSError with the kernel's errno; ESRCH means the thread is gone, which callers
treat as normal (threads exit between listing and acting).

sched_setattr/sched_getattr carry policy, nice and the slice in one call. On architectures whose
syscall numbers are not known here the module falls back to sched_setscheduler + setpriority
and reports the custom slice as unsupported.

The scheduling policy ids and names live here, once. With autogroup on, nice and the fair
policies rank threads only within one session: see autogroup.py.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
from dataclasses import dataclass
from typing import FrozenSet, Iterable, Optional


SCHED_OTHER = 0
SCHED_FIFO = 1
SCHED_RR = 2
SCHED_BATCH = 3
SCHED_IDLE = 5
SCHED_DEADLINE = 6

POLICY_BY_NAME = {"other": SCHED_OTHER, "batch": SCHED_BATCH, "idle": SCHED_IDLE}
POLICY_NAMES = {SCHED_OTHER: "other", SCHED_FIFO: "fifo", SCHED_RR: "rr", SCHED_BATCH: "batch",
                SCHED_IDLE: "idle", SCHED_DEADLINE: "deadline"}
FAIR_POLICIES = frozenset((SCHED_OTHER, SCHED_BATCH, SCHED_IDLE))
REALTIME_POLICIES = frozenset((SCHED_FIFO, SCHED_RR, SCHED_DEADLINE))

NICE_MIN, NICE_MAX = -20, 19

# (sched_setattr, sched_getattr) per machine; absent -> sched_setscheduler fallback.
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "arm64": (274, 275)}
_ATTR_SIZE_VER0 = 48  # up to sched_period: writing VER0 leaves utilisation clamps alone


class _SchedAttr(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),  # fair classes, kernel >= 6.12: the requested slice in ns
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_NUMBERS = _SYSCALLS.get(platform.machine())


@dataclass(frozen=True)
class SchedState:
    """A thread's scheduling parameters as the kernel reports them."""

    policy: int
    priority: int  # real-time priority (0 for the fair classes)
    nice: int
    slice_ns: Optional[int]  # the slice the kernel reports (sched_runtime); None: not reported


@dataclass(frozen=True)
class SliceSupport:
    """Whether sched_setattr's sched_runtime sets a fair thread's slice, detected once per process."""

    supported: bool
    default_ns: Optional[int]  # what a thread without a custom slice reports (the base slice)
    min_ns: Optional[int]  # the kernel clamps requests into [min_ns, max_ns]
    max_ns: Optional[int]
    reason: str


def _raise_errno() -> None:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))


_ATTR_SIZE = ctypes.sizeof(_SchedAttr)


# The int arguments (tid, size, flags) go as C ints, ctypes' conversion of a Python int.
def _getattr_raw(tid: int) -> _SchedAttr:
    attr = _SchedAttr()
    if _libc.syscall(_NUMBERS[1], tid, ctypes.byref(attr), _ATTR_SIZE, 0) != 0:
        _raise_errno()
    return attr


def _setattr_raw(tid: int, attr: _SchedAttr) -> None:
    attr.size = _ATTR_SIZE_VER0
    attr.sched_flags = 0
    if _libc.syscall(_NUMBERS[0], tid, ctypes.byref(attr), 0) != 0:
        _raise_errno()


# ---- affinity -------------------------------------------------------------------------------


def get_affinity(tid: int) -> FrozenSet[int]:
    return frozenset(os.sched_getaffinity(tid))


def set_affinity(tid: int, cpus: Iterable[int]) -> None:
    """EINVAL: the kernel refuses (per-CPU kernel thread, or no allowed CPU is online)."""
    os.sched_setaffinity(tid, set(cpus))


# ---- policy, nice, slice ----------------------------------------------------------------------


def _attr_or_none(tid: int) -> Optional[_SchedAttr]:
    """The thread's sched_attr, or None where sched_getattr does not exist (unknown arch, ENOSYS)."""
    if _NUMBERS is None:
        return None
    try:
        return _getattr_raw(tid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        return None


def get_sched(tid: int) -> SchedState:
    attr = _attr_or_none(tid)
    if attr is not None:
        fair = attr.sched_policy in FAIR_POLICIES
        return SchedState(policy=attr.sched_policy, priority=attr.sched_priority, nice=attr.sched_nice,
                          slice_ns=(attr.sched_runtime or None) if fair else None)
    policy = os.sched_getscheduler(tid)
    return SchedState(policy=policy, priority=os.sched_getparam(tid).sched_priority,
                      nice=os.getpriority(os.PRIO_PROCESS, tid), slice_ns=None)


def set_nice(tid: int, nice: int) -> None:
    os.setpriority(os.PRIO_PROCESS, tid, nice)


def set_sched(tid: int, *, policy: Optional[int] = None, nice: Optional[int] = None,
              slice_ns: Optional[int] = None, priority: Optional[int] = None) -> None:
    """Change some of a thread's policy, nice, slice and real-time priority; None keeps the current one.

    slice_ns 0 returns the thread to the kernel's base slice. The slice lives in the same
    sched_attr as policy and nice, so every write carries the current slice forward, or a policy
    change would silently drop a custom slice.
    """
    if nice is not None and not NICE_MIN <= nice <= NICE_MAX:
        raise ValueError(f"nice {nice} outside {NICE_MIN}..{NICE_MAX}")
    attr = _attr_or_none(tid)
    if attr is not None:
        current_custom = _custom_slice(attr.sched_runtime) if attr.sched_policy in FAIR_POLICIES else 0
        if policy is not None:
            attr.sched_policy = policy
        if priority is not None:
            attr.sched_priority = priority
        elif attr.sched_policy in FAIR_POLICIES:
            attr.sched_priority = 0
        if nice is not None:
            attr.sched_nice = nice
        if attr.sched_policy in FAIR_POLICIES:
            attr.sched_runtime = current_custom if slice_ns is None else slice_ns
            attr.sched_deadline = attr.sched_period = 0
        _setattr_raw(tid, attr)
        return
    if slice_ns:
        raise OSError(errno.ENOSYS, "sched_setattr is not available: no custom slice")
    if policy is not None or priority is not None:
        current = os.sched_getscheduler(tid)
        new_policy = current if policy is None else policy
        prio = priority if priority is not None else (0 if new_policy in FAIR_POLICIES else os.sched_getparam(tid).sched_priority)
        os.sched_setscheduler(tid, new_policy, os.sched_param(prio))
    if nice is not None:
        set_nice(tid, nice)


def _custom_slice(reported: int) -> int:
    """The sched_runtime to write back to keep a thread's slice: 0 when it is the base slice.

    sched_getattr reports the slice whether it is custom or the default, so a thread whose
    slice equals the base slice is taken as having none (the two behave the same).
    """
    support = slice_support()
    if not support.supported or reported == support.default_ns:
        return 0
    return reported


_support: Optional[SliceSupport] = None
_support_lock = threading.Lock()


def slice_support() -> SliceSupport:
    """Detect once whether a custom slice is honoured: set one on a scratch thread and read it back."""
    global _support
    with _support_lock:
        if _support is None:
            _support = _detect_slice_support()
        return _support


def _detect_slice_support() -> SliceSupport:
    kernel = platform.release()
    if _NUMBERS is None:
        return SliceSupport(False, None, None, None,
                            f"sched_setattr syscall number unknown for {platform.machine()}")
    found = {}

    def probe() -> None:
        # A fresh thread starts without a custom slice (the kernel resets it on clone).
        tid = threading.get_native_id()
        try:
            found["default"] = _getattr_raw(tid).sched_runtime
            attr = _getattr_raw(tid)
            attr.sched_runtime = 300_000
            _setattr_raw(tid, attr)
            found["set"] = _getattr_raw(tid).sched_runtime
            for key, request in (("min", 1), ("max", 10**12)):
                attr = _getattr_raw(tid)
                attr.sched_runtime = request
                _setattr_raw(tid, attr)
                found[key] = _getattr_raw(tid).sched_runtime
        except OSError as exc:
            found["error"] = exc

    worker = threading.Thread(target=probe, name="slice-probe", daemon=True)
    worker.start()
    worker.join(5)
    if "error" in found:
        return SliceSupport(False, None, None, None, f"sched_setattr probe failed on kernel {kernel}: {found['error']}")
    if not found.get("default"):
        return SliceSupport(False, None, None, None,
                            f"kernel {kernel} reports no slice in sched_getattr (custom slices need EEVDF, >= 6.12)")
    if found.get("set") != 300_000:
        return SliceSupport(False, found["default"], None, None,
                            f"kernel {kernel} ignored a 300 us sched_runtime (read back {found.get('set')})")
    return SliceSupport(True, found["default"], found.get("min"), found.get("max"),
                        f"kernel {kernel}: custom slice honoured, base slice {found['default']} ns, "
                        f"clamped to {found.get('min')}..{found.get('max')} ns")


# ---- errors ------------------------------------------------------------------------------------


def is_gone(exc: BaseException) -> bool:
    """ESRCH, ENOENT: the thread (or process) exited, or a held setting's owner is gone (held.py);
    normal between listing and acting."""
    return isinstance(exc, OSError) and exc.errno in (errno.ESRCH, errno.ENOENT)
