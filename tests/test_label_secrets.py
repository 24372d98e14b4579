"""A workload without a unit or a cgroup of its own is named by its profile, its program and a
digest of its command line: never the command line, which any local user would read on /metrics
(and an argument may be a password)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import uuid

import pytest

from facts_builder import FactsHost
from temperd.config.daemon_config import DaemonConfig
from temperd.config.profile import parse_profile
from temperd.decide.matcher import Matcher
from temperd.observe.workload_labels import workload_labels
from test_daemon_e2e import Temperd
from thread_children import wait_until

PROFILE = """schema_version = 1
id = "tmpd-secretive"
[fingerprint]
cmdline = ['tmpd-secretive-app']
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
"""


def _labels(*cmdlines):
    matcher = Matcher(DaemonConfig(), {"tmpd-secretive": parse_profile(PROFILE, "p.toml")})
    host = FactsHost()
    for cmdline in cmdlines:
        host.process("tpmc", exe="/opt/tp/bin/tpmc", cmdline=cmdline, cgroup="/")
    result = matcher.match(host.by_pid.values())
    return [workload_labels(result.workloads, lambda w: False)[w.key] for w in result.workloads]


def test_a_label_names_the_program_and_a_digest_never_the_command_line():
    secret = ("/opt/tp/bin/tpmc", "tmpd-secretive-app", "--port=7000", "--requirepass=TOPSECRET")
    (label,) = _labels(secret)
    assert label.startswith("tmpd-secretive: tpmc ") and len(label) <= 40, label
    assert not any(part in label for part in ("TOPSECRET", "requirepass", "7000", "/opt/tp"))
    # the same command line, started again: the same name (its history is kept under it)
    assert _labels(secret) == [label]
    other = secret[:2] + ("--port=7001", "--requirepass=TOPSECRET")
    assert sorted(_labels(secret, other)) == sorted([label, _labels(other)[0]]) and _labels(other) != [label]


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root")
def test_metrics_and_observe_of_the_real_daemon_carry_no_argument(tmp_path):
    secret = f"TOPSECRET{uuid.uuid4().hex[:8]}"
    daemon = Temperd(tmp_path)
    # /metrics' classes refreshed at each classification snapshot, not the default every 30 s
    with open(daemon.config_dir / "temperd.toml", "a") as config:
        config.write("[classify]\nmetrics_interval_s = 5.0\n")
    daemon.profiles.joinpath("tmpd-secretive.toml").write_text(PROFILE)
    # argv[0] "tpmc": a command line short enough that no bound on a label's length would cut it
    app = subprocess.Popen(["tpmc", "-c", "import sys;sys.stdin.read()", f"--requirepass={secret}", "tmpd-secretive-app"],
                           executable=sys.executable, stdin=subprocess.PIPE)
    daemon.start()
    try:
        scraped = []

        def classified():
            with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10) as reply:
                scraped[:] = [reply.read().decode()]
            return "tmpd-secretive" in scraped[0].partition("temperd_workload_class_info{")[2]
        assert wait_until(classified, 40, step_s=0.2), "the workload's class never came to /metrics"
        metrics = scraped[0]
        lines = [line for line in metrics.splitlines()
                 if line.startswith("temperd_workload_class_info{") and "tmpd-secretive" in line]
        observe = str(daemon.observe())
    finally:
        daemon.stop()
        app.stdin.close()
        app.wait(timeout=10)
    assert secret not in metrics and "requirepass" not in metrics, lines
    assert secret not in observe and "requirepass" not in observe
    python = os.path.basename(os.path.realpath(sys.executable))
    assert any(f'workload="tmpd-secretive: {python} ' in line for line in lines), lines


def test_the_digest_is_keyed_so_a_reader_cannot_test_guesses_of_an_argument():
    import hashlib
    cmdline = ("/opt/tp/bin/tpmc", "tmpd-secretive-app", "--requirepass=TOPSECRET")
    plain = hashlib.sha256("\0".join(cmdline).encode()).hexdigest()[:8]

    def label(key):
        matcher = Matcher(DaemonConfig(), {"tmpd-secretive": parse_profile(PROFILE, "p.toml")},
                          label_key=key)
        host = FactsHost()
        host.process("tpmc", exe="/opt/tp/bin/tpmc", cmdline=cmdline, cgroup="/")
        (workload,) = matcher.match(host.by_pid.values()).workloads
        return workload.instance

    one, other = label(b"k" * 32), label(b"j" * 32)
    assert one != other and plain not in one and plain not in other
    assert label(b"k" * 32) == one  # stable under one key


def test_the_label_key_is_made_once_kept_private_and_refused_when_others_may_write_it(tmp_path, caplog):
    from temperd.config.label_key import KEY_FILE, load_label_key
    key = load_label_key(str(tmp_path))
    path = tmp_path / KEY_FILE
    assert len(key) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_label_key(str(tmp_path)) == key  # read back: labels outlive a restart
    os.chmod(path, 0o666)
    with caplog.at_level("WARNING"):
        again = load_label_key(str(tmp_path))
    assert again != key and len(again) == 32
    assert any("writable by others" in r.getMessage() and "this run only" in r.getMessage() for r in caplog.records)
