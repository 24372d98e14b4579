"""Is sched_ext here, is a BPF scheduler already loaded, is scx_layered installed?"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Optional

SCX_BINARY = "scx_layered"
BINARY_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/sbin")


@dataclass(frozen=True)
class ScxAvailability:
    kernel_supported: bool
    state: Optional[str]  # /sys/kernel/sched_ext/state: "disabled", "enabled", "enabling", ...
    loaded_ops: Optional[str]  # /sys/kernel/sched_ext/root/ops: the loaded scheduler's name
    binary: Optional[str]
    reason: str

    @property
    def usable(self) -> bool:
        return self.kernel_supported and self.binary is not None and self.state == "disabled"


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def find_binary(path_env: Optional[str] = None) -> Optional[str]:
    found = shutil.which(SCX_BINARY, path=path_env)
    if found:
        return found
    for directory in BINARY_DIRS:
        candidate = os.path.join(directory, SCX_BINARY)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def detect_sched_ext(sysfs_root: str = "/sys", binary: Optional[str] = None) -> ScxAvailability:
    base = os.path.join(sysfs_root, "kernel", "sched_ext")
    binary = binary if binary is not None else find_binary()
    if not os.path.isdir(base):
        return ScxAvailability(False, None, None, binary,
                               f"no {base}: this kernel has no sched_ext (CONFIG_SCHED_CLASS_EXT)")
    state = _read(os.path.join(base, "state"))
    ops = _read(os.path.join(base, "root", "ops")) or None
    if state != "disabled":
        who = f"{ops!r}" if ops else "another scheduler"
        return ScxAvailability(True, state, ops, binary,
                               f"sched_ext state is {state!r}: {who} is loaded; refusing to start scx_layered beside it")
    if binary is None:
        return ScxAvailability(True, state, ops, None,
                               f"sched_ext is available but {SCX_BINARY} is not installed (package scx-scheds)")
    return ScxAvailability(True, state, ops, binary, f"sched_ext available and {binary} installed")
