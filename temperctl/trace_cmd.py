"""`temperctl trace`: a bounded kernel scheduling trace that opens in the Perfetto UI.

Through temperd's control socket when temperd runs (it does the capture; this copies the file
to -o); directly in this process, as root, when it does not (or with --direct).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Dict, Optional

import click

from temperd.trace import capture as trace_capture
from temperd.trace.capture import CaptureRequest, TraceError, capture, parse_duration, parse_size

from .daemon_cmd import ask, fail, json_option, rendered, socket_option
from .output import ProgressLine, print_json

# Beyond the capture itself: time temperd may need to write a large trace before it replies.
REPLY_GRACE_S = 300.0


def _note(note: Dict[str, Any]) -> str:
    return (f"capturing: {note.get('elapsed_s', 0):.1f}/{float(note.get('duration_s', 0)):g} s, "
            f"{note.get('events', 0)} events, {note.get('bytes', 0) / 2**20:.1f} MiB")


def _through_daemon(socket_path: str, args: Dict[str, Any], output: str, show: ProgressLine) -> Optional[dict]:
    """The result, or None when temperd is not running (there but not answering: capturing
    beside it would only collide)."""
    reply = ask(socket_path, "trace", not_running=None, timeout=float(args["duration"]) + REPLY_GRACE_S, show=show,
                escaped=False, **args)
    if reply is None:
        return None
    show.done()
    result = reply.get("trace")
    source = rendered(lambda: str(result["output"]), "trace")
    target = output + ".gz" if source.endswith(".gz") and not output.endswith(".gz") else output
    take_file(source, target)
    result.update(output=target, file_bytes=os.path.getsize(target), via="temperd")
    return result


def take_file(source: str, target: str) -> None:
    """A file temperd wrote, copied to target; temperd's copy removed where we may (temperd prunes
    old ones otherwise)."""
    try:
        shutil.copyfile(source, target)
    except OSError as exc:
        fail(f"temperd wrote {source} but it cannot be copied to {target}: {exc.strerror}")
    with contextlib.suppress(OSError):
        os.unlink(source)


def _direct(args: Dict[str, Any], output: str, show: ProgressLine) -> dict:
    if os.geteuid() != 0:
        fail("temperd is not running and capturing directly needs root")
    try:
        result = capture(CaptureRequest(output=output, duration_s=args["duration"], max_bytes=args["max_size"],
                                        pid=args.get("pid"), unit=args.get("unit"), requester=args["requester"]),
                         progress=show)
    except TraceError as exc:
        show.done()
        fail(str(exc))
    show.done()
    out = result.as_dict()
    out["via"] = "direct"
    return out


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _print_result(result: dict) -> None:
    kind = "gzip" if result["compressed"] else "text"
    click.echo(f"wrote {result['output']}: {_size(result['file_bytes'])} ({kind}), {result['events']} events "
               f"in {result['duration_s']:.2f} s (stopped by {result['stopped_by']}), "
               f"{result['lost_events']} lost, via {result['via']}")
    for event, count in sorted(result["by_event"].items(), key=lambda item: -item[1]):
        click.echo(f"  {event:<22} {count:>9}")
    click.echo("open it in https://ui.perfetto.dev (Open trace file)")


@click.command("trace")
@click.option("--duration", default=f"{trace_capture.DEFAULT_DURATION_S:g}s", show_default=True,
              help=f"How long to capture (e.g. 10s, 500ms; at most {trace_capture.MAX_DURATION_S:g}s).")
@click.option("--unit", help="Only this systemd unit's threads (and what they fork).")
@click.option("--pid", type=int, help="Only this process's threads (and what they fork).")
@click.option("--max-size", default=f"{trace_capture.DEFAULT_MAX_BYTES >> 20}M", show_default=True,
              help=f"Stop early at this much trace text (at most {trace_capture.HARD_MAX_BYTES >> 20}M).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Trace file to write; gzip when it ends in .gz or the trace is large.")
@click.option("--direct", is_flag=True, help="Capture in this process (root) without asking temperd.")
@socket_option
@json_option
def trace_command(duration: str, unit: Optional[str], pid: Optional[int], max_size: str, output: str,
                  direct: bool, socket_path: str, as_json: bool) -> None:
    """Capture scheduling events (switches, wakeups, migrations, forks, exits) for the Perfetto UI."""
    try:
        seconds = parse_duration(duration)
        size = parse_size(max_size)
    except TraceError as exc:
        raise click.BadParameter(str(exc)) from None
    if pid is not None and unit:
        raise click.UsageError("give either --unit or --pid, not both")
    output = os.path.abspath(output)
    if not os.path.isdir(os.path.dirname(output)):
        fail(f"output: directory {os.path.dirname(output)} does not exist")
    args: Dict[str, Any] = {"duration": seconds, "max_size": size, "gzip": output.endswith(".gz"),
                            "requester": f"temperctl pid {os.getpid()} uid {os.getuid()} for {output}"}
    if pid is not None:
        args["pid"] = pid
    if unit:
        args["unit"] = unit
    show = ProgressLine(_note)
    result = None if direct else _through_daemon(socket_path, args, output, show)
    if result is None:
        if not direct:
            click.echo("temperd is not running: capturing directly", err=True)
        result = _direct(args, output, show)
    if as_json:
        print_json(result)
    else:
        rendered(lambda: _print_result(result), "trace")
