"""The state file on a real host: a file of another owner is refused, and a change whose record
cannot be written (a full state directory) is not made, so a restart after a kill still finds
every change it has to undo."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess

import pytest

from temperd.backends.native import sched, state_file
from temperd.backends.native.autogroup import read_autogroup
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.plan import LATENCY, OPEN, LayerPlan
from temperd.sources import procfs
from test_native_backend import layer, make_backend, universe
from thread_children import nice_of, policy_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="other owners, tmpfs mounts and lower nices need root")

BACKEND_LOG = "temperd.backends.native"
NOBODY = 65534


def _plan(tids, nice=-3):
    return LayerPlan(layers=(layer("lat", OPEN, LATENCY, tids=tids, nice=nice),), reserve_cpus=(0,))


def test_a_state_file_of_another_owner_is_refused_set_aside_and_said(tmp_path, children, caplog):
    kid = children.spawn(["own-a"])
    crashed = make_backend(tmp_path)
    crashed.apply(_plan([kid.threads["own-a"]], nice=-4), universe(kid, kthreads=False))
    state = tmp_path / "native-state.json"
    os.chown(state, NOBODY, NOBODY)  # what another user could have written there
    with pytest.raises(state_file.StateFileError) as info:
        RestoreLedger(str(tmp_path)).load()
    assert str(info.value) == f"{state}: refused: owned by uid {NOBODY}, expected root"
    with caplog.at_level(logging.ERROR, logger=BACKEND_LOG):
        result = make_backend(tmp_path).recover()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(said) == 1 and "expected root" in said[0] and "native-state.json.unreadable" in said[0]
    assert result.errors == said and not state.exists() and (tmp_path / "native-state.json.unreadable").exists()
    crashed.stop()


def test_a_change_whose_record_cannot_be_written_is_not_made_and_said_once(tmp_path, children, monkeypatch, caplog):
    kid = children.spawn(["nw-a", "nw-b"])
    tids = [kid.threads["nw-a"], kid.threads["nw-b"]]

    def full(*_args, **_kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(state_file, "write_atomically", full)
    backend = make_backend(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger=BACKEND_LOG):
            first = backend.apply(_plan(tids[:1]), universe(kid, kthreads=False))
            second = backend.apply(_plan(tids), universe(kid, kthreads=False))
            assert [nice_of(kid.pid, tid) for tid in tids] == [0, 0]
            assert first.failed == {"state_file": 1} and second.failed == {"state_file": 1}
            said = [r.getMessage() for r in caplog.records]
            assert len(said) == 1 and "No space left on device" in said[0] and "not made" in said[0]
            monkeypatch.undo()
            again = backend.apply(_plan(tids, nice=-2), universe(kid, kthreads=False))
            assert [nice_of(kid.pid, tid) for tid in tids] == [-2, -2] and not again.failed
            assert len(caplog.records) == 2 and "written again" in caplog.records[1].getMessage()
    finally:
        backend.stop()
    assert [nice_of(kid.pid, tid) for tid in tids] == [0, 0]


@pytest.fixture
def small_state_dir(tmp_path):
    """An 8 KiB tmpfs: room for the records of a few dozen threads, not of seventy."""
    directory = tmp_path / "small"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k,mode=0700", "tmpfs", str(directory)], check=True)
    yield directory
    subprocess.run(["umount", "-l", str(directory)], check=True)


def test_a_full_state_directory_stops_changes_and_a_restart_undoes_every_one_made(small_state_dir, children):
    kid = children.spawn([f"full-{i}" for i in range(70)])
    tids = kid.tids()
    crashed = make_backend(small_state_dir)
    crashed.apply(_plan(tids[:8]), universe(kid, kthreads=False))
    assert [nice_of(kid.pid, tid) for tid in tids[:8]] == [-3] * 8  # recorded, then made
    result = crashed.apply(_plan(tids), universe(kid, kthreads=False))
    assert result.failed.get("state_file") == 1, "the records of 71 threads were expected not to fit"
    assert [tid for tid in tids if nice_of(kid.pid, tid) != 0] == tids[:8]  # nothing made unrecorded
    # Every change is on record (the file reads back whole: no line cut in the middle) ...
    left = RestoreLedger(str(small_state_dir))
    assert left.load() is True and sorted(rec.tid for rec in left.records.values()) == tids[:8]
    assert not left.skipped
    # ... so a run started after a kill -9 of this one puts every thread back.
    fresh = make_backend(small_state_dir)
    try:
        recovered = fresh.recover()
        assert recovered.restored.get("nice") == 8 and not recovered.errors
        assert [nice_of(kid.pid, tid) for tid in tids] == [0] * len(tids)
        assert read_autogroup(kid.pid)[1] == 0
    finally:
        fresh.stop()


def test_a_state_file_of_the_version_before_the_one_ledger_is_undone_at_start(tmp_path, children):
    """The thread lines of a temperd killed before the ledger kept per-setting originals (every
    kind's `original`, what it `applied`, a policy without its priority), exactly as it wrote them:
    a start of this one puts back what they applied, leaves what drifted, and removes the file."""
    kid = children.spawn(["old-a", "old-b"])
    a, b = kid.threads["old-a"], kid.threads["old-b"]
    original = {"affinity": sorted(sched.get_affinity(a)), "nice": 0, "policy": 0, "priority": 0, "slice_ns": 0}
    for tid, nice in ((a, 10), (b, 7)):
        sched.set_sched(tid, policy=sched.SCHED_BATCH, nice=nice)
    sched.set_affinity(a, original["affinity"][-1:])

    def line(tid, applied, drifted):
        return {"thread": {"applied": applied, "comm": f"t{tid}", "drifted": drifted, "original": original,
                           "pid": kid.pid, "since": 5, "start_time": procfs.read_thread_stat(tid).start_time,
                           "tid": tid}}

    lines = [{"version": 2, "writer_pid": 1, "written_at": 0.0},
             line(a, {"nice": 12, "policy": 3}, {}),  # the later line of the same thread counts
             line(a, {"affinity": original["affinity"][-1:], "nice": 10, "policy": 3}, {}),
             line(b, {"policy": 3}, {"nice": 7})]  # its nice drifted: someone else's, left
    (tmp_path / "native-state.json").write_text("".join(json.dumps(entry) + "\n" for entry in lines))
    os.chmod(tmp_path / "native-state.json", 0o600)
    fresh = make_backend(str(tmp_path))
    recovered = fresh.recover()
    assert recovered.restored == {"affinity": 1, "nice": 1, "policy": 2} and not recovered.errors, recovered
    assert (policy_of(kid.pid, a), nice_of(kid.pid, a)) == (0, 0)
    assert sorted(sched.get_affinity(a)) == original["affinity"]
    assert (policy_of(kid.pid, b), nice_of(kid.pid, b)) == (0, 7)
    assert not os.path.exists(tmp_path / "native-state.json")
