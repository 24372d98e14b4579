"""bench/build_churn.py's pure parts: the deb-src list made from a host's deb lines, the speed ratio
per round, the table and the verdicts."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import build_churn as BC  # noqa: E402


def test_deb_lines_and_deb822_stanzas_become_their_source_counterparts():
    one_line = "deb http://deb.example.org/debian bookworm main\n# deb-src kept as a comment\n"
    assert BC.deb_src_sources(one_line) == "deb-src http://deb.example.org/debian bookworm main\n# deb-src kept as a comment\n"
    stanza = "Types: deb\nURIs: http://deb.example.org/debian\nSuites: bookworm\nComponents: main\n"
    assert BC.deb_src_sources(stanza).splitlines()[0] == "Types: deb-src"
    assert BC.deb_src_sources(stanza).splitlines()[1:] == stanza.splitlines()[1:]
    assert BC.deb_src_sources("Types: deb-src\n") == "Types: deb-src\n"


def run(round_no, arm, wall, cpu=None):
    return {"round": round_no, "arm": arm, "wall_s": wall, "build_cpu_s": 110.0, "daemon_cpu_s": cpu,
            "daemon_share_of_build_pct": None if cpu is None else 100.0 * cpu / 110.0,
            "daemon_cpu_pct_of_core": None if cpu is None else 100.0 * cpu / wall,
            "events": None if cpu is None else 2144, "replans": None if cpu is None else 0,
            "host_idle_pct": 1.0, "host_steal_pct": 0.2, "foreign_cpu_pct_of_core": 1.0}


def test_speed_is_stocks_time_over_temperds_per_round():
    runs = [run(1, "stock", 55.0), run(1, "temperd", 50.0, 0.1), run(2, "temperd", 60.0, 0.2), run(2, "stock", 54.0),
            run(3, "stock", 50.0)]  # a round without its temperd run has no ratio
    assert [round(x, 3) for x in BC.speed_ratios(runs)] == [1.1, 0.9]


def test_table_and_verdicts():
    runs = [run(1, "stock", 55.0), run(1, "temperd", 55.5, 0.11), run(2, "temperd", 54.0, 0.22), run(2, "stock", 56.0)]
    rows = BC.table(runs).splitlines()
    assert len(rows) == 6 and all(row.count("|") == rows[0].count("|") for row in rows)
    assert rows[2] == "| 1 | stock | 55.00 | 110.0 | - | - | - | - | - | 1 / 0.2 / 1 % |"
    assert rows[3] == "| 1 | temperd | 55.50 | 110.0 | 0.11 | 0.10 % | 0.2 | 2144 | 0 | 1 / 0.2 / 1 % |"
    got = BC.verdicts(runs)
    assert got[0] == "build speed with temperd >= 0.98x stock's: PASS (median 1.014x; rounds 0.991, 1.037)"
    assert got[1] == "temperd's CPU: median 0.17 s, 0.15 % of the build's CPU (runs 0.10, 0.20 %)"
    runs[3]["wall_s"] = 50.0
    assert BC.verdicts(runs)[0] == "build speed with temperd >= 0.98x stock's: MISS (median 0.958x; rounds 0.991, 0.926)"
