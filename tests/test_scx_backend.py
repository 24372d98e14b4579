"""The scx backend: scx_layered carries the plan; the native backend takes over where it cannot.

scx_layered here is tests/standins/fake_scx_layered.py, a STAND-IN: the real binary needs a
kernel with sched_ext (CONFIG_SCHED_CLASS_EXT), which this host does not have. The stand-in
takes the config the way scx_layered does, serves its stats protocol, exits 0 on SIGTERM and
crashes when told. sched_ext's sysfs files are a fake tree the stand-in updates while attached.
The native fallback is real: thread settings are read back from /proc.
The real scx_layered 1.1.2 runs where it can: tests/test_scx_real_binary.py (its config
checks, on this host through trixie's glibc) and the VM test's scx_* steps (loaded for real);
what it did there that the stand-in does differently is in the stand-in's docstring.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest
import status_sample
from fixture_shapes import fixture_root
from test_native_backend import layer
from test_native_backend import make_backend as native_backend
from test_scx_supervisor import STANDIN, alive, fake_sysfs
from thread_children import nice_of, wait_for

from temperd.backends.native.backend import scan_threads
from temperd.backends.scx.backend import NATIVE, SCX, ScxBackend
from temperd.backends.scx.restarts import RestartPolicy
from temperd.backends.scx.stats import SysStats, layer_cpus
from temperd.backends.scx.supervisor import ScxSupervisor
from temperd.backends.select import make_backend
from temperd.backends.status import BackendStatus
from temperd.config.daemon_config import DaemonConfig, ScxSettings
from temperd.control.status import GapView, ScxStatsView, ScxView
from temperd.control.typed_json import to_json
from temperd.daemon import status_report
from temperd.daemon.daemon import Daemon
from temperd.observe.linter import lint
from temperd.observe.metrics import Metrics
from temperd.control.status import OverheadView
from temperd.observe.observer import Observation, ThreadSample
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, LATENCY, OPEN, OWNED, LayerPlan
from temperd.sources.shape import read_shape

WAIT_S = 15.0
BINDIR = os.path.dirname(sys.executable)


class StandinEnv:
    """A fake sched_ext sysfs, a short stats socket path and the stand-in's event record."""

    def __init__(self, tmp_path, monkeypatch):
        self.short = tempfile.mkdtemp(prefix="scxb", dir="/tmp")
        self.socket = os.path.join(self.short, "stats")
        self.sysfs = str(tmp_path / "sys")
        shutil.copytree(fixture_root("this-host"), self.sysfs)  # this host's CPUs: the fallback pins real ones
        fake_sysfs(self.sysfs, "disabled")
        self.record = str(tmp_path / "record.jsonl")
        for key, value in (("FAKE_SCX_STATS_SOCKET", self.socket), ("FAKE_SCX_SYSFS", self.sysfs),
                           ("FAKE_SCX_RECORD", self.record), ("FAKE_SCX_NR_CPUS", "2")):
            monkeypatch.setenv(key, value)
        self.monkeypatch = monkeypatch

    def attaches(self):
        if not os.path.exists(self.record):
            return []
        with open(self.record) as handle:
            return [e for e in map(json.loads, handle) if e["event"] == "attach"]

    def close(self):
        for event in self.attaches():  # nothing a test started outlives it
            if alive(event["pid"]):
                os.kill(event["pid"], signal.SIGKILL)
        shutil.rmtree(self.short, ignore_errors=True)


@pytest.fixture
def standin(tmp_path, monkeypatch):
    env = StandinEnv(tmp_path, monkeypatch)
    yield env
    env.close()


@pytest.fixture
def scx_backends(tmp_path):
    made = []

    def make(env, policy=RestartPolicy(batch_s=0.1, min_interval_s=0.2), cpu_count=2):
        sup = ScxSupervisor(STANDIN, str(tmp_path / "state"), env.socket, sysfs_root=env.sysfs, policy=policy,
                            cpu_count=cpu_count)
        backend = ScxBackend(sup, native_backend(tmp_path / "state"), cpu_count)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.stop()


def two_layer_plan(kid):
    return LayerPlan(layers=(
        layer("app.hot", CONFINED, EXCLUSIVE, tids=[kid.threads["sb-hot"]], pids=[kid.pid], cpus=[1],
              comm=["sb-hot"], protected=True),
        layer("app.rest", OPEN, LATENCY, tids=[kid.threads["sb-rest"]], pids=[kid.pid], catch_all=True, nice=-4),
    ), reserve_cpus=(0,))


def too_many_layers(kid):
    return LayerPlan(layers=tuple(layer(f"app.l{i}", OPEN, LATENCY, tids=[kid.threads["sb-rest"]], pids=[kid.pid],
                                        comm=[f"sb-{i}"], nice=-4) for i in range(16)), reserve_cpus=(0,))


# ---- the backend, driven directly ------------------------------------------------------------------

def test_scx_layered_carries_the_plan_and_leaves_threads_alone(standin, scx_backends, children):
    kid = children.spawn(["sb-hot", "sb-rest"])
    backend = scx_backends(standin)
    asked = []
    backend.on_carrier_change = asked.append
    backend.apply(two_layer_plan(kid), scan_threads([kid.pid]))
    # Until scx_layered attaches the kernel's default scheduler runs: the native backend holds the plan.
    assert backend.carried_by == NATIVE and "until it attaches" in backend.fallback_reason
    assert nice_of(kid.pid, kid.threads["sb-rest"]) == -4
    wait_for(lambda: "scx_layered attached" in asked, WAIT_S, "the replan asked for at the attach")
    result = backend.apply(two_layer_plan(kid), scan_threads([kid.pid]))  # what the daemon's replan does
    assert not result.applied and not result.failed  # nothing per thread: scx_layered schedules them
    # nice put back on the two threads of the rest layer (sb-rest and the main thread)
    assert result.restored.get("nice") == 2 and any("CPU numbers become CPU counts" in n for n in result.notes)
    assert os.sched_getaffinity(kid.threads["sb-hot"]) == set(range(os.cpu_count()))  # the native pin put back
    (attach,) = standin.attaches()
    specs = {s["name"]: s for s in attach["specs"]}
    assert specs["app.hot"]["kind"][CONFINED]["cpus_range"] == [1, 1]
    assert list(specs)[-1] == "rest"
    assert nice_of(kid.pid, kid.threads["sb-rest"]) == 0
    status = backend.status()
    assert status.carried_by == SCX and status.scx.fallback_reason is None and not status.scx.safe_mode
    assert list(to_json(status.scx)) == ["fallback_reason", "safe_mode", "safe_mode_reason", "render_notes",
                                           "render_problems", "scx_layered", "scx_stats"]  # as temperctl status shows it
    wait_for(lambda: backend.status().scx.scx_stats.layers.get("app.hot"), WAIT_S, "stats read")
    assert backend.layer_cpus()["app.hot"] == frozenset({1})  # the stand-in hands out CPUs from the top


def test_unexpressible_plan_is_carried_natively_and_says_why(standin, scx_backends, children):
    kid = children.spawn(["sb-hot", "sb-rest"])
    backend = scx_backends(standin)
    result = backend.apply(too_many_layers(kid), scan_threads([kid.pid]))
    assert backend.carried_by == NATIVE
    assert "cannot be expressed" in backend.fallback_reason and "exceed scx_layered's 16" in backend.fallback_reason
    assert result.applied.get("nice") == 1 and nice_of(kid.pid, kid.threads["sb-rest"]) == -4
    assert backend.layer_cpus() is None  # the plan's own CPU numbers are real now
    assert standin.attaches() == []
    # An expressible plan again: scx_layered starts; once attached it takes over and the native
    # settings are put back.
    backend.apply(two_layer_plan(kid), scan_threads([kid.pid]))
    assert backend.carried_by == NATIVE and nice_of(kid.pid, kid.threads["sb-rest"]) == -4
    wait_for(lambda: backend.status().scx.scx_layered.state == "running", WAIT_S, "scx_layered attached")
    result = backend.apply(two_layer_plan(kid), scan_threads([kid.pid]))
    assert backend.carried_by == SCX and result.restored.get("nice") == 2
    assert nice_of(kid.pid, kid.threads["sb-rest"]) == 0
    assert standin.attaches()


def test_refusal_beside_another_scheduler_falls_back_with_its_name(standin, scx_backends, children):
    kid = children.spawn(["sb-hot", "sb-rest"])
    fake_sysfs(standin.sysfs, "enabled", "minimal")  # loaded after temperd chose scx
    backend = scx_backends(standin)
    asked = []
    backend.on_carrier_change = asked.append
    backend.apply(two_layer_plan(kid), scan_threads([kid.pid]))
    wait_for(lambda: asked, WAIT_S, "the fallback request")
    assert "'minimal' is loaded" in asked[0]
    backend.apply(two_layer_plan(kid), scan_threads([kid.pid]))  # what the daemon's replan does
    assert backend.carried_by == NATIVE and "'minimal'" in backend.fallback_reason
    assert nice_of(kid.pid, kid.threads["sb-rest"]) == -4
    assert backend.status().scx.scx_layered.refusals == 1 and standin.attaches() == []


def test_make_backend_chooses_scx_only_where_it_can_run(standin, tmp_path):
    shape = read_shape(standin.sysfs)
    scx = DaemonConfig(backend="scx", state_dir=str(tmp_path / "state"),
                       scx=ScxSettings(binary=STANDIN, stats_socket=standin.socket))
    choice, backend = make_backend(scx, standin.sysfs, shape)
    assert choice.active == "scx" and isinstance(backend, ScxBackend)
    assert backend.supervisor.binary == STANDIN and backend.cpu_count == shape.n_cpus

    fake_sysfs(standin.sysfs, "enabled", "minimal")
    choice, backend = make_backend(scx, standin.sysfs, shape)
    assert choice.active == "native" and "'minimal' is loaded" in choice.reason

    fake_sysfs(standin.sysfs, "disabled")
    missing = DaemonConfig(backend="auto", scx=ScxSettings(binary=str(tmp_path / "nope")))
    choice, _ = make_backend(missing, standin.sysfs, shape)
    assert choice.active == "native" and "is not an executable file" in choice.reason


def test_layer_cpus_from_stats_decodes_mask_words():
    stats = SysStats.from_json({"layers": {"a": {"cpus": [0b1010, 1]}, "b": {"cpus": "junk"}, "c": {},
                                           "d": {"cpus": [0, 0]}}})
    assert layer_cpus(stats) == {"a": frozenset({1, 3, 64}), "d": frozenset()}
    assert layer_cpus(None) == {}


def test_linter_checks_placement_against_the_cpus_scx_layered_chose():
    shape = read_shape(fixture_root("gcp-c2-standard-8"))  # siblings (0,4) (1,5) (2,6) (3,7)
    hot = layer("app.hot", CONFINED, EXCLUSIVE, tids=[50], cpus=[3], idle_siblings=(7,), protected=True)
    plan = LayerPlan(layers=(hot,), reserve_cpus=(0, 4))

    def seen(tid, cpu, layer_name):
        return ThreadSample(tid=tid, pid=tid, comm=f"t{tid}", cpu=cpu, util=0.9, wait=0.0, policy=0, nice=0,
                            affinity=tuple(shape.cpus), layer=layer_name, sibling_busy=False)

    observation = Observation(at=0.0, machine_shape={}, layers=[], threads=[seen(50, 2, "app.hot"), seen(60, 6, None)],
                              psi=None, overhead=OverheadView(0.0, 0.0, 0.0, 1.0))
    by_plan = {v.invariant for v in lint(plan, observation, shape, check_treatment=False)}
    assert "protected_fallback" in by_plan  # CPU 2 is not the plan's CPU 3
    by_scx = lint(plan, observation, shape, check_treatment=False, confined_cpus={"app.hot": frozenset({2})})
    assert [(v.invariant, v.tid) for v in by_scx] == [("open_reserve", 60)]  # CPU 6 is CPU 2's sibling
    assert lint(plan, observation, shape, check_treatment=False, confined_cpus={}) == []  # placement unknown


def test_linter_lets_an_owned_layer_spill_under_scx_layered_only_while_its_cpus_run_its_threads():
    """Under scx_layered an owned layer is Grouped (its threads run on its CPUs first, and on others
    while those are all busy) and, with --allow-partial-core, its cores' SMT siblings are every
    layer's. The VM test saw four memcached workers on their one owned CPU reported as
    protected_fallback and smt_collision: what the render promises, not a violation. A member
    elsewhere while a CPU of its own ran no busy thread still is; under the native backend,
    which pins owned threads, a member outside is a fallback whatever its CPUs run."""
    shape = read_shape(fixture_root("gcp-c2-standard-8"))  # siblings (0,4) (1,5) (2,6) (3,7)
    hot = layer("app.hot", CONFINED, EXCLUSIVE, tids=[50, 51], cpus=[3], idle_siblings=(7,), protected=True,
                ownership=OWNED)
    plan = LayerPlan(layers=(hot,), reserve_cpus=(0, 4))
    on_scx = {"app.hot": frozenset({3})}

    def seen(tid, cpu, layer_name, sibling_busy=False):
        return ThreadSample(tid=tid, pid=tid, comm=f"t{tid}", cpu=cpu, util=0.9, wait=0.0, policy=0, nice=0,
                            affinity=tuple(shape.cpus), layer=layer_name, sibling_busy=sibling_busy)

    def found(threads, confined_cpus, plan=plan, cpu_idle=None):
        observation = Observation(at=0.0, machine_shape={}, layers=[], threads=threads, psi=None,
                                  overhead=OverheadView(0.0, 0.0, 0.0, 1.0), cpu_idle=cpu_idle or {})
        return sorted((v.invariant, v.tid) for v in lint(plan, observation, shape, check_treatment=False,
                                                          confined_cpus=confined_cpus))

    crowded = [seen(50, 3, "app.hot", sibling_busy=True), seen(51, 2, "app.hot"), seen(60, 7, None)]
    assert found(crowded, on_scx) == []  # 51 spills while 50 holds CPU 3; 60 on the shared sibling
    taken_by_another = [seen(61, 3, None), seen(51, 2, "app.hot")]  # e.g. a preempting layer's thread
    assert found(taken_by_another, on_scx) == []
    assert found(crowded, None) == [("protected_fallback", 51), ("smt_collision", 50)]  # native: pinned, sibling kept
    alone = [seen(51, 2, "app.hot")]  # CPU 3 ran no busy thread: not a spill
    assert found(alone, on_scx) == [("protected_fallback", 51)]
    # CPU 3 busy with a thread the observer did not read (/proc/stat: idle 10 % of the window): a spill
    assert found(alone, on_scx, cpu_idle={3: 0.1}) == []
    assert found(alone, on_scx, cpu_idle={3: 0.8}) == [("protected_fallback", 51)]  # idle: room it left
    fenced = LayerPlan(layers=(dataclasses.replace(hot, ownership=FENCED),), reserve_cpus=(0, 4))
    assert ("protected_fallback", 51) in found(crowded, on_scx, fenced)  # Confined under scx_layered too


def test_scx_metrics_count_restarts_and_expose_layer_stats(tmp_path):
    idle = ScxSupervisor(STANDIN, str(tmp_path)).status()
    supervisor = dataclasses.replace(idle, state="running", restarts=2, starts=3, crashes=1, refusals=0,
                                     default_scheduler_gap_s=GapView(0.2, 0.5))
    status = ScxView(fallback_reason=None, safe_mode=False, safe_mode_reason=None, render_notes=[],
                     render_problems=[], scx_layered=supervisor,
                     scx_stats=ScxStatsView({}, {"app.hot": {"util": 150.0, "tasks": 4, "cur_nr_cpus": 2}}))
    daemon = status_sample.daemon()
    daemon.backend_status = lambda: BackendStatus(carried_by="scx", scx=status)
    metrics = Metrics(status=lambda: status_report.build_status(daemon))  # read at each scrape
    metrics.exposition()
    # the supervisor's running totals, as they are at the next scrape
    status = dataclasses.replace(status, scx_layered=dataclasses.replace(supervisor, restarts=3))
    text = metrics.exposition().decode()
    assert "temperd_scx_restarts_total 3.0" in text and "temperd_scx_crashes_total 1.0" in text
    assert "temperd_scx_default_scheduler_seconds_total 0.5" in text
    assert 'temperd_scx_layer_cpu_usage_ratio{layer="app.hot"} 1.5' in text
    assert 'temperd_scx_layer_cpus{layer="app.hot"} 2.0' in text and "temperd_scx_running 1.0" in text


# ---- the daemon with backend = "scx" -----------------------------------------------------------------

PROFILE = """schema_version = 1
id = "scxb"
[fingerprint]
process_names = ["scxb-app"]
[[thread_groups]]
name = "hot"
thread_names = ["scxb-hot*"]
treatment = "exclusive"
ownership = "fenced"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "latency"
nice = -6
"""


def temperctl(*args):
    return subprocess.run([os.path.join(BINDIR, "temperctl"), *args], capture_output=True, text=True, timeout=30)


def test_daemon_runs_scx_layered_restarts_on_change_and_falls_back_after_a_crash_loop(standin, tmp_path, spawn):
    etc = tmp_path / "etc"
    (etc / "profiles.d").mkdir(parents=True)
    (etc / "profiles.d" / "scxb.toml").write_text(PROFILE)
    socket_path = os.path.join(standin.short, "temperd.sock")
    (etc / "temperd.toml").write_text(
        f'backend = "scx"\nstate_dir = "{tmp_path / "run"}"\n[http]\nport = 0\n[control]\nsocket = "{socket_path}"\n'
        f'[scx]\nbinary = "{STANDIN}"\nstats_socket = "{standin.socket}"\nmin_restart_interval_s = 0.5\n'
        f'crash_limit = 2\ncrash_window_s = 60.0\n[rightsizing]\nhistory_file = "{tmp_path / "history.json"}"\n')
    app = spawn("scxb-app")
    app.wait_ready()
    hot = int(app.command("thread scxb-hot0"))
    daemon = Daemon(str(etc), standin.sysfs, observe_interval_s=0.2)
    daemon.start()
    loop = threading.Thread(target=daemon.run, daemon=True)
    loop.start()
    try:
        status = json.loads(temperctl("status", "--json", "--socket", socket_path).stdout)
        assert status["backend"]["active"] == "scx"
        # The native backend holds the plan while scx_layered loads; its attach asks for the replan
        # that hands the plan over.
        wait_for(lambda: daemon.backend_status().carried_by == "scx", WAIT_S, "scx_layered attached and carrying")
        assert daemon.backend_status().scx.scx_layered.state == "running"
        first = standin.attaches()[0]["specs"]
        (hot_spec,) = [s["kind"][CONFINED] for s in first if s["name"].endswith(".hot")]
        assert hot_spec["cpus_range"] == [1, 1] and hot_spec["protected"] and hot_spec["exclusive"]
        assert nice_of(app.pid, app.pid) == 0 and os.sched_getaffinity(hot) == {0, 1}  # scx_layered's job now
        text = temperctl("status", "--socket", socket_path).stdout
        assert "backend:     scx" in text and "scx_layered running" in text

        # What scx_layered reports of each layer, beside the plan: JSON, text and /observe.
        def rows():
            data = json.loads(temperctl("status", "--json", "--socket", socket_path).stdout)
            return {l["name"]: l for l in data["layers"]}
        wait_for(lambda: any((l["scx"] or {}).get("cpus") for l in rows().values()), WAIT_S, "layer stats beside the plan")
        layers = rows()
        (hot_row,) = [r for n, r in layers.items() if n.endswith(".hot")]
        assert hot_row["plan"] is True and hot_row["scx"]["cpus"] == [1] and hot_row["scx"]["cpus_held"] == 1
        assert hot_row["scx"]["text"] == f"{hot_row['scx']['util_pct']:.0f}% of a CPU on 1"
        assert layers["rest"]["plan"] is False and layers["rest"]["treatment"] == "catch-all"  # not in the plan
        text = temperctl("status", "--socket", socket_path).stdout
        assert "SCX_LAYERED NOW" in text and hot_row["scx"]["text"] in text
        observed = daemon.observe_json()
        (hot_observed,) = [l for l in observed["layers"] if l["name"].endswith(".hot")]
        assert hot_observed["scx"]["cpus"] == [1] and "util" in hot_observed  # beside what temperd observed
        assert [l["name"] for l in observed["scx_layers_beyond_plan"]] == ["rest"]

        # A second hot thread: 2 cores wanted, 1 free -> demoted to shared CPUs (an Open
        # layer that preempts) -> one restart.
        app.command("thread scxb-hot1")
        wait_for(lambda: len(standin.attaches()) == 2, WAIT_S, "the restart for the changed plan")
        second = standin.attaches()[1]["specs"]
        (hot_kind,) = [s["kind"] for s in second if s["name"].endswith(".hot")]
        assert list(hot_kind) == ["Open"] and hot_kind["Open"]["preempt"] is True
        wait_for(lambda: "temperd_scx_restarts_total 1.0" in daemon.metrics.exposition().decode(), WAIT_S, "the restart metric")

        # Crash loop: the running scx_layered is killed, the next one crashes right after attaching.
        standin.monkeypatch.setenv("FAKE_SCX_CRASH_AFTER", "0.1")
        killed = standin.attaches()[-1]["pid"]
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: not alive(killed), WAIT_S, "the killed scx_layered gone")
        fake_sysfs(standin.sysfs, "disabled")  # what the kernel does when a BPF scheduler's process dies
        wait_for(lambda: daemon.backend_status().scx.safe_mode, 30, "safe mode")
        wait_for(lambda: nice_of(app.pid, app.pid) == -6, WAIT_S, "the native backend treating the rest group")
        status = json.loads(temperctl("status", "--json", "--socket", socket_path).stdout)
        assert status["backend"]["carried_by"] == "native" and "exited 2 times" in status["backend"]["fallback_reason"]
        assert "SAFE MODE" in temperctl("status", "--socket", socket_path).stdout
        wait_for(lambda: "temperd_safe_mode 1.0" in daemon.metrics.exposition().decode(), WAIT_S, "the safe-mode metric")
        assert 'temperd_backend_info{backend="native"} 1.0' in daemon.metrics.exposition().decode()
        assert daemon.observe_json()["backend"]["carried_by"] == "native"

        # The operator fixes the cause and reloads: scx_layered carries the plan again.
        standin.monkeypatch.delenv("FAKE_SCX_CRASH_AFTER")
        assert temperctl("reload", "--socket", socket_path).returncode == 0
        wait_for(lambda: daemon.backend_status().carried_by == "scx", WAIT_S, "scx_layered carrying again")
        assert daemon.backend_status().scx.scx_layered.state == "running" and not daemon.backend_status().scx.safe_mode
        assert nice_of(app.pid, app.pid) == 0  # the native fallback's settings put back
    finally:
        daemon.request("stop", "test")
        loop.join(20)
        daemon.stop()
    assert nice_of(app.pid, app.pid) == 0  # restored on stop
    assert not any(alive(e["pid"]) for e in standin.attaches())


def test_auto_on_this_host_runs_native_and_status_says_why(tmp_path):
    if os.path.isdir("/sys/kernel/sched_ext"):
        pytest.skip("this kernel has sched_ext")
    etc = tmp_path / "etc"
    etc.mkdir()
    socket_path = str(tmp_path / "temperd.sock")
    (etc / "temperd.toml").write_text(f'state_dir = "{tmp_path / "run"}"\n[http]\nport = 0\n'
                                      f'[control]\nsocket = "{socket_path}"\n'  # backend: the default, auto
                                      f'[rightsizing]\nhistory_file = "{tmp_path / "history.json"}"\n')
    daemon = Daemon(str(etc))
    daemon.start()
    try:
        text = temperctl("status", "--socket", socket_path).stdout
        assert ("backend:     native (auto: no /sys/kernel/sched_ext: kernel without CONFIG_SCHED_CLASS_EXT; "
                "native backend)") in text
        assert daemon.observe_json()["backend"]["requested"] == "auto"
    finally:
        daemon.stop()
