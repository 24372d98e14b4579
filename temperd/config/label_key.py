"""The host's key for naming workloads: a random secret kept beside the usage history.

A hand-started workload is labelled by a digest of its command line (decide/matcher.py), and
anyone who reads /metrics reads the label. A plain digest would let them test guesses of an
argument (a password) against it offline; keyed with this secret, which only root reads, it
tells instances apart and says nothing about what they were started with.
"""

from __future__ import annotations

import logging
import os

from temperd.config.errors import ConfigError
from temperd.config.tomlsource import read_config_bytes

log = logging.getLogger(__name__)

KEY_FILE = "label-key"
KEY_BYTES = 32


def load_label_key(directory: str) -> bytes:
    """The key kept in `directory` (made there on first use, mode 0600). Where it cannot be read
    or made, a key for this run alone, said once: labels then change at the next start."""
    path = os.path.join(directory, KEY_FILE)
    try:
        key = read_config_bytes(path, require_trusted=True, limit=KEY_BYTES, follow_symlinks=False, owner=os.geteuid())
    except ConfigError as exc:
        if os.path.lexists(path):
            return _for_this_run(exc.problems[0].message)
        return _made(path)
    return key if len(key) == KEY_BYTES else _for_this_run(f"{path}: {len(key)} bytes, expected {KEY_BYTES}")


def _made(path: str) -> bytes:
    key = os.urandom(KEY_BYTES)
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, key)
        finally:
            os.close(fd)
    except OSError as exc:
        return _for_this_run(f"{path}: cannot be made: {exc.strerror or exc}")
    return key


def _for_this_run(why: str) -> bytes:
    log.warning("%s; workload labels are keyed for this run only", why)
    return os.urandom(KEY_BYTES)
