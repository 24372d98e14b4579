"""The native backend: a LayerPlan carried out with kernel-native per-thread controls.

- Confined layers (exclusive groups): members pinned to the layer's CPUs, and every other
  movable thread of the host kept off them (affinity = its original affinity minus the
  exclusive CPUs). Per-CPU kernel threads cannot move; they stay and are counted as unmovable.
  Affinity is the control that holds across autogroups: a thread that may not run on a CPU
  does not compete there, whatever its session.
- Latency layers: nice from layer.nice and a custom slice from layer.slice_us (sched_setattr
  on EEVDF kernels that honour it). With autogroup on, nice only ranks threads within one
  session; see the autogroup note below.
- Yield layers: SCHED_IDLE (policy "idle") or SCHED_BATCH + nice (policy "batch"). These too
  act only within one autogroup.
- Autogroup (kernel.sched_autogroup_enabled=1): every session is one group entity and the
  per-thread controls above rank threads only inside it; a SCHED_IDLE spinner in its own
  session still takes half of a shared CPU. So when a whole autogroup belongs to yield layers,
  the autogroup's nice is raised to 19, and when it belongs wholly to latency/exclusive layers
  with a negative nice, the autogroup gets that nice. Mixed autogroups are left and reported.
- idle_resume_us: the PM QoS resume bound on the layer's own CPUs. Open layers own no CPUs;
  bounding every CPU of the host would keep all of them polling when idle (on a VM: CPU time
  taken from the host for nothing), so that needs pmqos_open_layers=True.
- Tier weights: cgroup v2 cpu.weight through systemd or the cgroupfs, where the host allows.

Every original is recorded in a RestoreLedger (and its state file) before the first change:
threads that leave a layer get their originals back, stop() restores everything, and
recover() undoes what a killed predecessor left behind.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from temperd import paths
from temperd.sources import procfs
from temperd.backends.native import sched
from temperd.backends.native.cgroup_weight import CgroupWeights
from temperd.plan import CONFINED, GROUPED, YIELD, Layer, LayerPlan
from temperd.backends.native.pmqos import PmQos
from temperd.backends.native.restore_ledger import (AFFINITY, NICE, POLICY, SLICE, THREAD_KINDS, LedgerError, Original, RestoreLedger, RestoreOutcome, ThreadRecord, custom_slice_of)
from temperd.config.schema import glob_match
from temperd.sources.shape import format_cpulist

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = paths.RUN_DIR
PMQOS = "pmqos"
CPU_WEIGHT = "cpu_weight"
AUTOGROUP = "autogroup"
AUTOGROUP_YIELD_NICE = 19
_NOTE_NAMES = 6  # thread names listed in a note before "..."


@dataclass(frozen=True)
class ThreadRef:
    """The minimum the backend needs to know about a thread (inventory ThreadInfo also fits)."""

    tid: int
    pid: int
    start_time: int
    comm: str
    is_kernel_thread: Optional[bool] = None  # None: the backend reads it from /proc


def scan_threads(pids: Optional[Iterable[int]] = None) -> List[ThreadRef]:
    """Threads of the given processes (all of the host by default), read from /proc."""
    out: List[ThreadRef] = []
    for pid in (procfs.list_pids() if pids is None else pids):
        stats = procfs.read_thread_stats(pid)
        if not stats:
            continue
        leader = stats.get(pid) or next(iter(stats.values()))
        kthread = procfs.is_kernel_thread(pid, leader)
        for tid, stat in sorted(stats.items()):
            if stat.state in ("Z", "X", "x"):
                continue
            out.append(ThreadRef(tid, pid, stat.start_time, stat.comm, kthread))
    return out


@dataclass
class ApplyResult:
    applied: Dict[str, int] = field(default_factory=dict)  # kind -> settings changed
    failed: Dict[str, int] = field(default_factory=dict)
    restored: Dict[str, int] = field(default_factory=dict)
    drift: Dict[str, int] = field(default_factory=dict)  # newly found changed by someone else
    unmovable: int = 0  # threads that should leave the exclusive CPUs but cannot
    gone: int = 0  # threads that exited while being treated (normal)
    threads_treated: int = 0  # threads with at least one setting held by temperd after this call
    errors: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    unsupported: List[str] = field(default_factory=list)

    def bump(self, table: Dict[str, int], kind: str, n: int = 1) -> None:
        if n:
            table[kind] = table.get(kind, 0) + n

    def take(self, outcome: RestoreOutcome) -> None:
        for kind, n in outcome.restored.items():
            self.bump(self.restored, kind, n)
        for kind, n in outcome.failed.items():
            self.bump(self.failed, kind, n)
        for kind, n in outcome.drift.items():
            self.bump(self.drift, kind, n)
        self.gone += outcome.gone
        self.errors.extend(outcome.errors)

    def take_counts(self, kind: str, part: Any) -> None:
        """Merge a HostSettingResult (PM QoS, cgroup weights)."""
        self.bump(self.applied, kind, part.applied)
        self.bump(self.restored, kind, part.restored)
        self.bump(self.failed, kind, part.failed)
        self.bump(self.drift, kind, part.drift)
        self.errors.extend(part.errors)
        for text in part.unsupported:
            if text not in self.unsupported:
                self.unsupported.append(text)

    def merge(self, other: "ApplyResult") -> None:
        """Add another result's counts and messages to this one."""
        for mine, theirs in ((self.applied, other.applied), (self.failed, other.failed),
                             (self.restored, other.restored), (self.drift, other.drift)):
            for kind, n in theirs.items():
                self.bump(mine, kind, n)
        self.unmovable += other.unmovable
        self.gone += other.gone
        self.errors.extend(other.errors)
        self.notes.extend(other.notes)
        self.unsupported.extend(other.unsupported)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        def fmt(table: Dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(table.items())) or "none"

        return (f"applied: {fmt(self.applied)}; restored: {fmt(self.restored)}; failed: {fmt(self.failed)}; "
                f"drift: {fmt(self.drift)}; unmovable {self.unmovable}; gone {self.gone}; "
                f"threads held {self.threads_treated}")


@dataclass(frozen=True)
class _Want:
    """What one thread should have; None = its original."""

    layer: Optional[Layer]
    affinity: Optional[FrozenSet[int]] = None
    policy: Optional[int] = None
    nice: Optional[int] = None
    slice_ns: Optional[int] = None

    def value(self, kind: str) -> Any:
        return {AFFINITY: self.affinity, POLICY: self.policy, NICE: self.nice, SLICE: self.slice_ns}[kind]


class _Membership:
    """Which layer a thread belongs to: the plan's tids first, then the selectors' rules (new threads)."""

    def __init__(self, plan: LayerPlan):
        self.by_tid: Dict[int, Layer] = {}
        for layer in plan.layers:
            for tid in layer.selector.tids:
                self.by_tid.setdefault(tid, layer)
        self.rule_layers = [l for l in plan.layers
                            if l.selector.pids or l.selector.cgroup]
        self.need_cgroup = any(l.selector.cgroup for l in self.rule_layers)
        self._titles: Dict[int, str] = {}
        self._cgroups: Dict[int, Tuple[Optional[str], Optional[str]]] = {}

    def forget_processes(self) -> None:
        """Drop cached titles and cgroups (pids get reused)."""
        self._titles.clear()
        self._cgroups.clear()

    def _title(self, pid: int) -> str:
        if pid not in self._titles:
            self._titles[pid] = " ".join(procfs.read_cmdline(pid) or ())
        return self._titles[pid]

    def _cgroup(self, pid: int) -> Tuple[Optional[str], Optional[str]]:
        if pid not in self._cgroups:
            paths = procfs.read_cgroup(pid)
            self._cgroups[pid] = (paths.unified, paths.systemd) if paths else (None, None)
        return self._cgroups[pid]

    def _in_workload(self, layer: Layer, pid: int) -> bool:
        if pid in layer.selector.pids:
            return True
        return bool(layer.selector.cgroup) and layer.selector.cgroup in self._cgroup(pid)

    def layer_for(self, thread) -> Optional[Layer]:
        layer = self.by_tid.get(thread.tid)
        if layer is not None:
            return layer
        candidates = [l for l in self.rule_layers if self._in_workload(l, thread.pid)]
        for layer in candidates:
            sel = layer.selector
            if any(glob_match(p, thread.comm) for p in sel.comm_patterns):
                return layer
            if sel.title_patterns:
                title = self._title(thread.pid)
                if title and any(re.search(p, title) for p in sel.title_patterns):
                    return layer
        for layer in candidates:
            if layer.selector.catch_all:
                return layer
        return None


class NativeBackend:
    name = "native"

    def __init__(self, state_dir: str = DEFAULT_STATE_DIR, *, pmqos: Optional[PmQos] = None,
                 weights: Optional[CgroupWeights] = None, pmqos_open_layers: bool = False,
                 autogroup: bool = True):
        self.ledger = RestoreLedger(state_dir)
        self.pmqos = pmqos if pmqos is not None else PmQos()
        self.weights = weights if weights is not None else CgroupWeights()
        self.pmqos_open_layers = pmqos_open_layers
        self.autogroup = autogroup and sched.autogroup_enabled()
        self.plan: Optional[LayerPlan] = None
        self._membership: Optional[_Membership] = None
        self._exclusive: FrozenSet[int] = frozenset()
        self._universe: Dict[Tuple[int, int], Any] = {}  # the host threads last seen
        self._refused: Set[Tuple[int, int]] = set()  # kernel threads that refused an affinity change
        self._autogroups: Dict[str, Dict[str, Any]] = {}  # name -> {pid, start_time, original, written}
        self._autogroup_drifted: Set[str] = set()
        self._stuck: Dict[str, List[str]] = {}
        self._kthreads: Dict[Tuple[int, int], bool] = {}
        self._failed: Set[Tuple[Tuple[int, int], str]] = set()  # (thread, kind) refused under this plan
        self._drift_totals: Dict[str, int] = {}
        self._recovered = False

    # ---- public API --------------------------------------------------------------------------

    def apply(self, plan: LayerPlan, threads: Iterable) -> ApplyResult:
        """Carry out `plan` over `threads`, the host's whole thread list."""
        result = ApplyResult()
        if not self._recovered:
            result.merge(self.recover())
        self._set_plan(plan, result)
        threads = list(threads)
        self._universe = {(t.tid, t.start_time): t for t in threads}
        self._kthreads = {k: v for k, v in self._kthreads.items() if k in self._universe}
        self._treat_threads(threads, result)
        # Threads temperd holds that are not in the host list any more: restore the living.
        online = sched.online_cpus()
        for rec in list(self.ledger.records.values()):
            if rec.key not in self._universe:
                result.take(self.ledger.restore(rec, online=online))
        self._apply_autogroups(result)
        self._apply_pmqos(plan, result)
        result.take_counts(CPU_WEIGHT, self.weights.apply(plan.cgroup_weights))
        return self._finish(result)

    def on_new_threads(self, threads: Iterable) -> ApplyResult:
        """Treat threads the inventory just saw, under the current plan, without waiting for a replan."""
        result = ApplyResult()
        if self.plan is None:
            return result
        threads = list(threads)
        self._membership.forget_processes()
        for thread in threads:
            self._universe[(thread.tid, thread.start_time)] = thread
        self._treat_threads(threads, result)
        if self.autogroup and any(t.tid == t.pid for t in threads):  # a new process may change a session's mix
            self._apply_autogroups(result)
        return self._finish(result)

    def stop(self) -> ApplyResult:
        """Restore everything temperd changed and remove the state file."""
        result = ApplyResult()
        result.take(self.ledger.restore_all())
        self._restore_autogroups(result, list(self._autogroups))
        result.take_counts(PMQOS, self.pmqos.restore_all())
        result.take_counts(CPU_WEIGHT, self.weights.restore_all())
        drifted = sum(len(rec.drifted) for rec in self.ledger.records.values())
        if drifted:
            result.notes.append(f"{drifted} setting(s) changed by someone else after temperd set them were left as found")
        self.ledger.records.clear()
        self._universe.clear()
        self._refused.clear()
        self._failed.clear()
        self.plan = None
        self._membership = None
        self._exclusive = frozenset()
        self._kthreads.clear()
        return self._finish(result)

    def recover(self) -> ApplyResult:
        """At start: undo what a previous run left in the state file (threads still alive: same tid and start time)."""
        result = ApplyResult()
        if self.ledger.records or self.pmqos.written or self.weights.written or self._autogroups:
            result.notes.append("recover: this backend already holds changes; the state file is its own")
            return result
        self._recovered = True
        previous = RestoreLedger(self.ledger.state_dir, os.path.basename(self.ledger.path))
        try:
            found = previous.load()
        except LedgerError as exc:
            aside = previous.path + ".unreadable"
            os.replace(previous.path, aside)
            result.errors.append(f"{exc}; moved to {aside}, nothing restored from it")
            return result
        if not found:
            return result
        result.take(previous.restore_all())
        pm = previous.extras.get(PMQOS) or {}
        if pm:
            self.pmqos.adopt(pm.get("originals", {}), pm.get("written", {}))
            result.take_counts(PMQOS, self.pmqos.restore_all())
        weights = previous.extras.get(CPU_WEIGHT) or {}
        if weights:
            self.weights.adopt(weights.get("originals", {}), weights.get("written", {}))
            result.take_counts(CPU_WEIGHT, self.weights.restore_all())
        groups = previous.extras.get(AUTOGROUP) or {}
        if groups:
            self._autogroups.update(groups)
            self._restore_autogroups(result, list(groups))
        result.notes.append(f"recovered from {previous.path}: {result.summary()}")
        previous.delete()
        return result

    def status(self) -> Dict[str, Any]:
        return {"carried_by": "native"}

    def layer_cpus(self) -> None:
        return None  # the plan's CPU numbers are the ones pinned

    def retry(self) -> bool:
        return False  # nothing is ever given up

    def drift_report(self) -> List[Dict[str, Any]]:
        """Settings someone else changed after temperd set them (temperd no longer enforces these)."""
        out = []
        for rec in self.ledger.records.values():
            for kind, found in sorted(rec.drifted.items()):
                out.append({"tid": rec.tid, "pid": rec.pid, "comm": rec.comm, "kind": kind,
                            "found": list(found) if isinstance(found, tuple) else found})
        for name in sorted(self._autogroup_drifted):
            out.append({"autogroup": name, "kind": AUTOGROUP})
        return out

    @property
    def drift_counts(self) -> Dict[str, int]:
        """Settings found changed by someone else since this backend started, by kind."""
        return dict(self._drift_totals)

    def _finish(self, result: ApplyResult) -> ApplyResult:
        self._save(result)
        result.threads_treated = sum(1 for rec in self.ledger.records.values() if rec.applied)
        for kind, n in result.drift.items():
            self._drift_totals[kind] = self._drift_totals.get(kind, 0) + n
        return result

    # ---- plan ------------------------------------------------------------------------------------

    def _set_plan(self, plan: LayerPlan, result: ApplyResult) -> None:
        if plan != self.plan:
            self._failed.clear()  # a new plan tries again what the kernel refused under the old one
        self.plan = plan
        self._membership = _Membership(plan)
        online = sched.online_cpus()
        exclusive = frozenset(c for l in plan.layers if l.kind == CONFINED for c in l.cpus) & online
        if exclusive and exclusive >= online:
            result.errors.append(f"exclusive CPUs {format_cpulist(exclusive)} cover every online CPU: "
                                 "nothing would be left for other threads; not keeping others off them")
            exclusive = frozenset()
        self._exclusive = exclusive
        support = sched.slice_support()
        if any(l.slice_us for l in plan.layers) and not support.supported:
            result.unsupported.append(f"custom slice: {support.reason}")
        for layer in plan.layers:
            if layer.kind == GROUPED and layer.cpus:
                result.notes.append(f"layer {layer.name}: Grouped on CPUs {format_cpulist(layer.cpus)} has no "
                                    "native form (owned but shared when idle); members keep their affinity")

    def _want(self, layer: Optional[Layer], original_affinity: FrozenSet[int], policy_now: int) -> _Want:
        affinity = None
        if layer is not None and layer.kind == CONFINED and layer.cpus:
            affinity = frozenset(layer.cpus)
        elif self._exclusive and original_affinity & self._exclusive:
            affinity = original_affinity - self._exclusive  # may be empty: the caller reports it
        if layer is None or policy_now in sched.REALTIME_POLICIES:
            return _Want(layer, affinity)
        policy = sched.POLICY_BY_NAME.get(layer.policy)
        if policy == sched.SCHED_OTHER:
            policy = None
        nice = layer.nice if policy != sched.SCHED_IDLE else None  # SCHED_IDLE has one fixed weight
        slice_ns = None
        if layer.slice_us and sched.slice_support().supported:
            slice_ns = int(layer.slice_us) * 1000
        return _Want(layer, affinity, policy, nice, slice_ns)

    # ---- threads ---------------------------------------------------------------------------------

    def _is_kthread(self, thread) -> bool:
        value = getattr(thread, "is_kernel_thread", None)
        if value is None:
            key = (thread.tid, thread.start_time)
            value = self._kthreads.get(key)
            if value is None:
                value = self._kthreads[key] = bool(sched.is_kernel_thread(thread.tid))
        return bool(value)

    def _treat_threads(self, threads: List, result: ApplyResult) -> None:
        """Two passes: record originals and intents (saved), then change. A kill between the passes
        leaves a state file that undoes whatever was already changed."""
        online = sched.online_cpus()
        actions: List[Tuple[ThreadRecord, Dict[str, Any], List[str]]] = []
        stuck: Dict[str, List[str]] = {}
        self._stuck = stuck
        for thread in threads:
            try:
                plan = self._plan_thread(thread, online, result, stuck)
            except OSError as exc:
                if not sched.is_gone(exc):
                    result.bump(result.failed, "read")
                    result.errors.append(f"tid {thread.tid} ({thread.comm}): reading settings: {exc.strerror or exc}")
                    continue
                result.gone += 1
                rec = self.ledger.get(thread.tid, thread.start_time)
                if rec is not None:
                    self.ledger.forget(rec)
                continue
            if plan is not None:
                actions.append(plan)
        if actions:
            self._save(result)
        for rec, sets, restores in actions:
            self._execute(rec, sets, restores, online, result)
        for why, names in sorted(stuck.items()):
            shown = ", ".join(sorted(names)[:_NOTE_NAMES]) + (", ..." if len(names) > _NOTE_NAMES else "")
            result.notes.append(f"{len(names)} {why}: {shown}")

    def _plan_thread(self, thread, online: FrozenSet[int], result: ApplyResult,
                     stuck: Dict[str, List[str]]) -> Optional[Tuple[ThreadRecord, Dict[str, Any], List[str]]]:
        key = (thread.tid, thread.start_time)
        rec = self.ledger.get(*key)
        layer = self._membership.layer_for(thread) if self._membership else None
        if rec is None and layer is None and not self._exclusive:
            return None  # nothing to do, nothing to undo: no syscall
        kthread = self._is_kthread(thread)
        excl = ", ".join(str(c) for c in sorted(self._exclusive))
        if kthread and layer is None and key in self._refused:
            if self._exclusive:
                stuck.setdefault(f"kernel thread(s) refused to leave CPUs {excl} (workqueue workers follow "
                                 "/sys/devices/virtual/workqueue/cpumask)", []).append(thread.comm)
                result.unmovable += 1
            return None
        state = sched.get_sched(thread.tid)
        current = {AFFINITY: sched.get_affinity(thread.tid), POLICY: state.policy, NICE: state.nice,
                   SLICE: state.slice_ns or 0}
        original = rec.original if rec else Original(
            affinity=tuple(sorted(current[AFFINITY])), policy=state.policy, priority=state.priority,
            nice=state.nice, slice_ns=custom_slice_of(state))
        if rec is None and not kthread:
            # Kernel threads are not created with their creator's settings (kthreadd's included).
            original = self._uninherit(thread, original, current, online)
        original_affinity = frozenset(original.affinity)
        want = self._want(layer, original_affinity, current[POLICY])
        if want.affinity is not None and not want.affinity:
            # Only allowed on exclusive CPUs: a per-CPU kernel thread, or a thread pinned there by its owner.
            what = (f"per-CPU kernel thread(s) stay on exclusive CPUs {excl}" if kthread
                    else f"thread(s) allowed only on exclusive CPUs {excl} are left there")
            stuck.setdefault(what, []).append(thread.comm)
            result.unmovable += 1
            want = _Want(want.layer, None, want.policy, want.nice, want.slice_ns)
        if layer is not None and current[POLICY] in sched.REALTIME_POLICIES and (
                layer.nice is not None or layer.slice_us or layer.policy != "other"):
            stuck.setdefault(f"real-time thread(s) keep their {sched.POLICY_NAMES[current[POLICY]]} policy "
                             "(nice, slice and yield policies are for the fair classes)", []).append(thread.comm)
        if current[POLICY] == sched.SCHED_DEADLINE and want.affinity is not None:
            stuck.setdefault(f"SCHED_DEADLINE thread(s) cannot leave exclusive CPUs {excl}", []).append(thread.comm)
            result.unmovable += 1
            want = _Want(want.layer, None)
        wanted = [k for k in THREAD_KINDS if want.value(k) is not None]
        if rec is None and not wanted:
            return None
        if rec is None:
            rec = self.ledger.record(thread.tid, thread.pid, thread.start_time, thread.comm, original)
        rec.comm = thread.comm
        sets: Dict[str, Any] = {}
        restores: List[str] = []
        for kind in THREAD_KINDS:
            if kind in rec.drifted or (rec.key, kind) in self._failed:
                continue
            value = want.value(kind)
            if kind in rec.applied:
                found = current[kind]
                if not self.ledger.matches(rec, kind, found, online):
                    self.ledger.mark_drift(rec, kind, found)
                    result.bump(result.drift, kind)
                    log.info("tid %d (%s): %s changed by someone else to %s; no longer enforced",
                             rec.tid, rec.comm, kind, found)
                    continue
                if value is None:
                    restores.append(kind)
                elif value != rec.applied[kind] and not (kind == AFFINITY and frozenset(value) == frozenset(rec.applied[kind])):
                    sets[kind] = value
            elif value is not None:
                sets[kind] = value
        for kind, value in sets.items():
            rec.applied[kind] = tuple(sorted(value)) if kind == AFFINITY else value  # intent, before the change
        if not sets and not restores:
            if not rec.applied and not rec.drifted:
                self.ledger.forget(rec)
            return None
        return rec, sets, restores

    def _uninherit(self, thread, original: Original, current: Dict[str, Any], online: FrozenSet[int]) -> Original:
        """A new thread or process starts with its creator's settings, which may be temperd's treatment:
        where a setting equals what temperd set on a thread of the same process (or of the parent
        process), the creator's original is the new thread's original."""
        candidates = [r for r in self.ledger.by_pid(thread.pid) if r.tid != thread.tid]
        if not candidates:
            fields = sched.read_stat_fields(thread.pid)
            if fields:
                candidates = self.ledger.by_pid(int(fields[1]))
        if not candidates:
            return original
        candidates.sort(key=lambda r: (r.tid != r.pid, r.tid))
        values = {AFFINITY: original.affinity, POLICY: (original.policy, original.priority),
                  NICE: original.nice, SLICE: original.slice_ns}
        for kind in THREAD_KINDS:
            for cand in candidates:
                if kind in cand.applied and self.ledger.matches(cand, kind, current[kind], online):
                    values[kind] = ((cand.original.policy, cand.original.priority) if kind == POLICY
                                    else cand.original.value(kind))
                    break
        return Original(affinity=tuple(values[AFFINITY]), policy=values[POLICY][0], priority=values[POLICY][1],
                        nice=values[NICE], slice_ns=values[SLICE])

    def _execute(self, rec: ThreadRecord, sets: Dict[str, Any], restores: List[str],
                 online: FrozenSet[int], result: ApplyResult) -> None:
        try:
            if restores:
                result.take(self.ledger.restore(rec, restores, online=online))
                if rec.key not in self.ledger.records:
                    return  # gone, or nothing left to hold
            if AFFINITY in sets:
                self._do(rec, [AFFINITY], result, lambda: sched.set_affinity(rec.tid, sets[AFFINITY]))
            sched_args = {}
            if POLICY in sets:
                sched_args["policy"] = sets[POLICY]
            if NICE in sets:
                sched_args["nice"] = sets[NICE]
            if SLICE in sets:
                sched_args["slice_ns"] = sets[SLICE]
            if sched_args:
                kinds = [k for k in (POLICY, NICE, SLICE) if k in sets]
                self._do(rec, kinds, result, lambda: sched.set_sched(rec.tid, **sched_args))
        except OSError as exc:
            if not sched.is_gone(exc):
                raise
            result.gone += 1
            self.ledger.forget(rec)
            return
        if not rec.applied and not rec.drifted:
            self.ledger.forget(rec)

    def _do(self, rec: ThreadRecord, kinds: List[str], result: ApplyResult, action) -> None:
        try:
            action()
        except OSError as exc:
            if sched.is_gone(exc):
                raise
            for kind in kinds:
                rec.applied.pop(kind, None)  # nothing changed: nothing to restore
            if kinds == [AFFINITY] and exc.errno == errno.EINVAL and self._is_kthread(rec):
                # Kernel threads with PF_NO_SETAFFINITY (workqueue workers, per-CPU threads) refuse.
                self._refused.add(rec.key)
                result.unmovable += 1
                excl = ", ".join(str(c) for c in sorted(self._exclusive))
                self._stuck.setdefault(f"kernel thread(s) refused to leave CPUs {excl} (workqueue workers follow "
                                       "/sys/devices/virtual/workqueue/cpumask)", []).append(rec.comm)
                return
            for kind in kinds:
                result.bump(result.failed, kind)
                self._failed.add((rec.key, kind))  # reported once; not retried until the plan changes
            result.errors.append(f"tid {rec.tid} ({rec.comm}): setting {'/'.join(kinds)}: {exc.strerror or exc}")
            return
        for kind in kinds:
            result.bump(result.applied, kind)

    # ---- autogroups ------------------------------------------------------------------------------

    def _apply_autogroups(self, result: ApplyResult) -> None:
        """Weigh whole autogroups whose every thread belongs to yield (or to latency/exclusive) layers."""
        if not self.autogroup or self._membership is None:
            return
        groups: Dict[str, Dict[str, Any]] = {}
        seen: Dict[int, Optional[tuple]] = {}
        for thread in self._universe.values():
            if self._is_kthread(thread):
                continue
            if thread.pid not in seen:
                seen[thread.pid] = sched.read_autogroup(thread.pid)
            found = seen[thread.pid]
            if found is None:
                continue
            name, nice = found
            group = groups.setdefault(name, {"pid": thread.pid, "nice": nice, "classes": set(), "nices": []})
            if thread.pid == thread.tid:
                group["pid"] = thread.pid
            layer = self._membership.layer_for(thread)
            if layer is None:
                group["classes"].add("none")
            elif layer.treatment == YIELD:
                group["classes"].add(YIELD)
            else:
                group["classes"].add("favoured")
                if layer.nice is not None:
                    group["nices"].append(layer.nice)
        desired: Dict[str, int] = {}
        for name, group in groups.items():
            if group["classes"] == {YIELD}:
                desired[name] = AUTOGROUP_YIELD_NICE
            elif group["classes"] == {"favoured"} and group["nices"] and min(group["nices"]) < 0:
                desired[name] = min(group["nices"])
            elif YIELD in group["classes"] and len(group["classes"]) > 1:
                result.notes.append(f"autogroup {name} (session of pid {group['pid']}) mixes yield threads with others: "
                                    "their SCHED_IDLE/BATCH only yields inside that session")
        self._restore_autogroups(result, [n for n in self._autogroups if n not in desired])
        for name, nice in sorted(desired.items()):
            if name in self._autogroup_drifted:
                continue
            group = groups[name]
            held = self._autogroups.get(name)
            if held is not None:
                if group["nice"] != held["written"]:
                    self._autogroup_drifted.add(name)
                    result.bump(result.drift, AUTOGROUP)
                    continue
                if held["written"] == nice:
                    continue
            pid = group["pid"]
            try:
                sched.set_autogroup_nice(pid, nice)
            except OSError as exc:
                if sched.is_gone(exc):
                    continue
                result.bump(result.failed, AUTOGROUP)
                result.errors.append(f"autogroup {name} (pid {pid}): setting nice {nice}: {exc.strerror or exc}")
                continue
            original = held["original"] if held else group["nice"]
            self._autogroups[name] = {"pid": pid, "start_time": sched.start_time(pid), "original": original,
                                      "written": nice}
            result.bump(result.applied, AUTOGROUP)

    def _restore_autogroups(self, result: ApplyResult, names: List[str]) -> None:
        for name in names:
            held = self._autogroups.pop(name, None)
            drifted = name in self._autogroup_drifted
            self._autogroup_drifted.discard(name)
            if held is None or drifted:
                continue
            pid = int(held["pid"])
            if sched.start_time(pid) != held.get("start_time"):
                continue  # the process that named it is gone; its session's group may be gone too
            found = sched.read_autogroup(pid)
            if found is None or found[0] != name or found[1] != held["written"]:
                continue  # moved to another session, or someone else set the nice since: leave it
            try:
                sched.set_autogroup_nice(pid, int(held["original"]))
                result.bump(result.restored, AUTOGROUP)
            except OSError as exc:
                if not sched.is_gone(exc):
                    result.bump(result.failed, AUTOGROUP)
                    result.errors.append(f"autogroup {name}: restoring nice {held['original']}: {exc.strerror or exc}")

    # ---- PM QoS ----------------------------------------------------------------------------------

    def _apply_pmqos(self, plan: LayerPlan, result: ApplyResult) -> None:
        desired: Dict[int, int] = {}
        online = sched.online_cpus()
        for layer in plan.layers:
            if layer.idle_resume_us is None:
                continue
            if layer.cpus:
                cpus = frozenset(layer.cpus) & online
            elif self.pmqos_open_layers:
                cpus = online
            else:
                result.notes.append(f"layer {layer.name}: idle_resume_us {layer.idle_resume_us} not applied: an Open "
                                    "layer owns no CPUs and bounding all of them needs pmqos_open_layers")
                continue
            for cpu in cpus:
                desired[cpu] = min(desired.get(cpu, layer.idle_resume_us), layer.idle_resume_us)
        result.take_counts(PMQOS, self.pmqos.apply(desired))

    # ---- persistence -----------------------------------------------------------------------------

    def _save(self, result: ApplyResult) -> None:
        self.ledger.extras[PMQOS] = ({"originals": {str(c): v for c, v in self.pmqos.originals.items()},
                                      "written": {str(c): v for c, v in self.pmqos.written.items()}}
                                     if self.pmqos.written else {})
        self.ledger.extras[CPU_WEIGHT] = ({"originals": dict(self.weights.originals),
                                           "written": dict(self.weights.written)} if self.weights.written else {})
        self.ledger.extras[AUTOGROUP] = dict(self._autogroups)
        try:
            self.ledger.save()
        except OSError as exc:
            result.bump(result.failed, "state_file")
            result.errors.append(f"{self.ledger.path}: cannot write the state file: {exc.strerror or exc}; "
                                 "a crash now would leave changes that the next start cannot undo")
