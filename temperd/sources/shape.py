"""The machine shape: online CPUs, physical cores and their SMT siblings, packages, the CPU model.

Read from sysfs (the root is injectable so fixture trees of other hosts can stand in for /sys).
Physical cores are grouped by the kernel's own sibling lists (core_cpus_list, or the older
thread_siblings_list), not by core_id alone: core_id is only unique within a package.
Files that every Linux host has are required and a problem with them raises ShapeError naming
the file. What no decision uses (NUMA nodes, caches) is not read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

from temperd.files import kernel_lines

CPU_DIR = "devices/system/cpu"
UNKNOWN_MODEL = "unknown"

_CPULIST_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")

T = TypeVar("T")
SYSFS_ROOT = "/sys"  # where the CPU topology is read; tests and `--sysfs` give a fixture tree


class ShapeError(Exception):
    """A sysfs or cpuinfo file is missing or does not hold what the kernel writes there."""


def parse_cpulist(text: str) -> Tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11); an empty list is (). Raises ValueError on garbage."""
    text = text.strip()
    if not text:
        return ()
    cpus = set()
    for item in text.split(","):
        match = _CPULIST_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"expected a CPU list like '0-3,8', found {text!r}")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"expected ascending ranges in a CPU list, found {item.strip()!r} in {text!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8, 10, 11) -> '0-3,8,10-11', the kernel's own notation; () -> ''."""
    ordered = sorted(set(cpus))
    parts: List[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


@dataclass(frozen=True)
class Core:
    """One physical core: its SMT siblings (online ones only), sorted."""

    core_key: str  # "package:core_id", unique on the host
    package: int
    core_id: int
    cpus: Tuple[int, ...]


@dataclass(frozen=True)
class MachineShape:
    cpus: Tuple[int, ...]  # online CPUs, sorted
    cores: Tuple[Core, ...]  # sorted by first CPU
    threads_per_core: int  # the most online siblings any core has
    packages: Tuple[int, ...]  # physical package ids, sorted
    cpu_model: str
    source: str  # where it was read from

    @property
    def n_cpus(self) -> int:
        return len(self.cpus)

    @property
    def n_cores(self) -> int:
        return len(self.cores)

    @property
    def n_packages(self) -> int:
        return len(self.packages)

    def core_of(self, cpu: int) -> Core:
        for core in self.cores:
            if cpu in core.cpus:
                return core
        raise KeyError(f"CPU {cpu} is not an online CPU of this machine (online: {format_cpulist(self.cpus)})")

    def siblings(self, cpu: int) -> Tuple[int, ...]:
        """The other online CPUs on the same physical core (not cpu itself)."""
        return tuple(c for c in self.core_of(cpu).cpus if c != cpu)

    def describe(self) -> str:
        def count(n: int, word: str) -> str:
            return f"{n} {word}" + ("" if n == 1 else "s")

        return (f"{count(self.n_cores, 'core')} x {count(self.threads_per_core, 'thread')} ({count(self.n_cpus, 'CPU')}), "
                f"{count(self.n_packages, 'package')}, model {self.cpu_model}")


# --- reading sysfs ------------------------------------------------------------------------------

def _read(path: str, expected: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace", newline="") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        raise ShapeError(f"{path}: missing; expected {expected}") from None
    except OSError as exc:
        raise ShapeError(f"{path}: cannot read ({exc.strerror}); expected {expected}") from None


def _read_as(parse: Callable[[str], T], path: str, expected: str) -> T:
    """The file's content parsed (int, parse_cpulist); ShapeError naming the file where it is not that."""
    text = _read(path, expected)
    try:
        return parse(text)
    except ValueError:
        raise ShapeError(f"{path}: expected {expected}, found {text[:60]!r}") from None


def _read_cores(cpu_dir: str, online: Sequence[int]) -> Tuple[Core, ...]:
    online_set = set(online)
    by_siblings: Dict[Tuple[int, ...], Tuple[int, int]] = {}
    for cpu in online:
        topo = os.path.join(cpu_dir, f"cpu{cpu}", "topology")
        core_id = _read_as(int, os.path.join(topo, "core_id"), "the core id (an integer)")
        package = _read_as(int, os.path.join(topo, "physical_package_id"), "the package id (an integer)")
        # core_cpus_list is the current name; thread_siblings_list is what older kernels have.
        siblings_file = os.path.join(topo, "core_cpus_list")
        if not os.path.exists(siblings_file):
            siblings_file = os.path.join(topo, "thread_siblings_list")
        siblings = tuple(c for c in _read_as(parse_cpulist, siblings_file, "the CPU list of this CPU's SMT siblings")
                         if c in online_set)
        if cpu not in siblings:
            raise ShapeError(f"{siblings_file}: expected a sibling list that contains CPU {cpu}, "
                             f"found {format_cpulist(siblings)!r}")
        known = by_siblings.setdefault(siblings, (package, core_id))
        if known != (package, core_id):
            raise ShapeError(f"{topo}: CPU {cpu} shares a core with CPUs {format_cpulist(siblings)} but reports "
                             f"package {package} core {core_id}, they report package {known[0]} core {known[1]}")
    claimed: Dict[int, Tuple[int, ...]] = {}
    for siblings in by_siblings:
        for cpu in siblings:
            if claimed.setdefault(cpu, siblings) != siblings:
                raise ShapeError(f"{cpu_dir}/cpu{cpu}/topology: CPU {cpu} is listed as a sibling on two different "
                                 f"cores ({format_cpulist(claimed[cpu])} and {format_cpulist(siblings)})")
    cores = []
    used_keys: Dict[str, int] = {}
    for siblings, (package, core_id) in sorted(by_siblings.items()):
        key = f"{package}:{core_id}"
        # Some firmware repeats core ids across dies of one package; keep keys unique anyway.
        if key in used_keys:
            key = f"{key}@{siblings[0]}"
        used_keys[key] = 1
        cores.append(Core(key, package, core_id, siblings))
    return tuple(cores)


def _cpuinfo_default(sysfs_root: str) -> Optional[str]:
    """The cpuinfo that belongs to this sysfs root: <root>/cpuinfo in a fixture tree, else <root>/../proc/cpuinfo."""
    for candidate in (os.path.join(sysfs_root, "cpuinfo"),
                      os.path.join(os.path.dirname(os.path.abspath(sysfs_root)), "proc", "cpuinfo")):
        if os.path.isfile(candidate):
            return candidate
    return None


def read_cpu_model(cpuinfo_path: str) -> str:
    """The 'model name' of the first CPU in a /proc/cpuinfo style file; 'unknown' when it has none
    (arm64 kernels do not write one)."""
    text = _read(cpuinfo_path, "a /proc/cpuinfo style file")
    for line in kernel_lines(text):
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return UNKNOWN_MODEL


def online_cpus(sysfs_root: str = SYSFS_ROOT) -> Tuple[int, ...]:
    """The online CPUs, sorted; ShapeError where the list cannot be read or is empty."""
    cpu_dir = os.path.join(sysfs_root, CPU_DIR)
    if not os.path.isdir(cpu_dir):
        raise ShapeError(f"{cpu_dir}: missing; expected the sysfs CPU directory")
    online = _read_as(parse_cpulist, os.path.join(cpu_dir, "online"), "the list of online CPUs like '0-3'")
    if not online:
        raise ShapeError(f"{os.path.join(cpu_dir, 'online')}: expected at least one online CPU, found none")
    return online


def read_shape(sysfs_root: str = SYSFS_ROOT, cpuinfo_path: Optional[str] = None) -> MachineShape:
    """Read the machine shape under sysfs_root. cpuinfo_path defaults to the cpuinfo next to the root
    (<root>/cpuinfo, else <root>/../proc/cpuinfo); without one the model is 'unknown'."""
    cpu_dir = os.path.join(sysfs_root, CPU_DIR)
    online = online_cpus(sysfs_root)
    cores = _read_cores(cpu_dir, online)
    if cpuinfo_path is None:
        cpuinfo_path = _cpuinfo_default(sysfs_root)
    model = read_cpu_model(cpuinfo_path) if cpuinfo_path is not None else UNKNOWN_MODEL
    return MachineShape(
        cpus=online,
        cores=tuple(sorted(cores, key=lambda c: c.cpus[0])),
        threads_per_core=max(len(c.cpus) for c in cores),
        packages=tuple(sorted({c.package for c in cores})),
        cpu_model=model,
        source=os.path.abspath(sysfs_root),
    )
