"""bench/isolation.py's results: the step names, the terminal and markdown tables, the goals and
their verdicts, and the JSON a run is kept in (read back by `--markdown`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

import arms as A  # bench/arms.py
import workloads as W  # bench/workloads.py

from temperd.training import harness as T


# ---- steps ----------------------------------------------------------------------------------------------


def step_name(variant: str, bg: int) -> str:
    return f"{variant} bg={bg}"


def parse_step(name: str) -> Tuple[str, int]:
    variant, _, bg = name.rpartition(" bg=")
    return variant, int(bg)


# ---- tables ----------------------------------------------------------------------------------------------


def wait_pct(runs: Sequence[T.Run], label: str, attr: str = "wait_pct") -> float:
    return T.median(getattr(r.waits[label], attr) for r in runs if label in r.waits)


def window_median(runs: Sequence[T.Run], attr: str) -> float:
    values = (getattr(r.window, attr) for r in runs if r.window is not None)
    return T.median(float("nan") if v is None else v for v in values)  # None: not counted (older JSON)


def groups_of(runs: Sequence[T.Run]) -> Dict[Tuple[str, str], List[T.Run]]:
    out: Dict[Tuple[str, str], List[T.Run]] = {}
    for run in runs:
        out.setdefault((run.step, run.arm), []).append(run)
    return out


def mark(comparison: T.Comparison) -> str:
    """The ratio, starred where the difference stands out of the runs' spread."""
    return f"{comparison.ratio:5.2f}{'' if comparison.verdict == T.WITHIN_NOISE else '*'}"


def by_hand_ratio(work: Dict[Tuple[str, str], T.Spread], step: str, arm: str) -> str:
    """The work done (the spinners', the neighbour's) under an arm over the same by hand ("-" without it)."""
    mine, hand = work.get((step, arm)), work.get((step, A.BY_HAND))
    if mine is None or hand is None or not hand.median or hand.median != hand.median:
        return "-"
    return f"{mine.median / hand.median:.2f}"


def print_table(workload: W.Workload, variant: str, ladder: Sequence[int], arm_names: Sequence[str],
                runs: Sequence[T.Run], amount: int) -> None:
    groups = groups_of(runs)
    rate = T.summarise(runs, "rate")
    p50 = T.summarise(runs, "p50_ms")
    p99 = T.summarise(runs, "p99_ms")
    bg_ops = T.summarise(runs, "bg_ops_s")
    neighbour = _measured(runs, "neighbour_ops_s")
    print()
    print(f"{workload.name}, {workload.describe(variant, amount)}; medians over the runs "
          f"(p99 range in brackets; * = ranges apart and >= 5 % apart, 2+ runs each)")
    head = (f"{'bg':>3} {'arm':<16} {workload.rate_unit:>9} {'p50 ms':>7} {'p99 ms (range)':>22} "
            f"{'r/st':>6} {'p99/st':>6} {'r/hand':>6} {'p99/hd':>6} {'cwait%':>6} {'cdly%':>6} {'swait%':>6} "
            f"{'runs':>4} {'noisy':>5} {'idle%':>5} {'bg ops/s':>9} {'bg/hd':>5} "
            + (f"{'nb ops/s':>9} {'nb/hd':>5} " if neighbour else "")
            + f"{'steal%':>6} {'frgn%':>5} {'IPI/s':>6}  client ran on (allowed); server ran on; spinners ran on"
            + ("; neighbour ran on" if neighbour else ""))
    print(head)
    print("-" * len(head))
    for bg in ladder:
        step = step_name(variant, bg)
        for arm in arm_names:
            group = [r for r in groups.get((step, arm), []) if r.ok]
            if (step, arm) not in rate:
                for r in groups.get((step, arm), []):
                    print(f"{bg:>3} {arm:<16} error: {r.error}")
                continue
            ratios = []
            for base in (A.STOCK, A.BY_HAND):
                if (step, base) in rate:
                    ratios.append(mark(T.compare(rate[step, arm], rate[step, base], higher_is_better=True)))
                    ratios.append(mark(T.compare(p99[step, arm], p99[step, base], higher_is_better=False)))
                else:
                    ratios += ["    -", "    -"]
            q = p99[step, arm]
            last = group[-1].notes
            print(f"{bg:>3} {arm:<16} {rate[step, arm].median:9.0f} {p50[step, arm].median:7.3f} "
                  f"{q.median:7.3f} ({q.low:6.3f}-{q.high:6.3f}) {' '.join(f'{x:>6}' for x in ratios)} "
                  f"{wait_pct(group, 'client'):6.1f} {wait_pct(group, 'client', 'delay_pct'):6.1f} "
                  f"{wait_pct(group, 'server'):6.1f} {len(group):>4} {sum(r.noisy for r in group):>5} "
                  f"{window_median(group, 'idle_pct'):5.1f} {bg_ops[step, arm].median:9.0f} "
                  f"{by_hand_ratio(bg_ops, step, arm):>5} "
                  + (f"{_median_of(neighbour, step, arm):9.0f} {by_hand_ratio(neighbour, step, arm):>5} " if neighbour else "")
                  + f"{window_median(group, 'steal_pct'):6.1f} "
                  f"{window_median(group, 'foreign_core_pct'):5.1f} {window_median(group, 'resched_per_s'):6.0f}  "
                  f"{last.get('client_cpus', '-')} ({last.get('client_allowed', '-')}); {last.get('server_cpus', '-')}; "
                  f"{last.get('spinner_cpus', '-')}" + (f"; {last.get('neighbour_cpus', '-')}" if neighbour else ""))


def markdown_table(workload_name: str, rate_unit: str, variant: str, ladder: Sequence[int],
                   arm_names: Sequence[str], runs: Sequence[T.Run]) -> str:
    """The table docs/benchmarks.md shows: medians, p99 range, ratios to stock and by-hand (a * marks
    a difference that stands out of the runs' spread), runqueue waits and the host's noise."""
    groups = groups_of(runs)
    rate, p50, p99, bg_ops = (T.summarise(runs, m) for m in ("rate", "p50_ms", "p99_ms", "bg_ops_s"))
    neighbour = _measured(runs, "neighbour_ops_s")
    lines = [f"| bg | arm | {rate_unit} | p50 ms | p99 ms (range) | {rate_unit} ÷ stock | p99 ÷ stock | "
             f"{rate_unit} ÷ by-hand | p99 ÷ by-hand | client wait % | server wait % | runs (noisy) | "
             "idle % | background bogo-ops/s | background ÷ by-hand | "
             + ("neighbour bogo-ops/s | neighbour ÷ by-hand | " if neighbour else "")
             + "steal % | foreign % of a core | resched IPIs/s |",
             "|" + "---|" * (20 if neighbour else 18)]
    for bg in ladder:
        step = step_name(variant, bg)
        for arm in arm_names:
            if (step, arm) not in rate:
                continue
            group = [r for r in groups[step, arm] if r.ok]
            ratios = []
            for base in (A.STOCK, A.BY_HAND):
                if (step, base) in rate:
                    ratios.append(mark(T.compare(rate[step, arm], rate[step, base], True)).strip())
                    ratios.append(mark(T.compare(p99[step, arm], p99[step, base], False)).strip())
                else:
                    ratios += ["-", "-"]
            q = p99[step, arm]
            lines.append(f"| {bg} | {arm} | {rate[step, arm].median:,.0f} | {p50[step, arm].median:.3f} | "
                         f"{q.median:.3f} ({q.low:.3f}–{q.high:.3f}) | {' | '.join(ratios)} | "
                         f"{wait_pct(group, 'client'):.1f} | {wait_pct(group, 'server'):.1f} | "
                         f"{len(group)} ({sum(r.noisy for r in group)}) | {window_median(group, 'idle_pct'):.0f} | "
                         f"{bg_ops[step, arm].median:,.0f} | {by_hand_ratio(bg_ops, step, arm)} | "
                         + (f"{_median_of(neighbour, step, arm):,.0f} | {by_hand_ratio(neighbour, step, arm)} | "
                            if neighbour else "")
                         + f"{window_median(group, 'steal_pct'):.1f} | {window_median(group, 'foreign_core_pct'):.1f} | "
                         f"{_count(window_median(group, 'resched_per_s'))} |")
    return "\n".join(lines).replace(",", " ")


def _count(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"  # NaN: not counted


def _measured(runs: Sequence[T.Run], metric: str) -> Dict[Tuple[str, str], T.Spread]:
    """T.summarise of a metric only some benchmarks measure (--neighbour); empty where no run has it."""
    return T.summarise(runs, metric) if any(metric in r.metrics for r in runs) else {}


def _median_of(table: Dict[Tuple[str, str], T.Spread], step: str, arm: str) -> float:
    found = table.get((step, arm))
    return found.median if found is not None else float("nan")


def runs_from_json(path: str) -> Tuple[dict, List[T.Run]]:
    with open(path) as handle:
        data = json.load(handle)
    runs = []
    for raw in data["runs"]:
        window = T.HostWindow(**raw["window"]) if raw.get("window") else None
        waits = {k: T.RunqueueWait(v["wait_s"], v["run_s"], v["seconds"]) for k, v in raw.get("waits", {}).items()}
        runs.append(T.Run(raw["step"], raw["arm"], raw["rep"], raw["metrics"], window, waits, raw["notes"],
                          raw["noisy"], raw["retried"], raw["error"]))
    return data, runs


STRONG_AT_TOP = ("redis c=50", "memcached", "postgresql")  # p99 >= 3x better than stock at the top step


Goal = Tuple[str, Optional[bool], bool, str]  # text, met (None: not measurable), settled by the runs, numbers


def goals(variant: str, ladder: Sequence[int], runs: Sequence[T.Run], arm: str,
          workload_name: str = "", p99_resolution: float = 1.0) -> List[Goal]:
    """The goals for one temperd arm, each judged by T.bound: met or missed by the medians, and
    settled only where every ratio the runs' ranges allow (p99s within `p99_resolution`) is on the
    same side of the limit.
    - p99 <= 1.1x by-hand at every step, throughput >= 0.95x by-hand;
    - at 0 and 1 spinners: p99 <= 1.1x stock and throughput >= 0.95x stock;
    - at the top step: host idle <= 5 %, and (redis c=50, memcached, PostgreSQL) p99 at least 3x
      better than stock;
    - with an untagged neighbour (--neighbour): its work >= 0.9x what it does by hand, every step."""
    rate, p99 = (T.summarise(runs, m) for m in ("rate", "p99_ms"))
    neighbour = _measured(runs, "neighbour_ops_s")
    groups = groups_of(runs)
    out: List[Goal] = []
    have = [bg for bg in ladder if (step_name(variant, bg), arm) in p99]
    top = max(ladder)

    def at(table, bg, who=arm):
        return table.get((step_name(variant, bg), who))

    def p99_within(bg, base, limit):
        return T.bound(at(p99, bg), at(p99, bg, base), limit, resolution=p99_resolution)

    def judged(text, bounds, numbers):
        met, firm = T.settled(bounds)
        out.append((text, met, firm, numbers))

    hand = [bg for bg in have if at(p99, bg, A.BY_HAND)]
    if hand:
        pairs = [(bg, p99_within(bg, A.BY_HAND, 1.1), T.bound(at(rate, bg), at(rate, bg, A.BY_HAND), 0.95, True))
                 for bg in hand]
        judged("p99 <= 1.1x by-hand and throughput >= 0.95x by-hand at every step",
               [b for _, q, r in pairs for b in (q, r)],
               ", ".join(f"bg={bg} p99 {q.ratio:.2f}x, thr {r.ratio:.2f}x" for bg, q, r in pairs))
    beside = [bg for bg in have if at(neighbour, bg) and at(neighbour, bg, A.BY_HAND)]
    if beside:
        shares = [(bg, T.bound(at(neighbour, bg), at(neighbour, bg, A.BY_HAND), 0.9, True)) for bg in beside]
        judged("the untagged neighbour's work >= 0.9x by-hand's at every step", [b for _, b in shares],
               ", ".join(f"bg={bg} {b.ratio:.2f}x" for bg, b in shares))
    for bg in (0, 1):
        if bg in have and at(p99, bg, A.STOCK):
            q, r = p99_within(bg, A.STOCK, 1.1), T.bound(at(rate, bg), at(rate, bg, A.STOCK), 0.95, True)
            judged(f"bg={bg}: p99 <= 1.1x stock and throughput >= 0.95x stock", [q, r],
                   f"p99 {q.ratio:.2f}x, throughput {r.ratio:.3f}x")
    if top in have and top > 0:
        mine = [r for r in groups.get((step_name(variant, top), arm), []) if r.ok]
        idle = window_median(mine, "idle_pct")
        out.append((f"bg={top}: host idle <= 5 %", idle <= 5.0, True, f"{idle:.1f} %"))
        if at(p99, top, A.STOCK) and (workload_name in STRONG_AT_TOP or f"{workload_name} {variant}" in STRONG_AT_TOP):
            third = p99_within(top, A.STOCK, 1 / 3)
            judged(f"bg={top}: p99 at least 3x better than stock", [third],
                   f"stock {at(p99, top, A.STOCK).median:.3f} ms / {at(p99, top).median:.3f} ms = {1 / third.ratio:.2f}x")
    return out


def print_goals(workload: W.Workload, variant: str, ladder: Sequence[int], arm_names: Sequence[str],
                runs: Sequence[T.Run]) -> None:
    for arm in arm_names:
        if arm in (A.STOCK, A.BY_HAND):
            continue
        print(f"\nGoals, {workload.name} {variant}, arm {arm}:")
        for text, met, firm, numbers in goals(variant, ladder, runs, arm, workload.name, workload.p99_resolution):
            print(f"  {verdict(met, firm):<20}  {text}: {numbers}")


def verdict(met: Optional[bool], firm: bool) -> str:
    """PASS or MISS; "within noise" where the runs' ranges (or the histogram's buckets) leave the limit open."""
    if met is None:
        return "n/a"
    return ("PASS" if met else "MISS") + ("" if firm else " (within noise)")


def print_scx(runs: Sequence[T.Run]) -> None:
    """What scx_layered reported about each layer over the scx arms' runs (medians)."""
    groups: Dict[Tuple[str, str], List[T.Run]] = {}
    for run in runs:
        if run.notes.get("scx"):
            groups.setdefault((run.step, run.arm), []).append(run)
    if not groups:
        return
    print("\nWhat scx_layered reported over each run (its stats socket: deltas over the run), medians; "
          "util: % of one CPU; prot: share of util on the layer's protected CPUs:")
    print(f"{'step':<14} {'arm':<7} {'layer':<44} {'tasks':>5} {'cpus':>4} {'util%':>6} {'prot':>5} {'affn_viol':>9}  cpu mask")
    for (step, arm), group in sorted(groups.items()):
        stats = [r.notes["scx"] for r in group]
        system = [s.get("", {}) for s in stats]
        print(f"{step:<14} {arm:<7} {'(system: busy % of all CPUs / util)':<44} {'':>5} {'':>4} "
              f"{_med(system, 'util'):6.0f} {'':>5} {_med(system, 'affn_viol'):9.0f}  busy {_med(system, 'busy'):.0f} %, "
              f"low fallback {_med(system, 'lo_fb_util'):.0f} % of a CPU")
        for name in sorted({n for s in stats for n in s if n}):
            rows = [s[name] for s in stats if name in s]
            print(f"{'':<14} {'':<7} {name[:44]:<44} {_med(rows, 'tasks'):5.0f} {_med(rows, 'cur_nr_cpus'):4.0f} "
                  f"{_med(rows, 'util'):6.1f} {_med(rows, 'util_protected_frac'):5.2f} {_med(rows, 'affn_viol'):9.0f}  "
                  f"{rows[-1].get('cpus', '-')}")


def _med(rows: Sequence[dict], key: str) -> float:
    return T.median(float(r[key]) for r in rows if isinstance(r.get(key), (int, float)))


def run_json(run: T.Run) -> dict:
    out = asdict(run)
    for label, wait in run.waits.items():
        out["waits"][label].update(wait_pct=wait.wait_pct, delay_pct=wait.delay_pct)
    return out
