"""bench/isolation.py's results at equal offered load (open loop, bench/openloop.py): the table per
offered load, the goals and their verdicts, and the short results table README.md and
docs/benchmarks.md carry, all generated from the bench's JSON (`--markdown`).

A cell (offered load, spinner step, arm) sustained the rate where the median of its runs'
achieved / offered is at least openloop.SUSTAINED; its p99 is over the runs that sustained it.
A cell that did not has no p99: the table says "not sustained" and the achieved share.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import arms as A  # bench/arms.py
import openloop as O  # bench/openloop.py
from isolation_report import Goal, groups_of, parse_step, step_name, verdict, wait_pct, window_median

from temperd.training import harness as T

FULL = T.Spread(1.0, 1.0, 1.0, 2)  # achieved / offered = 1, as the baseline of "sustains the rate"
BASELINES = (A.STOCK, A.BY_HAND)
PRIMARY = A.TEMPERD_BG  # the arm the short results table and README speak for


class Cells:
    """The spreads of one JSON's runs by (step, arm): p50, p99 (sustained runs only), achieved / offered."""

    def __init__(self, runs: Sequence[T.Run]):
        self.runs = runs
        self.groups = groups_of(runs)
        self.p50, self.p99, self.ratio, self.rate, self.offered = (
            T.summarise(runs, m) for m in ("p50_ms", "p99_ms", "achieved_ratio", "rate", "offered"))

    def get(self, table, variant: str, bg: int, arm: str) -> Optional[T.Spread]:
        return table.get((step_name(variant, bg), arm))

    def sustained(self, variant: str, bg: int, arm: str) -> bool:
        found = self.get(self.ratio, variant, bg, arm)
        return found is not None and found.median >= O.SUSTAINED

    def sustains(self, variant: str, bg: int, arm: str) -> T.Bound:
        """achieved / offered >= SUSTAINED, judged by the verdict rule over the runs' range."""
        found = self.get(self.ratio, variant, bg, arm) or T.spread([])
        return T.bound(found, FULL, O.SUSTAINED, at_least=True)

    def ok_runs(self, variant: str, bg: int, arm: str) -> List[T.Run]:
        return [r for r in self.groups.get((step_name(variant, bg), arm), []) if r.ok]

    def p99_text(self, variant: str, bg: int, arm: str, with_range: bool = True) -> str:
        if not self.sustained(variant, bg, arm):
            ratio = self.get(self.ratio, variant, bg, arm)
            return f"not sustained ({ratio.median:.2f}× offered)" if ratio and ratio.n else "-"
        q = self.get(self.p99, variant, bg, arm)
        return f"{q.median:.3f} ({q.low:.3f}–{q.high:.3f})" if with_range else f"{q.median:.3f}"


def count(value: Optional[float]) -> str:
    """A rate as the tables write it: 40 801 (a space between thousands)."""
    return "-" if value is None or value != value else f"{value:,.0f}".replace(",", " ")


def failed(cells: "Cells", variant: str, bg: int, arm: str) -> str:
    """Why a cell has no good run ("" where it has one, or no run at all)."""
    errors = [r.error for r in cells.groups.get((step_name(variant, bg), arm), []) if not r.ok]
    return "" if cells.ok_runs(variant, bg, arm) or not errors else errors[-1]


def p99_ratio(cells: Cells, variant: str, bg: int, arm: str, base: str, base_bg: Optional[int] = None) -> str:
    """arm's p99 over base's (a * where the ranges are apart by the compare rule); "-" where either
    did not sustain the rate."""
    if not (cells.sustained(variant, bg, arm) and cells.sustained(variant, bg if base_bg is None else base_bg, base)):
        return "-"
    found = T.compare(cells.get(cells.p99, variant, bg, arm),
                      cells.get(cells.p99, variant, bg if base_bg is None else base_bg, base), higher_is_better=False)
    return f"{found.ratio:.2f}{'' if found.verdict == T.WITHIN_NOISE else '*'}"


def markdown_open_table(variant: str, ladder: Sequence[int], arm_names: Sequence[str], runs: Sequence[T.Run]) -> str:
    """One offered load: every spinner step and arm, p99 from the intended send time where the
    generator knows it, its ratios to stock and by-hand, and the host's noise beside."""
    cells = Cells(runs)
    lines = ["| bg | arm | offered /s | achieved ÷ offered | p50 ms | p99 ms (range) | p99 ÷ stock | p99 ÷ by-hand | "
             "runs (not sustained) | client wait % | idle % | steal % | foreign % of a core |",
             "|" + "---|" * 13]
    for bg in ladder:
        for arm in arm_names:
            group = cells.ok_runs(variant, bg, arm)
            if failed(cells, variant, bg, arm):
                lines.append(f"| {bg} | {arm} | every run failed: {failed(cells, variant, bg, arm)} |")
            if not group:
                continue
            offered, ratio = cells.get(cells.offered, variant, bg, arm), cells.get(cells.ratio, variant, bg, arm)
            p50 = cells.get(cells.p50, variant, bg, arm)
            short = sum(1 for r in group if not r.metrics.get("sustained"))
            lines.append(
                f"| {bg} | {arm} | {count(offered.median)} | {ratio.median:.3f} | "
                f"{p50.median if cells.sustained(variant, bg, arm) else float('nan'):.3f} | "
                f"{cells.p99_text(variant, bg, arm)} | {p99_ratio(cells, variant, bg, arm, A.STOCK)} | "
                f"{p99_ratio(cells, variant, bg, arm, A.BY_HAND)} | {len(group)} ({short}) | "
                f"{wait_pct(group, 'client'):.1f} | {window_median(group, 'idle_pct'):.0f} | "
                f"{window_median(group, 'steal_pct'):.1f} | {window_median(group, 'foreign_core_pct'):.1f} |")
    return "\n".join(lines).replace("| nan |", "| - |")


def open_goals(variant: str, ladder: Sequence[int], runs: Sequence[T.Run], arm: str,
               p99_resolution: float = 1.0) -> List[Goal]:
    """The goals at equal offered load for one temperd arm, each settled or within noise by
    temperd.training.verdicts (a p99 where the arm did not sustain the rate misses):
    - at every spinner step, p99 <= 1.1x by-hand's (where by-hand does not sustain the rate: the
      arm sustains it);
    - at 0 spinners, p99 <= 1.1x stock's;
    - at the top step, p99 at least 3x better than stock's where stock sustains the rate, and where
      it does not, the arm sustains it;
    - at the top step, host idle <= 5 % (the waste measure);
    - flat: the arm's p99 at the top step <= 1.1x its own at 0 spinners."""
    cells = Cells(runs)
    out: List[Goal] = []
    have = [bg for bg in ladder if cells.ok_runs(variant, bg, arm)]
    top = max(ladder)

    def p99_bound(bg, base, limit, base_bg=None):
        mine = cells.get(cells.p99, variant, bg, arm) or T.spread([])
        theirs = cells.get(cells.p99, variant, bg if base_bg is None else base_bg, base) or T.spread([])
        return T.bound(mine, theirs, limit, resolution=p99_resolution)

    def against(bg, base, limit) -> Tuple[List[T.Bound], str]:
        """p99 within `limit` of base's where base sustains the rate, else the arm sustains it."""
        mine = cells.sustains(variant, bg, arm)
        if not cells.sustained(variant, bg, base):
            return [mine], f"bg={bg}: {base} not sustained, {arm} at {mine.ratio:.2f}x offered"
        q = p99_bound(bg, base, limit)
        return [q, mine], f"bg={bg} {q.ratio:.2f}x" + ("" if cells.sustained(variant, bg, arm) else " (not sustained)")

    def judged(text, parts):
        bounds = [b for found, _ in parts for b in found]
        met, firm = T.settled(bounds)
        out.append((text, met, firm, ", ".join(words for _, words in parts)))

    for bg in ladder:
        if failed(cells, variant, bg, arm):
            out.append((f"bg={bg}: not measured", None, False, f"every run failed: {failed(cells, variant, bg, arm)}"))
    hand = [bg for bg in have if cells.ok_runs(variant, bg, A.BY_HAND)]
    if hand:
        judged("p99 <= 1.1x by-hand's at every spinner step", [against(bg, A.BY_HAND, 1.1) for bg in hand])
    if 0 in have and cells.ok_runs(variant, 0, A.STOCK):
        judged("bg=0: p99 <= 1.1x stock's", [against(0, A.STOCK, 1.1)])
    if top in have and top > 0 and cells.ok_runs(variant, top, A.STOCK):
        found, words = against(top, A.STOCK, 1 / 3)
        if cells.sustained(variant, top, A.STOCK) and found[0].ratio:
            words = f"bg={top} stock / {arm} = {1 / found[0].ratio:.2f}x"
        judged(f"bg={top}: p99 at least 3x better than stock's where stock sustains the rate (else {arm} sustains it)", [(found, words)])
    if top in have and top > 0:
        idle = window_median(cells.ok_runs(variant, top, arm), "idle_pct")
        out.append((f"bg={top}: host idle <= 5 %", idle <= 5.0, True, f"{idle:.1f} %"))
    if top in have and 0 in have and top > 0:
        flat = p99_bound(top, arm, 1.1, base_bg=0)
        judged(f"flat: p99 at bg={top} <= 1.1x its own at bg=0",
               [([flat, cells.sustains(variant, top, arm)], f"{flat.ratio:.2f}x")])
    return out


def goals_lines(variant: str, ladder: Sequence[int], arm_names: Sequence[str], runs: Sequence[T.Run],
                p99_resolution: float = 1.0) -> List[str]:
    lines = []
    for arm in arm_names:
        if arm in BASELINES:
            continue
        for text, met, firm, numbers in open_goals(variant, ladder, runs, arm, p99_resolution):
            lines.append(f"- {arm}, {text}: **{verdict(met, firm)}** ({numbers})")
    return lines


def variants_of(runs: Sequence[T.Run]) -> List[str]:
    seen: List[str] = []
    for run in runs:
        variant = parse_step(run.step)[0]
        if variant not in seen:
            seen.append(variant)
    return sorted(seen, key=O.fraction_of)


def ladder_of(runs: Sequence[T.Run]) -> List[int]:
    return sorted({parse_step(r.step)[1] for r in runs})


def summary_rows(data: dict, runs: Sequence[T.Run], loads: Optional[Sequence[float]] = None) -> List[str]:
    """The short results table's rows for one JSON: per offered load, p99 at 0 spinners -> the top
    step for stock, by-hand and temperd+bg, and how many of temperd+bg's goals pass."""
    cells = Cells(runs)
    ladder = ladder_of(runs)
    top = max(ladder)
    rows = []
    for variant in variants_of(runs):
        if loads is not None and O.fraction_of(variant) not in loads:
            continue
        offered = cells.get(cells.offered, variant, 0, A.STOCK) or cells.get(cells.offered, variant, top, A.STOCK)
        found = open_goals(variant, ladder, runs, PRIMARY, float(data.get("p99_resolution", 1.0)))
        judged = [g for g in found if g[1] is not None]
        passed = sum(1 for _, met, _, _ in judged if met)
        firm = sum(1 for _, met, settled, _ in judged if met and settled)
        unmeasured = len(found) - len(judged)
        arms = " | ".join(" → ".join("error" if failed(cells, variant, bg, arm) else cells.p99_text(variant, bg, arm, False)
                                     for bg in (0, top)) for arm in (A.STOCK, A.BY_HAND, PRIMARY))
        rows.append(f"| {data['workload']} | {O.fraction_of(variant):g} × {count(data['capacity'])} = "
                    f"{count(offered.median if offered else None)}/s | {top} | {arms} | "
                    f"{passed} of {len(judged)} ({firm} settled)"
                    + (f"; {unmeasured} step(s) not measured" if unmeasured else "") + " |")
    return rows


def summary_table(datasets: Sequence[Tuple[dict, Sequence[T.Run]]], loads: Optional[Sequence[float]] = None) -> str:
    lines = ["| server | offered (× stock's idle rate) | spinners | stock p99 ms, 0 spinners → the top step | by-hand | "
             "temperd+bg | temperd+bg goals met |", "|---|---|---|---|---|---|---|"]
    for data, runs in datasets:
        lines += summary_rows(data, runs, loads)
    return "\n".join(lines)


def summary_caption(datasets: Sequence[Tuple[dict, Sequence[T.Run]]]) -> str:
    """Host, and each server's date and the host's state before its first run, from the JSON."""
    parts = []
    for data, _ in datasets:
        state = data.get("host_state", "")
        before = state.split("before the first run: ", 1)[1] if "before the first run: " in state else state
        parts.append(f"{data['workload']} {data['date']} ({data.get('repetitions', '?')} repetitions of "
                     f"{data.get('seconds', '?')} s runs; before them {before or 'host state not recorded'})")
    host = datasets[0][0]["host"].split(": ", 1)[-1] if datasets else ""
    return f"Host: {host}. " + "; ".join(parts) + "."


def _as_run(command: str) -> str:
    """A JSON's command as one runs it again: its --note (a description of that run) left out."""
    return re.sub(r" --note ('[^']*'|\S+)", "", command)


def reproduce(datasets: Sequence[Tuple[dict, Sequence[T.Run]]]) -> str:
    """The command that made each JSON, as run from the checkout: one loop over the servers where
    their commands differ only in the server's name."""
    made = [(data["workload"], _as_run(data["command"])) for data, _ in datasets if data.get("command")]
    shapes = {command.replace(f"--server {name} ", "--server $s ").replace(f"isolation-{name}-", "isolation-$s-")
              for name, command in made}
    if len(made) > 1 and len(shapes) == 1:
        commands = (f"`for s in {' '.join(name for name, _ in made)}; do sudo .venv/bin/python {shapes.pop()}; "
                    "done`")
    else:
        commands = "; ".join(f"`sudo .venv/bin/python {command}`" for _, command in made)
    return (f"Reproduce: {commands}, then `.venv/bin/python bench/isolation.py --update-docs`; every server's "
            "table and the full ladder's command: [docs/benchmarks.md](docs/benchmarks.md).")
