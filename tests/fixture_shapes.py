"""Machine shapes of other hosts, read from the sysfs fixture trees in tests/fixtures/sysfs/."""

from __future__ import annotations

import os
from typing import List

from temperd.sources.shape import MachineShape, read_shape

FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sysfs")


def fixture_names() -> List[str]:
    return sorted(name for name in os.listdir(FIXTURES_DIR) if os.path.isdir(os.path.join(FIXTURES_DIR, name)))


def fixture_root(name: str) -> str:
    root = os.path.join(FIXTURES_DIR, name)
    if not os.path.isdir(root):
        raise KeyError(f"no sysfs fixture {name!r}; have {', '.join(fixture_names())}")
    return root


def load_fixture_shape(name: str) -> MachineShape:
    """e.g. load_fixture_shape('gcp-c2-standard-8')."""
    return read_shape(fixture_root(name))
