"""Which tier a test belongs to, from what it uses — read from its source, not listed by hand.

A test's *reach* is its own function (with its decorators and its class), the fixtures it asks
for, the module-level names those use (the module's ``pytestmark`` always), and — through the
helper modules of this directory (``servers``, ``driven``, ...) — the helpers they call, followed
until nothing new is reached. The names in that reach decide the tier:

- ``vm``: runs the real scx_layered binary or loads a BPF program through bcc (a kernel with
  sched_ext or headers: the VM guest's, or root here);
- ``servers``: starts a real server from a Debian package (memcached, redis, PostgreSQL, ...);
- ``root``: checks for root (``os.geteuid()``), or is skipped unless root;
- ``slow``: starts processes or threads, opens sockets, or sleeps;
- ``unit``: none of these — runs as any user, in milliseconds.

A test may carry several of the first four markers; its tier (for the per-tier timing) is the
first of vm, servers, root, slow that it carries. pytest-free, so it can be tested on its own.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

TIERS = ("vm", "servers", "root", "slow", "unit")

# Names whose use puts a test into a tier (identifiers, attribute names and imported names).
VM_NAMES = frozenset({"real_scx_layered", "require_real_scx_layered", "BPF", "TEMPERD_SCX_LAYERED"})
SERVER_NAMES = frozenset({"memcached_server", "redis_server", "postgresql_server", "mariadb_server",
                          "jvm_service", "onnx_worker", "start_parallel_query"})
# geteuid: a root check; chown: files given to another owner. The calls after them answer from the
# caller's privileges (its capabilities, or files it wrote being root's): right only as root.
ROOT_NAMES = frozenset({"geteuid", "needs_root", "chown", "lchown", "fchown",
                        "load_profile_set", "detect_sched_ext", "bcc_unavailable", "missing_capabilities"})
# Processes, threads, sockets and sleeps — and the project's calls that start processes.
SLOW_NAMES = frozenset({
    "sleep", "subprocess", "Popen", "check_output", "fork", "spawn", "Children", "DrivenProcess",
    "Thread", "threading", "socket", "socketpair", "urlopen", "HTTPConnection", "create_connection",
    "ProcConnector", "Daemon", "spinners", "start_spinners",
})
# Fixtures that stand for one of the above (by the name a test asks for).
FIXTURE_SIGNALS = {"spawn": "slow", "children": "slow"}


@dataclass
class _Module:
    """One parsed file: its top-level definitions by name and the names it imports from helpers."""

    path: str
    defs: Dict[str, List[ast.AST]] = field(default_factory=dict)
    imported_from: Dict[str, Tuple[str, Optional[str]]] = field(default_factory=dict)
    external: Dict[str, str] = field(default_factory=dict)


def _names_in(node: ast.AST) -> Set[str]:
    found: Set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.alias):
            found.update(sub.name.split("."))
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.update(a.arg for a in sub.args.args + sub.args.kwonlyargs)
    return found


class Reach:
    """Follows a test's reach through the files of one directory (the helpers it may import)."""

    def __init__(self, helper_dir: str) -> None:
        self.helper_dir = helper_dir
        self._modules: Dict[str, _Module] = {}

    def _module(self, path: str) -> _Module:
        module = self._modules.get(path)
        if module is not None:
            return module
        module = _Module(path)
        self._modules[path] = module
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
        except (OSError, SyntaxError, ValueError):
            return module
        for node in tree.body:
            for name in _defined_names(node):
                module.defs.setdefault(name, []).append(node)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._note_imports(module, node)
        return module

    def _helper_path(self, dotted: str) -> Optional[str]:
        path = os.path.join(self.helper_dir, *dotted.split(".")) + ".py"
        return path if os.path.isfile(path) else None

    def _note_imports(self, module: _Module, node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            helper = self._helper_path(node.module)
            for alias in node.names:
                if helper:
                    module.imported_from[alias.asname or alias.name] = (helper, alias.name)
                else:  # `from subprocess import run`: a use of run is a use of subprocess
                    module.external[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                helper = self._helper_path(alias.name)
                if helper:
                    module.imported_from[alias.asname or alias.name] = (helper, None)

    def names(self, path: str, roots: Iterable[str], nodes: Iterable[ast.AST] = ()) -> Set[str]:
        """Every name reached from the top-level definitions ``roots`` of the file (and ``nodes``)."""
        seen_defs: Set[Tuple[str, str]] = set()
        found: Set[str] = set()
        todo: List[Tuple[str, ast.AST]] = [(path, n) for n in nodes]
        pending: List[Tuple[str, str]] = [(path, r) for r in roots]
        while todo or pending:
            while pending:
                where, name = pending.pop()
                if (where, name) in seen_defs:
                    continue
                seen_defs.add((where, name))
                todo.extend((where, n) for n in self._module(where).defs.get(name, ()))
            if not todo:
                break
            where, node = todo.pop()
            names = _names_in(node)
            found |= names
            module = self._module(where)
            for name in names:
                if name in module.external:
                    found.update(module.external[name].split("."))
                if name in module.defs:
                    pending.append((where, name))
                if name in module.imported_from:
                    helper, attr = module.imported_from[name]
                    found.add(os.path.splitext(os.path.basename(helper))[0])  # the helper module used
                    if attr is not None:
                        pending.append((helper, attr))
                    else:  # a module: follow the attributes used on it that it defines
                        helper_defs = self._module(helper).defs
                        pending.extend((helper, n) for n in names if n in helper_defs)
        return found


def _defined_names(node: ast.AST) -> List[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def markers_for(names: Set[str], fixtures: Iterable[str] = (), skip_reasons: Iterable[str] = ()) -> FrozenSet[str]:
    """The tier markers a test with this reach, these fixtures and these skip reasons carries."""
    marks: Set[str] = set()
    if names & VM_NAMES:
        marks.add("vm")
    if names & SERVER_NAMES:
        marks.add("servers")
    if names & ROOT_NAMES or any("root" in reason for reason in skip_reasons):
        marks.add("root")
    if names & SLOW_NAMES:
        marks.add("slow")
    marks.update(FIXTURE_SIGNALS[f] for f in fixtures if f in FIXTURE_SIGNALS)
    return frozenset(marks) if marks else frozenset({"unit"})


def tier_of(marks: Iterable[str]) -> str:
    """The one tier a test counts under: the first of TIERS among its markers."""
    present = set(marks)
    return next((tier for tier in TIERS if tier in present), "unit")
