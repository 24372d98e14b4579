"""Is sched_ext here, is a BPF scheduler already loaded, is scx_layered installed?

sysfs (kernel/sched_ext, mainline since 6.12):
- `state`: "disabled", "enabling", "enabled" or "disabling";
- `root/ops`: the loaded scheduler's name (scx_layered's starts with "layered"), present only
  while one is loaded.
scx_layered 1.1.x also refuses or panics at startup when possible CPUs outnumber online ones
(offline CPUs, or a VM with hot-pluggable slots), so that is checked here too.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Optional, Tuple

from temperd.config.tomlsource import trust_problem
from temperd.files import read_stripped
from temperd.sources import procfs

SCX_BINARY = "scx_layered"
BINARY_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/sbin")
LAYERED_OPS_PREFIX = "layered"


@dataclass(frozen=True)
class ScxAvailability:
    kernel_supported: bool
    state: Optional[str]  # /sys/kernel/sched_ext/state: "disabled", "enabled", "enabling", "disabling"
    loaded_ops: Optional[str]  # /sys/kernel/sched_ext/root/ops: the loaded scheduler's name
    binary: Optional[str]
    reason: str
    topology_problem: Optional[str] = None  # why scx_layered would fail to start on these CPUs
    privilege_problem: Optional[str] = None  # capabilities scx_layered would lack

    @property
    def usable(self) -> bool:
        return (self.kernel_supported and self.binary is not None and self.state == "disabled"
                and self.topology_problem is None and self.privilege_problem is None)


def sched_ext_dir(sysfs_root: str = "/sys") -> str:
    return os.path.join(sysfs_root, "kernel", "sched_ext")


def read_state(sysfs_root: str = "/sys") -> Tuple[Optional[str], Optional[str]]:
    """(state, loaded ops name); (None, None) on a kernel without sched_ext."""
    base = sched_ext_dir(sysfs_root)
    return read_stripped(os.path.join(base, "state")), (read_stripped(os.path.join(base, "root", "ops")) or None)


def describe_loaded(state: Optional[str], ops: Optional[str], sysfs_root: str = "/sys") -> str:
    """A sentence naming the scheduler that holds sched_ext."""
    where = os.path.join(sched_ext_dir(sysfs_root), "root", "ops")
    if not ops:
        return f"a sched_ext scheduler is loaded (state {state!r}; {where} names none)"
    return f"sched_ext scheduler {ops!r} is loaded (state {state!r}, {where})"


def topology_problem(sysfs_root: str = "/sys") -> Optional[str]:
    cpu_dir = os.path.join(sysfs_root, "devices", "system", "cpu")
    possible, online = read_stripped(os.path.join(cpu_dir, "possible")), read_stripped(os.path.join(cpu_dir, "online"))
    if possible is None or online is None or possible == online:
        return None
    return (f"possible CPUs {possible} differ from online CPUs {online}: scx_layered fails to start on hosts with "
            "offline or hot-pluggable CPUs (holes in CPU IDs, init_cpus panic)")


# scx_layered, a child of temperd, inherits its capabilities: loading BPF maps and programs needs
# CAP_BPF, struct_ops and tracing programs CAP_PERFMON, attaching a sched_ext scheduler CAP_SYS_ADMIN.
SCX_CAPABILITIES = (("CAP_SYS_ADMIN", 21), ("CAP_PERFMON", 38), ("CAP_BPF", 39))


def privilege_problem(status_path: str = "/proc/self/status") -> Optional[str]:
    """What scx_layered would lack of the capabilities it needs (those this process's CapEff lacks)."""
    missing = procfs.missing_capabilities(SCX_CAPABILITIES, status_path)
    if not missing:
        return None
    return (f"temperd lacks {', '.join(missing)}, which scx_layered needs (under systemd, the scx-privileges.conf "
            "drop-in adds them: see temperd(8))")


def find_binary() -> Optional[str]:
    """scx_layered on PATH, else in BINARY_DIRS."""
    return shutil.which(SCX_BINARY) or shutil.which(SCX_BINARY, path=os.pathsep.join(BINARY_DIRS))


def binary_trust_problem(binary: str) -> Optional[str]:
    """Why temperd, as root, will not run this scx_layered, or None: like temperd.toml, the
    binary and the directory it lies in must be root's and writable by no one else (whoever can
    replace it would run code as root, with CAP_BPF, at the next start)."""
    try:
        real = os.path.realpath(binary)
        for path in (real, os.path.dirname(real)):
            problem = trust_problem(os.stat(path))
            if problem:
                return f"{path}: {problem}"
    except OSError as exc:
        return f"{binary}: cannot be checked ({exc.strerror})"
    return None


def detect_sched_ext(sysfs_root: str = "/sys", binary: Optional[str] = None,
                     status_path: str = "/proc/self/status") -> ScxAvailability:
    base = sched_ext_dir(sysfs_root)
    binary = binary if binary is not None else find_binary()
    if not os.path.isdir(base):
        return ScxAvailability(False, None, None, binary, f"no {base}: kernel without CONFIG_SCHED_CLASS_EXT")
    state, ops = read_state(sysfs_root)
    if state != "disabled":
        return ScxAvailability(True, state, ops, binary,
                               describe_loaded(state, ops, sysfs_root) + "; refusing to start scx_layered beside it")
    if binary is None:
        return ScxAvailability(True, state, ops, None,
                               f"sched_ext is available but {SCX_BINARY} is not installed (package scx-scheds)")
    problem = topology_problem(sysfs_root)
    if problem:
        return ScxAvailability(True, state, ops, binary, problem, problem)
    lacking = privilege_problem(status_path)
    if lacking:
        return ScxAvailability(True, state, ops, binary, lacking, privilege_problem=lacking)
    return ScxAvailability(True, state, ops, binary, f"sched_ext available and {binary} installed")


def start_blocker(sysfs_root: str, ours_just_exited: bool) -> Tuple[Optional[str], bool]:
    """Why scx_layered cannot be started now, and whether that may pass by itself.

    (None, _): sched_ext is free. (reason, True): our own scx_layered is still unloading (the
    kernel disables sched_ext asynchronously after the process is gone): wait a little.
    (reason, False): another scheduler holds the kernel, or it has no sched_ext: refuse."""
    state, ops = read_state(sysfs_root)
    if state == "disabled":
        return None, False
    ours_leaving = state in ("disabling", "enabling") or (
        ours_just_exited and (state is None or (state == "enabled" and (ops or "").startswith(LAYERED_OPS_PREFIX))))
    if state is None and not os.path.isdir(sched_ext_dir(sysfs_root)):
        return f"no {sched_ext_dir(sysfs_root)}: kernel without CONFIG_SCHED_CLASS_EXT", ours_leaving
    return describe_loaded(state, ops, sysfs_root), ours_leaving


class SchedExtGate:
    """Whether scx_layered may start now. The kernel unloads a scheduler asynchronously after its
    process is gone, so a busy sched_ext that may be our own scx_layered leaving is waited for,
    grace_s at most; another scheduler holding the kernel refuses the start."""

    def __init__(self, sysfs_root: str, grace_s: float):
        self.sysfs_root = sysfs_root
        self.grace_s = grace_s
        self._exited_at: Optional[float] = None  # our scx_layered's last exit
        self._busy_since: Optional[float] = None  # sched_ext busy with what may be ours leaving

    def exited(self, now: float) -> None:
        self._exited_at = now

    def check(self, now: float) -> Tuple[Optional[str], bool]:
        """(None, False): start. (reason, True): wait and ask again. (reason, False): refuse."""
        ours_just_exited = self._exited_at is not None and now - self._exited_at < self.grace_s
        reason, passing = start_blocker(self.sysfs_root, ours_just_exited)
        if reason is None:
            self._busy_since = None
            return None, False
        if passing:
            self._busy_since = self._busy_since if self._busy_since is not None else now
            if now - self._busy_since < self.grace_s:
                return reason, True
        return reason, False
