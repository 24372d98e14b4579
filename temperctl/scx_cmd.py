"""`temperctl scx`: scx_layered configuration files and sched_ext on this host."""

from __future__ import annotations

import sys
from typing import Optional, Tuple

import click

from temperd.backends.scx.detect import detect_sched_ext
from temperd.backends.scx.validate import RULES, validate_file, validate_text
from temperd.sources.shape import SYSFS_ROOT

from .output import print_json


@click.group()
def scx() -> None:
    """scx_layered, the BPF scheduler behind backend = "scx"."""


@scx.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--cpus", "cpu_count", type=click.IntRange(min=1), default=None,
              help="Also check cpus_range against this many CPUs.")
@click.option("--gpu-support", is_flag=True,
              help="scx_layered runs with --enable-gpu-support (UsedGpu* matches are fine).")
@click.option("-q", "--quiet", is_flag=True, help="Print errors only, no warnings and no 'ok' lines.")
def validate_command(files: Tuple[str, ...], cpu_count: Optional[int], gpu_support: bool, quiet: bool) -> None:
    """Check scx_layered configuration FILEs ('-' for stdin) more strictly than scx_layered does.

    One line per problem: FILE: WHERE: WHAT [rule]. Unknown keys are errors (scx_layered
    ignores them silently). Exit status 0 when every file is valid (warnings allowed),
    1 when any has an error, 2 on a usage error."""
    invalid = 0
    for path in files:
        if path == "-":
            problems = validate_text(sys.stdin.read(), cpu_count=cpu_count, gpu_support=gpu_support)
            source = "<stdin>"
        else:
            problems = validate_file(path, cpu_count=cpu_count, gpu_support=gpu_support)
            source = path
        errors = [p for p in problems if p.is_error]
        for problem in problems:
            if problem.is_error or not quiet:
                click.echo(problem.line(source))
        if errors:
            invalid += 1
        elif not quiet:
            warnings = len(problems)
            click.echo(f"{source}: ok" + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else ""))
    if invalid:
        sys.exit(1)


@scx.command("rules")
def rules_command() -> None:
    """List the rules `temperctl scx validate` applies."""
    width = max(len(rule) for rule in RULES)
    for rule, what in RULES.items():
        click.echo(f"{rule.ljust(width)}  {what}")


@scx.command("detect")
@click.option("--sysfs", "sysfs_root", default=SYSFS_ROOT, show_default=True, help="sysfs root (a fixture tree for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def detect_command(sysfs_root: str, as_json: bool) -> None:
    """Can scx_layered run here? sched_ext in the kernel, a scheduler already loaded, the binary.

    Exit status 0 when it can, 1 when not (the reason says why)."""
    found = detect_sched_ext(sysfs_root)
    if as_json:
        print_json({"usable": found.usable, "kernel_supported": found.kernel_supported, "state": found.state,
                    "loaded_ops": found.loaded_ops, "binary": found.binary, "reason": found.reason})
    else:
        click.echo(f"sched_ext:   {'yes' if found.kernel_supported else 'no'}" + (f" (state {found.state})" if found.state else ""))
        if found.loaded_ops:
            click.echo(f"loaded:      {found.loaded_ops}")
        click.echo(f"scx_layered: {found.binary or 'not installed'}")
        click.echo(f"usable:      {'yes' if found.usable else 'no'}: {found.reason}")
    if not found.usable:
        sys.exit(1)
