"""Held settings: the one way temperd changes a setting and gives it back.

A Setting names values by key (a CPU's PM QoS bound, a cgroup's cpu.weight, an autogroup's nice,
a thread's cpu cgroup; a thread's affinity, policy, nice and slice: thread_settings.ThreadRecord)
and reads and writes them. HeldSettings holds such values for temperd (what each call did: an
ApplyResult, counted under the setting's kind). Its rules are the ledger's:

- the original is recorded before the first write, and the value about to be written with it,
  so a state file saved in between (`before_write`) undoes the write even if temperd is killed;
- drift: a value re-read differs from what temperd wrote, so someone else changed it. It is
  counted once and is theirs from then on: neither written again nor restored (only its
  `drifted` entry is kept, until the setting is gone or everything is restored);
- restore puts the original back, unless the value drifted or the setting vanished (read()
  says None: the CPU, cgroup, process or thread is gone; nothing is left to restore);
- adopt takes over what a killed predecessor held, from its state file, so restore_all()
  undoes it.

A Setting may write several keys at once (`together`: a thread's policy, nice and slice are one
sched_setattr) and compare a written value with the one read back (`same`: an affinity within
the online CPUs, a slice as the kernel clamps it).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Container, Dict, Generic, List, Mapping, Optional, Sequence, Tuple, TypeVar

from temperd.backends.native.sched import is_gone
from temperd.backends.result import ApplyResult

K = TypeVar("K")
V = TypeVar("V")
Pending = Tuple[Any, Any, Any]  # (key, value to write, the value written before it, or None)

log = logging.getLogger(__name__)


class Refused(Exception):
    """A read or write the setting's owner refused (e.g. systemctl failed); str() says why."""


class Setting(Generic[K, V]):
    """One kind of setting: how to read and write the value behind a key."""

    kind = "setting"  # what results count it as, and its state-file section: pmqos, cpu_weight, autogroup

    def read(self, key: K) -> Optional[V]:
        """The current value; None when the setting is gone. Raises OSError or Refused when it
        is there but cannot be read."""
        raise NotImplementedError

    def write(self, key: K, value: V) -> None:
        """Raises OSError (ENOENT, ESRCH: gone) or Refused."""
        raise NotImplementedError

    def write_many(self, values: Mapping[K, V]) -> None:
        """One group of `together`: written at once, or not at all."""
        for key, value in values.items():
            self.write(key, value)

    def together(self, pending: Sequence[Pending]) -> List[Sequence[Pending]]:
        """The writes (key first) grouped as write_many makes them: one each by default."""
        return [(item,) for item in pending]

    def same(self, key: K, written: V, current: V) -> bool:
        """Whether `current`, as read, is what a write of `written` leaves."""
        return written == current

    def kept(self, key: K, current: V) -> V:
        """A value read, as the ledger keeps it (an original, a drifted value)."""
        return current

    def where(self, key: K) -> str:
        """The setting as messages name it, e.g. a sysfs path or 'autogroup /autogroup-14 (pid 812)'."""
        return str(key)

    def shown(self, value: V) -> str:
        return repr(value)

    def key_text(self, key: K) -> str:
        """The key in the state file (JSON object keys are text)."""
        return str(key)

    def key_from_text(self, text: str) -> K:
        return text  # type: ignore[return-value]


def why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


class HeldSettings(Generic[K, V]):
    """The values of one Setting that temperd holds: originals, what it wrote, what drifted."""

    def __init__(self, setting: Setting[K, V]):
        self.setting = setting
        self.originals: Dict[K, V] = {}  # before temperd's first write
        self.written: Dict[K, V] = {}  # temperd's last write (recorded just before it is made)
        self.drifted: Dict[K, V] = {}  # what someone else wrote over temperd's value: theirs

    @property
    def kind(self) -> str:
        return self.setting.kind

    def count_as(self, key: K) -> str:
        """The kind a result counts this key under."""
        return self.setting.kind

    def hold(self, desired: Mapping[K, V], before_write: Optional[Callable[[], Optional[bool]]] = None,
             trusted: Container[K] = (), read: Optional[Mapping[K, Optional[V]]] = None) -> ApplyResult:
        """Make `desired` hold, and restore what is held but no longer desired.

        before_write is called once, after the originals and intended values are recorded and
        before the first write (the caller saves its state file there; False: it could not, and
        nothing is written). trusted: keys whose value
        temperd wrote is taken as current without reading it (drift is found at the next call
        that does not trust them). read: values the caller has just read, not read again."""
        result = ApplyResult()
        self.restore_keys(sorted(set(self.written) - set(desired)), result)
        self._hold_more({k: v for k, v in desired.items()
                         if not (k in trusted and self.written.get(k) == v)}, result, before_write, read or {})
        return result

    def _hold_more(self, desired: Mapping[K, V], result: ApplyResult,
                   before_write: Optional[Callable[[], Optional[bool]]], read: Mapping[K, Optional[V]]) -> None:
        """Make `desired` hold as well, what else is held staying as it is."""
        pending = self.intend(desired, result, read)
        if pending and before_write is not None and before_write() is False:
            self.withdraw(pending)  # unrecorded: not made
            return
        self.carry_out(pending, result)

    def intend(self, desired: Mapping[K, V], result: ApplyResult,
                read: Mapping[K, Optional[V]]) -> List[Pending]:
        """Read each desired setting, find drift, and record the original and the value to write.
        Returns (key, value, the value written before) for each write to make."""
        pending: List[Pending] = []
        setting = self.setting
        for key in sorted(desired):
            if key in self.drifted:
                continue
            value = desired[key]
            try:
                current = read[key] if key in read else setting.read(key)
            except (OSError, Refused) as exc:
                self._fail(result, f"{setting.where(key)}: cannot read the current value: {why(exc)}")
                continue
            if current is None:
                self.forget(key)  # gone: nothing to hold, nothing to restore
                continue
            before = self.written.get(key)
            if before is not None:
                if not setting.same(key, before, current):
                    self._drift(key, current, result)
                    continue
                if setting.same(key, value, current):
                    continue
                self.given_back(key, before, self.originals.get(key))  # replaced
            else:
                self.originals.setdefault(key, setting.kept(key, current))
            pending.append((key, value, before))
            self.written[key] = value
        return pending

    def withdraw(self, pending: Sequence[Pending]) -> None:
        """Intents that will not be carried out: each record goes back to what it was."""
        for key, _, previous in pending:
            if previous is None:
                self.forget(key)  # nothing changed: nothing to restore
            else:
                self.written[key] = previous

    def carry_out(self, pending: Sequence[Pending], result: ApplyResult) -> None:
        """Make the writes intend() recorded."""
        for group in self.setting.together(pending):
            try:
                self.setting.write_many({key: value for key, value, _ in group})
            except (OSError, Refused) as exc:
                self.not_written(group, exc, result)
                continue
            for key, _, _ in group:
                result.bump(result.applied, self.count_as(key))

    def not_written(self, group: Sequence[Pending], exc: BaseException, result: ApplyResult) -> None:
        """Writes that intend() recorded failed: each record goes back to what it was."""
        self.withdraw(group)
        if not is_gone(exc):  # an owner gone (a thread, CPU, cgroup, process) refused nothing
            self.refused([key for key, _, _ in group], [value for _, value, _ in group], exc, result)

    def refused(self, keys: List[K], values: List[V], exc: BaseException, result: ApplyResult) -> None:
        """Writes refused (not for being gone): failures, each said."""
        for key, value in zip(keys, values):
            self._fail(result, f"{self.setting.where(key)}: setting {self.setting.shown(value)}: {why(exc)}")

    def _drift(self, key: K, current: V, result: ApplyResult) -> None:
        """Someone else's value found where temperd's was: theirs from now on, not restored."""
        self.drifted[key] = self.setting.kept(key, current)
        self.originals.pop(key, None)
        self.written.pop(key, None)
        result.bump(result.drift, self.count_as(key))
        log.info("%s: changed by someone else to %s; no longer enforced",
                 self.setting.where(key), self.setting.shown(current))

    def given_back(self, key: K, written: V, original: V) -> None:
        """Told before a value temperd wrote is replaced or restored (restore_ledger: threads
        made while it was in force may carry it)."""

    def restore_all(self) -> ApplyResult:
        """Put every original back, and forget everything (what drifted included)."""
        result = ApplyResult()
        self.restore_keys(sorted(set(self.originals) | set(self.written)), result)
        self.drifted.clear()
        return result

    def restore_keys(self, keys: Sequence[K], result: ApplyResult) -> None:
        """Put these keys' originals back where the value is still temperd's."""
        setting = self.setting
        writes: List[Pending] = []
        for key in keys:
            original, written = self.originals.pop(key, None), self.written.pop(key, None)
            if original is None or written is None:
                continue  # never changed, or theirs now
            try:
                current = setting.read(key)
            except (OSError, Refused) as exc:
                self._fail(result, f"{setting.where(key)}: restoring {setting.shown(original)}: "
                                   f"cannot read the current value: {why(exc)}")
                continue
            if current is None:
                self.forget(key)  # gone: nothing to restore
            elif not setting.same(key, written, current):
                self._drift(key, current, result)  # someone else set it since: theirs, left as found
            else:
                writes.append((key, original, written))
        for group in setting.together(writes):
            try:
                setting.write_many({key: original for key, original, _ in group})
            except (OSError, Refused) as exc:
                if not is_gone(exc):
                    for key, original, _ in group:
                        self._fail(result, f"{setting.where(key)}: restoring {setting.shown(original)}: {why(exc)}")
                continue
            for key, original, written in group:
                self.given_back(key, written, original)
                result.bump(result.restored, self.count_as(key))

    def _fail(self, result: ApplyResult, error: str) -> None:
        result.bump(result.failed, self.kind)
        result.errors.append(error)

    def forget(self, key: K) -> None:
        """The thing the key names ended (a thread that exited): nothing to hold, nothing to restore."""
        self.originals.pop(key, None)
        self.written.pop(key, None)
        self.drifted.pop(key, None)

    # ---- state file ----------------------------------------------------------------------------

    def state(self) -> Dict[str, Any]:
        """This store's section of the state file; empty when nothing is held."""
        if not self.written:
            return {}
        text = self.setting.key_text
        return {"originals": {text(k): v for k, v in self.originals.items()},
                "written": {text(k): v for k, v in self.written.items()}}

    def adopt_state(self, section: Mapping[str, Any]) -> None:
        """Take over what a previous run held (its state-file section) so restore_all() undoes it."""
        for table, part in ((self.originals, "originals"), (self.written, "written")):
            for key, value in (section.get(part) or {}).items():
                table.setdefault(self.setting.key_from_text(str(key)), value)
