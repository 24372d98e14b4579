"""/metrics passes promtool, a real Prometheus scrapes it; /observe serves JSON; the linter sees real misplacement."""

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from servers import free_port
from temperd.backends.status import BackendStatus
from temperd.observe.http import HttpApi
from temperd.observe.linter import lint
from temperd.observe.metrics import Metrics
from temperd.observe.observer import BUSY_RATIO, Observer
from temperd.plan import CONFINED, EXCLUSIVE, YIELD, OPEN, Layer, LayerPlan, MemberSelector
from temperd.sources.inventory import Inventory
from temperd.decide.matcher import MatchResult
from temperd.sources.shape import read_shape


class Result:
    applied = {"affinity": 3, "nice": 1}
    failed = {"affinity": 1}
    restored = {}


@pytest.fixture
def api():
    metrics = Metrics()
    metrics.actions.update(Result())
    metrics.config.update(True, 3, time.time(), 0)
    metrics.backend.update(BackendStatus("native", drift={"nice": 1}))
    server = HttpApi("127.0.0.1", 0, metrics.exposition, lambda: {"layers": [], "ok": True})
    server.start()
    yield server, metrics
    server.stop()


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
        return reply.status, reply.headers.get("Content-Type"), reply.read()


def test_metrics_and_observe_endpoints(api):
    server, _ = api
    status, ctype, body = get(server.port, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert b'temperd_actions_applied_total{kind="affinity"} 3.0' in body
    assert b'temperd_backend_info{backend="native"} 1.0' in body and b'temperd_drift_total{kind="nice"} 1.0' in body
    assert b"temperd_config_generation 3.0" in body
    assert b'temperd_lint_violations{invariant="smt_collision"} 0.0' in body
    assert json.loads(get(server.port, "/observe")[2]) == {"layers": [], "ok": True}
    with pytest.raises(urllib.error.HTTPError) as info:
        get(server.port, "/other")
    assert info.value.code == 404
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=5)
    assert info.value.code == 405


def test_promtool_accepts_the_metrics(api):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    server, _ = api
    body = get(server.port, "/metrics")[2]
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_real_prometheus_scrapes_temperd(api, tmp_path):
    prometheus = shutil.which("prometheus")
    if not prometheus:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    server, _ = api
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: temperd\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        found = None
        while time.monotonic() < deadline and not found:
            time.sleep(1)
            try:
                reply = json.loads(get(port, "/api/v1/query?query=temperd_config_generation")[2])
            except OSError:
                continue
            found = reply["data"]["result"]
        assert found and found[0]["value"][1] == "3", found
        targets = json.loads(get(port, "/api/v1/targets")[2])["data"]["activeTargets"]
        assert targets[0]["health"] == "up"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_drift_counts_what_the_backend_found_since_start():
    """The backend keeps the running total; the counter grows by what it grew."""
    metrics = Metrics()
    for found in ({"nice": 1}, {"nice": 1}, {"nice": 3, "affinity": 2}):
        metrics.backend.update(BackendStatus("native", drift=found))
    text = metrics.exposition().decode()
    assert 'temperd_drift_total{kind="nice"} 3.0' in text and 'temperd_drift_total{kind="affinity"} 2.0' in text


def test_linter_sees_a_confined_member_running_outside_its_cpus(children):
    """A real busy thread pinned to CPU 0 while its Confined layer owns CPU 1: protected_fallback
    (it ran outside its CPUs) and layer_mismatch (it may run on CPU 0); the process leader is
    SCHED_OTHER where its layer says SCHED_IDLE: layer_mismatch."""
    child = children.spawn(["lint-hot"], spin_s=10.0)  # spins from its start
    hot = child.threads["lint-hot"]
    os.sched_setaffinity(hot, {0})
    shape = read_shape()
    plan = LayerPlan(layers=(
        Layer(name="w.hot", kind=CONFINED, treatment=EXCLUSIVE, tier="critical", workload="w", group="hot",
              selector=MemberSelector(tids=(hot,)), cpus=(1,)),
        Layer(name="w.rest", kind=OPEN, treatment=YIELD, tier="critical", workload="w", group="rest",
              selector=MemberSelector(tids=(child.pid,)), policy="idle"),
    ), reserve_cpus=(0,))
    inventory = Inventory()
    inventory.reconcile()
    observer = Observer(shape)
    observer.sample(plan, inventory.processes, MatchResult())
    time.sleep(0.5)  # a window in which the hot thread runs on CPU 0
    obs = observer.sample(plan, inventory.processes, MatchResult())
    seen = obs.member(hot)
    assert seen is not None and seen.cpu == 0 and seen.util >= BUSY_RATIO, seen
    kinds = {(v.invariant, v.tid) for v in lint(plan, obs, shape)}
    assert ("protected_fallback", hot) in kinds  # ran on CPU 0, its layer owns CPU 1
    assert ("layer_mismatch", hot) in kinds  # may run on CPU 0, the layer owns CPU 1
    assert ("layer_mismatch", child.pid) in kinds  # SCHED_OTHER where the plan says SCHED_IDLE
    # Where the layer really owns CPU 0 (scx_layered's choice), the same thread is in place.
    in_place = {(v.invariant, v.tid) for v in lint(plan, obs, shape, confined_cpus={"w.hot": frozenset({0})})}
    assert ("protected_fallback", hot) not in in_place
