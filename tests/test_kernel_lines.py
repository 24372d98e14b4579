"""Kernel files are split into lines on "\\n" alone (files.kernel_lines): a name the kernel lets
hold \\r, \\v, \\f, \\x1c-\\x1e, U+0085, U+2028 or U+2029 (a cgroup, a mount point) cannot end its
line and forge the next one — above all a name=systemd line of /proc/PID/cgroup, which would make
a user's process a system unit."""

from __future__ import annotations

import os

import pytest

from temperd.files import kernel_lines
from temperd.sources import procfs
from temperd.sources.facts import system_unit_of, unit_from_cgroup
from temperd.sources.inventory import Inventory
from temperd.sources.mounts import first_mount, parse_mountinfo

# Every separator str.splitlines() (after the parser's UTF-8 decode) or bytes.splitlines() breaks
# on besides "\n", as it appears in the file's bytes.
SEPARATORS = {"CR": b"\r", "VT": b"\x0b", "FF": b"\x0c", "FS": b"\x1c", "GS": b"\x1d", "RS": b"\x1e",
              "NEL": "\x85".encode(), "LS": "\u2028".encode(), "PS": "\u2029".encode()}
FORGED = b"9:name=systemd:/system.slice/memcached.service"
SESSION = b"/user.slice/user-1000.slice/session-4.scope"


@pytest.mark.parametrize("name", sorted(SEPARATORS))
def test_a_separator_in_a_cgroup_name_forges_no_systemd_line(name):
    sep = SEPARATORS[name]
    # a hybrid host: the user's own directory in the v2 hierarchy, the real unit in name=systemd
    data = b"1:name=systemd:" + SESSION + b"\n0::" + SESSION + b"/mine/y" + sep + FORGED + b"\n"
    paths = procfs.parse_cgroup(data)
    assert paths.systemd == SESSION.decode()
    assert paths.unit == "session-4.scope"
    assert system_unit_of(procfs.systemd_cgroup(paths.unified, paths.systemd)) is None
    assert paths.unified == (SESSION + b"/mine/y" + sep + FORGED).decode()


@pytest.mark.parametrize("name", sorted(SEPARATORS))
def test_kernel_lines_split_on_newline_alone(name):
    sep = SEPARATORS[name]
    assert kernel_lines(b"a" + sep + b"b\nc\n") == [b"a" + sep + b"b", b"c"]
    text = (b"a" + sep + b"b\nc").decode()
    assert kernel_lines(text) == [text.split("\n")[0], "c"]
    assert kernel_lines("") == [] and kernel_lines(b"\n") == [b""]


@pytest.mark.parametrize("line", [b"garbage", b"0::relative/path", b"x:cpu:/a", b"1:cpu", b":cpu:/a",
                                  "\u0661:cpu:/a".encode()])
def test_a_line_that_is_not_hierarchy_controllers_path_refuses_the_file(line):
    paths = procfs.parse_cgroup(b"1:name=systemd:/system.slice/memcached.service\n" + line + b"\n0::/\n")
    assert (paths.unified, paths.systemd, paths.cpu_v1, paths.unit) == (None, None, None, None)
    assert paths.refused and "hierarchy:controllers:/path" in paths.refused


def test_a_path_holding_colons_and_an_empty_file_are_fine():
    paths = procfs.parse_cgroup(b"4:cpu,cpuacct:/a:b\n1:name=systemd:/system.slice/x.service\n0::/\n")
    assert (paths.cpu_v1, paths.unit, paths.refused) == ("/a:b", "x.service", None)
    assert procfs.parse_cgroup(b"").refused is None


def test_directories_made_below_a_unit_name_no_other_unit():
    """A delegated subtree (a container's cgroup namespace) may name its directories as it likes:
    the unit is the one the manager made, the first in the path."""
    forged = "/system.slice/docker-1.scope/system.slice/memcached.service"
    assert unit_from_cgroup(forged) == system_unit_of(forged) == "docker-1.scope"
    assert system_unit_of("/system.slice/app.service/x/memcached.service") == "app.service"
    user = "/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service"
    assert unit_from_cgroup(user) == "foo.service" and system_unit_of(user) is None
    assert unit_from_cgroup(user + "/sub/memcached.service") == "foo.service"


@pytest.mark.parametrize("name", sorted(SEPARATORS))
def test_a_mount_point_holding_a_separator_is_read_whole(name):
    """The kernel escapes a space, tab, newline and backslash in a mount point (octal), nothing else."""
    point = "/home/u/m" + SEPARATORS[name].decode() + "x"
    text = (f"30 23 0:27 / /sys/fs/cgroup rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
            f"40 23 0:50 / {point} rw,nosuid - fuse.sshfs u@h{SEPARATORS[name].decode()}:/ rw,user_id=1000\n")
    found = parse_mountinfo(text)
    assert [(m.point, m.fstype) for m in found] == [("/sys/fs/cgroup", "cgroup2"), (point, "fuse.sshfs")]
    assert found[1].options == ["rw", "user_id=1000"]


# -- a real cgroup directory (root) --------------------------------------------------------------


def _move(mount: str, relative: str, pid: int) -> None:
    with open(os.path.join(mount, relative, "cgroup.procs"), "w") as handle:
        handle.write(str(pid))


@pytest.mark.skipif(os.geteuid() != 0, reason="making a cgroup and moving a process into it needs root")
def test_a_process_in_a_cgroup_named_like_a_systemd_line_is_not_that_unit(spawn):
    mount = first_mount("cgroup2")
    if mount is None:
        pytest.skip("no cgroup2 hierarchy mounted")
    child = spawn("memcached")
    child.wait_ready()
    own = procfs.read_cgroup(child.pid)
    top = f"temperd-test-forge-{os.getpid()}"
    leaf = os.path.join(top, "y\r" + FORGED.decode().lstrip("/"))
    try:
        os.makedirs(os.path.join(mount, leaf))
        _move(mount, leaf, child.pid)
        with open(f"/proc/{child.pid}/cgroup", "rb") as handle:
            assert b"/y\r" + FORGED + b"\n" in handle.read()  # the kernel shows the name as it is
        inventory = Inventory()
        inventory.reconcile()
        facts = inventory.process(child.pid)
        assert facts is not None and facts.name == "memcached"
        assert facts.unit != "memcached.service" and facts.system_unit != "memcached.service"
        assert facts.unit_cgroup == (own.systemd if own.systemd is not None else facts.cgroup)
        inventory.close()
    finally:
        if os.path.isdir(os.path.join(mount, top)):
            _move(mount, (own.unified or "/").lstrip("/"), child.pid)
            for directory in sorted((d for d, _, _ in os.walk(os.path.join(mount, top))), key=len, reverse=True):
                os.rmdir(directory)
        assert not os.path.exists(os.path.join(mount, top))
