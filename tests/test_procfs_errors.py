"""procfs tells "gone" from "denied": a task that exited is TaskGone (normal, counted), a fact that
is not ours to read is AccessDenied (the task is there); the lenient readers return None for both."""

import errno
import os
import subprocess
import sys

import pytest

from temperd.sources import procfs
from temperd.sources.process_store import ProcessStore


def _reaped_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _denying(monkeypatch, name: str, target: str):
    """os.<name> raises EACCES for paths ending in `target`."""
    real = getattr(os, name)

    def deny(path, *args, **kw):
        if str(path).endswith(target):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path, *args, **kw)

    monkeypatch.setattr(os, name, deny)


def test_a_task_that_exited_is_gone():
    pid = _reaped_pid()
    with pytest.raises(procfs.TaskGone) as caught:
        procfs.read_file(f"/proc/{pid}/stat")
    assert caught.value.path == f"/proc/{pid}/stat"
    with pytest.raises(procfs.TaskGone):
        procfs.read_exe(pid, strict=True)
    assert procfs.read_bytes(f"/proc/{pid}/stat") is None and procfs.read_exe(pid) is None


def test_a_fact_not_ours_to_read_is_denied_not_gone(monkeypatch):
    _denying(monkeypatch, "open", "/cmdline")
    with pytest.raises(procfs.AccessDenied):
        procfs.read_cmdline(os.getpid(), strict=True)
    assert procfs.read_cmdline(os.getpid()) is None  # lenient: not known now
    assert procfs.read_uid(os.getpid(), strict=True) == os.getuid()  # the rest still reads


def test_the_inventory_names_denied_facts_and_keeps_the_process(monkeypatch):
    _denying(monkeypatch, "readlink", "/exe")
    store = ProcessStore()
    proc = store.read_process(os.getpid())
    assert proc is not None
    facts = proc.freeze()
    assert facts.exe is None and facts.unreadable == ("exe",)
    assert facts.cmdline and facts.uid == os.getuid()


def test_other_errors_are_not_swallowed(monkeypatch):
    def broken(path, *args, **kw):
        raise OSError(errno.EIO, "I/O error", path)

    monkeypatch.setattr(os, "open", broken)
    with pytest.raises(OSError) as caught:
        procfs.read_file("/proc/self/stat")
    assert not isinstance(caught.value, procfs.ProcReadError)
