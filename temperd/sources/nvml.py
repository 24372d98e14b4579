"""NVIDIA GPUs through NVML (libnvidia-ml.so.1): whether this host has one.

Per-process GPU utilisation is not wired yet: where NVML and a GPU are present the source says so,
so a classification never claims "gpu none" on a GPU host."""

from __future__ import annotations

import ctypes
import glob
from typing import Tuple

LIBRARY = "libnvidia-ml.so.1"  # the name the driver package installs; what NVML users dlopen


def _library_loads() -> bool:
    # dlopen by name, not ctypes.util.find_library: that runs ldconfig (or a compiler) in a
    # subprocess, tenths of a second at every start of a daemon whose host has no GPU.
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return False
    return True


def gpu_state() -> Tuple[bool, str]:
    """(present, why no measurement). The library is looked for only where a device node is."""
    devices = glob.glob("/dev/nvidia[0-9]*")
    if not devices or not _library_loads():
        return False, "no NVIDIA GPU or NVML library on this host"
    return True, f"{len(devices)} NVIDIA GPU(s) present; per-process NVML utilisation not implemented yet"
