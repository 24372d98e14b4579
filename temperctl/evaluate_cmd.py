"""`temperctl train evaluate`: a profile judged by the user's benchmark, with the workload bound to
it and without (arms interleaved, each --reps times), beside --background N spinners in the
background tier; the verdict is noise-aware and says its rule (temperd.training.evaluate). --refine then
hill-climbs one parameter at a time (temperd.training.refine) and writes the best profile found,
its trial log as comments. Binding goes through temperd's control socket, so temperd must be running."""

from __future__ import annotations

import os
from typing import Optional

import click

from temperd.trace.capture import unit_pids
from temperd.training.evaluate import (MIN_EFFECT, MIN_REPS, EvaluationError, Request, evaluate, log_comment,
                                       measure_arms)
from temperd.training.refine import refine, trial_log
from temperd.training.harness import compare

from .daemon_cmd import ask, fail, json_option, socket_option
from .output import print_json

BIND_RETRY_S = 2.0  # a process just started may not be in temperd's inventory yet
WHY = " (evaluate binds the profile through temperd)"


@click.command("evaluate")
@click.argument("profile_path", metavar="FILE.toml", type=click.Path(dir_okay=False, exists=True))
@click.option("--pid", type=int, help="The workload's process (bound with its descendants).")
@click.option("--unit", help="The workload's systemd unit (its first process is bound).")
@click.option("--bench", required=True, help="Shell command that measures the workload once.")
@click.option("--metric", required=True, help="Regular expression; its first group in --bench's output is the metric.")
@click.option("--higher-is-better", is_flag=True, help="The metric is a rate (default: lower is better, a latency).")
@click.option("--background", type=click.IntRange(0, 256), default=0, show_default=True,
              help="CPU spinners beside the workload, in the background tier.")
@click.option("--reps", type=click.IntRange(MIN_REPS, 100), default=MIN_REPS, show_default=True,
              help="Runs per arm.")
@click.option("--tier", type=click.Choice(("critical", "standard", "background")), help="The workload's tier while bound.")
@click.option("--refine", "refine_it", is_flag=True,
              help="Then hill-climb: change one group parameter at a time, keep a measured improvement (needs -o).")
@click.option("--max-trials", type=click.IntRange(1, 100), default=12, show_default=True,
              help="With --refine: the most neighbours measured.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the profile (with --refine: the best found) with the evaluation and trial log appended.")
@socket_option
@json_option
def evaluate_command(profile_path: str, pid: Optional[int], unit: Optional[str], bench: str, metric: str,
                     higher_is_better: bool, background: int, reps: int, tier: Optional[str], refine_it: bool,
                     max_trials: int, output: Optional[str], socket_path: str, as_json: bool) -> None:
    """Run a benchmark with and without the profile and say whether it helps, beyond the noise."""
    if (pid is None) == (not unit):
        raise click.UsageError("give either --pid or --unit")
    if refine_it and not output:
        raise click.UsageError("--refine writes the profile it finds: give -o OUT.toml")
    if unit:
        pids = unit_pids(unit)
        if not pids:
            fail(f"unit {unit} has no running processes")
        pid = min(pids)
    with open(profile_path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    name = os.path.abspath(profile_path)

    def bind(target: int, profile: str, bound_tier: Optional[str]) -> None:
        ask(socket_path, "bind", retry_s=BIND_RETRY_S, why=WHY, pid=target, profile_text=profile, tier=bound_tier,
                 profile_name=name if target == pid else "evaluation spinners",
                 requester=f"temperctl train evaluate pid {os.getpid()}")

    def unbind(target: int) -> None:
        ask(socket_path, "unbind", retry_s=BIND_RETRY_S, why=WHY, pid=target)

    def progress(run) -> None:
        if not as_json:
            value = run.metrics.get("metric")
            click.echo(f"rep {run.rep} {run.arm:<7} {value if value is not None else run.error}"
                       + (" (noisy host)" if run.noisy else ""), err=True)

    req = Request(pid=pid, profile_text=text, bench=bench, metric=metric, higher_is_better=higher_is_better,
                  background=background, reps=reps, tier=tier)
    try:
        verdict = evaluate(req, bind, unbind, progress)
        if not as_json:
            click.echo(verdict.describe())
            click.echo(f"rule: {verdict.rule}")
        refined = _refine(req, bind, unbind, max_trials, as_json) if refine_it else None
    except EvaluationError as exc:
        fail(str(exc))
    if output:
        best = refined.text if refined else text
        log = log_comment(verdict, req)
        if refined:
            log += trial_log(refined, f"Refined from {name} ({len(refined.trials)} trials, each arm {req.reps} "
                                      f"runs, interleaved; a change kept only when better by the rule above)")
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(best.rstrip("\n") + "\n\n" + log)
    if as_json:
        out = {"verdict": verdict.verdict, "ratio": verdict.ratio, "rule": verdict.rule,
               "with": vars(verdict.with_profile), "without": vars(verdict.without), "runs": verdict.runs,
               "output": output}
        if refined:
            out["trials"] = [{"trial": t.number, "change": t.change.describe(), "candidate": vars(t.candidate),
                              "best": vars(t.best), "ratio": round(t.ratio, 4), "verdict": t.verdict, "kept": t.kept}
                             for t in refined.trials]
        print_json(out)
    elif refined:
        click.echo(f"refined: {len(refined.kept)} of {len(refined.trials)} changes kept; written to {output}")


CANDIDATE, BEST = "candidate", "best"


def _refine(req: Request, bind, unbind, max_trials: int, quiet: bool):
    """The hill climb, each neighbour against the best so far, both bound, arms interleaved."""
    def measure(candidate: str, best: str):
        spreads, _runs = measure_arms(req, {BEST: best, CANDIDATE: candidate}, bind, unbind, step="refine")
        comparison = compare(spreads[CANDIDATE], spreads[BEST], req.higher_is_better, MIN_EFFECT)
        return spreads[CANDIDATE], spreads[BEST], comparison.ratio, comparison.verdict

    def progress(trial) -> None:
        if not quiet:
            click.echo(trial.describe(), err=True)

    return refine(req.profile_text, measure, max_trials, progress)
