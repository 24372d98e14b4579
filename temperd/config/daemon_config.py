"""The daemon configuration, /etc/temper/temperd.toml: tiers, bindings, backend, endpoints."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from temperd import paths
from temperd.config.errors import ConfigError, ConfigProblem
from temperd.config.profile import PROFILE_ID_PATTERN
from temperd.plan import TIERS
from temperd.config.schema import Spec, TableSpec, Validator, check_cgroup_path, check_glob
from temperd.config.tomlsource import TomlDocument, read_toml

DEFAULT_CONFIG_DIR = paths.CONFIG_DIR
CONFIG_FILE = "temperd.toml"
BACKENDS = ("auto", "scx", "native")
NO_IDLE_RESUME_BOUND = -1


def _tier_spec(name: str, weight: int, idle_resume_us: int) -> TableSpec:
    return TableSpec(name, f"The {name} tier.", {
        "weight": Spec("int", "cgroup v2 cpu.weight of this tier's workloads (1..10000).", minimum=1, maximum=10000,
                       default=weight),
        "idle_resume_us": Spec("int", "PM QoS resume bound (microseconds) on the CPUs this tier's exclusive groups "
                               "own, where their profile sets no idle_resume_us: 0 keeps an owned CPU polling while "
                               "its owner sleeps (no wakeup from a sleep state; the CPU never saves power), -1 sets "
                               "none.", minimum=-1, maximum=1000000, default=idle_resume_us),
    })


# Each tier's cgroup v2 cpu.weight (1..10000; the kernel's default is 100) and PM QoS resume bound.
# The critical tier's 0: an owned CPU waits for its owner's next request polling, never in a sleep
# state (on a KVM guest, never halted): a lone client's request is then served without a wakeup
# from idle (redis, one client, 2-vCPU guest: 1.79x stock's requests per second, p99 0.58x;
# docs/benchmarks.md). The cost is power: the CPU never sleeps while its owner does.
TIERS_SPEC = TableSpec("tiers", "tiers", {
    name: Spec("table", f"The {name} tier.", default={}, table=_tier_spec(name, weight, idle_resume_us))
    for name, weight, idle_resume_us in (("critical", 1000, 0), ("standard", 100, NO_IDLE_RESUME_BOUND),
                                         ("background", 10, NO_IDLE_RESUME_BOUND))
})


def tier_defaults(key: str) -> Dict[str, int]:
    """Each tier's declared default of a [tiers.*] key."""
    return {name: TIERS_SPEC.fields[name].table.default_of(key) for name in TIERS}  # type: ignore[union-attr]


BINDING_SPEC = TableSpec(
    "binding",
    "Binds a systemd unit or a cgroup to a tier, a profile and a CPU budget. Exactly one of unit, cgroup.",
    {
        "unit": Spec("str", "systemd unit name or glob, e.g. 'memcached.service'.", item_check=check_glob),
        "cgroup": Spec("str", "cgroup path prefix, e.g. '/system.slice/memcached.service'.", item_check=check_cgroup_path),
        "tier": Spec("str", "QoS tier.", choices=TIERS, default="standard"),
        "profile": Spec("str", "Profile id to apply (overrides fingerprints).", pattern=PROFILE_ID_PATTERN,
                        pattern_doc="a profile id"),
        "cpus": Spec("float", "CPU budget in CPUs, e.g. 1.5; otherwise the cgroup's CPU quota.", minimum=0.0,
                     maximum=4096.0, exclusive_minimum=True),
    },
)

SCX_SPEC = TableSpec("scx", "scx", {
    "binary": Spec("str", "Path of scx_layered; empty: found on PATH, /usr/bin, /usr/local/bin, /usr/sbin.", default=""),
    "args": Spec("strlist", "Extra scx_layered command-line options, e.g. ['--disable-topology=false'].", default=[]),
    "stats_socket": Spec("str", "scx_layered's stats socket.", default="/var/run/scx/root/stats"),
    "min_restart_interval_s": Spec("float", "Least time between two restarts for plan changes (each restart is a "
                                   "moment on the kernel's default scheduler).", minimum=0.0, maximum=3600.0,
                                   default=30.0),
    "crash_limit": Spec("int", "This many crashes within crash_window_s put the scx backend into safe mode "
                        "(the native backend carries the plan).", minimum=1, maximum=100, default=3),
    "crash_window_s": Spec("float", "The window for crash_limit.", minimum=1.0, maximum=86400.0, default=300.0),
})

HTTP_SPEC = TableSpec("http", "HTTP", {
    "listen": Spec("str", "Address to listen on.", default="127.0.0.1"),
    # 9100 is node_exporter's and 9256 process-exporter's; 9477 is temperd's.
    "port": Spec("int", "TCP port (0 = disabled).", minimum=0, maximum=65535, default=9477),
})

CONTROL_SPEC = TableSpec("control", "control", {
    "socket": Spec("str", "Socket path.", default=paths.CONTROL_SOCKET),
    "group": Spec("str", "Group allowed to use the socket besides root.", default="temper"),
})

TRUST_SPEC = TableSpec("trust", "trust", {
    "users": Spec("strlist", "Users whose processes may be raised (exclusive cores, latency treatment, the "
                  "critical tier) besides root, system accounts and system units.", default=[],
                  pattern=r"[a-z_][a-z0-9_.-]*[$]?", pattern_doc="a user name"),
    "groups": Spec("strlist", "Groups whose members' processes may be raised, as for users.", default=[],
                   pattern=r"[a-z_][a-z0-9_.-]*[$]?", pattern_doc="a group name"),
})

# The placement linter's runqueue_latency invariant: a protected (exclusive or latency) layer's
# scheduling delay p99 over one observation window above this bound is a violation.
LINT_SPEC = TableSpec("lint", "lint", {
    "runqueue_latency_p99_ms": Spec("float", "Bound on a protected layer's scheduling-delay p99 (wakeup to run) "
                                    "over one observation window, in milliseconds; above it the linter reports "
                                    "runqueue_latency.", minimum=0.001, maximum=60000.0,
                                    default=10.0),
})

# Scheduling-delay telemetry: the bcc program (bpf/runqlat.bpf.c) where it can load, else schedstat.
TELEMETRY_SPEC = TableSpec("telemetry", "telemetry", {
    "bpf": Spec("bool", "Load the bcc program for scheduling delay per layer where bcc, the kernel headers and the "
                "privileges it needs are there (under systemd, the bpf-telemetry.conf drop-in); false: schedstat "
                "means only, nothing loaded into the kernel.", default=True),
})

CLASSIFY_SPEC = TableSpec("classify", "classify", {
    "enabled": Spec("bool", "Classify every tracked workload (temperctl classify, /observe, /metrics).", default=True),
    "window_s": Spec("float", "The sliding window a classification covers, in seconds.", minimum=10.0,
                     maximum=86400.0, default=600.0),
    "metrics_interval_s": Spec("float", "Seconds between refreshes of the classes and rightsizing recommendations "
                               "on /metrics (temperctl and /observe compute theirs when asked).", minimum=5.0,
                               maximum=3600.0, default=30.0),
})

RIGHTSIZING_SPEC = TableSpec("rightsizing", "rightsizing", {
    "enabled": Spec("bool", "Keep per-thread usage histories and recommend CPUs (temperctl rightsize).", default=True),
    "margin": Spec("float", "Headroom on the shared remainder: p95 x (1 + margin).", minimum=0.0, maximum=10.0,
                   default=0.15),
    "half_life_h": Spec("float", "Half-life of a usage sample's weight in the histograms, in hours.", minimum=0.01,
                        maximum=8760.0, default=24.0),
    "sample_interval_s": Spec("float", "Seconds between usage samples of each tracked workload's busiest threads "
                              "(a thread busy 2 s in 10 s is seen as hot only with samples this short).",
                              minimum=0.2, maximum=60.0, default=1.0),
    "idle_sample_interval_s": Spec("float", "Seconds between looks at a workload whose own cgroup has used no CPU "
                                   "for 30 s (one read of its cpu.stat); the first look that finds it running "
                                   "again returns it to sample_interval_s and counts at its average.",
                                   minimum=0.2, maximum=60.0, default=5.0),
    "keep_threads": Spec("int", "Threads of each workload kept individually in the history (the busiest); the "
                         "rest are aggregated.", minimum=1, maximum=1024, default=16),
    "history_file": Spec("str", "The history, kept across restarts.", default=paths.USAGE_HISTORY),
})

CONFIG_SPEC = TableSpec(
    "temperd configuration",
    "temperd's own settings: /etc/temper/temperd.toml.",
    {
        "backend": Spec("str", "auto: scx_layered where sched_ext and the binary exist, else native.", choices=BACKENDS, default="auto"),
        "profile_dir": Spec("str", "Directory of file profiles (relative to this file's directory).",
                            default=os.path.relpath(paths.PROFILE_DIR, paths.CONFIG_DIR)),
        "state_dir": Spec("str", "Runtime state (restore records, control socket).", default=paths.RUN_DIR),
        "default_tier": Spec("str", "Tier of workloads no binding names.", choices=TIERS, default="standard"),
        "reserve_cpus": Spec("int", "CPUs kept for everything that is not exclusive (at least 1).", minimum=1, maximum=4096, default=1),
        # With process events the inventory is current without scanning; the scan catches what no
        # event reports (affinity, nice, policy changed by others; cgroup moves). It reads every
        # thread's stat (about 18 us each), so its interval sets temperd's idle CPU on hosts with
        # thousands of threads: at 2 000 threads, 0.200 % of a core every 30 s and 0.083 % every
        # 120 s (docs/benchmarks.md). Without events the scan is the only way to see new processes.
        "reconcile_interval_s": Spec("float", "Seconds between full /proc reconcile scans while process events arrive "
                                     "(a lost-event overflow starts one at once).", minimum=1.0, maximum=3600.0,
                                     default=120.0),
        "scan_interval_without_events_s": Spec("float", "Seconds between /proc scans where process events are "
                                               "unavailable (no CAP_NET_ADMIN, containers).", minimum=1.0,
                                               maximum=3600.0, default=30.0),
        "http": Spec("table", "Read-only HTTP endpoints /metrics and /observe.", default={}, table=HTTP_SPEC),
        "control": Spec("table", "The Unix control socket used by temperctl.", default={}, table=CONTROL_SPEC),
        "tiers": Spec("table", "Per-tier settings.", default={}, table=TIERS_SPEC),
        "scx": Spec("table", "The scx backend: how temperd runs and supervises scx_layered.", default={},
                    table=SCX_SPEC),
        "trust": Spec("table", "Whose processes a match may raise: a process owned by anyone else only ever "
                      "yields or goes to the background tier.", default={}, table=TRUST_SPEC),
        "lint": Spec("table", "The placement linter's bounds.", default={}, table=LINT_SPEC),
        "classify": Spec("table", "Workload classification.", default={}, table=CLASSIFY_SPEC),
        "rightsizing": Spec("table", "Thread-aware rightsizing.", default={}, table=RIGHTSIZING_SPEC),
        "telemetry": Spec("table", "Where scheduling delay comes from.", default={}, table=TELEMETRY_SPEC),
        "binding": Spec("tables", BINDING_SPEC.doc, default=[], table=BINDING_SPEC),
    },
)


@dataclass(frozen=True)
class Binding:
    tier: str
    unit: Optional[str] = None
    cgroup: Optional[str] = None
    profile: Optional[str] = None
    cpus: Optional[float] = None
    index: int = 0  # position in the file, for messages

    def describe(self) -> str:
        return f"binding[{self.index}] ({'unit ' + self.unit if self.unit else 'cgroup ' + str(self.cgroup)})"


@dataclass(frozen=True)
class ScxSettings:
    binary: str = SCX_SPEC.default_of("binary")  # empty: search the usual places
    args: Tuple[str, ...] = tuple(SCX_SPEC.default_of("args"))
    stats_socket: str = SCX_SPEC.default_of("stats_socket")
    min_restart_interval_s: float = SCX_SPEC.default_of("min_restart_interval_s")
    crash_limit: int = SCX_SPEC.default_of("crash_limit")
    crash_window_s: float = SCX_SPEC.default_of("crash_window_s")


@dataclass(frozen=True)
class LearnerSettings:
    """[classify] and [rightsizing]: what temperd learns of each workload."""

    classify: bool = CLASSIFY_SPEC.default_of("enabled")
    window_s: float = CLASSIFY_SPEC.default_of("window_s")
    metrics_interval_s: float = CLASSIFY_SPEC.default_of("metrics_interval_s")
    rightsizing: bool = RIGHTSIZING_SPEC.default_of("enabled")
    margin: float = RIGHTSIZING_SPEC.default_of("margin")
    half_life_h: float = RIGHTSIZING_SPEC.default_of("half_life_h")
    sample_interval_s: float = RIGHTSIZING_SPEC.default_of("sample_interval_s")
    idle_sample_interval_s: float = RIGHTSIZING_SPEC.default_of("idle_sample_interval_s")
    keep_threads: int = RIGHTSIZING_SPEC.default_of("keep_threads")
    history_file: str = RIGHTSIZING_SPEC.default_of("history_file")

    @property
    def sampling(self) -> bool:
        return self.classify or self.rightsizing


@dataclass(frozen=True)
class DaemonConfig:
    source: str = "(defaults)"
    backend: str = CONFIG_SPEC.default_of("backend")
    profile_dir: str = os.path.join(DEFAULT_CONFIG_DIR, CONFIG_SPEC.default_of("profile_dir"))  # beside temperd.toml
    state_dir: str = CONFIG_SPEC.default_of("state_dir")
    default_tier: str = CONFIG_SPEC.default_of("default_tier")
    reserve_cpus: int = CONFIG_SPEC.default_of("reserve_cpus")
    reconcile_interval_s: float = CONFIG_SPEC.default_of("reconcile_interval_s")
    scan_interval_without_events_s: float = CONFIG_SPEC.default_of("scan_interval_without_events_s")
    http_listen: str = HTTP_SPEC.default_of("listen")
    http_port: int = HTTP_SPEC.default_of("port")
    control_socket: str = CONTROL_SPEC.default_of("socket")
    control_group: str = CONTROL_SPEC.default_of("group")
    tier_weights: Dict[str, int] = field(default_factory=lambda: tier_defaults("weight"))
    tier_idle_resume_us: Dict[str, int] = field(default_factory=lambda: tier_defaults("idle_resume_us"))
    trust_users: Tuple[str, ...] = tuple(TRUST_SPEC.default_of("users"))
    trust_groups: Tuple[str, ...] = tuple(TRUST_SPEC.default_of("groups"))
    bindings: Tuple[Binding, ...] = ()
    scx: ScxSettings = field(default_factory=lambda: ScxSettings())
    lint_runqueue_latency_p99_ms: float = LINT_SPEC.default_of("runqueue_latency_p99_ms")
    learner: LearnerSettings = field(default_factory=lambda: LearnerSettings())
    telemetry_bpf: bool = TELEMETRY_SPEC.default_of("bpf")

    def scan_interval(self, events_active: bool) -> float:
        """Seconds until the next full /proc scan."""
        return self.reconcile_interval_s if events_active else self.scan_interval_without_events_s


def config_from_document(doc: TomlDocument) -> DaemonConfig:
    v = Validator(doc)
    values = v.table(doc.data, CONFIG_SPEC)
    bindings: List[Binding] = []
    raw = doc.data.get("binding") if isinstance(doc.data.get("binding"), list) else []
    for index, b in enumerate(values["binding"] or []):
        # Presence as written: a cgroup with a bad value is not also reported missing.
        if ("unit" in raw[index]) == ("cgroup" in raw[index]):
            v.fail(("binding", index), "expected exactly one of unit, cgroup")
            continue
        if b.get("unit") is None and b.get("cgroup") is None:
            continue
        bindings.append(Binding(tier=b["tier"], unit=b.get("unit"), cgroup=b.get("cgroup"),
                                profile=b.get("profile"), cpus=b.get("cpus"), index=index))
    if v.problems:
        raise ConfigError(sorted(v.problems, key=lambda p: p.line or 0))
    tiers = values["tiers"]  # every tier's table, its absent keys at their declared defaults
    http, control, scx, trust = values["http"], values["control"], values["scx"], values["trust"]
    return DaemonConfig(
        source=doc.file,
        **{key: values[key] for key in ("backend", "profile_dir", "state_dir", "default_tier", "reserve_cpus",
                                        "reconcile_interval_s", "scan_interval_without_events_s")},
        http_listen=http["listen"],
        http_port=http["port"],
        control_socket=control["socket"],
        control_group=control["group"],
        tier_weights={name: tiers[name]["weight"] for name in TIERS},
        tier_idle_resume_us={name: tiers[name]["idle_resume_us"] for name in TIERS},
        trust_users=tuple(trust["users"]),
        trust_groups=tuple(trust["groups"]),
        bindings=tuple(bindings),
        scx=ScxSettings(**{**scx, "args": tuple(scx["args"])}),
        lint_runqueue_latency_p99_ms=values["lint"]["runqueue_latency_p99_ms"],
        telemetry_bpf=values["telemetry"]["bpf"],
        learner=LearnerSettings(classify=values["classify"]["enabled"], window_s=values["classify"]["window_s"],
                                metrics_interval_s=values["classify"]["metrics_interval_s"],
                                rightsizing=values["rightsizing"]["enabled"],
                                **{k: v for k, v in values["rightsizing"].items() if k != "enabled"}),
    )


def load_config(config_dir: str = DEFAULT_CONFIG_DIR, require_trusted: bool = False) -> DaemonConfig:
    """temperd.toml from the directory; defaults when there is none (profile_dir beside it).
    A directory named on purpose must exist: only the default one may be absent (a fresh host).
    The daemon requires the file to be trusted (root's, writable by nobody else): it names the
    cgroups that get a tier and the scx_layered binary temperd runs as root."""
    if not os.path.isdir(config_dir) and (os.path.exists(config_dir) or config_dir != DEFAULT_CONFIG_DIR):
        what = "is not a directory" if os.path.exists(config_dir) else "does not exist"
        raise ConfigError([ConfigProblem(config_dir, (), f"{what}; expected the directory of {CONFIG_FILE}")])
    path = os.path.join(config_dir, CONFIG_FILE)
    if not os.path.lexists(path):
        return DaemonConfig(source=f"{path} (absent: defaults)",
                            profile_dir=os.path.join(config_dir, CONFIG_SPEC.default_of("profile_dir")))
    config = config_from_document(read_toml(path, require_trusted))
    # profiles.d lives beside temperd.toml unless the file says otherwise (relative = to the file).
    return dataclasses.replace(config, profile_dir=os.path.join(config_dir, config.profile_dir))


def check_binding_profiles(config: DaemonConfig, known_ids) -> List[ConfigProblem]:
    """Bindings that name a profile no loaded profile has."""
    return [ConfigProblem(config.source, ("binding", b.index, "profile"),
                          f"expected the id of a loaded profile ({', '.join(sorted(known_ids))}), found {b.profile!r}")
            for b in config.bindings if b.profile is not None and b.profile not in known_ids]
