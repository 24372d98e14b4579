"""The host's accounts, as far as trust needs them: which uids are system accounts, and which
users and groups temperd.toml names."""

from __future__ import annotations

import grp
import pwd
from typing import FrozenSet, Iterable, Optional

LOGIN_DEFS = "/etc/login.defs"
DEFAULT_UID_MIN = 1000  # login.defs' own default: uids below it (except root) are system accounts
NOBODY_NAMES = ("nobody", "nfsnobody")


def read_uid_min(path: str = LOGIN_DEFS) -> int:
    """UID_MIN of login.defs: the first uid useradd gives to people."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "UID_MIN" and fields[1].isdigit():
                    return int(fields[1])
    except OSError:
        pass
    return DEFAULT_UID_MIN


def user_name(uid: int) -> Optional[str]:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def uid_of(name: str) -> Optional[int]:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def uids_of(users: Iterable[str], groups: Iterable[str]) -> FrozenSet[int]:
    """The uids of the named users and of every member (primary or listed) of the named groups;
    names that do not exist (yet) contribute nothing."""
    out = {uid for uid in map(uid_of, users) if uid is not None}
    gids, members = set(), set()
    for name in groups:
        try:
            entry = grp.getgrnam(name)
        except KeyError:
            continue
        gids.add(entry.gr_gid)
        members.update(entry.gr_mem)
    if gids or members:
        for entry in pwd.getpwall():
            if entry.pw_gid in gids or entry.pw_name in members:
                out.add(entry.pw_uid)
    return frozenset(out)
