"""The arms of the isolation bench: ways of scheduling a host that runs one server beside CPU
spinners. Each is a harness.Arm (temperd/training/harness.py); `make_arms()` builds them for one server.

  stock         nothing changed: the kernel's scheduler as installed.
  by-hand       what a careful operator does without temperd (BY_HAND_COMMANDS says it exactly):
                the server pinned with taskset to the CPUs temperd would give it, the spinners
                started with `nice -n 19 chrt --idle 0`.
  temperd       `[[binding]] cgroup = <server's> tier = "critical" profile = <builtin> cpus = 1.0`;
                the spinners untagged (standard tier). The exclusive group's CPUs are owned:
                others may run there while the server's threads sleep.
  temperd+bg    the same plus `[[binding]] cgroup = <spinners'> tier = "background"`.
  temperd+bg-fenced
                temperd+bg with a file profile overriding the builtin: `ownership = "fenced"` on
                the exclusive group (no other thread runs on its CPUs, even while it sleeps).
  temperd+bg-ownerslice
                temperd+bg with a file profile overriding the builtin: `slice_us = 100` on the
                exclusive group (a waking owner preempts a fair borrower).
  temperd-nopoll, temperd+bg-nopoll
                those with `[tiers.critical] idle_resume_us = -1`: the owned CPUs sleep while
                idle, as they did before the critical tier's default bound of 0 (which keeps
                them polling: pm_qos_resume_latency_us "n/a").
  scx, scx+bg   temperd and temperd+bg with backend = "scx": scx_layered carries the plan.
  scx-bare      no temperd: scx_layered started by hand with one Open layer for every task. What
                the BPF scheduler costs beside stock whatever the plan, so that an scx arm's
                miss can be split into the scheduler's share and the render's.
  trained       temperd+bg with a profile file given on the command line (what `temperctl train`
                wrote) instead of the builtin.

A new arm is one more entry in the table `make_arms()` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence

import common as C

from temperd.backends.scx.process import terminate  # noqa: E402
from temperd.backends.scx.stats import StatsClient, StatsError, SysStats  # noqa: E402
from temperd.config.profile import parse_profile  # noqa: E402
from temperd.plan import CONFINED, EXCLUSIVE, FENCED  # noqa: E402
from temperd.training.harness import Arm, ScratchCgroup  # noqa: E402

STOCK, BY_HAND, TEMPERD, TEMPERD_BG = "stock", "by-hand", "temperd", "temperd+bg"
TEMPERD_BG_FENCED = "temperd+bg-fenced"
TEMPERD_BG_OWNERSLICE = "temperd+bg-ownerslice"
NOPOLL, NOPOLL_BG = "temperd-nopoll", "temperd+bg-nopoll"
SCX, SCX_BG, SCX_BARE = "scx", "scx+bg", "scx-bare"
TRAINED = "trained"
DEFAULT_ARMS = (STOCK, BY_HAND, TEMPERD_BG, TEMPERD_BG_FENCED)
NO_POLL_SETTINGS = "[tiers.critical]\nidle_resume_us = -1\n"
SCX_STATE = "/sys/kernel/sched_ext/state"
SCX_STATS_SOCKET = "/var/run/scx/root/stats"
SCX_ATTACH_S = 180.0  # scx_layered's BPF load and attach (about 30 s under software emulation)
PMQOS_FILE = "/sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"

# The operator's commands, exactly as the by-hand arm runs them ({cpus}, {pid}: the server's).
BY_HAND_SERVER = "taskset -a -p -c {cpus} {pid}"  # every thread of the running server (CPUAffinity= in its unit)
BY_HAND_SPINNERS = ("nice", "-n", "19", "chrt", "--idle", "0")  # prefix of the batch job's command line
BY_HAND_COMMANDS = (f"server: `{BY_HAND_SERVER}` (each process of the server); "
                    f"batch job: `{' '.join(BY_HAND_SPINNERS)} <command>`")


@dataclass(frozen=True)
class BenchArm(Arm):
    """An arm plus what must hold once the spinners run under it."""

    spinners_kept_off: bool = False  # the spinners' affinity excludes the exclusive CPUs (native temperd)
    spinner_policy: Optional[int] = None  # the policy the spinners must have (SCHED_IDLE)
    # The spinners start before the arm enters (scx: scx_layered attaches once, with their layer,
    # instead of being restarted for it under their load).
    spinners_first: bool = False
    # Once the spinners run, before the measured window: wait until the arm has taken them in;
    # returns why not ("" when it has).
    settle: Optional[Callable[[Sequence[int]], str]] = None


@dataclass
class ServerUnderTest:
    """What the arms need to know about the server: its processes, cgroup, profile."""

    name: str
    profile_id: str
    exclusive_group: str
    server_cgroup: ScratchCgroup
    spinner_cgroup: ScratchCgroup
    pids: Callable[[], List[int]]  # the server's processes now (process-per-connection servers change)
    treated: Callable[[FrozenSet[int]], bool]  # the plan is in force for the server (given exclusive CPUs)
    trained_profile: Optional[str] = None  # a profile file for the trained arm
    expects_exclusive: bool = True  # false where no thread can match the exclusive group (MariaDB 10.11)
    profile_arms: Dict[str, str] = field(default_factory=dict)  # more arms like it: name -> profile file
    # The rightsizing history every temperd arm shares, as one long-running temperd keeps it
    # (None: temperd's default file): exclusive groups are sized from what it measured.
    history_file: Optional[str] = None


def temperd_bindings(server: ServerUnderTest, background: bool, profile_id: str) -> str:
    binding = (f'[[binding]]\ncgroup = "{server.server_cgroup.relative}"\ntier = "critical"\n'
               f'profile = "{profile_id}"\ncpus = 1.0\n')
    if background:
        binding += f'[[binding]]\ncgroup = "{server.spinner_cgroup.relative}"\ntier = "background"\n'
    return binding


def fenced_profile(server: ServerUnderTest) -> str:
    """The builtin profile with its exclusive group fenced instead of owned."""
    return edited_builtin(server, 'ownership = "fenced"')


def owner_slice_profile(server: ServerUnderTest) -> str:
    """The builtin profile with its exclusive group's owners at a 100 us slice."""
    return edited_builtin(server, "slice_us = 100")


def edited_builtin(server: ServerUnderTest, line: str) -> str:
    """The builtin profile with `line` added to its exclusive group. Read from the temperd package,
    so that it is found where only bench/ was copied beside an installed temperd (the VM test)."""
    text = (resources.files("temperd.builtin_profiles") / f"{server.profile_id}.toml").read_text(encoding="utf-8")
    marker = f'name = "{server.exclusive_group}"\n'
    if marker not in text:
        raise SystemExit(f"profiles/{server.profile_id}.toml has no thread group {server.exclusive_group!r}")
    return text.replace(marker, marker + line + "\n", 1)


def profile_id_of(text: str) -> str:
    match = re.search(r'^id\s*=\s*"([^"]+)"', text, re.M)
    if not match:
        raise SystemExit("the trained profile has no id")
    return match.group(1)


def exclusive_group_layer(status: dict, group: str) -> Optional[dict]:
    """The layer of the profile's exclusive group in temperd's status (None: no such layer)."""
    found = [layer for layer in status["layers"] if group and layer["name"].endswith("." + group)]
    return found[0] if found else None


def applied(daemon) -> bool:
    """temperd has carried out a plan (its last apply is in the status)."""
    return daemon.status()["last_apply"] is not None


def exclusive_cpus(status: dict) -> FrozenSet[int]:
    return frozenset(c for layer in status["layers"] if layer["kind"] == CONFINED for c in layer["cpus"])


@contextlib.contextmanager
def temperd_arm(server: ServerUnderTest, background: bool, backend: str = "native",
                profiles: Optional[Dict[str, str]] = None, profile_id: str = "",
                expects_exclusive: Optional[bool] = None, settings: str = "") -> Iterator[Dict[str, object]]:
    """temperd running with the server's critical-tier binding (and the spinners' background one);
    yields once the plan is in force: notes with the exclusive CPUs. expects_exclusive: the
    profile has an exclusive group some thread matches (default: the server's builtin's)."""
    if expects_exclusive is not None:
        server = dataclasses.replace(server, expects_exclusive=expects_exclusive)
    bindings = temperd_bindings(server, background, profile_id or server.profile_id)
    if server.history_file:
        settings += f'[rightsizing]\nhistory_file = "{server.history_file}"\n'
    with C.running_temperd(bindings=bindings, profiles=profiles or {}, backend=backend, settings=settings,
                           ready_timeout_s=SCX_ATTACH_S if backend == "scx" else 60.0) as daemon:
        status = daemon.status()
        if status["profiles"]["failed"]:
            raise RuntimeError(f"temperd did not load a profile: {status['profiles']['failed']}")
        def planned():  # exclusive CPUs, or the group demoted (sized from use: too big for them)
            status = daemon.status()
            group = exclusive_group_layer(status, server.exclusive_group)
            return exclusive_cpus(status) or (group is not None and group["treatment"] != EXCLUSIVE)

        C.wait_until(planned, 10.0 if server.expects_exclusive else 2.0)
        exclusive = exclusive_cpus(daemon.status())
        group = exclusive_group_layer(daemon.status(), server.exclusive_group)
        demoted = bool(group) and group["treatment"] != EXCLUSIVE
        if not exclusive and server.expects_exclusive and not demoted:
            raise RuntimeError(f"temperd made no exclusive layer for {server.name}: {daemon.status()['workloads']}")
        if backend == "scx":
            wait_for_scx(daemon)
            _scx_daemons.append(daemon)
        # A group demoted at nice 0 changes nothing a thread shows: its layer in the status, with
        # an apply made (the status is read under the lock the apply holds), is the plan in force.
        elif not C.wait_until(lambda: server.treated(exclusive) or (demoted and applied(daemon)), 10.0):
            raise RuntimeError(f"{server.name} is not on CPUs {C.cpulist(exclusive)} after 10 s")
        try:
            yield {"exclusive": C.cpulist(exclusive) if exclusive else "",
                   "group": (f"{group['kind']} {group['treatment']}" + (f" ({group['ownership']})" if group.get("ownership") else "")
                             + f" CPUs {C.cpulist(group['cpus'])}") if group else "-",
                   "pmqos": "/".join(C.read_text(PMQOS_FILE.format(cpu=c), "?") for c in sorted(exclusive)),
                   "temperd_ready_s": daemon.ready_after_s}
        finally:
            if daemon in _scx_daemons:
                _scx_daemons.remove(daemon)


@contextlib.contextmanager
def by_hand_arm(server: ServerUnderTest, cpus: FrozenSet[int]) -> Iterator[Dict[str, object]]:
    """The server's processes pinned with taskset to `cpus`; put back on every online CPU after."""
    online = C.cpulist(_online())
    pinned: List[int] = []
    try:
        for pid in server.pids() if cpus else ():  # temperd gives no CPU of its own: nothing to pin
            _taskset(BY_HAND_SERVER.format(cpus=C.cpulist(cpus), pid=pid))
            pinned.append(pid)
        yield {"exclusive": C.cpulist(cpus) if cpus else ""}
    finally:
        for pid in pinned:
            with contextlib.suppress(RuntimeError):
                _taskset(BY_HAND_SERVER.format(cpus=online, pid=pid))


def _taskset(command: str) -> None:
    out = subprocess.run(command.split(), capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise RuntimeError(f"{command}: {out.stderr.strip()[-200:]}")


def _online() -> FrozenSet[int]:
    from temperd.sources.shape import online_cpus

    return frozenset(online_cpus())


def warm_history(workload, server, under: ServerUnderTest, variant: str, seconds: float, timeout_s: float) -> str:
    """temperd with the server's binding under `variant`'s load for `seconds` (no spinners), so the
    runs that follow find the history a temperd running for a while has (exclusive groups sized
    from use); returns what temperd then plans for the exclusive group."""
    amount = workload.size(server, variant, seconds, timeout_s)
    with temperd_arm(under, background=False):
        out = subprocess.run(workload.load_argv(server, variant, amount), capture_output=True, text=True,
                             timeout=timeout_s)
        if out.returncode != 0:
            raise SystemExit(f"warming the history: {workload.tool} exited with {out.returncode}")
    with temperd_arm(under, background=False) as notes:
        return str(notes["group"])


def planned_cpus(server: ServerUnderTest) -> FrozenSet[int]:
    """The exclusive CPUs temperd gives the server (its builtin profile, critical tier): the CPUs
    the by-hand arm pins it to. Asked of a short temperd run, once."""
    with temperd_arm(server, background=False) as notes:
        return frozenset(int(c) for c in str(notes["exclusive"]).split(",") if c)


@contextlib.contextmanager
def stock_arm() -> Iterator[Dict[str, object]]:
    yield {}


# scx-bare's config: one Open layer that matches every task (as temperd's catch-all `rest` layer).
BARE_CONFIG = [{"name": "all", "comment": "every task", "matches": [[]], "kind": {"Open": {}}}]


@contextlib.contextmanager
def scx_bare_arm() -> Iterator[Dict[str, object]]:
    """scx_layered with BARE_CONFIG, started by hand; stopped (SIGTERM) on exit."""
    binary = shutil.which("scx_layered")
    if binary is None:
        raise RuntimeError("scx_layered is not installed: no scx-bare arm")
    workdir = tempfile.mkdtemp(prefix="scx-bare-")
    config, log_path = os.path.join(workdir, "scx_layered.json"), os.path.join(workdir, "scx_layered.log")
    with open(config, "w") as handle:
        json.dump(BARE_CONFIG, handle)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([binary, f"f:{config}"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        def attached() -> bool:
            client = StatsClient(SCX_STATS_SOCKET, 5.0)
            try:
                client.stats()
            except (OSError, ValueError, StatsError):  # not serving yet
                return False
            finally:
                client.close()
            return scx_state() == "enabled"
        if not C.wait_until(lambda: proc.poll() is not None or attached(), SCX_ATTACH_S) or proc.poll() is not None:
            raise RuntimeError(f"scx_layered (one layer) did not attach within {SCX_ATTACH_S:.0f} s "
                               f"(exit {proc.poll()}): {C.read_text(log_path)[-500:]}")
        yield {"exclusive": "", "group": "-"}
    finally:
        terminate(proc, 30.0)
        C.wait_until(lambda: scx_state() == "disabled", 30.0)
        shutil.rmtree(workdir, ignore_errors=True)


def make_arms(server: ServerUnderTest, by_hand_cpus: FrozenSet[int]) -> Dict[str, BenchArm]:
    idle = os.SCHED_IDLE
    # Read when the arm is entered, not when the arms are listed.
    fenced = lambda: {f"{server.profile_id}.toml": fenced_profile(server)} if server.exclusive_group else {}  # noqa: E731
    owner_slice = lambda: ({f"{server.profile_id}.toml": owner_slice_profile(server)}  # noqa: E731
                           if server.exclusive_group else {})
    arms = [
        BenchArm(STOCK, "the kernel's scheduler as installed", stock_arm),
        BenchArm(BY_HAND, f"by hand: {BY_HAND_COMMANDS}", lambda: by_hand_arm(server, by_hand_cpus),
                 spinner_wrapper=BY_HAND_SPINNERS, spinner_policy=idle),
        BenchArm(TEMPERD, "temperd, builtin profile (owned CPUs), critical tier; spinners untagged",
                 lambda: temperd_arm(server, False)),
        BenchArm(TEMPERD_BG, "temperd, builtin profile (owned CPUs), critical tier; spinners in the background tier",
                 lambda: temperd_arm(server, True), spinner_policy=idle),
        BenchArm(TEMPERD_BG_FENCED, "temperd+bg with the exclusive group fenced (ownership = \"fenced\")",
                 lambda: temperd_arm(server, True, profiles=fenced()), spinners_kept_off=True, spinner_policy=idle),
        BenchArm(TEMPERD_BG_OWNERSLICE, "temperd+bg with the exclusive group's owners at a 100 us slice "
                 "(slice_us = 100)", lambda: temperd_arm(server, True, profiles=owner_slice()), spinner_policy=idle),
        BenchArm(NOPOLL, "temperd with no resume bound on the owned CPUs ([tiers.critical] idle_resume_us = -1)",
                 lambda: temperd_arm(server, False, settings=NO_POLL_SETTINGS)),
        BenchArm(NOPOLL_BG, "temperd+bg with no resume bound on the owned CPUs ([tiers.critical] idle_resume_us = -1)",
                 lambda: temperd_arm(server, True, settings=NO_POLL_SETTINGS), spinner_policy=idle),
        BenchArm(SCX, "temperd with backend = scx (scx_layered places the threads)",
                 lambda: temperd_arm(server, False, backend="scx"), during=scx_window, spinners_first=True),
        BenchArm(SCX_BG, "temperd+bg with backend = scx",
                 lambda: temperd_arm(server, True, backend="scx"), during=scx_window, spinners_first=True,
                 settle=scx_settled),
        # The spinners start after it attached: at nice 0 on every CPU they would slow its BPF load.
        BenchArm(SCX_BARE, "scx_layered by hand, one Open layer for every task (no temperd)", scx_bare_arm,
                 during=scx_window),
    ]
    files = dict(server.profile_arms, **({TRAINED: server.trained_profile} if server.trained_profile else {}))
    arms += [profile_arm(server, name, path) for name, path in files.items()]
    return {arm.name: arm for arm in arms}


def profile_arm(server: ServerUnderTest, name: str, path: str) -> BenchArm:
    """temperd+bg with the server bound to the profile in `path` (a trained one, or a variant of it)."""
    with open(path) as handle:
        text = handle.read()
    groups = [g for g in parse_profile(text, path).thread_groups if g.treatment == EXCLUSIVE]
    # Only a fence keeps the spinners off the exclusive CPUs; owned ones are lent to them.
    return BenchArm(name, f"temperd+bg with the profile {profile_id_of(text)!r} ({os.path.basename(path)})",
                    lambda: temperd_arm(server, True, profiles={"trained.toml": text},
                                        profile_id=profile_id_of(text),
                                        expects_exclusive=bool(groups) and server.expects_exclusive),
                    spinners_kept_off=any(g.ownership == FENCED for g in groups), spinner_policy=os.SCHED_IDLE)


def train_profile(workload, server, variant: str, seconds: float, path: str, timeout_s: float) -> None:
    """`temperctl train --direct` on the server for `seconds` under `variant`'s load (sized for
    twice as long; temperctl stops it at the end); prints each group it found."""
    amount = workload.size(server, variant, 2 * seconds, timeout_s)
    argv = [os.path.join(C.BINDIR, "temperctl"), "train", "--pid", str(server.pid), "--duration", f"{seconds:g}s",
            "--load", shlex.join(workload.load_argv(server, variant, amount)), "--id", f"{workload.name}-trained",
            "-o", path, "--direct", "--no-report", "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 300)
    if out.returncode != 0:
        raise SystemExit(f"temperctl train failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    result = json.loads(out.stdout)
    print(f"trained {path} under {workload.describe(variant, amount)} for {seconds:g} s:")
    for group in result["groups"]:
        members = sorted({t["comm"] for t in result["threads"] if t["group"] == group["name"]})
        print(f"  {group['name']}: {group['class']}, {group['treatment']}, {group['threads']} threads "
              f"({', '.join(members[:6])}{' ...' if len(members) > 6 else ''}), CPU share {group['cpu_share']:.2f}")


# ---- scx_layered: attach and per-layer stats over a run ---------------------------------------------------


def scx_state() -> str:
    return C.read_text(SCX_STATE, "-")


# The temperd of the scx arm now in force (set by temperd_arm), for scx_settled, which runs later.
_scx_daemons: List[C.TemperdProcess] = []


def scx_settled(spinners: Sequence[int]) -> str:
    """Spinners in a tier layer of their own are part of scx_layered's config: wait until temperd
    has planned their layer, no restart is pending, and the scx_layered that carries it has been
    read. A window measured across a restart would mix two schedulers (and its stats connection
    would break), hence also spinners_first for the scx arms."""
    if not spinners or not _scx_daemons:
        return ""
    daemon = _scx_daemons[-1]
    deadline = time.monotonic() + SCX_ATTACH_S
    reads_when_settled = None
    last: dict = {}
    while time.monotonic() < deadline:
        status = daemon.status()
        last = status["backend"]
        supervisor = last.get("scx_layered") or {}
        # the spinners' cgroup is empty until they start: its tier layer exists once they are planned
        planned = any(layer["name"].endswith(".tier") for layer in status["layers"])
        settled = planned and _scx_carries(last) and not supervisor.get("pending_change")
        if not settled:
            reads_when_settled = None
        elif reads_when_settled is None:
            reads_when_settled = supervisor.get("stats_reads", 0)
        elif supervisor.get("stats_reads", 0) > reads_when_settled:
            return ""
        time.sleep(0.5)
    supervisor = last.get("scx_layered") or {}
    tiers = [(layer["name"], layer["members"]) for layer in status["layers"] if layer["name"].endswith(".tier")]
    return (f"scx_layered did not settle with the {len(spinners)} spinners in their layer within {SCX_ATTACH_S:.0f} s: "
            f"sched_ext {scx_state()}, carried by {last.get('carried_by')}, scx_layered {supervisor.get('state')}, "
            f"change pending {supervisor.get('pending_change')}, stats reads {supervisor.get('stats_reads')}, "
            f"restarts {supervisor.get('restarts')}, crashes {supervisor.get('crashes')}, tier layers {tiers}")


def _scx_carries(backend_status: dict) -> bool:
    """temperd's backend status says a running scx_layered carries the plan."""
    supervisor = backend_status.get("scx_layered") or {}
    return backend_status.get("carried_by") == "scx" and supervisor.get("state") == "running"


def wait_for_scx(daemon: C.TemperdProcess) -> None:
    """scx_layered places the threads itself (affinities stay as they were): wait until it
    carries the plan and temperd has read its stats."""
    def attached():
        backend_status = daemon.status()["backend"]
        supervisor = backend_status.get("scx_layered") or {}
        return _scx_carries(backend_status) and supervisor.get("stats_reads", 0) > 0, backend_status

    ok, last = attached()
    deadline = time.monotonic() + SCX_ATTACH_S
    # The native backend holds the plan while scx_layered loads; safe mode or a plan it cannot
    # express keeps it there.
    while not ok and time.monotonic() < deadline and not (last.get("safe_mode") or last.get("render_problems")):
        time.sleep(1.0)
        ok, last = attached()
    if not ok:
        raise RuntimeError(f"scx_layered does not carry the plan (sched_ext {scx_state()}): "
                           f"backend {last.get('active')}, carried by {last.get('carried_by')}: "
                           f"{last.get('fallback_reason') or last.get('reason') or last.get('safe_mode_reason')}")


def scx_summary(stats: SysStats) -> Dict[str, dict]:
    """What scx_layered said about each layer over a run: tasks, CPUs it held, CPU use (100 = one
    CPU), the share of it on protected CPUs, and its own affinity violations; "" = the whole system
    (lo_fb_util: CPU use from the low fallback queue, where the yield layers run)."""
    out: Dict[str, dict] = {"": {k: getattr(stats, k) for k in ("busy", "util", "affn_viol", "lo_fb", "lo_fb_util",
                                                               "antistall")}}
    for name, layer in stats.layers.items():
        out[name] = {k: getattr(layer, k) for k in ("tasks", "cur_nr_cpus", "util", "util_protected_frac", "affn_viol")}
        out[name]["cpus"] = C.cpulist(layer.cpus or set())
    return out


@contextlib.contextmanager
def scx_window() -> Iterator[Dict[str, object]]:
    """Around the measured window: scx_layered's per-layer stats over it, kept as notes["scx"]."""
    notes: Dict[str, object] = {}
    stats = StatsClient(SCX_STATS_SOCKET, 10.0)  # one connection of our own: its replies are deltas since its last
    try:
        stats.stats()
        yield notes
        try:
            notes["scx"] = scx_summary(stats.stats())
        except OSError as exc:  # the socket went with the scx_layered that served it
            raise RuntimeError(f"scx_layered's stats connection broke during the run ({exc.strerror or exc}; "
                               f"sched_ext now {scx_state()}): scx_layered exited or was restarted, "
                               f"so the run was not carried by one scx_layered throughout") from None
    finally:
        stats.close()


def restored_host(server_pids: Sequence[int], pmqos_originals: Dict[int, str]) -> str:
    """Why the host is not back to what it was before any arm ran ("" when it is): our affinity and
    the server's, PM QoS values, sched_ext."""
    online = _online()
    for who, pid in (("this benchmark", os.getpid()), *(("the server", p) for p in server_pids)):
        found = C.affinity_of(pid)
        if found is not None and found != online:
            return f"{who} (pid {pid}) has affinity {C.cpulist(found)} before a stock run: not restored"
    for cpu, original in pmqos_originals.items():
        found = C.read_text(PMQOS_FILE.format(cpu=cpu), "?")
        if found != original:
            return f"CPU {cpu} pm_qos_resume_latency_us is {found!r}, was {original!r}: not restored"
    if os.path.exists(SCX_STATE) and not C.wait_until(lambda: scx_state() == "disabled", 20.0):
        return f"sched_ext is {scx_state()} before a stock run: scx_layered did not exit"
    return ""


def pmqos_values() -> Dict[int, str]:
    return {cpu: C.read_text(PMQOS_FILE.format(cpu=cpu), "?") for cpu in sorted(_online())}
