"""README.md and docs/ name what exists: every temperctl command is in README's command table, in
`temperctl --help` (its group's list of commands) and in temperctl(8) (its synopsis and its
COMMANDS section); every path into the tree (`temperd/x/y.py`, `bench/x.py`, `scripts/x.sh`, ...)
and every dotted module name in README.md, docs/*.md and docs/man/* is in the tree."""

from __future__ import annotations

import ast
import glob
import os
import re
from typing import Dict, Iterator, List, Optional, Tuple

import click
from click.testing import CliRunner

from temperctl.main import main as temperctl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted([os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))
              + glob.glob(os.path.join(ROOT, "docs", "man", "*")))
# Installed packages whose source lives elsewhere in the tree (pyproject.toml's package-dir).
PACKAGE_DIRS = {"temperd.builtin_profiles": "profiles"}
# Files named after the daemon, not modules: temperd.toml, temperd.sock, temperd.service(.d), temperd.lock.
FILE_SUFFIXES = ("toml", "sock", "service", "lock")
MAN_PAGE = os.path.join(ROOT, "docs", "man", "temperctl.8")
# The tree's top-level directories (temperd/, temperctl/, bench/, scripts/, tests/, docs/, ...).
TOP_DIRS = sorted(name for name in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, name))
                  and not name.startswith((".", "_")))
# A path into the tree: a top-level directory and what follows it, not preceded by a word, a path or
# a dot (/usr/share/temperd/... is an installed path, not the tree's). One with a shell variable or
# a glob in it, or a component in capitals (bench/NAME.py), is a pattern, not a path.
TREE_PATH = re.compile(r"(?<![\w/.~$-])(?:%s)/[\w/.@$*{}-]*" % "|".join(map(re.escape, TOP_DIRS)))
PLACEHOLDER = re.compile(r"[$*{}]|(?:^|/)[A-Z][A-Z_]*(?:\.\w+)?(?:/|$)")
# Kept for the check of the patterns below: the module paths of the package.
MODULE_PATH = re.compile(r"(?<![\w/.-])temperd/[\w/]*\.py\b")
DOTTED_NAME = re.compile(r"(?<![\w/.-])(?:temperd|temperctl)(?:\.[A-Za-z_]\w*)+")


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


def help_commands(words: Tuple[str, ...]) -> List[str]:
    """The commands `temperctl WORDS --help` lists (its "Commands:" section), by name."""
    result = CliRunner().invoke(temperctl, [*words, "--help"], prog_name="temperctl", terminal_width=200)
    assert result.exit_code == 0, result.output
    section = result.output.split("\nCommands:\n", 1)
    return [line.split()[0] for line in section[1].splitlines() if line.strip()] if len(section) == 2 else []


def test_help_lists_every_temperctl_command():
    ctx = click.Context(temperctl)
    paths = list(command_paths(temperctl, ctx))
    assert "train" in help_commands(()) and "evaluate" in help_commands(("train",))  # the sections are read
    missing = [" ".join(p) for p in paths if p[-1] not in help_commands(p[:-1])]
    assert missing == [], f"`temperctl --help` (or its group's) leaves out: {missing}"


def roff_text(line: str) -> str:
    """A man page line as it reads: its macro, font escapes, quotes and escaped hyphens gone."""
    line = re.sub(r"^\.[A-Z]{1,2}\b ?", "", line)
    line = re.sub(r"\\f[BIRP]", "", line).replace("\\-", "-").replace('"', "")
    return " ".join(line.split())


def man_sections(path: str = MAN_PAGE) -> Dict[str, List[str]]:
    """The lines of each `.SH` section of a man page, by section name."""
    sections: Dict[str, List[str]] = {}
    current = ""
    with open(path, encoding="utf-8") as handle:
        for line in handle.read().splitlines():
            if line.startswith(".SH "):
                current = line[4:].strip().strip('"')
                sections[current] = []
            else:
                sections.setdefault(current, []).append(line)
    return sections


def man_command_lines(sections: Dict[str, List[str]]) -> Tuple[List[List[str]], List[List[str]]]:
    """(the synopsis's commands, the COMMANDS section's items): each as its words after `temperctl`."""
    synopsis = [roff_text(line).split()[1:] for line in sections.get("SYNOPSIS", [])
                if roff_text(line).startswith("temperctl ")]
    lines = sections.get("COMMANDS", [])
    items = [roff_text(lines[i + 1]).split() for i, line in enumerate(lines[:-1]) if line.startswith(".TP")]
    return synopsis, items


def test_the_man_page_lists_every_temperctl_command():
    ctx = click.Context(temperctl)
    paths = list(command_paths(temperctl, ctx))
    synopsis, items = man_command_lines(man_sections())
    assert ["train", "evaluate"] in [words[:2] for words in synopsis] and ["status"] in items  # the sections are read
    missing = [" ".join(p) for p in paths if not any(tuple(words[:len(p)]) == p for words in synopsis)]
    assert missing == [], f"temperctl(8)'s SYNOPSIS leaves out: {missing}"
    missing = [" ".join(p) for p in paths if not any(tuple(words[:len(p)]) == p for words in items)]
    assert missing == [], f"temperctl(8)'s COMMANDS section leaves out: {missing}"


def test_the_man_page_check_sees_a_missing_command(tmp_path):
    page = tmp_path / "temperctl.8"
    page.write_text('.SH SYNOPSIS\n.B temperctl scx validate\n.RB [ \\-\\-json ]\n.br\n.B temperctl status\n'
                    '.SH COMMANDS\n.TP\n.BI "profiles show" " PROFILE_ID"\n.TP\n.BR "trace \\-o" " \\fIFILE\\fR"\n')
    synopsis, items = man_command_lines(man_sections(str(page)))
    assert synopsis == [["scx", "validate"], ["status"]]
    assert items == [["profiles", "show", "PROFILE_ID"], ["trace", "-o", "FILE"]]


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


def tree_paths(text: str) -> List[str]:
    """The paths into the tree a text names, placeholders (bench/NAME.py) left out."""
    paths = (path.rstrip(".-") for path in TREE_PATH.findall(text))
    return [path for path in paths if not PLACEHOLDER.search(path)]


def named_modules() -> Iterator[Tuple[str, str]]:
    """(document, name) for each path into the tree and each dotted module name the documents give."""
    for doc in DOCS:
        with open(doc, encoding="utf-8") as handle:
            text = handle.read().replace("\\-", "-")  # man pages escape their hyphens
        for found in tree_paths(text):
            yield os.path.relpath(doc, ROOT), found
        for found in DOTTED_NAME.findall(text):
            if found.split(".")[1] not in FILE_SUFFIXES:
                yield os.path.relpath(doc, ROOT), found


def test_every_module_the_docs_name_exists():
    names = list(named_modules())
    for top in ("temperd/", "bench/", "scripts/", "tests/"):  # the patterns find what the docs hold
        assert any(name.startswith(top) for _, name in names), top
    missing = [f"{doc}: {name}" for doc, name in names
               if not (os.path.exists(os.path.join(ROOT, name)) if "/" in name else dotted_exists(name))]
    assert missing == [], f"named in the docs, not in the tree: {missing}"


def test_the_module_check_sees_a_moved_module():
    assert dotted_exists("temperd.trace.parse") and dotted_exists("temperd.trace.parse.parse_trace")
    assert dotted_exists("temperd.builtin_profiles") and dotted_exists("temperctl.main")
    assert not dotted_exists("temperd.trace_parse.parse_trace") and not dotted_exists("temperd.trace.parse.nothing_here")
    assert MODULE_PATH.findall("see temperd/plan.py, not /usr/share/temperd/x.py") == ["temperd/plan.py"]
    assert DOTTED_NAME.findall("`temperd.trace_parse.parse_trace(FILE)`") == ["temperd.trace_parse.parse_trace"]
    text = ("run `bench/isolation.py`, `bash scripts/test.sh` (not /usr/share/temperd/x.py, bench/NAME.py or "
            "bench/results/isolation-$s-open.json), see tests/fixtures/sysfs/ and scripts/gone.sh.")
    assert tree_paths(text) == ["bench/isolation.py", "scripts/test.sh", "tests/fixtures/sysfs/", "scripts/gone.sh"]
    assert os.path.exists(os.path.join(ROOT, "tests/fixtures/sysfs/")) and not os.path.exists(os.path.join(ROOT, "scripts/gone.sh"))


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
