"""What a backend says about itself, typed: `temperctl status`, /observe and /metrics read this one
object (the daemon asks for it once per observation sample)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from temperd.control.status import LayerScxView, ScxView

NATIVE = "native"
SCX = "scx"


@dataclass(frozen=True)
class BackendStatus:
    carried_by: str  # who carries the plan now: "native", or "scx" while scx_layered does
    # Settings temperd made that someone else changed afterwards, by kind, since the backend
    # started (cumulative; temperd leaves them as found). The native backend keeps this count.
    drift: Mapping[str, int] = field(default_factory=dict)
    scx: Optional[ScxView] = None  # the scx backend's own state; None under the native backend
    scx_layers: Mapping[str, LayerScxView] = field(default_factory=dict)  # what scx_layered reports of each layer
