"""The state file's journal: a change appends its own lines, a load replays them, a torn last
line is dropped, the file is rewritten whole before it outgrows what it holds, and a file of the
earlier one-document format is still read."""

import json
import os

from temperd.backends.native import state_file
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.thread_settings import NICE, ThreadRecord


def _record(tid, pid, start_time, comm, nice=5):
    """A record that wrote `nice` over an original 0."""
    rec = ThreadRecord(tid, pid, start_time, comm, since=1)
    rec.originals[NICE], rec.written[NICE] = 0, nice
    return rec


def _ledger(tmp_path, count):
    ledger = RestoreLedger(str(tmp_path))
    for tid in range(100, 100 + count):
        ledger.add(_record(tid, 100, 5000 + tid, f"t{tid}"))
    return ledger


def _lines(path):
    with open(path) as handle:
        return handle.read().splitlines()


def _reloaded(tmp_path):
    again = RestoreLedger(str(tmp_path))
    assert again.load() is True
    return again


def test_a_change_appends_only_its_own_record_and_a_load_sees_the_latest(tmp_path):
    ledger = _ledger(tmp_path, 50)
    ledger.save()
    whole = _lines(ledger.path)
    assert len(whole) == 1 + 50 and json.loads(whole[0])["version"] == state_file.STATE_VERSION
    inode = os.stat(ledger.path).st_ino
    ledger.get(107, 5107).written[NICE] = 9
    ledger.save()
    after = _lines(ledger.path)
    assert os.stat(ledger.path).st_ino == inode and after[:51] == whole  # appended, not rewritten
    assert [json.loads(line)["thread"]["tid"] for line in after[51:]] == [107]
    assert _reloaded(tmp_path).get(107, 5107).written == {NICE: 9}


def test_an_unchanged_state_writes_nothing_and_a_file_removed_behind_its_back_is_written_whole(tmp_path):
    ledger = _ledger(tmp_path, 3)
    ledger.save()
    before = os.stat(ledger.path)
    ledger.save()
    assert os.stat(ledger.path).st_size == before.st_size and os.stat(ledger.path).st_mtime_ns == before.st_mtime_ns
    os.unlink(ledger.path)
    ledger.save()
    assert len(_lines(ledger.path)) == 1 + 3


def test_a_forgotten_thread_is_gone_after_a_load(tmp_path):
    ledger = _ledger(tmp_path, 4)
    ledger.save()
    ledger.forget(ledger.get(101, 5101))
    ledger.save()
    assert json.loads(_lines(ledger.path)[-1]) == {"gone": [101, 5101]}
    assert sorted(key[0] for key in _reloaded(tmp_path).records) == [100, 102, 103]


def test_sections_append_the_entries_that_changed_and_load_as_they_stand(tmp_path):
    ledger = _ledger(tmp_path, 1)
    ledger.extras["idle_cgroup"] = {"originals": {f"{t}/1": "/" for t in range(200)},
                                    "written": {f"{t}/1": "/temperd-yield" for t in range(200)}}
    ledger.save()
    ledger.extras["idle_cgroup"] = {"originals": {f"{t}/1": "/" for t in range(1, 201)},
                                    "written": {f"{t}/1": "/temperd-yield" for t in range(1, 201)}}
    ledger.extras["pmqos"] = {"originals": {"0": "0"}, "written": {"0": "20"}}
    ledger.save()
    last = [json.loads(line) for line in _lines(ledger.path)[-2:]]
    idle = next(entry for entry in last if entry["section"] == "idle_cgroup")
    assert idle["set"] == {"originals": {"200/1": "/"}, "written": {"200/1": "/temperd-yield"}}
    assert idle["drop"] == {"originals": ["0/1"], "written": ["0/1"]}
    again = _reloaded(tmp_path)
    assert again.extras == ledger.extras


def test_a_line_cut_short_by_a_kill_is_dropped(tmp_path):
    ledger = _ledger(tmp_path, 2)
    ledger.save()
    with open(ledger.path, "a") as handle:
        handle.write('{"thread": {"tid": 100, "start_ti')  # the write a kill cut short
    assert sorted(key[0] for key in _reloaded(tmp_path).records) == [100, 101]


def test_the_file_is_rewritten_whole_before_its_appends_outgrow_what_it_holds(tmp_path):
    ledger = _ledger(tmp_path, 10)
    ledger.save()
    rounds = state_file.COMPACT_AFTER + 5
    for n in range(rounds):
        ledger.get(100 + n % 10, 5100 + n % 10).written[NICE] = n % 7 + 1
        ledger.save()
    assert ledger.file.whole_writes >= 2 and ledger.file.appends >= state_file.COMPACT_AFTER - 1
    assert len(_lines(ledger.path)) <= 1 + 10 + state_file.COMPACT_AFTER
    again = _reloaded(tmp_path)
    assert {key: rec.written for key, rec in again.records.items()} == \
        {key: rec.written for key, rec in ledger.records.items()}


def test_a_state_file_of_the_earlier_one_document_format_is_read(tmp_path):
    record = {"tid": 42, "pid": 42, "start_time": 777, "comm": "old", "since": 1, "applied": {"nice": 3}, "drifted": {},
              "original": {"affinity": [0, 1], "policy": 0, "priority": 0, "nice": 0, "slice_ns": 0}}
    (tmp_path / "native-state.json").write_text(json.dumps(
        {"version": 1, "writer_pid": 1, "written_at": 0, "threads": [record],
         "pmqos": {"originals": {"0": "0"}, "written": {"0": "20"}}}, indent=1))
    again = _reloaded(tmp_path)
    assert again.get(42, 777).written == {NICE: 3} and again.extras["pmqos"]["written"] == {"0": "20"}


def test_nothing_left_to_undo_removes_the_file(tmp_path):
    ledger = _ledger(tmp_path, 2)
    ledger.save()
    for rec in list(ledger.records.values()):
        rec.written.clear()
    ledger.save()
    assert not os.path.exists(ledger.path)


def test_nothing_waits_for_the_disk_what_the_file_describes_ends_with_the_boot(tmp_path, monkeypatch):
    def refused(*_args):
        raise AssertionError("the state file was synced to disk")

    monkeypatch.setattr(os, "fsync", refused)
    monkeypatch.setattr(os, "fdatasync", refused)
    ledger = _ledger(tmp_path, 3)
    ledger.save()  # whole
    ledger.get(100, 5100).written[NICE] = 7
    ledger.save()  # appended
    assert _reloaded(tmp_path).get(100, 5100).written == {NICE: 7}


def test_any_stream_of_changes_and_failed_writes_loads_as_the_records_stand(tmp_path, monkeypatch):
    """Saves that append, compact, or fail (an append cut back, a whole write refused) in any
    order: the file loads as the records stood at the last save that succeeded, and a save after
    a failure writes what the failed one did not."""
    import random

    draw = random.Random(7)
    ledger = _ledger(tmp_path, 20)
    ledger.save()
    real_append, real_whole = state_file.StateFile._append, state_file.StateFile._write_whole
    failing = {"append": False, "whole": False}

    def append(self, data, count):
        if failing["append"]:
            raise OSError(28, "No space left on device")
        return real_append(self, data, count)

    def whole(self, threads, sections):
        if failing["whole"]:
            raise OSError(28, "No space left on device")
        return real_whole(self, threads, sections)

    monkeypatch.setattr(state_file.StateFile, "_append", append)
    monkeypatch.setattr(state_file.StateFile, "_write_whole", whole)
    monkeypatch.setattr(state_file, "COMPACT_AFTER", 4)  # whole writes among the appends
    next_tid = 200
    for _ in range(400):
        step = draw.random()
        keys = sorted(ledger.records)
        if step < 0.4 and keys:
            ledger.get(*draw.choice(keys)).written[NICE] = draw.randrange(1, 20)  # marks it changed
        elif step < 0.6 and keys:
            ledger.forget(ledger.get(*draw.choice(keys)))
        else:
            ledger.add(_record(next_tid, 100, 9000 + next_tid, f"t{next_tid}", nice=draw.randrange(1, 20)))
            next_tid += 1
        failing["append"], failing["whole"] = draw.random() < 0.15, draw.random() < 0.15
        if draw.random() < 0.05 and os.path.exists(ledger.path):
            os.unlink(ledger.path)  # removed behind its back: written whole
        try:
            ledger.save()
        except OSError:
            continue
        if ledger.is_empty():
            assert not os.path.exists(ledger.path)
            continue
        again = _reloaded(tmp_path)
        assert {key: rec.written for key, rec in again.records.items()} == \
            {key: rec.written for key, rec in ledger.records.items() if rec.written}
