"""The temperd process.

- main: the `temperd` command (foreground; systemd runs it the same way)
- daemon: Daemon, the running state and every change to it (start, replan, reload, observe, stop)
- state: DaemonState, what the command modules and the status report read of the Daemon
- main_loop: the poll() loop (and LoopHost, what it drives) and the requests other threads and
  signal handlers make of it
- reload: the host view with the command line's overrides, and what a reload refuses
- services: the threads that serve and watch (control socket, HTTP, config and hotplug watchers)
- control: the control socket's server (the protocol and temperctl's client: temperd/control)
- control_commands: the commands served on it (status, reload, plan, explain) and the table of
  the others: bind_commands (bind, unbind, bindings), trace_commands (trace: a capture into
  temperd's own directory), training_commands (train), learner_commands (classify, rightsize)
- status_report: the typed Status (temperd/control/status) built from the running state, the
  one-line status, /observe
- notify: sd_notify
- instance_lock: one temperd per state directory
"""
