"""What the scheduler does with the plan, and how it is shown.

- observer: a sample of per-thread schedstat, per-layer use, PSI and temperd's own cost
- process_cpu: each process's CPU ticks for a sample, a many-threaded one read only when its cgroup ran
- linter: the placement invariants checked against a sample (LintReport)
- sampler: one observation sample: observer, linter, then the metrics
- metrics: Prometheus metrics, one group per source, each fed that source's typed status
- status_metrics: the metrics that are facts of the typed status (temperd/control/status), read
  from its fields at each scrape
- http: GET /metrics and /observe
- journal: what temperd did and why, for the log
- learner: the learner's thread (classification and rightsizing), with its tracker
  (usage_tracker), a workload's stable name (workload_labels), the classification signals over a
  window (workload_window) and the decaying usage histograms (histogram) of the rightsizing
  history (usage_history)
"""
