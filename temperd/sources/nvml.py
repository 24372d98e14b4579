"""NVIDIA GPUs through NVML (libnvidia-ml.so.1): whether this host has one.

Per-process GPU utilisation is not wired yet: where NVML and a GPU are present the source says so,
so a classification never claims "gpu none" on a GPU host."""

from __future__ import annotations

import ctypes.util
import glob
from typing import Tuple


def gpu_state() -> Tuple[bool, str]:
    """(present, why no measurement)."""
    devices = glob.glob("/dev/nvidia[0-9]*")
    library = ctypes.util.find_library("nvidia-ml")
    if not devices or not library:
        return False, "no NVIDIA GPU or NVML library on this host"
    return True, f"{len(devices)} NVIDIA GPU(s) present; per-process NVML utilisation not implemented yet"
