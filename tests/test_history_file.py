"""The rightsizing history file is read like a configuration file, before temperd changes anything:
a link, a FIFO, a device, an oversized file, numbers out of range or nesting too deep are refused
in one log line, the file is kept aside as NAME.bad, and temperd starts without it. The temp files
of a write a killed run left unfinished are removed."""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest

from temperd.observe.usage_history import FORMAT_VERSION, MAX_FILE_BYTES, UsageHistory
from test_daemon_e2e import named  # noqa: F401 (a fixture)

DAY = 86400.0
GOOD = {"version": FORMAT_VERSION, "workloads": {"app.service": {
    "first_at": 1000.0, "last_at": 1600.0, "samples": 600, "rest": {}, "total": {"reference": 1000.0, "buckets": {"20": 1.0}},
    "threads": [{"tid": 100, "start_time": 1, "comm": "hot", "group": "workers",
                 "hist": {"reference": 1000.0, "buckets": {"80": 2.5}}}]}}}


def _text(samples="600", reference="1000.0", bucket="80"):
    return (json.dumps(GOOD).replace('"samples": 600', f'"samples": {samples}')
            .replace('"reference": 1000.0, "buckets": {"80"', f'"reference": {reference}, "buckets": {{"{bucket}"'))


def make_dev_zero_link(path):
    os.symlink("/dev/zero", path)


def make_fifo(path):
    os.mkfifo(path)


def make_oversized(path):
    with open(path, "wb") as handle:  # sparse: the size is refused before a byte is read
        handle.truncate(MAX_FILE_BYTES + 1)


BAD_FILES = {
    "a link to /dev/zero": (make_dev_zero_link, "symbolic link"),
    "a FIFO": (make_fifo, "FIFO"),
    "samples 1e999": (lambda p: open(p, "w").write(_text(samples="1e999")), "out of range"),
    "a reference of NaN": (lambda p: open(p, "w").write(_text(reference="NaN")), "not a number"),
    "a 400-digit number": (lambda p: open(p, "w").write(_text(samples="9" * 400)), "digits"),
    "a bucket past the histogram": (lambda p: open(p, "w").write(_text(bucket="100000")), "buckets"),
    "200 000 brackets deep": (lambda p: open(p, "w").write("[" * 200_000), "nested too deeply"),
    "oversized": (make_oversized, "expected at most"),
    "not the format": (lambda p: open(p, "w").write(json.dumps({"version": 99})), "version 99"),
}


def load_within(history: UsageHistory, seconds: float = 10.0) -> str:
    """load() in a thread: a FIFO that blocked the open would hang the test, not fail it."""
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("said", history.load()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"load() still blocked after {seconds} s"
    return out["said"]


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_history_file_is_set_aside_in_one_line(tmp_path, caplog, case):
    make, expected = BAD_FILES[case]
    path = tmp_path / "usage-history.json"
    make(str(path))
    kind = os.lstat(path).st_mode
    history = UsageHistory(str(path), DAY, 16)
    with caplog.at_level(logging.INFO, logger="temperd.rightsizing"):
        said = load_within(history)
    assert history.workloads == {}
    assert expected in said and "set aside as usage-history.json.bad" in said and "starting without it" in said
    assert [r.getMessage() for r in caplog.records] == [f"rightsizing history {said}"]
    assert caplog.records[0].levelno == logging.WARNING and "\n" not in said
    assert not os.path.lexists(path) and os.lstat(str(path) + ".bad").st_mode == kind  # the very file, kept
    history.save()  # what temperd writes next is a fresh history beside the copy
    assert UsageHistory(str(path), DAY, 16).load().endswith(": 0 workload(s)")


def test_a_good_history_file_loads_and_says_so_in_one_line(tmp_path, caplog):
    path = tmp_path / "usage-history.json"
    path.write_text(json.dumps(GOOD))
    history = UsageHistory(str(path), DAY, 16)
    with caplog.at_level(logging.INFO, logger="temperd.rightsizing"):
        said = history.load()
    assert said.endswith("1 workload(s)") and [r.levelno for r in caplog.records] == [logging.INFO]
    summary = history.workloads["app.service"].summary()
    assert summary.samples == 600 and [t.comm for t in summary.threads] == ["hot"]


def test_unfinished_writes_of_a_killed_run_are_removed_at_start(tmp_path):
    path = tmp_path / "usage-history.json"
    stale = [".usage-history.json.tmp-k2j4x9_a", ".usage-history.json.tmp-0"]
    kept = ["usage-history.json.bad", "native-state.json", ".other.json.tmp-1"]
    for name in stale + kept:
        (tmp_path / name).write_text("{")
    assert UsageHistory(str(path), DAY, 16).load().endswith("none yet")
    assert sorted(os.listdir(tmp_path)) == sorted(kept)


@pytest.mark.root
def test_a_history_file_writable_by_others_is_not_trusted(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the owner check applies when temperd runs as root")
    path = tmp_path / "usage-history.json"
    path.write_text(json.dumps(GOOD))
    os.chmod(path, 0o666)
    history = UsageHistory(str(path), DAY, 16)
    assert "writable by others" in history.load() and history.workloads == {}
    os.chown(str(path) + ".bad", 65534, 65534)
    (tmp_path / "usage-history.json").write_text(json.dumps(GOOD))
    os.chown(path, 65534, 65534)
    assert "owned by uid 65534" in UsageHistory(str(path), DAY, 16).load()


def temperd_with_history(tmp_path):
    """A temperd (tests/test_daemon_e2e.py) that yields the tmpd-fd* processes, with its history
    file in tmp_path; the file's path."""
    from test_daemon_e2e import YIELDER, Temperd

    temperd_ = Temperd(tmp_path)
    temperd_.profiles.joinpath("fdtest.toml").write_text(YIELDER)
    history = tmp_path / "usage-history.json"
    temperd_.write_config(history=False)
    with open(temperd_.config_dir / "temperd.toml", "a") as config:
        config.write(f'[rightsizing]\nhistory_file = "{history}"\n')
    return temperd_, history


@pytest.mark.servers
def test_temperd_checks_the_history_before_any_change_and_keeps_a_bad_one(tmp_path, named, monkeypatch):
    """In the daemon: the file is read before the first change to the host (a FIFO there once
    blocked a start that had already changed threads), and a start that fails later leaves the
    set-aside copy in place."""
    from click.testing import CliRunner

    from temperd.daemon import main as temperd_main
    from temperd.daemon.daemon import Daemon
    from temperd.daemon.services import Services
    from test_daemon_e2e import yielded

    workload = named("tmpd-fd1")
    temperd_, history = temperd_with_history(tmp_path)
    os.mkfifo(history)
    seen = {}
    load = UsageHistory.load

    def checked_load(self):
        seen["treated before"] = yielded(workload.pid)
        seen["state before"] = os.path.exists(temperd_.state_dir / "native-state.json")
        return load(self)

    def serve_fails(self, *args):
        seen["treated"] = yielded(workload.pid)
        raise RuntimeError("the hotplug watcher could not start")

    monkeypatch.setattr(UsageHistory, "load", checked_load)
    monkeypatch.setattr(Services, "serve", serve_fails)
    monkeypatch.setattr(Daemon, "install_signal_handlers", lambda self: None)
    result = CliRunner().invoke(temperd_main.main, ["--config", str(temperd_.config_dir), "--log-level", "error"])
    assert result.exit_code == 1 and "hotplug watcher" in result.output, result.output
    assert seen == {"treated before": False, "state before": False, "treated": True}
    assert os.path.lexists(str(history) + ".bad") and os.path.isfile(history)  # the FIFO kept aside


@pytest.mark.servers
def test_temperd_starts_without_a_history_it_cannot_read(tmp_path, named):
    from test_daemon_e2e import yielded
    from thread_children import wait_for

    workload = named("tmpd-fd1")
    temperd_, history = temperd_with_history(tmp_path)
    os.symlink("/dev/zero", history)
    try:
        temperd_.start()
        assert temperd_.status()["state"] == "running"
        wait_for(lambda: yielded(workload.pid), 10, "the workload treated")
    finally:
        assert temperd_.stop() == 0
    lines = [line for line in temperd_.logtext().splitlines() if "rightsizing history" in line]
    assert len(lines) == 1 and "symbolic link" in lines[0] and "starting without it" in lines[0], lines
    assert os.readlink(str(history) + ".bad") == "/dev/zero"
