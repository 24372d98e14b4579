"""temperctl imports a command's module only when that command runs: `temperctl status`, called in
loops by scripts and the VM test, starts without the planner, the trainer or the tracer."""

from __future__ import annotations

import subprocess
import sys

import click

from temperctl.main import COMMANDS, main


def test_every_listed_command_resolves_to_a_click_command_of_that_name():
    ctx = click.Context(main)
    assert main.list_commands(ctx) == list(COMMANDS)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
    assert main.get_command(ctx, "no-such-command") is None


def test_status_starts_without_the_planner_trainer_or_tracer():
    probe = ("import sys; from temperctl.main import main; main.get_command(None, 'status'); "
             "print('\\n'.join(m for m in sys.modules if m.startswith(('temperd.', 'temperctl.'))))")
    loaded = set(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                text=True).stdout.split())
    assert "temperctl.daemon_cmd" in loaded  # the probe did load the status command
    heavy = sorted(m for m in loaded if m.startswith(("temperd.decide", "temperd.training", "temperd.trace",
                                                      "temperd.config.daemon_config", "temperctl.plan_cmd")))
    assert heavy == [], heavy
