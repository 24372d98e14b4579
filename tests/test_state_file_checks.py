"""The state file is read only as temperd writes it (a regular file of the daemon's user, writable
by nobody else, bounded), a bad line costs its own entry, and an append that fails leaves the
file as it was before it."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal

import pytest

from temperd.backends.native import state_file
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.thread_settings import NICE, ThreadRecord


def _record(tid, pid, start_time, comm, nice=5):
    """A record that wrote `nice` over an original 0."""
    rec = ThreadRecord(tid, pid, start_time, comm, since=1)
    rec.originals[NICE], rec.written[NICE] = 0, nice
    return rec
LEDGER_LOG = "temperd.backends.native.restore_ledger"


def _saved(directory, count=3):
    ledger = RestoreLedger(str(directory))
    for tid in range(100, 100 + count):
        ledger.add(_record(tid, 100, 5000 + tid, f"t{tid}"))
    ledger.save()
    return ledger


def _refusal(directory):
    """The one-line error a load of the directory's state file gives, within two seconds."""

    def hung(*_):
        raise TimeoutError("the load did not return")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(state_file.StateFileError) as info:
            RestoreLedger(str(directory)).load()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    message = str(info.value)
    assert message.startswith(os.path.join(str(directory), "native-state.json") + ": ") and "\n" not in message
    return message


def test_a_state_file_others_may_write_is_refused(tmp_path):
    ledger = _saved(tmp_path)
    os.chmod(ledger.path, 0o666)
    assert "refused: writable by others" in _refusal(tmp_path)


def test_a_fifo_in_place_of_the_state_file_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "native-state.json", 0o600)
    assert "refused: a FIFO, expected a regular file" in _refusal(tmp_path)


def test_a_state_file_reached_through_a_symbolic_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _saved(elsewhere)
    os.symlink(elsewhere / "native-state.json", tmp_path / "native-state.json")
    assert "refused: a symbolic link, expected a regular file" in _refusal(tmp_path)


def test_a_line_longer_than_the_file_bound_costs_only_itself(tmp_path, monkeypatch):
    # One 100 MB line in a journal: the file is read line by line, that line through in pieces.
    monkeypatch.setattr(state_file, "MAX_LINE_BYTES", 4096)
    monkeypatch.setattr(state_file, "MAX_FILE_BYTES", 16384)
    ledger = _saved(tmp_path, 2)
    with open(ledger.path, "ab") as handle:
        handle.write(b"x" * (state_file.MAX_FILE_BYTES * 3) + b"\n")
        ledger.get(101, 5101).written[NICE] = 9
        handle.write(json.dumps({"thread": ledger.get(101, 5101).as_json()}).encode() + b"\n")
    again = RestoreLedger(str(tmp_path))
    assert again.load() is True and again.skipped == ["line 4"]
    assert sorted(again.records) == [(100, 5100), (101, 5101)] and again.get(101, 5101).written == {NICE: 9}


def test_a_journal_past_the_read_bound_keeps_what_came_before_and_names_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(state_file, "MAX_READ_BYTES", 2048)
    ledger = _saved(tmp_path, 2)
    os.truncate(ledger.path, 1 << 40)  # sparse: a terabyte of zeros after the records, no disk used
    again = RestoreLedger(str(tmp_path))
    assert again.load() is True
    assert sorted(again.records) == [(100, 5100), (101, 5101)]
    assert len(again.skipped) == 1 and again.skipped[0].startswith("line 4 and after (past 2048 bytes")


def test_a_version_1_file_over_the_bound_is_refused_unread(tmp_path):
    path = tmp_path / "native-state.json"
    path.write_bytes(b'{"version": 1, "threads": []}')
    os.chmod(path, 0o600)
    os.truncate(path, state_file.MAX_FILE_BYTES + 1)  # sparse: no disk used
    assert f"expected at most {state_file.MAX_FILE_BYTES}" in _refusal(tmp_path)


def test_a_bad_line_in_the_middle_costs_its_entry_and_is_named_once(tmp_path, caplog):
    ledger = _saved(tmp_path, 3)
    with open(ledger.path, "ab") as handle:
        handle.write(b"garbage!!\n")
        handle.write(b"\xff\xfe not text\n")
        handle.write(b"[" * 100_000 + b"\n")  # nested past the parser's recursion limit
        ledger.get(101, 5101).written[NICE] = 9
        handle.write(json.dumps({"thread": ledger.get(101, 5101).as_json()}).encode() + b"\n")
    with caplog.at_level(logging.WARNING, logger=LEDGER_LOG):
        again = RestoreLedger(str(tmp_path))
        assert again.load() is True
    assert sorted(again.records) == [(100, 5100), (101, 5101), (102, 5102)]
    assert again.get(101, 5101).written == {NICE: 9}
    assert again.skipped == ["line 5", "line 6", "line 7"]
    said = [r.getMessage() for r in caplog.records if r.name == LEDGER_LOG]
    assert len(said) == 1 and "line 5, line 6, line 7" in said[0] and ledger.path in said[0]


def test_a_line_over_the_line_bound_is_skipped_without_parsing_it(tmp_path):
    ledger = _saved(tmp_path, 2)
    entry = {"thread": dict(ledger.get(100, 5100).as_json(), comm="x" * state_file.MAX_LINE_BYTES)}
    with open(ledger.path, "a") as handle:
        handle.write(json.dumps(entry) + "\n")  # valid JSON: only its length is wrong
    again = RestoreLedger(str(tmp_path))
    assert again.load() is True and again.skipped == ["line 4"]
    assert again.get(100, 5100).comm == "t100"  # the earlier line stands


def _failing_writes(monkeypatch, path, after):
    """os.write of the state file writes `after` bytes, then fails with ENOSPC, as a full disk does."""
    real = os.write
    inode = os.stat(path).st_ino
    left = [after]

    def write(fd, data):
        if os.fstat(fd).st_ino != inode:
            return real(fd, data)
        if not left[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done = real(fd, bytes(data[:left[0]]))
        left[0] -= done
        return done

    monkeypatch.setattr(state_file.os, "write", write)


def test_an_append_cut_short_by_a_full_disk_is_taken_back(tmp_path, monkeypatch):
    ledger = _saved(tmp_path, 3)
    with open(ledger.path, "rb") as handle:
        before = handle.read()
    ledger.get(101, 5101).written[NICE] = 9
    _failing_writes(monkeypatch, ledger.path, after=20)
    with pytest.raises(OSError) as info:
        ledger.save()
    assert info.value.errno == errno.ENOSPC
    with open(ledger.path, "rb") as handle:
        assert handle.read() == before  # no part of the failed line stays
    monkeypatch.undo()
    ledger.save()  # the change is written at the next save that can
    again = RestoreLedger(str(tmp_path))
    assert again.load() is True and again.get(101, 5101).written == {NICE: 9} and not again.skipped


def test_a_failed_append_that_cannot_be_cut_back_is_followed_by_a_whole_write(tmp_path, monkeypatch):
    ledger = _saved(tmp_path, 3)
    ledger.get(101, 5101).written[NICE] = 9
    _failing_writes(monkeypatch, ledger.path, after=20)

    def refused(*_):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(state_file.os, "ftruncate", refused)
    with pytest.raises(OSError):
        ledger.save()
    monkeypatch.undo()
    ledger.get(102, 5102).written[NICE] = 7
    ledger.save()  # not appended after the 20 bytes left: they would spoil the line after them
    again = RestoreLedger(str(tmp_path))
    assert again.load() is True and not again.skipped
    assert again.get(101, 5101).written == {NICE: 9} and again.get(102, 5102).written == {NICE: 7}
