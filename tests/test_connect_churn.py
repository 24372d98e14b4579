"""bench/connect_churn.py's pure parts: pgbench -C's report read back (a recorded one), what counts as
a treated backend and which backends the 100 ms goal applies to, and the table and verdicts."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import connect_churn as CC  # noqa: E402


def recorded(name: str) -> str:
    with open(os.path.join(HERE, "fixtures", "loadgen", name)) as handle:
        return handle.read()


def test_pgbench_dash_c_report_gives_transactions_tps_and_connection_time():
    """pgbench 15, -C -S -c 2 -j 2 -T 2 over the Unix socket."""
    got = CC.parse_pgbench_report(recorded("pgbench-C-select-only.txt"))
    assert got == {"transactions": 768.0, "failed": 0.0, "latency_avg_ms": 5.215, "connection_avg_ms": 3.898,
                   "tps": 383.512364, "duration_s": 2.0}


def test_a_report_without_tps_is_an_error():
    with pytest.raises(ValueError, match="unexpected pgbench output"):
        CC.parse_pgbench_report("connection to server failed\n")


def test_treated_is_the_groups_policy_and_nice_whatever_the_cpus():
    plan = {"layers": [{"group": "postmaster", "policy": "other", "nice": -10, "cpus": []},
                       {"group": "backends", "policy": "other", "nice": 0, "cpus": [1]}]}
    expected = CC.treatment_from_plan(plan)
    assert expected == CC.Treatment(os.SCHED_OTHER, 0)
    assert expected.holds(os.SCHED_OTHER, 0, frozenset({0, 1})) and expected.holds(os.SCHED_OTHER, 0, frozenset({1}))
    assert not expected.holds(os.SCHED_OTHER, -10, frozenset({1}))  # inherited from the postmaster
    assert CC.treatment_from_plan({"layers": [{"group": "wal", "policy": "batch", "nice": 5}]}) is None
    assert CC.treatment_from_plan({"layers": [{"group": "backends", "policy": "batch", "nice": None}]}) == \
        CC.Treatment(os.SCHED_BATCH, None)


def backend(title_at=None, treated_at=None, ended_at=None, slow=True, pid=1):
    return CC.Backend(pid, 0.0, title_at=title_at, slow=slow, treated_at=treated_at, ended_at=ended_at)


def test_the_goal_applies_to_backends_treated_or_living_past_it():
    assert CC.judged(backend(1.0, treated_at=1.02))
    assert CC.judged(backend(1.0, ended_at=1.15))  # lived 150 ms untreated: a miss
    assert not CC.judged(backend(1.0, ended_at=1.004))  # ended 4 ms after its title, untreated
    assert not CC.judged(backend(None, ended_at=2.0))  # its title never seen
    assert CC.judged(backend(1.0))  # still there at the window's end, untreated


def test_summary_counts_slow_and_fast_backends_apart():
    seen = [backend(1.0, 1.010, 1.2, pid=1), backend(2.0, 2.150, 2.2, pid=2), backend(3.0, None, 3.21, pid=3),
            backend(4.0, None, 4.003, slow=False, pid=4), backend(5.0, 5.002, 5.004, slow=False, pid=5),
            backend(None, None, 6.0, slow=False, pid=6)]
    got = CC.summarize_backends(seen)
    assert (got["children_seen"], got["slow_titled"], got["slow_judged"], got["slow_treated"], got["slow_within"]) == \
        (6, 3, 3, 2, 1)
    assert (got["fast_titled"], got["fast_judged"], got["fast_treated"], got["fast_within"]) == (2, 1, 1, 1)
    assert (round(got["slow_p50_ms"]), round(got["slow_p99_ms"]), round(got["slow_max_ms"])) == (10, 150, 150)


def run(round_no, arm, tps, cpu=None, within=40, judged=40):
    return {"round": round_no, "arm": arm, "wall_s": 20.0, "tps": tps, "connections_per_s": tps + 5,
            "daemon_cpu_pct_of_core": cpu, "daemon_cpu_us_per_backend": None if cpu is None else 150.0,
            "replans": None if cpu is None else 300, "slow_within": within, "slow_judged": judged,
            "slow_p50_ms": 40.0, "slow_p99_ms": 90.0, "slow_max_ms": 95.0, "fast_treated": 3, "fast_titled": 900,
            "fast_within": 3, "fast_judged": 3, "distinguishable": None if cpu is None else True,
            "host_idle_pct": 2.0, "host_steal_pct": 0.3, "foreign_cpu_pct_of_core": 1.0}


def test_table_has_a_row_per_run_and_stock_has_no_daemon_columns():
    text = CC.table([run(1, "stock", 400.0), run(1, "temperd", 390.0, cpu=6.5)])
    rows = text.splitlines()
    assert len(rows) == 4 and rows[0].count("|") == rows[1].count("|") == rows[2].count("|")
    assert rows[2].startswith("| 1 | stock | 400 | 405 | - | - | - | - | 40 / 90 / 95 | - |")
    assert "| 6.5 | 150 µs | 15.0 | 40 of 40 | 40 / 90 / 95 | 3 of 900; 3 of 3 | 2 / 0.3 / 1 % |" in rows[3]


def test_verdicts_judge_the_median_ratio_the_worst_cpu_and_every_backend():
    runs = [run(1, "stock", 400.0), run(1, "temperd", 390.0, cpu=6.5),
            run(2, "temperd", 360.0, cpu=11.0, within=39), run(2, "stock", 400.0)]
    got = CC.verdicts(runs)
    assert got[0].startswith("tps with temperd >= 0.95x stock's: MISS (median 0.938x; rounds 0.975, 0.900)")
    assert got[1].startswith("temperd <= 10 % of a core: MISS (median 8.8 %, max 11.0 %)")
    assert got[2].endswith("MISS (85 of 86)")
    runs[2].update(tps=380.0, daemon_cpu_pct_of_core=7.0, slow_within=40)
    assert [line.split(": ", 1)[1][:4] for line in CC.verdicts(runs)] == ["PASS", "PASS", "PASS"]
