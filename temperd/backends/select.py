"""Which backend carries out the plan: `backend = "auto" | "scx" | "native"` and why."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Tuple

log = logging.getLogger("temperd.backend")


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


def make_backend(config, sysfs_root: str = "/sys", shape=None) -> Tuple[BackendChoice, Any]:
    from .native import NativeBackend

    available, reason = scx_availability(sysfs_root) if config.backend != "native" else (False, "")
    choice = choose(config.backend, available, reason)
    native = NativeBackend(config.state_dir)
    if choice.active == "native":
        return choice, native
    from .scx import ScxBackend

    return choice, ScxBackend(config, shape, native, sysfs_root=sysfs_root)


def scx_availability(sysfs_root: str = "/sys") -> Tuple[bool, str]:
    from .scx_detect import detect_sched_ext

    found = detect_sched_ext(sysfs_root)
    return found.usable, found.reason
