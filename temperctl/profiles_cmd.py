"""`temperctl profiles`: list, show, validate and describe workload profiles (no daemon needed)."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import List

import click

from temperd.config.profile import profile_json_schema
from temperd.config.profileset import (DEFAULT_PROFILE_DIR, HostShape, load_profile_files, load_profile_set, resolve)
from temperd.sources.shape import SYSFS_ROOT, ShapeError, read_shape

from .daemon_cmd import json_option
from .output import print_json, print_table

dir_option = click.option("--dir", "profile_dir", default=DEFAULT_PROFILE_DIR, show_default=True,
                          help="Directory of file profiles (*.toml).")
sysfs_option = click.option("--sysfs", "sysfs_root", default=SYSFS_ROOT, show_default=True,
                            help="sysfs root to read the machine shape from (a fixture tree for another host shape).")


def _host(sysfs_root: str) -> HostShape:
    try:
        return HostShape.of(read_shape(sysfs_root))
    except ShapeError as exc:
        raise click.ClickException(f"cannot read the machine shape: {exc}")


@click.group()
def profiles() -> None:
    """Workload profiles: builtins and files in /etc/temper/profiles.d."""


@profiles.command("list")
@dir_option
@sysfs_option
@json_option
def list_profiles(profile_dir: str, sysfs_root: str, as_json: bool) -> None:
    """List every profile, where it comes from and whether it applies on this host."""
    host = _host(sysfs_root)
    pset = load_profile_set(host, profile_dir)
    if as_json:
        print_json({
            "host_shape": dataclasses.asdict(host),
            "profiles": [{"id": c.profile.id, "status": c.status, "source": c.profile.source,
                          "groups": [g.name for g in c.profile.thread_groups], "reason": c.reason}
                         for c in pset.candidates],
            "problems": [p.as_dict() for p in pset.problems],
        })
    else:
        click.echo(f"host shape: {host.describe()}")
        rows = [(c.profile.id, c.status, c.profile.source, ",".join(g.name for g in c.profile.thread_groups), c.reason)
                for c in pset.candidates]
        print_table(("ID", "STATUS", "SOURCE", "GROUPS", "REASON"), rows)
        for problem in pset.problems:
            click.echo(f"error: {problem}", err=True)
    if pset.problems:
        sys.exit(1)


@profiles.command("show")
@click.argument("profile_id")
@dir_option
@sysfs_option
@json_option
def show_profile(profile_id: str, profile_dir: str, sysfs_root: str, as_json: bool) -> None:
    """Show the profile that applies on this host for PROFILE_ID: its groups and treatments."""
    host = _host(sysfs_root)
    pset = load_profile_set(host, profile_dir)
    profile = pset.active.get(profile_id)
    if profile is None:
        known = [c for c in pset.candidates if c.profile.id == profile_id]
        why = known[0].reason if known else "no builtin or file profile has this id"
        raise click.ClickException(f"profile {profile_id!r} does not apply on this host: {why}")
    if as_json:
        print_json({**dataclasses.asdict(profile), "reason": pset.reason_for(profile_id)})
        return
    click.echo(f"id:           {profile.id}")
    click.echo(f"description:  {profile.description}")
    click.echo(f"source:       {profile.source}")
    click.echo(f"why:          {pset.reason_for(profile_id)}")
    click.echo(f"shape:        {profile.machine_shape.describe()}")
    fp = profile.fingerprint
    for key in ("executables", "process_names", "units", "cgroups", "cmdline", "images"):
        if getattr(fp, key):
            click.echo(f"match {key + ':':<15}{', '.join(getattr(fp, key))}")
    traits = {k: v for k, v in dataclasses.asdict(profile.traits).items() if v}
    if traits:
        click.echo("traits:       " + ", ".join(f"{k}={v}" for k, v in traits.items()))
    click.echo("")
    print_table(("GROUP", "SELECTS", "TREATMENT"),
                [(g.name, g.describe_selector(), g.describe_treatment()) for g in profile.thread_groups])


@profiles.command("validate")
@click.argument("paths", nargs=-1, type=click.Path())
@json_option
def validate_profiles(paths: List[str], as_json: bool) -> None:
    """Check profile files (or directories of them) strictly; default: /etc/temper/profiles.d.

    Prints one line per problem with file, line, key and what was expected; exits 1 if any.
    Ownership rules that temperd applies to /etc/temper are not checked here.
    """
    paths = list(paths) or [DEFAULT_PROFILE_DIR]
    for path in paths:
        if not os.path.exists(path):
            raise click.BadParameter(f"{path}: no such file or directory", param_hint="PATHS")
    good, problems = load_profile_files(paths)
    problems += resolve([], good, HostShape(0, 0, "")).problems
    if as_json:
        print_json({"valid": [{"id": p.id, "file": p.source} for p in good],
                    "problems": [p.as_dict() for p in problems]})
    else:
        bad_files = {p.file for p in problems}
        for profile in good:
            if profile.source not in bad_files:
                click.echo(f"ok: {profile.source} (id {profile.id})")
        for problem in problems:
            click.echo(f"error: {problem}")
    if problems:
        sys.exit(1)


@profiles.command("schema")
def schema() -> None:
    """Print the JSON Schema of the profile format (for editors)."""
    print_json(profile_json_schema())
