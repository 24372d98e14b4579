"""scx_layered as a child process: start it, stop it, and say why it exited.

The child gets SIGTERM if the thread that started it dies (PR_SET_PDEATHSIG), so scx_layered
never outlives temperd. Its output goes to a log file; the `EXIT:` line it prints on the way
out (or its `Error:` line, or a panic) is the reason given for an exit.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import subprocess
from typing import Mapping, Sequence

log = logging.getLogger(__name__)

_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
PR_SET_PDEATHSIG = 1
# Exit statuses of a scx_layered that was told to stop: it catches SIGTERM, SIGINT and SIGHUP,
# detaches and exits 0 ("EXIT: unregistered from user space"); negative: killed by that signal
# before it installed its handler.
STOPPED_BY_SIGNAL = (0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def spawn(argv: Sequence[str], log_path: str, env: Mapping[str, str]) -> subprocess.Popen:
    """Start scx_layered with its output in log_path (replaced). Raises OSError."""
    # scx_layered colours its log lines (ANSI escapes) even into a file, unless NO_COLOR is set.
    full_env = {**os.environ, "NO_COLOR": "1", **env}
    with open(log_path, "wb") as output:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                env=full_env, preexec_fn=_die_with_parent, close_fds=True)


def terminate(proc: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM, then SIGKILL after timeout_s; the exit status."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("scx_layered ignored SIGTERM for %.0f s: SIGKILL", timeout_s)
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            proc.wait()
    return proc.returncode


def exit_reason(log_path: str, code: int) -> str:
    """scx_layered's own `EXIT: ...` line if it printed one, else the exit status."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith("EXIT:"):
            return line.strip()
    for line in reversed(lines):
        if line.startswith("Error:") or "panicked" in line:
            return line.strip()[:300]
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def keep_crash_log(log_path: str, crash_log_path: str) -> None:
    """The crashed run's output (EXIT line, DEBUG DUMP) survives the next start."""
    try:
        os.replace(log_path, crash_log_path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("cannot keep the scx_layered crash log: %s", exc)
