"""What the controller knows about nodes and tenants, rebuilt from reports.

Nearly everything in the registry (limits, policies, usage, curves)
arrives again in the next report of every node; what does not (each
node's registration, the last directives) the service keeps in its state
store (controller/store.py) and gives back to a restarted registry.

The controller never takes a node's word for what it can check: a node must
be in the config, its memory counts only up to what the config gives it,
and it may report only the tenants the config places on it.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace

import grpc

from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport


class Refused(Exception):
    """A call the controller refuses; `code` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str, owner: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.owner = owner          # another replica's address (controller/fleet.py)


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
    decided_at: int = 0          # its report count when a round last decided it
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
                      reports: list[TenantReport], applied: list[ApplyResult],
                      refused: list[tuple[str, str]] = ()):
        """Check a report and record what is acceptable, tenant by tenant.

        The report as a whole is refused (Refused raised, nothing recorded)
        only for what makes all of it suspect: an unregistered node, an old
        session, a lost node, a replayed sequence number.  Otherwise each
        tenant entry is taken or refused on its own: an entry for a tenant
        the config does not place on this node, a tenant reported twice,
        a limit above the node's memory.  `refused` lists entries refused
        before (malformed numbers) as (tenant, why).  A refused entry of a
        tenant placed here stands in as its last taken report, without
        curves and marked refused, so the tenant is held where it is and
        its memory stays counted.

        Returns (record, the reports to decide on, [(tenant, why)] refused)."""
        rec = self._check_session(node_id, session, seq)
        placed = {t.name for t in self.config.tenants_on(node_id)}
        taken: dict[str, TenantReport] = {}
        out = [(t, why) for t, why in refused]
        for r in reports:
            why = ("not a tenant of this node in the controller's config"
                   if r.tenant not in placed else
                   "reported twice; the first entry counts" if r.tenant in taken else
                   f"limit {r.limit_bytes} is above the node's memory "
                   f"{rec.config_memory_bytes}" if r.limit_bytes > rec.config_memory_bytes
                   else "")
            if why:
                out.append((r.tenant, why))
            else:
                taken[r.tenant] = r
                if r.refused:       # taken without its curves (wire.report_from_pb)
                    out.append((r.tenant, r.refused))
        for a in applied:
            if a.tenant not in placed:
                out.append((a.tenant, "applied: not a tenant of this node"))
        # Everything checked: record.
        rec.tenants.update(taken)
        rec.applied.update({a.tenant: a for a in applied if a.tenant in placed})
        decide_on = list(taken.values())
        for tenant, why in out:
            prior = rec.tenants.get(tenant)
            if tenant in placed and tenant not in taken and prior is not None:
                decide_on.append(replace(prior, curves=[], refused=why))
                taken[tenant] = prior
        rec.last_report_at = self.clock()
        rec.reports += 1
        rec.last_seq = seq
        rec.state = REPORTING
        return rec, decide_on, out

    def _check_session(self, node_id: str, session: str, seq: int) -> NodeRecord:
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
