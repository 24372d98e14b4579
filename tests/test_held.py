"""Held settings (the one mechanism behind PM QoS bounds, cgroup weights and autogroup nices):
original recorded once before the first write, drift, restore, adopt, and settings that vanish."""

from __future__ import annotations

import errno
import json
from typing import Dict, List, Optional, Tuple

from temperd.backends.native.held import HeldSettings, Refused, Setting


class Knobs(Setting[str, int]):
    """Values in a dict, as another writer or the kernel would leave them; every call logged."""

    kind = "knob"

    def __init__(self, **values: int):
        self.values: Dict[str, int] = dict(values)
        self.log: List[Tuple[str, str, Optional[int]]] = []
        self.refuse: Dict[str, BaseException] = {}  # key -> what write() raises

    def read(self, key: str) -> Optional[int]:
        self.log.append(("read", key, None))
        return self.values.get(key)

    def write(self, key: str, value: int) -> None:
        self.log.append(("write", key, value))
        if key in self.refuse:
            raise self.refuse[key]
        if key not in self.values:
            raise OSError(errno.ENOENT, "No such file or directory")
        self.values[key] = value


def test_original_is_recorded_once_before_the_first_write():
    knobs = Knobs(a=1, b=2)
    held = HeldSettings(knobs)
    seen_at_save = []
    result = held.hold({"a": 10, "b": 20}, before_write=lambda: seen_at_save.append(
        (dict(held.originals), dict(held.written), dict(knobs.values))))
    assert (result.applied, result.failed) == ({"knob": 2}, {})
    # When the caller saves its state, the originals and the intended values are recorded and
    # nothing is written yet: a kill after the save can be undone.
    assert seen_at_save == [({"a": 1, "b": 2}, {"a": 10, "b": 20}, {"a": 1, "b": 2})]
    assert knobs.values == {"a": 10, "b": 20}
    # A new value later: the original stays the first one, not temperd's own earlier value.
    assert held.hold({"a": 11, "b": 20}).applied == {"knob": 1}
    assert held.originals == {"a": 1, "b": 2} and knobs.values["a"] == 11
    # Nothing to change: no write, and no save asked for.
    knobs.log.clear()
    assert held.hold({"a": 11, "b": 20}, before_write=lambda: seen_at_save.append("again")).applied == {}
    assert not [entry for entry in knobs.log if entry[0] == "write"] and len(seen_at_save) == 1


def test_restore_puts_the_original_back_and_forgets():
    knobs = Knobs(a=1, b=2)
    held = HeldSettings(knobs)
    held.hold({"a": 10, "b": 20})
    shrink = held.hold({"b": 20})  # a no longer wanted: restored at once
    assert shrink.restored == {"knob": 1} and knobs.values == {"a": 1, "b": 20}
    done = held.restore_all()
    assert (done.restored, done.failed, done.drift) == ({"knob": 1}, {}, {})
    assert knobs.values == {"a": 1, "b": 2}
    assert not held.originals and not held.written and not held.drifted
    assert held.restore_all().restored == {}  # nothing held: nothing written
    assert knobs.log[-1][0] == "write" and knobs.log[-1][1] == "b"


def test_drift_is_counted_once_never_fought_and_left_as_found():
    knobs = Knobs(a=1)
    held = HeldSettings(knobs)
    held.hold({"a": 10})
    knobs.values["a"] = 7  # someone else
    found = held.hold({"a": 10})
    assert (found.drift, found.applied) == ({"knob": 1}, {})
    assert knobs.values["a"] == 7 and held.drifted == {"a": 7}
    assert held.hold({"a": 10}).drift == {}  # counted once
    assert held.hold({"a": 12}).applied == {}  # theirs: not written, even for a new value
    done = held.restore_all()
    assert (done.restored, done.drift) == ({}, {})
    assert knobs.values["a"] == 7


def test_a_setting_found_theirs_when_no_longer_wanted_stays_theirs():
    knobs = Knobs(a=1)
    held = HeldSettings(knobs)
    held.hold({"a": 10})
    knobs.values["a"] = 7  # someone else
    assert held.hold({}).drift == {"knob": 1}  # given back: found theirs, left
    assert held.drifted == {"a": 7} and not held.written and held.state() == {}  # nothing to restore after a kill
    assert held.hold({"a": 10}).applied == {} and knobs.values["a"] == 7  # wanted again: still theirs


def test_a_change_found_at_restore_is_drift_and_left():
    knobs = Knobs(a=1)
    held = HeldSettings(knobs)
    held.hold({"a": 10})
    knobs.values["a"] = 5  # changed after temperd's last look
    done = held.restore_all()
    assert (done.restored, done.drift) == ({}, {"knob": 1})
    assert knobs.values["a"] == 5


def test_a_vanished_setting_is_forgotten_without_error():
    knobs = Knobs(a=1, b=2)
    held = HeldSettings(knobs)
    held.hold({"a": 10, "b": 20})
    del knobs.values["a"]  # the CPU, cgroup or process went away
    again = held.hold({"a": 10, "b": 20})
    assert (again.applied, again.failed, again.errors) == ({}, {}, [])
    assert "a" not in held.originals and "a" not in held.written
    del knobs.values["b"]
    done = held.restore_all()
    assert (done.restored, done.failed, done.errors) == ({}, {}, [])
    # Gone between the read and the write (ENOENT): not a failure either, and nothing held.
    knobs.values["c"] = 3
    knobs.refuse["c"] = OSError(errno.ENOENT, "No such file or directory")
    assert held.hold({"c": 30}).failed == {} and not held.written


def test_a_refused_first_write_leaves_nothing_to_restore():
    knobs = Knobs(a=1, b=2)
    knobs.refuse["a"] = OSError(errno.EACCES, "Permission denied")
    held = HeldSettings(knobs)
    result = held.hold({"a": 10, "b": 20})
    assert (result.applied, result.failed) == ({"knob": 1}, {"knob": 1})
    assert result.errors == ["a: setting 10: Permission denied"]
    assert "a" not in held.originals and "a" not in held.written
    del knobs.refuse["a"]
    held.hold({"a": 10, "b": 20})
    knobs.refuse["a"] = Refused("systemctl exited 1")
    later = held.hold({"a": 11, "b": 20})  # refused again: what was written before still holds
    assert later.errors == ["a: setting 11: systemctl exited 1"] and held.written["a"] == 10
    del knobs.refuse["a"]
    assert held.restore_all().restored == {"knob": 2} and knobs.values == {"a": 1, "b": 2}


def test_unreadable_setting_is_a_failure_not_a_change():
    class Unreadable(Knobs):
        def read(self, key):
            raise Refused("systemctl show failed")

    held = HeldSettings(Unreadable(a=1))
    result = held.hold({"a": 10})
    assert (result.applied, result.failed) == ({}, {"knob": 1})
    assert result.errors == ["a: cannot read the current value: systemctl show failed"]
    assert not held.written


def test_adopt_after_a_crash_restores_the_predecessors_originals():
    knobs = Knobs(a=1, b=2)
    crashed = HeldSettings(knobs)
    crashed.hold({"a": 10, "b": 20})
    section = json.loads(json.dumps(crashed.state()))  # through the state file
    assert section == {"originals": {"a": 1, "b": 2}, "written": {"a": 10, "b": 20}}
    knobs.values["b"] = 9  # someone else changed b after the crash
    fresh = HeldSettings(knobs)
    fresh.adopt_state(section)
    done = fresh.restore_all()
    assert (done.restored, done.drift) == ({"knob": 1}, {"knob": 1})
    assert knobs.values == {"a": 1, "b": 9}
    assert fresh.state() == {}


def test_keys_come_back_from_the_state_file_as_their_type():
    class Cpus(Knobs):
        def key_from_text(self, text):
            return int(text)

    knobs = Cpus()
    knobs.values = {0: 0, 1: 0}
    crashed = HeldSettings(knobs)
    crashed.hold({1: 25})
    section = json.loads(json.dumps(crashed.state()))
    assert section["written"] == {"1": 25}
    fresh = HeldSettings(knobs)
    fresh.adopt_state(section)
    assert fresh.written == {1: 25}
    assert fresh.restore_all().restored == {"knob": 1} and knobs.values == {0: 0, 1: 0}
