"""The agent's Prometheus endpoint: every report figure per cgroup, the MRC
points as gauges labelled by policy and size, the sampler's events, samples
and drops, and the agent's own CPU time (its sampler child included)."""
from __future__ import annotations

import math
import os
import resource

from prometheus_client import CollectorRegistry, Gauge, start_http_server

_REPORT_FIELDS = {
    "accesses_per_s": "page-cache page accesses per second",
    "inserts_per_s": "page-cache insertions (misses) per second, in pages",
    "removals_per_s": "page-cache removals per second, in pages",
    "refaults_per_s": "file refaults per second",
    "limit_bytes": "memory limit in force (0 = none)",
    "usage_file_bytes": "page cache charged to the cgroup",
    "usage_anon_bytes": "anonymous memory charged to the cgroup",
    "throughput": "throughput from the tenant's throughput source (NaN: it did not answer)",
    "miss_ratio": "insertions over accesses in the last interval",
    "policy_capacity_pages": "pages the cgroup's cache_ext policy was sized for",
    "policy_overflow_pages": "pages the cgroup's cache_ext policy had no room for",
}
MAX_CURVE_POINTS = 32       # per curve, to bound the label cardinality


def _proc_cpu_seconds(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks     # utime + stime


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        labels = ["tenant", "cgroup"]
        self.report = {name: Gauge(f"cachepilot_cgroup_{name}", doc, labels,
                                   registry=self.registry)
                       for name, doc in _REPORT_FIELDS.items()}
        self.curve = Gauge("cachepilot_mrc_miss_ratio",
                           "miss ratio the curve predicts at a memory limit",
                           ["tenant", "policy", "size_pages"], registry=self.registry)
        self.sampler = Gauge("cachepilot_sampler_total",
                             "sampler counts since the cgroup was first watched",
                             ["tenant", "kind"], registry=self.registry)
        self.cpu = Gauge("cachepilot_agent_cpu_seconds",
                         "CPU time of the agent process and its sampler child",
                         ["process"], registry=self.registry)
        self.stats_only = Gauge("cachepilot_agent_stats_only",
                                "1 when the agent runs without the BPF sampler",
                                registry=self.registry)
        self._tenants: set[str] = set()
        self._points: dict[str, set] = {}      # tenant -> curve labels exported

    def update(self, reports, backend=None):
        seen = set()
        for r in reports:
            seen.add(r.tenant)
            for name in _REPORT_FIELDS:
                value = getattr(r, name)
                self.report[name].labels(r.tenant, r.cgroup).set(
                    math.nan if value is None else float(value))
            points = set()
            for c in r.curves:
                idx = range(len(c.sizes))
                if len(c.sizes) > MAX_CURVE_POINTS:
                    step = len(c.sizes) / MAX_CURVE_POINTS
                    idx = sorted({int(i * step) for i in range(MAX_CURVE_POINTS)}
                                 | {len(c.sizes) - 1})
                for i in idx:
                    labels = (r.tenant, c.policy, str(int(c.sizes[i])))
                    self.curve.labels(*labels).set(float(c.miss_ratio[i]))
                    points.add(labels)
            # a curve's sizes move with its builder's rate and the tenant's
            # limit: points of an earlier grid would read as this curve's
            for labels in self._points.get(r.tenant, set()) - points:
                self.curve.remove(*labels)
            self._points[r.tenant] = points
        for gone in self._tenants - seen:
            self._forget(gone)
        self._tenants = seen
        if backend is not None:
            for tenant, w in getattr(backend, "watched", {}).items():
                t = w.totals
                for kind, value in (("events", t.access_events + t.insert_events
                                     + t.removal_events),
                                    ("accesses", t.accesses), ("samples", t.sampled),
                                    ("drops", t.drops)):
                    self.sampler.labels(tenant, kind).set(value)
            self.stats_only.set(1 if getattr(backend, "stats_only_reason", None) else 0)
            sampler = getattr(backend, "sampler", None)
            if sampler is not None:
                self.cpu.labels("sampler").set(_proc_cpu_seconds(sampler._proc.pid))
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu.labels("agent").set(ru.ru_utime + ru.ru_stime)

    def _forget(self, tenant: str):
        self._points.pop(tenant, None)
        for gauge in list(self.report.values()) + [self.curve, self.sampler]:
            for labels in list(gauge._metrics):      # noqa: SLF001 - no public API
                if labels and labels[0] == tenant:
                    gauge.remove(*labels)

    def serve(self, address: str, port: int):
        return start_http_server(port, addr=address, registry=self.registry)
