"""Profile schema v1: the typed model of a workload profile, its strict loader and its JSON Schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from temperd.config.defaults import by_value
from temperd.config.errors import ConfigError, describe_value
from temperd.plan import EXCLUSIVE, LATENCY, OWNED, OWNERSHIPS, TREATMENTS, YIELD
from temperd.config.safe_regex import regex_problem
from temperd.config.schema import (Spec, TableSpec, Validator, check_cgroup_path, check_comm_glob, check_glob, glob_match, json_schema)
from temperd.config.tomlsource import TomlDocument, parse_toml

SCHEMA_VERSION = 1
PROFILE_ID_PATTERN = r"[a-z0-9][a-z0-9-]{0,62}"
GROUP_NAME_PATTERN = r"[a-z0-9][a-z0-9_-]{0,31}"

YIELD_POLICIES = ("idle", "batch")
SELECTORS = ("thread_names", "process_titles", "busiest", "catch_all")
# Which treatment each optional parameter belongs to.
PARAM_TREATMENTS = {
    "cpu_fraction": (EXCLUSIVE,),
    "ownership": (EXCLUSIVE,),
    "slice_us": (EXCLUSIVE, LATENCY),
    "idle_resume_us": (EXCLUSIVE, LATENCY),
    "yield_policy": (YIELD,),
}

LEVELS = ("high", "medium", "low")

FINGERPRINT_SPEC = TableSpec(
    "fingerprint",
    "How processes are recognised as this workload; a process matches if any pattern matches.",
    {
        "executables": Spec("strlist", "Globs on the executable path (/proc/PID/exe).", default=(), item_check=check_glob, item_format="glob"),
        "process_names": Spec("strlist", "Globs on the process name (the leader's comm).", default=(), item_check=check_comm_glob, item_format="glob"),
        "units": Spec("strlist", "Globs on the systemd unit name, e.g. 'postgresql@*.service'.", default=(), item_check=check_glob, item_format="glob"),
        "cgroups": Spec("strlist", "cgroup path prefixes, e.g. '/system.slice/memcached.service'.", default=(), item_check=check_cgroup_path),
        "cmdline": Spec("strlist", "Regular expressions searched in the command line (arguments joined by spaces).", default=(), item_check=regex_problem, item_format="regex"),
        "images": Spec("strlist", "Container image globs, accepted for profiles shared with the Kubernetes agent.", default=(), item_check=check_glob, item_format="glob"),
    },
)

SHAPE_SPEC = TableSpec(
    "machine_shape",
    "The machine shape the tuning was measured on; every key given must equal the host's.",
    {
        "cores": Spec("int", "Physical cores.", minimum=1, maximum=4096),
        "threads_per_core": Spec("int", "SMT threads per core.", minimum=1, maximum=8),
        "cpu_model": Spec("str", "Glob on the CPU model name.", item_check=check_glob),
    },
)

TRAITS_SPEC = TableSpec(
    "traits",
    "Workload-level characteristics, in the workload-classification vocabulary.",
    {
        "criticality": Spec("str", "performance: latency or throughput matters; standard: may run anywhere.", choices=("performance", "standard")),
        "cpu_intensity": Spec("str", "How much CPU the workload uses.", choices=LEVELS),
        "cpu_bound": Spec("str", "The dominant constraint on its CPU use.", choices=("compute", "memory", "io", "mixed")),
        "cpu_cap_sensitivity": Spec("str", "Slowdown under CPU frequency or quota caps.", choices=LEVELS),
        "gpu_intensity": Spec("str", "How much GPU the workload uses.", choices=LEVELS + ("none",)),
        "gpu_bound": Spec("str", "The dominant constraint on its GPU use (input: the GPU waits for the CPUs that feed it).",
                      choices=("compute", "memory", "input", "mixed", "none")),
        "gpu_cap_sensitivity": Spec("str", "Slowdown under GPU power caps.", choices=LEVELS + ("none",)),
    },
)

GROUP_SPEC = TableSpec(
    "thread_group",
    "One group of the workload's threads and its scheduling treatment. Exactly one selector "
    "(thread_names, process_titles, busiest, catch_all) is given.",
    {
        "name": Spec("str", "Group name, unique in the profile.", required=True, pattern=GROUP_NAME_PATTERN,
                     pattern_doc="a name of lowercase letters, digits, '_' or '-' (at most 32)"),
        "description": Spec("str", "What these threads do.", default=""),
        "thread_names": Spec("strlist", "Globs on the thread name (comm, at most 15 bytes).", default=(), item_check=check_comm_glob, item_format="glob", min_items=1),
        "process_titles": Spec("strlist", "Regular expressions searched in the process title (/proc/PID/cmdline), for process-per-connection servers.", default=(), item_check=regex_problem, item_format="regex", min_items=1),
        "busiest": Spec("int", "The N busiest threads of the process by recent CPU time, for runtimes that leave threads unnamed.", minimum=1, maximum=1024),
        "catch_all": Spec("bool", "This group takes the workload's threads no other group claims (at most one group).", default=False),
        "treatment": Spec("str", "exclusive: whole cores of its own; latency: fast wakeups; yield: runs when nothing else wants the CPU.", required=True, choices=TREATMENTS),
        "cpu_fraction": Spec("float", "exclusive: cores = ceil(workload CPU budget x cpu_fraction).", minimum=0.0, maximum=1.0, exclusive_minimum=True, default=1.0),
        "ownership": Spec("str", "exclusive: 'owned' = the group's threads run on its cores first and other work may use them while they sleep; 'fenced' = no other thread runs there, even while the group sleeps.", choices=OWNERSHIPS, default=OWNED),
        "weight": Spec("int", "Share under contention (1..10000), by treatment.", minimum=1, maximum=10000,
                       default=by_value("treatment", {EXCLUSIVE: 1000, LATENCY: 500, YIELD: 50})),
        "nice": Spec("int", "Nice value, by treatment (yield: with yield_policy = 'batch').", minimum=-20, maximum=19,
                     default=by_value("treatment", {EXCLUSIVE: 0, LATENCY: -10, YIELD: 19})),
        "slice_us": Spec("int", "exclusive/latency: custom time slice in microseconds (EEVDF kernels >= 6.12); on an owned exclusive group, 100 lets a waking owner preempt a fair borrower.", minimum=100, maximum=100000),
        "yield_policy": Spec("str", "yield: 'idle' = SCHED_IDLE, 'batch' = SCHED_BATCH with nice.", choices=YIELD_POLICIES, default="idle"),
        "idle_resume_us": Spec("int", "exclusive/latency: bound on the wake-up latency of idle CPUs serving this group (microseconds).", minimum=0, maximum=1000000),
    },
)

PROFILE_SPEC = TableSpec(
    "temperd workload profile (schema v1)",
    "A workload profile: how to recognise a workload and how to schedule each of its thread groups.",
    {
        "schema_version": Spec("int", "Profile schema version; this temperd reads 1.", required=True, choices=(SCHEMA_VERSION,)),
        "id": Spec("str", "Profile id; a file profile replaces the builtin with the same id.", required=True,
                   pattern=PROFILE_ID_PATTERN, pattern_doc="an id of lowercase letters, digits and '-' (at most 63)"),
        "description": Spec("str", "One line saying what the profile is for.", default=""),
        "fingerprint": Spec("table", FINGERPRINT_SPEC.doc, table=FINGERPRINT_SPEC, default={}),
        "machine_shape": Spec("table", SHAPE_SPEC.doc, table=SHAPE_SPEC, default={}),
        "traits": Spec("table", TRAITS_SPEC.doc, table=TRAITS_SPEC, default={}),
        "thread_groups": Spec("tables", GROUP_SPEC.doc, required=True, table=GROUP_SPEC, min_items=1),
    },
)


@dataclass(frozen=True)
class Fingerprint:
    executables: Tuple[str, ...] = ()
    process_names: Tuple[str, ...] = ()
    units: Tuple[str, ...] = ()
    cgroups: Tuple[str, ...] = ()
    cmdline: Tuple[str, ...] = ()
    images: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ShapeRequirement:
    cores: Optional[int] = None
    threads_per_core: Optional[int] = None
    cpu_model: Optional[str] = None

    @property
    def specificity(self) -> int:
        return sum(v is not None for v in (self.cores, self.threads_per_core, self.cpu_model))

    def describe(self) -> str:
        parts = []
        if self.cores is not None:
            parts.append(f"{self.cores} cores")
        if self.threads_per_core is not None:
            parts.append(f"{self.threads_per_core} threads/core")
        if self.cpu_model is not None:
            parts.append(f"model {self.cpu_model!r}")
        return ", ".join(parts) or "any shape"

    def mismatch(self, cores: int, threads_per_core: int, cpu_model: str) -> Optional[str]:
        """None when the host matches, else why not."""
        if self.cores is not None and self.cores != cores:
            return f"tuned for {self.cores} cores, host has {cores}"
        if self.threads_per_core is not None and self.threads_per_core != threads_per_core:
            return f"tuned for {self.threads_per_core} threads/core, host has {threads_per_core}"
        if self.cpu_model is not None and not glob_match(self.cpu_model, cpu_model):
            return f"tuned for CPU model {self.cpu_model!r}, host has {cpu_model!r}"
        return None


@dataclass(frozen=True)
class Traits:
    criticality: Optional[str] = None
    cpu_intensity: Optional[str] = None
    cpu_bound: Optional[str] = None
    cpu_cap_sensitivity: Optional[str] = None
    gpu_intensity: Optional[str] = None
    gpu_bound: Optional[str] = None
    gpu_cap_sensitivity: Optional[str] = None


@dataclass(frozen=True)
class ThreadGroup:
    """One [[thread_groups]] table; each default is GROUP_SPEC's."""

    name: str
    treatment: str
    description: str = GROUP_SPEC.default_of("description")
    thread_names: Tuple[str, ...] = GROUP_SPEC.default_of("thread_names")
    process_titles: Tuple[str, ...] = GROUP_SPEC.default_of("process_titles")
    busiest: Optional[int] = GROUP_SPEC.default_of("busiest")
    catch_all: bool = GROUP_SPEC.default_of("catch_all")
    cpu_fraction: float = GROUP_SPEC.default_of("cpu_fraction")
    ownership: str = GROUP_SPEC.default_of("ownership")
    weight: int = None  # type: ignore[assignment]  # None: the treatment's (__post_init__)
    nice: int = None  # type: ignore[assignment]  # None: the treatment's (__post_init__)
    slice_us: Optional[int] = GROUP_SPEC.default_of("slice_us")
    yield_policy: str = GROUP_SPEC.default_of("yield_policy")
    idle_resume_us: Optional[int] = GROUP_SPEC.default_of("idle_resume_us")

    def __post_init__(self) -> None:
        for key in ("weight", "nice"):
            if getattr(self, key) is None:
                object.__setattr__(self, key, GROUP_SPEC.default_for(key, {"treatment": self.treatment}))

    @property
    def selector(self) -> str:
        if self.thread_names:
            return "thread_names"
        if self.process_titles:
            return "process_titles"
        if self.busiest is not None:
            return "busiest"
        return "catch_all"

    def describe_selector(self) -> str:
        return {"thread_names": "threads named " + ", ".join(self.thread_names),
                "process_titles": "processes titled " + ", ".join(self.process_titles),
                "busiest": f"the {self.busiest} busiest threads",
                "catch_all": "all other threads"}[self.selector]

    def describe_treatment(self) -> str:
        if self.treatment == EXCLUSIVE:
            extra = f"cpu_fraction={self.cpu_fraction:g}" + (f" {self.ownership}" if self.ownership != GROUP_SPEC.default_of("ownership") else "")
        elif self.treatment == LATENCY:
            extra = f"nice={self.nice}"
        else:
            extra = "SCHED_IDLE" if self.yield_policy == "idle" else f"SCHED_BATCH nice={self.nice}"
        if self.slice_us is not None:
            extra += f" slice={self.slice_us}us"
        if self.idle_resume_us is not None:
            extra += f" idle_resume={self.idle_resume_us}us"
        return f"{self.treatment} (weight={self.weight} {extra})"


@dataclass(frozen=True)
class Profile:
    id: str
    description: str
    fingerprint: Fingerprint
    machine_shape: ShapeRequirement
    traits: Traits
    thread_groups: Tuple[ThreadGroup, ...]
    source: str  # file path, or "builtin:<name>.toml"
    builtin: bool = False
    schema_version: int = SCHEMA_VERSION

    def group(self, name: str) -> ThreadGroup:
        for group in self.thread_groups:
            if group.name == name:
                return group
        raise KeyError(name)


def _group_from(values: dict, raw: dict, index: int, v: Validator) -> Optional[ThreadGroup]:
    path = ("thread_groups", index)
    # Selectors are counted as written, so a selector with a bad pattern is not reported missing.
    selectors = [s for s in SELECTORS if s in raw and raw[s] is not False]
    treatment = values.get("treatment")
    if treatment is not None:
        bad = {p.keypath for p in v.problems}  # a bad value is reported once, as that
        for param, allowed in PARAM_TREATMENTS.items():
            if param in raw and path + (param,) not in bad and treatment not in allowed:
                v.fail(path + (param,), f"applies only to treatment {' or '.join(repr(a) for a in allowed)}; this group's treatment is {treatment!r}")
    if len(selectors) != 1:
        found = ", ".join(selectors) if selectors else "none"
        v.fail(path, f"expected exactly one selector of {', '.join(SELECTORS)}; found {found}")
        return None
    if treatment is None:
        return None
    # The validator filled in every absent key's declared default (GROUP_SPEC).
    return ThreadGroup(**{key: values[key] for key in GROUP_SPEC.fields})


def profile_from_document(doc: TomlDocument, *, builtin: bool = False) -> Profile:
    """Validate a parsed TOML document as a profile; raises ConfigError listing every problem."""
    v = Validator(doc)
    version = doc.data.get("schema_version")
    if "schema_version" in doc.data and version != SCHEMA_VERSION:
        # Other keys may mean something else in another version: say only this.
        v.fail(("schema_version",), f"unsupported schema_version: expected {SCHEMA_VERSION}, found {describe_value(version)}")
        raise ConfigError(v.problems)
    values = v.table(doc.data, PROFILE_SPEC)
    groups: List[ThreadGroup] = []
    seen: Dict[str, int] = {}
    catch_alls: List[int] = []
    raw_groups = doc.data.get("thread_groups") if isinstance(doc.data.get("thread_groups"), list) else []
    for index, gvalues in enumerate(values.get("thread_groups") or []):
        name = gvalues.get("name")
        if name is not None:
            if name in seen:
                v.fail(("thread_groups", index, "name"), f"duplicate group name {name!r} (also thread_groups[{seen[name]}])")
            seen.setdefault(name, index)
        group = _group_from(gvalues, raw_groups[index], index, v)
        if group is not None:
            groups.append(group)
            if group.catch_all:
                catch_alls.append(index)
    if len(catch_alls) > 1:
        v.fail(("thread_groups", catch_alls[1], "catch_all"), f"at most one catch_all group; thread_groups[{catch_alls[0]}] is one already")
    if v.problems:
        raise ConfigError(sorted(v.problems, key=lambda p: p.line or 0))
    fp, shape, traits = values["fingerprint"], values["machine_shape"], values["traits"]
    return Profile(
        id=values["id"],
        description=values["description"],
        fingerprint=Fingerprint(**{k: fp.get(k) or () for k in FINGERPRINT_SPEC.fields}),
        machine_shape=ShapeRequirement(**{k: shape.get(k) for k in SHAPE_SPEC.fields}),
        traits=Traits(**{k: traits.get(k) for k in TRAITS_SPEC.fields}),
        thread_groups=tuple(groups),
        source=doc.file,
        builtin=builtin,
    )


def parse_profile(text: str, file: str, *, builtin: bool = False) -> Profile:
    return profile_from_document(parse_toml(text, file), builtin=builtin)


def profile_json_schema() -> dict:
    return json_schema(PROFILE_SPEC, root_id="urn:temperd:profile:v1")

