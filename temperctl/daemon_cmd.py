"""`temperctl status` and `temperctl reload`: talk to the running temperd over its control socket."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable, List, NoReturn, Optional

import click

from temperd import paths
from temperd.control.client import request
from temperd.control.protocol import DaemonNotRunning, DaemonUnavailable
from temperd.control.typed_json import to_json
from temperd.text import printable, printable_data

if TYPE_CHECKING:
    from temperd.control.status import BackendView, Status

from .output import ProgressLine, print_json, table

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


def ask(socket_path: str, cmd: str, *, not_running: Optional[int] = 1, timeout: Optional[float] = None,
        show: Optional[ProgressLine] = None, retry_s: float = 0.0, escaped: bool = True, why: str = "",
        **args) -> Optional[dict]:
    """One request and its reply (within timeout, TIMEOUT_S where None); show gets its progress
    lines. Where no temperd runs: exit not_running, or None where that is None (the caller does
    the work itself). A clear line (why added where temperd cannot be asked) and exit 1 when
    temperd does not answer or refuses; a refusal that says "no such process" is asked again for
    retry_s (a process just started may not be in temperd's inventory yet)."""
    deadline = time.monotonic() + retry_s
    timeout = TIMEOUT_S if timeout is None else timeout
    code = 1
    try:
        reply = request(socket_path, cmd, timeout=timeout, on_progress=show, **args)
        while not reply["ok"] and "no such process" in reply["error"] and time.monotonic() < deadline:
            time.sleep(0.1)
            reply = request(socket_path, cmd, timeout=timeout, on_progress=show, **args)
        error = None if reply["ok"] else reply["error"]
    except DaemonNotRunning as exc:
        if not_running is None:
            return None
        error, code = str(exc) + why, not_running
    except DaemonUnavailable as exc:
        error = str(exc) + why
    if error is not None:
        if show is not None:
            show.done()
        fail(error, code)
    return printable_data(reply) if escaped else reply  # names and titles shown escaped, in text and JSON alike


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
    from temperd.control.status import Status

    reply = ask(socket_path, "status", not_running=NOT_RUNNING).get("status")
    status = rendered(lambda: Status.from_json(reply), "status")
    if as_json:
        print_json(status.to_json())
    else:
        rendered(lambda: click.echo("\n".join(status_lines(status))), "status")


def status_lines(status: "Status") -> List[str]:
    """`temperctl status`'s text, from the typed status."""
    backend, reload = status.backend, status.last_reload
    lines = [f"temperd {status.version}: {status.state} (pid {status.pid}, up {status.uptime_s:.0f} s)",
             f"backend:     {backend.active} ({backend.reason})" + ("  SAFE MODE" if backend.safe_mode else "")]
    lines.extend("  " + line for line in scx_lines(backend))
    lines.append(f"machine:     {status.machine_shape}")
    lines.append(f"config:      generation {status.generation}, last reload "
                 + (f"{'ok' if reload.ok else 'FAILED'} ({reload.trigger}: {reload.summary})" if reload else "FAILED (-: )"))
    lines.extend(f"  error: {problem}" for problem in (reload.problems if reload else ()))
    profiles = status.profiles
    lines.append(f"profiles:    {len(profiles.loaded)} loaded ({', '.join(profiles.loaded)}), {len(profiles.failed)} failed")
    lines.extend(f"  error: {p.file}:{p.line or ''}: {p.key}: {p.message}" for p in profiles.failed)
    lines.extend(f"  disabled: regular expression {pattern!r}: {why}"
                 for pattern, why in sorted(profiles.disabled_patterns.items()))
    lint = status.lint
    lines.append(f"lint:        {lint.total} violation(s)" +
                 (" (" + ", ".join(f"{k} {v}" for k, v in sorted(lint.by_invariant.items())) + ")" if lint.total else ""))
    if status.telemetry:
        lines.append(f"telemetry:   {status.telemetry}")
    inventory = status.inventory  # which process events the kernel sends, and how many processes nothing can match
    lines.append(f"events:      {inventory.event_filter or '-'}; {inventory.processes} processes "
                 f"tracked, {inventory.untracked} not ({status.candidates or '-'})")
    path = status.event_path  # what the host's churn cost: the passes that handled process events
    if path is not None:
        per_event = f", {1000 * path.cpu_s / inventory.events_received:.2f} ms per event" \
            if inventory.events_received else ""
        lines.append(f"event path:  {path.passes} passes, {path.cpu_s:.2f} s of CPU{per_event}")
    if status.overhead is not None:
        lines.append("overhead:    " + ", ".join(f"{k} {v}" for k, v in to_json(status.overhead).items()))
    if status.http:
        lines.append(f"http:        {status.http}/metrics, {status.http}/observe")
    lines.append("")
    lines.extend(table(("WORKLOAD", "PROFILE", "TIER", "BUDGET", "THREADS", "GROUPS"),
                       [(w.key, w.profile or "-", w.tier, "-" if w.budget is None else f"{w.budget:g}", w.threads,
                         ", ".join(f"{g} {n}" for g, n in sorted(w.groups.items()))) for w in status.workloads]))
    if status.layers:
        layers = status.layers
        columns = ("LAYER", "KIND", "TREATMENT", "CPUS", "MEMBERS")
        rows = [(l.name, l.kind, l.treatment + (f" ({l.ownership})" if l.ownership else ""),
                 ",".join(map(str, l.cpus)) or "-", "-" if l.members is None else l.members) for l in layers]
        if any(l.scx for l in layers):  # scx_layered carries the plan: what it reports of each layer
            columns += ("SCX_LAYERED NOW",)
            rows = [row + (l.scx.text if l.scx else "-",) for row, l in zip(rows, layers)]
        lines.append("")
        lines.extend(table(columns, rows))
    return lines


def scx_lines(backend: "BackendView") -> List[str]:
    """The scx backend's own state: who carries the plan, scx_layered's process, restarts, notes."""
    scx = backend.scx
    if scx is None:
        return []
    sup = scx.scx_layered
    lines = []
    if backend.carried_by == "native":
        lines.append(f"carried by the native backend: {scx.fallback_reason}")
    pid = f" (pid {sup.pid})" if sup.pid else ""
    lines.append(f"scx_layered {sup.state}{pid}: {sup.starts} start(s), {sup.restarts} restart(s) for plan "
                 f"changes, {sup.crashes} crash(es), {sup.default_scheduler_gap_s.total:g} s on the default "
                 f"scheduler")
    if sup.last_exit is not None:
        lines.append(f"last exit: {sup.last_exit.reason}")
    lines.extend(f"note: {note}" for note in scx.render_notes)
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
