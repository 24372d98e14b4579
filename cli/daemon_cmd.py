"""`temperctl status` and `temperctl reload`: talk to the running temperd over its control socket."""

from __future__ import annotations

import sys
from typing import List

import click

from temperd.config.daemon_config import DEFAULT_SOCKET
from temperd.daemon.control import DaemonUnavailable, request

from .output import print_json, print_table

socket_option = click.option("--socket", "socket_path", default=DEFAULT_SOCKET, show_default=True,
                             envvar="TEMPERD_SOCKET", help="temperd's control socket.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def ask(socket_path: str, cmd: str, **args) -> dict:
    """One request; a clear message and exit 1 when temperd is not there or refuses."""
    try:
        reply = request(socket_path, cmd, **args)
    except DaemonUnavailable as exc:
        click.echo(f"temperctl: {exc}", err=True)
        sys.exit(1)
    if not reply.get("ok"):
        click.echo(f"temperctl: {reply.get('error', 'request failed')}", err=True)
        sys.exit(1)
    return reply


@click.command("status")
@socket_option
@json_option
def status_command(socket_path: str, as_json: bool) -> None:
    """Daemon state, backend, configuration generation, profiles, workloads, lint and overhead."""
    status = ask(socket_path, "status")["status"]
    if as_json:
        print_json(status)
        return
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
    lint = status["lint"]
    click.echo(f"lint:        {lint['total']} violation(s)" +
               (" (" + ", ".join(f"{k} {v}" for k, v in sorted(lint["by_invariant"].items())) + ")" if lint["total"] else ""))
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
        print_table(("LAYER", "KIND", "TREATMENT", "CPUS", "MEMBERS"),
                    [(l["name"], l["kind"], l["treatment"], ",".join(map(str, l["cpus"])) or "-", l["members"])
                     for l in status["layers"]])


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
    result = ask(socket_path, "reload")["reload"]
    if as_json:
        print_json(result)
    elif result["ok"]:
        click.echo(f"reloaded: generation {result['generation']}, {result['summary']}")
    else:
        click.echo(f"reload refused, generation {result['generation']} keeps running:")
        for problem in result["problems"]:
            click.echo(f"  error: {problem}")
    if not result["ok"]:
        sys.exit(1)
