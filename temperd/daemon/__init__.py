"""The temperd process.

- main: the `temperd` command (foreground; systemd runs it the same way)
- daemon: Daemon, the running state and every change to it (start, replan, reload, observe, stop)
- main_loop: the poll() loop and the requests other threads and signal handlers make of it
- reload: the host view with the command line's overrides, and ReloadResult
- services: the threads that serve and watch (control socket, HTTP, config and hotplug watchers)
- control: the control socket (server and temperctl's client)
- control_commands: the commands served on it (status, reload, plan, explain, trace)
- trace_commands: the trace command (a capture into temperd's own directory)
- status_report: `temperctl status`, the one-line status, /observe
- notify: sd_notify
- instance_lock: one temperd per state directory
"""
