"""bench/openloop.py and bench/openloop_report.py: the open-loop generators' output read back (from
recorded output: memtier_benchmark's JSON, pgbench -R's report and per-transaction log, sysbench
--rate's report), a run that did not carry its offered rate, and the goals at equal offered load."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import arms as A  # noqa: E402
import isolation as I  # noqa: E402
import openloop as O  # noqa: E402
import openloop_report as R  # noqa: E402
import workloads as W  # noqa: E402

from temperd.training import harness as T  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures", "loadgen")


def recorded(name: str) -> str:
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


# ---- memtier_benchmark ----------------------------------------------------------------------------------


def test_memtier_json_gives_the_totals_rate_and_hdr_percentiles():
    """4 connections at --rate-limiting=500: 2 000/s offered, 4 056 requests in 2.021 s (memtier's
    own Ops/sec: 2 007.10)."""
    offered = O.memtier_rate(2000, 4)[1]
    got = O.parse_memtier_json(recorded("memtier-redis-sustained.json"), offered)
    assert offered == 2000.0
    assert (round(got.achieved, 2), got.p50_ms, got.p99_ms) == (round(4056 / 2.021, 2), 0.111, 1.159)
    assert got.sustained and got.metrics()["p99_ms"] == 1.159


def test_memtier_short_of_its_rate_has_no_p99():
    """200 000/s per connection asked of 4 connections: 209 428/s done, a quarter of it."""
    got = O.parse_memtier_json(recorded("memtier-redis-short.json"), O.memtier_rate(800000, 4)[1])
    assert got.achieved == 418916 / 2.0 and not got.sustained
    metrics = got.metrics()
    assert metrics["sustained"] == 0.0 and abs(metrics["achieved_ratio"] - 209458 / 800000) < 1e-9
    assert "p99_ms" not in metrics and "p50_ms" not in metrics


def test_memtier_json_of_memcached_reads_the_same_way():
    got = O.parse_memtier_json(recorded("memtier-memcached.json"), 2000.0)
    assert got.p50_ms > 0 and got.p99_ms >= got.p50_ms and got.achieved > 0


def test_memtier_rate_counts_over_the_whole_test_time_not_a_late_start():
    """A run whose measured duration began late (a connection's first request on a busy host) is
    counted over its --test-time: 4 056 requests in a 2 s test read 2 028/s, not 4 056/s."""
    text = recorded("memtier-redis-sustained.json").replace('"Total duration": 2021', '"Total duration": 1000')
    assert O.parse_memtier_json(text, 2000.0).achieved == 4056 / 2.0


def test_a_memtier_json_without_totals_is_an_error():
    with pytest.raises(ValueError, match="unexpected memtier_benchmark JSON"):
        O.parse_memtier_json('{"ALL STATS": {}}', 100.0)


def test_the_offered_rate_is_what_memtiers_interval_arithmetic_sends():
    """ceil(rate / 50) requests per interval of 1e6 // (rate // that) us: 801/s asked of one
    connection is 17 per 21 276 us, 799.0/s; 40 000/s over 50 connections is exact."""
    per_conn, offered = O.memtier_rate(801, 1)
    assert per_conn == 801 and abs(offered - 17 * 1e6 / 21276) < 1e-6 and offered < 800
    assert O.memtier_rate(40000, 50) == (800, 40000.0)


def test_open_loop_memtier_keeps_four_intervals_in_flight_and_closed_loop_none():
    opened = O.memtier_argv("mt", 6379, "redis", 50, 5, "0:1", 100000, "/x.json", per_conn_rate=800)
    assert "--rate-limiting=800" in opened and "--pipeline=64" in opened  # 16 a 20 ms interval, x4
    closed = O.memtier_argv("mt", 6379, "redis", 50, 5, "0:1", 100000, "/x.json")
    assert not any(a.startswith(("--rate-limiting", "--pipeline")) for a in closed)


def test_memtier_that_cannot_be_found_or_built_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(O, "MEMTIER_SRC", str(tmp_path / "nowhere"))
    monkeypatch.delenv("TEMPERD_MEMTIER", raising=False)
    with pytest.raises(O.GeneratorUnavailable) as found:
        O.memtier_binary()
    assert "\n" not in str(found.value) and "TEMPERD_MEMTIER" in str(found.value)
    with pytest.raises(O.GeneratorUnavailable, match="not an executable"):
        O.memtier_binary(str(tmp_path / "missing"))


# ---- pgbench -R and sysbench --rate ------------------------------------------------------------------


def test_pgbench_rate_reads_tps_and_the_logs_latency():
    got = O.parse_pgbench(recorded("pgbench-R-sustained.txt"), 200.0)
    assert got.achieved == 203.352849 and got.sustained
    assert 0.5 < got.p50_ms < got.p99_ms < 10  # a TPC-B transaction in ms, fsync off


def test_pgbench_rates_latency_includes_the_schedule_lag():
    """3 000/s asked of 2 clients: 2 057/s done, each transaction ~0.5 ms but, in these first 400 log lines, already tens of ms late. The
    log's latency (3rd field) counts from the scheduled start: at least the lag (7th)."""
    text = recorded("pgbench-R-short.txt")
    rows = [line.split() for line in text.splitlines() if line.startswith("tx ")]
    assert all(int(row[3]) >= int(row[7]) for row in rows)
    got = O.parse_pgbench(text, 3000.0)
    assert not got.sustained and got.p50_ms > 10 and "p99_ms" not in got.metrics()


def test_sysbench_rate_reads_tps_p99_and_the_histograms_middle():
    got = O.parse_sysbench(recorded("sysbench-rate-sustained.txt"), 50.0)
    assert (got.achieved, got.p99_ms) == (48.85, 5.77) and got.sustained
    assert 1.5 < got.p50_ms < 5.77


def test_sysbench_behind_its_rate_counts_the_queue_and_is_not_sustained():
    got = O.parse_sysbench(recorded("sysbench-rate-short.txt"), 2000.0)
    assert got.achieved == 346.02 and not got.sustained
    assert got.p99_ms > 1000  # 1 244 ms on average: the time in the queue is in the latency


def test_sysbench_whose_queue_overflowed_is_not_sustained():
    got = O.parse_sysbench(recorded("sysbench-rate-queue-full.txt"), 100000.0)
    assert got.achieved == 0.0 and not got.sustained and "p99_ms" not in got.metrics()


def bench_for(workload: W.Workload, rate: float) -> "I.Bench":
    bench = I.Bench.__new__(I.Bench)
    bench.workload, bench.open_seconds, bench.amounts = workload, 3, {"load=0.5": rate}
    return bench


def test_a_run_that_did_not_carry_its_rate_is_reported_so_not_as_an_error_or_a_p99(tmp_path):
    """sysbench exits 1 when its queue overflows: a run that was not sustained, not a failure."""
    run = T.Run("load=0.5 bg=4", A.STOCK, 0)
    bench_for(W.MariaDB(), 100000.0)._result(run, "load=0.5", 1, recorded("sysbench-rate-queue-full.txt"), str(tmp_path))
    assert run.ok and run.metrics["sustained"] == 0.0 and "p99_ms" not in run.metrics
    failed = T.Run("load=0.5 bg=4", A.STOCK, 0)
    bench_for(W.MariaDB(), 50.0)._result(failed, "load=0.5", 1, "FATAL: connection refused", str(tmp_path))
    assert not failed.ok and "exited with 1" in failed.error
    kept = T.Run("load=0.5 bg=0", A.STOCK, 0)
    bench_for(W.MariaDB(), 50.0)._result(kept, "load=0.5", 0, recorded("sysbench-rate-sustained.txt"), str(tmp_path))
    assert kept.metrics["p99_ms"] == 5.77 and kept.metrics["offered"] == 50.0


def test_a_memtier_run_reads_its_json_from_the_runs_directory(tmp_path):
    (tmp_path / "memtier.json").write_text(recorded("memtier-redis-short.json"))
    run = T.Run("load=0.5 bg=4", A.TEMPERD_BG, 0)
    bench_for(W.Redis(), 800000.0)._result(run, "load=0.5", 0, "", str(tmp_path))
    assert run.ok and run.metrics["sustained"] == 0.0 and run.metrics["rate"] == 209458.0


# ---- goals at equal offered load -------------------------------------------------------------------------


def run(bg: int, arm: str, p99: float, ratio: float = 1.0, idle: float = 2.0, rep: int = 0) -> T.Run:
    found = O.OpenMeasurement(1000.0, 1000.0 * ratio, p99 / 2, p99)
    window = T.HostWindow(seconds=5.0, idle_pct=idle, steal_pct=0.0, foreign_core_pct=0.0, foreign_top="")
    return T.Run(f"load=0.5 bg={bg}", arm, rep, found.metrics(), window)


def ladder_runs(stock_top_ratio: float = 1.0, mine_top_ratio: float = 1.0, mine_top: float = 1.0):
    out = []
    for rep, wobble in enumerate((0.98, 1.0, 1.02)):
        out += [run(0, A.STOCK, 1.0 * wobble, rep=rep), run(0, A.BY_HAND, 1.0 * wobble, rep=rep),
                run(0, A.TEMPERD_BG, 1.02 * wobble, rep=rep),
                run(4, A.STOCK, 9.0 * wobble, stock_top_ratio, rep=rep), run(4, A.BY_HAND, 1.0 * wobble, rep=rep),
                run(4, A.TEMPERD_BG, mine_top * wobble, mine_top_ratio, rep=rep)]
    return out


def verdicts(runs) -> dict:
    return {text: (met, firm) for text, met, firm, _ in R.open_goals("load=0.5", [0, 4], runs, A.TEMPERD_BG)}


def test_every_goal_settles_where_temperd_holds_its_tail_at_equal_load():
    found = verdicts(ladder_runs())
    assert set(found) == {"p99 <= 1.1x by-hand's at every spinner step", "bg=0: p99 <= 1.1x stock's",
                          "bg=4: p99 at least 3x better than stock's where stock sustains the rate (else temperd+bg sustains it)",
                          "bg=4: host idle <= 5 %", "flat: p99 at bg=4 <= 1.1x its own at bg=0"}
    assert all(found.values()), found  # met, and settled by the runs' ranges


def test_where_stock_cannot_carry_the_rate_temperd_carrying_it_meets_the_3x_goal():
    found = verdicts(ladder_runs(stock_top_ratio=0.6))
    assert found["bg=4: p99 at least 3x better than stock's where stock sustains the rate (else temperd+bg sustains it)"] == (True, True)


def test_temperd_short_of_the_rate_misses_firmly_and_its_p99_is_not_shown():
    runs = ladder_runs(stock_top_ratio=0.6, mine_top_ratio=0.7)
    found = verdicts(runs)
    assert found["bg=4: p99 at least 3x better than stock's where stock sustains the rate (else temperd+bg sustains it)"] == (False, True)
    assert found["flat: p99 at bg=4 <= 1.1x its own at bg=0"] == (False, True)
    table = R.markdown_open_table("load=0.5", [0, 4], [A.STOCK, A.BY_HAND, A.TEMPERD_BG], runs)
    mine = [line for line in table.splitlines() if line.startswith("| 4 | temperd+bg |")][0]
    assert "not sustained (0.70× offered)" in mine and "| 3 (3) |" in mine


def test_a_tail_that_grows_under_spinners_misses_the_flat_goal_and_one_inside_the_noise_is_open():
    assert verdicts(ladder_runs(mine_top=2.0))["flat: p99 at bg=4 <= 1.1x its own at bg=0"] == (False, True)
    assert verdicts(ladder_runs(mine_top=1.1))["flat: p99 at bg=4 <= 1.1x its own at bg=0"][1] is False


def test_loads_are_fractions_of_stocks_rate():
    assert O.parse_loads("0.5,0.8") == [0.5, 0.8]
    for bad in ("", "0", "1.5,-1", "3"):
        with pytest.raises(ValueError):
            O.parse_loads(bad)


def test_a_step_whose_runs_all_failed_is_named_not_measured_not_passed():
    runs = [r for r in ladder_runs() if not (r.arm == A.TEMPERD_BG and r.step.endswith("bg=4"))]
    runs.append(T.Run("load=0.5 bg=4", A.TEMPERD_BG, 0, error="spinners did not get idle within 5 s"))
    found = R.open_goals("load=0.5", [0, 4], runs, A.TEMPERD_BG)
    assert ("bg=4: not measured", None, False, "every run failed: spinners did not get idle within 5 s") in found
    assert not any(text.startswith("flat") for text, *_ in found)
    table = R.markdown_open_table("load=0.5", [0, 4], [A.STOCK, A.BY_HAND, A.TEMPERD_BG], runs)
    assert "| 4 | temperd+bg | every run failed: spinners did not get idle within 5 s |" in table
    data = {"workload": "redis", "capacity": 2000.0}
    row = R.summary_rows(data, runs)[0]
    assert "→ error" in row and "1 step(s) not measured" in row and "0.5 × 2 000 = 1 000/s" in row


def test_the_headline_reproduces_several_servers_with_one_loop_and_no_note():
    def made(server, note):
        return ({"workload": server, "command": f"bench/isolation.py --server {server} --load 0.5 --note '{note}' "
                                                f"--json bench/results/isolation-{server}-open.json"}, [])
    line = R.reproduce([made("redis", "quiet host"), made("memcached", "other work paused")])
    assert ("`for s in redis memcached; do sudo .venv/bin/python bench/isolation.py --server $s --load 0.5 "
            "--json bench/results/isolation-$s-open.json; done`") in line
    assert "--note" not in line
    other = made("postgresql", "x")
    other[0]["command"] = other[0]["command"].replace("--load 0.5", "--load 0.8")
    listed = R.reproduce([made("redis", "quiet host"), other])
    assert "for s in" not in listed and "--server postgresql --load 0.8" in listed and "--server redis" in listed


def test_the_headline_caption_keeps_each_servers_date_and_host_state_before_its_runs():
    data = {"workload": "redis", "date": "2026-11-28 09:25:25 UTC", "repetitions": 3, "seconds": 5,
            "host": "vm: Linux 6.18, VM, CPUs 0-1",
            "host_state": "quiet host; load average 0.59 at the start; before the first run: idle 99 %, steal 0.5 %"}
    caption = R.summary_caption([(data, [])])
    assert caption == ("Host: Linux 6.18, VM, CPUs 0-1. redis 2026-11-28 09:25:25 UTC (3 repetitions of 5 s runs; "
                       "before them idle 99 %, steal 0.5 %).")
