"""HTTP load for tests/jvm/TrainingService.java: CONNECTIONS keep-alive clients asking GET /
back to back for SECONDS, then one line: requests, rate and latency quantiles.
Usage: python3 http_load.py PORT SECONDS CONNECTIONS"""

import http.client
import statistics
import sys
import threading
import time


def client(port: int, deadline: float, latencies: list) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while time.monotonic() < deadline:
        started = time.perf_counter()
        connection.request("GET", "/")
        connection.getresponse().read()
        latencies.append(time.perf_counter() - started)  # list.append is atomic under the GIL


def main() -> None:
    port, seconds, connections = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    latencies: list = []
    started = time.monotonic()
    deadline = started + seconds
    clients = [threading.Thread(target=client, args=(port, deadline, latencies)) for _ in range(connections)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    elapsed = time.monotonic() - started
    if len(latencies) < 2:
        print(f"requests {len(latencies)} rps 0 p50_ms nan p99_ms nan")
        return
    cuts = statistics.quantiles(latencies, n=100)
    print(f"requests {len(latencies)} rps {len(latencies) / elapsed:.1f} "
          f"p50_ms {cuts[49] * 1000:.3f} p99_ms {cuts[98] * 1000:.3f}")


if __name__ == "__main__":
    main()
