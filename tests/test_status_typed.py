"""The typed status (temperd/control/status.py): built once from the daemon's state, it goes
through its JSON and back unchanged, `temperctl status` renders its text and `--json` from the
value parsed back, and a view of another layer's data cannot drop one of its fields."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

import status_sample
from temperctl import daemon_cmd
from temperd.backends.result import ApplyResult
from temperd.control.status import (ApplyView, OverheadView, ReloadView, Status, SupervisorView,
                                    WorkloadView)
from temperd.control.typed_json import from_json, json_keys, to_json
from temperd.daemon import status_report

TEXT = """\
temperd 1.2.3: running (pid 77, up 60 s)
backend:     scx (scx_layered found)
  scx_layered running (pid 4242): 3 start(s), 2 restart(s) for plan changes, 1 crash(es), 0.75 s on the default scheduler
  last exit: killed by SIGKILL
  note: one note
machine:     4 CPUs, 2 cores
config:      generation 3, last reload FAILED (SIGHUP: kept generation 3)
  error: bad.toml: treatment
profiles:    2 loaded (redis, web), 1 failed
  error: profiles.d/bad.toml:7: thread_groups[0].treatment: expected one of exclusive, latency, yield
  disabled: regular expression '(a+)+$': nested quantifier
lint:        3 violation(s) (layer_mismatch 1, smt_collision 2)
telemetry:   schedstat (bcc: not installed)
events:      exec, exit; 12 processes tracked, 300 not (name, executable)
event path:  150 passes, 0.37 s of CPU, 0.30 ms per event
overhead:    sample_cpu_s 0.012, observe_cpu_ratio 0.003, daemon_cpu_ratio 0.021, window_s 5.0
http:        http://127.0.0.1:9464/metrics, http://127.0.0.1:9464/observe

WORKLOAD            PROFILE  TIER      BUDGET  THREADS  GROUPS
------------------  -------  --------  ------  -------  ----------
unit:web.service    web      critical  2.5     3        - 1, hot 2
unit:batch.service  -        batch     -       1        rest 1

LAYER     KIND      TREATMENT          CPUS  MEMBERS  SCX_LAYERED NOW
--------  --------  -----------------  ----  -------  ----------------
web.hot   Confined  exclusive (owned)  2,3   2        1.50 CPUs on 2,3
web.rest  Open      yield              -     1        -
catchall  Open      catch-all          -     -        -
"""


def fixed(scx: bool = True) -> Status:
    status = status_sample.status(scx)
    profiles = dataclasses.replace(status.profiles, disabled_patterns={"(a+)+$": "nested quantifier"})
    return dataclasses.replace(status, version="1.2.3", pid=77, uptime_s=60.4, profiles=profiles)


@pytest.mark.parametrize("scx", [True, False], ids=["scx", "native"])
def test_the_status_round_trips_through_its_json(scx):
    status = fixed(scx)
    wire = json.loads(json.dumps(status.to_json()))
    assert Status.from_json(wire) == status
    assert Status.from_json(wire).to_json() == wire
    # the scx backend's own part is written into the backend's object, and read back from it
    assert ("scx_layered" in wire["backend"]) is scx and wire["backend"]["drift"]
    assert list(wire) == [f.name for f in dataclasses.fields(Status)]


def test_the_text_is_rendered_from_the_status_parsed_back():
    wire = json.loads(json.dumps(fixed().to_json()))
    assert "\n".join(daemon_cmd.status_lines(Status.from_json(wire))) + "\n" == TEXT
    native = daemon_cmd.status_lines(Status.from_json(fixed(scx=False).to_json()))
    assert native[1] == "backend:     native (no sched_ext)" and not native[2].startswith("  ")
    assert not any("SCX_LAYERED" in line for line in native)


def test_a_status_from_a_temperd_that_did_not_count_its_event_path_reads_without_it():
    wire = json.loads(json.dumps(fixed().to_json()))
    del wire["event_path"]
    older = Status.from_json(wire)
    assert older.event_path is None
    assert not any(line.startswith("event path:") for line in daemon_cmd.status_lines(older))


def test_temperctl_status_prints_text_and_json_from_the_typed_value(monkeypatch):
    wire = json.loads(json.dumps(fixed().to_json()))
    newer = {**wire, "a_field_from_a_newer_temperd": 1}
    monkeypatch.setattr(daemon_cmd, "ask", lambda *a, **kw: {"ok": True, "status": newer})
    runner = CliRunner()
    out = runner.invoke(daemon_cmd.status_command, ["--json"])
    assert out.exit_code == 0 and json.loads(out.output) == wire  # what this temperctl knows of it
    out = runner.invoke(daemon_cmd.status_command, [])
    assert out.exit_code == 0 and out.output == TEXT
    broken = {k: v for k, v in wire.items() if k != "backend"}
    monkeypatch.setattr(daemon_cmd, "ask", lambda *a, **kw: {"ok": True, "status": broken})
    for args in ([], ["--json"]):
        out = runner.invoke(daemon_cmd.status_command, args)
        assert out.exit_code == 1 and "same version?" in out.output, out.output


def test_a_reply_that_is_not_a_status_is_refused():
    wire = fixed().to_json()
    with pytest.raises(KeyError):
        Status.from_json({k: v for k, v in wire.items() if k != "generation"})
    with pytest.raises(TypeError):
        Status.from_json({**wire, "workloads": {"not": "a list"}})
    with pytest.raises(TypeError):
        Status.from_json({**wire, "generation": "3"})
    with pytest.raises(TypeError):
        Status.from_json([wire])


def test_the_daemon_side_refuses_a_field_its_view_would_drop():
    data = dataclasses.asdict(ReloadView(True, 2, 1.0, "start", [], "ok"))
    assert from_json(ReloadView, {**data, "new": 1}) == from_json(ReloadView, data)  # the client: ignored
    daemon = status_sample.daemon()
    daemon.last_apply = dataclasses.make_dataclass("Newer", [("new", int, 1)], bases=(ApplyResult,))()
    with pytest.raises(TypeError, match="new"):  # the daemon: a view to extend
        status_report.build_status(daemon)


@pytest.mark.parametrize("view, source", [
    (ApplyView, ApplyResult),
], ids=lambda c: c.__name__)
def test_each_view_has_the_fields_of_what_it_shows(view, source):
    assert json_keys(view) == tuple(f.name for f in dataclasses.fields(source))


def test_the_supervisor_view_has_every_key_scx_layered_s_status_has():
    assert json_keys(SupervisorView) == tuple(to_json(status_sample.supervisor()))
    assert set(json_keys(WorkloadView)) == set(fixed().to_json()["workloads"][0])
