"""The operators' side of the controller: status, tenants, SLOs, modes,
the decision log, what-if and consolidation plans.

A mixin of the Controller (controller/service.py): every call takes the
controller's lock, reads or changes its state, and answers with the
Admin service's reply message (the decision log is read from the store
with the lock let go: on etcd that is network calls).  A change (an SLO,
a mode) is written to the state store before it is answered, so a
restart keeps it.
"""
from __future__ import annotations

import json
import math
import time

import grpc

from cachepilot.controller.config import SLO
from cachepilot.controller.engine import trace
from cachepilot.controller.engine.whatif import WhatIfError
from cachepilot.controller.registry import Refused
from cachepilot.core.errors import UserError
from cachepilot.core.units import size
from cachepilot.protocol import cachepilot_pb2 as pb

MODES = ("recommend", "enforce")


class AdminOps:
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
                    advisory=rec.advisory, config_memory_bytes=rec.config_memory_bytes))
            return pb.StatusReply(nodes=nodes, rounds=self.rounds, uptime_s=now - self.started,
                                  pool_bytes=self.registry.pool_bytes(), tls=self.tls,
                                  violations=sum(len(v) for v in self.last_violations.values()))

    def tenants(self) -> pb.TenantsReply:
        with self.lock:
            return pb.TenantsReply(tenants=[self._tenant_status(t) for t in self.config.tenants])

    def _tenant_status(self, t) -> pb.TenantStatus:
        rec = self.registry.nodes[t.node]
        r = rec.tenants.get(t.name)
        d = rec.directives.get(t.name)
        a = rec.applied.get(t.name)
        rd = self.recommended.get(t.name)
        book = self.books[t.name]
        target = getattr(self.engine, "target_bytes", lambda _: None)(t.name)
        held_off = getattr(self.engine, "held_off", lambda _: {})(t.name)
        return pb.TenantStatus(
            name=t.name, node=t.node, has_slo=t.slo is not None,
            slo_min_throughput=t.slo.min_throughput if t.slo else 0.0,
            throughput=(r.throughput or 0.0) if r else 0.0,
            throughput_known=bool(r and r.throughput is not None),
            slo_met=bool(book.last_met),
            limit_bytes=d.limit_bytes if d else (r.limit_bytes if r else 0),
            policy=d.policy if d else (r.policy if r else ""),
            priority=t.priority, miss_ratio=r.miss_ratio if r else 0.0,
            reason=self.last_reason.get(t.name, ""), reported=r is not None,
            running_policy=r.policy if r else "", advisory=rec.advisory,
            applied="" if a is None else "ok" if a.ok and a.policy_ok else "refused",
            applied_message="; ".join(m for m in (a.message, a.policy_message) if m)
            if a else "",
            held=self.held.get(t.name, ""), mode=self.mode_of(t.name),
            recommended_limit_bytes=rd.limit_bytes if rd else 0,
            recommended_policy=rd.policy if rd else "",
            target_bytes=target or 0, held_off=sorted(held_off),
            policy_capacity_pages=r.policy_capacity_pages if r else 0,
            policy_overflow_pages=r.policy_overflow_pages if r else 0)

    # -- changes -------------------------------------------------------------------
    def set_slo(self, tenant: str, min_throughput: float) -> pb.SLOReply:
        if not math.isfinite(min_throughput) or min_throughput < 0:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"SLO for {tenant!r}: expected a throughput >= 0, got {min_throughput}")
        with self.lock:
            spec = self._tenant(tenant)
            old = spec.slo
            self.store.put_slo(tenant, min_throughput, time.time())
            spec.slo = SLO(min_throughput=min_throughput,
                           source=old.source if old is not None else "accesses")
            self._export_slo(tenant)
            self._note(spec.node, tenant, "slo", f"{tenant}: SLO set to {min_throughput:g} ops/s"
                       + (f" (was {old.min_throughput:g})" if old else ""))
            self._flush()
            return pb.SLOReply(tenant=tenant, had_slo=old is not None,
                               previous=old.min_throughput if old else 0.0,
                               has_slo=True, current=min_throughput)

    def clear_slo(self, tenant: str) -> pb.SLOReply:
        with self.lock:
            spec = self._tenant(tenant)
            old = spec.slo
            self.store.put_slo(tenant, None, time.time())
            spec.slo = None
            self._export_slo(tenant)
            self._note(spec.node, tenant, "slo", f"{tenant}: SLO cleared")
            self._flush()
            return pb.SLOReply(tenant=tenant, had_slo=old is not None,
                               previous=old.min_throughput if old else 0.0, has_slo=False)

    def set_mode(self, tenant: str, mode: str) -> pb.ModeReply:
        """The controller's mode (tenant "") or one tenant's ("" for a tenant:
        follow the controller's again)."""
        allowed = MODES if not tenant else MODES + ("",)
        if mode not in allowed:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"mode {mode!r}: expected " + " or ".join(
                              repr(m) for m in allowed))
        with self.lock:
            if tenant:
                spec = self._tenant(tenant)
                before = self.mode_of(tenant)
                self.store.put_mode(tenant, mode or None, time.time())
                spec.mode = mode or None
                node = spec.node
            else:
                before = self.config.control.mode
                self.store.put_mode("", mode, time.time())
                self.config.control.mode = mode
                node = ""
            for t in self.config.tenants:
                self.metrics.mode.labels(t.name).set(1 if self.mode_of(t.name) == "recommend"
                                                     else 0)
            after = self.mode_of(tenant) if tenant else mode
            self._note(node, tenant, "mode", f"{tenant or 'controller'}: mode {before} -> "
                       f"{after}" + (" (follows the controller)" if tenant and not mode else ""))
            self._flush()
            return pb.ModeReply(tenant=tenant, previous=before, current=after)

    # -- reading -------------------------------------------------------------------
    def decision_log(self, limit: int = 50, tenant: str = "",
                     since: float = 0.0) -> pb.DecisionLogReply:
        with self.lock:
            if tenant:
                self._tenant(tenant)
            self._flush()
        # the store may page through etcd: not under the lock every round takes
        entries = self.store.read_log(since=since or 0.0, tenant=tenant, limit=limit or 50)
        return pb.DecisionLogReply(entries=[
            pb.LogEntry(round=e.round, time=e.time, node=e.node, tenant=e.tenant,
                        kind=e.kind, message=e.message,
                        detail_json=json.dumps(e.detail, default=str) if e.detail else "")
            for e in entries])

    def explain(self, tenant: str, rnd: int = 0) -> pb.ExplainReply:
        """The trace record of `tenant` in round `rnd` (0: its latest)."""
        with self.lock:
            self._tenant(tenant)
        blob, first, last = self.store.read_trace(tenant, rnd)
        record = None
        if blob is not None:
            cols = trace.decode(blob)
            i = trace.find(cols, tenant)
            record = trace.record(cols, i) if i is not None else None
        if record is None:
            if not last:
                raise Refused(grpc.StatusCode.NOT_FOUND,
                              f"tenant {tenant!r} has no decision round yet: none is traced "
                              f"until its node reports")
            raise Refused(grpc.StatusCode.NOT_FOUND,
                          f"tenant {tenant!r}: round {rnd} is not kept (rounds "
                          f"{first}-{last} are)")
        return pb.ExplainReply(record_json=json.dumps(record), round=record["round"],
                               first_round=first, last_round=last)

    def plan(self, request: pb.PlanRequest) -> pb.PlanReply:
        """A consolidation plan from every tenant's live demand vector
        (controller/consolidate.py); with apply, its moves carried out in
        order (move_tenant), refused when it predicts a broken SLO.  The
        demands are taken under the lock, the packing (up to the MILP's
        time limit) is done without it: rounds go on meanwhile."""
        from cachepilot.controller import consolidate, planner
        if not 0 <= request.headroom <= 10 or request.hosts < 0:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          "plan: headroom must be in [0, 10] and hosts >= 0")
        with self.lock:
            config = self.config.model_copy(deep=True)
            demands = consolidate.live_demands(config, self.engine.state, self.registry,
                                               request.headroom or 0.10)
            resources = consolidate.node_resources(self.registry)
            refine = consolidate.as_allocated(config, self.engine.state, self.registry)
        try:
            result = planner.plan(config, demands=demands, resources=resources,
                                  memory_only=request.memory_only,
                                  hosts=request.hosts or None, refine=refine)
        except UserError as err:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
        applied, message = [], ""
        if request.apply:
            if result.breaks and not request.force:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"plan --apply: refused, it predicts these tenants miss "
                              f"their SLO: {', '.join(result.breaks)} (--force "
                              f"carries it out all the same)")
            with self.lock:
                for move in result.moves:
                    self.move_tenant(move["tenant"], move["to"], move["limit_bytes"],
                                     move["policy"])
                    applied.append(f"{move['tenant']}: {move['from']} -> {move['to']}")
            message = f"{len(applied)} move(s) carried out"
        return pb.PlanReply(plan_json=json.dumps(result.to_dict(), default=str),
                            applied=applied, message=message)

    def move_tenant(self, tenant: str, node: str, limit_bytes: int, policy) -> None:
        """Place `tenant` on `node` (the lock held): the config's placement
        changes and is saved, and both nodes' agents are told to register
        again, when the old one lets it go and the new one is handed it.
        Its cache stays behind; what the engine learnt of it goes along,
        but for its throughput model, which the round starts again once the
        new node reports it (engine/round.py _moved).  The engine's state
        is not touched here: a round is rebuilt from its reports and
        restores alone (a recording replays it).  The plan's `limit_bytes`
        and `policy` are its start (the sim starts it there; on a real host
        the migration makes its cgroup at that limit, as `make consolidate`
        does; the rounds take it from there)."""
        spec = self._tenant(tenant)
        if node not in self.registry.nodes:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"unknown node {node!r}")
        old = spec.node
        update = {"node": node, "initial_limit_bytes": int(limit_bytes)}
        if policy:
            update["initial_policy"] = policy
        self.config.tenants = [t.model_copy(update=update) if t.name == tenant else t
                               for t in self.config.tenants]
        self.store.put_placement(tenant, node, time.time())
        for name in (old, node):
            rec = self.registry.nodes[name]
            rec.tenants.pop(tenant, None)
            rec.directives.pop(tenant, None)
            rec.session = None           # its next report is told to register again
        self._note(node, tenant, "move", f"moved from {old} to {node} at "
                   f"{size(limit_bytes)} under {policy or 'its policy'} (consolidation plan)",
                   {"from": old, "to": node, "limit_bytes": int(limit_bytes),
                    "policy": policy})
        self._flush()

    def what_if(self, request: pb.WhatIfRequest) -> pb.WhatIfReply:
        if bool(request.tenant) == bool(request.node):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          "what-if: name a tenant, or a node with the memory it would free")
        if request.limit_bytes < 0 or request.free_bytes < 0:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "what-if: sizes must be >= 0")
        with self.lock:
            try:
                if request.tenant:
                    return self._what_if_tenant(request)
                return self._what_if_node(request)
            except WhatIfError as err:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None

    def _what_if_tenant(self, request) -> pb.WhatIfReply:
        spec = self._tenant(request.tenant)
        if request.policy and spec.policies is not None and request.policy not in spec.policies:
            raise WhatIfError(f"tenant {spec.name!r} may not run {request.policy!r} "
                              f"(allowed: {', '.join(spec.policies)})")
        report = self.registry.nodes[spec.node].tenants.get(spec.name)
        p = self.engine.what_if_tenant(spec, report, self.config,
                                       request.limit_bytes or None, request.policy or None)
        return pb.WhatIfReply(tenants=[_prediction(p)])

    def _what_if_node(self, request) -> pb.WhatIfReply:
        rec = self.registry.nodes.get(request.node)
        if rec is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"unknown node {request.node!r}")
        if not request.free_bytes:
            raise WhatIfError("what-if --node: give --free BYTES, the memory it would give up")
        pairs = self.engine.what_if_node(self.config, rec.name, list(rec.tenants.values()),
                                         rec.memory_bytes, request.free_bytes, rec.advisory)
        return pb.WhatIfReply(tenants=[_prediction(after, before) for before, after in pairs],
                              note=f"node {rec.name}: {size(rec.memory_bytes)} -> "
                                   f"{size(rec.memory_bytes - request.free_bytes)}")


def _prediction(p, before=None) -> pb.WhatIfTenant:
    msg = pb.WhatIfTenant(tenant=p.tenant, node=p.node, policy=p.policy,
                          limit_bytes=p.limit_bytes, miss_ratio=p.miss_ratio,
                          throughput=p.throughput, has_slo=p.slo is not None,
                          slo_min_throughput=p.slo or 0.0, slo_met=bool(p.slo_met),
                          model_fitted=p.fitted)
    if before is not None:
        msg.limit_before = before.limit_bytes
        msg.miss_ratio_before = before.miss_ratio
        msg.throughput_before = before.throughput
        msg.slo_met_before = bool(before.slo_met)
    return msg

