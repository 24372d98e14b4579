"""The control socket's owner: root and group temper, set without chown where it is born so."""

from __future__ import annotations

import grp
import os
import stat

import pytest

from temperd.daemon.control import ControlServer


def _serve(tmp_path, monkeypatch, group: str):
    calls = []

    def chown(path, uid, gid):
        calls.append((uid, gid))
        return real_chown(path, uid, gid)

    real_chown = os.chown
    monkeypatch.setattr(os, "chown", chown)
    server = ControlServer(str(tmp_path / "temperd.sock"), {}, group=group)
    server.start()
    info = os.stat(server.path)
    server.stop()
    return calls, info


def test_socket_born_with_the_group_is_not_chowned(tmp_path, monkeypatch):
    """As under the unit (Group=temper): the unit's system call filter would refuse chown."""
    if os.geteuid() != 0:
        pytest.skip("the socket is root's: run as root")
    own = grp.getgrgid(os.getegid()).gr_name
    calls, info = _serve(tmp_path, monkeypatch, own)
    assert calls == []
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, os.getegid(), 0o660)


def test_socket_is_given_to_the_group_where_it_differs(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("chown to another group needs root")
    other = next((g for g in grp.getgrall() if g.gr_gid != os.getegid()), None)
    if other is None:
        pytest.skip("no second group on this host")
    calls, info = _serve(tmp_path, monkeypatch, other.gr_name)
    assert calls == [(0, other.gr_gid)]
    assert (info.st_uid, info.st_gid) == (0, other.gr_gid)
