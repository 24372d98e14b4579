"""The benchmark tables README.md and docs/benchmarks.md carry, generated from the bench's JSON: each
sits between a marker that names the command making it and an end marker,

    <!-- generated: bench/isolation.py --markdown bench/results/FILE.json [--summary] -->
    ...the command's output...
    <!-- end generated -->

`bench/isolation.py --update-docs` writes every block again from its JSON; tests/test_bench_docs.py
fails where a block and its JSON differ. JSON paths are relative to the checkout.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Callable, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", os.path.join("docs", "benchmarks.md"))
BLOCK = re.compile(r"<!-- generated: (bench/isolation\.py [^\n]*?) -->\n(.*?)<!-- end generated -->", re.S)


def blocks(text: str) -> List[Tuple[str, str]]:
    """(command, the text between the markers) of every generated block."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def render(command: str, markdown: Callable[[List[str]], str]) -> str:
    """The block's text for its command: `markdown` turns the command's arguments (JSON paths made
    absolute) into its Markdown."""
    argv = shlex.split(command)[1:]
    for i, word in enumerate(argv[:-1]):
        if word == "--markdown":
            argv[i + 1] = ",".join(os.path.join(ROOT, p) for p in argv[i + 1].split(","))
    return markdown(argv).rstrip("\n") + "\n"


def refresh(text: str, markdown: Callable[[List[str]], str]) -> str:
    """The text with every generated block written again."""
    return BLOCK.sub(lambda m: f"<!-- generated: {m.group(1)} -->\n{render(m.group(1), markdown)}<!-- end generated -->",
                     text)


def update(markdown: Callable[[List[str]], str]) -> List[str]:
    """Writes the blocks of README.md and docs/benchmarks.md again; returns the files changed."""
    changed = []
    for name in DOCS:
        path = os.path.join(ROOT, name)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        fresh = refresh(text, markdown)
        if fresh != text:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(fresh)
            changed.append(name)
    return changed
