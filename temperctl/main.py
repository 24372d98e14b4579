"""temperctl: inspect profiles, plans and the running temperd."""

from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Tuple

import click

from temperd import __version__

from .output import guard_output

# Exit codes: 0 ok, 1 invalid input or failed check, 2 usage error (click's own), 3 `temperctl status`:
# temperd is not running (daemon_cmd.NOT_RUNNING).

# Each command's module is imported only when that command runs (or --help lists them): `temperctl
# status` is called in loops by scripts, and the planner and trainer behind `plan` and `train` are
# most of temperctl's start-up time.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "profiles": ("profiles_cmd", "profiles"),
    "plan": ("plan_cmd", "plan_command"),
    "explain": ("plan_cmd", "explain_command"),
    "status": ("daemon_cmd", "status_command"),
    "reload": ("daemon_cmd", "reload_command"),
    "scx": ("scx_cmd", "scx"),
    "trace": ("trace_cmd", "trace_command"),
    "classify": ("learner_cmd", "classify_command"),
    "rightsize": ("learner_cmd", "rightsize_command"),
    "train": ("train_cmd", "train_command"),
    "bind": ("bind_cmd", "bind_command"),
    "unbind": ("bind_cmd", "unbind_command"),
    "bindings": ("bind_cmd", "bindings_command"),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported by name when asked for."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name not in COMMANDS:
            return None
        module, attribute = COMMANDS[cmd_name]
        return getattr(importlib.import_module(f"{__package__}.{module}"), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="temperctl")
def main() -> None:
    """Control and inspect temperd, the per-thread-group CPU scheduling daemon."""
    guard_output()


if __name__ == "__main__":  # pragma: no cover
    main()
