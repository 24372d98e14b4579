"""scx_layered's stats socket: the client and the reply, typed after its stats.rs.

scx_layered serves `SysStats` (host-wide, with a `LayerStats` per layer) over the scx_stats
protocol: one JSON request per line, one JSON reply per line, on a Unix socket
(/var/run/scx/root/stats). The values are deltas since the previous request on the same
connection, so one connection is kept open. Fields are added from release to release: unknown
ones are ignored, missing ones left unset (None), never an error.

Each field is declared once, with the unit and meaning its stats.rs gives it. That declaration
parses the reply and lists the numbers behind `/metrics`, and `describe()` turns it into the text
`temperctl status` shows.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional

from temperd.control.status import LayerScxView, ScxStatsView
from temperd.sources.shape import format_cpulist

STATS_REQUEST = {"req": "stats", "args": {"target": "top"}}


def _stat(desc: str) -> Any:
    return field(default=None, metadata={"desc": desc})


@dataclass(frozen=True)
class LayerStats:
    """One layer's part of a stats reply (stats.rs LayerStats; the fields temperd reads)."""

    util: Optional[float] = _stat("CPU use, % of one CPU (100 = one full CPU)")
    util_frac: Optional[float] = _stat("share of all CPU use, %")
    util_open_frac: Optional[float] = _stat("% of its use on CPUs no layer owns")
    util_protected_frac: Optional[float] = _stat("% of its use on protected CPUs")
    tasks: Optional[int] = _stat("tasks in the layer")
    cur_nr_cpus: Optional[int] = _stat("CPUs it holds now")
    min_nr_cpus: Optional[int] = _stat("fewest CPUs it may hold")
    max_nr_cpus: Optional[int] = _stat("most CPUs it may hold")
    slice_us: Optional[int] = _stat("its slice, us")
    preempt: Optional[float] = _stat("% of its enqueues that preempted another layer's task")
    preempt_fail: Optional[float] = _stat("% of its enqueues that tried to preempt and could not")
    affn_viol: Optional[float] = _stat("% of its enqueues that ran outside its CPUs (affinity)")
    migration: Optional[float] = _stat("% of its runs on another CPU than the last")
    cpus: Optional[FrozenSet[int]] = _stat("the CPUs it holds now (its mask); None: not reported")

    @classmethod
    def from_json(cls, data: Any) -> "LayerStats":
        data = data if isinstance(data, Mapping) else {}
        return cls(**_read_numbers(cls, data, "cpus"), cpus=_mask(data.get("cpus")))


@dataclass(frozen=True)
class SysStats:
    """A whole stats reply (stats.rs SysStats; the fields temperd reads)."""

    at: Optional[float] = _stat("seconds since scx_layered started")
    busy: Optional[float] = _stat("% of all CPUs busy")
    util: Optional[float] = _stat("CPU use, % of one CPU")
    total: Optional[int] = _stat("scheduling events in the interval")
    local_sel: Optional[float] = _stat("% of events placed on an idle CPU at wakeup")
    local_enq: Optional[float] = _stat("% of events put on a CPU's local queue")
    open_idle: Optional[float] = _stat("% of events on an idle CPU no layer owns")
    affn_viol: Optional[float] = _stat("% of events that broke a layer's CPUs for affinity")
    hi_fb: Optional[float] = _stat("% of events through the high fallback queue")
    lo_fb: Optional[float] = _stat("% of events through the low fallback queue")
    hi_fb_util: Optional[float] = _stat("CPU use from the high fallback queue, % of one CPU")
    lo_fb_util: Optional[float] = _stat("CPU use from the low fallback queue (yield layers among it), % of one CPU")
    proc_ms: Optional[int] = _stat("scx_layered's own CPU time in the interval, ms")
    antistall: Optional[int] = _stat("tasks the anti-stall timer had to run")
    system_cpu_util_ewma: Optional[float] = _stat("host CPU use, moving average")
    layers: Mapping[str, LayerStats] = field(default_factory=dict, metadata={"desc": "per layer, by name"})

    @classmethod
    def from_json(cls, data: Any) -> "SysStats":
        data = data if isinstance(data, Mapping) else {}
        layers = data.get("layers")
        parsed = {str(k): LayerStats.from_json(v) for k, v in sorted(layers.items())} if isinstance(layers, Mapping) else {}
        return cls(**_read_numbers(cls, data, "layers"), layers=parsed)


def stats_view(stats: Optional[SysStats]) -> ScxStatsView:
    """The numeric fields by scx_layered's own names, present where it reported them, host-wide
    and per layer with the CPUs it holds (for JSON and /metrics)."""
    if stats is None:
        return ScxStatsView({}, {})
    return ScxStatsView(_numbers(stats), {name: {**_numbers(layer), "cpus": sorted(layer.cpus or ())}
                                          for name, layer in stats.layers.items()})


def scx_layer_views(stats: Optional[SysStats]) -> Dict[str, LayerScxView]:
    """Each layer's stats as shown beside the plan (`temperctl status`, /observe)."""
    layers = stats.layers if stats is not None else {}
    return {name: LayerScxView(layer.util, layer.tasks, layer.cur_nr_cpus, sorted(layer.cpus or ()), describe(layer))
            for name, layer in layers.items()}


def layer_cpus(stats: Optional[SysStats]) -> Dict[str, FrozenSet[int]]:
    """Layer name -> the CPUs it holds now; layers that reported no mask are left out."""
    layers = stats.layers if stats is not None else {}
    return {name: layer.cpus for name, layer in layers.items() if layer.cpus is not None}


def describe(layer: Optional[LayerStats]) -> str:
    """One layer's stats as `temperctl status` shows them beside the plan: `42% of a CPU on 2-3`, or
    `180% of a CPU, no CPUs of its own` for a layer that runs where others leave room."""
    if layer is None or layer.util is None:
        return "-"
    if layer.cpus:
        return f"{layer.util:.0f}% of a CPU on {format_cpulist(layer.cpus)}"
    return f"{layer.util:.0f}% of a CPU" + (", no CPUs of its own" if layer.cur_nr_cpus == 0 else "")


def _number(value: Any) -> Optional[float]:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _read_numbers(cls: type, data: Mapping, other: str) -> Dict[str, Optional[float]]:
    """A reply's numeric fields, each None where missing or not a number; `other` is read apart."""
    return {f.name: _number(data.get(f.name)) for f in fields(cls) if f.name != other}


def _numbers(stats: Any) -> Dict[str, float]:
    """The numeric fields it reported, by scx_layered's own names (for /metrics and JSON)."""
    return {f.name: getattr(stats, f.name) for f in fields(stats) if _number(getattr(stats, f.name)) is not None}


def _mask(words: Any) -> Optional[FrozenSet[int]]:
    """A CPU mask as 64-bit words, word 0 = CPUs 0..63; anything else: None (placement unknown)."""
    if not isinstance(words, list) or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in words):
        return None
    return frozenset(64 * i + bit for i, word in enumerate(words) for bit in range(64) if word >> bit & 1)


class StatsError(RuntimeError):
    pass


class StatsClient:
    """One connection to an scx_stats socket; requests are one JSON line each way."""

    def __init__(self, path: str, timeout: float = 2.0):
        self.path = path
        self.timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._reader = None

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self._sock, self._reader = sock, sock.makefile("rb")

    def request(self, request: Mapping[str, Any]) -> Any:
        if self._sock is None:
            self.connect()
        assert self._sock is not None and self._reader is not None
        self._sock.sendall((json.dumps(request) + "\n").encode())
        line = self._reader.readline()
        if not line:
            raise StatsError("the stats socket closed the connection")
        reply = json.loads(line)
        if not isinstance(reply, dict) or "errno" not in reply:
            raise StatsError(f"unexpected stats reply: {line[:200]!r}")
        resp = (reply.get("args") or {}).get("resp")
        if reply["errno"]:
            raise StatsError(f"stats request failed: {os.strerror(reply['errno'])}: {resp}")
        return resp

    def stats(self) -> SysStats:
        """One `top` stats reply (deltas since this connection's previous one)."""
        resp = self.request(STATS_REQUEST)
        if not isinstance(resp, Mapping):
            raise StatsError(f"unexpected stats reply: {str(resp)[:200]!r}")
        return SysStats.from_json(resp)

    def close(self) -> None:
        for thing in (self._reader, self._sock):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self._sock = self._reader = None


class StatsReader:
    """The stats socket as the supervisor uses it: connecting tells that scx_layered attached,
    then a read every interval_s on that one connection. Written by the supervisor's thread only;
    others read `latest` (an immutable SysStats), `error` and the counts."""

    def __init__(self, path: str, timeout_s: float, interval_s: float, clock: Callable[[], float]):
        self.interval_s = interval_s
        self.clock = clock
        self.latest: Optional[SysStats] = None
        self.error: Optional[str] = None
        self.reads = 0
        self.errors = 0
        self._client = StatsClient(path, timeout_s)
        self._next_at = 0.0
        self._wall: Optional[float] = None

    def attach(self) -> bool:
        """A fresh connection; False while the socket does not answer."""
        self._client.close()
        try:
            self._client.connect()
        except OSError:
            return False
        self._next_at = self.clock()
        return True

    def poll(self) -> None:
        """Read the stats when the interval has passed."""
        if self.clock() < self._next_at:
            return
        self._next_at = self.clock() + self.interval_s
        try:
            self.latest = self._client.stats()
        except (OSError, ValueError, StatsError) as exc:
            self._client.close()  # reconnect on the next read
            self.errors += 1
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self._wall = time.time()
        self.error = None
        self.reads += 1

    def detach(self) -> None:
        """scx_layered is gone: its stats with it."""
        self._client.close()
        self.latest = None

    def report(self) -> Dict[str, Any]:
        """Its part of the supervisor's status: SupervisorView's stats_* fields."""
        age_s = round(time.time() - self._wall, 3) if self._wall else None
        return {"stats_age_s": age_s, "stats_error": self.error, "stats_reads": self.reads, "stats_errors": self.errors}
