"""Reading TOML files with enough position information to point a user at the right line.

tomllib does not report where a key was written, so `KeyLines` re-scans the text for table
headers and `key =` lines. It is a locator for error messages, not a parser: values are
always taken from tomllib.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from temperd.config.errors import ConfigError, ConfigProblem, KeyPath

# A profile or temperd.toml is a few KiB; a bound keeps a mistaken path (a log, /dev/zero) from
# filling memory.
MAX_FILE_BYTES = 1 << 20

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*(\]\]?)\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_DECODE_POS = re.compile(r"at line (\d+), column (\d+)")


def _split_dotted(key: str) -> Tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", key)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


class KeyLines:
    """Maps key paths such as ("thread_groups", 1, "treatment") to 1-based line numbers."""

    def __init__(self, text: str):
        self._lines: Dict[KeyPath, int] = {}
        array_counts: Dict[Tuple[str, ...], int] = {}
        current: Tuple[Union[str, int], ...] = ()
        in_multiline_array = 0
        for number, line in enumerate(text.splitlines(), start=1):
            if in_multiline_array:
                in_multiline_array += line.count("[") - line.count("]")
                continue
            header = _HEADER.match(line)
            if header and not _KEY.match(line):
                names = _split_dotted(header.group(2))
                if header.group(1) == "[[":
                    array_counts[names] = array_counts.get(names, 0) + 1
                current = self._resolve(names, array_counts)
                self._lines.setdefault(current, number)
                continue
            key = _KEY.match(line)
            if key:
                path = current + _split_dotted(key.group(1))
                self._lines.setdefault(path, number)
                rest = line[key.end():]
                depth = rest.count("[") - rest.count("]")
                if depth > 0:
                    in_multiline_array = depth

    @staticmethod
    def _resolve(names: Tuple[str, ...], array_counts: Dict[Tuple[str, ...], int]) -> Tuple[Union[str, int], ...]:
        path: List[Union[str, int]] = []
        for i, name in enumerate(names):
            path.append(name)
            count = array_counts.get(names[: i + 1])
            if count:
                path.append(count - 1)
        return tuple(path)

    def line_for(self, path: KeyPath) -> Optional[int]:
        """The line of the key, or of its closest enclosing key or table that was written down."""
        path = tuple(path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None


@dataclass(frozen=True)
class TomlDocument:
    file: str
    data: dict
    lines: KeyLines

    def problem(self, path: KeyPath, message: str) -> ConfigProblem:
        return ConfigProblem(self.file, tuple(path), message, self.lines.line_for(path))


def parse_toml(text: str, file: str) -> TomlDocument:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        pos = _DECODE_POS.search(message)
        line = int(pos.group(1)) if pos else None
        message = _DECODE_POS.sub("", message).replace("()", "").strip().rstrip(".")
        raise ConfigError([ConfigProblem(file, (), f"not valid TOML: {message}", line)]) from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively
        raise ConfigError([ConfigProblem(file, (), "not accepted: arrays or tables nested too deeply")]) from None
    return TomlDocument(file, data, KeyLines(text))


def trust_problem(st: os.stat_result, owner: int = 0) -> Optional[str]:
    """Why a file that configures the root daemon is refused, or None. The rule of sudoers and
    systemd units: owned by root, writable by nobody else (group-writable only for group root).
    owner: the uid expected instead of root (a file a daemon of another user wrote itself)."""
    if st.st_uid != owner:
        return f"refused: owned by uid {st.st_uid}, expected {'root' if owner == 0 else f'uid {owner}'}"
    if st.st_mode & stat.S_IWOTH:
        return "refused: writable by others, expected mode without o+w"
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        return f"refused: writable by group {st.st_gid}, expected mode without g+w (or group root)"
    return None


def open_checked(path: str, require_trusted: bool = False, limit: Optional[int] = MAX_FILE_BYTES,
                 follow_symlinks: bool = True, owner: int = 0) -> int:
    """An open descriptor of a file that configures the daemon, checked on the opened file itself
    (so the file checked is the file read): a regular file, of at most `limit` bytes (None: any
    size, for a reader that streams it) and, when required, trusted. O_NONBLOCK keeps a FIFO from
    blocking the open; follow_symlinks=False refuses a symbolic link (files temperd writes itself
    are never one). ConfigError names the file and why it is refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise ConfigError([ConfigProblem(path, (), "refused: a symbolic link, expected a regular file")]) from None
        raise ConfigError([ConfigProblem(path, (), f"cannot be read: {exc.strerror}")]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
                stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "not a file"
            raise ConfigError([ConfigProblem(path, (), f"refused: {kind}, expected a regular file")])
        refused = trust_problem(st, owner) if require_trusted else None
        if refused:
            raise ConfigError([ConfigProblem(path, (), refused)])
        if limit is not None and st.st_size > limit:
            raise ConfigError([ConfigProblem(path, (), f"refused: {st.st_size} bytes, expected at most {limit}")])
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_config_bytes(path: str, require_trusted: bool = False, limit: int = MAX_FILE_BYTES,
                      follow_symlinks: bool = True, owner: int = 0) -> bytes:
    """A configuration file's content, read only if open_checked accepts it."""
    fd = open_checked(path, require_trusted, limit, follow_symlinks, owner)
    try:
        chunks, total = [], 0
        while total <= limit:
            try:
                chunk = os.read(fd, limit + 1 - total)
            except OSError as exc:
                raise ConfigError([ConfigProblem(path, (), f"cannot be read: {exc.strerror}")]) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # grew while being read
            raise ConfigError([ConfigProblem(path, (), f"refused: more than {limit} bytes")])
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_toml(path: str, require_trusted: bool = False) -> TomlDocument:
    raw = read_config_bytes(path, require_trusted)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem(path, (), f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_toml(text, path)
