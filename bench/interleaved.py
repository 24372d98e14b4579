"""Stock against temperd, interleaved: what bench/connect_churn.py and bench/build_churn.py share —
the arms' order per round, a noisy run repeated once, the daemon's counters over a window, and the
closing report (the table, the verdicts, the JSON file)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from common import host_description, median, wait_for_quiet

ARMS = ("stock", "temperd")


def arguments(doc: str) -> argparse.ArgumentParser:
    """A parser described by the docstring's first paragraph, with the options both benches take:
    rounds, another checkout's temperd, the JSON file."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two arms")
    parser.add_argument("--tree", help="run the temperd package of this checkout")
    parser.add_argument("--json", metavar="FILE", help="write the runs as JSON into FILE")
    return parser


def arm_order(round_no: int) -> Tuple[str, ...]:
    """stock first in odd rounds, temperd first in even ones."""
    return ARMS if round_no % 2 else ARMS[::-1]


def quieter_of_two(run_once: Callable[[str], Dict[str, object]]) -> Dict[str, object]:
    """run_once(the host's state just before it) -> a run with "noisy" and "foreign_cpu_pct_of_core";
    a noisy run (another process's CPU or the hypervisor's steal beyond NoiseLimits) is run again
    once, and the one with less foreign CPU kept."""
    kept: Optional[Dict[str, object]] = None
    for attempt in range(2):
        run = run_once(wait_for_quiet(30.0, window_s=1.0).describe())  # other work on the host, before each run
        run["attempt"] = attempt + 1
        if kept is None or float(run["foreign_cpu_pct_of_core"]) < float(kept["foreign_cpu_pct_of_core"]):  # type: ignore
            kept = run
        if not run["noisy"]:
            break
    return kept  # type: ignore[return-value]


def daemon_counts(daemon) -> Dict[str, Optional[int]]:
    """The daemon's replans and process events received since its start (its status); None where
    it did not answer, and {} without a daemon (the stock arm)."""
    if daemon is None:
        return {}
    try:
        status = daemon.status(timeout=30)
        return {"replans": int(status["replans"]), "events": int(status["inventory"]["events_received"])}
    except (RuntimeError, subprocess.TimeoutExpired, KeyError, TypeError, ValueError):
        return {"replans": None, "events": None}


def grown(before: Dict[str, Optional[int]], after: Dict[str, Optional[int]]) -> Dict[str, Optional[int]]:
    """daemon_counts over a window: after - before, None where either is missing."""
    return {key: after[key] - before[key] if before.get(key) is not None and after.get(key) is not None else None  # type: ignore
            for key in ("replans", "events")}


def num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def ratio_verdict(what: str, goal: float, ratios: Sequence[float]) -> str:
    """The goal on the median of the rounds' temperd/stock ratios, with each round's."""
    return (f"{what} with temperd >= {goal}x stock's: {'PASS' if median(ratios) >= goal else 'MISS'} "
            f"(median {median(ratios):.3f}x; rounds {', '.join(f'{x:.3f}' for x in ratios)})")


def needs_root() -> bool:
    if os.geteuid() != 0:
        print("run as root: temperd changes other processes' scheduling", file=sys.stderr)
        return True
    return False


def report(runs: Sequence[Dict[str, object]], table: Callable, verdicts: Callable[..., List[str]],
           json_path: Optional[str], **about) -> None:
    """The runs' table and verdicts on stdout; the runs and `about` as JSON into json_path."""
    print()
    print(table(runs))
    print()
    for line in verdicts(runs):
        print(f"- {line}")
    if json_path:
        with open(json_path, "w") as handle:
            json.dump({"host": host_description(), **about, "argv": sys.argv[1:], "runs": list(runs)}, handle, indent=1)
            handle.write("\n")
