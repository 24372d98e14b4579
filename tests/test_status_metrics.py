"""The metrics that are facts of the typed status read them from its fields: each such metric,
scraped, holds what `temperctl status --json` shows, and every one of them is checked here."""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

import status_sample
from temperd.control.status import Status
from temperd.observe.linter import INVARIANTS
from temperd.observe.metrics import Metrics
from temperd.observe.status_metrics import FAMILIES


def scraped(status) -> Dict[str, Dict[Tuple[Tuple[str, str], ...], float]]:
    """sample name -> {labels: value}, from the exposition as Prometheus reads it."""
    out: Dict[str, Dict[Tuple[Tuple[str, str], ...], float]] = {}
    text = Metrics(status=lambda: status).exposition().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def one(metrics, name: str) -> float:
    (value,) = metrics[name].values()
    return value


def expected(status: Status) -> Dict[str, Dict[Tuple[Tuple[str, str], ...], float]]:
    """Each mirrored metric as the status's JSON (what temperctl shows) says it must read."""
    d = status.to_json()
    backend, reload, inventory = d["backend"], d["last_reload"], d["inventory"]
    sup = backend.get("scx_layered") or {}
    workloads: Dict[Tuple[Tuple[str, str], ...], float] = {}
    for w in d["workloads"]:
        key = (("profile", w["profile"] or "none"), ("tier", w["tier"]))
        workloads[key] = workloads.get(key, 0) + 1
    layers = (backend.get("scx_stats") or {}).get("layers", {})
    return {
        "temperd_config_generation": {(): d["generation"]},
        "temperd_config_last_reload_success": {(): 1 if reload["ok"] else 0},
        "temperd_config_last_reload_timestamp_seconds": {(): reload["at"]},
        "temperd_config_problems": {(): len(reload["problems"])},
        "temperd_backend_info": {(("backend", backend["carried_by"]),): 1},
        "temperd_safe_mode": {(): 1 if backend.get("safe_mode") else 0},
        "temperd_drift_total": {(("kind", k),): n for k, n in backend["drift"].items()},
        "temperd_scx_restarts_total": {(): sup.get("restarts", 0)},
        "temperd_scx_starts_total": {(): sup.get("starts", 0)},
        "temperd_scx_crashes_total": {(): sup.get("crashes", 0)},
        "temperd_scx_refusals_total": {(): sup.get("refusals", 0)},
        "temperd_scx_default_scheduler_seconds_total": {(): sup["default_scheduler_gap_s"]["total"] if sup else 0},
        "temperd_scx_running": {(): 1 if sup.get("state") == "running" else 0},
        "temperd_scx_layer_cpu_usage_ratio": {(("layer", k),): v["util"] / 100 for k, v in layers.items()},
        "temperd_scx_layer_tasks": {(("layer", k),): v["tasks"] for k, v in layers.items()},
        "temperd_scx_layer_cpus": {(("layer", k),): v["cur_nr_cpus"] for k, v in layers.items()},
        "temperd_inventory_events": {(): inventory["events_received"]},
        "temperd_inventory_event_overflows": {(): inventory["events_lost"]},
        "temperd_inventory_threads": {(): inventory["threads"]},
        "temperd_reconcile_cpu_seconds": {(): inventory["last_reconcile_cpu_s"]},
        "temperd_event_passes_total": {(): d["event_path"]["passes"]},
        "temperd_event_cpu_seconds_total": {(): d["event_path"]["cpu_s"]},
        "temperd_workloads": workloads,
        "temperd_lint_violations": {(("invariant", k),): d["lint"]["by_invariant"].get(k, 0) for k in INVARIANTS},
        "temperd_cpu_usage_ratio": {(): d["overhead"]["daemon_cpu_ratio"]},
        "temperd_observe_cpu_seconds": {(): d["overhead"]["sample_cpu_s"]},
    }


@pytest.mark.parametrize("scx", [True, False], ids=["scx", "native"])
def test_each_metric_that_mirrors_a_status_field_reads_the_same_value(scx):
    status = status_sample.status(scx)
    metrics, want = scraped(status), expected(status)
    for name, values in want.items():
        assert metrics.get(name, {}) == pytest.approx(values), name
    assert metrics["temperd_lint_violations"][(("invariant", "smt_collision"),)] == 2


def test_every_status_metric_is_checked_here():
    exposed = {name + ("_total" if kind == "counter" else "") for name, kind, _text, _labels in FAMILIES}
    assert exposed == set(expected(status_sample.status()))


def test_the_metrics_follow_the_status_from_one_scrape_to_the_next():
    """Read at each scrape: a later status (a reload, more drift) is what the next scrape shows."""
    status = status_sample.status(scx=False)
    current = [status]
    metrics = Metrics(status=lambda: current[0])
    metrics.exposition()
    later = dataclasses.replace(status, generation=4,
                                backend=dataclasses.replace(status.backend, drift={"nice": 3, "affinity": 2}))
    current[0] = later
    text = metrics.exposition().decode()
    assert "temperd_config_generation 4.0" in text
    assert 'temperd_drift_total{kind="nice"} 3.0' in text and 'temperd_drift_total{kind="affinity"} 2.0' in text


def test_before_the_first_status_every_name_is_there_without_samples():
    families = {f.name: f for f in text_string_to_metric_families(Metrics().exposition().decode())}
    for name, kind, _text, _labels in FAMILIES:
        assert families[name].type == kind and families[name].samples == [], name
