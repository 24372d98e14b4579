"""The native backend's picture of the host's threads: the ids a batch ended are found through
its index, a reused id's new thread stays."""

from types import SimpleNamespace

from temperd.backends.native.universe import Universe


def _t(tid, start, pid=None):
    return SimpleNamespace(tid=tid, pid=pid or tid, start_time=start)


def test_the_threads_an_id_named_are_found_by_id_and_a_reused_id_keeps_its_new_thread():
    universe = Universe([_t(10, 1), _t(11, 2), _t(12, 3)])
    reborn = _t(11, 9)
    universe.put(reborn)  # 11 ended and its id was taken again before the exit was handled
    assert sorted(universe.ended([11, 12, 99], {11: reborn})) == [(11, 2), (12, 3)]
    for key in universe.ended([11, 12], {11: reborn}):
        universe.drop(key)
    assert sorted(universe) == [(10, 1), (11, 9)]
    assert universe.ended([11], {}) == [(11, 9)]  # gone too now: nothing alive under the id
    assert universe.ended([10], {10: _t(10, 1)}) == []  # alive: not ended


def test_a_cleared_universe_finds_nothing():
    universe = Universe([_t(5, 1)])
    universe.clear()
    assert universe.ended([5], {}) == [] and not universe
