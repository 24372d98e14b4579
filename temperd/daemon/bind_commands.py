"""The control-socket commands `bind`, `unbind` and `bindings`: a profile bound to one running
process (and its descendants) at run time, without editing /etc/temper, for `temperctl train
evaluate` and for operators. Runtime only: a binding ends with `unbind`, with the process, or when
temperd stops; the threads it moved are put back like any others. It is checked like a profile
file (the strict loader, the regular-expression bounds), and the trust rules still decide: a
binding raises only processes the host trusts, whoever asked.

Who may bind what: root any process but these; a member of group temper only processes of its
own uid (a binding can lower a process, and SCHED_IDLE starves it beside any busy thread). No one
binds PID 1, temperd or an ancestor of temperd (a binding covers descendants), or a kernel thread.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Set

from temperd.config.errors import ConfigError
from temperd.config.profile import parse_profile
from temperd.control.protocol import ControlError, Progress, shown, task_id
from temperd.daemon.control import PEER, Peer, requester
from temperd.daemon.status_report import workload_view
from temperd.decide.matcher import RuntimeBinding
from temperd.plan import TIERS
from temperd.text import printable

if TYPE_CHECKING:
    from temperd.daemon.state import DaemonState

MAX_PROFILE_BYTES = 60 * 1024  # what fits in one request line


def temperd_and_ancestors(process: Callable[[int], Any]) -> Set[int]:
    """temperd's pid and those of its ancestors (PID 1 among them), by the inventory's `process`."""
    pid, chain = os.getpid(), {1}
    while pid > 0 and pid not in chain:
        chain.add(pid)
        proc = process(pid)
        pid = proc.ppid if proc is not None else 0
    return chain


def bind_refusal(pid: int, proc, peer: Optional[Peer], protected: Set[int]) -> Optional[str]:
    """Why this peer may not bind this process, or None."""
    if proc is None:
        return f"pid {pid}: no such process"
    if proc.is_kernel_thread:
        return f"pid {pid} is a kernel thread: refused"
    if pid == 1:
        return "pid 1 is the init process: refused (a binding covers every descendant)"
    if pid in protected:
        what = "temperd itself" if pid == os.getpid() else "an ancestor of temperd"
        return f"pid {pid} is {what}: refused (temperd must stay responsive)"
    if peer is not None and peer.uid != 0 and proc.uid != peer.uid:
        return (f"pid {pid} belongs to uid {proc.uid}, not to you (uid {peer.uid}): members of group temper bind "
                "only their own processes; root binds any")
    return None


class BindCommands:
    def __init__(self, daemon: "DaemonState"):
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
        daemon = self.daemon
        with daemon.lock:
            proc = daemon.inventory.process(pid)
            refused = bind_refusal(pid, proc, request.get(PEER), temperd_and_ancestors(daemon.inventory.process))
            if refused:
                raise ControlError(refused)
            bound = dataclasses.replace(profile, id=RuntimeBinding.bound_id(profile.id, pid),
                                        source=f"bind:{printable(name)}")
            bindings = dict(daemon.runtime_bindings)
            bindings[pid] = RuntimeBinding(pid, proc.start_time, bound, tier, requester(request))
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
        groups = workload_view(workload).groups if workload else {}
        return {"pid": pid, "profile": binding.profile.id, "source": binding.profile.source, "tier": binding.tier,
                "requester": binding.requester, "workload": workload.key if workload else None,
                "reason": workload.reason if workload else "the process is gone", "groups": groups}
