"""Yield threads of mixed sessions in the idle cpu cgroup (cgroup v1), on real threads of this host.

Where the cpu controller is on a cgroup v2 hierarchy (the VM guest) the move cannot be made and
these tests skip; what such a host gets instead (the session's note) is checked everywhere.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from temperd.backends.native.autogroup import autogroup_enabled
from temperd.backends.native.backend import NativeBackend, scan_threads
from temperd.backends.native.cgroup_moves import DeferredMoves
from temperd.backends.native.cgroup_weight import CgroupWeights, WeightSupport
from temperd.backends.native.idle_cgroup import IDLE_CGROUP, IdleCgroup, cgroup_name, detect
from temperd.backends.native.pmqos import PmQos
from temperd.plan import OPEN, YIELD, Layer, LayerPlan, MemberSelector
from temperd.sources import procfs
from thread_children import needs_two_cpus, policy_of, ticks_used_until

MOUNT, WHY_NOT = detect()

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="moving other processes' threads needs root"),
    pytest.mark.skipif(not autogroup_enabled(), reason="kernel.sched_autogroup_enabled is 0: no sessions to escape"),
]
needs_v1_cpu = pytest.mark.skipif(MOUNT is None, reason=f"no idle cgroup here: {WHY_NOT}")

SHARED_CPU = 1


def yield_layer(tids, pids=()) -> Layer:
    return Layer(name="bg", kind=OPEN, treatment=YIELD, tier="background", workload="w", group="bg",
                 selector=MemberSelector(pids=tuple(pids), tids=tuple(tids)), policy="idle")


def plan_of(*layers) -> LayerPlan:
    return LayerPlan(layers=tuple(layers), reserve_cpus=(0,))


@pytest.fixture
def backends():
    made = []

    def make(state_dir, **kw):
        kw.setdefault("weights", CgroupWeights(WeightSupport(None, None, "off in this test")))
        kw.setdefault("pmqos", PmQos(str(state_dir) + "/no-sysfs"))
        backend = NativeBackend(str(state_dir), **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.stop()


def cpu_cgroup(pid, tid):
    return procfs.read_cgroup(pid, tid).cpu_v1


def idle_dir(state_dir) -> str:
    return os.path.join(MOUNT, cgroup_name(str(state_dir), "/nowhere"))


def test_cpu_v1_path_is_read_from_a_combined_or_single_hierarchy_line():
    both = procfs.parse_cgroup(b"12:pids:/\n4:cpu,cpuacct:/temperd-yield\n1:name=systemd:/init.scope\n0::/\n")
    assert (both.cpu_v1, both.systemd, both.unified) == ("/temperd-yield", "/init.scope", "/")
    alone = procfs.parse_cgroup(b"2:cpuacct:/a\n1:cpu:/b\n")
    assert alone.cpu_v1 == "/b"
    assert procfs.parse_cgroup(b"0::/system.slice/x.service\n").cpu_v1 is None


def test_state_directories_get_cgroups_of_their_own():
    assert cgroup_name("/run/temper", "/run/temper") == "temperd-yield"
    assert cgroup_name("/run/temper/", "/run/temper") == "temperd-yield"
    assert cgroup_name("/tmp/a", "/run/temper") != cgroup_name("/tmp/b", "/run/temper")


@needs_v1_cpu
def test_mixed_session_yield_thread_moves_to_the_idle_cgroup_and_back(tmp_path, children, backends):
    job = children.spawn(["bg-a", "bg-b"])  # all yield: its autogroup is reniced, it stays in the root
    mixed = children.spawn(["srv-a", "bg-c"])  # a yield thread beside an untreated one
    backend = backends(tmp_path)
    result = backend.apply(plan_of(yield_layer(job.tids() + [mixed.threads["bg-c"]])),
                           scan_threads([job.pid, mixed.pid]))
    assert not result.failed, result.errors
    where = "/" + os.path.basename(idle_dir(tmp_path))
    assert cpu_cgroup(mixed.pid, mixed.threads["bg-c"]) == where
    assert cpu_cgroup(mixed.pid, mixed.threads["srv-a"]) == "/"
    assert all(cpu_cgroup(job.pid, t) == "/" for t in job.tids())
    assert result.applied[IDLE_CGROUP] == 1
    with open(os.path.join(idle_dir(tmp_path), "cpu.idle")) as handle:
        assert handle.read().strip() == "1"
    assert not any("mixes yield threads" in n for n in result.notes)

    result = backend.stop()
    assert result.restored[IDLE_CGROUP] == 1
    assert cpu_cgroup(mixed.pid, mixed.threads["bg-c"]) == "/"
    assert not os.path.exists(idle_dir(tmp_path))


@needs_v1_cpu
def test_threads_a_moved_thread_creates_go_back_unless_they_yield(tmp_path, children, backends):
    """The child's main thread creates its threads: moved, it hands the idle cgroup to each new one."""
    mixed = children.spawn(["srv-a", "bg-c"])
    backend = backends(tmp_path)
    bg = yield_layer([mixed.pid, mixed.threads["bg-c"]])
    backend.apply(plan_of(bg), scan_threads([mixed.pid]))
    where = cpu_cgroup(mixed.pid, mixed.pid)
    assert where != "/"
    late = mixed.spawn("late")
    assert cpu_cgroup(mixed.pid, late) == where  # inherited from its creator
    backend.apply(plan_of(bg), scan_threads([mixed.pid]))  # late is no yield member: back to the root
    assert cpu_cgroup(mixed.pid, late) == "/"
    assert cpu_cgroup(mixed.pid, mixed.pid) == where

    unseen = mixed.spawn("unseen")  # created and never shown to the backend before it stops
    assert cpu_cgroup(mixed.pid, unseen) == where
    backend.stop()
    assert {cpu_cgroup(mixed.pid, t) for t in mixed.tids()} == {"/"}
    assert not os.path.exists(idle_dir(tmp_path))


@needs_v1_cpu
def test_a_killed_runs_idle_cgroup_is_emptied_at_the_next_start(tmp_path, children, backends):
    mixed = children.spawn(["srv-a", "bg-c"])
    crashed = NativeBackend(str(tmp_path), weights=CgroupWeights(WeightSupport(None, None, "off")),
                            pmqos=PmQos(str(tmp_path) + "/no-sysfs"))
    crashed.apply(plan_of(yield_layer([mixed.pid, mixed.threads["bg-c"]])), scan_threads([mixed.pid]))
    late = mixed.spawn("late")  # inherited, and in no state file
    assert cpu_cgroup(mixed.pid, late) != "/"
    # The moves are not written down (a fork storm makes hundreds a second): the start empties the cgroup.
    with open(tmp_path / "native-state.json") as handle:
        assert IDLE_CGROUP not in handle.read()
    (tmp_path / "native-state.json").unlink()  # even without the state file
    result = backends(tmp_path).recover()
    assert not result.failed, result.errors
    assert {cpu_cgroup(mixed.pid, t) for t in mixed.tids()} == {"/"}
    assert result.restored[IDLE_CGROUP] == 3
    assert not os.path.exists(idle_dir(tmp_path))


@needs_v1_cpu
def test_a_thread_someone_else_moved_is_theirs(tmp_path, children, backends):
    mixed = children.spawn(["srv-a", "bg-c"])
    tid = mixed.threads["bg-c"]
    backend = backends(tmp_path)
    bg = yield_layer([tid])
    backend.apply(plan_of(bg), scan_threads([mixed.pid]))
    theirs = os.path.join(MOUNT, f"theirs-{os.getpid()}")
    os.makedirs(theirs, exist_ok=True)
    try:
        with open(os.path.join(theirs, "tasks"), "w") as handle:
            handle.write(str(tid))
        result = backend.apply(plan_of(bg), scan_threads([mixed.pid]))
        assert result.drift[IDLE_CGROUP] == 1
        assert cpu_cgroup(mixed.pid, tid) == "/" + os.path.basename(theirs)
        backend.stop()
        assert cpu_cgroup(mixed.pid, tid) == "/" + os.path.basename(theirs)
    finally:
        with open(os.path.join(MOUNT, "tasks"), "w") as handle:
            handle.write(str(tid))
        os.rmdir(theirs)


def test_where_no_idle_cgroup_can_be_made_the_mixed_session_is_reported(tmp_path, children, backends):
    mixed = children.spawn(["srv-a", "bg-c"])
    why = "the cpu controller is not on a cgroup v1 hierarchy"
    backend = backends(tmp_path, idle_cgroup=IdleCgroup(mount=None, why_not=why))
    result = backend.apply(plan_of(yield_layer([mixed.threads["bg-c"]])), scan_threads([mixed.pid]))
    assert any("mixes yield threads with others" in n and why in n for n in result.notes), result.notes
    assert cpu_cgroup(mixed.pid, mixed.threads["bg-c"]) in ("/", None)


@needs_v1_cpu
@needs_two_cpus
def test_yield_spinner_beside_an_untreated_thread_yields_to_another_session(tmp_path, children, backends):
    """The mechanism, measured: SCHED_IDLE alone leaves two sessions at ~50/50 on one CPU even when
    one session's only runnable thread is the yield spinner; in the idle cgroup it gets a few percent."""
    spin_s = 6.0  # outlasts the window on a crowded host
    fg = children.spawn(["fg-spin"], spin_s=spin_s)
    bg = children.spawn(["bg-spin"], spin_s=spin_s)  # its main thread is untreated: a mixed session
    spinner = bg.threads["bg-spin"]
    for kid in (fg, bg):
        for tid in kid.tids():
            os.sched_setaffinity(tid, {SHARED_CPU})
    backend = backends(tmp_path)
    backend.apply(plan_of(yield_layer([spinner])), scan_threads([bg.pid]))
    assert policy_of(bg.pid, spinner) == os.SCHED_IDLE and cpu_cgroup(bg.pid, spinner) != "/"
    used = ticks_used_until([fg.pid, bg.pid], 100)  # 1 s of the CPU they share
    share = used[bg.pid] / max(1, used[fg.pid] + used[bg.pid])
    assert share < 0.15, used


@needs_v1_cpu
def test_an_ended_thread_leaves_the_hold_when_its_end_is_told(tmp_path, children, backends):
    """Between whole applies the event path tells the backend which threads ended: the idle
    cgroup forgets them then, rather than reading each one again at the next pass."""
    mixed = children.spawn(["srv-a", "bg-c"])
    backend = backends(tmp_path)
    tid = mixed.threads["bg-c"]
    backend.apply(plan_of(yield_layer([tid])), scan_threads([mixed.pid]))
    assert [key[0] for key in backend.idle_cgroup.written] == [tid]
    mixed.proc.kill()
    mixed.proc.wait(10)
    backend.forget_threads([mixed.pid, tid])
    assert backend.idle_cgroup.written == {} and backend.idle_cgroup.originals == {}


@needs_v1_cpu
def test_threads_read_in_this_pass_move_without_a_second_start_time_read_through_one_open_tasks_file(
        tmp_path, children, monkeypatch):
    """A fork storm's new yield threads cost one /proc read each (their cgroup): the inventory read
    their start time within the pass, and the moves share the cgroup's tasks file."""
    kid = children.spawn(["srv-a", "bg-1", "bg-2", "bg-3"])
    threads = [t for t in scan_threads([kid.pid]) if t.comm.startswith("bg-")]
    fresh = {(t.tid, t.start_time) for t in threads[:2]}
    idle = IdleCgroup(cgroup_name(str(tmp_path), "/nowhere"), MOUNT)
    stat_reads, opens = [], []
    real_stat, real_open = procfs.read_task_stat, os.open
    monkeypatch.setattr(procfs, "read_task_stat", lambda pid, tid: stat_reads.append(tid) or real_stat(pid, tid))
    monkeypatch.setattr(os, "open", lambda path, *a, **kw: opens.append(path) or real_open(path, *a, **kw))
    try:
        result = idle.apply(threads, fresh=fresh)
        assert result.applied == {IDLE_CGROUP: 3} and not result.errors, result
        assert sorted(stat_reads) == [threads[2].tid]  # the one not read in this pass
        assert [p for p in opens if p.endswith("/tasks")] == [os.path.join(idle_dir(tmp_path), "tasks")]
        assert {cpu_cgroup(kid.pid, t.tid) for t in threads} == {idle.path}
    finally:
        monkeypatch.undo()
        idle.restore_all()
    assert {cpu_cgroup(kid.pid, t.tid) for t in threads} == {"/"}


def _yield_thread_moved(children, backend):
    """A process of a mixed session whose yield thread bg-c a whole apply moved: (it, bg-c, the cgroup)."""
    mixed = children.spawn(["srv-a", "bg-c"])
    bg_c = mixed.threads["bg-c"]
    backend.apply(plan_of(yield_layer([bg_c])), scan_threads([mixed.pid]))
    where = cpu_cgroup(mixed.pid, bg_c)
    assert where != "/"
    return mixed, bg_c, where


def _threads_of(pid, *tids):
    by_tid = {t.tid: t for t in scan_threads([pid])}
    return [by_tid[tid] for tid in tids]


@needs_v1_cpu
def test_a_batch_that_leaves_every_sessions_mix_as_it_was_moves_only_its_own_threads(
        tmp_path, children, backends, monkeypatch):
    """Between whole applies, a new yield thread of a session that was mixed already goes into the
    idle cgroup, and a thread that no longer yields comes out, without the pass over every thread
    of the host (a fork storm's batches come ten a second); a favoured newcomer, which may change
    an autogroup's nice, still gets the whole pass."""
    backend = backends(tmp_path)
    mixed, bg_c, where = _yield_thread_moved(children, backend)
    whole_passes = []
    real = backend.autogroups.cache.sessions
    monkeypatch.setattr(backend.autogroups.cache, "sessions", lambda *a, **kw: whole_passes.append(1) or real(*a, **kw))

    bg_d = mixed.spawn("bg-d")
    result = backend.apply(plan_of(yield_layer([bg_c, bg_d])), scan_threads([mixed.pid]), _threads_of(mixed.pid, bg_d))
    assert not result.failed, result.errors
    settled = backend.idle_cgroup.settle()  # the move is made on the worker thread (cgroup_moves.py)
    assert settled.applied == {IDLE_CGROUP: 1} and not settled.failed, settled
    assert cpu_cgroup(mixed.pid, bg_d) == where and not whole_passes

    backend.apply(plan_of(yield_layer([bg_d])), scan_threads([mixed.pid]), [])  # bg-c moved out of the layer
    assert cpu_cgroup(mixed.pid, bg_c) == "/" and cpu_cgroup(mixed.pid, bg_d) == where and not whole_passes

    fav = mixed.spawn("fav-e")
    favoured = Layer(name="fav", kind=OPEN, treatment="latency", tier="critical", workload="w", group="fav",
                     selector=MemberSelector(tids=(fav,)), nice=-5)
    backend.apply(plan_of(yield_layer([bg_d]), favoured), scan_threads([mixed.pid]), _threads_of(mixed.pid, fav))
    assert whole_passes and cpu_cgroup(mixed.pid, fav) == "/" and cpu_cgroup(mixed.pid, bg_d) == where


@needs_v1_cpu
def test_a_thread_renamed_into_a_yield_group_moves_without_a_start_time_read(tmp_path, children, backends,
                                                                             monkeypatch):
    """Between whole applies, a thread the backend saw before under another name was named by a
    rename event (the inventory would have seen its exit and a reuse of its id first): its move
    into the idle cgroup reads its cgroup alone, not its start time again (a generator's renamed
    threads come tens a second)."""
    backend = backends(tmp_path)
    mixed, bg_c, where = _yield_thread_moved(children, backend)
    late = mixed.spawn("xx-d")
    backend.apply(plan_of(yield_layer([bg_c])), scan_threads([mixed.pid]), _threads_of(mixed.pid, late))
    backend.idle_cgroup.settle()
    assert cpu_cgroup(mixed.pid, late) == "/"  # seen, in no layer
    # As the inventory tells it after the thread's rename event (only the thread itself may rename it).
    threads = [dataclasses.replace(t, comm="bg-d") if t.tid == late else t for t in scan_threads([mixed.pid])]
    stat_reads = []
    real_stat = procfs.read_task_stat
    monkeypatch.setattr(procfs, "read_task_stat", lambda pid, tid: stat_reads.append(tid) or real_stat(pid, tid))
    result = backend.apply(plan_of(yield_layer([bg_c, late])), threads, [])
    backend.idle_cgroup.settle()
    assert not result.failed, result.errors
    assert cpu_cgroup(mixed.pid, late) == where and late not in stat_reads, stat_reads
    backend.stop()


@needs_v1_cpu
def test_between_whole_applies_a_thread_that_inherited_the_cgroup_goes_back(tmp_path, children, backends,
                                                                           monkeypatch):
    """A new thread made by a moved yield thread inherits the idle cgroup; told of it between whole
    applies (not a member), it goes back to the root without the whole pass. Whose new threads'
    cgroup is read: the processes with held threads (a set kept between batches, made again at
    each whole pass), so this fails where that set misses the process."""
    mixed = children.spawn(["srv-a", "bg-c"])  # the main thread makes the threads spawned later
    backend = backends(tmp_path)
    layer = yield_layer([mixed.pid, mixed.threads["bg-c"]])
    backend.apply(plan_of(layer), scan_threads([mixed.pid]))
    where = cpu_cgroup(mixed.pid, mixed.pid)
    assert where != "/"
    whole_passes = []
    real = backend.autogroups.cache.sessions
    monkeypatch.setattr(backend.autogroups.cache, "sessions", lambda *a, **kw: whole_passes.append(1) or real(*a, **kw))
    for name in ("late-1", "late-2"):  # the second after a batch that kept the set
        late = mixed.spawn(name)
        assert cpu_cgroup(mixed.pid, late) == where  # inherited from its creator
        result = backend.apply(plan_of(layer), scan_threads([mixed.pid]), _threads_of(mixed.pid, late))
        assert not result.failed, result.errors
        backend.idle_cgroup.settle()
        assert cpu_cgroup(mixed.pid, late) == "/" and cpu_cgroup(mixed.pid, mixed.pid) == where
    assert not whole_passes
    backend.stop()


def test_moves_made_on_the_worker_thread_tell_what_failed_and_their_records_go_back(tmp_path):
    """add()'s moves are written by a worker thread; settle() waits for them, and a move that
    failed is undone in the records as a failed write would be (the thread is not held there),
    its error told. Two batches not waited for in between are told together, in order."""
    idle = IdleCgroup(cgroup_name(str(tmp_path), "/nowhere"), MOUNT or "/nonexistent", why_not="")
    read_only = os.open(os.devnull, os.O_RDONLY)  # every write fails (EBADF)
    key = (os.getpid(), 1)
    idle.written[key] = idle.path
    idle.originals[key] = "/"
    idle._moves.submit(read_only, [(key, idle.path, None)])
    reader, writer = os.pipe()
    try:
        idle._moves.submit(writer, [((7, 1), idle.path, None), ((8, 1), idle.path, None)])
        settled = idle.settle()
        assert (settled.applied, settled.failed) == ({IDLE_CGROUP: 2}, {IDLE_CGROUP: 1}), settled
        assert "setting cpu cgroup /" in settled.errors[0] and key not in idle.written and key not in idle.originals
        assert os.read(reader, 100) == b"78"  # both tids, in order, through the open file
        assert not idle.settle().applied  # nothing left on its way
    finally:
        os.close(reader)
        idle._moves.close()


def test_a_batch_after_one_that_broke_still_closes_its_tasks_file():
    """The worker closes each batch's tasks file, also where the batch before it ended in an
    error (carried into this one and raised by wait()): the daemon would otherwise keep the fd."""
    moves = DeferredMoves()
    reader, writer = os.pipe()
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)  # the first batch's close of it fails (EBADF): that batch ends in an error
    try:
        moves.submit(closed, [])
        moves.submit(writer, [((7, 1), "/x", None)])
        with pytest.raises(OSError):
            moves.wait()
        os.set_blocking(reader, False)
        assert os.read(reader, 100) == b""  # end of file: the write end was closed, nothing written
    finally:
        os.close(reader)
        moves.close()


@needs_v1_cpu
def test_between_whole_applies_the_cgroup_is_not_made_again_unless_someone_removed_it(
        tmp_path, children, backends, monkeypatch):
    """A batch's moves go into the cgroup the last whole apply made (no mkdir and cpu.idle write
    per batch); one removed meanwhile by someone else is made again by the batch that finds it gone."""
    backend = backends(tmp_path)
    mixed, bg_c, where = _yield_thread_moved(children, backend)
    made = []
    real = os.makedirs
    monkeypatch.setattr(os, "makedirs", lambda *a, **kw: made.append(a) or real(*a, **kw))

    bg_d = mixed.spawn("bg-d")
    backend.apply(plan_of(yield_layer([bg_c, bg_d])), scan_threads([mixed.pid]), _threads_of(mixed.pid, bg_d))
    assert backend.idle_cgroup.settle().applied == {IDLE_CGROUP: 1}
    assert cpu_cgroup(mixed.pid, bg_d) == where and not made

    for tid in (bg_c, bg_d):  # someone else empties and removes it
        with open(os.path.join(MOUNT, "tasks"), "w") as handle:
            handle.write(str(tid))
    os.rmdir(idle_dir(tmp_path))
    bg_e = mixed.spawn("bg-e")
    result = backend.apply(plan_of(yield_layer([bg_c, bg_d, bg_e])), scan_threads([mixed.pid]),
                           _threads_of(mixed.pid, bg_e))
    assert not result.failed, result.errors
    assert backend.idle_cgroup.settle().applied == {IDLE_CGROUP: 1}
    assert made and cpu_cgroup(mixed.pid, bg_e) == where
