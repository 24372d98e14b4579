"""The control-socket commands `bind`, `unbind` and `bindings`: a profile bound to one running
process (and its descendants) at run time, without editing /etc/temper, for `temperctl train
evaluate` and for operators. Runtime only: a binding ends with `unbind`, with the process, or when
temperd stops; the threads it moved are put back like any others. It is checked like a profile
file (the strict loader, the regular-expression bounds), and the trust rules still decide: a
binding raises only processes the host trusts, whoever asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

import dataclasses

from temperd.config.errors import ConfigError
from temperd.config.profile import parse_profile
from temperd.daemon.control import ControlError, Progress, shown, task_id
from temperd.decide.matcher import RuntimeBinding
from temperd.plan import TIERS

if TYPE_CHECKING:
    from temperd.daemon.daemon import Daemon

MAX_PROFILE_BYTES = 60 * 1024  # what fits in one request line


class BindCommands:
    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon

    def bind(self, request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
        """{"cmd": "bind", "pid": P, "profile_text": TOML, "profile_name": "file.toml", "tier": T or null}
        -> {"bound": the binding and where the process's threads went}."""
        pid = task_id(request.get("pid"), "pid")
        text, name = request.get("profile_text"), request.get("profile_name") or "bound profile"
        if not isinstance(text, str) or len(text.encode("utf-8", "replace")) > MAX_PROFILE_BYTES:
            raise ControlError(f"profile_text: expected the profile's TOML text, at most {MAX_PROFILE_BYTES} bytes")
        if not isinstance(name, str) or len(name) > 256:
            raise ControlError(f"profile_name: expected a file name, found {shown(name)}")
        tier = request.get("tier")
        if tier is not None and tier not in TIERS:
            raise ControlError(f"tier: expected one of {', '.join(TIERS)}, found {shown(tier)}")
        try:
            profile = parse_profile(text, name)
        except ConfigError as exc:
            problems = exc.problems
            raise ControlError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")) from None
        requester = str(request.get("requester") or "control socket")[:200]
        daemon = self.daemon
        with daemon.lock:
            proc = daemon.inventory.process(pid)
            if proc is None or proc.is_kernel_thread:
                raise ControlError(f"pid {pid}: no such process" if proc is None else f"pid {pid} is a kernel thread")
            bound = dataclasses.replace(profile, id=RuntimeBinding.bound_id(profile.id, pid), source=f"bind:{name}")
            bindings = dict(daemon.runtime_bindings)
            bindings[pid] = RuntimeBinding(pid, proc.start_time, bound, tier, requester)
            daemon.set_runtime_bindings(bindings, f"bind pid {pid} to {profile.id}")
            return {"bound": self._describe(pid)}

    def unbind(self, request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
        """{"cmd": "unbind", "pid": P} -> {"unbound": pid}; its threads go back to what matched before."""
        pid = task_id(request.get("pid"), "pid")
        daemon = self.daemon
        with daemon.lock:
            if pid not in daemon.runtime_bindings:
                raise ControlError(f"pid {pid} has no runtime binding")
            bindings = dict(daemon.runtime_bindings)
            del bindings[pid]
            daemon.set_runtime_bindings(bindings, f"unbind pid {pid}")
            return {"unbound": pid}

    def bindings(self, request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
        """{"bindings": [each live runtime binding]}."""
        with self.daemon.lock:
            return {"bindings": [self._describe(pid) for pid in sorted(self.daemon.runtime_bindings)]}

    def _describe(self, pid: int) -> Dict[str, Any]:
        binding = self.daemon.runtime_bindings[pid]
        workload = self.daemon.match.workload_of(pid)
        groups: Dict[str, int] = {}
        for thread in workload.threads if workload else ():
            groups[thread.group or "-"] = groups.get(thread.group or "-", 0) + 1
        return {"pid": pid, "profile": binding.profile.id, "source": binding.profile.source, "tier": binding.tier,
                "requester": binding.requester, "workload": workload.key if workload else None,
                "reason": workload.reason if workload else "the process is gone", "groups": groups}
