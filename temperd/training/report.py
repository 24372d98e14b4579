"""The training report: one self-contained HTML file (pictures inline, nothing fetched when it is
opened) with per-thread CPU over time, the on-CPU burst-length distribution of each cluster, the
waker -> wakee graph between clusters, and the table of threads and where they went.

Drawn with matplotlib (Debian: python3-matplotlib), imported only here.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Dict, List, Tuple

from temperd.trace.parse import BURST_BUCKETS
from temperd.training.features import INTERRUPT, NETWORK, OUTSIDE

MAX_LINES = 12  # threads drawn in the CPU-over-time chart (the busiest)


class ReportUnavailable(Exception):
    """matplotlib is missing; the message says what to install."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportUnavailable("matplotlib is not installed (Debian/Ubuntu: apt install python3-matplotlib)") from None
    return plt


def _png(plt, fig) -> str:
    """The figure as base64 PNG; the figure is closed."""
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
        return base64.b64encode(buffer.getvalue()).decode("ascii")
    finally:
        plt.close(fig)


def _cpu_over_time(plt, trained) -> str:
    a = trained.analysis
    fig, ax = plt.subplots(figsize=(9, 3.6))
    threads = sorted(a.features.threads.values(), key=lambda t: (-t.cpu_share, t.tid))[:MAX_LINES]
    for t in threads:
        cluster = a.cluster_of(t.tid)
        ax.plot(range(len(t.cpu_per_second)), t.cpu_per_second, marker=".",
                label=f"{t.comm} {t.tid} ({cluster.name if cluster else '-'})")
    ax.set_xlabel("second of the trace")
    ax.set_ylabel("CPUs")
    ax.set_title(f"CPU per thread (the {len(threads)} busiest)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(plt, fig)


def _bursts(plt, trained) -> str:
    a = trained.analysis
    fig, ax = plt.subplots(figsize=(9, 3.2))
    edges = [2 ** i for i in range(BURST_BUCKETS)]
    for cluster in a.clusters:
        total = [0] * BURST_BUCKETS
        for tid in cluster.tids:
            for i, n in enumerate(a.features.threads[tid].burst_histogram or ()):
                total[i] += n
        if sum(total):
            last = max(i for i, n in enumerate(total) if n) + 1
            ax.step(edges[:last], [n / sum(total) for n in total[:last]], where="post",
                    label=f"{cluster.name} ({cluster.treatment})")
    ax.set_xscale("log")
    ax.set_xlabel("on-CPU burst (us, log2 buckets)")
    ax.set_ylabel("share of bursts")
    ax.set_title("Burst lengths per cluster")
    ax.legend(fontsize=8)
    return _png(plt, fig)


def cluster_edges(trained) -> Dict[Tuple[str, str], float]:
    """(waker, wakee) cluster names (or network / timer / outside) -> wakeups per second."""
    a = trained.analysis
    name_of = {tid: c.name for c in a.clusters for tid in c.tids}
    rates: Dict[Tuple[str, str], float] = {}
    duration = a.features.duration_s
    for tid, t in a.features.threads.items():
        wakee = name_of.get(tid, "-")
        for source, label in ((NETWORK, "network"), (INTERRUPT, "timer"), (OUTSIDE, "other processes")):
            if t.woken_by.get(source):
                rates[(label, wakee)] = rates.get((label, wakee), 0.0) + t.woken_by[source] / duration
        for waker, count in t.wakers.items():
            key = (name_of.get(waker, "-"), wakee)
            rates[key] = rates.get(key, 0.0) + count / duration
    return rates


def _graph(plt, trained) -> str:
    rates = cluster_edges(trained)
    nodes = sorted({n for pair in rates for n in pair})
    fig, ax = plt.subplots(figsize=(6.5, 6.5))
    where = {n: (math.cos(2 * math.pi * i / max(1, len(nodes))), math.sin(2 * math.pi * i / max(1, len(nodes))))
             for i, n in enumerate(nodes)}
    top = max(rates.values(), default=1.0)
    for (a, b), rate in sorted(rates.items()):
        (x1, y1), (x2, y2) = where[a], where[b]
        width = 0.5 + 4.0 * math.log1p(rate) / math.log1p(top)
        if a == b:
            ax.annotate("", xy=(x1 + 0.08, y1 + 0.08), xytext=(x1 - 0.08, y1 + 0.08),
                        arrowprops=dict(arrowstyle="->", lw=width, connectionstyle="arc3,rad=-1.5", color="tab:gray"))
        else:
            ax.annotate("", xy=(x2, y2), xytext=(x1, y1),
                        arrowprops=dict(arrowstyle="->", lw=width, shrinkA=22, shrinkB=22,
                                        connectionstyle="arc3,rad=0.12", color="tab:blue"))
        ax.text((x1 + x2) / 2, (y1 + y2) / 2 + (0.18 if a == b else 0), f"{rate:.0f}/s", fontsize=7, ha="center")
    for n, (x, y) in where.items():
        ax.text(x, y, n, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc="white" if n in ("network", "timer", "other processes") else "lightyellow"))
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.axis("off")
    ax.set_title("Who wakes whom (wakeups per second, between clusters)")
    return _png(plt, fig)


def render(trained) -> str:
    plt = _pyplot()
    a = trained.analysis
    pictures = [("CPU over time", _cpu_over_time(plt, trained)), ("Burst lengths", _bursts(plt, trained)),
                ("Wake graph", _graph(plt, trained))]
    rows: List[str] = []
    for tid, t in sorted(a.features.threads.items(), key=lambda item: (-item[1].cpu_share, item[0])):
        cluster = a.cluster_of(tid)
        cells = [tid, t.pid, t.comm, cluster.name if cluster else "-", a.verdicts[tid].cls,
                 cluster.treatment if cluster else "none", f"{t.cpu_share:.3f}", f"{t.burst_p50_us:g}",
                 f"{t.burst_p99_us:g}", f"{t.wakeups_per_s:g}", a.verdicts[tid].why]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("tid", "pid", "name", "group", "class", "treatment", "CPUs",
                                             "burst p50 us", "burst p99 us", "wakeups/s", "why"))
    images = "".join(f"<h2>{html.escape(title)}</h2><img alt=\"{html.escape(title)}\" src=\"data:image/png;base64,{data}\">"
                     for title, data in pictures)
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>temperctl train report</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}pre{background:#f6f6f6;padding:1em}"
            "</style></head><body><h1>Training report</h1>"
            f"{images}<h2>Threads</h2><table><tr>{head}</tr>{''.join(rows)}</table>"
            f"<h2>Profile</h2><pre>{html.escape(trained.profile_text)}</pre></body></html>\n")


def write_report(trained, path: str) -> str:
    text = render(trained)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
