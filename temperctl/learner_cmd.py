"""`temperctl classify` and `temperctl rightsize`: what the running temperd has learned of each
tracked workload - its class, with reasons and confidence, and the CPUs it needs, counted per thread."""

from __future__ import annotations

from typing import Callable, Optional

import click

from .daemon_cmd import ask, json_option, rendered, socket_option
from .output import print_json, print_table

pid_option = click.option("--pid", type=int, help="Only the workload this process belongs to.")
unit_option = click.option("--unit", help="Only the workload of this systemd unit (or with this label).")


def _cpus(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:g}"


def learner_command(name: str) -> Callable[[Callable[[dict, list], None]], click.Command]:
    """`temperctl NAME`: temperd's answer to NAME for the workloads --pid / --unit select, as JSON
    or as the decorated function shows it (its docstring is the command's help)."""
    def make(show: Callable[[dict, list], None]) -> click.Command:
        @click.command(name, help=show.__doc__)
        @pid_option
        @unit_option
        @socket_option
        @json_option
        def command(pid: Optional[int], unit: Optional[str], socket_path: str, as_json: bool) -> None:
            reply = ask(socket_path, name, pid=pid, unit=unit)
            items = reply.get(name) or []
            if as_json:
                print_json(items)
            else:
                rendered(lambda: show(reply, items), name)
        return command
    return make


@learner_command("classify")
def classify_command(reply: dict, items: list) -> None:
    """Each tracked workload's class: criticality, CPU intensity, what bounds it (compute, memory,
    io, mixed), cap sensitivity, GPU; the reason naming every threshold that fired, the signals
    used and missing, and a confidence. Answers from the first minute on with the data so far."""
    if not items:
        click.echo("no tracked workload matches")
        return
    print_table(("WORKLOAD", "CRITICALITY", "INTENSITY", "BOUND", "UTIL %", "CAP-SENS", "GPU", "CONFIDENCE", "WINDOW"),
                [(c["workload"], c["criticality"]["class"], c["cpu"]["intensity"], c["cpu"]["bound"],
                  _cpus(c["cpu"]["avgUtilizationPct"]), c["cpu"]["capSensitivity"], c["gpu"]["intensity"],
                  f"{c['confidence']:.2f}", f"{c['window_s']:g} s") for c in items])
    for c in items:
        click.echo(f"\n{c['workload']}: {c['classificationReason']}")


@learner_command("rightsize")
def rightsize_command(reply: dict, items: list) -> None:
    """CPUs each tracked workload needs, counted per thread: exclusive cores for threads whose p95
    is at least 0.8 of a core, plus the shared remainder at p95 x (1 + margin); against what is
    declared (quota, cpuset, binding cpus), with the saving, the risk where it is short (and
    how often it was throttled), a confidence from the history's length and the reason."""
    if not items:
        click.echo("no tracked workload has a usage history yet")
        return
    host = reply.get("host") or {}
    print_table(("WORKLOAD", "DECLARED", "NEEDED", "EXCLUSIVE", "SHARED", "HOT THREADS", "SAVINGS", "PER-CONTAINER",
                 "CONFIDENCE"),
                [(r["workload"], _cpus(r["declared_cpus"]), _cpus(r["needed_cpus"]), r["exclusive_cores"],
                  _cpus(r["shared_cpus"]), ", ".join(f"{t['comm']}({t['tid']}) {t['p95_cpus']:g}"
                                                     for t in r["hot_threads"]) or "-",
                  _cpus(r["savings_cpus"]), _cpus(r["per_container_cpus"]), f"{r['confidence']:.2f}") for r in items])
    click.echo(f"\nhost: {host.get('cpus', '?')} CPUs, identified savings {_cpus(host.get('savings_cpus'))} CPUs "
               f"(margin {host.get('margin', '?')}, half-life {host.get('half_life_h', '?')} h)")
    for r in items:
        click.echo(f"\n{r['workload']}: {r['reason']}")
        if r["risk"]:
            click.echo(f"  RISK: {r['risk']}")
