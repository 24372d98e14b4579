"""What the matcher is told changed between two inventory snapshots (sources/change_log.py):
the union of what each snapshot in between made again, or None where the log cannot say."""

from temperd.sources.change_log import CHANGE_LOG, ChangeLog


def test_the_pids_made_again_since_a_generation_add_up_along_the_chain():
    log = ChangeLog()
    log.add(1, 3, [10, 11])
    log.add(3, 4, [12])
    log.add(4, 7, [10, 13])
    assert log.since(7, 7) == frozenset()
    assert log.since(4, 7) == {10, 13}
    assert log.since(1, 7) == {10, 11, 12, 13}


def test_a_generation_the_log_does_not_reach_or_a_broken_chain_says_none():
    log = ChangeLog()
    log.add(1, 3, [10])
    log.add(5, 6, [11])  # a snapshot in between not logged: nothing is known before 5
    assert log.since(5, 6) == {11}
    assert log.since(1, 6) is None and log.since(3, 6) is None
    assert log.since(None, 6) is None
    log.clear()
    assert log.since(5, 6) is None


def test_only_the_last_snapshots_are_kept():
    log = ChangeLog()
    for generation in range(CHANGE_LOG + 5):
        log.add(generation, generation + 1, [generation])
    latest = CHANGE_LOG + 5
    assert log.since(latest - CHANGE_LOG, latest) == set(range(latest - CHANGE_LOG, latest))
    assert log.since(0, latest) is None
