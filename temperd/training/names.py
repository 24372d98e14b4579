"""Thread names as training groups them: one name per role, whatever number a thread of that role
carries.

The kernel keeps 15 bytes of a thread's name (TASK_COMM_LEN), so Java's `order-handler-17` is
`order-handler-1` in the kernel and `http-nio-8080-exec-3` is `http-nio-8080-e`. A name key drops
the trailing number with its separator's digits (`io_thd_1`, `GC Thread#0`, `ib_io_rd-2`,
`order-handler-1` -> `io_thd_*`, `GC Thread#*`, `ib_io_rd-*`, `order-handler-*`) and a name of
the full 15 bytes, cut by the kernel, gets a `*` in place of what was cut. The key is a glob that
temper-profile(5) `thread_names` accepts; a control character of a name (ESC, \\r, \\n, ...) is a
`?` in it, so the glob matches the real name and writes no control character into the profile.
"""

from __future__ import annotations

import re

from temperd.text import CONTROL

TASK_COMM_BYTES = 15
_TRAILING_NUMBER = re.compile(r"\d+$")
_GLOB_CHARS = re.compile(r"[\[\]*?\\]")


def name_key(comm: str) -> str:
    """The normalised name of a thread: a thread_names glob that all threads of its role match."""
    truncated = len(comm.encode("utf-8", "replace")) >= TASK_COMM_BYTES
    base = CONTROL.sub("?", _GLOB_CHARS.sub("?", comm))
    stripped = _TRAILING_NUMBER.sub("", base)
    if stripped != base and stripped:
        return stripped + "*"
    return base + "*" if truncated and base else base or "?"
