"""Change proportional to the change: a batch of process events plans again only the workloads it
touched (plan_delta) and the native backend applies that delta alone; a stream of such deltas
leaves the host exactly as one whole plan, applied in full to the final state, does. The kernel
is tests/fake_kernel.py's, the processes facts_builder's: nothing of the host is touched."""

from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from facts_builder import FactsHost, profile
from fake_kernel import FakeKernel
from fixture_shapes import load_fixture_shape

from temperd.backends.native.backend import NativeBackend
from temperd.backends.native.cgroup_weight import CGROUPFS, CgroupWeights, WeightSupport
from temperd.backends.native.idle_cgroup import IdleCgroup
from temperd.backends.native.pmqos import PmQos
from temperd.config.daemon_config import config_from_document
from temperd.config.tomlsource import parse_toml
from temperd.decide import plan_delta as delta_module, planner
from temperd.decide.hostview import decide
from temperd.decide.matcher import Matcher
from temperd.decide.trust import TrustPolicy

SHAPE = load_fixture_shape("gcp-c2-standard-8")
CPUS = sorted(cpu for core in SHAPE.cores for cpu in core.cpus)
PROFILES = {p.id: p for p in (
    profile("yielder", 'process_names = ["yld*"]',
            'name = "bg"\nthread_names = ["bg-*"]\ntreatment = "yield"\nyield_policy = "batch"\nnice = 5'),
    profile("mixed", 'process_names = ["mix*"]',
            'name = "fast"\nthread_names = ["fast-*"]\ntreatment = "latency"\nnice = -5',
            'name = "rest"\ncatch_all = true\ntreatment = "yield"\nyield_policy = "idle"'),
    profile("db", 'process_names = ["db"]',
            'name = "conn"\nthread_names = ["conn-*"]\ntreatment = "exclusive"',
            'name = "rest"\ncatch_all = true\ntreatment = "yield"\nyield_policy = "batch"\nnice = 10'),
)}
# a weight unlike the kernel's 100
CONFIG = config_from_document(parse_toml("[tiers.standard]\nweight = 300\n", "temperd.toml"))
VIEW = SimpleNamespace(shape=SHAPE, config=CONFIG, profiles=SimpleNamespace(active=PROFILES))
THREAD_NAMES = ("bg-1", "bg-2", "fast-1", "conn-1", "conn-2", "zz", "worker")


class Host:
    """One daemon's view: processes (facts), the kernel, the matcher and the backend, driven as
    Daemon.replan drives them after each batch of process events."""

    def __init__(self, root: str, kernel: FakeKernel):
        self.root, self.kernel = root, kernel
        self.facts = FactsHost()
        self.matcher = Matcher(CONFIG, PROFILES, trust=TrustPolicy(uid_min=1000))
        os.makedirs(os.path.join(root, "run"), exist_ok=True)
        self.backend = NativeBackend(
            os.path.join(root, "run"), pmqos=PmQos(os.path.join(root, "cpu")), autogroup=False,
            weights=CgroupWeights(WeightSupport(CGROUPFS, os.path.join(root, "cg"), "a directory of the test")),
            idle_cgroup=IdleCgroup(why_not="no idle cgroup in a fake kernel"), online_cpus=lambda: kernel.cpus)
        self.plan = None
        self.generation = 0  # as the inventory's snapshots count them
        self.matched = {}  # pid -> the facts of the last replan
        self.top = {}  # pid -> the highest tid its threads had

    def launch(self, name: str, threads, cgroup) -> None:
        """cgroup: True, one of its own; "/": the root's (its weight unsupported); else none."""
        path = "/" if cgroup == "/" else None
        if cgroup is True:
            path = f"/tmpd/{name}-{len(self.facts.by_pid)}"
            _cgroup(self.root, path)
        proc = self.facts.process(name, threads=[name, *threads], cgroup=path)
        self.top[proc.pid] = max(proc.threads)
        for t in proc.threads.values():
            self.kernel.add(t.tid, t.pid, t.start_time, t.comm)

    def threads(self):
        return {tid: t for proc in self.facts.processes for tid, t in proc.threads.items()}

    def replan(self, fresh=None, ended=(), told=True):
        """Daemon.replan: after events (`fresh`, not None) the plan in force is the delta's start;
        told: the matcher is told which processes changed, as the inventory tells it (else it compares all)."""
        threads = self.threads()
        procs = {proc.pid: proc for proc in self.facts.processes}
        changed = {pid for pid in procs.keys() | self.matched.keys() if procs.get(pid) is not self.matched.get(pid)}
        self.generation += 1
        self.matched = procs
        _match, layer_plan = decide(VIEW, self.matcher, procs, memo=None,
                                    previous=self.plan if fresh is not None else None,
                                    generation=self.generation, changed=changed if told else None)
        if fresh is not None and layer_plan is self.plan:
            result = self.backend.on_new_threads(fresh) if fresh else None
        else:
            result = self.backend.apply(layer_plan, threads, fresh)
        if fresh is not None:
            self.backend.forget_threads(list(ended), threads)
        self.plan = layer_plan
        assert result is None or not result.errors, result.errors

    def held(self):
        """What the backend holds: each thread's original where it applied something, and the weights."""
        records = {key: (dict(rec.originals), dict(rec.written)) for key, rec in self.backend.ledger.records.items()
                   if rec.written}
        weights = {}
        live = {proc.cgroup for proc in self.facts.processes}
        for top, _dirs, files in os.walk(os.path.join(self.root, "cg")):
            for name in files:
                with open(os.path.join(top, name)) as handle:
                    value = handle.read().strip()
                cgroup = "/" + os.path.relpath(top, os.path.join(self.root, "cg"))
                if cgroup in live:
                    weights[cgroup] = value
                else:  # its workload ended: its weight given back
                    assert value == "100", (cgroup, value)
        return records, weights


def _cgroup(root: str, path: str) -> None:
    """A cgroup directory with the kernel's default weight, unless it exists (two processes may share one)."""
    weight = os.path.join(root, "cg", path.lstrip("/"), "cpu.weight")
    if not os.path.exists(weight):
        os.makedirs(os.path.dirname(weight), exist_ok=True)
        with open(weight, "w") as handle:
            handle.write("100\n")


def _act(host: Host, action: str, pick: int, name_pick: int):
    """One batch of events; returns (new threads, ended tids)."""
    procs = host.facts.processes
    proc = procs[pick % len(procs)] if procs else None
    comm = THREAD_NAMES[name_pick % len(THREAD_NAMES)]
    if action == "spawn" or proc is None:
        kind = ("yld", "mix", "mix2", "yld2", "db")[pick % 5]
        host.launch(kind, [THREAD_NAMES[(name_pick + i) % len(THREAD_NAMES)] for i in range(pick % 4)],
                   cgroup=(False, True, "/")[name_pick % 3])
        new = host.facts.processes[-1]
        return list(new.threads.values()), []
    if action == "thread":
        # A tid not used before (the kernel's come round only after millions; a reused one has
        # another start time, which the facts here do not give it).
        host.top[proc.pid] = max(max(proc.threads), host.top.get(proc.pid, 0)) + 1
        grown = host.facts.add_threads(proc, [comm], first_tid=host.top[proc.pid])
        (tid,) = set(grown.threads) - set(proc.threads)
        t = grown.threads[tid]
        host.kernel.add(tid, t.pid, t.start_time, t.comm)
        return [t], []
    if action == "rename":
        tid = sorted(proc.threads)[name_pick % len(proc.threads)]
        host.facts.rename_thread(proc, tid, comm)
        host.kernel.rename(tid, comm)
        return [], []
    if action == "exit_thread" and len(proc.threads) > 1:
        tid = sorted(proc.threads)[1 + name_pick % (len(proc.threads) - 1)]
        host.facts.replace(proc, threads={k: v for k, v in proc.threads.items() if k != tid})
        host.kernel.remove(tid)
        return [], [tid]
    host.facts.remove(proc)
    for tid in proc.threads:
        host.kernel.remove(tid)
    return [], list(proc.threads)


ACTIONS = st.lists(st.tuples(st.sampled_from(["spawn", "spawn", "thread", "rename", "exit_thread", "exit"]),
                             st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=30)
# Batches of one or more actions, each replanned with the changed pids (True) or without (False).
BATCHES = st.lists(st.tuples(ACTIONS.map(lambda actions: actions[:3]), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
@example([("spawn", 0, 1), ("exit", 0, 0), ("spawn", 0, 1)])  # two workloads in one cgroup
def test_a_stream_of_deltas_leaves_the_host_as_one_whole_apply_of_the_final_state(actions):
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        host, kernel = _started(root, patch)
        for action, pick, name_pick in actions:
            fresh, ended = _act(host, action, pick, name_pick)
            host.replan(fresh, ended)
        _assert_as_one_whole_apply(host, kernel, root, patch, actions)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BATCHES)
def test_batches_told_their_changed_processes_leave_the_host_as_one_whole_apply(batches):
    """The matcher told which processes changed since its last match (the inventory's
    changed_since) compares no other, and plan_delta reads the workloads it built again and
    ended instead of comparing every one; a batch not told compares them all."""
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        host, kernel = _started(root, patch)
        patch.setattr(delta_module, "_changed", lambda *a: pytest.fail("every workload compared"))
        for actions, told in batches:
            fresh, ended = [], []
            for action, pick, name_pick in actions:
                more, gone = _act(host, action, pick, name_pick)
                fresh = [t for t in fresh if t.tid not in gone] + more
                ended += gone
            live = host.threads()  # as the daemon reads them from the snapshot: renamed since they came
            host.replan([live[t.tid] for t in fresh if t.tid in live], ended, told=told)
        _assert_as_one_whole_apply(host, kernel, root, patch, batches)


def _started(root: str, patch):
    """A host with two workloads, planned and applied whole (the daemon's start)."""
    kernel = FakeKernel(CPUS)
    kernel.install(patch)
    host = Host(os.path.join(root, "delta"), kernel)
    host.launch("yld", ["bg-1", "worker"], cgroup=True)
    host.launch("mix", ["fast-1", "zz"], cgroup=False)
    host.replan()
    return host, kernel


def _assert_as_one_whole_apply(host: Host, kernel: FakeKernel, root: str, patch, actions) -> None:
    after_deltas, held = kernel.state(), host.held()
    # The same final processes on a host temperd never touched, planned and applied whole.
    whole_kernel = FakeKernel(CPUS)
    whole_kernel.install(patch)
    whole = Host(os.path.join(root, "whole"), whole_kernel)
    for proc in host.facts.processes:
        whole.facts.by_pid[proc.pid] = proc
        for t in proc.threads.values():
            whole_kernel.add(t.tid, t.pid, t.start_time, t.comm)
        if proc.cgroup and proc.cgroup != "/":
            _cgroup(whole.root, proc.cgroup)
    whole.replan()
    assert after_deltas == whole_kernel.state(), actions
    assert held == whole.held(), actions


def test_an_event_in_one_workload_plans_and_reads_that_workload_alone(tmp_path, monkeypatch):
    kernel = FakeKernel(CPUS)
    kernel.install(monkeypatch)
    host = Host(str(tmp_path), kernel)
    host.launch("db", ["conn-1", "zz"], cgroup=True)  # an exclusive group: CPUs of its own
    for i in range(20):
        host.launch(f"yld{i}", ["bg-1", "bg-2"], cgroup=bool(i % 2))
    host.replan()
    db_layers = [layer for layer in host.plan.layers if layer.workload.startswith("db")]
    assert any(layer.cpus for layer in db_layers)

    planned, whole = [], []
    real = planner._workload_layers
    monkeypatch.setattr(delta_module, "_workload_layers",
                        lambda workload, *rest: planned.append(workload.key) or real(workload, *rest))
    real_plan = planner.plan
    monkeypatch.setattr("temperd.decide.hostview.plan", lambda *a, **k: whole.append(1) or real_plan(*a, **k))
    kernel.reads.clear()
    weight_reads = []
    setting = host.backend.weights.setting
    monkeypatch.setattr(setting, "read", lambda key, real=setting.read: weight_reads.append(key) or real(key))
    target = host.facts.processes[6]
    assert target.cgroup  # a workload with a cgroup weight
    fresh, _ = _act(host, "thread", 6, 0)  # a new bg-1 thread in one yielding process
    host.replan(fresh, [])
    assert not whole, "the whole plan was made for one workload's event"
    assert planned == [host.matcher.match(host.facts.processes).workload_of(target.pid).key]
    assert set(kernel.reads) == {fresh[0].tid}  # only the new thread was read
    assert not weight_reads  # no workload's weight changed: none was read again
    assert [layer for layer in host.plan.layers if layer.workload.startswith("db")] == db_layers
    assert kernel.threads[fresh[0].tid].policy == 3  # SCHED_BATCH: the bg group's

    # A new process with an exclusive group moves CPUs: the whole plan.
    fresh, _ = _act(host, "spawn", 4, 1)
    host.replan(fresh, [])
    assert whole


def test_a_new_workload_whose_layer_name_is_taken_gets_a_suffix_not_the_whole_plan(tmp_path, monkeypatch):
    """Keys cut at the 63-byte limit of a layer name meet (a long unit or profile id): the
    delta names the newcomer's layer with the first free suffix instead of planning every workload."""
    long_id = "a-profile-with-an-id-long-enough-to-cut-its-layer-names-short"
    profiles = {**PROFILES, long_id: profile(long_id, 'process_names = ["longer*"]',
                                             'name = "bg"\nthread_names = ["bg-*"]\ntreatment = "yield"')}
    monkeypatch.setattr(VIEW.profiles, "active", profiles)
    kernel = FakeKernel(CPUS)
    kernel.install(monkeypatch)
    host = Host(str(tmp_path), kernel)
    host.matcher = Matcher(CONFIG, profiles, trust=TrustPolicy(uid_min=1000))
    host.launch("longer", ["bg-1"], cgroup=False)
    host.replan()
    whole = []
    real_plan = planner.plan
    monkeypatch.setattr("temperd.decide.hostview.plan", lambda *a, **k: whole.append(1) or real_plan(*a, **k))
    for _ in range(3):
        host.launch("longer", ["bg-1"], cgroup=False)
        host.replan(list(host.facts.processes[-1].threads.values()), [])
    names = [layer.name for layer in host.plan.layers]
    assert not whole and len(names) == len(set(names)) == 4 and all(len(n) <= 63 for n in names)
    assert all(kernel.threads[t.tid].policy == 5 for p in host.facts.processes for t in p.threads.values()
               if t.comm == "bg-1")  # SCHED_IDLE: the group's yield
