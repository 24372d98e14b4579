"""Reading the configuration: the host view (temperd.toml, profiles, machine shape) with the
command line's overrides, and what an attempt to (re)load it found."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from temperd.config.daemon_config import DaemonConfig
from temperd.config.errors import ConfigError
from temperd.decide.hostview import HostView, load_host_view
from temperd.sources.shape import ShapeError


class ViewLoader:
    """The host view from the configuration directory, with the command line's overrides
    (state_dir, http_port, control_socket; None: as the file says)."""

    def __init__(self, config_dir: str, sysfs_root: str, overrides: Dict[str, Optional[object]]):
        self.config_dir = config_dir
        self.sysfs_root = sysfs_root
        self.overrides = {k: v for k, v in overrides.items() if v is not None}

    def load(self) -> HostView:
        """Raises ConfigError (temperd.toml unusable) or ShapeError (sysfs unreadable)."""
        view = load_host_view(self.config_dir, self.sysfs_root)
        if self.overrides:
            view = dataclasses.replace(view, config=dataclasses.replace(view.config, **self.overrides))
        return view

    def attempt(self) -> Tuple[Optional[HostView], List[str]]:
        """A fresh view and every problem found, as text. A view with problems (a profile that
        did not load) is whole but must not be adopted; None when nothing could be read."""
        try:
            view = self.load()
        except ConfigError as exc:
            return None, [str(p) for p in exc.problems]
        except ShapeError as exc:
            return None, [f"machine shape: {exc}"]
        return view, [str(p) for p in view.problems]


def summary_of(view: HostView) -> str:
    return f"{len(view.profiles.active)} profiles, {len(view.config.bindings)} bindings"


# Settings a running temperd holds from its start: the state directory (its lock and restore
# records), the control socket, and the backend with scx_layered's settings. A reload that
# changes one is refused rather than reported as done while the old value stays in force.
RESTART_ONLY = (("state_dir", "state_dir"), ("control_socket", "[control] socket"),
                ("control_group", "[control] group"), ("backend", "backend"), ("scx", "[scx]"))


def restart_only_changes(running: DaemonConfig, new: DaemonConfig) -> List[str]:
    """A problem for each setting that only a restart can change and that the new file changes."""
    problems = []
    for field, key in RESTART_ONLY:
        before, after = getattr(running, field), getattr(new, field)
        if before != after:
            change = "" if field == "scx" else f" from {before!r} to {after!r}"
            problems.append(f"{new.source}: {key} changed{change}: temperd takes it only when it starts; "
                            f"restart it (systemctl restart temperd) or put the old value back")
    return problems
