"""What a tracked workload is called in the usage history, classify, rightsize, /observe and
/metrics: a name that stays the same across restarts of the workload and of temperd (its history
is kept under it), that tells two instances apart, and that stays bounded (never a pid).

In order: its systemd unit; else the cgroup of its [[binding]]; else its own cgroup, where no
process outside the workload is in it (the root cgroup and a login session's are shared); else its
profile and what makes the instance itself: its root process's program and a digest of that
process's command line ("redis: redis-server 5f0c2a91", the matcher's Workload.instance). Never
the command line itself: any local user reads /metrics, and an argument may be a password. Two
workloads whose names would still be equal (one program started twice with the same arguments in
one shared cgroup: nothing tells them apart) get #2, #3 by their lowest pid: the one case where
the name follows the order of appearance.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Dict, Sequence

MAX_INSTANCE_CHARS = 96  # a longer program name is cut, with a digest of the whole kept beside


def bounded(text: str, limit: int = MAX_INSTANCE_CHARS) -> str:
    """text, or its first characters and a short digest of the whole where it is longer than limit."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha1(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{text[:limit - 11]}… {digest}"


def workload_label(w, own_cgroup: bool) -> str:
    """One workload's label (module docstring); own_cgroup: no other process is in w.cgroup."""
    if w.unit:
        return w.unit
    if w.source == "binding" and w.cgroup:
        return w.cgroup
    if own_cgroup and w.cgroup and w.cgroup != "/":
        return w.cgroup
    profile = w.profile_id or f"tier-{w.tier}"
    instance = getattr(w, "instance", "")
    return f"{profile}: {bounded(instance)}" if instance else profile


def workload_labels(workloads: Sequence, own_cgroup: Callable[[object], bool]) -> Dict[str, str]:
    """workload key -> its label; own_cgroup(w): whether w's cgroup holds no other process."""
    named: Dict[str, list] = {}
    for w in workloads:
        named.setdefault(workload_label(w, own_cgroup(w)), []).append(w)
    out: Dict[str, str] = {}
    for label, same in named.items():
        same.sort(key=lambda w: (min(w.pids, default=0), w.key))
        for rank, w in enumerate(same, start=1):
            out[w.key] = label if rank == 1 else f"{label}#{rank}"
    return out
