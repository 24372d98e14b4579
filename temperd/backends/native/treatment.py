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
from temperd.backends.native.inheritance import Creators, Parents, uninherited
from temperd.backends.native.membership import KernelThreads, Membership, ThreadKey
from temperd.backends.native.held import Pending, why
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.thread_settings import (AFFINITY, NICE, POLICY, SLICE, THREAD_KINDS, ThreadRecord,
                                                     thread_values)
from temperd.backends.result import ApplyResult
from temperd.plan import CONFINED, FENCED, GROUPED, Layer, LayerPlan
from temperd.sources.shape import format_cpulist

log = logging.getLogger(__name__)

_NOTE_NAMES = 6  # thread names listed in a note before "..."

Change = Tuple[ThreadRecord, List[Pending], List[str]]  # record, the writes it intends, kinds to restore
Stuck = Dict[str, List[str]]  # why threads keep a setting -> their names, for one note each
_FIELDS = {AFFINITY: "affinity", POLICY: "policy", NICE: "nice", SLICE: "slice_ns"}  # Wanted's, by kind


@dataclass(frozen=True)
class Wanted:
    """What one thread should have; None = its original."""

    layer: Optional[Layer]
    affinity: Optional[FrozenSet[int]] = None
    policy: Optional[int] = None
    nice: Optional[int] = None
    slice_ns: Optional[int] = None

    def value(self, kind: str) -> Any:
        return getattr(self, _FIELDS[kind])

    def changes_any(self) -> bool:
        """Whether any setting is wanted other than the thread's original."""
        return not (self.affinity is None and self.policy is None and self.nice is None and self.slice_ns is None)


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
    if want.affinity is not None and not want.affinity:
        # Only allowed on exclusive CPUs: a per-CPU kernel thread, or a thread pinned there by its owner.
        excl = _cpus_text(exclusive)
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
        stuck.setdefault(f"SCHED_DEADLINE thread(s) cannot leave exclusive CPUs {_cpus_text(exclusive)}",
                         []).append(thread.comm)
        result.unmovable += 1
        want = Wanted(layer, None)
    return want


class ThreadTreatment:
    """Treats threads under one plan; every original goes into the ledger before the first change."""

    def __init__(self, ledger: RestoreLedger):
        self.ledger = ledger
        ledger.on_refused = self._refused_write
        self.membership: Optional[Membership] = None
        self.exclusive: FrozenSet[int] = frozenset()
        self.is_kernel_thread = KernelThreads()
        self._refused: Set[ThreadKey] = set()  # kernel threads that refused an affinity change
        self._failed: Set[Tuple[ThreadKey, str]] = set()  # (thread, kind) refused under this plan
        self._stuck: Stuck = {}
        # For one treat(): the threads new to temperd, the processes temperd gave treatment back
        # on lately or held threads of in this pass that the ledger no longer holds (with the
        # ledger's own: _held_pid), the settings recorded as intents and not written yet
        # (thread -> kinds), parent pids, the threads that may have created a new one.
        self._new: Optional[Container[ThreadKey]] = None
        self._held_pids: Set[int] = set()
        self._intents: Dict[ThreadKey, Set[str]] = {}
        self._parents = Parents()
        self._creators = Creators(ledger, frozenset(), ledger.given_back)

    def set_plan(self, plan: LayerPlan, changed: bool, result: ApplyResult,
                 added: Optional[Sequence[Layer]] = None) -> None:
        """added: the layers that came, where the plan differs from the one in force only in its
        members (plan.host_wide): the CPUs kept for fenced layers stand, and only these are looked at."""
        if changed:
            self._failed.clear()  # a new plan tries again what the kernel refused under the old one
        self.membership = Membership(plan, self.membership)
        if added is None:
            self.exclusive, error = exclusive_cpus(plan, self.ledger.now_online())
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
        self._creators = Creators(self.ledger, frozenset(), self.ledger.given_back)
        self._refused.clear()
        self._failed.clear()
        self.ledger.given_back.clear()

    def treat(self, threads: Iterable, result: ApplyResult, before_write: Callable[[], Optional[bool]],
              new: Optional[Container[ThreadKey]] = None) -> None:
        """Two passes: record originals and intents (before_write saves them), then change. A kill
        between the passes leaves a state file that undoes whatever was already changed; where
        before_write says False (the file could not be written), no change is made.

        new: the threads temperd has not looked at before (None: all of them); only those can
        have inherited temperd's treatment unseen."""
        online = self.ledger.now_online()
        changes: List[Change] = []
        self._stuck = stuck = {}
        self._new = new
        self.ledger.given_back.prune()
        self._held_pids = self.ledger.given_back.pids()  # the ledger's own pids are asked of it (_held_pid)
        self._intents = {}
        self._parents = Parents()
        self._creators.follow(online)
        for thread in threads:
            try:
                change = self._plan_thread(thread, online, result)
            except OSError as exc:
                if not sched.is_gone(exc):
                    result.bump(result.failed, "read")
                    result.errors.append(f"tid {thread.tid} ({thread.comm}): reading settings: {exc.strerror or exc}")
                    continue
                result.gone += 1
                rec = self.ledger.get(thread.tid, thread.start_time)
                if rec is not None:
                    self._held_pids.add(rec.pid)  # held in this pass still
                    self.ledger.forget(rec)
                continue
            if change is not None:
                changes.append(change)
        if changes and before_write() is False:
            self._withdraw(changes, result)
            changes = []
        for rec, pending, restores in changes:
            if restores:
                rec.restore_keys(restores, result)
            if not rec.ended:
                rec.carry_out(pending, result)
            self.ledger.settle(rec, result)
        for reason, names in sorted(stuck.items()):
            shown = ", ".join(sorted(names)[:_NOTE_NAMES]) + (", ..." if len(names) > _NOTE_NAMES else "")
            result.notes.append(f"{len(names)} {reason}: {shown}")

    def restore_departed(self, present: Container[ThreadKey], result: ApplyResult) -> None:
        """Threads temperd holds that are not among the host's threads any more: restore the living."""
        online = self.ledger.now_online()
        for rec in list(self.ledger.records.values()):
            if rec.key not in present:
                result.merge(self.ledger.restore(rec, online=online))

    # ---- one thread ---------------------------------------------------------------------------

    def _plan_thread(self, thread: Any, online: FrozenSet[int], result: ApplyResult) -> Optional[Change]:
        """Read the thread, decide what it should have, and record originals and intents."""
        key = (thread.tid, thread.start_time)
        rec = self.ledger.get(*key)
        layer = self.layer_for(thread)
        if rec is None and layer is None and not self.exclusive and not self._may_have_inherited(thread):
            return None  # nothing to do, nothing to undo: no syscall
        kthread = self.is_kernel_thread(thread)
        if kthread and layer is None and key in self._refused:
            if self.exclusive:
                self._stuck.setdefault(_refused_note(self.exclusive), []).append(thread.comm)
                result.unmovable += 1
            return None
        affinity, state = sched.get_affinity(thread.tid), sched.get_sched(thread.tid)
        current = thread_values(affinity, state)
        originals: Dict[str, Any] = rec.originals if rec is not None else {}
        inherited: Dict[str, Any] = {}
        if rec is None and not kthread and self._is_new(key):
            # Kernel threads are not created with their creator's settings (kthreadd's included).
            originals, inherited = uninherited(self._creators, thread, current, online, self._parents,
                                               self._intents)
        want = wanted_settings(layer, frozenset(originals.get(AFFINITY, affinity)), state.policy, self.exclusive)
        want = within_limits(thread, kthread, want, state.policy, self.exclusive, result, self._stuck)
        if rec is None:
            if not inherited and not want.changes_any():
                return None
            rec = self.ledger.record(thread.tid, thread.pid, thread.start_time, thread.comm,
                                     since=thread.start_time if inherited else None)
            rec.originals.update(originals)  # temperd's treatment, come by inheritance: held (and undone) as such
            rec.written.update(inherited)
            self._creators.add(rec)  # a creator of threads later in this pass
        rec.comm = thread.comm
        return self._changes(rec, want, current, result)

    def _is_new(self, key: ThreadKey) -> bool:
        return self._new is None or key in self._new

    def _may_have_inherited(self, thread: Any) -> bool:
        """Whether a thread new to temperd may carry treatment from a creator temperd held: one
        in its own process or in its parent process (kernel threads never do)."""
        if not (self._held_pids or self.ledger.holds_any()) or not self._is_new((thread.tid, thread.start_time)):
            return False
        if not self._held_pid(thread.pid) and not self._held_pid(self._parents(thread.pid)):
            return False
        return not self.is_kernel_thread(thread)

    def _held_pid(self, pid: Optional[int]) -> bool:
        """Whether temperd holds threads of `pid` (or held some in this pass), or gave treatment
        back on one lately."""
        return pid in self._held_pids or self.ledger.holds_pid(pid)

    def _changes(self, rec: ThreadRecord, want: Wanted, current: Dict[str, Any],
                 result: ApplyResult) -> Optional[Change]:
        """What to write and what to restore on a held thread (the ledger's intents, recorded
        here; drift is found and left by the ledger)."""
        desired: Dict[str, Any] = {}
        restores: List[str] = []
        key = rec.key
        failed = self._failed
        for kind in THREAD_KINDS:
            if failed and (key, kind) in failed:
                continue
            value = want.value(kind)
            if value is None:
                if kind in rec.written:
                    restores.append(kind)
            elif kind == AFFINITY:
                desired[kind] = tuple(sorted(value))
            else:
                desired[kind] = (value, 0) if kind == POLICY else value
        pending = rec.intend(desired, result, current)
        if pending:
            self._intents.setdefault(key, set()).update(kind for kind, _, _ in pending)
        if not pending and not restores:
            self._held_pids.add(rec.pid)  # held in this pass, whether or not settle() forgets it
            self.ledger.settle(rec, result)
            return None
        return rec, pending, restores

    def _withdraw(self, changes: List[Change], result: ApplyResult) -> None:
        """The state file could not record these changes: none is made, and each record holds
        what it held before this pass (a record made for them is dropped)."""
        for rec, pending, _ in changes:
            rec.withdraw(pending)
            self.ledger.settle(rec, result)

    def _refused_write(self, rec: ThreadRecord, kinds: List[str], exc: BaseException, result: ApplyResult) -> None:
        """The kernel refused writes to a thread (the ledger took them back): said once, not
        retried until the plan changes."""
        if kinds == [AFFINITY] and getattr(exc, "errno", None) == errno.EINVAL and self.is_kernel_thread(rec):
            # Kernel threads with PF_NO_SETAFFINITY (workqueue workers, per-CPU threads) refuse.
            self._refused.add(rec.key)
            result.unmovable += 1
            self._stuck.setdefault(_refused_note(self.exclusive), []).append(rec.comm)
            return
        for kind in kinds:
            result.bump(result.failed, kind)
            self._failed.add((rec.key, kind))  # reported once; not retried until the plan changes
        result.errors.append(f"tid {rec.tid} ({rec.comm}): setting {'/'.join(kinds)}: {why(exc)}")
