"""The machine-learning workloads of the isolation bench, as long-lived processes measured on
request (run under a Python that has the PyPI packages: onnxruntime and onnx, or torch).

  ml_worker.py onnx --port P            ONNX Runtime inference on a model built here with
                                        onnx.helper (8 x MatMul 512x512 + Relu, batch 64), CPU
                                        execution provider, default intra-op threads
  ml_worker.py dataloader --port P      a torch DataLoader (2 worker processes, persistent)
                                        feeding a simulated accelerator: a consumer that takes a
                                        fixed time per batch (sleeps), standing in for a GPU step
  ml_worker.py client --port P --seconds S
                                        asks the worker to run for S seconds; prints its JSON

The worker listens on 127.0.0.1 only and waits idle between requests; a request runs the loop
for the asked time and answers {"rate": per second, "p50_ms", "p99_ms"}: per inference for
onnx; for the DataLoader, samples per second and the time the accelerator waited for each
batch (0 when the workers kept it fed). It exits after --lifetime seconds in any case.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from typing import Callable, Dict, List

LOOPBACK = "127.0.0.1"


def quantile(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- ONNX Runtime ------------------------------------------------------------------------------------


def onnx_runner(layers: int = 8, width: int = 512, batch: int = 64) -> Callable[[float], Dict[str, float]]:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, inits = [], []
    last = "x"
    for i in range(layers):
        weight = numpy_helper.from_array((rng.standard_normal((width, width)) / width ** 0.5).astype(np.float32), f"w{i}")
        inits.append(weight)
        nodes.append(helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
        last = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, [batch, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": rng.standard_normal((batch, width)).astype(np.float32)}
    session.run(None, feed)

    def run(seconds: float) -> Dict[str, float]:
        latencies = []
        start = time.monotonic()
        end = start + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            session.run(None, feed)
            latencies.append(time.perf_counter() - t0)
        wall = time.monotonic() - start
        return {"rate": len(latencies) / wall, "p50_ms": 1000 * quantile(latencies, 0.5),
                "p99_ms": 1000 * quantile(latencies, 0.99), "count": len(latencies)}

    return run


# ---- torch DataLoader feeding a simulated accelerator -------------------------------------------------------


class SpinDataset:
    """Each sample costs `sample_ms` of CPU in the worker (decode and augment stand-in)."""

    def __init__(self, sample_ms: float, size: int = 10 ** 9):
        self.sample_s = sample_ms / 1000.0
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        import torch

        end = time.thread_time() + self.sample_s
        while time.thread_time() < end:
            pass
        return torch.full((64,), float(index % 1000))


def dataloader_runner(sample_ms: float, step_ms: float, batch: int = 16, workers: int = 2) -> Callable[[float], Dict[str, float]]:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    loader = DataLoader(SpinDataset(sample_ms), batch_size=batch, num_workers=workers, persistent_workers=True,
                        prefetch_factor=2, shuffle=False)
    batches = iter(loader)
    next(batches)

    def run(seconds: float) -> Dict[str, float]:
        waits = []
        samples = 0
        start = time.monotonic()
        end = start + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            data = next(batches)
            waits.append(time.perf_counter() - t0)  # the accelerator idles, waiting for data
            samples += data.shape[0]
            time.sleep(step_ms / 1000.0)  # the accelerator's step: a stand-in for the GPU
        wall = time.monotonic() - start
        return {"rate": samples / wall, "p50_ms": 1000 * quantile(waits, 0.5), "p99_ms": 1000 * quantile(waits, 0.99),
                "count": len(waits), "ideal_rate": batch / (step_ms / 1000.0)}

    return run


# ---- serving requests ------------------------------------------------------------------------------------


def serve(run: Callable[[float], Dict[str, float]], port: int, lifetime_s: float) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, port))
    listener.listen(1)
    threading.Timer(lifetime_s, lambda: os._exit(3)).start()
    print(f"ready {listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn, conn.makefile("rw") as stream:
            words = stream.readline().split()
            if len(words) == 2 and words[0] == "run":
                stream.write(json.dumps(run(min(float(words[1]), 120.0))) + "\n")
            else:
                stream.write(json.dumps({"error": f"unknown request {words!r}"}) + "\n")
            stream.flush()


def client(port: int, seconds: float) -> int:
    with socket.create_connection((LOOPBACK, port), timeout=seconds + 60) as conn, conn.makefile("rw") as stream:
        stream.write(f"run {seconds}\n")
        stream.flush()
        reply = stream.readline()
    print(reply.strip())
    return 0 if reply and "error" not in json.loads(reply) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("onnx", "dataloader", "client"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=3.0, help="client: how long the worker runs its loop")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="the worker exits after this long")
    parser.add_argument("--sample-ms", type=float, default=1.0, help="dataloader: CPU per sample in a worker")
    parser.add_argument("--step-ms", type=float, default=20.0, help="dataloader: the simulated accelerator's step")
    args = parser.parse_args()
    if args.mode == "client":
        return client(args.port, args.seconds)
    run = onnx_runner() if args.mode == "onnx" else dataloader_runner(args.sample_ms, args.step_ms)
    serve(run, args.port, args.lifetime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
