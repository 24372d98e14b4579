"""Training end to end after the observation: parse the trace, measure each thread, analyze,
synthesize the profile, and say where every thread went (`temperctl train --json`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from temperd.sources.shape import MachineShape
from temperd.trace.parse import parse_trace
from temperd.training.analyze import Analysis, analyze
from temperd.training.features import workload_features
from temperd.training.observation import Observation
from temperd.training.samples import ProcessInfo, Samples
from temperd.training.synthesize import ShapeFacts, synthesize


@dataclass
class Trained:
    analysis: Analysis
    profile_text: str
    root: Optional[ProcessInfo]

    def summary(self, profile_path: str) -> Dict[str, Any]:
        """{"profile", "groups", "threads"}: every observed thread with its group, class,
        treatment (exclusive / latency / yield / none) and CPU share."""
        a = self.analysis
        groups = [{"name": c.name, "class": c.cls, "treatment": c.treatment, "selector": c.selector,
                   "patterns": list(c.patterns), "busiest": c.busiest, "cores": c.cores,
                   "threads": len(c.tids), "cpu_share": round(sum(a.features.threads[t].cpu_share for t in c.tids), 3)}
                  for c in a.clusters]
        threads: List[Dict[str, Any]] = []
        for tid, t in sorted(a.features.threads.items()):
            cluster = a.cluster_of(tid)
            threads.append({"tid": tid, "pid": t.pid, "comm": t.comm, "group": cluster.name if cluster else None,
                            "class": a.verdicts[tid].cls, "treatment": cluster.treatment if cluster else "none",
                            "cpu_share": round(t.cpu_share, 4)})
        return {"profile": profile_path, "groups": groups, "threads": threads}


def shape_facts(shape: MachineShape) -> ShapeFacts:
    return ShapeFacts(shape.n_cores, shape.threads_per_core, shape.n_cpus, shape.describe())


def budget_of(root: Optional[ProcessInfo], shape: ShapeFacts) -> tuple:
    """(CPUs, why): the CPU quota of the workload's root process's cgroup, else the host's CPUs."""
    if root is not None and root.cpu_quota:
        return root.cpu_quota, f"the CPU quota of cgroup {root.cgroup}"
    return float(shape.cpus), f"the host's {shape.cpus} CPUs: the workload has no CPU quota"


def root_process(samples: Samples) -> Optional[ProcessInfo]:
    if samples.root_pid is not None and samples.root_pid in samples.processes:
        return samples.processes[samples.root_pid]
    if not samples.processes:
        return None
    pids = set(samples.processes)
    tops = [p for p in samples.processes.values() if p.ppid not in pids]
    return min(tops or samples.processes.values(), key=lambda p: p.pid)


def train(observation: Observation, shape: ShapeFacts, *, trace_path: Optional[str] = None,
          requested_id: Optional[str] = None, load: Optional[str] = None) -> Trained:
    summary = parse_trace(trace_path or observation.trace["output"])
    samples = observation.samples
    features = workload_features(summary, samples)
    root = root_process(samples)
    budget, why = budget_of(root, shape)
    analysis = analyze(features, budget, why, {pid: list(p.titles) for pid, p in samples.processes.items()})
    text = synthesize(analysis, root, shape, requested_id=requested_id, load=load)
    return Trained(analysis, text, root)
