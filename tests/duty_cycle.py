"""A process whose threads run fixed duty cycles, for the rightsizing tests: each argument is one
thread, NAME=BUSY/PERIOD in milliseconds: BUSY ms of CPU work, then PERIOD - BUSY ms asleep
("hot=100/100" spins; "light=10/100" wants a tenth of a core), or NAME=burst:BUSY/PERIOD in
seconds (busy BUSY s of wall time, then asleep PERIOD - BUSY s). The sleep is fixed rather than
"until the period is over", so on a crowded host a thread does not fall behind and then run
back to back to catch up: what it wants stays its duty cycle.

The work is hashing a buffer sized to the busy phase in one call: hashlib releases the GIL for
the whole call, so the threads run in parallel and never sleep on the GIL mid-phase.
Prints "ready" once every thread runs; runs until killed."""

import ctypes
import hashlib
import sys
import threading
import time

BUFFER = bytes(64 * 2**20)
libc = ctypes.CDLL(None)


def hashing_rate() -> float:
    """Bytes hashed per CPU second on this host."""
    start = time.thread_time()
    hashlib.sha256(BUFFER[: 16 * 2**20]).digest()
    return 16 * 2**20 / max(1e-6, time.thread_time() - start)


RATE = hashing_rate()


def work(seconds: float) -> None:
    """About `seconds` of CPU in one GIL-free call."""
    size = max(4096, min(len(BUFFER), int(RATE * seconds)))
    hashlib.sha256(memoryview(BUFFER)[:size]).digest()


def duty(name: str, spec: str, started: threading.Barrier) -> None:
    libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    started.wait()
    if spec.startswith("burst:"):
        busy, period = (float(v) for v in spec[len("burst:"):].split("/"))
        while True:
            end = time.monotonic() + busy
            while time.monotonic() < end:
                work(0.05)
            time.sleep(period - busy)
    busy_ms, period_ms = (float(v) for v in spec.split("/"))
    if busy_ms >= period_ms:
        while True:
            work(0.1)
    while True:
        work(busy_ms / 1000.0)
        time.sleep((period_ms - busy_ms) / 1000.0)


def main() -> None:
    specs = [arg.split("=", 1) for arg in sys.argv[1:]]
    started = threading.Barrier(len(specs) + 1)
    for name, spec in specs:
        threading.Thread(target=duty, args=(name, spec, started), daemon=True).start()
    started.wait()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
