"""What the daemon reacts to: CPU hotplug uevents (udev/kernel netlink) and config edits (debounced)."""

import os
import threading
import time

import pytest

from temperd.sources.watch import ConfigWatcher, CpuHotplugWatcher, Debouncer, is_config_edit
from thread_children import holds, wait_until

UEVENT = "/sys/devices/system/cpu/cpu0/uevent"


def test_cpu_uevent_reaches_the_hotplug_watcher():
    """A real kernel uevent for a CPU device ("change", harmless: nothing goes offline)."""
    if not os.access(UEVENT, os.W_OK):
        pytest.skip(f"{UEVENT} is not writable here")
    fired = threading.Event()
    watcher = CpuHotplugWatcher(fired.set)
    watcher.start()
    try:
        if not watcher.active:
            pytest.skip(watcher.reason)
        time.sleep(0.2)
        with open(UEVENT, "w") as handle:
            handle.write("change")
        assert fired.wait(3), "no cpu uevent seen"
    finally:
        watcher.stop()


def test_config_edits_are_debounced_into_one_reload_within_half_a_second(tmp_path, monkeypatch):
    from temperd.sources import watch

    judged = []  # (paths, edit?) of every event the watcher saw, in order
    real_is_config_edit = watch.is_config_edit

    def recording(event_type, is_directory, paths):
        edit = real_is_config_edit(event_type, is_directory, paths)
        judged.append((" ".join(str(p) for p in paths), edit))
        return edit
    monkeypatch.setattr(watch, "is_config_edit", recording)
    (tmp_path / "profiles.d").mkdir()
    calls = []
    watcher = ConfigWatcher(str(tmp_path), str(tmp_path / "profiles.d"), lambda: calls.append(time.monotonic()))
    watcher.start()
    try:
        time.sleep(0.2)
        start = time.monotonic()
        for i in range(5):  # an editor's several writes
            (tmp_path / "profiles.d" / "a.toml").write_text(f"# edit {i}\n")
            time.sleep(0.02)
        deadline = time.monotonic() + 2
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        # No second call: the span is twice the debounce, in which a trailing poke would have fired.
        holds(lambda: len(calls) == 1, 2 * watcher.debouncer.delay_s, "one call for the five writes")
        assert calls[0] - start < 0.5
        (tmp_path / "notes.txt").write_text("not a toml file\n")
        (tmp_path / "profiles.d" / "b.toml").write_text("")  # its events come after notes.txt's
        assert wait_until(lambda: any("b.toml" in paths for paths, _ in judged), 5)
        notes = [edit for paths, edit in judged if "notes.txt" in paths]
        assert notes and not any(notes), "non-TOML files do not trigger a reload"
    finally:
        watcher.stop()


def test_debouncer_runs_once_after_the_last_poke():
    calls = []
    debouncer = Debouncer(0.05, lambda: calls.append(1))
    for _ in range(10):
        debouncer.poke()
    # The last poke's timer is the only one left: once it has run, no other call can come.
    assert wait_until(lambda: calls and not debouncer._timer.is_alive(), 5)
    assert calls == [1]


def test_reading_the_configuration_is_not_an_edit():
    """watchdog >= 2.3 reports opens and read-only closes: counting them made every reload start the next."""
    toml = ["/etc/temper/temperd.toml", ""]
    assert not is_config_edit("opened", False, toml)
    assert not is_config_edit("closed_no_write", False, toml)
    assert is_config_edit("closed", False, toml) and is_config_edit("modified", False, toml)
    assert is_config_edit("moved", False, ["/etc/temper/profiles.d/a.toml.tmp", "/etc/temper/profiles.d/a.toml"])
    assert not is_config_edit("modified", False, ["/etc/temper/notes.txt", ""])
    assert is_config_edit("created", True, ["/etc/temper/profiles.d", ""])
    assert not is_config_edit("modified", True, ["/etc/temper/profiles.d", ""])
