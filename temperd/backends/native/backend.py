"""The native backend: a LayerPlan carried out with kernel-native controls.

- per-thread affinity, policy, nice and slice for the layers' members, and every other thread
  kept off the exclusive CPUs (treatment.py, with membership.py saying who is in which layer);
- the nice of whole autogroups whose threads all yield or are all favoured (autogroup.py), and
  the yield threads of sessions that mix them with others moved into an idle cpu cgroup, where
  the cpu controller is on a cgroup v1 hierarchy (idle_cgroup.py);
- idle_resume_us: the PM QoS resume bound on the layers' own CPUs (pmqos.py);
- tier weights: cgroup v2 cpu.weight through systemd or the cgroupfs, where the host allows
  (cgroup_weight.py).

Every original is recorded before the first change: the threads' in the restore ledger
(restore_ledger.py), the host settings' by held.py, all in one state file. Threads that leave a
layer get their originals back, stop() restores everything, and recover() undoes what a killed
predecessor left behind. Threads and processes created by a treated thread inherit its treatment;
temperd gives them their creator's original wherever no layer wants the setting, including the
ones it never saw while running (inheritance.py).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from typing import Any, Callable, Container, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set

from temperd.backends.native.autogroup import Autogroups, Groups, autogroup_enabled, mixed_note
from temperd.backends.native.cgroup_weight import CgroupWeights
from temperd.backends.native.held import HeldSettings
from temperd.backends.native.idle_cgroup import IDLE_CGROUP, IdleCgroup, cgroup_name
from temperd.backends.native.inheritance import restore_inherited
from temperd.backends.native.membership import ThreadKey, scan_threads
from temperd.backends.native.pmqos import PmQos, resume_bounds
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.state_file import StateFileError
from temperd.backends.result import ApplyResult
from temperd.backends.native.treatment import ThreadTreatment
from temperd.backends.native.universe import Universe
from temperd.backends.status import NATIVE, BackendStatus
from temperd.config.daemon_config import CONFIG_SPEC
from temperd.plan import YIELD, LayerPlan, carry_members, layer_changes, moved_members, weight_changes

__all__ = ["DEFAULT_STATE_DIR", "NativeBackend", "scan_threads"]

DEFAULT_STATE_DIR = CONFIG_SPEC.default_of("state_dir")

log = logging.getLogger(__name__)


class NativeBackend:
    name = NATIVE

    def __init__(self, state_dir: str = DEFAULT_STATE_DIR, *, pmqos: Optional[PmQos] = None,
                 weights: Optional[CgroupWeights] = None, pmqos_open_layers: bool = False,
                 autogroup: bool = True, idle_cgroup: Optional[IdleCgroup] = None,
                 online_cpus: Optional[Callable[[], FrozenSet[int]]] = None):
        self.ledger = RestoreLedger(state_dir, online_cpus=online_cpus)  # online_cpus: the daemon's shape's
        self.treatment = ThreadTreatment(self.ledger)
        self.pmqos = pmqos if pmqos is not None else PmQos()
        self.weights = weights if weights is not None else CgroupWeights()
        self.autogroups = Autogroups()
        self.idle_cgroup = idle_cgroup if idle_cgroup is not None else IdleCgroup(
            cgroup_name(state_dir, DEFAULT_STATE_DIR))
        self.pmqos_open_layers = pmqos_open_layers  # bound every CPU for Open layers (temperd.toml has no key)
        self.autogroup = autogroup and autogroup_enabled()
        self.plan: Optional[LayerPlan] = None
        self._drift: Counter = Counter()  # drift_counts: each setting counted once, when first found
        self._universe = Universe()  # the host threads last seen
        self._saved_records = 0  # records in the ledger at the last save
        self._recovered = False
        self.on_carrier_change: Optional[Callable[[str], None]] = None  # the interface's; never called: it always carries

    def _held(self) -> List[HeldSettings]:
        """The host settings held, in the order they are restored (the idle cgroup before the
        threads' own settings, the rest after); each kind is its state-file section."""
        return [self.idle_cgroup, self.autogroups, self.pmqos, self.weights]

    @staticmethod
    def _restore_held(result: ApplyResult, held_settings: List[HeldSettings]) -> int:
        """Restore these held settings; how many had drifted (left as found)."""
        drifted = 0
        for held in held_settings:
            drifted += len(held.drifted)
            part = held.restore_all()
            drifted += sum(part.drift.values())
            result.merge(part)
        return drifted

    # ---- public API --------------------------------------------------------------------------

    def apply(self, plan: LayerPlan, threads: Iterable, changed: Optional[Iterable] = None) -> ApplyResult:
        """The one way a plan is carried out. `threads`: the host's whole thread list (or a tid ->
        thread mapping). `changed`: the threads new since the last apply (a delta); then the plan
        in force treats only those, and one that differs from it only in its members and weights
        (plan.host_wide) those and the threads whose layer changed: a fork storm costs per fork,
        not per thread or workload of the host. Anything else, or `changed` None: the whole host."""
        if changed is not None and self.plan is not None and self._recovered:
            if plan is self.plan and self.treatment.membership is not None:
                self.treatment.membership.forget_processes()  # their pids may name other processes now
                return self._treat_some(list(changed), ApplyResult())
            moved = moved_members(self.plan, plan, *carry_members(self.plan, plan))
            if moved is not None:
                return self._apply_members(plan, threads, changed, moved)
        result = ApplyResult()
        if not self._recovered:
            result.merge(self.recover())
        self.treatment.set_plan(plan, plan != self.plan, result)
        self.plan = plan
        threads = list(threads.values()) if isinstance(threads, Mapping) else list(threads)
        seen, self._universe = self._universe, Universe(threads)
        new = {key for key in self._universe if key not in seen}
        self.treatment.is_kernel_thread.keep_only(self._universe)
        save = functools.partial(self._save, result)  # the state file, before each round of writes
        self.treatment.treat(threads, result, save, new)
        self.treatment.restore_departed(self._universe, result)
        self._apply_autogroups(result, reread=True)
        bounds, notes = resume_bounds(plan, self.ledger.online_cpus(), self.pmqos_open_layers)
        result.notes.extend(notes)
        result.merge(self.pmqos.apply(bounds, save))
        result.merge(self.weights.apply(plan.cgroup_weights, save))
        return self._finish(result)

    def _apply_members(self, plan: LayerPlan, threads: Iterable, changed: Iterable,
                       moved: FrozenSet[int]) -> ApplyResult:
        """A plan equal to the one in force beyond its members (plan.host_wide): the new threads
        and the moved ones are treated under it."""
        result = ApplyResult()
        if plan.cgroup_weights != self.plan.cgroup_weights:  # a workload came, went or changed tier: only those read
            result.merge(self.weights.apply(plan.cgroup_weights, functools.partial(self._save, result), verify=False,
                                            changes=weight_changes(self.plan, plan)))
        self.treatment.set_plan(plan, False, result, layer_changes(self.plan, plan)[1])
        self.plan = plan
        touched = {thread.tid: thread for thread in changed}
        if moved:
            by_tid = threads if isinstance(threads, Mapping) else {t.tid: t for t in threads}
            for tid in moved:
                thread = by_tid.get(tid)
                if thread is not None:
                    touched.setdefault(tid, thread)
        return self._treat_some(list(touched.values()), result)

    def on_new_threads(self, threads: Iterable) -> ApplyResult:
        """Threads the inventory just saw: apply()'s delta under the plan in force."""
        return self.apply(self.plan, (), threads) if self.plan is not None else ApplyResult()

    def _treat_some(self, threads: List, result: ApplyResult) -> ApplyResult:
        """These threads treated under the plan in force; the autogroup pass only where one of
        them changes a session's mix."""
        new, renamed = set(), set()
        for thread in threads:
            key = (thread.tid, thread.start_time)
            seen = self._universe.get(key)
            if seen is None:
                new.add(key)
            elif seen.comm != thread.comm:
                renamed.add(key)
            self._universe.put(thread)
        self.treatment.treat(threads, result, functools.partial(self._save, result), new)
        # A thread renamed since it was last seen here was named by a rename event of the inventory's,
        # which would have seen its exit and a reuse of its id first: its start time is as good as read.
        fresh = new | renamed
        groups: Groups = {}  # the batch's processes' autogroups, read once
        if self.autogroup and self.treatment.membership is not None and self.autogroups.cache.changes_mix(
                threads, self.treatment.layer_for, self.treatment.is_kernel_thread, groups) \
                and not self._idle_cgroup_only(threads, fresh, result, groups):
            # A new thread or process changed a session's mix (or a recheck is due): the whole pass,
            # the batch's processes read again.
            self._apply_autogroups(result, reread=False, touched={thread.pid for thread in threads}, fresh=fresh)
        # The state file was written before the first change of this call (treat's before_write);
        # written again only where the writes did not go as recorded or records came or went
        # without a write (each write appends to the file, and events come ten or more batches a second).
        settled = (result.failed or result.restored or result.gone or result.drift
                   or len(self.ledger.records) != self._saved_records)
        return self._finish(result, save=bool(settled))

    def _idle_cgroup_only(self, threads: List, fresh: Set[ThreadKey], result: ApplyResult,
                          groups: Groups) -> bool:
        """Where this batch leaves every session's mix as it was (autogroup.SessionCache.count),
        the autogroups' nices stay: only the batch's threads go into the idle cgroup or out of
        it, and the whole autogroup pass is not made. False where it must be."""
        if not self.idle_cgroup.supported:
            return False  # the whole pass says which sessions stay mixed, and why
        counted = self.autogroups.cache.count(threads, self.treatment.layer_for, self.treatment.is_kernel_thread, groups)
        if counted is None:
            return False
        yielding = [thread for thread, kind, mixed in counted if kind == YIELD and mixed]
        others = [thread for thread, kind, mixed in counted if not (kind == YIELD and mixed)]
        universe = self._universe
        result.merge(self.idle_cgroup.add(
            yielding, others, lambda key: universe[key].pid if key in universe else None, fresh=fresh))
        return True

    def forget_threads(self, tids: Iterable[int], live: Optional[Mapping[int, Any]] = None) -> None:
        """Ended threads, between whole applies: out of the host's picture, so that the passes over
        it (autogroups) stay the size of the host, out of the sessions' counts, and out of the
        ledger (their settings ended with them) and the idle cgroup's hold, so that neither grows
        with every thread a fork storm made nor reads an ended one again. Called after the apply of their batch, so that a
        thread one of them created in that batch was treated with its creator still on record.
        live: tid -> the thread alive now (a reused id names a new thread, which stays)."""
        dead = self._universe.ended(tids, live or {})
        if not dead:
            return
        self.autogroups.cache.forget(dead)
        for key in dead:
            self._universe.drop(key)
            self.idle_cgroup.forget(key)
            rec = self.ledger.get(*key)
            if rec is not None:
                self.ledger.forget(rec)

    def stop(self) -> ApplyResult:
        """Restore everything temperd changed and remove the state file.

        Threads keep being created while their creators are restored: threads that inherited
        temperd's treatment and were never handed to this backend are found and restored after
        their creators (inheritance.restore_inherited). The idle cgroup is left first: a creator
        held there can be preempted by anything in the middle of a fork() and hand its treatment
        to a child only after the last sweep for such threads."""
        result = ApplyResult()
        drifted = self._restore_held(result, self._held()[:1])
        drifted += sum(len(rec.drifted) for rec in self.ledger.records.values())
        creators = self.ledger.copy()
        part = self.ledger.restore_all()
        drifted += sum(part.drift.values())
        result.merge(part)
        # Every thread of the creators' families is looked at again, the ones already seen
        # included: between whole applies the event path treats only new and moved threads, and
        # one it saw before its creator's treatment landed may hold it now.
        result.merge(restore_inherited(self.ledger, creators, given_back=self.ledger.given_back))
        drifted += self._restore_held(result, self._held()[1:])
        if drifted:
            result.notes.append(f"{drifted} setting(s) changed by someone else after temperd set them were left as found")
        self.ledger.clear()
        self._universe.clear()
        self.treatment.clear()
        self.plan = None
        return self._finish(result)

    def recover(self) -> ApplyResult:
        """At start: undo what a previous run left in the state file (threads still alive: same tid
        and start time, and the threads and processes they created since, which inherited
        temperd's treatment), and remove the temp files of state-file writes it never finished."""
        result = ApplyResult()
        if self.ledger.records or any(held.written for held in self._held()):
            result.notes.append("recover: this backend already holds changes; the state file is its own")
            return result
        self._recovered = True
        self._recover_from_state_file(result)
        left = self.idle_cgroup.empty() if self.idle_cgroup.supported else 0
        if left:  # threads an earlier run's moved threads created, or a run that left no state file
            result.bump(result.restored, IDLE_CGROUP, left)
            result.notes.append(f"recover: {left} thread(s) left in the idle cgroup moved back to the root")
        return result

    def _recover_from_state_file(self, result: ApplyResult) -> None:
        previous = RestoreLedger(self.ledger.state_dir, os.path.basename(self.ledger.path), self.ledger.online_cpus)
        removed = previous.file.remove_stale_temp_files()
        if removed:
            result.notes.append(f"removed {len(removed)} unfinished state-file write(s) of an earlier run: "
                                + ", ".join(removed))
        try:
            found = previous.load()
        except StateFileError as exc:
            result.errors.append(previous.set_aside(exc))
            return
        if not found:
            return
        idle, rest = self._held()[:1], self._held()[1:]  # the idle cgroup first, as in stop()
        self._recover_held(result, previous, idle)
        creators = previous.copy()
        result.merge(previous.restore_all())
        result.merge(restore_inherited(previous, creators))
        self._recover_held(result, previous, rest)
        if previous.skipped:
            result.errors.append(f"{previous.path}: {len(previous.skipped)} malformed entries skipped")
        result.notes.append(f"recovered from {previous.path}: {result.summary()}")
        previous.file.delete()

    @staticmethod
    def _recover_held(result: ApplyResult, previous: RestoreLedger, held_settings: List[HeldSettings]) -> None:
        for held in held_settings:
            section = previous.extras.get(held.kind) or {}
            if section:
                try:
                    held.adopt_state(section)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    # What was adopted before the bad entry is restored; the rest of the section is lost.
                    result.errors.append(f"{previous.path}: section {held.kind}: malformed entry ({exc}); "
                                         "the entries after it are not restored")
                    log.error("%s", result.errors[-1])
                result.merge(held.restore_all())

    def status(self) -> BackendStatus:
        return BackendStatus(carried_by=NATIVE, drift=self.drift_counts)

    def layer_cpus(self) -> None:
        return None  # the plan's CPU numbers are the ones pinned

    def retry(self) -> bool:
        return False  # nothing is ever given up

    @property
    def drift_counts(self) -> Dict[str, int]:
        """Settings found changed by someone else since this backend started, by kind."""
        return dict(self._drift)

    # ---- steps ---------------------------------------------------------------------------------

    def _apply_autogroups(self, result: ApplyResult, reread: bool, touched: Optional[Set[int]] = None,
                          fresh: Container[ThreadKey] = ()) -> None:
        """reread: every process's autogroup read anew (a whole apply); else only the few that
        can have changed (autogroup.SessionCache; touched: the batch's processes): a new process
        costs file reads for itself. fresh: the threads the inventory read in this pass."""
        if self.autogroup and self.treatment.membership is not None:
            save = functools.partial(self._save, result)
            result.merge(self.autogroups.apply(
                self._universe.values(), self.treatment.layer_for, self.treatment.is_kernel_thread,
                save, reread=reread, touched=touched))
            mixed = self.autogroups.mixed
            if not self.idle_cgroup.supported:
                result.notes.extend(mixed_note(name, session, self.idle_cgroup.why_not)
                                    for name, session in mixed.items())
            result.merge(self.idle_cgroup.apply(
                [t for session in mixed.values() for t in session.yielding], verify=reread, fresh=fresh))

    def _finish(self, result: ApplyResult, save: bool = True) -> ApplyResult:
        if save:
            self._save(result)
        result.threads_treated = self.ledger.held()
        self._drift.update(result.drift)
        return result

    def _save(self, result: ApplyResult) -> bool:
        """Write the state file: the threads' records and each held setting's section. False
        where it cannot be written: the caller makes none of the changes it was to record."""
        self._saved_records = len(self.ledger.records)
        for held in self._held():
            self.ledger.extras[held.kind] = held.state()
        failure = self.ledger.try_save()
        if failure is not None and "state_file" not in result.failed:  # counted once per call
            result.bump(result.failed, "state_file")
            result.errors.append(failure)
        return failure is None
