"""Held settings: one way to change a host setting and give it back.

A Setting names a value by key (a CPU's PM QoS bound, a cgroup's cpu.weight, an autogroup's
nice) and reads and writes it. HeldSettings holds such values for temperd (what each call did:
an ApplyResult, counted under the setting's kind):

- the original is recorded before the first write, and the value about to be written with it,
  so a state file saved in between (`before_write`) undoes the write even if temperd is killed;
- drift: a value re-read differs from what temperd wrote, so someone else changed it. It is
  counted once and is theirs from then on: neither written again nor restored;
- restore puts the original back, unless the value drifted or the setting vanished (read()
  says None: the CPU, cgroup or process is gone; nothing is left to restore);
- adopt takes over what a killed predecessor held, from its state file, so restore_all()
  undoes it.

The per-thread settings (affinity, policy, nice, slice) follow the same rules through the
restore ledger (restore_ledger.py), which reads and writes a thread's policy, nice and slice
together (one sched_getattr, one sched_setattr).
"""

from __future__ import annotations

import errno
from typing import Any, Callable, Container, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar

from temperd.backends.result import ApplyResult

K = TypeVar("K")
V = TypeVar("V")

GONE_ERRNOS = (errno.ENOENT, errno.ESRCH)  # what a write answers when the setting's owner is gone


class Refused(Exception):
    """A read or write the setting's owner refused (e.g. systemctl failed); str() says why."""


class Setting(Generic[K, V]):
    """One kind of host setting: how to read and write the value behind a key."""

    kind = "setting"  # what results count it as, and its state-file section: pmqos, cpu_weight, autogroup

    def read(self, key: K) -> Optional[V]:
        """The current value; None when the setting is gone. Raises OSError or Refused when it
        is there but cannot be read."""
        raise NotImplementedError

    def write(self, key: K, value: V) -> None:
        """Raises OSError (ENOENT, ESRCH: gone) or Refused."""
        raise NotImplementedError

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


def _why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _gone(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in GONE_ERRNOS


class HeldSettings(Generic[K, V]):
    """The values of one Setting that temperd holds: originals, what it wrote, what drifted."""

    def __init__(self, setting: Setting[K, V]):
        self.setting = setting
        self.originals: Dict[K, V] = {}  # before temperd's first write
        self.written: Dict[K, V] = {}  # temperd's last write (recorded just before it is made)
        self.drifted: Dict[K, V] = {}  # what someone else wrote over temperd's value

    @property
    def kind(self) -> str:
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
        for key in sorted(set(self.written) - set(desired)):
            self._restore(key, result)
        self._hold_more({k: v for k, v in desired.items()
                         if not (k in trusted and self.written.get(k) == v and k not in self.drifted)},
                        result, before_write, read or {})
        return result

    def _hold_more(self, desired: Mapping[K, V], result: ApplyResult,
                   before_write: Optional[Callable[[], Optional[bool]]], read: Mapping[K, Optional[V]]) -> None:
        """Make `desired` hold as well, what else is held staying as it is."""
        pending = self._intend(desired, result, read)
        if pending and before_write is not None and before_write() is False:
            for key, _, previous in pending:
                self._unintend(key, previous)  # unrecorded: not made
            return
        for key, value, previous in pending:
            self._write(key, value, previous, result)

    def _intend(self, desired: Mapping[K, V], result: ApplyResult,
                read: Mapping[K, Optional[V]]) -> List[Tuple[K, V, Optional[V]]]:
        """Read each desired setting, find drift, and record the original and the value to write.
        Returns (key, value, the value written before) for each write to make."""
        pending: List[Tuple[K, V, Optional[V]]] = []
        for key in sorted(desired):
            if key in self.drifted:
                continue
            value = desired[key]
            try:
                current = read[key] if key in read else self.setting.read(key)
            except (OSError, Refused) as exc:
                self._fail(result, f"{self.setting.where(key)}: cannot read the current value: {_why(exc)}")
                continue
            if current is None:
                self._forget(key)  # gone: nothing to hold, nothing to restore
                continue
            if key in self.written:
                if current != self.written[key]:
                    self.drifted[key] = current
                    result.bump(result.drift, self.kind)
                    continue
                if current == value:
                    continue
            else:
                self.originals.setdefault(key, current)
            pending.append((key, value, self.written.get(key)))
            self.written[key] = value
        return pending

    def _write(self, key: K, value: V, previous: Optional[V], result: ApplyResult) -> None:
        try:
            self.setting.write(key, value)
        except (OSError, Refused) as exc:
            self._not_written(key, value, previous, exc, result)
            return
        result.bump(result.applied, self.kind)

    def _not_written(self, key: K, value: V, previous: Optional[V], exc: BaseException,
                     result: ApplyResult) -> None:
        """A write that _intend recorded failed: the record goes back to what it was."""
        self._unintend(key, previous)
        if not _gone(exc):
            self._fail(result, f"{self.setting.where(key)}: setting {self.setting.shown(value)}: {_why(exc)}")

    def _unintend(self, key: K, previous: Optional[V]) -> None:
        if previous is None:
            self._forget(key)  # nothing changed: nothing to restore
        else:
            self.written[key] = previous

    def restore(self, key: K) -> ApplyResult:
        result = ApplyResult()
        self._restore(key, result)
        return result

    def restore_all(self) -> ApplyResult:
        result = ApplyResult()
        for key in sorted(set(self.originals) | set(self.written)):
            self._restore(key, result)
        return result

    def _restore(self, key: K, result: ApplyResult) -> None:
        original = self.originals.get(key)
        written = self.written.get(key)
        drifted = key in self.drifted
        self._forget(key)
        if original is None or drifted:
            return  # never changed, or theirs now
        try:
            current = self.setting.read(key)
        except (OSError, Refused) as exc:
            self._fail(result, f"{self.setting.where(key)}: restoring {self.setting.shown(original)}: "
                               f"cannot read the current value: {_why(exc)}")
            return
        if current is None:
            return  # gone: nothing to restore
        if written is not None and current != written:
            result.bump(result.drift, self.kind)  # someone else set it since: theirs, left as found
            return
        try:
            self.setting.write(key, original)
        except (OSError, Refused) as exc:
            if not _gone(exc):
                self._fail(result, f"{self.setting.where(key)}: restoring {self.setting.shown(original)}: {_why(exc)}")
            return
        result.bump(result.restored, self.kind)

    def _fail(self, result: ApplyResult, error: str) -> None:
        result.bump(result.failed, self.kind)
        result.errors.append(error)

    def forget(self, key: K) -> None:
        """The thing the key names ended (a thread that exited): nothing to hold, nothing to restore."""
        self._forget(key)

    def _forget(self, key: K) -> None:
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

    def adopt(self, originals: Mapping[Any, V], written: Mapping[Any, V]) -> None:
        """Take over what a previous run held (from its state file) so restore_all() undoes it."""
        for table, found in ((self.originals, originals), (self.written, written)):
            for key, value in found.items():
                table.setdefault(self.setting.key_from_text(str(key)), value)

    def adopt_state(self, section: Mapping[str, Any]) -> None:
        self.adopt(section.get("originals") or {}, section.get("written") or {})
