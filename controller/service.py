"""The controller: decision rounds behind a gRPC service.

`Controller` is the transport-free core (registry, decision engine, SLO
bookkeeping, decision log, metrics); `NodeServicer` and `AdminServicer`
expose it over gRPC; `serve()` starts a server with TLS and token
authentication (or plaintext on request, with a loud warning).

A decision round runs for one node each time that node reports: memory is
divided per node, so a node's directives depend only on its own tenants, and
answering in the Report reply needs no second channel back to the agent.
"""
from __future__ import annotations

import hmac
import json
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import grpc

from cachepilot.controller import engine
from cachepilot.controller.config import SLO
from cachepilot.controller.engine import keep_freed_memory
from cachepilot.controller.metrics import ControllerMetrics
from cachepilot.controller.registry import LOST, Refused, Registry
from cachepilot.core.errors import UserError
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.protocol import wire
from cachepilot.protocol.channel import TOKEN_HEADER
from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport

log = logging.getLogger("cachepilot.controller")


@dataclass
class LogRecord:
    round: int
    time: float
    node: str
    tenant: str
    kind: str
    message: str
    detail: dict = field(default_factory=dict)


@dataclass
class TenantBook:
    """Per-tenant SLO bookkeeping from the reports (what was observed)."""
    intervals: int = 0
    counted: int = 0          # intervals after warm-up
    met: int = 0              # of those, intervals with the SLO met
    first_met_interval: int | None = None
    last_met: bool | None = None


class Engine:
    """The decision engine (controller/engine) behind the call the service makes.

    A round sees only the reporting node's reports; EngineState carries the
    models, streaks and targets across rounds, and a fresh state (after a
    restart) starts from the limits and policies every report carries.
    `advisory` says the node cannot swap policies (NodeRecord.advisory).
    Returns (directives for that node, predicted SLO violations, log entries).
    """

    def __init__(self):
        self._engine = engine
        self.state = engine.EngineState()

    def decide(self, node: str, reports: list[TenantReport], config, advisory: bool = False):
        d = self._engine.decide(self.state, {node: reports}, config,
                                advisory_nodes={node} if advisory else ())
        return list(d.directives.get(node, [])), list(d.violations), list(d.log)


class Controller:
    def __init__(self, config, engine=None, clock=time.monotonic, tls: bool = False):
        self.config = config.model_copy(deep=True)    # SetSLO edits our copy only
        self.clock = clock
        self.started = clock()
        self.tls = tls
        self.registry = Registry(self.config, clock)
        self.engine = engine if engine is not None else Engine()
        self.metrics = ControllerMetrics()
        self.lock = threading.RLock()
        self.rounds = 0
        self.log: deque[LogRecord] = deque(maxlen=20000)
        self.books = {t.name: TenantBook() for t in self.config.tenants}
        self.last_violations: dict[str, list] = {}
        self.last_reason: dict[str, str] = {}
        self.latencies: deque[float] = deque(maxlen=10000)   # seconds per round
        for t in self.config.tenants:
            self._export_slo(t.name)
            # a labelled counter is exported only once it has a child: start
            # every tenant's at 0, or Prometheus first sees a revert as a
            # series born at 1 and increase() never counts it
            self.metrics.reverts.labels(t.name)

    # -- nodes ----------------------------------------------------------------
    def register(self, info: NodeInfo, peer: str = "") -> tuple[str, float]:
        with self.lock:
            rec = self.registry.register(info)
            rec.peer = peer
            self._note(rec.name, "", "register",
                       f"node {rec.name} registered ({info.backend}, "
                       f"{info.memory_bytes} bytes, cache_ext={info.has_cache_ext})")
            self._export_nodes()
            return rec.session, self.config.control.interval_s

    def report(self, node_id: str, session: str, seq: int, reports: list[TenantReport],
               applied: list[ApplyResult]) -> tuple[list[Directive], int]:
        with self.lock:
            rec = self.registry.accept_report(node_id, session, seq, reports, applied)
            for a in applied:
                if not a.ok:
                    self._note(node_id, a.tenant, "refused-by-node", a.message)
                if not a.policy_ok:
                    self._note(node_id, a.tenant, "refused-by-node", a.policy_message)
            self._observe(reports)
            start = time.perf_counter()
            directives, violations, entries = self.engine.decide(node_id, reports, self.config,
                                                                 advisory=rec.advisory)
            took = time.perf_counter() - start
            self.metrics.loop_latency.observe(took)
            self.latencies.append(took)
            self.rounds += 1
            placed = {t.name for t in self.config.tenants_on(node_id)}
            directives = [d for d in directives if d.tenant in placed]
            self._record_directives(rec, directives)
            self.last_violations[node_id] = violations
            self.metrics.violations.labels(node_id).set(len(violations))
            for e in entries:
                self._note_engine(node_id, e)
            self._export_nodes()
            return directives, self.rounds

    def check_lost(self) -> list[str]:
        with self.lock:
            c = self.config.control
            lost = self.registry.check_lost(c.interval_s, c.lost_after_intervals)
            for name in lost:
                self._note(name, "", "lost", f"node {name} sent no report for "
                           f"{c.lost_after_intervals} intervals; its memory leaves the pool")
            if lost:
                self._export_nodes()
            return lost

    # -- bookkeeping ----------------------------------------------------------
    def _observe(self, reports):
        warmup = self.config.control.warmup_intervals
        for r in reports:
            book = self.books[r.tenant]
            book.intervals += 1
            slo = self.config.tenant(r.tenant).slo
            self.metrics.throughput.labels(r.tenant).set(r.throughput)
            if slo is None:
                book.last_met = None
                continue
            met = r.throughput >= slo.min_throughput
            book.last_met = met
            if met and book.first_met_interval is None:
                book.first_met_interval = book.intervals
            if book.intervals > warmup:
                book.counted += 1
                book.met += met
            self.metrics.slo_met.labels(r.tenant).set(1 if met else 0)
            if book.counted:
                self.metrics.slo_attainment.labels(r.tenant).set(book.met / book.counted)

    def _record_directives(self, rec, directives):
        for d in directives:
            old = rec.directives.get(d.tenant)
            reported = rec.tenants.get(d.tenant)
            before_limit = old.limit_bytes if old else (reported.limit_bytes if reported else 0)
            before_policy = old.policy if old else (reported.policy if reported else "")
            if d.limit_bytes != before_limit:
                self.metrics.decisions.labels("limit").inc()
            if d.policy != before_policy:
                # The engine's own log entry says why; only count it here.
                self.metrics.decisions.labels("policy").inc()
            rec.directives[d.tenant] = d
            self.last_reason[d.tenant] = d.reason
            self.metrics.limit.labels(d.tenant, rec.name).set(d.limit_bytes)
            self.metrics.set_policy(d.tenant, d.policy)

    def _note(self, node, tenant, kind, message, detail=None):
        self.log.append(LogRecord(self.rounds, time.time(), node, tenant, kind, message,
                                  detail or {}))

    def _note_engine(self, node, entry):
        if isinstance(entry, LogRecord):
            self.log.append(entry)
            return
        get = entry.get if isinstance(entry, dict) else (lambda k, d=None: getattr(entry, k, d))
        detail = {k: get(k) for k in ("predicted", "observed", "predicted_gain",
                                      "observed_gain", "before", "after",
                                      "predicted_miss", "observed_miss")
                  if get(k) is not None}
        if get("kind") == "watchdog":
            self.metrics.reverts.labels(get("tenant", "") or "").inc()
        self.log.append(LogRecord(int(get("round", self.rounds) or self.rounds), time.time(),
                                  get("node", node) or node, get("tenant", "") or "",
                                  get("kind", "decision") or "decision",
                                  str(get("message", "") or get("reason", "") or ""), detail))

    def _export_nodes(self):
        counts = {}
        for rec in self.registry.nodes.values():
            counts[rec.state] = counts.get(rec.state, 0) + 1
        for state in ("expected", "registered", "reporting", "lost"):
            self.metrics.nodes.labels(state).set(counts.get(state, 0))
        self.metrics.pool.set(self.registry.pool_bytes())

    def _export_slo(self, tenant):
        slo = self.config.tenant(tenant).slo
        self.metrics.slo_target.labels(tenant).set(slo.min_throughput if slo else 0)

    # -- operators ------------------------------------------------------------
    def status(self) -> pb.StatusReply:
        with self.lock:
            now = self.clock()
            nodes = []
            for rec in self.registry.nodes.values():
                since = -1.0 if rec.reports == 0 else now - rec.last_report_at
                nodes.append(pb.NodeStatus(
                    node_id=rec.name, state=rec.state, memory_bytes=rec.memory_bytes,
                    seconds_since_report=since, reports=rec.reports,
                    backend=rec.info.backend if rec.info else "",
                    has_cache_ext=bool(rec.info and rec.info.has_cache_ext), peer=rec.peer,
                    advisory=rec.advisory))
            return pb.StatusReply(nodes=nodes, rounds=self.rounds, uptime_s=now - self.started,
                                  pool_bytes=self.registry.pool_bytes(), tls=self.tls,
                                  violations=sum(len(v) for v in self.last_violations.values()))

    def tenants(self) -> pb.TenantsReply:
        with self.lock:
            out = []
            for t in self.config.tenants:
                rec = self.registry.nodes[t.node]
                r = rec.tenants.get(t.name)
                d = rec.directives.get(t.name)
                a = rec.applied.get(t.name)
                book = self.books[t.name]
                out.append(pb.TenantStatus(
                    name=t.name, node=t.node, has_slo=t.slo is not None,
                    slo_min_throughput=t.slo.min_throughput if t.slo else 0.0,
                    throughput=r.throughput if r else 0.0,
                    slo_met=bool(book.last_met),
                    limit_bytes=d.limit_bytes if d else (r.limit_bytes if r else 0),
                    policy=d.policy if d else (r.policy if r else ""),
                    priority=t.priority, miss_ratio=r.miss_ratio if r else 0.0,
                    reason=self.last_reason.get(t.name, ""), reported=r is not None,
                    running_policy=r.policy if r else "", advisory=rec.advisory,
                    applied="" if a is None else "ok" if a.ok and a.policy_ok else "refused",
                    applied_message="; ".join(m for m in (a.message, a.policy_message) if m)
                    if a else "",
                    policy_capacity_pages=r.policy_capacity_pages if r else 0,
                    policy_overflow_pages=r.policy_overflow_pages if r else 0))
            return pb.TenantsReply(tenants=out)

    def set_slo(self, tenant: str, min_throughput: float) -> pb.SLOReply:
        if not math.isfinite(min_throughput) or min_throughput < 0:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"SLO for {tenant!r}: expected a throughput >= 0, got {min_throughput}")
        with self.lock:
            spec = self._tenant(tenant)
            old = spec.slo
            spec.slo = SLO(min_throughput=min_throughput,
                           source=old.source if old is not None else "accesses")
            self._export_slo(tenant)
            self._note(spec.node, tenant, "slo", f"{tenant}: SLO set to {min_throughput:g} ops/s"
                       + (f" (was {old.min_throughput:g})" if old else ""))
            return pb.SLOReply(tenant=tenant, had_slo=old is not None,
                               previous=old.min_throughput if old else 0.0,
                               has_slo=True, current=min_throughput)

    def clear_slo(self, tenant: str) -> pb.SLOReply:
        with self.lock:
            spec = self._tenant(tenant)
            old = spec.slo
            spec.slo = None
            self._export_slo(tenant)
            self._note(spec.node, tenant, "slo", f"{tenant}: SLO cleared")
            return pb.SLOReply(tenant=tenant, had_slo=old is not None,
                               previous=old.min_throughput if old else 0.0, has_slo=False)

    def decision_log(self, limit: int = 50, tenant: str = "") -> pb.DecisionLogReply:
        with self.lock:
            if tenant:
                self._tenant(tenant)
            limit = limit or 50
            out = []
            for e in reversed(self.log):
                if tenant and e.tenant != tenant:
                    continue
                out.append(pb.LogEntry(round=e.round, time=e.time, node=e.node, tenant=e.tenant,
                                       kind=e.kind, message=e.message,
                                       detail_json=json.dumps(e.detail, default=str)
                                       if e.detail else ""))
                if len(out) >= limit:
                    break
            return pb.DecisionLogReply(entries=out)

    def _tenant(self, name):
        try:
            return self.config.tenant(name)
        except KeyError:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"unknown tenant {name!r}") from None


# -- gRPC ------------------------------------------------------------------------
def _guard(controller, context, fn):
    """Run fn(); turn refusals and malformed input into gRPC errors."""
    try:
        return fn()
    except Refused as err:
        controller.metrics.refused.labels(err.code.name).inc()
        context.abort(err.code, err.message)
    except wire.WireError as err:
        controller.metrics.refused.labels("INVALID_ARGUMENT").inc()
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


class NodeServicer(pb_grpc.NodeServicer):
    def __init__(self, controller: Controller):
        self.c = controller

    def Register(self, request, context):
        def run():
            session, interval = self.c.register(wire.node_info_from_pb(request.node),
                                                peer=context.peer())
            return pb.RegisterReply(session=session, interval_s=interval)
        return _guard(self.c, context, run)

    def Report(self, request, context):
        def run():
            # Convert (and so validate) everything before the core sees any of it.
            reports = [wire.report_from_pb(r) for r in request.reports]
            applied = [wire.apply_result_from_pb(a) for a in request.applied]
            directives, rnd = self.c.report(request.node_id, request.session, request.seq,
                                            reports, applied)
            return pb.ReportReply(directives=[wire.directive_to_pb(d) for d in directives],
                                  round=rnd)
        return _guard(self.c, context, run)


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(self, controller: Controller):
        self.c = controller

    def Status(self, request, context):
        return _guard(self.c, context, self.c.status)

    def Tenants(self, request, context):
        return _guard(self.c, context, self.c.tenants)

    def SetSLO(self, request, context):
        return _guard(self.c, context,
                      lambda: self.c.set_slo(request.tenant, request.min_throughput))

    def ClearSLO(self, request, context):
        return _guard(self.c, context, lambda: self.c.clear_slo(request.tenant))

    def DecisionLog(self, request, context):
        return _guard(self.c, context,
                      lambda: self.c.decision_log(request.limit, request.tenant))


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose metadata lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str, on_refuse=None):
        self.expected = f"Bearer {token}".encode()
        self.on_refuse = on_refuse

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get(TOKEN_HEADER, "")
        if isinstance(given, str):
            given = given.encode()
        if hmac.compare_digest(given, self.expected):
            return continuation(details)
        if self.on_refuse:
            self.on_refuse()
        return self._deny


@dataclass
class Served:
    server: grpc.Server
    controller: Controller
    port: int
    address: str
    stop_event: threading.Event

    def stop(self, grace: float | None = 0.5):
        self.stop_event.set()
        self.server.stop(grace).wait()


def _read(path, what):
    try:
        return path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read the TLS {what}: {err.strerror}") from None


def serve(config, listen: str | None = None, engine=None, max_workers: int = 8,
          watch_lost: bool = True) -> Served:
    """Start the controller's gRPC server (and its metrics endpoint when the
    config names a port).  `listen` overrides config.controller.listen;
    port 0 picks a free one (see Served.port).  watch_lost=False leaves out
    the wall-clock lost-node watch, for nodes stepped on a virtual clock."""
    keep_freed_memory()
    spec = config.controller
    address = listen or spec.listen
    token = spec.token_value()
    controller = Controller(config, engine=engine, tls=not spec.insecure)
    interceptors = []
    if token:
        interceptors.append(TokenInterceptor(
            token, on_refuse=lambda: controller.metrics.refused.labels("UNAUTHENTICATED").inc()))
    from concurrent import futures
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         interceptors=interceptors)
    pb_grpc.add_NodeServicer_to_server(NodeServicer(controller), server)
    pb_grpc.add_AdminServicer_to_server(AdminServicer(controller), server)
    creds = None
    if spec.insecure:
        log.warning("controller: TLS is OFF (insecure: true) -- plaintext gRPC on %s%s",
                    address, "" if token else ", and no token: anyone who can connect is trusted")
    else:
        creds = grpc.ssl_server_credentials(
            [(_read(spec.tls_key, "key"), _read(spec.tls_cert, "certificate"))])
    try:
        port = server.add_insecure_port(address) if creds is None else \
            server.add_secure_port(address, creds)
    except RuntimeError:    # grpc raises, rather than returning 0, on a bad address
        port = 0
    if port == 0:
        raise UserError(f"controller: cannot listen on {address}")
    server.start()
    stop = threading.Event()

    def watch():
        # Check more often than the loss horizon so a lost node is noticed
        # within one interval of crossing it.
        period = max(0.05, config.control.interval_s / 2)
        while not stop.wait(period):
            controller.check_lost()
    if watch_lost:
        threading.Thread(target=watch, name="lost-node-watch", daemon=True).start()
    if spec.metrics_port is not None:
        controller.metrics.serve(spec.metrics_port)
    host = address.rsplit(":", 1)[0]
    return Served(server, controller, port, f"{host}:{port}", stop)
