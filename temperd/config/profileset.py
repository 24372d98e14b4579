"""Which profile applies for each id: builtins, files from profiles.d, and the host's machine shape.

Rules (temper-profile(5)): a file profile overrides the builtin with the same id; among candidates for
one id the most specific machine_shape that matches this host wins; a profile whose shape does
not match is not applied. Every decision carries a reason a person can read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.resources import files as resource_files
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from temperd import paths
from temperd.config.errors import ConfigError, ConfigProblem
from temperd.config.profile import Profile, parse_profile, profile_from_document
from temperd.config.tomlsource import read_toml

DEFAULT_PROFILE_DIR = paths.PROFILE_DIR

@dataclass(frozen=True)
class HostShape:
    """The three facts of a machine shape that profiles are keyed on."""

    cores: int
    threads_per_core: int
    cpu_model: str

    @classmethod
    def of(cls, shape) -> "HostShape":
        return cls(len(shape.cores), shape.threads_per_core, shape.cpu_model)

    def describe(self) -> str:
        return f"{self.cores} cores x {self.threads_per_core} threads/core, {self.cpu_model or 'unknown model'}"


@dataclass(frozen=True)
class Candidate:
    profile: Profile
    status: str  # "active" | "overridden" | "shape-mismatch"
    reason: str


@dataclass
class ProfileSet:
    active: Dict[str, Profile] = field(default_factory=dict)
    candidates: List[Candidate] = field(default_factory=list)
    problems: List[ConfigProblem] = field(default_factory=list)

    def reason_for(self, profile_id: str) -> str:
        for candidate in self.candidates:
            if candidate.profile.id == profile_id and candidate.status == "active":
                return candidate.reason
        return f"no profile with id {profile_id!r} applies on this host"


def load_builtin_profiles() -> List[Profile]:
    """The profiles shipped in the package (profiles/*.toml)."""
    root = resource_files("temperd.builtin_profiles")
    return [parse_profile(entry.read_text(encoding="utf-8"), f"builtin:{entry.name}", builtin=True)
            for entry in sorted(root.iterdir(), key=lambda e: e.name) if entry.name.endswith(".toml")]


def profile_files(paths: Sequence[str]) -> List[str]:
    """*.toml files named directly or found (non-recursively) in directories, sorted."""
    out: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            out.extend(os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".toml"))
        else:
            out.append(path)
    return out


def load_profile_files(paths: Sequence[str], *, require_trusted: bool = False) -> Tuple[List[Profile], List[ConfigProblem]]:
    """Load every profile file; bad files become problems, good ones profiles."""
    profiles: List[Profile] = []
    problems: List[ConfigProblem] = []
    for path in profile_files(paths):
        try:
            profiles.append(profile_from_document(read_toml(path, require_trusted)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    return profiles, problems


def _duplicates(profiles: Iterable[Profile]) -> List[ConfigProblem]:
    """Two files with the same id and the same shape requirement cannot be ranked: the later
    file (in name order) is refused and reported."""
    seen: Dict[Tuple[str, object], Profile] = {}
    problems = []
    for profile in profiles:
        key = (profile.id, profile.machine_shape)
        if key in seen:
            problems.append(ConfigProblem(
                profile.source, ("id",),
                f"profile id {profile.id!r} with the same machine_shape ({profile.machine_shape.describe()}) "
                f"is already defined in {seen[key].source}; expected one file per id and shape"))
        else:
            seen[key] = profile
    return problems


def resolve(builtins: Sequence[Profile], files: Sequence[Profile], host: HostShape,
            problems: Sequence[ConfigProblem] = ()) -> ProfileSet:
    duplicates = _duplicates(files)
    refused = {problem.file for problem in duplicates}
    result = ProfileSet(problems=list(problems) + duplicates)
    by_id: Dict[str, List[Profile]] = {}
    for profile in list(builtins) + [f for f in files if f.source not in refused]:
        by_id.setdefault(profile.id, []).append(profile)
    for profile_id in sorted(by_id):
        fitting = []
        for profile in by_id[profile_id]:
            why_not = profile.machine_shape.mismatch(host.cores, host.threads_per_core, host.cpu_model)
            if why_not:
                result.candidates.append(Candidate(profile, "shape-mismatch", f"not applied: {why_not}"))
            else:
                fitting.append(profile)
        # Most specific shape first; at equal specificity a file beats the builtin.
        fitting.sort(key=lambda p: (-p.machine_shape.specificity, p.builtin))
        for rank, profile in enumerate(fitting):
            if rank == 0:
                result.active[profile_id] = profile
                result.candidates.append(Candidate(profile, "active", _win_reason(profile, fitting[1:])))
            else:
                winner = fitting[0]
                result.candidates.append(Candidate(profile, "overridden", f"overridden by {winner.source}"
                                                   + (" (more specific machine_shape)" if winner.machine_shape.specificity > profile.machine_shape.specificity else "")))
    return result


def _win_reason(profile: Profile, others: Sequence[Profile]) -> str:
    origin = "builtin" if profile.builtin else f"file {profile.source}"
    shape = profile.machine_shape
    shape_text = "any machine shape" if shape.specificity == 0 else f"machine_shape {shape.describe()} matches this host"
    beaten = f"; preferred over {', '.join(o.source for o in others)}" if others else ""
    return f"{origin}; {shape_text}{beaten}"


def load_profile_set(host: HostShape, profile_dir: Optional[str] = DEFAULT_PROFILE_DIR, *,
                     require_trusted: bool = True) -> ProfileSet:
    """Builtins plus the profile directory (absent directory = builtins only)."""
    files: List[Profile] = []
    problems: List[ConfigProblem] = []
    if profile_dir and os.path.isdir(profile_dir):
        files, problems = load_profile_files([profile_dir], require_trusted=require_trusted)
    return resolve(load_builtin_profiles(), files, host, problems)
