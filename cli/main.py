"""temperctl: inspect profiles, plans and the running temperd."""

from __future__ import annotations

import click

from temperd import __version__

from .bind_cmd import bind_command, bindings_command, unbind_command
from .daemon_cmd import reload_command, status_command
from .knowledge_cmd import classify_command, rightsize_command
from .output import guard_output
from .plan_cmd import explain_command, plan_command
from .profiles_cmd import profiles
from .scx_cmd import scx
from .trace_cmd import trace_command
from .train_cmd import train_command

# Exit codes: 0 ok, 1 invalid input or failed check, 2 usage error (click's own), 3 `temperctl status`:
# temperd is not running (daemon_cmd.NOT_RUNNING).


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="temperctl")
def main() -> None:
    """Control and inspect temperd, the per-thread-group CPU scheduling daemon."""
    guard_output()


main.add_command(profiles)
main.add_command(plan_command)
main.add_command(explain_command)
main.add_command(status_command)
main.add_command(reload_command)
main.add_command(scx)
main.add_command(trace_command)
main.add_command(classify_command)
main.add_command(rightsize_command)
main.add_command(train_command)
main.add_command(bind_command)
main.add_command(unbind_command)
main.add_command(bindings_command)


if __name__ == "__main__":  # pragma: no cover
    main()
