"""temperd supports Python >= 3.9 (RHEL 9). Parsing with the 3.9 grammar catches `match` and
parenthesised context managers; what it cannot catch is code that parses on 3.9 and fails when
it runs: `X | Y` of types evaluated at run time (isinstance, aliases, casts, and every
annotation of a module without `from __future__ import annotations`), standard-library names
added later, and keywords 3.9's functions refuse. `find_python310_uses` walks each module for
those; the checker's own tests feed it code that 3.9 rejects, so the module tests can fail."""

import ast
import pathlib
from typing import List

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for d in ("temperd", "temperctl", "bench", "profiles") for p in (ROOT / d).rglob("*.py"))

_BUILTIN_TYPES = {"int", "float", "str", "bytes", "bool", "list", "dict", "tuple", "set", "frozenset", "type", "object"}
_TYPING_GENERICS = {"Optional", "Union", "List", "Dict", "Tuple", "Set", "FrozenSet", "Iterable", "Iterator",
                    "Mapping", "Sequence", "Callable", "Any", "Type"}
# Names added to the standard library after 3.9, as module.attribute or names imported from a module.
_NEW_NAMES = {
    "typing": {"TypeAlias", "ParamSpec", "Concatenate", "TypeGuard", "Self", "LiteralString", "Never",
               "Required", "NotRequired", "assert_never", "reveal_type", "Unpack", "TypeVarTuple", "override"},
    "itertools": {"pairwise", "batched"},
    "contextlib": {"aclosing", "chdir"},
    "enum": {"StrEnum", "verify", "ReprEnum"},
    "datetime": {"UTC"},
    "hashlib": {"file_digest"},
    "asyncio": {"TaskGroup", "timeout"},
    "math": {"cbrt", "exp2"},
    "tomllib": None,  # the whole module: 3.11
}
_NEW_METHODS = {"bit_count"}  # int.bit_count (3.10)
# function name -> keywords it gained after 3.9
_NEW_KEYWORDS = {"zip": {"strict"}, "dataclass": {"kw_only", "slots", "match_args"},
                 "bisect": {"key"}, "bisect_left": {"key"}, "bisect_right": {"key"}, "insort": {"key"}}


def _is_type_expr(node: ast.AST, classes: set) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Name):
        return node.id in _BUILTIN_TYPES or node.id in _TYPING_GENERICS or node.id in classes
    if isinstance(node, ast.Subscript):
        return _is_type_expr(node.value, classes)
    if isinstance(node, ast.Attribute):
        return node.attr in _TYPING_GENERICS
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_type_expr(node.left, classes) or _is_type_expr(node.right, classes)
    return False


def _annotation_nodes(tree: ast.AST) -> set:
    """ids of every node inside an annotation (postponed, never evaluated, under PEP 563)."""
    out = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        for annotation in annotations:
            out.update(id(n) for n in ast.walk(annotation))
    return out


def _guarded_imports(tree: ast.AST) -> set:
    """ids of nodes inside `try: ... except ImportError` or `if sys.version_info >= ...:` (the
    3.11-or-backport patterns)."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and "version_info" in ast.dump(node.test.left)):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def find_python310_uses(source: str) -> List[str]:
    """What Python 3.9 would reject when this module is imported or run, one line each."""
    tree = ast.parse(source)
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    skipped = _annotation_nodes(tree) if postponed else set()
    guarded = _guarded_imports(tree)
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in skipped
                and _is_type_expr(node, classes)):
            found.append(f"line {line}: `X | Y` of types is evaluated here (3.10)")
        elif isinstance(node, ast.ImportFrom) and node.module in _NEW_NAMES and id(node) not in guarded:
            new = _NEW_NAMES[node.module]
            bad = [a.name for a in node.names] if new is None else [a.name for a in node.names if a.name in new]
            if bad:
                found.append(f"line {line}: from {node.module} import {', '.join(bad)} (after 3.9)")
        elif isinstance(node, ast.Import) and id(node) not in guarded:
            for alias in node.names:
                if _NEW_NAMES.get(alias.name, ()) is None:
                    found.append(f"line {line}: import {alias.name} (after 3.9)")
        elif isinstance(node, ast.Attribute):
            if (isinstance(node.value, ast.Name) and node.value.id in _NEW_NAMES
                    and _NEW_NAMES[node.value.id] and node.attr in _NEW_NAMES[node.value.id]):
                found.append(f"line {line}: {node.value.id}.{node.attr} (after 3.9)")
            elif node.attr in _NEW_METHODS:
                found.append(f"line {line}: .{node.attr}() (3.10)")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            for keyword in node.keywords:
                if keyword.arg in _NEW_KEYWORDS.get(name, ()):
                    found.append(f"line {line}: {name}({keyword.arg}=...) (after 3.9)")
    return found


# --- the checker can fail: each snippet is something Python 3.9 rejects at import or run time ---

@pytest.mark.parametrize("snippet", [
    "def f(x: int | None): pass",  # no PEP 563: annotations are evaluated at definition
    "from __future__ import annotations\nAlias = int | None",
    "from __future__ import annotations\nimport typing\ndef f(x):\n    return isinstance(x, int | str)",
    "from __future__ import annotations\nfrom typing import Optional, cast\ny = cast(Optional[int] | str, 1)",
    "from __future__ import annotations\nclass A: pass\nx = A | None",
    "from typing import TypeAlias",
    "import itertools\npairs = itertools.pairwise([1, 2])",
    "import tomllib",
    "n = (5).bit_count()",
    "pairs = list(zip([1], [2], strict=True))",
    "from dataclasses import dataclass\n@dataclass(slots=True)\nclass A:\n    x: int = 0",
])
def test_checker_finds_what_python_3_9_rejects(snippet):
    assert find_python310_uses(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "from __future__ import annotations\ndef f(x: int | None) -> str | None: pass",
    "from __future__ import annotations\nfrom dataclasses import dataclass\n@dataclass\nclass A:\n    x: int | None = None",
    "import os\nflags = os.O_RDONLY | os.O_CLOEXEC",
    "mask = 1 | 2",
    "try:\n    import tomllib\nexcept ImportError:\n    import tomli as tomllib",
    "import sys\nif sys.version_info >= (3, 11):\n    import tomllib\nelse:\n    import tomli as tomllib",
])
def test_checker_accepts_what_python_3_9_runs(snippet):
    assert find_python310_uses(snippet) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_parses_with_python_3_9_grammar(path):
    source = path.read_text(encoding="utf-8")
    ast.parse(source, filename=str(path), feature_version=(3, 9))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runs_on_python_3_9(path):
    assert find_python310_uses(path.read_text(encoding="utf-8")) == []
