#!/usr/bin/env python3
"""Write the defaults block of temperd(8) and temper-profile(5) from the settings' specs: run it
after changing a default (tests/test_defaults_once.py fails until the pages say what the specs do)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temperd.config.daemon_config import CONFIG_SPEC  # noqa: E402
from temperd.config.defaults import in_man_page  # noqa: E402
from temperd.config.profile import PROFILE_SPEC  # noqa: E402

if __name__ == "__main__":
    for name, spec in (("temperd.8", CONFIG_SPEC), ("temper-profile.5", PROFILE_SPEC)):
        page = ROOT / "docs" / "man" / name
        text = page.read_text(encoding="utf-8")
        if in_man_page(text, spec) != text:
            page.write_text(in_man_page(text, spec), encoding="utf-8")
            print(f"wrote {page.relative_to(ROOT)}")
