"""`temperctl bind` / `unbind` / `bindings`: a profile for one running process (and its
descendants), at run time, through temperd's control socket only. Nothing is written to
/etc/temper: a binding ends with `unbind`, with the process, or when temperd stops, and the
threads it moved are put back. The trust rules hold: a binding raises only processes the host
trusts."""

from __future__ import annotations

import os
from typing import Optional

import click

from temperd.plan import TIERS

from .daemon_cmd import ask, fail, json_option, socket_option
from .output import print_json

MAX_PROFILE_BYTES = 60 * 1024


def _show(bound: dict) -> None:
    groups = ", ".join(f"{name} {count}" for name, count in sorted(bound.get("groups", {}).items()))
    click.echo(f"pid {bound['pid']}: {bound['profile']} (tier {bound.get('tier') or 'as before'}); "
               f"workload {bound.get('workload')}; threads: {groups or 'none'}")


@click.command("bind")
@click.option("--pid", type=int, required=True, help="The process (its descendants too).")
@click.option("--profile", "profile_path", required=True, type=click.Path(dir_okay=False),
              help="A profile TOML file (e.g. one `temperctl train` wrote).")
@click.option("--tier", type=click.Choice(TIERS), help="Its tier while bound (default: as configured).")
@socket_option
@json_option
def bind_command(pid: int, profile_path: str, tier: Optional[str], socket_path: str, as_json: bool) -> None:
    """Schedule a running process by a profile until `temperctl unbind` (runtime only)."""
    try:
        with open(profile_path, "rb") as handle:
            data = handle.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        fail(f"{profile_path}: {exc.strerror}")
    if len(data) > MAX_PROFILE_BYTES:
        fail(f"{profile_path}: expected a profile of at most {MAX_PROFILE_BYTES} bytes")
    reply = ask(socket_path, "bind", pid=pid, profile_text=data.decode("utf-8", "replace"),
                profile_name=os.path.abspath(profile_path), tier=tier,
                requester=f"temperctl pid {os.getpid()} uid {os.getuid()}")
    print_json(reply["bound"]) if as_json else _show(reply["bound"])


@click.command("unbind")
@click.option("--pid", type=int, required=True, help="The process bound with `temperctl bind`.")
@socket_option
def unbind_command(pid: int, socket_path: str) -> None:
    """End a runtime binding: the process's threads go back to what matches them otherwise."""
    ask(socket_path, "unbind", pid=pid)
    click.echo(f"pid {pid}: unbound")


@click.command("bindings")
@socket_option
@json_option
def bindings_command(socket_path: str, as_json: bool) -> None:
    """The runtime bindings temperd holds."""
    bindings = ask(socket_path, "bindings")["bindings"]
    if as_json:
        print_json(bindings)
    elif not bindings:
        click.echo("no runtime bindings")
    for bound in bindings if not as_json else ():
        _show(bound)
