"""monitoring/: the alert and recording rules pass promtool (check and unit tests, every alert both
firing and silent), the dashboard is well formed (the monitoring mixins' lint rules: a datasource
variable, job and instance selectors, $__rate_interval, no hard-coded instance), and a real
Prometheus scraping a real temperd treating a real memcached answers every panel's query."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
RULES = MONITORING / "rules.yaml"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = MONITORING / "tests" / "alerts_test.yaml"
DASHBOARDS = sorted((MONITORING / "dashboards").glob("*.json"))

REQUIRED_ALERTS = {"TemperdDown", "TemperdConfigReloadFailed", "TemperdSafeMode", "TemperdLintViolationsPersist",
                   "TemperdSettingsFought", "TemperdEventsLost", "TemperdProtectedLatencyHigh"}
# Panels whose queries measure scheduling delay: their data must be numbers, not only NaN.
LATENCY_METRIC = "temperd_layer_runqueue_latency_seconds"


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return path


def load_yaml(path: Path):
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


def alert_rules():
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def panels(dashboard: dict):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())  # a collapsed row's panels


def targets():
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in panels(dashboard):
            for target in panel.get("targets", ()):
                yield path.name, panel["title"], target["expr"]


# ---- rules ---------------------------------------------------------------------------------------


def test_promtool_checks_the_rules():
    out = subprocess.run([promtool(), "check", "rules", str(RULES), str(ALERTS)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_pass():
    out = subprocess.run([promtool(), "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True,
                         timeout=120, cwd=ALERT_TESTS.parent)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_silent():
    tested = {}
    for test in load_yaml(ALERT_TESTS)["tests"]:
        for case in test.get("alert_rule_test", ()):
            tested.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    names = {rule["alert"] for rule in alert_rules()}
    assert REQUIRED_ALERTS <= names
    for name in names:
        assert tested.get(name) == {True, False}, f"{name}: needs a case where it fires and one where it stays silent"


def test_alerts_follow_the_mixin_conventions():
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Temperd[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"].get("summary") and rule["annotations"].get("description"), name
        assert 'job="temperd"' in rule["expr"] or ":" in rule["expr"].split("{")[0], f"{name}: selects no job"
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]


# ---- the dashboard -------------------------------------------------------------------------------


def test_dashboard_structure():
    assert DASHBOARDS, "monitoring/dashboards/ holds no dashboard"
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard.get("uid") and dashboard.get("title"), path.name
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for name in ("job", "instance"):
            assert variables[name]["type"] == "query", name
            assert variables[name]["datasource"]["uid"] == "${datasource}", name
        assert "$job" in json.dumps(variables["instance"]["query"])
        ids = [p["id"] for p in panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        for panel in panels(dashboard):
            if panel["type"] == "row":
                continue
            where = f"{path.name}: {panel.get('title')!r}"
            assert panel.get("title"), where
            assert panel["datasource"]["uid"] == "${datasource}", where
            assert panel.get("targets"), where
            assert panel.get("gridPos", {}).get("w"), where
            for target in panel["targets"]:
                expr = target["expr"]
                assert target.get("datasource", {}).get("uid", "${datasource}") == "${datasource}", where
                assert 'job="$job"' in expr and 'instance="$instance"' in expr, f"{where}: {expr}"
                ranges = re.findall(r"\[([^\]]+)\]", expr)
                assert all(r == "$__rate_interval" for r in ranges), f"{where}: use $__rate_interval, not {ranges}"
        text = path.read_text()
        assert not re.search(r'instance=~?"(?!\$instance")', text), f"{path.name}: a hard-coded instance"
        assert not re.search(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|localhost|:9477", text), f"{path.name}: a hard-coded address"


def test_dashboard_covers_the_host_view():
    """Workloads by tier, layers with CPUs / use / scheduling delay, lint, configuration and reloads,
    drift, temperd's own CPU, scx state."""
    exprs = " ".join(expr for _, _, expr in targets())
    for metric in ("temperd_workloads", "temperd_layer_cpus", "temperd_layer_cpu_usage_ratio", LATENCY_METRIC,
                   "temperd_lint_violations", "temperd_config_generation", "temperd_config_last_reload_success",
                   "temperd_drift_total", "temperd_cpu_usage_ratio", "temperd_scx_running", "temperd_safe_mode",
                   "instance_layer:temperd_protected_layer_runqueue_latency_seconds:p99_5m"):
        assert metric in exprs, metric


# ---- a real Prometheus, a real temperd, a real memcached ----------------------------------------


def _get(port: int, path: str, timeout: float = 10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
        return json.load(reply)


def _query(port: int, expr: str) -> dict:
    return _get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def _numbers(result) -> list:
    values = []
    for series in result:
        value = float(series["value"][1])
        if value == value:  # not NaN
            values.append(value)
    return values


def _concrete(expr: str, instance: str) -> str:
    # What Grafana sends with a 1 s scrape interval would be 4 s; 20 s keeps several observation
    # samples (every 5 s) in each window.
    return expr.replace("$job", "temperd").replace("$instance", instance).replace("$__rate_interval", "20s")


@pytest.mark.servers
@pytest.mark.slow
def test_prometheus_answers_every_panel_from_a_real_temperd(tmp_path):
    prometheus = shutil.which("prometheus")
    if not prometheus:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    import servers as S
    from test_daemon_e2e import PROFILE, Temperd, memcached, task_stat, threads_by_name
    from thread_children import wait_for

    with memcached() as server:
        daemon = Temperd(tmp_path)
        daemon.profiles.joinpath("memcached.toml").write_text(PROFILE.format(nice=-7))
        daemon.start()
        prom = None
        stop_load = threading.Event()
        loader = None
        try:
            lru = threads_by_name(server.pid)["mc-lrumaint"][0]
            wait_for(lambda: task_stat(server.pid, lru)["nice"] == 15, 20, "memcached treated")
            instance = f"127.0.0.1:{daemon.port}"
            (tmp_path / "rules").mkdir()
            shutil.copy(RULES, tmp_path / "rules" / "rules.yaml")
            shutil.copy(ALERTS, tmp_path / "rules" / "alerts.yaml")
            (tmp_path / "prometheus.yml").write_text(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"rule_files:\n  - {tmp_path / 'rules' / 'rules.yaml'}\n  - {tmp_path / 'rules' / 'alerts.yaml'}\n"
                "scrape_configs:\n  - job_name: temperd\n"
                f"    static_configs:\n      - targets: ['{instance}']\n")
            port = S.free_port()
            prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp_path / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            def load():
                while not stop_load.is_set():
                    server.load(seconds=2.0)

            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            # Someone else changes a setting temperd made: drift, counted once (the drift panel's data).
            subprocess.run(["renice", "-n", "5", "-p", str(lru)], check=True, capture_output=True)

            def all_answered():
                try:
                    _query(port, "up")
                except OSError:
                    return None
                missing = []
                for name, title, expr in targets():
                    reply = _query(port, _concrete(expr, instance))
                    assert reply["status"] == "success", (title, expr, reply)
                    result = reply["data"]["result"]
                    if not result or (LATENCY_METRIC in expr and not _numbers(result)):
                        missing.append(title)
                return missing or True

            answered = wait_for(lambda: all_answered() is True, 120, "every panel's query to return data")
            assert answered
            # The latency panels' numbers come from the schedstat fallback on a host without headers.
            source = _query(port, f'temperd_telemetry_source{{instance="{instance}"}}')["data"]["result"]
            assert [s["metric"]["source"] for s in source] in (["schedstat"], ["bpf"]), source
            protected = _query(port, "instance_layer:temperd_protected_layer_runqueue_latency_seconds:p99_5m")
            layers = {s["metric"]["layer"] for s in protected["data"]["result"]}
            assert any(layer.endswith(".workers") for layer in layers), layers
            assert not any("pid" in layer for layer in layers), layers
            rules = _get(port, "/api/v1/rules")["data"]["groups"]
            loaded = [rule for group in rules for rule in group["rules"]]
            assert len(loaded) == 14 and all(rule["health"] == "ok" for rule in loaded), loaded
            summary = []
            for name, title, expr in targets():
                result = _query(port, _concrete(expr, instance))["data"]["result"]
                numbers = _numbers(result)
                summary.append(f"{title}: {len(result)} series" + (f", max {max(numbers):.6g}" if numbers else ""))
            print("\n".join(summary))
        finally:
            stop_load.set()
            if loader is not None:
                loader.join(timeout=15)
            if prom is not None:
                prom.terminate()
                prom.wait(timeout=20)
            code = daemon.stop()
        assert code == 0, daemon.logtext()
