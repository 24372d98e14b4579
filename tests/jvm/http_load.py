"""HTTP load for tests/jvm/TrainingService.java: CONNECTIONS keep-alive clients asking GET /
back to back for SECONDS. Usage: python3 http_load.py PORT SECONDS CONNECTIONS"""

import http.client
import sys
import threading
import time


def client(port: int, deadline: float) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while time.monotonic() < deadline:
        connection.request("GET", "/")
        connection.getresponse().read()


def main() -> None:
    port, seconds, connections = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    deadline = time.monotonic() + seconds
    clients = [threading.Thread(target=client, args=(port, deadline)) for _ in range(connections)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()


if __name__ == "__main__":
    main()
