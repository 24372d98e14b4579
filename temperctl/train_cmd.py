"""`temperctl train`: a profile measured from a running workload instead of written by hand.

Observe (through temperd's control socket when it runs, else directly as root): a bounded
scheduling trace of the workload and per-thread /proc samples while --load runs. Then, here:
analyze (temperd.training), synthesize FILE.toml, write FILE.html (the report) and keep the trace
beside them (FILE.trace, opens in the Perfetto UI).
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Dict, Optional

import click

from temperd.sources.shape import ShapeError, read_shape
from temperd.trace.capture import CaptureRequest, TraceError, parse_duration
from temperd.training.observation import Observation, observe
from temperd.training.train import shape_facts, train

from .daemon_cmd import ask, fail, json_option, rendered, socket_option
from .output import ProgressLine, print_json, print_table
from .trace_cmd import REPLY_GRACE_S, take_file

DEFAULT_DURATION = "20s"


def _note(note: Dict[str, Any]) -> str:
    return (f"{note.get('stage', 'observing')}: {note.get('elapsed_s', 0):.1f}/{float(note.get('duration_s', 0)):g} s, "
            f"{note.get('events', 0)} events, {note.get('threads', 0)} threads")


class LoadCommand:
    """--load: a shell command started for the observation, killed (its whole session) at the end."""

    def __init__(self, command: Optional[str]):
        self.command = command
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "LoadCommand":
        if self.command:
            self.proc = subprocess.Popen(["/bin/sh", "-c", self.command], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _through_daemon(socket_path: str, args: Dict[str, Any], show: ProgressLine) -> Optional[Observation]:
    reply = ask(socket_path, "train", not_running=None, timeout=float(args["duration"]) + REPLY_GRACE_S, show=show,
                escaped=False, **args)
    return None if reply is None else rendered(lambda: Observation.from_dict(reply["observation"]), "train")


def _direct(args: Dict[str, Any], trace_path: str, show: ProgressLine) -> Observation:
    if os.geteuid() != 0:
        fail("temperd is not running and observing directly needs root")
    try:
        return observe(CaptureRequest(output=trace_path, duration_s=args["duration"], pid=args.get("pid"),
                                      unit=args.get("unit"), requester=args["requester"]), progress=show)
    except TraceError as exc:
        fail(str(exc))


def _keep_trace(observation: Observation, trace_path: str) -> str:
    """The trace beside the profile (temperd's copy is removed where we may)."""
    source = str(observation.trace["output"])
    target = trace_path + (".gz" if source.endswith(".gz") else "")
    if os.path.abspath(source) != os.path.abspath(target):
        take_file(source, target)
    return target


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror}")


def _print_summary(summary: Dict[str, Any], report: Optional[str], trace: str) -> None:
    click.echo(f"wrote {summary['profile']}" + (f", report {report}" if report else "") + f", trace {trace}")
    print_table(["group", "class", "treatment", "selector", "threads", "CPUs"],
                [[g["name"], g["class"], g["treatment"],
                  f"busiest = {g['busiest']}" if g["selector"] == "busiest" else
                  "catch_all" if g["selector"] == "catch_all" else ", ".join(g["patterns"])[:48],
                  g["threads"], f"{g['cpu_share']:.2f}"] for g in summary["groups"]])
    click.echo(f"check it: temperctl profiles validate {summary['profile']}; try it: temperctl bind --pid PID "
               f"--profile {summary['profile']}")


@click.group("train", invoke_without_command=True)
@click.option("--pid", type=int, help="The workload: this process and the processes it has forked.")
@click.option("--unit", help="The workload: this systemd unit's processes.")
@click.option("--duration", default=DEFAULT_DURATION, show_default=True, help="How long to observe (at most 60s).")
@click.option("--load", "load", help="Shell command that loads the workload while it is observed (killed at the end).")
@click.option("--id", "profile_id", help="Profile id (default: the program's name + '-trained').")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Profile file to write (FILE.toml).")
@click.option("--no-report", is_flag=True, help="Skip FILE.html.")
@click.option("--direct", is_flag=True, help="Observe in this process (root) without asking temperd.")
@socket_option
@json_option
@click.pass_context
def train_command(ctx: click.Context, pid: Optional[int], unit: Optional[str], duration: str, load: Optional[str],
                  profile_id: Optional[str], output: Optional[str], no_report: bool, direct: bool, socket_path: str,
                  as_json: bool) -> None:
    """Measure a running workload's thread structure and write a profile for it.

    `temperctl train evaluate FILE.toml ...` judges a profile by running a benchmark."""
    if ctx.invoked_subcommand is not None:
        return
    if (pid is None) == (not unit):
        raise click.UsageError("give either --pid or --unit")
    if not output:
        raise click.UsageError("give -o FILE.toml")
    try:
        seconds = parse_duration(duration)
    except TraceError as exc:
        raise click.BadParameter(str(exc)) from None
    output = os.path.abspath(output)
    if not os.path.isdir(os.path.dirname(output)):
        fail(f"output: directory {os.path.dirname(output)} does not exist")
    stem = output[:-5] if output.endswith(".toml") else output
    try:
        shape = shape_facts(read_shape())
    except ShapeError as exc:
        fail(f"cannot read this host's machine shape: {exc}")
    args: Dict[str, Any] = {"duration": seconds, "requester": f"temperctl train pid {os.getpid()} uid {os.getuid()}"}
    if pid is not None:
        args["pid"] = pid
    else:
        args["unit"] = unit
    show = ProgressLine(_note, quiet=as_json)
    via = "temperd"
    with LoadCommand(load):
        observation = None if direct else _through_daemon(socket_path, args, show)
        if observation is None:
            via = "direct"
            if not direct:
                show.say("temperd is not running: observing directly")
            observation = _direct(args, stem + ".trace", show)
    trace = _keep_trace(observation, stem + ".trace")
    show.say(f"analyzing {observation.trace.get('events', 0)} events")
    try:
        trained = train(observation, shape, trace_path=trace, requested_id=profile_id, load=load)
    except ValueError as exc:
        fail(f"the synthesized profile does not validate: {exc}")
    _write(output, trained.profile_text)
    report = None
    if not no_report:
        from temperd.training.report import ReportUnavailable, write_report

        try:
            report = write_report(trained, stem + ".html")
        except ReportUnavailable as exc:
            show.say(f"no report: {exc}")
    summary = trained.summary(output)
    if as_json:
        print_json(dict(summary, report=report, trace=trace, via=via))
    else:
        _print_summary(summary, report, trace)


from .evaluate_cmd import evaluate_command  # noqa: E402  (the subcommand needs train_command defined)

train_command.add_command(evaluate_command)
