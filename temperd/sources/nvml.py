"""NVIDIA GPUs through NVML (libnvidia-ml.so.1, the driver's library): whether the host has one,
and what each process holding a GPU does with it.

A reading (GpuReading) is, per device, its utilisation (the share of time a kernel ran) and its
memory-bandwidth use (the share of time device memory was read or written), both over NVML's last
sample period; and per process holding a device, its own shares over the samples since the
previous reading (nvmlDeviceGetProcessUtilization) and the device memory it holds. Where the
driver keeps no per-process samples (NOT_SUPPORTED: MIG, some vGPUs) a device's figures go to its
one process, and a device shared by several is left unattributed. Readings turn into JSON and back
(control/typed_json), so a recorded one can stand in for a GPU in tests.
"""

from __future__ import annotations

import ctypes
import glob
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

LIBRARY = "libnvidia-ml.so.1"  # the name the driver package installs; what NVML users dlopen

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7


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
    return True, f"{len(devices)} NVIDIA GPU(s) present"


@dataclass(frozen=True)
class ProcessGpu:
    pid: int
    device: int
    util_pct: Optional[float]  # its kernels' share of the device's time; None: not attributable
    memory_util_pct: Optional[float]  # its share of the device memory's busy time
    used_bytes: Optional[int]  # device memory it holds


@dataclass(frozen=True)
class DeviceGpu:
    index: int
    name: str
    util_pct: float
    memory_util_pct: float


@dataclass(frozen=True)
class GpuReading:
    at: float  # wall-clock seconds
    devices: Tuple[DeviceGpu, ...]
    processes: Tuple[ProcessGpu, ...]


@dataclass(frozen=True)
class WorkloadGpu:
    """What the processes of one workload did on the GPUs of one reading."""

    util_pct: float  # summed over its processes (a share of one device; may pass 100 with several)
    memory_util_pct: float
    used_bytes: int
    pids: Tuple[int, ...]  # its processes holding a device


def workload_gpu(reading: GpuReading, pids: Iterable[int]) -> Optional[WorkloadGpu]:
    """The GPU use of the processes `pids` (a workload's), or None where none of them holds a device."""
    wanted = set(pids)
    mine = [p for p in reading.processes if p.pid in wanted]
    if not mine:
        return None
    return WorkloadGpu(sum(p.util_pct or 0.0 for p in mine), sum(p.memory_util_pct or 0.0 for p in mine),
                       sum(p.used_bytes or 0 for p in mine), tuple(sorted({p.pid for p in mine})))


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _ProcessSample(ctypes.Structure):  # nvmlProcessUtilizationSample_t
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class NvmlError(Exception):
    pass


class NvmlReader:
    """One NVML session (nvmlInit once); read() takes a GpuReading of every device."""

    def __init__(self, library: str = LIBRARY):
        self.lib = ctypes.CDLL(library)
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        count = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        self.handles: List[ctypes.c_void_p] = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "GetHandleByIndex")
            self.handles.append(handle)
        self._seen_us: Dict[int, int] = {}  # device -> timestamp of the newest process sample read

    def _check(self, code: int, call: str) -> None:
        if code != NVML_SUCCESS:
            self.lib.nvmlErrorString.restype = ctypes.c_char_p
            raise NvmlError(f"{call}: {self.lib.nvmlErrorString(code).decode(errors='replace')} ({code})")

    def close(self) -> None:
        self.lib.nvmlShutdown()

    def _name(self, handle) -> str:
        buffer = ctypes.create_string_buffer(96)
        return buffer.value.decode(errors="replace") if self.lib.nvmlDeviceGetName(handle, buffer, 96) == 0 else "?"

    def _holders(self, handle) -> Dict[int, int]:
        """pid -> device memory held, of the compute processes on the device."""
        for call in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            function = getattr(self.lib, call, None)
            if function is None:
                continue
            count = ctypes.c_uint(0)
            code = function(handle, ctypes.byref(count), None)
            if code == NVML_SUCCESS and count.value == 0:
                return {}
            if code != NVML_ERROR_INSUFFICIENT_SIZE:
                continue
            items = (_ProcessInfo * (count.value + 8))()
            count = ctypes.c_uint(len(items))
            if function(handle, ctypes.byref(count), items) == NVML_SUCCESS:
                return {items[i].pid: int(items[i].usedGpuMemory) for i in range(count.value)}
        return {}

    def _process_samples(self, index: int, handle) -> Optional[Dict[int, Tuple[float, float]]]:
        """pid -> (sm %, memory %), averaged over the samples since the last read; None where the
        driver keeps none (NOT_SUPPORTED)."""
        since = self._seen_us.get(index, 0)
        count = ctypes.c_uint(0)
        code = self.lib.nvmlDeviceGetProcessUtilization(handle, None, ctypes.byref(count), ctypes.c_ulonglong(since))
        if code == NVML_ERROR_NOT_FOUND:
            return {}
        if code == NVML_ERROR_NOT_SUPPORTED:
            return None
        if code not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE) or count.value == 0:
            return {}
        samples = (_ProcessSample * count.value)()
        code = self.lib.nvmlDeviceGetProcessUtilization(handle, samples, ctypes.byref(count), ctypes.c_ulonglong(since))
        if code != NVML_SUCCESS:
            return {}
        sums: Dict[int, List[float]] = {}
        for i in range(count.value):
            sample = samples[i]
            if sample.timeStamp <= since:
                continue
            total = sums.setdefault(sample.pid, [0.0, 0.0, 0])
            total[0] += sample.smUtil
            total[1] += sample.memUtil
            total[2] += 1
            self._seen_us[index] = max(self._seen_us.get(index, 0), int(sample.timeStamp))
        return {pid: (sm / n, mem / n) for pid, (sm, mem, n) in sums.items()}

    def read(self) -> GpuReading:
        devices, processes = [], []
        for index, handle in enumerate(self.handles):
            rates = _Utilization()
            self._check(self.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)), "GetUtilizationRates")
            devices.append(DeviceGpu(index, self._name(handle), float(rates.gpu), float(rates.memory)))
            holders = self._holders(handle)
            samples = self._process_samples(index, handle)
            for pid in sorted(set(holders) | set(samples or {})):
                if samples is not None:
                    sm, mem = samples.get(pid, (0.0, 0.0))
                elif len(holders) == 1:  # no per-process samples: the device's one process did it all
                    sm, mem = float(rates.gpu), float(rates.memory)
                else:
                    sm = mem = None
                processes.append(ProcessGpu(pid, index, sm, mem, holders.get(pid)))
        return GpuReading(time.time(), tuple(devices), tuple(processes))


def open_reader() -> Tuple[Optional[NvmlReader], str]:
    """(a reader, "") where a GPU and NVML are present, else (None, why not)."""
    present, why = gpu_state()
    if not present:
        return None, why
    try:
        return NvmlReader(), ""
    except (OSError, AttributeError, NvmlError) as exc:
        return None, f"NVML did not start: {exc}"
