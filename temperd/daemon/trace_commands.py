"""The control-socket command `trace`: temperd captures a bounded trace for temperctl.

temperd writes the trace into its own directory (TRACE_DIR, root:temper 0750, files 0640) and
replies with the path; temperctl copies it to where the user asked. temperd never writes to a
path a client names, since members of group temper may ask but are not root. Only the newest
KEEP_TRACES files are kept there.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Optional, Tuple

from temperd import paths
from temperd.trace import capture as trace_capture
from temperd.control.protocol import ControlError, Progress, shown, task_id
from temperd.daemon.control import group_id, requester
from temperd.trace.capture import CaptureRequest, TraceError, capture, parse_duration, parse_size

TRACE_DIR = paths.TRACE_DIR
KEEP_TRACES = 3
GROUP = "temper"

log = logging.getLogger("temperd.trace")


def pid_and_unit(request: Dict[str, Any]) -> Tuple[Optional[int], Optional[str]]:
    """The request's pid and unit filters, each None where not given (or given as "")."""
    pid, unit = (None if request.get(key) == "" else request.get(key) for key in ("pid", "unit"))
    pid = None if pid is None else task_id(pid, "pid")
    if unit is not None and (not isinstance(unit, str) or len(unit) > 256 or "\0" in unit):
        raise ControlError(f"unit: expected a systemd unit name, found {shown(unit)}")
    return pid, unit


def _limit(parse, value: Any, what: str) -> Any:
    """A duration or size through the capture's own parser; a value it cannot take at all
    (a list, a number too large for a float) is refused the same way."""
    refusal = f"{what}: expected e.g. {'10s' if what == 'duration' else '64M'}, found {shown(value)}"
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or len(str(value)) > 64:
        raise ControlError(refusal)
    try:
        return parse(value)
    except TraceError as exc:
        raise ControlError(str(exc)) from None
    except (ValueError, OverflowError):
        raise ControlError(refusal) from None


def _prune(directory: str, keep: int) -> None:
    """Delete the oldest traces so at most `keep` remain (before a new one is added)."""
    entries = []
    for name in os.listdir(directory):
        if name.startswith("trace-"):
            path = os.path.join(directory, name)
            try:
                entries.append((os.stat(path).st_mtime, path))
            except OSError:
                continue
    for _, path in sorted(entries)[: max(0, len(entries) - keep)]:
        try:
            os.unlink(path)
        except OSError:
            pass


def _share(path: str, mode: int) -> None:
    """Readable by group temper (temperctl of a non-root member copies the file). Under the
    systemd unit temperd already runs with group temper (and UMask=0077, hence the chmod) and
    has no CAP_CHOWN, so the group is only changed where it differs."""
    gid = group_id(GROUP)
    if gid is not None and os.stat(path).st_gid != gid:
        try:
            os.chown(path, -1, gid)
        except OSError as exc:
            log.warning("cannot give %s to group %s: %s", path, GROUP, exc.strerror)
    os.chmod(path, mode)


def capture_request(request: Dict[str, Any], prefix: str, default_duration_s: float) -> CaptureRequest:
    """The capture a request asks for, written to a new file in TRACE_DIR (the oldest pruned)."""
    duration = _limit(parse_duration, request.get("duration", default_duration_s), "duration")
    max_bytes = _limit(parse_size, request.get("max_size", trace_capture.DEFAULT_MAX_BYTES), "max size")
    pid, unit = pid_and_unit(request)
    directory = TRACE_DIR
    os.makedirs(directory, mode=0o750, exist_ok=True)
    _share(directory, 0o750)
    _prune(directory, KEEP_TRACES - 1)
    name = time.strftime(f"{prefix}-%Y%m%d-%H%M%S") + f"-{time.monotonic_ns() % 1_000_000:06d}.txt"
    if request.get("gzip"):
        name += ".gz"
    return CaptureRequest(output=os.path.join(directory, name), duration_s=duration, max_bytes=max_bytes, pid=pid,
                          unit=unit, requester=requester(request))


def relayed(progress: Progress, what: str) -> Progress:
    """progress, ending the work with a ControlError when temperctl has gone away."""
    def relay(note: Dict[str, Any]) -> None:
        try:
            progress(note)
        except OSError:
            raise ControlError(f"temperctl went away; {what} stopped") from None
    return relay


def shared_output(path: str) -> None:
    """A finished trace, readable by group temper."""
    _share(path, 0o640)


def trace_handler(request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
    """{"cmd": "trace", "duration": "10s", "max_size": "64M", "pid"|"unit": ..., "gzip": bool,
    "requester": "..."} -> {"trace": CaptureResult as a dict}; progress notes while it runs."""
    wanted = capture_request(request, "trace", trace_capture.DEFAULT_DURATION_S)
    try:
        result = capture(wanted, progress=relayed(progress, "capture"))
    except TraceError as exc:
        raise ControlError(str(exc)) from None
    shared_output(result.output)
    return {"trace": result.as_dict()}
