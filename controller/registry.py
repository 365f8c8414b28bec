"""What the controller knows about nodes and tenants, rebuilt from reports.

The registry holds no state that a restart could lose for good: everything
in it (limits, policies, usage, curves) arrives again in the next report of
every node, so a restarted controller picks up where the old one stopped.

The controller never takes a node's word for what it can check: a node must
be in the config, its memory counts only up to what the config gives it,
and it may report only the tenants the config places on it.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import grpc

from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport


class Refused(Exception):
    """A call the controller refuses; `code` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# Node states, in the order a node passes through them.
EXPECTED = "expected"        # in the config, never registered
REGISTERED = "registered"    # registered, no report yet
REPORTING = "reporting"
LOST = "lost"                # no report for `lost_after_intervals`


@dataclass
class NodeRecord:
    name: str
    config_memory_bytes: int
    state: str = EXPECTED
    info: NodeInfo | None = None
    session: str | None = None
    registered_at: float | None = None
    last_report_at: float | None = None
    reports: int = 0
    peer: str = ""
    last_seq: int = 0
    tenants: dict[str, TenantReport] = field(default_factory=dict)
    directives: dict[str, Directive] = field(default_factory=dict)
    applied: dict[str, ApplyResult] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        """What the node may hand out: the config's figure, or less when the
        node itself says it has less."""
        if self.info is None:
            return self.config_memory_bytes
        return min(self.config_memory_bytes, self.info.memory_bytes)

    @property
    def in_pool(self) -> bool:
        return self.state in (REGISTERED, REPORTING)

    @property
    def advisory(self) -> bool:
        """Whether policy directives are only advice on this node: a linux
        host whose kernel has no cache_ext cannot swap policies (the sim
        backend emulates swaps)."""
        return self.info is not None and self.info.backend == "linux" and \
            not self.info.has_cache_ext


class Registry:
    def __init__(self, config, clock=time.monotonic):
        self.config = config
        self.clock = clock
        self.nodes = {n.name: NodeRecord(n.name, n.memory_bytes) for n in config.nodes}

    # -- nodes ----------------------------------------------------------------
    def register(self, info: NodeInfo) -> NodeRecord:
        rec = self.nodes.get(info.node_id)
        if rec is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"node {info.node_id!r} is not in the controller's config")
        rec.info = info
        # A fresh session on every registration: reports from an older
        # connection (or from before a restart) are told to re-register.
        rec.session = secrets.token_hex(8)
        rec.last_seq = 0
        rec.registered_at = self.clock()
        rec.state = REGISTERED if rec.reports == 0 else REPORTING
        rec.last_report_at = rec.last_report_at or rec.registered_at
        return rec

    def accept_report(self, node_id: str, session: str, seq: int,
                      reports: list[TenantReport], applied: list[ApplyResult]) -> NodeRecord:
        """Check a report against what is known and record it; raises
        Refused (and records nothing) when any part of it is unacceptable."""
        rec = self.nodes.get(node_id)
        if rec is None or rec.session is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"node {node_id!r} has not registered")
        if session != rec.session:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"node {node_id!r}: unknown session; register again")
        if rec.state == LOST:
            rec.session = None
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"node {node_id!r} was marked lost; register again")
        if seq <= rec.last_seq:
            # A replayed or reordered report would run an extra decision
            # round on old numbers.
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"node {node_id!r}: report {seq} is not newer than {rec.last_seq}")
        placed = {t.name for t in self.config.tenants_on(node_id)}
        seen = set()
        for r in reports:
            if r.tenant not in placed:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"node {node_id!r} reported unknown tenant {r.tenant!r}")
            if r.tenant in seen:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"node {node_id!r} reported tenant {r.tenant!r} twice")
            seen.add(r.tenant)
            if r.limit_bytes > rec.config_memory_bytes:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"tenant {r.tenant!r}: limit {r.limit_bytes} is above "
                              f"the node's memory {rec.config_memory_bytes}")
        for a in applied:
            if a.tenant not in placed:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"node {node_id!r} applied to unknown tenant {a.tenant!r}")
        # Everything checked: record.
        rec.tenants.update({r.tenant: r for r in reports})
        rec.applied.update({a.tenant: a for a in applied})
        rec.last_report_at = self.clock()
        rec.reports += 1
        rec.last_seq = seq
        rec.state = REPORTING
        return rec

    def check_lost(self, interval_s: float, lost_after: int) -> list[str]:
        """Mark nodes silent for `lost_after` intervals as lost; their memory
        leaves the pool.  Returns the names newly marked."""
        now, newly = self.clock(), []
        for rec in self.nodes.values():
            if rec.state in (REGISTERED, REPORTING) and rec.last_report_at is not None \
                    and now - rec.last_report_at > lost_after * interval_s:
                rec.state = LOST
                newly.append(rec.name)
        return newly

    def pool_bytes(self) -> int:
        return sum(r.memory_bytes for r in self.nodes.values() if r.in_pool)

    def node_of(self, tenant: str) -> NodeRecord:
        try:
            return self.nodes[self.config.tenant(tenant).node]
        except KeyError:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"unknown tenant {tenant!r}") from None
