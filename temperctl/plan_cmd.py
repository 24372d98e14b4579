"""`temperctl plan` and `temperctl explain`: what temperd decides for this host, and why."""

from __future__ import annotations

import dataclasses
import sys
from typing import Tuple

import click

from temperd.backends.scx.render import RenderError, render_plan
from temperd.config.daemon_config import DEFAULT_CONFIG_DIR
from temperd.decide.hostview import HostView, decide, load_host_view, make_matcher
from temperd.config.errors import ConfigError
from temperd.text import printable_data
from temperd.decide.explain import NoSuchTask, explain
from temperd.sources.inventory import Inventory
from temperd.decide.matcher import MatchResult
from temperd.plan import CONFINED, EXCLUSIVE, LayerPlan
from temperd.sources.shape import SYSFS_ROOT, ShapeError, format_cpulist

from .daemon_cmd import ask, json_option, rendered, socket_option
from .output import print_json, print_table

config_option = click.option("--config", "config_dir", default=DEFAULT_CONFIG_DIR, show_default=True,
                             help="Configuration directory (temperd.toml, profiles.d/).")
sysfs_option = click.option("--sysfs", "--shape", "sysfs_root", default=SYSFS_ROOT, show_default=True,
                            help="sysfs root for the machine shape (a fixture tree plans for another host shape).")


def _view(config_dir: str, sysfs_root: str) -> HostView:
    try:
        view = load_host_view(config_dir, sysfs_root)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(1)
    except ShapeError as exc:
        raise click.ClickException(f"cannot read the machine shape: {exc}")
    for problem in view.problems:
        click.echo(f"warning: not loaded: {problem}", err=True)
    return view


def compute(config_dir: str, sysfs_root: str) -> Tuple[HostView, Inventory, MatchResult, LayerPlan]:
    view = _view(config_dir, sysfs_root)
    inventory = Inventory()
    inventory.reconcile()
    match, layer_plan = decide(view, make_matcher(view), inventory.processes.values())
    return view, inventory, match, layer_plan


def plan_json(view: HostView, match: MatchResult, layer_plan: LayerPlan) -> dict:
    return {
        "machine_shape": view.shape.describe(),
        "workloads": [dataclasses.asdict(w) for w in match.workloads],
        "plan": dataclasses.asdict(layer_plan),
    }


def print_plan(data: dict) -> None:
    """The plan as tables, from its JSON form (the daemon's reply or a local dry run)."""
    click.echo(f"machine shape: {data['machine_shape']}")
    click.echo("")
    print_table(("WORKLOAD", "PROFILE", "TIER", "BUDGET", "THREADS", "WHY"),
                [(w["key"], w["profile_id"] or "-", w["tier"], "-" if w["budget"] is None else f"{w['budget']:g}",
                  len(w["threads"]), w["reason"]) for w in data["workloads"]])
    click.echo("")
    plan = data["plan"] or {"layers": [], "decisions": [], "errors": []}
    print_table(("LAYER", "KIND", "TREATMENT", "CPUS", "MEMBERS", "REASON"),
                [(l["name"], l["kind"], treatment_text(l), format_cpulist(l["cpus"]) or "-", len(l["selector"]["tids"]),
                  "; ".join(l["reasons"])) for l in plan["layers"]])
    click.echo("")
    for decision in plan["decisions"]:
        click.echo(f"- {decision}")
    for error in plan["errors"]:
        click.echo(f"error: {error}")


def treatment_text(layer: dict) -> str:
    """"exclusive (owned)", "exclusive (fenced)", "latency": a layer's treatment and, where it
    holds CPUs of its own, what others may do there."""
    holds = layer.get("ownership") if layer["kind"] == CONFINED and layer["treatment"] == EXCLUSIVE else None
    return f"{layer['treatment']} ({holds})" if holds and layer["cpus"] else layer["treatment"]


def print_scx_config(view: HostView, layer_plan: LayerPlan) -> None:
    """The plan as the scx_layered configuration (JSON on stdout, notes on stderr); exit 1 if it cannot be."""
    try:
        rendered = render_plan(layer_plan, view.shape.n_cpus)
    except RenderError as exc:
        for problem in exc.problems:
            click.echo(f"error: cannot be expressed as a scx_layered config: {problem}", err=True)
        sys.exit(1)
    for note in rendered.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(rendered.to_json())


@click.command("plan")
@click.option("--dry-run", is_flag=True, help="Compute the plan here (as root, no daemon needed) instead of asking temperd.")
@click.option("--backend", type=click.Choice(["native", "scx"]), default="native", show_default=True,
              help="scx: print the plan as the scx_layered configuration temperd would run (computed here, "
                   "like --dry-run).")
@config_option
@sysfs_option
@socket_option
@json_option
def plan_command(dry_run: bool, backend: str, config_dir: str, sysfs_root: str, socket_path: str, as_json: bool) -> None:
    """Show the layer plan: layer, kind, CPUs, members and the reason for each decision.

    Without --dry-run, the plan the running temperd applies; with --dry-run, the plan temperd
    would make from --config on this host (or, with --shape/--sysfs, on the machine shape of
    another host's sysfs tree). With --backend scx, the scx_layered configuration of that plan:
    `temperctl plan --backend scx > layered.json` is a file scx_layered takes as f:layered.json,
    with the options a note names (--allow-partial-core)."""
    if backend == "scx":
        view, _, _, layer_plan = compute(config_dir, sysfs_root)
        print_scx_config(view, layer_plan)
        return
    if dry_run:
        view, _, match, layer_plan = compute(config_dir, sysfs_root)
        data = printable_data(plan_json(view, match, layer_plan))
    else:
        data = ask(socket_path, "plan")
    if as_json:
        print_json({k: data[k] for k in ("machine_shape", "workloads", "plan")})
    else:
        rendered(lambda: print_plan(data), "plan")
    if data["plan"] and data["plan"]["errors"]:
        sys.exit(1)



@click.command("explain")
@click.argument("task_id", type=int)
@click.option("--dry-run", is_flag=True, help="Compute here (as root) from --config instead of asking temperd.")
@config_option
@socket_option
@json_option
def explain_command(task_id: int, dry_run: bool, config_dir: str, socket_path: str, as_json: bool) -> None:
    """Why is process or thread TASK_ID treated as it is?

    The running temperd answers from the plan it applies; where none runs (or with --dry-run)
    the answer is computed here, as root, from --config."""
    reply = None if dry_run else ask(socket_path, "explain", not_running=None, id=task_id)  # None: compute here
    if reply is not None:
        data = rendered(lambda: dict(reply["explain"]), "explain")
    else:
        view, inventory, match, layer_plan = compute(config_dir, SYSFS_ROOT)
        try:
            data = printable_data(explain(task_id, inventory, match, layer_plan, make_matcher(view)))
        except NoSuchTask as exc:
            raise click.ClickException(str(exc))
    if as_json:
        print_json(data)
    else:
        rendered(lambda: print_explanation(data), "explain")


def print_explanation(data: dict) -> None:
    """An explanation as text, from its JSON form (the daemon's reply or computed here)."""
    unit = data["unit"] or "-"
    if data["unit"] and "system_unit" in data:
        unit += f" ({'a system unit' if data['system_unit'] else 'not a system unit'}, {data['unit_cgroup']})"
    click.echo(f"process {data['pid']} ({data['process']}), unit {unit}, cgroup {data['cgroup'] or '-'}")
    workload = data["workload"]
    if workload is None:
        click.echo(f"not treated: {data['why_not']}")
        return
    click.echo(f"workload {workload['key']}: profile {workload['profile_id'] or '-'}, tier {workload['tier']}")
    click.echo(f"  why: {workload['reason']}")
    click.echo(f"  budget: {workload['budget_reason']}")
    rows = []
    for t in data["threads"]:
        layer = data["layers"].get(t["layer"]) if t["layer"] else None
        rows.append((t["tid"], t["comm"], t["group"] or "-", f"{t['layer']} ({layer['kind']}, CPUs "
                     f"{format_cpulist(layer['cpus']) or 'shared'}"
                     + (f" {layer['ownership']}" if layer.get("ownership") else "") + ")" if layer else "-", t["reason"]))
    print_table(("TID", "NAME", "GROUP", "LAYER", "WHY"), rows)
    for name, layer in sorted(data["layers"].items()):
        click.echo(f"layer {name}: {'; '.join(layer.get('reasons') or [])}")
