"""Every setting's default is declared once, in its Spec: the typed dataclasses, what a parsed empty
file gives, the JSON Schema (its default and help text), the man pages and etc/temperd.toml all say
the Spec's. A contrary default in any of them fails here."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

from temperd.config import daemon_config as dc
from temperd.config.tomlsource import parse_toml
from temperd.config.defaults import ByValue, default_text, in_man_page, shown, toml_text
from temperd.config.profile import (FINGERPRINT_SPEC, GROUP_SPEC, PROFILE_SPEC, Fingerprint, ThreadGroup, parse_profile,
                                    profile_json_schema)
from temperd.config.schema import TableSpec, json_schema
from temperd.config.tomlsource import tomllib
from temperd.decide.classify import WorkloadSignals
from temperd.decide.hostview import planner_settings
from temperd.decide.planner import PlannerSettings
from temperd.plan import TIERS, TREATMENTS, Layer
from temperd.training import synthesize

ROOT = Path(__file__).resolve().parent.parent
MAN = ROOT / "docs" / "man"
PAGES = {"temperd.8": dc.CONFIG_SPEC, "temper-profile.5": PROFILE_SPEC}

# Each typed field that holds a setting: (table spec, key). Tuples stand for TOML arrays.
DAEMON_FIELDS = {
    "backend": (dc.CONFIG_SPEC, "backend"), "state_dir": (dc.CONFIG_SPEC, "state_dir"),
    "default_tier": (dc.CONFIG_SPEC, "default_tier"), "reserve_cpus": (dc.CONFIG_SPEC, "reserve_cpus"),
    "reconcile_interval_s": (dc.CONFIG_SPEC, "reconcile_interval_s"),
    "scan_interval_without_events_s": (dc.CONFIG_SPEC, "scan_interval_without_events_s"),
    "http_listen": (dc.HTTP_SPEC, "listen"), "http_port": (dc.HTTP_SPEC, "port"),
    "control_socket": (dc.CONTROL_SPEC, "socket"), "control_group": (dc.CONTROL_SPEC, "group"),
    "trust_users": (dc.TRUST_SPEC, "users"), "trust_groups": (dc.TRUST_SPEC, "groups"),
    "lint_runqueue_latency_p99_ms": (dc.LINT_SPEC, "runqueue_latency_p99_ms"),
    "telemetry_bpf": (dc.TELEMETRY_SPEC, "bpf"),
}
WATCH_FIELDS = {"classify": (dc.CLASSIFY_SPEC, "enabled"), "window_s": (dc.CLASSIFY_SPEC, "window_s"),
                "metrics_interval_s": (dc.CLASSIFY_SPEC, "metrics_interval_s"),
                "rightsizing": (dc.RIGHTSIZING_SPEC, "enabled"),
                **{key: (dc.RIGHTSIZING_SPEC, key) for key in dc.RIGHTSIZING_SPEC.fields if key != "enabled"}}


def same(value: Any, default: Any) -> bool:
    return (list(value) if isinstance(value, tuple) else value) == (list(default) if isinstance(default, tuple) else default)


def contrary(obj: Any, fields: Dict[str, Tuple[TableSpec, str]]) -> List[str]:
    """The fields of a typed value that do not hold their spec's default."""
    return [f"{type(obj).__name__}.{name} = {getattr(obj, name)!r}, the spec says {spec.default_of(key)!r}"
            for name, (spec, key) in fields.items() if not same(getattr(obj, name), spec.default_of(key))]


def test_the_daemon_dataclasses_and_a_parsed_empty_file_hold_the_spec_defaults():
    for config in (dc.DaemonConfig(), dc.config_from_document(parse_toml("", "temperd.toml"))):
        assert contrary(config, DAEMON_FIELDS) == []
        assert contrary(config.learner, WATCH_FIELDS) == []
        assert contrary(config.scx, {key: (dc.SCX_SPEC, key) for key in dc.SCX_SPEC.fields}) == []
        for key, values in (("weight", config.tier_weights), ("idle_resume_us", config.tier_idle_resume_us)):
            assert values == {tier: dc.TIERS_SPEC.fields[tier].table.default_of(key) for tier in TIERS}
    assert dc.DaemonConfig().profile_dir == os.path.join(dc.DEFAULT_CONFIG_DIR, dc.CONFIG_SPEC.default_of("profile_dir"))
    assert tuple(dc.TIERS_SPEC.fields) == TIERS
    assert PlannerSettings() == planner_settings(dc.DaemonConfig())
    # A workload's tier where none is given, in what classifies and trains it: the configuration's.
    default_tier = dc.CONFIG_SPEC.default_of("default_tier")
    assert WorkloadSignals("w", 1.0, 1.0).tier == default_tier
    assert {inspect.signature(f).parameters["tier"].default for f in (synthesize.traits, synthesize.synthesize)} == {default_tier}


def test_every_daemon_key_with_a_default_has_its_typed_field_checked():
    checked = {(id(spec), key) for spec, key in [*DAEMON_FIELDS.values(), *WATCH_FIELDS.values()]}
    checked |= {(id(dc.SCX_SPEC), key) for key in dc.SCX_SPEC.fields}
    checked |= {(id(dc.TIERS_SPEC.fields[t].table), key) for t in TIERS for key in ("weight", "idle_resume_us")}
    checked |= {(id(dc.CONFIG_SPEC), "profile_dir"), (id(dc.BINDING_SPEC), "tier")}  # tested above; required in Binding
    unchecked = [f"{spec.title}.{key}" for spec, key, _ in walk(dc.CONFIG_SPEC) if (id(spec), key) not in checked]
    assert unchecked == []


def test_a_thread_group_and_a_layer_hold_the_spec_defaults_for_each_treatment():
    keys = [key for key in GROUP_SPEC.fields if key not in ("name", "treatment")]
    for treatment in TREATMENTS:
        built = ThreadGroup(name="g", treatment=treatment)
        parsed = parse_profile(f'schema_version = 1\nid = "p"\n[[thread_groups]]\nname = "g"\ncatch_all = true\n'
                               f'treatment = "{treatment}"\n', "p.toml").thread_groups[0]
        for group, selector in ((built, ""), (parsed, "catch_all")):
            wrong = [key for key in keys if key != selector
                     and not same(getattr(group, key), GROUP_SPEC.default_for(key, {"treatment": treatment}))]
            assert wrong == [], (treatment, wrong)
        assert dataclasses.replace(parsed, catch_all=False) == built
    assert isinstance(GROUP_SPEC.default_of("weight"), ByValue) and ThreadGroup("g", "latency").weight == 500
    assert contrary(Fingerprint(), {key: (FINGERPRINT_SPEC, key) for key in FINGERPRINT_SPEC.fields}) == []
    # A layer's ownership, where the planner gives none, is a thread group's.
    assert Layer.__dataclass_fields__["ownership"].default == GROUP_SPEC.default_of("ownership")


def walk(table: TableSpec, schema: Any = None) -> Iterator[Tuple[TableSpec, str, Any]]:
    """(table, key, its JSON Schema) for every key with a default shown, through nested tables."""
    for key, spec in table.fields.items():
        sub = schema["properties"][key] if schema is not None else None
        if spec.table is not None:
            yield from walk(spec.table, (sub["items"] if spec.type == "tables" else sub) if sub is not None else None)
        elif shown(spec):
            yield table, key, sub


def test_the_json_schemas_give_the_spec_default_and_say_it_in_the_help_text():
    for table, schema in ((dc.CONFIG_SPEC, json_schema(dc.CONFIG_SPEC)), (PROFILE_SPEC, profile_json_schema())):
        for spec, key, sub in walk(table, schema):
            default = spec.default_of(key)
            assert sub["description"].endswith(f" Default: {default_text(default)}."), (spec.title, key)
            assert "default" not in sub if isinstance(default, ByValue) else same(sub["default"], default), (spec.title, key)
            typed = re.search(r"\(default|by default|default:", spec.fields[key].doc, re.I)
            assert not typed, f"{spec.title}.{key}: a default typed into its doc"


def page_problems(name: str, text: str) -> List[str]:
    """What a man page says of a default that its spec does not."""
    spec = PAGES[name]
    problems = [] if in_man_page(text, spec) == text else [f"{name}: the defaults block is not the specs' "
                                                            "(scripts/man-defaults.py writes it)"]
    plain = text.replace("\\-", "-").replace("\\(dq", '"')
    defaults = {}  # dotted key -> TOML text of its default
    for table, key, _ in walk(spec):
        defaults.setdefault(key, set()).add(default_text(table.default_of(key)))
    # `.BR key " = V"` and `.BR [table] " k = V, k2 = V2"`: each literal value said in a key's heading.
    for name, head in re.findall(r'^\.BR (\S+) "(.*)"$', plain, re.M):
        said = re.sub(r"\s+", " ", f"{name} {head}").replace('""', '"')  # roff's quote in a quoted argument
        for key, value in re.findall(r'(\w+) = ("[^"]*"|\[\]|true|false|-?[\d.]+)(?=,|$)', said):
            if key in defaults and value not in defaults[key]:
                problems.append(f"{name}: {key} = {value}, the spec says {' or '.join(sorted(defaults[key]))}")
    # `.B auto` then `(default)`: the word is its key's default.
    choices = {c: spec_.default_of(key) for spec_, key, _ in walk(spec)
               for c in spec_.fields[key].choices}
    for word in re.findall(r'^\.[BI] (\w+)\n\((?:the )?default\)', plain, re.M):
        if word in choices and choices[word] != word:
            problems.append(f"{name}: {word} is said to be the default, the spec says {choices[word]!r}")
    return problems


def test_the_man_pages_say_the_spec_defaults():
    for name in PAGES:
        assert page_problems(name, (MAN / name).read_text()) == []
    http = dc.HTTP_SPEC
    assert f"{http.default_of('listen')}:{http.default_of('port')}" in (MAN / "temperd.8").read_text()


def settings_problems(settings: dict) -> List[str]:
    """The settings of a temperd.toml that show a value other than their spec's default ([[binding]] aside)."""
    wrong = []

    def compare(values: dict, table: TableSpec, where: str) -> None:
        for key, value in values.items():
            spec = table.fields[key]
            if isinstance(value, dict):
                compare(value, spec.table, f"{where}{key}.")
            elif not same(value, spec.default):
                wrong.append(f"{where}{key} = {toml_text(value)}, the spec says {default_text(spec.default)}")
    compare({k: v for k, v in settings.items() if k != "binding"}, dc.CONFIG_SPEC, "")
    return wrong


def test_etc_temperd_toml_and_readme_show_the_spec_defaults():
    text = (ROOT / "etc" / "temperd.toml").read_text()
    shipped = tomllib.loads("\n".join(line[1:] for line in text.splitlines() if re.match(r"#[\[a-z]", line)))
    assert settings_problems(shipped) == [] and shipped["scx"]["crash_limit"] == dc.SCX_SPEC.default_of("crash_limit")
    readme = (ROOT / "README.md").read_text().split("## Configuration: /etc/temper/temperd.toml", 1)[1]
    example = tomllib.loads(readme.split("```toml\n", 1)[1].split("```", 1)[0])
    assert settings_problems(example) == [] and "weight" in example["tiers"]["critical"]  # the block was found


def test_the_checks_see_a_contrary_default():
    assert contrary(dataclasses.replace(dc.DaemonConfig(), reserve_cpus=2), DAEMON_FIELDS) != []
    assert settings_problems({"reserve_cpus": 2, "scx": {"crash_limit": 3}}) == ["reserve_cpus = 2, the spec says 1"]
    page = (MAN / "temperd.8").read_text()
    assert page_problems("temperd.8", page.replace('reserve_cpus " = 1"', 'reserve_cpus " = 2"'))
    assert page_problems("temperd.8", page.replace("crash_limit = 3\n", "crash_limit = 4\n", 1))
    profile = (MAN / "temper-profile.5").read_text()
    assert page_problems("temper-profile.5", profile.replace(".B owned\n(default)", ".B fenced\n(default)"))
