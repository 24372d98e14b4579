"""The packages follow the data flow (docs/architecture.md): each stage imports only the stages
before it. An import that points up the flow (sources importing a backend, a backend importing
the daemon) fails here, found by walking every module's imports with ast, lazy ones included."""

import ast
import pathlib
from typing import List, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Earlier stages first. A stage may import any stage listed before it (and itself), never one after.
# `plan`, `paths` and `files` are the shared base; trace sits beside the backends (both read sources);
# training sits beside observe (it reads traces and samples, and judges profiles by measuring them).
STAGES = [
    ("plan", "paths", "files", "text", "wakeup"),
    ("config",),
    ("sources",),
    ("decide",),
    ("backends", "trace"),
    ("observe", "training"),
    ("daemon",),
]
RANK = {name: rank for rank, names in enumerate(STAGES) for name in names}


def stage_of(module: str) -> Optional[str]:
    parts = module.split(".")
    if parts[0] != "temperd" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> List[tuple]:
    """(line, absolute module) for every import, relative ones resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # `from temperd import sources` names a package through its parent
            out.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return out


def upward_imports(path: pathlib.Path) -> List[str]:
    module = module_name(path)
    mine = stage_of(module)
    if mine is None:
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for line, target in imported_modules(tree, module, path.name == "__init__.py"):
        theirs = stage_of(target)
        if theirs is not None and RANK[theirs] > RANK[mine]:
            found.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target} ({theirs} comes later)")
    return sorted(set(found))


MODULES = sorted((ROOT / "temperd").rglob("*.py"))


def test_every_module_belongs_to_a_stage():
    loose = [str(p.relative_to(ROOT)) for p in MODULES
             if module_name(p) != "temperd" and stage_of(module_name(p)) is None]
    assert loose == [], "modules outside the stages (add them to one, and to docs/architecture.md)"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_points_up_the_data_flow(path):
    assert upward_imports(path) == []


def test_an_upward_import_is_found(tmp_path, monkeypatch):
    """The walk itself can fail: a source module importing the daemon, lazily, is reported."""
    fake_root = tmp_path
    pkg = fake_root / "temperd" / "sources"
    pkg.mkdir(parents=True)
    bad = pkg / "leaky.py"
    bad.write_text("def f():\n    from ..daemon import control\n    import temperd.backends.native.sched\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake_root)
    found = upward_imports(bad)
    assert any("temperd.daemon" in f for f in found) and any("temperd.backends" in f for f in found), found


def test_cli_computes_locally_only_through_decide():
    """temperctl is a client of the daemon: what it computes itself goes through decide (and the
    config and sources decide reads), never a backend's or the daemon's internals, except the
    read-only scx render/validate it shows and the control socket client."""
    allowed_backends = {"temperd.backends.scx.render", "temperd.backends.scx.validate", "temperd.backends.scx.detect"}
    allowed_daemon = {"temperd.daemon.control"}
    found = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, target in imported_modules(tree, "temperctl." + path.stem, False):
            stage = stage_of(target)
            if stage == "backends" and not any(target.startswith(a) for a in allowed_backends):
                found.append(f"cli/{path.name}:{line}: {target}")
            if stage in ("daemon", "observe") and not any(target.startswith(a) for a in allowed_daemon):
                found.append(f"cli/{path.name}:{line}: {target}")
    assert found == []
