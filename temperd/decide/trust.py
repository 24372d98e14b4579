"""Whose processes a match may raise.

Everything the matcher reads about a process can be chosen by the user who runs it: its name,
its command line, its environment, even the executable (a copy of /usr/bin/memcached runs as
anyone). So a treatment that raises standing over other processes goes only to processes the
host trusts: owned by root or a system account, running in a systemd system unit, or owned by a
user (or a member of a group) that temperd.toml's [trust] names. Which unit, and whether the
system manager runs it, is a fact of the inventory (ProcessFacts.system_unit): a login session's
scope and a user's own services are never system units, on unified, hybrid and legacy hosts alike. Anyone else's match may only
lower standing: yield groups and the background tier apply, exclusive and latency groups and the
critical tier do not, and the reason says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, FrozenSet, Optional

from temperd.plan import EXCLUSIVE, LATENCY
from temperd.sources import accounts

# Treatments that take CPU time or CPUs from others: whole cores of their own (and everyone else
# pushed off them), negative nice, a short slice, a bound on idle-state exit latency.
RAISING_TREATMENTS = frozenset((EXCLUSIVE, LATENCY))
RAISING_TIERS = frozenset(("critical",))
UNTRUSTED_TIER_CAP = "standard"  # the kernel's default weight: neither raised nor lowered


@dataclass(frozen=True)
class TrustPolicy:
    uid_min: int  # uids from here up are people's (login.defs UID_MIN); below, system accounts
    trusted_uids: FrozenSet[int] = frozenset()  # from [trust] users and groups
    nobody_uids: FrozenSet[int] = frozenset()  # "nobody" is below no one's trust
    name_of: Callable[[int], Optional[str]] = lambda uid: None

    def distrust(self, proc) -> Optional[str]:
        """None when the process may be raised; else why not, for status, explain and the log."""
        uid = proc.uid
        if uid is None:
            return "owner unknown (its /proc status could not be read)"
        if uid == 0 or uid in self.trusted_uids:
            return None
        if uid < self.uid_min and uid not in self.nobody_uids:
            return None  # a system account: only root creates those
        if proc.system_unit is not None:
            return None  # only root starts system units (whatever User= they run as)
        name = self.name_of(uid)
        who = f"uid {uid} ({name})" if name else f"uid {uid}"
        return (f"owner {who} is not trusted: not root, a system account or a system unit, nor named "
                "in [trust] of temperd.toml")


def trust_policy(config) -> TrustPolicy:
    """The host's policy: login.defs' UID_MIN, the uids of [trust] users and groups as they
    exist now (re-read at every reload)."""
    nobody = frozenset(uid for uid in (accounts.uid_of(n) for n in accounts.NOBODY_NAMES) if uid is not None)
    return TrustPolicy(uid_min=accounts.read_uid_min(),
                       trusted_uids=accounts.uids_of(config.trust_users, config.trust_groups),
                       nobody_uids=nobody, name_of=accounts.user_name)
