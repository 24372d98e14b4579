"""The control-socket command `train`: temperd observes a workload for `temperctl train` (the
host's one trace capture, filtered to the workload, and per-thread /proc samples) and replies
with the observation; temperctl analyzes it and writes the profile.

The trace goes where `trace` puts its files (TRACE_DIR, readable by group temper); temperd never
writes to a path a client names.
"""

from __future__ import annotations

from typing import Any, Dict

from temperd.control.protocol import ControlError, Progress
from temperd.daemon.trace_commands import capture_request, relayed, shared_output
from temperd.trace.capture import TraceError
from temperd.training.observation import observe

DEFAULT_TRAIN_DURATION_S = 20.0


def train_handler(request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
    """{"cmd": "train", "pid"|"unit": ..., "duration": "20s", "max_size": "64M", "requester": "..."}
    -> {"observation": Observation as a dict}; progress notes while it observes."""
    wanted = capture_request(request, "trace-train", DEFAULT_TRAIN_DURATION_S)
    if (wanted.pid is None) == (wanted.unit is None):
        raise ControlError("train: expected exactly one of pid and unit")
    try:
        observation = observe(wanted, progress=relayed(progress, "training"))
    except TraceError as exc:
        raise ControlError(str(exc)) from None
    shared_output(observation.trace["output"])
    return {"observation": observation.as_dict()}
