"""The controller's Prometheus metrics.

Each Controller owns its own CollectorRegistry, so several controllers (the
tests start many) never collide in the process-wide default registry.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import start_http_server


class ControllerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.slo_attainment = Gauge(
            "cachepilot_slo_attainment_ratio",
            "Fraction of reported intervals (after warm-up) in which the tenant met its SLO",
            ["tenant"], registry=r)
        self.slo_met = Gauge("cachepilot_slo_met", "1 when the last interval met the SLO",
                             ["tenant"], registry=r)
        self.slo_target = Gauge("cachepilot_slo_min_throughput",
                                "The tenant's SLO (operations per second)", ["tenant"], registry=r)
        self.throughput = Gauge("cachepilot_tenant_throughput",
                                "Throughput the node reported for the tenant", ["tenant"], registry=r)
        self.limit = Gauge("cachepilot_tenant_limit_bytes",
                           "Memory limit the controller directs", ["tenant", "node"], registry=r)
        self.policy = Gauge("cachepilot_tenant_policy",
                            "1 for the eviction policy the controller directs",
                            ["tenant", "policy"], registry=r)
        self.decisions = Counter("cachepilot_decisions_total",
                                 "Directive changes by kind", ["kind"], registry=r)
        self.violations = Gauge("cachepilot_slo_violations",
                                "SLOs the last decision predicts missed", ["node"], registry=r)
        self.loop_latency = Histogram(
            "cachepilot_decision_seconds", "Time to decide one node's directives",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r)
        self.shed = Counter("cachepilot_shed_reports_total",
                            "Reports answered without a decision round: the controller "
                            "was behind (it waited on its lock longer than the shed bound)",
                            registry=r)
        self.nodes = Gauge("cachepilot_nodes", "Nodes by state", ["state"], registry=r)
        self.pool = Gauge("cachepilot_pool_bytes", "Memory of the nodes that are not lost",
                          registry=r)
        self.reverts = Counter("cachepilot_watchdog_reverts_total",
                               "Policy switches the model watchdog undid", ["tenant"],
                               registry=r)
        self.refused = Counter("cachepilot_refused_calls_total", "Calls refused, by reason",
                               ["code"], registry=r)
        self.refused_entries = Counter(
            "cachepilot_refused_report_entries_total",
            "Tenant entries of accepted reports that were refused (a malformed curve or "
            "entry, a tenant not on the node); the tenant is held", ["node"], registry=r)
        self.held = Gauge("cachepilot_tenant_held",
                          "1 while the tenant is held: its throughput is unknown or its "
                          "report entry was refused", ["tenant"], registry=r)
        self.mode = Gauge("cachepilot_tenant_recommend_mode",
                          "1 when the tenant's directives are only recommended", ["tenant"],
                          registry=r)
        self.recommended_limit = Gauge(
            "cachepilot_recommended_limit_bytes",
            "Recommend mode: the limit the controller would direct", ["tenant"], registry=r)
        self.recommended_policy = Gauge(
            "cachepilot_recommended_policy",
            "Recommend mode: 1 for the policy the controller would direct",
            ["tenant", "policy"], registry=r)
        self._policies: dict[tuple[str, bool], str] = {}

    def set_policy(self, tenant: str, policy: str, recommended: bool = False):
        gauge = self.recommended_policy if recommended else self.policy
        old = self._policies.get((tenant, recommended))
        if old is not None and old != policy:
            gauge.labels(tenant, old).set(0)
        self._policies[(tenant, recommended)] = policy
        gauge.labels(tenant, policy).set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Expose /metrics over HTTP; returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)
