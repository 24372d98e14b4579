"""`temperctl status` and `temperctl reload`: talk to the running temperd over its control socket."""

from __future__ import annotations

import sys
from typing import Any, Callable, List, NoReturn

import click

from temperd import paths
from temperd.control.client import request
from temperd.control.protocol import DaemonNotRunning, DaemonUnavailable
from temperd.text import printable, printable_data

from .output import print_json, print_table

socket_option = click.option("--socket", "socket_path", default=paths.CONTROL_SOCKET, show_default=True,
                             envvar="TEMPERD_SOCKET", help="temperd's control socket.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


# `temperctl status` exits NOT_RUNNING where no temperd runs (the LSB code for status that
# systemctl status uses and scripts test for); every other failure, here and elsewhere, is 1.
NOT_RUNNING = 3
TIMEOUT_S = 30.0  # for temperd's reply


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"temperctl: {printable(message)}", err=True)
    sys.exit(code)


def ask(socket_path: str, cmd: str, not_running_exit: int = 1, **args) -> dict:
    """One request; a clear line and exit 1 (not_running_exit where no temperd runs) when
    temperd is not there, does not answer, or refuses."""
    try:
        reply = request(socket_path, cmd, timeout=TIMEOUT_S, **args)
    except DaemonNotRunning as exc:
        fail(str(exc), not_running_exit)
    except DaemonUnavailable as exc:
        fail(str(exc))
    if not reply["ok"]:
        fail(reply["error"])
    return printable_data(reply)  # names and titles shown escaped, in text and JSON alike


def rendered(render: Callable[[], Any], what: str) -> Any:
    """render() of a reply; one line instead of a traceback when the reply lacks what it reads."""
    try:
        return render()
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        fail(f"temperd's {what} reply is not one this temperctl reads ({type(exc).__name__}: {exc}); "
             "are temperd and temperctl the same version?")


@click.command("status")
@socket_option
@json_option
def status_command(socket_path: str, as_json: bool) -> None:
    """Daemon state, backend, configuration generation, profiles, workloads, lint and overhead.
    Exits 3 when temperd is not running, 1 when it cannot be asked."""
    status = ask(socket_path, "status", not_running_exit=NOT_RUNNING).get("status")
    if as_json:
        print_json(status)
    else:
        rendered(lambda: _print_status(status), "status")


def _print_status(status: dict) -> None:
    backend = status["backend"]
    reload = status["last_reload"] or {}
    click.echo(f"temperd {status['version']}: {status['state']} (pid {status['pid']}, up {status['uptime_s']:.0f} s)")
    click.echo(f"backend:     {backend['active']} ({backend['reason']})" + ("  SAFE MODE" if backend.get("safe_mode") else ""))
    for line in scx_lines(backend):
        click.echo("  " + line)
    click.echo(f"machine:     {status['machine_shape']}")
    click.echo(f"config:      generation {status['generation']}, last reload "
               f"{'ok' if reload.get('ok') else 'FAILED'} ({reload.get('trigger', '-')}: {reload.get('summary', '')})")
    for problem in reload.get("problems") or []:
        click.echo(f"  error: {problem}")
    profiles = status["profiles"]
    click.echo(f"profiles:    {len(profiles['loaded'])} loaded ({', '.join(profiles['loaded'])}), {len(profiles['failed'])} failed")
    for failed in profiles["failed"]:
        click.echo(f"  error: {failed['file']}:{failed['line'] or ''}: {failed['key']}: {failed['message']}")
    for pattern, why in sorted(profiles.get("disabled_patterns", {}).items()):
        click.echo(f"  disabled: regular expression {pattern!r}: {why}")
    lint = status["lint"]
    click.echo(f"lint:        {lint['total']} violation(s)" +
               (" (" + ", ".join(f"{k} {v}" for k, v in sorted(lint["by_invariant"].items())) + ")" if lint["total"] else ""))
    if status.get("telemetry"):
        click.echo(f"telemetry:   {status['telemetry']}")
    inventory = status.get("inventory")
    if inventory:  # which process events the kernel sends, and how many processes nothing can match
        click.echo(f"events:      {inventory.get('event_filter') or '-'}; {inventory['processes']} processes "
                   f"tracked, {inventory.get('untracked', 0)} not ({status.get('candidates') or '-'})")
    overhead = status.get("overhead") or {}
    if overhead:
        click.echo("overhead:    " + ", ".join(f"{k} {v}" for k, v in overhead.items()))
    if status.get("http"):
        click.echo(f"http:        {status['http']}/metrics, {status['http']}/observe")
    click.echo("")
    print_table(("WORKLOAD", "PROFILE", "TIER", "BUDGET", "THREADS", "GROUPS"),
                [(w["key"], w["profile"] or "-", w["tier"], "-" if w["budget"] is None else f"{w['budget']:g}",
                  w["threads"], ", ".join(f"{g} {n}" for g, n in sorted(w["groups"].items())))
                 for w in status["workloads"]])
    if status["layers"]:
        click.echo("")
        layers = status["layers"]
        columns = ("LAYER", "KIND", "TREATMENT", "CPUS", "MEMBERS")
        rows = [(l["name"], l["kind"], l["treatment"] + (f" ({l['ownership']})" if l.get("ownership") else ""),
                 ",".join(map(str, l["cpus"])) or "-", "-" if l.get("members") is None else l["members"]) for l in layers]
        if any(l.get("scx") for l in layers):  # scx_layered carries the plan: what it reports of each layer
            columns += ("SCX_LAYERED NOW",)
            rows = [row + ((l.get("scx") or {}).get("text", "-"),) for row, l in zip(rows, layers)]
        print_table(columns, rows)


def scx_lines(backend: dict) -> List[str]:
    """The scx backend's own state: who carries the plan, scx_layered's process, restarts, notes."""
    sup = backend.get("scx_layered")
    if sup is None:
        return []
    lines = []
    if backend.get("carried_by") == "native":
        lines.append(f"carried by the native backend: {backend.get('fallback_reason')}")
    pid = f" (pid {sup['pid']})" if sup.get("pid") else ""
    lines.append(f"scx_layered {sup['state']}{pid}: {sup['starts']} start(s), {sup['restarts']} restart(s) for plan "
                 f"changes, {sup['crashes']} crash(es), {sup['default_scheduler_gap_s']['total']:g} s on the default "
                 f"scheduler")
    if sup.get("last_exit"):
        lines.append(f"last exit: {sup['last_exit']['reason']}")
    lines.extend(f"note: {note}" for note in backend.get("render_notes") or [])
    return lines


@click.command("reload")
@socket_option
@json_option
def reload_command(socket_path: str, as_json: bool) -> None:
    """Re-read temperd.toml and profiles.d; a bad file is reported and the running set stays."""
    result = ask(socket_path, "reload").get("reload")
    if as_json:
        print_json(result)
    else:
        rendered(lambda: _print_reload(result), "reload")
    if not rendered(lambda: result["ok"], "reload"):
        sys.exit(1)


def _print_reload(result: dict) -> None:
    if result["ok"]:
        click.echo(f"reloaded: generation {result['generation']}, {result['summary']}")
    else:
        click.echo(f"reload refused, generation {result['generation']} keeps running:")
        for problem in result["problems"]:
            click.echo(f"  error: {problem}")
