"""Names and client-given text are escaped wherever temperd or temperctl prints or writes them: a
thread or process name holding ESC, an OSC sequence (a terminal title) or a newline cannot drive
the terminal, split a table row, forge a log line or inject a line into a trained profile; what a
client says of itself follows what the kernel says of it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from temperd.daemon.bind_commands import bind_refusal
from temperd.daemon.control import PEER, Peer, requester
from temperd.sources.facts import ProcessFacts
from temperd.text import PrintableFormatter, printable, printable_data
from temperd.training import analyze as A
from temperd.training.samples import ProcessInfo
from temperd.training.synthesize import synthesize
from test_training import SHAPE, thread, workload

ESC_NAME = "ev\x1b]0;pwn\x07\x1b[2J"  # sets the terminal's title, then clears the screen (15 bytes: a comm)
NEWLINE_NAME = "a\nqq = 2"


def test_printable_escapes_controls_and_leaves_text_alone():
    assert printable(ESC_NAME) == "ev\\x1b]0;pwn\\x07\\x1b[2J"
    assert printable(NEWLINE_NAME) == "a\\nqq = 2" and printable("x\r\u202eabc\x9b") == "x\\r\\u202eabc\\x9b"
    assert printable("postgres: app db 10.0.0.1(5432) idle — ünïcode") == "postgres: app db 10.0.0.1(5432) idle — ünïcode"
    assert printable_data({"k\n": [ESC_NAME, 3, None]}) == {"k\\n": ["ev\\x1b]0;pwn\\x07\\x1b[2J", 3, None]}


def test_a_log_line_stays_one_line():
    record = logging.LogRecord("temperd.match", logging.INFO, __file__, 1, "pid %d (%s): matched", (7, NEWLINE_NAME +
                               "\nINFO temperd: forged " + ESC_NAME), None)
    line = PrintableFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert "\n" not in line and "\x1b" not in line
    assert line == "INFO temperd.match: pid 7 (a\\nqq = 2\\nINFO temperd: forged ev\\x1b]0;pwn\\x07\\x1b[2J): matched"


def test_the_requester_is_the_kernels_word_first():
    said = {"requester": "uid 0\nINFO temperd: forged", PEER: Peer(4242, 54321, 54321)}
    assert requester(said) == "uid 54321 pid 4242 (uid 0\\nINFO temperd: forged)"
    assert requester({PEER: Peer(1, 0, 0)}).startswith("uid 0 (root) pid 1")


def _proc(pid, uid, kernel=False):
    return ProcessFacts(pid=pid, start_time=1, name="p", exe=None, cmdline=(), cgroup=None, cgroup_systemd=None,
                        unit=None, is_kernel_thread=kernel, ppid=1, threads={}, uid=uid)


def test_who_may_bind_what():
    member, root = Peer(10, 54321, 54321), Peer(11, 0, 0)
    protected = {1, os.getpid(), 555}
    assert "init process" in bind_refusal(1, _proc(1, 0), root, protected)
    assert "temperd itself" in bind_refusal(os.getpid(), _proc(os.getpid(), 0), root, protected)
    assert "an ancestor of temperd" in bind_refusal(555, _proc(555, 0), root, protected)
    assert "kernel thread" in bind_refusal(77, _proc(77, 0, kernel=True), root, protected)
    assert "belongs to uid 0, not to you (uid 54321)" in bind_refusal(900, _proc(900, 0), member, protected)
    assert bind_refusal(900, _proc(900, 54321), member, protected) is None  # its own
    assert bind_refusal(900, _proc(900, 1002), root, protected) is None  # root: anyone else's


def test_a_trained_profile_quotes_names_in_its_comments_escaped():
    wf = workload(thread(1, NEWLINE_NAME, 0.6, network=3000), thread(2, ESC_NAME, 0.0), thread(3, "loop", 0.4, network=2000))
    analysis = A.analyze(wf, 2.0, "test")
    root = ProcessInfo(pid=100, ppid=1, name=ESC_NAME, exe="/usr/bin/server", titles=["server"], unit=None, cgroup=None,
                       cpu_quota=None)
    text = synthesize(analysis, root, SHAPE)  # validates: no injected key
    assert "\nqq = 2" not in text and "\x1b" not in text and "\x07" not in text
    assert "a\\nqq = 2" in text and "ev\\x1b]0;pwn\\x07" in text


NAMED = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
         "print('ready', flush=True); time.sleep(60)")


@pytest.mark.root
@pytest.mark.parametrize("name", [ESC_NAME, NEWLINE_NAME])
def test_temperctl_prints_a_hostile_process_name_escaped(tmp_path, name):
    if os.geteuid() != 0:
        pytest.skip("explain --dry-run reads every process: root")
    etc = tmp_path / "etc"
    (etc / "profiles.d").mkdir(parents=True)
    (etc / "temperd.toml").write_text('backend = "native"\n')
    proc = subprocess.Popen([sys.executable, "-c", NAMED, name], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "temperctl"), "explain", str(proc.pid),
                              "--dry-run", "--config", str(etc)], capture_output=True, text=True, timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"process {proc.pid} ({printable(name)}), unit")
    assert len(lines) == 2 and lines[1].startswith("not treated:")
