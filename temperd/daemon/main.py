"""The `temperd` command: run the daemon in the foreground (systemd runs it the same way)."""

from __future__ import annotations

import logging
import os
import sys

import click

from temperd import __version__
from temperd.config.daemon_config import DEFAULT_CONFIG_DIR
from temperd.text import PrintableFormatter
from temperd.sources.shape import SYSFS_ROOT


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_dir", default=DEFAULT_CONFIG_DIR, show_default=True,
              help="Configuration directory: temperd.toml and profiles.d/.")
@click.option("--sysfs", "sysfs_root", default=SYSFS_ROOT, show_default=True, hidden=True,
              help="sysfs root for the machine shape (tests).")
@click.option("--state-dir", default=None, help="Runtime state directory [default: state_dir of temperd.toml, /run/temper].")
@click.option("--http-port", type=int, default=None, help="Port of /metrics and /observe (0 = off) [default: temperd.toml, 9477].")
@click.option("--socket", "control_socket", default=None, help="Control socket path [default: temperd.toml, /run/temper/temperd.sock].")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@click.option("--check", is_flag=True, help="Validate the configuration and profiles, print the result and exit (0 ok, 1 invalid).")
@click.version_option(__version__, prog_name="temperd")
def main(config_dir, sysfs_root, state_dir, http_port, control_socket, log_level, check) -> None:
    """Per-thread-group CPU scheduling daemon. Runs in the foreground and logs to stderr;
    SIGHUP reloads, SIGTERM stops and restores every thread it changed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(levelname)s %(name)s: %(message)s" if os.environ.get("INVOCATION_ID")
                                            else "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, log_level.upper()), handlers=[handler])
    logging.getLogger("watchdog").setLevel(logging.WARNING)  # its debug output is per inotify event
    if check:
        sys.exit(_check(config_dir, sysfs_root))
    from temperd.daemon.daemon import Daemon, StartupError

    if os.geteuid() != 0:
        click.echo("temperd: must run as root (it changes scheduling settings of other processes)", err=True)
        sys.exit(1)
    daemon = Daemon(config_dir, sysfs_root, state_dir=state_dir, http_port=http_port, control_socket=control_socket)
    daemon.install_signal_handlers()
    try:
        daemon.start()
    except StartupError as exc:
        click.echo(str(exc), err=True)
        _stop(daemon)
        sys.exit(1)
    code = 0
    try:
        daemon.run()
    except Exception:  # a bug: its traceback goes to the journal, and what temperd changed is put back
        logging.getLogger("temperd").exception("the main loop failed; stopping")
        code = 1
    if not _stop(daemon):
        code = 1
    if code:
        sys.exit(code)


def _stop(daemon) -> bool:
    """Put back what temperd changed; False, with one line, when that failed."""
    from temperd.daemon.daemon import describe_error

    try:
        daemon.stop()
        return True
    except Exception as exc:
        logging.getLogger("temperd").debug("stop failed", exc_info=True)
        click.echo(f"error: stopping: {describe_error(exc)}", err=True)
        return False


def _check(config_dir: str, sysfs_root: str) -> int:
    from temperd.decide.hostview import load_host_view
    from temperd.config.errors import ConfigError
    from temperd.sources.shape import ShapeError

    try:
        view = load_host_view(config_dir, sysfs_root)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        return 1
    except ShapeError as exc:
        click.echo(f"error: cannot read the machine shape: {exc}", err=True)
        return 1
    for problem in view.problems:
        click.echo(f"error: {problem}", err=True)
    click.echo(f"{view.config.source}: backend {view.config.backend}, {len(view.config.bindings)} bindings; "
               f"{len(view.profiles.active)} profiles apply to {view.shape.describe()}")
    return 1 if view.problems else 0


if __name__ == "__main__":  # pragma: no cover
    main()
