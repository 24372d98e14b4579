"""Fuzzing the loaders with hypothesis. The TOML ones (profiles, temperd.toml): whatever the text,
the only exception is ConfigError, and every ConfigError names the file on one line. Two
strategies: any text, and valid files with one value replaced by another TOML value (the
validators' inputs). The rightsizing history (JSON): whatever the file holds, loading never
raises, says what it found in one line, and what it loads can be summarised and saved."""

import json
import pathlib
import re
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from temperd.config.daemon_config import config_from_document
from temperd.config.tomlsource import parse_toml
from temperd.config.errors import ConfigError
from temperd.config.profile import parse_profile
from temperd.observe.usage_history import UsageHistory

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROFILE_TEXTS = [p.read_text() for p in sorted((ROOT / "profiles").glob("*.toml"))]
# The shipped temperd.toml with every setting uncommented (each shows its default).
CONFIG_TEXT = "\n".join(re.sub(r"^#(?=[\[a-z])", "", line) for line in
                        (ROOT / "etc" / "temperd.toml").read_text().splitlines()) + "\n"
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Named functions, not lambdas, in the strategies: hypothesis describes a lambda by finding and
# parsing its source, at every draw of a strategy built inside st.recursive — most of a run's time.


def toml_float(f: float) -> str:
    return repr(f)


def toml_string(s: str) -> str:
    return '"' + (s.replace("\\", "\\\\").replace('"', '\\"').encode("unicode_escape").decode("ascii")
                  .replace("\\\\x", "\\\\u00")) + '"'


def toml_literal_string(s: str) -> str:
    return "'" + s + "'"


def containers(keys, separator: str):
    """st.recursive's extension: arrays of the values drawn so far, and tables of them under one
    of `keys` (TOML's `{k = v}`, JSON's `{k: v}`: `separator`)."""
    def array(items) -> str:
        return "[" + ", ".join(items) + "]"

    def table(members) -> str:
        return "{" + ", ".join(f"{k}{separator}{v}" for k, v in members.items()) + "}"

    def extend(inner):
        return st.one_of(st.lists(inner, max_size=4).map(array),
                         st.dictionaries(st.sampled_from(keys), inner, max_size=3).map(table))
    return extend


scalar = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70).map(str),
    st.sampled_from(["nan", "inf", "-inf", "0.0", "1e400", "-0", "true", "false", "1979-05-27", "07:32:00"]),
    st.floats(allow_nan=True, allow_infinity=True).map(toml_float),
    st.text(max_size=40).map(toml_string),
    st.text(alphabet="()[]{}*+?|^$.\\abc", max_size=20).map(toml_literal_string),
)
toml_value = st.recursive(scalar, containers(["a", "b", "name", "weight"], " = "), max_leaves=8)


def test_the_uncommented_example_is_a_valid_config():
    assert daemon_config(CONFIG_TEXT, "temperd.toml").bindings


def daemon_config(text, file):
    return config_from_document(parse_toml(text, file))


def assert_only_config_errors(parse, text, file):
    try:
        parse(text, file)
    except ConfigError as exc:
        assert exc.problems and all(p.file == file for p in exc.problems)
        assert all("\n" not in str(p) for p in exc.problems)


def replace_one_value(text: str, line_index: int, value: str) -> str:
    lines = text.splitlines()
    assignments = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
    i = assignments[line_index % len(assignments)]
    key = lines[i].split("=", 1)[0]
    lines[i] = f"{key}= {value}"
    return "\n".join(lines) + "\n"


@FUZZ
@given(st.text(max_size=400))
def test_any_text_as_a_profile_or_config(text):
    assert_only_config_errors(parse_profile, text, "fuzz.toml")
    assert_only_config_errors(daemon_config, text, "temperd.toml")


@FUZZ
@given(st.sampled_from(range(len(PROFILE_TEXTS))), st.integers(min_value=0, max_value=200), toml_value)
def test_a_builtin_profile_with_one_value_replaced(which, line_index, value):
    assert_only_config_errors(parse_profile, replace_one_value(PROFILE_TEXTS[which], line_index, value), "fuzz.toml")


@FUZZ
@given(st.integers(min_value=0, max_value=200), toml_value)
def test_temperd_toml_with_one_value_replaced(line_index, value):
    assert_only_config_errors(daemon_config, replace_one_value(CONFIG_TEXT, line_index, value), "temperd.toml")


@pytest.mark.parametrize("text", ["a = " + "[" * 3000 + "]" * 3000, "a = 1\n" * 20000 + "a = 2\n"])
def test_pathological_but_valid_shapes(text):
    assert_only_config_errors(daemon_config, text, "temperd.toml")
    assert_only_config_errors(parse_profile, text, "fuzz.toml")


HISTORY_TEXT = json.dumps({"version": 1, "half_life_s": 86400.0, "workloads": {"app.service": {
    "first_at": 1000.0, "last_at": 1600.0, "samples": 600,
    "threads": [{"tid": 100, "start_time": 1, "comm": "hot", "group": "workers",
                 "hist": {"reference": 1000.0, "buckets": {"80": 2.5, "3": 0.5}}}],
    "rest": {"reference": 1000.0, "buckets": {"2": 1.0}}, "total": {"reference": 1000.0, "buckets": {"20": 1.0}},
    "group_rest": {"workers": {"reference": 1000.0, "buckets": {"2": 1.0}}}}}}, indent=0)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                        st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "9" * 400, '"\\ud800"']))


def json_text(value) -> str:
    """A scalar as JSON text; the strings that stand for out-of-range or invalid JSON numbers
    (1e999, NaN, a 400-digit integer, a lone surrogate) as they are."""
    return value if isinstance(value, str) and value[:1] in "19-NI\"" else json.dumps(value)


json_value = st.recursive(json_scalar.map(json_text), containers(['"0"', '"80"', '"a"', '"buckets"', '"hist"'], ": "),
                          max_leaves=8)


def assert_history_loads_or_is_set_aside(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "usage-history.json"
        path.write_text(text)
        history = UsageHistory(str(path), 86400.0, 16)
        said = history.load()
        assert "\n" not in said and said.startswith(str(path))
        if "unreadable" in said:
            assert history.workloads == {} and (path.parent / "usage-history.json.bad").exists()
        for workload in history.workloads.values():
            workload.summary()
        history.save()


@FUZZ
@given(st.text(max_size=400))
def test_any_text_as_the_history_file(text):
    assert_history_loads_or_is_set_aside(text)


@FUZZ
@given(st.integers(min_value=0, max_value=200), json_value)
def test_the_history_file_with_one_value_replaced(line_index, value):
    lines = HISTORY_TEXT.splitlines()
    values = [i for i, line in enumerate(lines) if re.search(r'": [^[{]', line)]
    i = values[line_index % len(values)]
    key = lines[i].split('": ', 1)[0]
    lines[i] = f'{key}": {value}' + ("," if lines[i].rstrip().endswith(",") else "")
    assert_history_loads_or_is_set_aside("\n".join(lines))
