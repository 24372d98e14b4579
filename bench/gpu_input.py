"""Is the GPU waiting for its input? A real trainer (ResNet-18, images JPEG-decoded and augmented
by DataLoader workers) runs on the GPU while temperd's usage sampler, NVML reader and classifier
watch it as one workload (its process tree), once per worker count given. Prints, per run, the
images per second, NVML's device readings, and what classify and rightsize say; writes the
results and the raw NVML readings as JSON to --out.

    python3 bench/gpu_input.py --workers 8 14 --seconds 75 --out /tmp/gpu

Needs PyTorch, torchvision, Pillow and an NVIDIA GPU; --cpu-smoke runs a tiny model on the CPU
for a few seconds instead, to check the script where there is no GPU (no NVML: gpu=none)."""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def trainer(workers: int, seconds: float, cpu: bool, report) -> None:
    """The trainer process: trains until `seconds` pass, then puts its images per second on `report`."""
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    from torchvision.transforms import v2 as T

    class Jpegs(Dataset):
        """Photograph-sized JPEGs in memory, decoded and augmented per item as an image folder would be."""

        def __init__(self, count: int = 64):
            rng = np.random.default_rng(0)
            self.blobs = []
            for _ in range(count):
                base = rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)
                image = Image.fromarray(base).resize((640, 480), Image.BICUBIC)  # smooth: compresses like a photo
                out = io.BytesIO()
                image.save(out, "JPEG", quality=90)
                self.blobs.append(out.getvalue())
            self.transform = T.Compose([T.PILToTensor(), T.RandomResizedCrop(224, antialias=True),
                                        T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                                        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

        def __len__(self) -> int:
            return 10 ** 7

        def __getitem__(self, index: int):
            image = Image.open(io.BytesIO(self.blobs[index % len(self.blobs)])).convert("RGB")
            return self.transform(image), index % 1000

    device = torch.device("cpu" if cpu else "cuda")
    model = (torchvision.models.resnet18(num_classes=1000) if not cpu else torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 1000)))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(Jpegs(), batch_size=32 if cpu else 256, num_workers=workers, pin_memory=not cpu,
                        persistent_workers=True, prefetch_factor=4, multiprocessing_context="fork")
    started, images = time.monotonic(), 0
    for x, y in loader:
        x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        images += len(y)
        if time.monotonic() - started >= seconds:
            break
    if not cpu:
        torch.cuda.synchronize()
    report.put(images / (time.monotonic() - started))


def process_tree(root: int):
    import psutil
    try:
        proc = psutil.Process(root)
        return [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def tracked_workload(root: int):
    """The trainer's process tree as one workload, as the matcher builds one for a hand-started process."""
    import psutil
    from temperd.decide.matcher import ThreadMatch, Workload
    procs, threads = process_tree(root), []
    if not procs:
        return ()
    for proc in procs:
        try:
            for t in proc.threads():
                with open(f"/proc/{proc.pid}/task/{t.id}/comm") as handle:
                    threads.append(ThreadMatch(t.id, proc.pid, handle.read().strip(), None, "trainer"))
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    try:
        with open(f"/proc/{root}/cgroup") as handle:
            cgroup = next((line.split(":", 2)[2].strip() for line in handle if line.startswith("0::")), "/")
        instance = " ".join(psutil.Process(root).cmdline())
    except (OSError, psutil.NoSuchProcess):
        return ()
    return (Workload(key=f"trainer:pid{root}", profile_id="trainer", tier="standard", budget=None,
                    budget_reason="", source="fingerprint", reason="gpu_input", unit=None, cgroup=cgroup,
                    pids=tuple(p.pid for p in procs), threads=tuple(sorted(threads, key=lambda t: t.tid)),
                    instance=instance),)


def run(workers: int, seconds: float, cpu: bool, settle: float) -> dict:
    from temperd.config.daemon_config import LearnerSettings
    from temperd.control.typed_json import to_json
    from temperd.observe.learner import WorkloadLearner
    from temperd.sources import nvml
    from temperd.sources.shape import online_cpus

    ctx = multiprocessing.get_context("spawn")
    report = ctx.Queue()
    child = ctx.Process(target=trainer, args=(workers, seconds, cpu, report), name="trainer")
    child.start()
    settings = LearnerSettings(window_s=max(10.0, seconds - settle), sample_interval_s=1.0, keep_threads=32,
                                 history_file=f"/tmp/gpu-input-history-{os.getpid()}.json")
    watch = WorkloadLearner(settings, len(online_cpus()), lambda: (tracked_workload(child.pid), None, {}))
    reader, why = nvml.open_reader()
    readings = []
    watch.start()
    started = time.monotonic()
    classified = recommended = None
    while child.is_alive() and classified is None and time.monotonic() - started < seconds + 60:
        time.sleep(2.5)
        if reader is not None:
            try:
                readings.append(to_json(reader.read()))
            except nvml.NvmlError as exc:
                why, reader = f"read failed: {exc}", None
        if time.monotonic() - started >= seconds - 4:  # while it still trains
            classified = [c.as_json() for c in watch.classifications()]
            recommended = [r.as_json() for r in watch.recommendations()]
    rate = report.get(timeout=120) if child.is_alive() or not report.empty() else float("nan")
    child.join(timeout=60)
    watch.stop()
    if reader is not None:
        reader.close()
    if os.path.exists(settings.history_file):
        os.unlink(settings.history_file)
    return {"workers": workers, "images_per_s": round(rate, 1), "nvml": why or "present",
            "classify": classified, "rightsize": recommended, "nvml_readings": readings,
            "watch_cpu_s": watch.describe()["sample_cpu_s_total"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8])
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--settle", type=float, default=15.0, help="start-up seconds left out of the window")
    parser.add_argument("--out", default=None)
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args()
    results = []
    for workers in args.workers:
        result = run(workers, args.seconds, args.cpu_smoke, args.settle)
        results.append(result)
        if args.out:  # after each run: what was measured comes back even if a later run fails
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "gpu-input.json"), "w") as handle:
                json.dump(results, handle, indent=1)
        devices = [d for r in result["nvml_readings"] for d in r["devices"]]
        gpu = (sum(d["util_pct"] for d in devices) / len(devices), sum(d["memory_util_pct"] for d in devices) / len(devices)) \
            if devices else None
        print(f"\n== {workers} DataLoader workers: {result['images_per_s']} images/s; device util / memory-bandwidth "
              f"(NVML, mean of {len(devices)} readings): {gpu}; sampler CPU {result['watch_cpu_s']} s", flush=True)
        for c in result["classify"] or []:
            print(f"classify {c['workload']}: cpu {c['cpu']['intensity']}/{c['cpu']['bound']}, gpu "
                  f"{c['gpu']['intensity']}/{c['gpu']['bound']} util {c['gpu']['avgUtilizationPct']} memory "
                  f"{c['gpu']['memoryUtilizationPct']}\n  reason: {c['classificationReason']}", flush=True)
        for r in result["rightsize"] or []:
            print(f"rightsize {r['workload']}: needed {r['needed_cpus']}\n  reason: {r['reason']}", flush=True)


if __name__ == "__main__":
    main()
