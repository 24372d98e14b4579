"""/metrics passes promtool, a real Prometheus scrapes it; /observe serves JSON; the linter sees real misplacement."""

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

import status_sample
from servers import free_port
from thread_children import wait_for
from temperd.observe.http import HttpApi
from temperd.observe.linter import lint
from temperd.observe.metrics import Metrics
from temperd.observe.observer import BUSY_RATIO, Observer
from temperd.plan import CONFINED, EXCLUSIVE, YIELD, OPEN, Layer, LayerPlan, MemberSelector
from temperd.sources.inventory import Inventory
from temperd.sources.procfs import read_schedstat
from temperd.decide.matcher import MatchResult
from temperd.sources.shape import read_shape


class Result:
    applied = {"affinity": 3, "nice": 1}
    failed = {"affinity": 1}
    restored = {}


@pytest.fixture
def api():
    status = status_sample.status(scx=False)  # generation 3, drift nice 2
    metrics = Metrics(status=lambda: status)
    metrics.actions.update(Result())
    server = HttpApi("127.0.0.1", 0, metrics.exposition, lambda: {"layers": [], "ok": True})
    server.bind()
    server.serve()
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
    assert b'temperd_backend_info{backend="native"} 1.0' in body and b'temperd_drift_total{kind="nice"} 2.0' in body
    assert b"temperd_config_generation 3.0" in body
    assert b'temperd_lint_violations{invariant="smt_collision"} 2.0' in body
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
    def scraped():
        try:
            return json.loads(get(port, "/api/v1/query?query=temperd_config_generation")[2])["data"]["result"]
        except OSError:
            return None
    try:
        found = wait_for(scraped, 30, "Prometheus's first scrape of temperd", step=0.5)
        assert found[0]["value"][1] == "3", found
        targets = json.loads(get(port, "/api/v1/targets")[2])["data"]["activeTargets"]
        assert targets[0]["health"] == "up"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


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
    ran = read_schedstat(child.pid, hot).run_ns
    # A window in which the hot thread runs on CPU 0: a third of a second on it.
    wait_for(lambda: read_schedstat(child.pid, hot).run_ns - ran >= 0.3e9, 10, "the hot thread running on CPU 0")
    obs = observer.sample(plan, inventory.processes, MatchResult())
    seen = next((t for t in obs.threads if t.tid == hot), None)
    assert seen is not None and seen.cpu == 0 and seen.util >= BUSY_RATIO, seen
    kinds = {(v.invariant, v.tid) for v in lint(plan, obs, shape)}
    assert ("protected_fallback", hot) in kinds  # ran on CPU 0, its layer owns CPU 1
    assert ("layer_mismatch", hot) in kinds  # may run on CPU 0, the layer owns CPU 1
    assert ("layer_mismatch", child.pid) in kinds  # SCHED_OTHER where the plan says SCHED_IDLE
    # Where the layer really owns CPU 0 (scx_layered's choice), the same thread is in place.
    in_place = {(v.invariant, v.tid) for v in lint(plan, obs, shape, confined_cpus={"w.hot": frozenset({0})})}
    assert ("protected_fallback", hot) not in in_place


# ---- resilience: what a local user can do to the HTTP server ------------------------------------


def _burst(port: int, n: int, path: str = "/observe", timeout: float = 60.0) -> dict:
    """n concurrent GETs from one thread (non-blocking sockets): how many ended how."""
    import errno
    import selectors
    import socket

    sel = selectors.DefaultSelector()
    outcome = {}
    request = f"GET {path} HTTP/1.0\r\n\r\n".encode()
    for i in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        err = sock.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            outcome[i] = errno.errorcode.get(err, str(err))
            sock.close()
            continue
        sel.register(sock, selectors.EVENT_WRITE, [i, b"", False])
    deadline = time.monotonic() + timeout
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(1.0):
            sock, data = key.fileobj, key.data
            try:
                if not data[2]:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, "connect")
                    sock.sendall(request)
                    data[2] = True
                    sel.modify(sock, selectors.EVENT_READ, data)
                    continue
                chunk = sock.recv(65536)
                if chunk:
                    data[1] += chunk
                    continue
                outcome[data[0]] = data[1].split(b" ", 2)[1].decode() if data[1].startswith(b"HTTP/") else "empty"
            except OSError as exc:
                outcome[data[0]] = errno.errorcode.get(exc.errno, str(exc))
            sel.unregister(sock)
            sock.close()
    for key in list(sel.get_map().values()):
        outcome[key.data[0]] = "timed out"
        key.fileobj.close()
    counts = {}
    for result in outcome.values():
        counts[result] = counts.get(result, 0) + 1
    return counts


def _enough_descriptors(n: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"needs {n} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def hold_idle(port: int, n: int, connect_timeout: float = 1.0) -> list:
    """Up to n connections that send nothing; those the kernel would not queue are left out."""
    import socket

    held = []
    for _ in range(n):
        sock = socket.socket()
        sock.settimeout(connect_timeout)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            break
        held.append(sock)
    return held


def test_a_thousand_concurrent_observe_requests_are_all_answered(api):
    """The listen backlog holds what the served connections cannot take yet (with the default
    backlog of 5, 1000 concurrent requests ended in resets and timeouts)."""
    _enough_descriptors(1200)
    server, _ = api
    assert _burst(server.port, 1000) == {"200": 1000}


def test_idle_and_slow_clients_are_dropped_at_the_request_deadline(monkeypatch):
    import socket

    from temperd.observe import http

    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.5)
    server = HttpApi("127.0.0.1", 0, lambda: b"", lambda: {})
    server.bind()
    server.serve()
    try:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        started = time.monotonic()
        for _ in range(20):  # a byte every 0.1 s: each read is quick, the whole request is not
            try:
                slow.sendall(b"G")
            except OSError:
                break
            time.sleep(0.1)
        assert idle.recv(100) == b"" and time.monotonic() - started < 3
        try:
            assert slow.recv(100) == b""
        except ConnectionResetError:
            pass  # bytes it had not read yet were pending when it closed
        assert time.monotonic() - started < 3
        wait = time.monotonic() + 5
        while server.open_connections and time.monotonic() < wait:
            time.sleep(0.05)
        assert server.open_connections == 0
        assert get(server.port, "/metrics")[0] == 200
    finally:
        server.stop()


def test_connections_beyond_the_cap_wait_in_the_backlog(monkeypatch):
    """More idle connections than the cap: at most the cap is open in temperd (each a descriptor),
    the rest wait in the kernel; as the idle ones time out, a real request is answered."""
    from temperd.observe import http

    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.5)
    server = HttpApi("127.0.0.1", 0, lambda: b"ok\n", lambda: {}, max_connections=4)
    server.bind()
    server.serve()
    held = hold_idle(server.port, 20)
    try:
        assert len(held) == 20
        peak = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            peak = max(peak, server.open_connections)
            time.sleep(0.01)
        assert 1 <= peak <= 4
        assert get(server.port, "/metrics")[2] == b"ok\n"  # queued behind 20 idle ones: about 2.5 s
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_a_client_that_goes_away_early_is_no_error(caplog):
    """A reset before the reply is taken: logged at debug, not as an error with a traceback."""
    import socket
    import struct

    big = {"x": "y" * (4 << 20)}
    server = HttpApi("127.0.0.1", 0, lambda: b"", lambda: big)
    server.bind()
    server.serve()
    try:
        with caplog.at_level("DEBUG", logger="temperd.http"):
            for _ in range(5):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                sock.sendall(b"GET /observe HTTP/1.0\r\n\r\n")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # RST
            # Connections are accepted in turn: once this one is answered all five were, and once
            # none is open every one of them was served to its end (and had its chance to log).
            assert get(server.port, "/metrics")[0] == 200
            wait_for(lambda: server._open == 0, 10, "every connection served to its end")
        assert [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") or r.exc_info] == []
    finally:
        server.stop()


def test_move_http_rebinds_or_keeps_the_old_listener():
    """A reload's new [http] address: served from then on, or refused with the old one still serving."""
    import socket

    from temperd.daemon.services import Services

    services = Services()
    services._metrics, services._observe = (lambda: b"m\n"), (lambda: {})
    first = free_port()
    services.move_http("127.0.0.1", first)
    try:
        assert get(first, "/metrics")[2] == b"m\n"
        second = free_port()
        services.move_http("127.0.0.1", second)
        assert services.http.port == second and get(second, "/metrics")[2] == b"m\n"
        with pytest.raises(OSError):
            get(first, "/metrics")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            with pytest.raises(OSError) as info:
                services.move_http("127.0.0.1", taken.getsockname()[1])
            assert f"cannot listen on 127.0.0.1:{taken.getsockname()[1]}" in str(info.value)
        assert services.http.port == second and get(second, "/metrics")[2] == b"m\n"
        # The same port on another address, taken there: the old listener lets go, then takes it back.
        with socket.socket() as taken:
            taken.bind(("127.0.0.2", second))
            taken.listen(1)
            with pytest.raises(OSError):
                services.move_http("127.0.0.2", second)
        assert services.http.listen == "127.0.0.1" and get(second, "/metrics")[2] == b"m\n"
        # The same port on every address conflicts with the loopback listener until it lets go.
        services.move_http("0.0.0.0", second)
        assert services.http.listen == "0.0.0.0" and get(second, "/metrics")[2] == b"m\n"
        services.move_http("0.0.0.0", 0)
        assert services.http is None
        with pytest.raises(OSError):
            get(second, "/metrics")
    finally:
        services.stop()
