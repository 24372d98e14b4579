"""The commands temperd serves on its control socket (control.py), one handler each:
status, reload, plan, explain, trace (trace_commands.py), train (training_commands.py), bind, unbind and
bindings (bind_commands.py), classify and rightsize (learner_commands.py). Each runs on the socket's thread
for that client and holds the daemon's lock while it reads or changes its state."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict

from temperd.control.protocol import ControlError, Handler, Progress, task_id
from temperd.decide.explain import NoSuchTask, explain
from temperd.daemon.bind_commands import BindCommands
from temperd.daemon.trace_commands import trace_handler
from temperd.daemon.training_commands import train_handler
from temperd.daemon.learner_commands import LearnerCommands

if TYPE_CHECKING:
    from temperd.daemon.state import DaemonState

Request = Dict[str, Any]
Reply = Dict[str, Any]


class ControlCommands:
    def __init__(self, daemon: "DaemonState"):
        self.daemon = daemon

    def handlers(self) -> Dict[str, Handler]:
        watch = LearnerCommands(self.daemon)
        binds = BindCommands(self.daemon)
        return {"bind": binds.bind, "unbind": binds.unbind, "bindings": binds.bindings,
                "status": self.status, "reload": self.reload, "plan": self.plan, "explain": self.explain,
                "trace": trace_handler, "train": train_handler, "classify": watch.classify, "rightsize": watch.rightsize}

    def status(self, request: Request, progress: Progress) -> Reply:
        """{"status": the typed Status (control/status.py) as JSON}."""
        status = self.daemon.status()
        if status is None:
            raise ControlError("temperd is starting; ask again")
        return {"status": status.to_json()}

    def reload(self, request: Request, progress: Progress) -> Reply:
        """Reload now, on this thread: {"reload": the ReloadView}."""
        with self.daemon.lock:
            return {"reload": dataclasses.asdict(self.daemon.reload("temperctl reload"))}

    def plan(self, request: Request, progress: Progress) -> Reply:
        """The plan in force: {"machine_shape", "workloads", "plan"}."""
        daemon = self.daemon
        with daemon.lock:
            assert daemon.view is not None
            return {"machine_shape": daemon.view.shape.describe(),
                    "workloads": [dataclasses.asdict(w) for w in daemon.match.workloads],
                    "plan": dataclasses.asdict(daemon.plan) if daemon.plan else None}

    def explain(self, request: Request, progress: Progress) -> Reply:
        """{"cmd": "explain", "id": PID or TID} -> {"explain": explain.explain()'s answer}."""
        task = task_id(request.get("id"))
        daemon = self.daemon
        with daemon.lock:
            try:
                return {"explain": explain(task, daemon.inventory, daemon.match, daemon.plan, daemon.matcher)}
            except NoSuchTask as exc:
                raise ControlError(str(exc)) from None
