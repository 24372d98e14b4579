"""Judge a profile by measuring it: the user's benchmark command run repeatedly with the workload
bound to the profile and without, arms interleaved (harness.run_trials: the order reversed every
other repetition), optionally beside N bounded CPU spinners that are bound to the background
tier (a density step), the metric read from the benchmark's output.

The verdict rule (verdicts.compare): the profile is better or worse only when each arm has at least
MIN_REPS runs, the ranges (lowest to highest run) of the two arms do not overlap, and the medians
differ by at least MIN_EFFECT; anything else is within the noise.

Binding goes through temperd (the caller passes the bind and unbind functions: the control socket
is the daemon's), so this module runs the trials and judges, and nothing else.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from temperd.training.harness import HostMonitor, Run, TrialPlan, read_proc_cpu, run_trials, spinners
from temperd.training.verdicts import Spread, compare, spread

MIN_REPS = 5
MIN_EFFECT = 0.05
WITHOUT, WITH = "without", "with"
RULE = (f"better or worse only when both arms have >= {MIN_REPS} runs, their ranges (lowest to highest run) do "
        f"not overlap and the medians differ by >= {MIN_EFFECT:.0%}; otherwise within the noise")
# Spinners yield while they are measured beside the workload: all of their threads, background
# tier, SCHED_IDLE as the background tier gives a batch job (the isolation bench's temperd+bg).
SPINNER_PROFILE = """schema_version = 1
id = "evaluation-spinners"
description = "temperctl train evaluate: background CPU spinners"
[[thread_groups]]
name = "spin"
catch_all = true
treatment = "yield"
yield_policy = "idle"
"""

Bind = Callable[[int, str, Optional[str]], None]  # (pid, profile text, tier)
Unbind = Callable[[int], None]


class EvaluationError(Exception):
    """One line for the user: a benchmark that failed or printed no metric."""


@dataclass
class Request:
    pid: int
    profile_text: str
    bench: str  # a shell command
    metric: str  # a regular expression; its first group is the number
    higher_is_better: bool = False
    background: int = 0
    reps: int = MIN_REPS
    tier: Optional[str] = None
    bench_timeout_s: float = 600.0


@dataclass
class Verdict:
    without: Spread
    with_profile: Spread
    ratio: float
    verdict: str
    rule: str = RULE
    runs: List[Dict[str, object]] = field(default_factory=list)

    def describe(self) -> str:
        return (f"with the profile {self.with_profile.describe()}, without {self.without.describe()}: "
                f"{self.ratio:.3f}x, {self.verdict}")


def metric_of(output: str, pattern: str) -> float:
    """The first capture group of `pattern` in the benchmark's output, as a number."""
    found = re.search(pattern, output, re.MULTILINE)
    if found is None or not found.groups():
        raise EvaluationError(f"--metric {pattern!r} found no capture group in the benchmark's output "
                              f"(last line: {output.strip().splitlines()[-1][:120] if output.strip() else 'none'!r})")
    try:
        return float(found.group(1))
    except ValueError:
        raise EvaluationError(f"--metric {pattern!r} captured {found.group(1)!r}, not a number") from None


def _bench(command: str, timeout_s: float) -> str:
    try:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout_s,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise EvaluationError(f"--bench did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        raise EvaluationError(f"--bench exited with status {done.returncode}: {done.stderr.strip()[-200:]}")
    return done.stdout + done.stderr


def measure_arms(request: Request, texts: Dict[str, Optional[str]], bind: Bind, unbind: Unbind,
                 progress: Callable[[Run], None] = lambda run: None,
                 step: Optional[str] = None) -> Tuple[Dict[str, Spread], List[Run]]:
    """Each arm (name -> the profile text the workload is bound to, None: unbound) request.reps
    times, interleaved; the metric's spread per arm. Raises EvaluationError."""
    if request.reps < MIN_REPS:
        raise EvaluationError(f"--reps: expected at least {MIN_REPS} repetitions per arm, found {request.reps}")

    @contextlib.contextmanager
    def arm(name: str) -> Iterator[None]:
        text = texts[name]
        if text is not None:
            bind(request.pid, text, request.tier)
        try:
            yield
        finally:
            if text is not None:
                unbind(request.pid)

    @contextlib.contextmanager
    def background(count: int) -> Iterator[None]:
        # A session of their own, as a batch job under a service manager: the benchmark runs in
        # another (its shell's), so the spinners' SCHED_IDLE alone would yield only inside their
        # autogroup; a whole-yield session is one temperd weighs down too.
        with spinners(count, request.bench_timeout_s, own_session=True) as workers:
            parent = None
            if workers:
                info = read_proc_cpu(workers[0])
                parent = info.ppid if info else None
                if parent:
                    bind(parent, SPINNER_PROFILE, "background")
            try:
                yield
            finally:
                if parent:
                    unbind(parent)

    def measure(step: str, name: str, rep: int) -> Run:
        run = Run(step, name, rep)
        with arm(name):
            with background(request.background):
                monitor = HostMonitor(also_ours=(request.pid,))  # the workload's own CPU is not noise
                monitor.start()
                started = time.monotonic()
                try:
                    run.metrics["metric"] = metric_of(_bench(request.bench, request.bench_timeout_s), request.metric)
                except EvaluationError as exc:
                    run.error = str(exc)
                run.metrics["seconds"] = round(time.monotonic() - started, 3)
                run.window = monitor.stop()
        return run

    plan = TrialPlan(steps=[step or f"background={request.background}"], arms_of=lambda step: tuple(texts),
                     reps=request.reps, max_retries=2)
    runs = run_trials(plan, measure, progress)
    failed = [r for r in runs if not r.ok]
    if failed:
        raise EvaluationError(failed[0].error)
    return {name: spread(r.metrics["metric"] for r in runs if r.arm == name) for name in texts}, runs


def run_log(runs: List[Run]) -> List[Dict[str, object]]:
    return [{"arm": r.arm, "rep": r.rep, "metric": r.metrics["metric"], "noisy": r.noisy,
             "host": r.window.describe() if r.window else ""} for r in runs]


def evaluate(request: Request, bind: Bind, unbind: Unbind, progress: Callable[[Run], None] = lambda run: None) -> Verdict:
    """Both arms, interleaved, request.reps times each; raises EvaluationError."""
    spreads, runs = measure_arms(request, {WITHOUT: None, WITH: request.profile_text}, bind, unbind, progress)
    comparison = compare(spreads[WITH], spreads[WITHOUT], request.higher_is_better, MIN_EFFECT)
    return Verdict(spreads[WITHOUT], spreads[WITH], round(comparison.ratio, 4), comparison.verdict, runs=run_log(runs))


def log_comment(verdict: Verdict, request: Request) -> str:
    """The evaluation as comment lines to append to the profile."""
    lines = [f"# Evaluated {time.strftime('%Y-%m-%d %H:%M')}: --bench {request.bench!r}, --metric {request.metric!r} "
             f"({'higher' if request.higher_is_better else 'lower'} is better), --background {request.background}, "
             f"{request.reps} repetitions per arm, arms interleaved",
             f"# Verdict: {verdict.describe()}", f"# Rule: {verdict.rule}"]
    for run in verdict.runs:
        lines.append(f"#   rep {run['rep']} {run['arm']:<7} {run['metric']:g}" + ("  (noisy host)" if run["noisy"] else ""))
    return "\n".join(lines) + "\n"
