"""Run the real scx_layered on a config: does it accept it?

The binary is a test dependency (the product finds scx_layered where the distribution put it):
$TEMPERD_SCX_LAYERED, else ../shared/scx/scx_layered next to the repository. Its directory's
SHA256SUMS must list it with the right checksum.

It is built against glibc >= 2.38 (Debian trixie). On an older host (bookworm: CI and the
developers' machines) it runs through trixie's own dynamic loader and libraries, taken from
$TEMPERD_SCX_GLIBC: a directory made by tests/e2e/trixie-glibc.sh (`mmdebstrap --variant=extract`
of libc6 and libgcc-s1, about 14 MB in 3 s, no root needed to use it). It then runs on the host's
kernel:

- `--print-and-exit` parses the JSON (types, kinds, match names; unknown keys pass) and exits 0;
- a normal start also runs the layer rule checks (terminal layer, match limits, ranges, hints)
  and, on a kernel without sched_ext, stops with `sched_ext_ops.dump() missing, kernel too old?`:
  reaching that error means "config accepted". Checks scx_layered makes only after that point
  (node / LLC IDs, cpus_range_frac beside cpus_range) are not covered here; the VM test starts
  the scheduler for real.

On a host whose kernel has sched_ext a normal start would load the scheduler on that host, so it
is not done there (normal_start_skip_reason says so).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_TOO_OLD = "sched_ext_ops.dump() missing, kernel too old?"
LOADER = "ld-linux-x86-64.so.2"
MIN_GLIBC = (2, 38)


@dataclass(frozen=True)
class Outcome:
    accepted: bool
    code: int
    message: str  # the lines that say why (an Error: line, a panic), or the last output lines


def binary_path() -> str:
    return os.environ.get("TEMPERD_SCX_LAYERED") or os.path.join(os.path.dirname(REPO), "shared", "scx",
                                                                     "scx_layered")


def verify_checksum(path: str) -> Optional[str]:
    """None when SHA256SUMS beside the binary lists it with this content; else what is wrong."""
    sums = os.path.join(os.path.dirname(path), "SHA256SUMS")
    try:
        with open(sums) as handle:
            listed = {line.split()[1].lstrip("*"): line.split()[0] for line in handle if len(line.split()) == 2}
    except OSError as exc:
        return f"cannot read {sums}: {exc.strerror}"
    name = os.path.basename(path)
    if name not in listed:
        return f"{sums} does not list {name}"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != listed[name]:
        return f"{path}: sha256 {digest.hexdigest()} is not the {listed[name]} that {sums} lists"
    return None


def host_glibc() -> Tuple[int, ...]:
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return ()
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


def glibc_dir() -> Optional[str]:
    """The trixie library directory (holding ld-linux-x86-64.so.2) from $TEMPERD_SCX_GLIBC."""
    root = os.environ.get("TEMPERD_SCX_GLIBC")
    if not root:
        return None
    for candidate in (root, os.path.join(root, "usr", "lib", "x86_64-linux-gnu")):
        if os.path.isfile(os.path.join(candidate, LOADER)):
            return candidate
    return None


def command_prefix() -> Tuple[Optional[List[str]], str]:
    """(argv prefix that runs scx_layered, "") or (None, why it cannot run here)."""
    path = binary_path()
    if not os.path.isfile(path):
        return None, (f"no scx_layered at {path} (set TEMPERD_SCX_LAYERED, or put the real binary in "
                      "../shared/scx/ beside the repository)")
    problem = verify_checksum(path)
    if problem:
        return None, problem
    if platform.machine() != "x86_64":
        return None, f"scx_layered there is an x86_64 binary; this host is {platform.machine()}"
    if host_glibc() >= MIN_GLIBC:
        return [path], ""
    libs = glibc_dir()
    if libs is None:
        have = ".".join(map(str, host_glibc())) or "unknown"
        return None, (f"scx_layered needs glibc >= 2.38, this host has {have}, and TEMPERD_SCX_GLIBC names no "
                      "trixie glibc (make one: bash tests/e2e/trixie-glibc.sh DIR)")
    return [os.path.join(libs, LOADER), "--library-path", libs, path], ""


def normal_start_skip_reason(sysfs_root: str = "/sys") -> Optional[str]:
    if os.path.isdir(os.path.join(sysfs_root, "kernel", "sched_ext")):
        return ("this host's kernel has sched_ext: a normal start would load scx_layered on it for real "
                "(the VM test does that in its guest)")
    return None


def _run(argv: List[str], timeout: float) -> Tuple[int, str]:
    env = {"PATH": "/usr/bin:/bin", "RUST_BACKTRACE": "0", "NO_COLOR": "1", "RUST_LOG": "warn"}
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env, timeout=timeout)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def _why(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    picked = [line for line in lines if line.startswith(("Error:", "Caused by", "EXIT:")) or "panicked" in line]
    return " | ".join((picked or lines[-3:])[:6])[:600]


def print_and_exit(prefix: List[str], config_path: str, timeout: float = 30, options: Sequence[str] = ()) -> Outcome:
    """`scx_layered [OPTIONS] --print-and-exit f:FILE`: accepted when it exits 0 and prints the specs."""
    code, out = _run([*prefix, *options, "--print-and-exit", f"f:{config_path}"], timeout)
    accepted = code == 0 and "specs=" in out
    return Outcome(accepted, code, "parsed" if accepted else _why(out))


def normal_start(prefix: List[str], config_path: str, timeout: float = 30, options: Sequence[str] = ()) -> Outcome:
    """`scx_layered [OPTIONS] f:FILE` on a kernel without sched_ext: accepted when it gets as far as the kernel check."""
    code, out = _run([*prefix, *options, f"f:{config_path}"], timeout)
    accepted = KERNEL_TOO_OLD in out
    return Outcome(accepted, code, "rule checks passed (stopped at: kernel too old)" if accepted else _why(out))
