"""Which backend carries out the plan: `backend = "auto" | "scx" | "native"` and why."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, FrozenSet, Optional, Tuple

from temperd.backends import Backend


@dataclass(frozen=True)
class BackendChoice:
    requested: str  # what temperd.toml asks for
    active: str  # "scx" | "native"
    reason: str


def choose(requested: str, scx_available: bool, scx_reason: str) -> BackendChoice:
    """Pure: the decision and a sentence that explains it."""
    if requested == "native":
        return BackendChoice(requested, "native", "backend = \"native\" in temperd.toml")
    if scx_available:
        return BackendChoice(requested, "scx", f"backend = \"{requested}\": {scx_reason}")
    if requested == "scx":
        return BackendChoice(requested, "native", f"backend = \"scx\" requested but unavailable ({scx_reason}); "
                                                   "running the native backend instead")
    return BackendChoice(requested, "native", f"auto: {scx_reason}; native backend")


def make_backend(config, sysfs_root: str = "/sys", shape=None,
                 online_cpus: Optional[Callable[[], FrozenSet[int]]] = None) -> Tuple[BackendChoice, Backend]:
    """online_cpus: the daemon's machine shape's, current after each reload (the native backend
    reads sysfs without it)."""
    from temperd.backends.native.backend import NativeBackend

    found = scx_availability(sysfs_root, config.scx.binary) if config.backend != "native" else None
    choice = choose(config.backend, bool(found and found.usable), found.reason if found else "")
    native = NativeBackend(config.state_dir, online_cpus=online_cpus)
    if choice.active == "native":
        return choice, native
    from temperd.backends.scx.backend import ScxBackend, restart_policy
    from temperd.backends.scx.supervisor import ScxSupervisor

    assert found is not None and found.binary is not None and shape is not None
    supervisor = ScxSupervisor(found.binary, config.state_dir, config.scx.stats_socket, sysfs_root=sysfs_root,
                               policy=restart_policy(config.scx), args=config.scx.args, cpu_count=shape.n_cpus)
    return choice, ScxBackend(supervisor, native, shape.n_cpus)


def scx_availability(sysfs_root: str = "/sys", binary: str = ""):
    """detect_sched_ext with temperd.toml's scx.binary (empty: search the usual places)."""
    from temperd.backends.scx.detect import ScxAvailability, detect_sched_ext, sched_ext_dir

    if binary and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return ScxAvailability(os.path.isdir(sched_ext_dir(sysfs_root)), None, None, None,
                               f"scx.binary = {binary!r} in temperd.toml is not an executable file")
    return detect_sched_ext(sysfs_root, binary or None)
