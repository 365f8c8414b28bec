"""Helpers for the gRPC tests (service, client, multi-node): a throwaway
self-signed certificate, small configs, a transport-only engine and a fake
backend.  Not a test module itself."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from cachepilot.protocol.types import ApplyResult, NodeInfo, TenantReport
from cachepilot.controller.config import config_from_dict
from cachepilot.models.mrc import MRC

TOKEN = "s3cret-test-token"


def make_cert(folder: Path, ips=("127.0.0.1",)) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and the given addresses."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    san = ",".join(["DNS:localhost"] + [f"IP:{ip}" for ip in ips])
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=localhost", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    return key, cert


def small_config(tmp: Path | None = None, **kw):
    return config_from_dict(small_config_dict(tmp, **kw), "test.yaml")


def small_config_dict(tmp: Path | None = None, tls: bool = True, nodes=("n1",),
                      tenants_per_node=2, interval_s=0.2, lost_after=3, memory=64 << 20,
                      ips=("127.0.0.1",), listen="127.0.0.1:0", metrics_port=None):
    ctl = {"insecure": True, "listen": listen}
    if tls:
        key, cert = make_cert(tmp, ips)
        ctl = {"listen": listen, "tls_cert": str(cert), "tls_key": str(key),
               "tls_ca": str(cert), "token": TOKEN}
    if metrics_port is not None:
        ctl["metrics_port"] = metrics_port
    # Shedding (a report that waited over shed_after of an interval goes
    # undecided) is tested on its own; at these 0.2-s intervals the default
    # would shed a report that merely met a busy CI machine.
    data = {
        "control": {"interval_s": interval_s, "lost_after_intervals": lost_after,
                    "shed_after": 5.0},
        "controller": ctl,
        "nodes": [{"name": n, "memory_bytes": memory} for n in nodes],
        "tenants": [{"name": f"{n}-t{i}", "node": n, "slo": {"min_throughput": 1000},
                     "policies": ["lru", "fifo"], "initial_policy": "lru"}
                    for n in nodes for i in range(tenants_per_node)],
    }
    return data


class EchoEngine:
    """Transport-only stand-in for the decision engine: answers every report
    with directives that restate (or, when `script` has one, replace) the
    reported limit and policy.  Used only to test the plumbing."""

    def __init__(self, script=None):
        self.script = script or {}
        self.calls = []

    def decide(self, node, reports, config, advisory=False):
        from cachepilot.protocol.types import Directive
        self.calls.append((node, [r.tenant for r in reports]))
        self.advisory = advisory
        out, log = [], []
        for r in reports:
            limit, policy = self.script.get(r.tenant, (r.limit_bytes, r.policy))
            out.append(Directive(r.tenant, limit, policy, "echo"))
            if policy != r.policy:
                log.append({"kind": "policy", "tenant": r.tenant, "predicted": 1.5,
                            "message": f"{r.tenant}: policy {r.policy} -> {policy}"})
        return out, [], log


def curve(policy="lru", sizes=(256, 1024, 4096), ratios=(0.9, 0.5, 0.2)):
    return MRC(np.array(sizes), np.array(ratios), policy, "exact")


def report(tenant, limit=16 << 20, policy="lru", throughput=500.0, curves=None):
    return TenantReport(tenant=tenant, cgroup=tenant, interval_s=1.0, accesses_per_s=1e4,
                        inserts_per_s=100.0, removals_per_s=0.0, refaults_per_s=0.0,
                        limit_bytes=limit, usage_file_bytes=limit // 2, usage_anon_bytes=0,
                        policy=policy, throughput=throughput, miss_ratio=0.3,
                        curves=curves if curves is not None else [curve("lru"), curve("fifo")])


class FakeBackend:
    """A node whose tenants report fixed numbers and remember what they are told."""

    def __init__(self, node, tenants, memory=64 << 20):
        self.node, self.memory = node, memory
        self.limits = {t: 16 << 20 for t in tenants}
        self.policies = {t: "lru" for t in tenants}
        self.applied = []

    def info(self):
        return NodeInfo(self.node, self.memory, 0, True, ["lru", "fifo"], "sim")

    def assign(self, tenants):
        self.assigned = [t.name for t in tenants]

    def collect(self):
        return [report(t, self.limits[t], self.policies[t]) for t in self.limits]

    def apply(self, directives):
        out = []
        for d in directives:
            self.limits[d.tenant], self.policies[d.tenant] = d.limit_bytes, d.policy
            out.append(ApplyResult(d.tenant, d.limit_bytes, d.policy, True))
        self.applied.append(directives)
        return out

    def current(self):
        return {t: {"limit_bytes": self.limits[t], "policy": self.policies[t]}
                for t in self.limits}

    def close(self):
        pass
