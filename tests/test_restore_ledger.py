"""The restore ledger: originals per (tid, start_time), atomic state file, restore, drift."""

from __future__ import annotations

import json
import os
import stat

import pytest

from temperd.backends.native import sched
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.state_file import StateFileError
from temperd.backends.native.thread_settings import AFFINITY, NICE, POLICY, ThreadRecord, thread_values
from temperd.backends.result import ApplyResult
from temperd.sources import procfs
from fake_kernel import FakeKernel
from thread_children import cpus_allowed, needs_two_cpus, nice_of, policy_of

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="lowering nice and changing other threads needs root")


def _start_time(tid: int) -> int:
    return procfs.read_thread_stat(tid).start_time


def _record(ledger: RestoreLedger, pid: int, tid: int, comm: str) -> ThreadRecord:
    return ledger.record(tid, pid, _start_time(tid), comm)


def _write(rec: ThreadRecord, values) -> None:
    """Record the thread's originals of these kinds, and these values as written (not made)."""
    now = thread_values(sched.get_affinity(rec.tid), sched.get_sched(rec.tid))
    for kind, value in values.items():
        rec.originals.setdefault(kind, rec.kept(kind, now[kind]))
        rec.written[kind] = value


def test_state_file_round_trip_is_atomic_and_private(tmp_path, children):
    child = children.spawn(["led-a"])
    tid = child.threads["led-a"]
    ledger = RestoreLedger(str(tmp_path / "state"))
    rec = _record(ledger, child.pid, tid, "led-a")
    _write(rec, {NICE: 5, AFFINITY: (0,)})
    ledger.extras["pmqos"] = {"originals": {"1": "0"}, "written": {"1": "20"}}
    ledger.save()
    assert os.listdir(tmp_path / "state") == ["native-state.json"]  # no temp file left behind
    assert stat.S_IMODE(os.stat(ledger.path).st_mode) == 0o600
    header = json.loads(open(ledger.path).readline())
    assert header["version"] == 2 and header["writer_pid"] == os.getpid()

    again = RestoreLedger(str(tmp_path / "state"))
    assert again.load() is True
    loaded = again.get(tid, rec.start_time)
    assert loaded.originals == rec.originals and loaded.originals[NICE] == 0
    assert loaded.written == {NICE: 5, AFFINITY: (0,)}
    assert again.extras["pmqos"]["written"] == {"1": "20"}


def test_nothing_to_undo_removes_the_state_file(tmp_path, children):
    child = children.spawn(["led-b"])
    ledger = RestoreLedger(str(tmp_path))
    rec = _record(ledger, child.pid, child.threads["led-b"], "led-b")
    _write(rec, {NICE: 3})
    ledger.save()
    assert os.path.exists(ledger.path)
    rec.written.clear()
    ledger.save()
    assert not os.path.exists(ledger.path)
    assert RestoreLedger(str(tmp_path)).load() is False


@pytest.mark.parametrize("content, expect", [
    ("{not json", "unreadable state file"),
    ('{"version": 7}', "version: expected one of (1, 2), found 7"),
])
def test_bad_state_file_is_one_line_error_naming_it(tmp_path, content, expect):
    path = tmp_path / "native-state.json"
    path.write_text(content)
    with pytest.raises(StateFileError) as info:
        RestoreLedger(str(tmp_path)).load()
    message = str(info.value)
    assert str(path) in message and expect in message and "\n" not in message


@pytest.mark.parametrize("content, skipped", [
    ('{"version": 1, "threads": [{"tid": 1}]}', ["threads[0]"]),
    ('{"version": 2}\n{"thread": {"tid": 1}}\n', ["line 2"]),
    ('{"version": 2}\n{"what": 1}\n', ["line 2"]),
    ('{"version": 2}\n{"section": "pmqos", "set": {"originals": 3}}\n', ["line 2"]),
])
def test_a_malformed_entry_is_skipped_and_named_not_the_file(tmp_path, content, skipped):
    (tmp_path / "native-state.json").write_text(content)
    ledger = RestoreLedger(str(tmp_path))
    assert ledger.load() is True and ledger.skipped == skipped and not ledger.records and not ledger.extras


@needs_root
@needs_two_cpus
def test_restore_one_thread_puts_back_what_was_applied(tmp_path, children):
    child = children.spawn(["led-c", "led-d"])
    tid, other = child.threads["led-c"], child.threads["led-d"]
    ledger = RestoreLedger(str(tmp_path))
    rec = _record(ledger, child.pid, tid, "led-c")
    _write(_record(ledger, child.pid, other, "led-d"), {NICE: 0})  # held, but not changed
    _write(rec, {AFFINITY: (1,), POLICY: (sched.SCHED_BATCH, 0), NICE: 10})
    sched.set_affinity(tid, {1})
    sched.set_sched(tid, policy=sched.SCHED_BATCH, nice=10)
    assert (cpus_allowed(child.pid, tid), policy_of(child.pid, tid), nice_of(child.pid, tid)) == ("1", 3, 10)

    outcome = ledger.restore(rec)
    assert outcome.restored == {AFFINITY: 1, POLICY: 1, NICE: 1}
    assert not outcome.failed and not outcome.drift
    assert (cpus_allowed(child.pid, tid), policy_of(child.pid, tid), nice_of(child.pid, tid)) == ("0-1", 0, 0)
    assert ledger.get(tid, rec.start_time) is None  # nothing left to hold
    assert len(ledger.records) == 1


@needs_root
def test_restore_leaves_a_setting_someone_else_changed(tmp_path, children):
    child = children.spawn(["led-e"])
    tid = child.threads["led-e"]
    ledger = RestoreLedger(str(tmp_path))
    rec = _record(ledger, child.pid, tid, "led-e")
    _write(rec, {POLICY: (sched.SCHED_BATCH, 0), NICE: 5})
    sched.set_sched(tid, policy=sched.SCHED_BATCH, nice=5)
    os.setpriority(os.PRIO_PROCESS, tid, 12)  # someone else
    outcome = ledger.restore(rec)
    assert outcome.drift == {NICE: 1} and outcome.restored == {POLICY: 1}
    assert (policy_of(child.pid, tid), nice_of(child.pid, tid)) == (0, 12)  # theirs kept
    assert rec.drifted == {NICE: 12}
    again = ledger.restore(rec)
    assert not again.drift and not again.restored  # counted once: the drifted nice is theirs, not held


@needs_root
def test_reused_tid_is_not_restored(tmp_path, children):
    child = children.spawn(["led-f"])
    tid = child.threads["led-f"]
    ledger = RestoreLedger(str(tmp_path))
    impostor = ledger.record(tid, child.pid, _start_time(tid) - 1, "led-f")
    impostor.originals[NICE], impostor.written[NICE] = 7, 0
    outcome = ledger.restore_all()
    assert outcome.gone == 1 and not outcome.restored
    assert nice_of(child.pid, tid) == 0  # the 7 of the earlier thread with this tid is not written
    assert not ledger.records


def test_gone_thread_is_dropped(tmp_path, children):
    child = children.spawn(["led-g"])
    tid = child.threads["led-g"]
    ledger = RestoreLedger(str(tmp_path))
    rec = _record(ledger, child.pid, tid, "led-g")
    _write(rec, {NICE: 4})
    children.kill_all()
    outcome = ledger.restore_all()
    assert outcome.gone == 1 and not outcome.failed and not ledger.records


@pytest.mark.parametrize("seed", range(4))
def test_a_save_that_compares_only_the_changed_records_leaves_the_file_a_whole_save_would(tmp_path, seed):
    """The ledger tells the state file which records were added, forgotten or changed since its
    last save (their applied and drifted values say so themselves); after each of a random
    sequence of changes, what a later start loads is every record that holds something."""
    import random
    rng = random.Random(seed)
    ledger = RestoreLedger(str(tmp_path / f"state-{seed}"))
    for step in range(120):
        action = rng.choice(["new", "apply", "drop", "drift", "forget", "forget"])
        recs = list(ledger.records.values())
        if action == "new" or not recs:
            tid = rng.randrange(100, 400)
            rec = ledger.record(tid, tid, 1, "t")
            rec.originals[NICE], rec.written[NICE] = 0, rng.choice([5, 19])
        elif action == "apply":
            rec = rng.choice(recs)
            rec.originals[POLICY], rec.written[POLICY] = (0, 0), (rng.choice([3, 5]), 0)
        elif action == "drop":
            rng.choice(recs).written.pop(NICE, None)
        elif action == "drift":
            rec = rng.choice(recs)
            rec._drift(NICE, 7, ApplyResult()) if NICE in rec.written else rec.drifted.setdefault(AFFINITY, (1,))
        else:
            ledger.forget(rng.choice(recs))
        if rng.random() < 0.5:
            continue
        ledger.save()
        again = RestoreLedger(ledger.state_dir)
        found = again.load()
        expected = {key: (dict(rec.written), dict(rec.drifted)) for key, rec in ledger.records.items()
                    if rec.written or rec.drifted}
        if not any(rec.written for rec in ledger.records.values()):
            expected = {}  # nothing to undo: no file (drift alone is theirs)
        assert found == bool(expected), (seed, step)
        assert {key: (dict(rec.written), dict(rec.drifted)) for key, rec in again.records.items()} == expected, \
            (seed, step, action)


def test_held_counts_the_records_that_hold_a_setting_through_every_kind_of_change(tmp_path):
    """held() recounts only the records changed since its last call: after each of a random
    sequence of records made, settings written, given back and popped, records forgotten and the
    ledger cleared, it equals a count over every record."""
    import random
    rng = random.Random(7)
    ledger = RestoreLedger(str(tmp_path))
    for step in range(300):
        records = list(ledger.records.values())
        action = rng.choice(["add", "add", "write", "write", "pop", "clear_applied", "forget", "clear"])
        if action == "add" or not records:
            tid = rng.randrange(1, 60)
            ledger.record(tid, tid, 1000 + tid, f"t{tid}", since=1)
        elif action == "write":
            rng.choice(records).written[rng.choice([NICE, POLICY])] = 5
        elif action == "pop":
            rng.choice(records).written.pop(NICE, None)
        elif action == "clear_applied":
            rng.choice(records).written.clear()
        elif action == "forget":
            ledger.forget(rng.choice(records))
        elif action == "clear" and rng.random() < 0.1:
            ledger.clear()
        if rng.random() < 0.5:
            assert ledger.held() == sum(1 for rec in ledger.records.values() if rec.written), (step, action)


def test_a_record_is_marked_changed_only_when_its_values_change(tmp_path):
    """The state file compares the records marked since its last save: a pop of a value that is
    not there, or a setdefault of one that is, changes nothing and marks nothing."""
    ledger = RestoreLedger(str(tmp_path))
    rec = ledger.record(5, 5, 1005, "t5", since=1)
    rec.written[NICE] = 5
    ledger._changed.clear()
    assert rec.written.pop(POLICY, None) is None and rec.written.setdefault(NICE, 9) == 5
    assert not ledger._changed
    assert rec.written.pop(NICE) == 5 and ledger._changed == {rec.key}


def test_a_threads_settings_follow_the_held_rules_one_sched_setattr_a_write(tmp_path, monkeypatch):
    """Originals recorded and journalled before the first write; policy and nice written together,
    and given back together; drift left as found."""
    kernel = FakeKernel(cpus=range(4))
    kernel.install(monkeypatch)
    kernel.add(100, 100, 5, "one")
    calls = []
    monkeypatch.setattr(sched, "set_sched", lambda tid, **kw: (calls.append(kw), kernel.set_sched(tid, **kw))[1])
    ledger = RestoreLedger(str(tmp_path), online_cpus=lambda: kernel.cpus)
    ledger.now_online()
    rec = ledger.record(100, 100, 5, "one", since=1)
    result = ApplyResult()
    pending = rec.intend({AFFINITY: (1,), POLICY: (sched.SCHED_BATCH, 0), NICE: 10}, result, {})
    ledger.save()
    journalled = RestoreLedger(str(tmp_path))
    assert journalled.load() and journalled.get(100, 5).originals == {AFFINITY: (0, 1, 2, 3), POLICY: (0, 0), NICE: 0}
    assert kernel.threads[100].nice == 0  # not written yet
    rec.carry_out(pending, result)
    assert result.applied == {AFFINITY: 1, POLICY: 1, NICE: 1} and len(calls) == 1
    assert (kernel.threads[100].affinity, kernel.threads[100].policy, kernel.threads[100].nice) == \
        (frozenset({1}), sched.SCHED_BATCH, 10)
    kernel.set_sched(100, nice=3)  # someone else
    done = ledger.restore_all()
    assert (done.restored, done.drift, len(calls)) == ({AFFINITY: 1, POLICY: 1}, {NICE: 1}, 2)
    assert (kernel.threads[100].affinity, kernel.threads[100].policy, kernel.threads[100].nice) == \
        (frozenset(range(4)), sched.SCHED_OTHER, 3)
    assert not ledger.records


def test_a_thread_recorded_again_under_another_process_is_listed_under_that_one_alone(tmp_path):
    """by_pid lists the ledger's records, even where a malformed state file named one thread in two processes."""
    ledger = RestoreLedger(str(tmp_path))
    first, second = ThreadRecord(7, 100, 50, "t"), ThreadRecord(7, 200, 50, "t")
    ledger.add(first)
    ledger.add(second)
    assert (ledger.by_pid(100), ledger.by_pid(200), ledger.holds_pid(100)) == ([], [second], False)
    ledger.forget(first)  # the record the ledger holds under that key goes, from its own process's list too
    assert (ledger.records, ledger.by_pid(200), ledger.holds_any()) == ({}, [], False)
