"""Per-thread treatment: the affinity, policy, nice and slice each thread should have under the
plan, carried out, and undone through the restore ledger.

- Confined layers (exclusive groups): members pinned to the layer's CPUs.
  Owned CPUs (the default) stay open to every other thread, so while no owner wants the CPU the
  host's other work runs there instead of leaving it idle. The background tier and yield
  threads borrow at SCHED_IDLE or SCHED_BATCH, which a waking owner preempts at once; a fair
  borrower, of any session, first runs out its slice, unless the owners' layer sets a shorter
  slice_us (then EEVDF lets a waking owner preempt it). Fenced CPUs: every other movable thread
  of the host is kept off them (affinity = its original affinity minus the fenced CPUs).
  Per-CPU kernel threads cannot move; they stay and are counted as unmovable. Affinity is the
  control that holds across autogroups: a thread that may not run on a CPU does not compete
  there, whatever its session.
- Latency layers: nice from layer.nice and a custom slice from layer.slice_us (sched_setattr
  on EEVDF kernels that honour it).
- Yield layers: SCHED_IDLE (policy "idle") or SCHED_BATCH + nice (policy "batch").
- Real-time threads keep their policy; SCHED_DEADLINE threads cannot leave their CPUs.
- A thread new to temperd that inherited temperd's treatment from its creator (inheritance.py)
  is held like a treated one: the inherited settings no layer wants for it are given back.

With autogroup on, nice and the yield policies rank threads only within one session; see
autogroup.py for what temperd does about that.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from typing import Any, Callable, Container, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from temperd.backends.native import sched
from temperd.backends.native.given_back import GivenBack
from temperd.backends.native.inheritance import Creators, Parents, uninherited
from temperd.backends.native.membership import KernelThreads, Membership, ThreadKey
from temperd.backends.native.restore_ledger import (AFFINITY, NICE, POLICY, SLICE, THREAD_KINDS, Original,
                                                    RestoreLedger, ThreadRecord, thread_values)
from temperd.backends.result import ApplyResult
from temperd.plan import CONFINED, FENCED, GROUPED, Layer, LayerPlan
from temperd.sources.shape import format_cpulist

log = logging.getLogger(__name__)

_NOTE_NAMES = 6  # thread names listed in a note before "..."
_UNSET = object()  # a kind the record did not hold before this pass's intent

Change = Tuple[ThreadRecord, Dict[str, Any], List[str]]  # record, kind -> value to set, kinds to restore
Stuck = Dict[str, List[str]]  # why threads keep a setting -> their names, for one note each


@dataclass(frozen=True)
class Wanted:
    """What one thread should have; None = its original."""

    layer: Optional[Layer]
    affinity: Optional[FrozenSet[int]] = None
    policy: Optional[int] = None
    nice: Optional[int] = None
    slice_ns: Optional[int] = None

    def value(self, kind: str) -> Any:
        return {AFFINITY: self.affinity, POLICY: self.policy, NICE: self.nice, SLICE: self.slice_ns}[kind]


def exclusive_cpus(plan: LayerPlan, online: FrozenSet[int]) -> Tuple[FrozenSet[int], Optional[str]]:
    """The online CPUs of fenced layers, which every other thread is kept off; none (and why)
    when they would leave no CPU for the rest. Owned CPUs are not among them: others may borrow."""
    exclusive = frozenset(c for l in plan.layers if l.holds_cpus == FENCED for c in l.cpus) & online
    if exclusive and exclusive >= online:
        return frozenset(), (f"fenced CPUs {format_cpulist(exclusive)} cover every online CPU: "
                             "nothing would be left for other threads; not keeping others off them")
    return exclusive, None


def wanted_settings(layer: Optional[Layer], original_affinity: FrozenSet[int], policy_now: int,
                    exclusive: FrozenSet[int]) -> Wanted:
    """What a thread should have as a member of `layer` (None: of no layer), before the kernel's limits."""
    affinity = None
    if layer is not None and layer.kind == CONFINED and layer.cpus:
        affinity = frozenset(layer.cpus)
    elif exclusive and original_affinity & exclusive:
        affinity = original_affinity - exclusive  # may be empty: the caller reports it
    if layer is None or policy_now in sched.REALTIME_POLICIES:
        return Wanted(layer, affinity)
    policy = sched.POLICY_BY_NAME.get(layer.policy)
    if policy == sched.SCHED_OTHER:
        policy = None
    nice = layer.nice if policy != sched.SCHED_IDLE else None  # SCHED_IDLE has one fixed weight
    slice_ns = None
    if layer.slice_us and sched.slice_support().supported:
        slice_ns = int(layer.slice_us) * 1000
    return Wanted(layer, affinity, policy, nice, slice_ns)


def _cpus_text(cpus: Iterable[int]) -> str:
    return ", ".join(str(c) for c in sorted(cpus))


def _refused_note(exclusive: FrozenSet[int]) -> str:
    return (f"kernel thread(s) refused to leave CPUs {_cpus_text(exclusive)} (workqueue workers follow "
            "/sys/devices/virtual/workqueue/cpumask)")


def within_limits(thread: Any, kthread: bool, want: Wanted, policy_now: int, exclusive: FrozenSet[int],
                  result: ApplyResult, stuck: Stuck) -> Wanted:
    """What the kernel lets this thread have of `want`; the rest is noted and counted."""
    layer = want.layer
    excl = _cpus_text(exclusive)
    if want.affinity is not None and not want.affinity:
        # Only allowed on exclusive CPUs: a per-CPU kernel thread, or a thread pinned there by its owner.
        what = (f"per-CPU kernel thread(s) stay on exclusive CPUs {excl}" if kthread
                else f"thread(s) allowed only on exclusive CPUs {excl} are left there")
        stuck.setdefault(what, []).append(thread.comm)
        result.unmovable += 1
        want = Wanted(layer, None, want.policy, want.nice, want.slice_ns)
    if layer is not None and policy_now in sched.REALTIME_POLICIES and (
            layer.nice is not None or layer.slice_us or layer.policy != "other"):
        stuck.setdefault(f"real-time thread(s) keep their {sched.POLICY_NAMES[policy_now]} policy "
                         "(nice, slice and yield policies are for the fair classes)", []).append(thread.comm)
    if policy_now == sched.SCHED_DEADLINE and want.affinity is not None:
        stuck.setdefault(f"SCHED_DEADLINE thread(s) cannot leave exclusive CPUs {excl}", []).append(thread.comm)
        result.unmovable += 1
        want = Wanted(layer, None)
    return want


class ThreadTreatment:
    """Treats threads under one plan; every original goes into the ledger before the first change."""

    def __init__(self, ledger: RestoreLedger, given_back: Optional[GivenBack] = None):
        self.ledger = ledger
        self.given_back = given_back if given_back is not None else GivenBack()
        self.membership: Optional[Membership] = None
        self.exclusive: FrozenSet[int] = frozenset()
        self.is_kernel_thread = KernelThreads()
        self._refused: Set[ThreadKey] = set()  # kernel threads that refused an affinity change
        self._failed: Set[Tuple[ThreadKey, str]] = set()  # (thread, kind) refused under this plan
        self._stuck: Stuck = {}
        # For one treat(): the threads new to temperd, the processes temperd holds threads of (or
        # gave treatment back on lately), the settings recorded as intents and not written yet
        # (thread -> kinds), parent pids.
        self._new: Optional[Container[ThreadKey]] = None
        self._held_pids: Set[int] = set()
        self._intents: Dict[ThreadKey, Set[str]] = {}
        self._before: Dict[ThreadKey, Dict[str, Any]] = {}  # what a record held before this pass's intents
        self._parents = Parents()
        self._creators: Optional[Creators] = None

    def set_plan(self, plan: LayerPlan, changed: bool, result: ApplyResult,
                 added: Optional[Sequence[Layer]] = None) -> None:
        """added: the layers that came, where the plan differs from the one in force only in its
        members (plan.host_wide): the CPUs kept for fenced layers stand, and only these are looked at."""
        if changed:
            self._failed.clear()  # a new plan tries again what the kernel refused under the old one
        self.membership = Membership(plan, self.membership)
        if added is None:
            self.exclusive, error = exclusive_cpus(plan, self.ledger.online_cpus())
            if error:
                result.errors.append(error)
        layers = plan.layers if added is None else added
        support = sched.slice_support()
        if any(l.slice_us for l in layers) and not support.supported:
            result.unsupported.append(f"custom slice: {support.reason}")
        for layer in layers:
            if layer.kind == GROUPED and layer.cpus:
                result.notes.append(f"layer {layer.name}: Grouped on CPUs {format_cpulist(layer.cpus)} has no "
                                    "native form (owned but shared when idle); members keep their affinity")

    def layer_for(self, thread: Any) -> Optional[Layer]:
        return self.membership.layer_for(thread) if self.membership else None

    def clear(self) -> None:
        """Forget the plan and what was learnt under it (after everything was restored)."""
        self.membership = None
        self.exclusive = frozenset()
        self.is_kernel_thread.clear()
        self._refused.clear()
        self._failed.clear()
        self.given_back.clear()

    def treat(self, threads: Iterable, result: ApplyResult, before_write: Callable[[], Optional[bool]],
              new: Optional[Container[ThreadKey]] = None) -> None:
        """Two passes: record originals and intents (before_write saves them), then change. A kill
        between the passes leaves a state file that undoes whatever was already changed; where
        before_write says False (the file could not be written), no change is made.

        new: the threads temperd has not looked at before (None: all of them); only those can
        have inherited temperd's treatment unseen."""
        online = self.ledger.online_cpus()
        changes: List[Change] = []
        stuck: Stuck = {}
        self._stuck = stuck
        self._new = new
        self.given_back.prune()
        self._held_pids = self.ledger.pids() | self.given_back.pids()  # and where it gave treatment back lately
        self._intents, self._before = {}, {}
        self._parents = Parents()
        self._creators = Creators(self.ledger, online, self.given_back)
        for thread in threads:
            try:
                change = self._plan_thread(thread, online, result, stuck)
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
            if change is not None:
                changes.append(change)
        if changes and before_write() is False:
            self._withdraw(changes)
            changes = []
        for rec, sets, restores in changes:
            self._execute(rec, sets, restores, online, result)
        for why, names in sorted(stuck.items()):
            shown = ", ".join(sorted(names)[:_NOTE_NAMES]) + (", ..." if len(names) > _NOTE_NAMES else "")
            result.notes.append(f"{len(names)} {why}: {shown}")

    def restore_departed(self, present: Container[ThreadKey], result: ApplyResult) -> None:
        """Threads temperd holds that are not among the host's threads any more: restore the living."""
        online = self.ledger.online_cpus()
        for rec in list(self.ledger.records.values()):
            if rec.key not in present:
                result.merge(self.ledger.restore(rec, online=online))

    # ---- one thread ---------------------------------------------------------------------------

    def _plan_thread(self, thread: Any, online: FrozenSet[int], result: ApplyResult,
                     stuck: Stuck) -> Optional[Change]:
        """Read the thread, decide what it should have, and record originals and intents."""
        key = (thread.tid, thread.start_time)
        rec = self.ledger.get(*key)
        layer = self.layer_for(thread)
        if rec is None and layer is None and not self.exclusive and not self._may_have_inherited(thread):
            return None  # nothing to do, nothing to undo: no syscall
        kthread = self.is_kernel_thread(thread)
        if kthread and layer is None and key in self._refused:
            if self.exclusive:
                stuck.setdefault(_refused_note(self.exclusive), []).append(thread.comm)
                result.unmovable += 1
            return None
        affinity, state = sched.get_affinity(thread.tid), sched.get_sched(thread.tid)
        current = thread_values(affinity, state)
        inherited: Dict[str, Any] = {}
        if rec is not None:
            original = rec.original
        else:
            original = Original.of(affinity, state)
            if not kthread and self._is_new(key):
                # Kernel threads are not created with their creator's settings (kthreadd's included).
                original, inherited = uninherited(self.ledger, thread, original, current, online, self._parents,
                                                  self._intents, self._creators)
        want = wanted_settings(layer, frozenset(original.affinity), state.policy, self.exclusive)
        want = within_limits(thread, kthread, want, state.policy, self.exclusive, result, stuck)
        if rec is None:
            if not inherited and not any(want.value(k) is not None for k in THREAD_KINDS):
                return None
            rec = self.ledger.record(thread.tid, thread.pid, thread.start_time, thread.comm, original,
                                     since=thread.start_time if inherited else None)
            rec.applied.update(inherited)  # temperd's treatment, come by inheritance: held (and undone) as such
            self._held_pids.add(thread.pid)
            if self._creators is not None:
                self._creators.add(rec)  # a creator of threads later in this pass
        rec.comm = thread.comm
        return self._changes(rec, want, current, online, result)

    def _is_new(self, key: ThreadKey) -> bool:
        return self._new is None or key in self._new

    def _may_have_inherited(self, thread: Any) -> bool:
        """Whether a thread new to temperd may carry treatment from a creator temperd held: one
        in its own process or in its parent process (kernel threads never do)."""
        if not self._held_pids or not self._is_new((thread.tid, thread.start_time)):
            return False
        if thread.pid not in self._held_pids and self._parents(thread.pid) not in self._held_pids:
            return False
        return not self.is_kernel_thread(thread)

    def _changes(self, rec: ThreadRecord, want: Wanted, current: Dict[str, Any], online: FrozenSet[int],
                 result: ApplyResult) -> Optional[Change]:
        """What to set and what to restore on a held thread; drift is found (and left) here."""
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
                elif value != rec.applied[kind] and not (
                        kind == AFFINITY and frozenset(value) == frozenset(rec.applied[kind])):
                    sets[kind] = value
            elif value is not None:
                sets[kind] = value
        for kind, value in sets.items():
            if kind in rec.applied and self.ledger.on_give_back is not None:
                self.ledger.on_give_back(rec, kind)  # replaced: threads made before may carry it
            self._before.setdefault(rec.key, {}).setdefault(kind, rec.applied.get(kind, _UNSET))
            rec.applied[kind] = tuple(sorted(value)) if kind == AFFINITY else value  # intent, before the change
        if sets:
            self._intents.setdefault(rec.key, set()).update(sets)
        if not sets and not restores:
            if not rec.applied and not rec.drifted:
                self.ledger.forget(rec)
            return None
        return rec, sets, restores

    def _withdraw(self, changes: List[Change]) -> None:
        """The state file could not record these changes: none is made, and each record holds
        what it held before this pass (a record made for them is dropped)."""
        for rec, sets, _ in changes:
            before = self._before.get(rec.key, {})
            for kind in sets:
                value = before.get(kind, _UNSET)
                if value is _UNSET:
                    rec.applied.pop(kind, None)
                else:
                    rec.applied[kind] = value
            if not rec.applied and not rec.drifted:
                self.ledger.forget(rec)

    def _execute(self, rec: ThreadRecord, sets: Dict[str, Any], restores: List[str],
                 online: FrozenSet[int], result: ApplyResult) -> None:
        try:
            if restores:
                result.merge(self.ledger.restore(rec, restores, online=online))
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

    def _do(self, rec: ThreadRecord, kinds: List[str], result: ApplyResult, action: Callable[[], None]) -> None:
        try:
            action()
        except OSError as exc:
            if sched.is_gone(exc):
                raise
            for kind in kinds:
                rec.applied.pop(kind, None)  # nothing changed: nothing to restore
            if kinds == [AFFINITY] and exc.errno == errno.EINVAL and self.is_kernel_thread(rec):
                # Kernel threads with PF_NO_SETAFFINITY (workqueue workers, per-CPU threads) refuse.
                self._refused.add(rec.key)
                result.unmovable += 1
                self._stuck.setdefault(_refused_note(self.exclusive), []).append(rec.comm)
                return
            for kind in kinds:
                result.bump(result.failed, kind)
                self._failed.add((rec.key, kind))  # reported once; not retried until the plan changes
            result.errors.append(f"tid {rec.tid} ({rec.comm}): setting {'/'.join(kinds)}: {exc.strerror or exc}")
            return
        for kind in kinds:
            result.bump(result.applied, kind)
