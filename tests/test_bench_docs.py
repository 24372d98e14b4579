"""The benchmark tables in README.md and docs/benchmarks.md are generated from the JSON the bench
wrote (bench/docblocks.py): each table is what its marker's command makes of its JSON today, so a
table edited by hand, a JSON changed without the docs, or a report change that alters the tables
fails here (`bench/isolation.py --update-docs` writes them again)."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import docblocks  # noqa: E402
import isolation  # noqa: E402


def render(argv):
    return isolation.markdown(isolation.parse_args(argv))


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("name", docblocks.DOCS)
def test_every_generated_table_is_what_its_json_makes(name):
    found = docblocks.blocks(read(name))
    assert found, f"{name} has no generated benchmark table"
    for command, text in found:
        assert text == docblocks.render(command, render), f"{name}: the block of `{command}` differs from its JSON"


def test_readmes_results_section_is_one_generated_table_in_ten_lines():
    text = read("README.md")
    section = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    shown = [line for line in section.strip().splitlines() if not line.startswith("<!--")]
    assert len(shown) <= 10 and sum(line.startswith("|---") for line in shown) == 1
    assert "--summary" in docblocks.blocks(section)[0][0]


def test_a_table_edited_by_hand_is_found():
    text = read("README.md")
    command, block = docblocks.blocks(text)[0]
    edited = text.replace(block, block.replace("|", "| ", 1), 1)
    assert docblocks.blocks(edited)[0][1] != docblocks.render(command, render)
    assert docblocks.refresh(edited, render) == text
