"""Observe a workload for training: one bounded scheduling trace of its threads (the host's one
trace capture, filtered to the workload) while its threads' /proc counters are sampled every
second. temperd runs this for `temperctl train` over its control socket; temperctl runs it
itself, as root, where no temperd runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional

from temperd.control.protocol import Progress
from temperd.control.typed_json import from_json, to_json
from temperd.trace.capture import CaptureRequest, TraceError, capture
from temperd.training.samples import Sampler, Samples


@dataclass
class Observation:
    trace: Dict[str, Any]  # the capture's result (CaptureResult.as_dict(): output path, events ...)
    samples: Samples

    def as_dict(self) -> Dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Observation":
        """From as_dict() output that came through JSON."""
        return from_json(cls, data)


def observe(request: CaptureRequest, progress: Optional[Progress] = None,
            cancel: Optional[threading.Event] = None) -> Observation:
    """Trace and sample the workload of request.pid / request.unit for request.duration_s.
    Raises TraceError (one line) when it cannot: no such workload, a capture already running,
    no tracefs, not root."""
    if request.pid is None and not request.unit:  # capture() would trace the whole host
        raise TraceError("training needs a workload: a pid or a unit")
    sampler = Sampler(request.pid, request.unit)

    def note(values: Dict[str, Any]) -> None:
        if progress is not None:
            progress(dict(values, stage="observing", threads=len(sampler.samples.threads)))

    sampler.start()
    try:
        result = capture(request, progress=note, cancel=cancel)
    finally:
        samples = sampler.stop()
    return Observation(result.as_dict(), samples)
