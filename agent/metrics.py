"""The agent's Prometheus endpoint: every report figure per cgroup, the MRC
points as gauges labelled by policy and size, the sampler's events, samples
and drops, and the agent's own CPU time (its sampler child included)."""
from __future__ import annotations

import math
import os
import resource

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily

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


def _shown(n: int):
    """The indices of a curve's points exported: all, or MAX_CURVE_POINTS
    spread evenly and the last."""
    if n <= MAX_CURVE_POINTS:
        return range(n)
    step = n / MAX_CURVE_POINTS
    return sorted({int(i * step) for i in range(MAX_CURVE_POINTS)} | {n - 1})


class _Curves:
    """The curves' points, made into gauges when scraped.  Each report
    replaces its tenant's points whole: a curve on a new grid (a builder at
    a new rate, a tenant at a new limit) leaves none of the old one, and
    the agent's interval does no per-point label work (under emulation,
    setting and removing a few hundred labelled gauges an interval took
    more of the agent's time than its curves did)."""

    def __init__(self):
        self.points: dict[str, list] = {}     # tenant -> [(policy, size, ratio)]

    def collect(self):
        family = GaugeMetricFamily("cachepilot_mrc_miss_ratio",
                                   "miss ratio the curve predicts at a memory limit",
                                   labels=["tenant", "policy", "size_pages"])
        for tenant, points in list(self.points.items()):
            for policy, size, ratio in points:
                family.add_metric([tenant, policy, size], ratio)
        return [family]


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        labels = ["tenant", "cgroup"]
        self.report = {name: Gauge(f"cachepilot_cgroup_{name}", doc, labels,
                                   registry=self.registry)
                       for name, doc in _REPORT_FIELDS.items()}
        self.curve = _Curves()
        self.registry.register(self.curve)
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

    def update(self, reports, backend=None):
        seen = set()
        for r in reports:
            seen.add(r.tenant)
            for name in _REPORT_FIELDS:
                value = getattr(r, name)
                self.report[name].labels(r.tenant, r.cgroup).set(
                    math.nan if value is None else float(value))
            self.curve.points[r.tenant] = [
                (c.policy, str(int(c.sizes[i])), float(c.miss_ratio[i]))
                for c in r.curves for i in _shown(len(c.sizes))]
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
        self.curve.points.pop(tenant, None)
        for gauge in list(self.report.values()) + [self.sampler]:
            for labels in list(gauge._metrics):      # noqa: SLF001 - no public API
                if labels and labels[0] == tenant:
                    gauge.remove(*labels)

    def serve(self, address: str, port: int):
        return start_http_server(port, addr=address, registry=self.registry)
