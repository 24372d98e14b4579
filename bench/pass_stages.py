"""Where a pass over process events spends its CPU: the main loop's CPU time (time.thread_time)
in each stage of each pass that handled events, for bench/churn.py --stages.

temperd runs under this module (`command`, then `serve`): the functions of STAGES are wrapped to add their CPU
time to the pass's stage, and at its exit every pass's stages go to a JSON file, which `table`
prints as the mean per pass. Stages nest (`apply` holds `treat` and `idle cgroup`), so the rows
do not add up to the total; each wrapper costs a microsecond or two, a few per cent of a pass.

    python bench/pass_stages.py --tree DIR --out FILE -- TEMPERD-ARGS   (run by churn.py)
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections import Counter
from typing import Any, Dict, List, Sequence

# (module, attribute path, stage): a stage is the CPU time inside that function during a pass
STAGES = (
    ("temperd.sources.inventory", "Inventory.handle_events", "read events"),
    ("temperd.sources.events", "EventApplier._on_exec", "  new processes"),
    ("temperd.sources.events", "EventApplier._on_task_appeared", "  new threads"),
    ("temperd.daemon.daemon", "decide", "decide"),
    ("temperd.decide.matcher", "Matcher.match", "  match"),
    ("temperd.decide.hostview", "plan_delta", "  plan_delta"),
    ("temperd.backends.native.backend", "NativeBackend.apply", "apply"),
    ("temperd.backends.native.treatment", "ThreadTreatment.treat", "  treat threads"),
    ("temperd.backends.native.backend", "NativeBackend._save", "    state file"),
    ("temperd.backends.native.backend", "NativeBackend._idle_cgroup_only", "  idle cgroup"),
    ("temperd.observe.journal", "Journal.applied", "journal"),
)


def command(tree: str, out: str) -> List[str]:
    """running_temperd's `command`: temperd of the checkout `tree`, its passes timed into `out`."""
    return [sys.executable, os.path.abspath(__file__), "--tree", os.path.abspath(tree), "--out", out, "--"]


def serve(tree: str, out: str, argv: Sequence[str]) -> int:
    sys.path.insert(0, tree)
    passes: List[Dict[str, float]] = []
    current: Counter = Counter()
    for module_name, path, stage in STAGES:
        _wrap(importlib.import_module(module_name), path, stage, current)
    loop = importlib.import_module("temperd.daemon.main_loop")
    step = loop.MainLoop._step

    def timed_step(self):
        inventory = self.daemon.inventory
        received, began = inventory.events_received, time.thread_time()
        try:
            return step(self)
        finally:
            events = inventory.events_received - received
            if events:
                passes.append({**current, "events": events, "total": time.thread_time() - began})
            current.clear()

    loop.MainLoop._step = timed_step
    sys.argv = ["temperd", *argv]
    try:
        return importlib.import_module("temperd.daemon.main").main()
    finally:
        with open(out, "w") as handle:
            json.dump(passes, handle)


def _wrap(module: Any, path: str, stage: str, current: Counter) -> None:
    owner_name, _, name = path.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    original = getattr(owner, name, None)
    if original is None:  # another checkout without this stage
        return

    def timed(*args, **kwargs):
        began = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            current[stage] += time.thread_time() - began

    setattr(owner, name, timed)


def table(path: str, seconds: float) -> List[str]:
    """Each stage's mean CPU per pass that handled events, with the passes a second and events a pass."""
    with open(path) as handle:
        passes = json.load(handle)
    if not passes:
        return ["no pass handled events"]
    n = len(passes)
    lines = [f"{n} passes that handled events ({n / seconds:.1f}/s), {sum(p['events'] for p in passes) / n:.1f} "
             "events a pass; main-loop CPU per pass:"]
    for stage in ["total", *(stage for _, _, stage in STAGES)]:
        mean = sum(p.get(stage, 0.0) for p in passes) / n
        lines.append(f"  {stage:<18} {1000 * mean:7.3f} ms")
    return lines


if __name__ == "__main__":
    args = sys.argv[1:]
    split = args.index("--")
    options = dict(zip(args[:split:2], args[1:split:2]))
    sys.exit(serve(options["--tree"], options["--out"], args[split + 1:]))
