"""The packages follow the data flow (docs/architecture.md): each stage imports only the stages
before it. An import that points up the flow (sources importing a backend, a backend importing
the daemon) fails here, found by walking every module's imports with ast, lazy ones included."""

import ast
import re
import pathlib
from typing import List, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Earlier stages first. A stage may import any stage listed before it (and itself), never one after.
# `plan`, `paths` and `files` are the shared base; trace sits beside the backends (both read sources);
# training sits beside observe (it reads traces and samples, and judges profiles by measuring them).
STAGES = [
    ("plan", "paths", "files", "text", "wakeup", "control"),
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


def module_name(path: pathlib.Path, root: Optional[pathlib.Path] = None) -> str:
    parts = list(path.relative_to(root or ROOT).with_suffix("").parts)
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
    allowed_daemon: set = set()  # the control client and protocol are a package of their own (temperd/control)
    found = []
    for path in sorted((ROOT / "temperctl").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, target in imported_modules(tree, "temperctl." + path.stem, False):
            stage = stage_of(target)
            if stage == "backends" and not any(target.startswith(a) for a in allowed_backends):
                found.append(f"temperctl/{path.name}:{line}: {target}")
            if stage in ("daemon", "observe") and not any(target.startswith(a) for a in allowed_daemon):
                found.append(f"temperctl/{path.name}:{line}: {target}")
    assert found == []


# ---- no circles, TYPE_CHECKING imports counted ------------------------------------------------

def import_graph(root: pathlib.Path) -> dict:
    """module -> the temperd modules it imports (every import: lazy, TYPE_CHECKING, relative), each
    resolved to the longest module name that exists (`from temperd.x import y` names temperd.x.y
    where y is a module, else temperd.x)."""
    paths = {module_name(p, root): p for p in sorted((root / "temperd").rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        targets = set()
        for _line, target in imported_modules(ast.parse(path.read_text(encoding="utf-8")), module,
                                              path.name == "__init__.py"):
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def circles(graph: dict) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_even_counting_type_checking_imports():
    assert circles(import_graph(ROOT)) == []


def test_a_circle_through_a_type_checking_import_is_found(tmp_path):
    pkg = tmp_path / "temperd" / "daemon"
    pkg.mkdir(parents=True)
    (tmp_path / "temperd" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from temperd.daemon.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from temperd.daemon import a\n")
    (pkg / "c.py").write_text("from temperd.daemon import a\n")
    assert circles(import_graph(tmp_path)) == [["temperd.daemon.a", "temperd.daemon.b"]]


# ---- only sources/, backends/ and trace/ name the kernel's files ------------------------------

KERNEL_PATH = re.compile(r"""^/(proc|sys)(/|$)""")
KERNEL_READERS = ("sources", "backends", "trace")


def kernel_path_literals(path: pathlib.Path) -> List[str]:
    """String literals (f-string parts included) that start with /proc or /sys, docstrings aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and KERNEL_PATH.match(node.value)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_only_sources_backends_and_trace_name_proc_or_sys_paths():
    found = []
    for path in MODULES:
        if stage_of(module_name(path)) in KERNEL_READERS:
            continue
        found.extend(kernel_path_literals(path))
    for path in sorted((ROOT / "temperctl").glob("*.py")):
        found.extend(kernel_path_literals(path))
    assert found == [], "read the kernel's facts through temperd/sources"


def test_a_proc_path_outside_sources_is_found(tmp_path, monkeypatch):
    bad = tmp_path / "temperd" / "observe" / "peek.py"
    bad.parent.mkdir(parents=True)
    bad.write_text('"""Reads /proc in its docstring: fine."""\nPATH = "/proc/stat"\nf = f"/sys/fs/cgroup/{1}"\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [line.split(": ", 1)[1] for line in kernel_path_literals(bad)] == ["'/proc/stat'", "'/sys/fs/cgroup/'"]


# ---- docs/architecture.md names every module ----------------------------------------------------

def test_architecture_names_every_module():
    """Each module's name appears in docs/architecture.md's package table, as `name` (a package's
    __init__ by its package)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = "\n".join(line for line in text.splitlines() if line.startswith("| `"))
    missing = []
    for path in MODULES:
        name = path.parent.name if path.name == "__init__.py" else path.stem
        if name == "temperd":
            continue
        if not re.search(rf"`([^`]*/)?{re.escape(name)}(\.py|/)?`", table):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == [], "add these to the package table of docs/architecture.md"


# ---- small classes ------------------------------------------------------------------------------

MAX_CLASS_LINES = 300


def class_sizes(path: pathlib.Path, root: pathlib.Path = ROOT) -> dict:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {f"{path.relative_to(root)}::{node.name}": node.end_lineno - node.lineno + 1
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_no_class_over_300_lines():
    large = {name: lines for path in MODULES for name, lines in class_sizes(path).items() if lines > MAX_CLASS_LINES}
    assert large == {}, "split these: one concern per class"


MAX_FUNCTION_LINES = 80


def function_sizes(path: pathlib.Path, root: pathlib.Path = ROOT) -> dict:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {f"{path.relative_to(root)}:{node.lineno}:{node.name}": node.end_lineno - node.lineno + 1
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_function_over_80_lines():
    long = {name: lines for path in MODULES for name, lines in function_sizes(path).items()
            if lines > MAX_FUNCTION_LINES}
    assert long == {}, "split these: a function a reader holds in one view"


def test_a_long_function_is_measured(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("class C:\n    def f(self):\n" + "        x = 1\n" * MAX_FUNCTION_LINES)
    assert function_sizes(long, tmp_path) == {"long.py:2:f": MAX_FUNCTION_LINES + 1}


def test_a_large_class_is_measured(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert class_sizes(big, tmp_path) == {"big.py::Big": MAX_CLASS_LINES + 1}
