"""README.md and docs/ name what exists: every temperctl command is in README's command table,
and every module path or dotted module name in README.md, docs/*.md and docs/man/* is in the tree."""

from __future__ import annotations

import ast
import glob
import os
import re
from typing import Iterator, List, Optional, Tuple

import click

from temperctl.main import main as temperctl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted([os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))
              + glob.glob(os.path.join(ROOT, "docs", "man", "*")))
# Installed packages whose source lives elsewhere in the tree (pyproject.toml's package-dir).
PACKAGE_DIRS = {"temperd.builtin_profiles": "profiles"}
# Files named after the daemon, not modules: temperd.toml, temperd.sock, temperd.service(.d), temperd.lock.
FILE_SUFFIXES = ("toml", "sock", "service", "lock")
# Not preceded by a word, a path or a dot: /usr/share/temperd/... is an installed path, not the tree's.
MODULE_PATH = re.compile(r"(?<![\w/.-])temperd/[\w/]*\.py\b")
DOTTED_NAME = re.compile(r"(?<![\w/.-])temperd(?:\.[A-Za-z_]\w*)+")


def command_paths(command: click.Command, ctx: click.Context, path: Tuple[str, ...] = ()) -> Iterator[Tuple[str, ...]]:
    """Every command temperctl runs, as its words after `temperctl`: a group that runs without a
    subcommand (`train`) is one too."""
    if not isinstance(command, click.Group):
        yield path
        return
    if path and command.invoke_without_command:
        yield path
    for name in command.list_commands(ctx):
        yield from command_paths(command.get_command(ctx, name), ctx, path + (name,))


def readme_command_lines() -> List[List[str]]:
    """The command part of each line of README's temperctl table (the block under `## temperctl`),
    split into words; `a | b` lists both."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    block = text.split("\n## temperctl\n", 1)[1].split("```", 2)[1]
    lines = []
    for line in block.splitlines():
        if line.startswith("temperctl "):
            lines.append([w for w in re.split(r"\s{2,}", line)[0].split()[1:] if w != "|"])
    return lines


def listed(path: Tuple[str, ...], lines: List[List[str]]) -> bool:
    """A line starts with the command's words; for a subcommand, or one of `a | b` after them."""
    for words in lines:
        if tuple(words[:len(path)]) == path:
            return True
        if len(path) > 1 and tuple(words[:len(path) - 1]) == path[:-1] and path[-1] in words[len(path) - 1:]:
            return True
    return False


def test_readme_lists_every_temperctl_command():
    ctx = click.Context(temperctl)
    paths = list(command_paths(temperctl, ctx))
    assert ("status",) in paths and ("profiles", "list") in paths and ("train",) in paths  # the walk reaches them
    lines = readme_command_lines()
    missing = [" ".join(p) for p in paths if not listed(p, lines)]
    assert missing == [], f"README.md's temperctl table leaves out: {missing}"


def test_the_command_check_sees_a_missing_command():
    lines = [["status", "[--json]"], ["scx", "rules", "detect"]]
    assert listed(("status",), lines) and listed(("scx", "detect"), lines)
    assert not listed(("reload",), lines) and not listed(("scx", "validate"), lines)


def module_file(dotted: str) -> Optional[str]:
    """The file or package directory of a dotted module name, None if there is none."""
    for installed, source in PACKAGE_DIRS.items():
        if dotted == installed or dotted.startswith(installed + "."):
            dotted = source + dotted[len(installed):]
            break
    base = os.path.join(ROOT, *dotted.split("."))
    if os.path.isfile(base + ".py"):
        return base + ".py"
    if os.path.isdir(base):
        return base
    return None


def defines(path: str, name: str) -> bool:
    """Whether a module file (or a package's __init__.py) binds `name` at its top level."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, name + ".py")) or os.path.isdir(os.path.join(path, name)):
            return True
        path = os.path.join(path, "__init__.py")
        if not os.path.isfile(path):
            return False
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def dotted_exists(dotted: str) -> bool:
    """temperd.a.b: the longest prefix that is a module, and what follows it defined there."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        found = module_file(".".join(parts[:cut]))
        if found is None:
            continue
        rest = parts[cut:]
        return not rest or (len(rest) == 1 and defines(found, rest[0]))
    return False


def named_modules() -> Iterator[Tuple[str, str]]:
    """(document, name) for each module path and dotted module name the documents give."""
    for doc in DOCS:
        with open(doc, encoding="utf-8") as handle:
            text = handle.read().replace("\\-", "-")  # man pages escape their hyphens
        for found in MODULE_PATH.findall(text):
            yield os.path.relpath(doc, ROOT), found
        for found in DOTTED_NAME.findall(text):
            if found.split(".")[1] not in FILE_SUFFIXES:
                yield os.path.relpath(doc, ROOT), found


def test_every_module_the_docs_name_exists():
    names = list(named_modules())
    assert any(name.startswith("temperd/") for _, name in names)  # the patterns find what the docs hold
    missing = [f"{doc}: {name}" for doc, name in names
               if not (os.path.isfile(os.path.join(ROOT, name)) if name.endswith(".py") else dotted_exists(name))]
    assert missing == [], f"named in the docs, not in the tree: {missing}"


def test_the_module_check_sees_a_moved_module():
    assert dotted_exists("temperd.trace.parse") and dotted_exists("temperd.trace.parse.parse_trace")
    assert dotted_exists("temperd.builtin_profiles")
    assert not dotted_exists("temperd.trace_parse.parse_trace") and not dotted_exists("temperd.trace.parse.nothing_here")
    assert MODULE_PATH.findall("see temperd/plan.py, not /usr/share/temperd/x.py") == ["temperd/plan.py"]
    assert DOTTED_NAME.findall("`temperd.trace_parse.parse_trace(FILE)`") == ["temperd.trace_parse.parse_trace"]


# ---- package docstrings that list their modules --------------------------------------------------

LISTED_MODULE = re.compile(r"^(?:- (\w+):|(\w+)\.py\s)", re.MULTILINE)


def package_lists() -> Iterator[Tuple[str, List[str], List[str], str]]:
    """(package, modules in its directory, modules its docstring lists, the docstring) for each
    package whose docstring lists modules, one a line (`- name: ...` or `name.py  ...`)."""
    for init in sorted(glob.glob(os.path.join(ROOT, "temperd", "**", "__init__.py"), recursive=True)):
        with open(init, encoding="utf-8") as handle:
            doc = ast.get_docstring(ast.parse(handle.read())) or ""
        listed_names = [a or b for a, b in LISTED_MODULE.findall(doc)]
        if not listed_names:
            continue
        folder = os.path.dirname(init)
        modules = sorted(name[:-3] for name in os.listdir(folder) if name.endswith(".py") and name != "__init__.py")
        yield os.path.relpath(folder, ROOT), modules, listed_names, doc


def test_package_docstrings_list_the_modules_there_are():
    """A package docstring that lists its modules lists each one there is (by name, in the list
    or in a line of it) and none that moved away."""
    lists = list(package_lists())
    assert {"temperd/backends/native", "temperd/daemon", "temperd/observe"} <= {p for p, *_ in lists}
    for package, modules, listed_names, doc in lists:
        gone = [name for name in listed_names if name not in modules]
        assert gone == [], f"{package}/__init__.py lists modules it does not hold: {gone}"
        unnamed = [name for name in modules if not re.search(rf"\b{name}\b", doc)]
        assert unnamed == [], f"{package}/__init__.py leaves out: {unnamed}"
