"""temperd supports Python >= 3.9 (RHEL 9): every module must parse with the 3.9 grammar."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for d in ("temperd", "cli", "bench", "profiles") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_parses_with_python_3_9_grammar(path):
    source = path.read_text(encoding="utf-8")
    ast.parse(source, filename=str(path), feature_version=(3, 9))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_runtime_union_syntax_or_new_stdlib(path):
    """`X | None` in annotations is fine only when annotations are not evaluated (PEP 563)."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    postponed = "from __future__ import annotations" in source
    for node in ast.walk(tree):
        if isinstance(node, (ast.AnnAssign, ast.arg)) and not postponed:
            annotation = node.annotation
            assert not (annotation is not None and isinstance(annotation, ast.BinOp)
                        and isinstance(annotation.op, ast.BitOr)), f"{path}:{node.lineno}: X | Y needs Python 3.10"
    for name in ("from typing import TypeAlias", "zip(strict", "kw_only=", "slots=True"):
        assert name not in source, f"{path}: {name} needs Python >= 3.10"
