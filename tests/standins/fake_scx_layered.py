#!/usr/bin/env python3
"""STAND-IN for scx_layered, for tests only: it schedules nothing.

The real scx_layered needs a kernel with sched_ext (CONFIG_SCHED_CLASS_EXT) and root. This
stand-in behaves like it as far as a supervisor can see (reference: scx_layered 1.1.x):

- command line `[OPTIONS] SPEC...`, SPEC inline JSON or `f:PATH` / `file:PATH`, layers of all
  SPECs concatenated; `--print-and-exit` prints `specs=<json>` and exits 0;
- startup errors exit 1 with `Error: ...` on stderr (not an array, 0 or > 16 layers, last layer
  not `[[]]`, a layer before it without matches, another scheduler loaded);
- once "attached" it logs `Layered Scheduler Attached` and serves the scx_stats protocol on a
  Unix socket: one JSON request per line, `{"req":"stats","args":{"target":"top"}}` answered
  with `{"errno":0,"args":{"resp":SysStats}}`, counters as deltas since the previous request
  on the same connection; `stats_meta`; unknown requests get errno 22 (EINVAL);
- SIGTERM, SIGINT and SIGHUP: prints `EXIT: unregistered from user space` on stderr, exit 0.
- log lines on stdout in the real one's format (tracing's: `<UTC time>  INFO ThreadId(01)
  scx_layered: <source file>:<line>: <message>`), colourless as the real one is under NO_COLOR
  (temperd's supervisor sets it: the real one writes ANSI colours even into a file).

What the real scx_layered 1.1.2 did in the VM test (Debian trixie guest, kernel 7.3.4, software
emulation, 4 vCPUs), where this stand-in differs:
- start-up: 12-15 s from exec to `Layered Scheduler Attached` (BPF load and verification), and
  the stats socket appears only then; the stand-in attaches at once unless FAKE_SCX_ATTACH_DELAY
  says otherwise (the supervisor allows 90 s);
- `systemctl stop temperd` signals every process of the unit: the real one got SIGTERM before
  temperd's own stop and exited 0 as above (the supervisor counts that as a stop from outside,
  not a crash); `kill -9` leaves no EXIT line ("killed by signal 9") and the kernel unloads it;
- LayerStats `tasks` counts the threads that have run since the attach (a thread sleeping on a
  condition is matched to its layer when it next wakes); the stand-in's counts are made up;
- a config error exits 1 with `Error: ...` (a panic, e.g. a wrong template type, exits 101); a
  bad flag exits 2.

Test controls (environment):
  FAKE_SCX_STATS_SOCKET  socket path (default /var/run/scx/root/stats, like the real one)
  FAKE_SCX_ATTACH_DELAY  seconds before attaching (default 0)
  FAKE_SCX_CRASH_AFTER   seconds after attaching to "crash": `EXIT: runnable task stall`, a
                         DEBUG DUMP on stderr and exit status FAKE_SCX_CRASH_CODE (default 1)
  FAKE_SCX_SYSFS         a fake sysfs root: refuses to start when its kernel/sched_ext/state is
                         not "disabled"; writes "enabled" and root/ops while attached
  FAKE_SCX_NR_CPUS       CPUs to hand out to Confined layers (from the highest down; default: this host's)
  FAKE_SCX_RECORD        a file to which the stand-in appends JSON lines: {"event": "attach", pid,
                         argv, specs} when it attaches, {"event": "stats-connect", pid} per
                         stats connection
"""

import json
import os
import signal
import socket
import sys
import threading
import time

DEFAULT_SOCKET = "/var/run/scx/root/stats"
OPS_NAME = "layered_1.1.2_stand-in"
VALUE_OPTIONS = {"-s", "--slice-us", "-i", "--interval", "--log-level", "--task-hint-map", "--antistall-sec",
                 "--run-id", "--stats", "--monitor", "-e", "--example", "--layer-refresh-ms-avgruntime"}
FLAG_OPTIONS = {"--allow-partial-core", "--enable-gpu-support", "--disable-antistall", "--run-example",
                "--print-and-exit", "-v", "-V", "--version", "--monitor-disable", "-t", "--disable-topology"}


def log_line(level, where, message):
    """One line as the real scx_layered logs it (tracing's format, no colours)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    print(f"{stamp}  {level} ThreadId(01) scx_layered: {where}: {message}", flush=True)


def fail(message, code=1):
    sys.stderr.write(f"Error: {message}\n")
    sys.stderr.flush()
    sys.exit(code)


def parse_args(argv):
    specs, flags = [], set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in VALUE_OPTIONS:
            i += 1 if "=" in arg else 2
            continue
        if name in FLAG_OPTIONS:
            flags.add(name)
        elif arg.startswith("-"):
            fail(f"unexpected argument '{arg}' found", 2)
        else:
            specs.append(arg)
        i += 1
    return specs, flags


def load_specs(args):
    layers = []
    for arg in args:
        try:
            if arg.startswith("f:") or arg.startswith("file:"):
                with open(arg.split(":", 1)[1]) as handle:
                    data = json.load(handle)
            else:
                data = json.loads(arg)
        except (OSError, ValueError) as exc:
            fail(f"{exc}")
        if not isinstance(data, list):
            fail("invalid type: map, expected a sequence")
        layers.extend(data)
    if not layers:
        fail("No layer spec")
    if len(layers) > 16:
        fail("Too many layer specs")
    for index, spec in enumerate(layers):
        matches = spec.get("matches")
        if index < len(layers) - 1 and not matches:
            fail(f"Non-terminal spec {spec.get('name')!r} has NULL matches")
        if index == len(layers) - 1 and matches != [[]]:
            fail(f"Terminal spec {spec.get('name')!r} must have an empty match")
    return layers


def cpu_mask_words(cpus):
    """LayerStats `cpus`: the layer's CPU mask as 64-bit words."""
    words = [0] * (max(cpus, default=0) // 64 + 1)
    for cpu in cpus:
        words[cpu // 64] |= 1 << (cpu % 64)
    return words


class FakeSysfs:
    def __init__(self, root):
        self.base = os.path.join(root, "kernel", "sched_ext") if root else None

    def state(self):
        if not self.base:
            return "disabled"
        try:
            with open(os.path.join(self.base, "state")) as handle:
                return handle.read().strip()
        except OSError:
            return "disabled"

    def set(self, state, ops):
        if not self.base:
            return
        os.makedirs(os.path.join(self.base, "root"), exist_ok=True)
        with open(os.path.join(self.base, "state"), "w") as handle:
            handle.write(state + "\n")
        ops_path = os.path.join(self.base, "root", "ops")
        if ops:
            with open(ops_path, "w") as handle:
                handle.write(ops + "\n")
        elif os.path.exists(ops_path):
            os.unlink(ops_path)


def record(event, **fields):
    path = os.environ.get("FAKE_SCX_RECORD")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(dict(event=event, pid=os.getpid(), **fields)) + "\n")


class StatsServer:
    def __init__(self, path, layers):
        self.path = path
        self.layers = layers
        self.started = time.monotonic()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)  # a stale socket of an earlier run
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        threading.Thread(target=self.accept, daemon=True).start()

    def close(self):
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.sock.close()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            record("stats-connect")
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def cumulative(self):
        return int((time.monotonic() - self.started) * 1000)  # "scheduling events" since attach

    def top(self, last):
        now = self.cumulative()
        delta = now - last[0]
        last[0] = now
        layers = {}
        free_top = int(os.environ.get("FAKE_SCX_NR_CPUS") or os.cpu_count() or 1)  # Confined layers: CPUs from the top
        for index, spec in enumerate(self.layers):
            (kind, body), = spec.get("kind", {"Open": {}}).items()
            cpus = (body.get("cpus_range") or [0, 0]) if kind != "Open" else [0, 0]
            owned = range(max(0, free_top - cpus[1]), free_top) if kind == "Confined" else range(0)
            free_top = owned.start if kind == "Confined" else free_top
            layers[spec["name"]] = {
                "index": index, "util": 12.5 * (index + 1), "util_frac": 0.1, "util_open_frac": 0.0,
                "util_protected_frac": 0.0, "tasks": 3 + index, "total": delta // (index + 1),
                "cur_nr_cpus": cpus[1], "min_nr_cpus": cpus[0], "max_nr_cpus": cpus[1], "cpus": cpu_mask_words(owned),
                "slice_us": body.get("slice_us") or 20000, "preempt": 0.0, "affn_viol": 0.0, "migration": 0.0,
                "l_runq_lat_hist": [0, 0, 0],
            }
        return {"at": time.time(), "nr_nodes": 1, "total": delta, "local_sel": 80.0, "local_enq": 5.0,
                "open_idle": 0.1, "affn_viol": 0.0, "hi_fb": 0.0, "lo_fb": 0.0, "proc_ms": 3, "busy": 42.0,
                "util": 84.0, "antistall": 0, "system_cpu_util_ewma": 0.42, "layers": layers}

    def serve(self, conn):
        last = [0]  # per connection: counters are deltas since this connection's previous request
        with conn, conn.makefile("rwb") as stream:
            for raw in stream:
                try:
                    request = json.loads(raw)
                    kind = request.get("req")
                    target = (request.get("args") or {}).get("target", "top")
                    if kind == "stats" and target == "top":
                        reply = {"errno": 0, "args": {"resp": self.top(last)}}
                    elif kind == "stats_meta":
                        reply = {"errno": 0, "args": {"resp": {"SysStats": {"desc": "stand-in", "fields": {}}}}}
                    else:
                        reply = {"errno": 22, "args": {"resp": f"unknown command or target {raw.decode().strip()!r}"}}
                except ValueError as exc:
                    reply = {"errno": 22, "args": {"resp": f"{exc}"}}
                try:
                    stream.write((json.dumps(reply) + "\n").encode())
                    stream.flush()
                except OSError:
                    return


def main():
    specs, flags = parse_args(sys.argv[1:])
    layers = load_specs(specs)
    if "--print-and-exit" in flags:
        print("specs=" + json.dumps(layers, indent=2))
        return 0
    sysfs = FakeSysfs(os.environ.get("FAKE_SCX_SYSFS"))
    log_line("INFO", "scheds/rust/scx_layered/src/main.rs:2794", "Running scx_layered (build ID: 1.1.2 stand-in)")
    if sysfs.state() != "disabled":
        fail("another sched_ext scheduler is already running")
    stop = threading.Event()

    def on_signal(_signum, _frame):
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    if stop.wait(float(os.environ.get("FAKE_SCX_ATTACH_DELAY", "0"))):
        sys.stderr.write("EXIT: unregistered from user space\n")
        return 0
    sysfs.set("enabled", OPS_NAME)
    record("attach", argv=sys.argv[1:], specs=layers)
    # The stats threads block the stop signals, so the kernel hands them to the main thread: one
    # taken by a stats thread would run its Python handler only when the main thread's wait ended.
    stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = StatsServer(os.environ.get("FAKE_SCX_STATS_SOCKET", DEFAULT_SOCKET), layers)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    log_line("INFO", "scheds/rust/scx_layered/src/main.rs:3107",
             "Layered Scheduler Attached. Run `scx_layered --monitor` for metrics.")
    crash_after = os.environ.get("FAKE_SCX_CRASH_AFTER")
    crashed = not stop.wait(float(crash_after)) if crash_after else not stop.wait()
    server.close()
    sysfs.set("disabled", None)
    if crashed:
        sys.stderr.write("EXIT: runnable task stall (stand-in crash)\nDEBUG DUMP\n"
                         "================================================================================\n"
                         "stand-in: no real dump\n")
        sys.stderr.flush()
        return int(os.environ.get("FAKE_SCX_CRASH_CODE", "1"))
    sys.stderr.write("EXIT: unregistered from user space\n")
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Out at once, as the real one exits: no interpreter shutdown beside the stats threads, which
    # may be in the middle of a reply (a clean stop must never look like a crash).
    os._exit(code or 0)
