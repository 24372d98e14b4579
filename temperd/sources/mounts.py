"""The mount table (/proc/self/mountinfo): where cgroup2, a cgroup v1 cpu hierarchy and tracefs
are mounted. One parser for every reader of the table."""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from temperd.files import kernel_lines

MOUNTINFO = "/proc/self/mountinfo"


class Mount(NamedTuple):
    point: str
    fstype: str
    options: List[str]  # the super options (after " - "): a cgroup v1 hierarchy's controllers


def parse_mountinfo(text: str) -> List[Mount]:
    out = []
    for line in kernel_lines(text):
        # Fields are separated by one space; a name may hold any other white space (\\r, \\v).
        left, sep, right = line.partition(" - ")
        fields = right.split(" ")
        before = left.split(" ")
        if sep and len(fields) >= 3 and len(before) >= 5:
            out.append(Mount(before[4], fields[0], fields[2].split(",")))
    return out


def mounts(mountinfo: str = MOUNTINFO) -> List[Mount]:
    """Every mount; none where the table cannot be read."""
    try:
        with open(mountinfo, newline="") as handle:  # a \r in a mount point ends no line
            return parse_mountinfo(handle.read())
    except OSError:
        return []


def first_mount(fstype: str, option: Optional[str] = None, mountinfo: str = MOUNTINFO) -> Optional[str]:
    """The first mount point of this filesystem type (with this super option, if given)."""
    return next((m.point for m in mounts(mountinfo) if m.fstype == fstype and (option is None or option in m.options)),
                None)


def cgroup2_mount(mountinfo: str = MOUNTINFO) -> Optional[str]:
    return first_mount("cgroup2", mountinfo=mountinfo)


def cgroup1_cpu_mount(mountinfo: str = MOUNTINFO) -> Optional[str]:
    return first_mount("cgroup", "cpu", mountinfo)


def tracefs_mount(mountinfo: str = MOUNTINFO) -> Optional[str]:
    return first_mount("tracefs", mountinfo=mountinfo)
