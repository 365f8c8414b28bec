"""The controller: decision rounds behind a gRPC service.

`Controller` is the transport-free core (registry, decision engine, SLO
bookkeeping, decision log, state store, metrics; the operators' side is in
controller/admin.py); `NodeServicer` and `AdminServicer` expose it over
gRPC; `serve()` starts a server with mutual TLS (a certificate per node and
one for admins, controller/auth.py), TLS with a shared token, or
plaintext on request, with a loud warning.

A decision round runs each time a node reports: memory is divided per
node, so a node's directives depend only on its own tenants, and answering
in the Report reply needs no second channel back to the agent.  Reports
that arrive while a round runs are decided together in the next one.

What a restart must not lose -- SLOs and modes set through the admin API,
node registrations and last directives, the engine's memory of each tenant
(autopilot holds among it) and the decision log -- goes to the state store
(controller/store.py) as it happens; a controller starts from the store
and from the reports.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

import grpc

from cachepilot.controller import auth, engine
from cachepilot.controller.admin import AdminOps
from cachepilot.controller.config import SLO
from cachepilot.controller.engine import keep_freed_memory
from cachepilot.controller.engine import saved as engine_saved
from cachepilot.controller.engine import whatif
from cachepilot.controller.metrics import ControllerMetrics
from cachepilot.controller.registry import Refused, Registry
from cachepilot.controller.store import (LogRecord, MemoryStore, StateStore, directive_record,
                                         open_store)
from cachepilot.core.errors import UserError, unreadable
from cachepilot.core.units import size as _mib
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.protocol import wire
from cachepilot.protocol.channel import OWNER_HEADER
from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport

log = logging.getLogger("cachepilot.controller")

# A directive is saved at once when it changed, else every SAVE_EVERY of
# its tenant's reports (service._save_round).
SAVE_EVERY = 5

LOG_MEMORY = 20000        # decision log entries kept in memory (all are in the store)


@dataclass
class TenantBook:
    """Per-tenant SLO bookkeeping from the reports (what was observed)."""
    intervals: int = 0
    counted: int = 0          # intervals after warm-up with a known throughput
    met: int = 0              # of those, intervals with the SLO met
    first_met_interval: int | None = None
    last_met: bool | None = None


class _Pending:
    """A report waiting for its round, and then its answer."""
    __slots__ = ("node_id", "session", "seq", "reports", "applied", "refused", "arrived",
                 "done", "result", "error")

    def __init__(self, node_id, session, seq, reports, applied, refused, arrived):
        self.node_id, self.session, self.seq = node_id, session, seq
        self.reports, self.applied, self.refused = reports, applied, refused
        self.arrived = arrived
        self.done = False
        self.result = None
        self.error: BaseException | None = None

    def finish(self, result=None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True


class Engine:
    """The decision engine (controller/engine) behind the calls the service makes.

    A round sees only the reporting node's reports; EngineState carries the
    models, streaks and targets across rounds, and a restarted controller
    gives it back what the store kept (restore) before the reports arrive.
    `advisory` says the node cannot swap policies (NodeRecord.advisory);
    `recommend` names its tenants in recommend mode.  decide() returns
    (directives for that node, predicted SLO violations, log entries)."""

    def __init__(self, recorder=None):
        self._engine = engine
        self.state = engine.EngineState()
        self.last_targets: dict[str, int] = {}
        self.recorder = recorder        # controller/recording.py, or None
        self.last_trace = None          # the last round's trace (engine/trace.py)

    def decide(self, node: str, reports: list[TenantReport], config, advisory: bool = False,
               recommend=(), node_memory=None):
        return self.decide_many({node: reports}, config, {node} if advisory else (),
                                recommend, node_memory)[node]

    def decide_many(self, reports: dict[str, list[TenantReport]], config, advisory=(),
                    recommend=(), node_memory=None) -> dict:
        """One round over several nodes' reports: node -> what decide()
        returns for it (every violation and log entry names its node).
        node_memory: node -> bytes, where a node has less than its config says."""
        d, self.state = self._engine.decide(self.state, reports, config,
                                            node_memory=node_memory,
                                            advisory_nodes=advisory, recommend=recommend)
        if self.recorder is not None:
            self.recorder.round(d.round, reports, config, advisory, recommend, node_memory,
                                d.directives)
        self.last_trace = d.trace
        out = {n: (list(d.directives.get(n, [])), [], []) for n in reports}
        for v in d.violations:
            if v.node in out:
                out[v.node][1].append(v)
        for e in d.log:
            if e.node in out:
                out[e.node][2].append(e)
        return out

    def restore(self, records: dict, rounds: int, config) -> None:
        if self.recorder is not None:
            self.recorder.config(config)
            self.recorder.restore(records, rounds)
        engine_saved.restore(self.state, records, rounds, config.control.model_window)

    def records(self, tenants) -> dict[str, dict]:
        return {t: engine_saved.tenant_record(self.state, t) for t in tenants
                if t in self.state.tenants}

    def target_bytes(self, tenant: str) -> int | None:
        st = self.state.tenants.get(tenant)
        return st.target_bytes if st is not None else None

    def held_off(self, tenant: str) -> dict[str, int]:
        """Policies the watchdog holds off -> the tenant round they end."""
        st = self.state.tenants.get(tenant)
        return dict(st.held_until) if st is not None else {}

    def what_if_tenant(self, spec, report, config, limit_bytes=None, policy=None):
        return whatif.tenant(self.state, spec, report, config.control, limit_bytes, policy)

    def what_if_node(self, config, node, reports, memory_bytes, free_bytes, advisory=False):
        return whatif.node_free(self.state, config, node, reports, memory_bytes, free_bytes,
                                advisory)


class Controller(AdminOps):
    def __init__(self, config, engine=None, clock=time.monotonic, tls: bool = False,
                 store: StateStore | None = None, fleet=None):
        self.config = config.model_copy(deep=True)    # SetSLO edits our copy only
        self.clock = clock
        self.started = clock()
        self.tls = tls
        self.registry = Registry(self.config, clock)
        self.engine = engine if engine is not None else Engine()
        self.store = store if store is not None else MemoryStore()
        self.fleet = fleet              # controller/fleet.py: replicas sharing the nodes
        self.serving: set[str] = set()  # nodes reported here since this replica owned them
        self._last_saved: dict[str, tuple] = {}   # what each record last saved said
        self._memory_warned: set[str] = set()     # nodes with less memory than configured
        self.metrics = ControllerMetrics()
        self.lock = threading.RLock()
        self.rounds = 0
        self.log: deque[LogRecord] = deque(maxlen=LOG_MEMORY)
        self._unsaved: list[LogRecord] = []
        self.books = {t.name: TenantBook() for t in self.config.tenants}
        self.last_violations: dict[str, list] = {}
        self.last_reason: dict[str, str] = {}
        self.recommended: dict[str, Directive] = {}   # recommend mode: not sent
        self.held: dict[str, str] = {}                # tenant -> why it is held now
        self.latencies: deque[float] = deque(maxlen=10000)   # seconds per round
        self.shed = 0                   # reports answered without a round, since shed_since
        self.shed_since: float | None = None
        # reports waiting for the lock, taken a batch at a time (report())
        self._queue: deque[_Pending] = deque()
        self._queue_lock = threading.Lock()
        self._restore()
        for t in self.config.tenants:
            self._export_slo(t.name)
            # a labelled counter is exported only once it has a child: start
            # every tenant's at 0, or Prometheus first sees a revert as a
            # series born at 1 and increase() never counts it
            self.metrics.reverts.labels(t.name)
            self.metrics.mode.labels(t.name).set(1 if self.mode_of(t.name) == "recommend"
                                                 else 0)

    # -- starting from the store ----------------------------------------------
    def _restore(self):
        saved = self.store.load(LOG_MEMORY)
        names = {t.name for t in self.config.tenants}
        self._apply_settings(saved)
        for name, reg in saved.nodes.items():
            if name in self.registry.nodes:
                self.registry.nodes[name].info = NodeInfo(**reg)
        for tenant, d in saved.directives.items():
            if tenant not in names or d.node not in self.registry.nodes:
                continue
            directive = Directive(tenant, d.limit_bytes, d.policy, d.reason)
            if d.sent:
                self.registry.nodes[d.node].directives[tenant] = directive
            else:
                self.recommended[tenant] = directive
            self.last_reason[tenant] = d.reason
        if hasattr(self.engine, "restore"):
            self.engine.restore({t: r for t, r in saved.tenants.items() if t in names},
                                saved.rounds, self.config)
        self.rounds = saved.rounds
        self.log.extend(saved.log)
        if saved.rounds or saved.slos or saved.nodes:
            where = getattr(self.store, "path", None) or "memory"
            self._note("", "", "restart",
                       f"started from the state store ({where}): round {saved.rounds}, "
                       f"{len(saved.slos)} SLO change(s), {len(saved.nodes)} node(s), "
                       f"{len(saved.tenants)} tenant record(s)")
            self._flush()

    def _apply_settings(self, saved) -> list[str]:
        """The SLOs and modes in `saved` (from the store: at a restart, or
        set through another replica) put in force; what changed, said."""
        names = {t.name for t in self.config.tenants}
        changed = []
        for tenant, value in saved.slos.items():
            if tenant not in names:
                continue
            spec = self.config.tenant(tenant)
            old = spec.slo
            if (old.min_throughput if old else None) == value:
                continue
            spec.slo = None if value is None else SLO(
                min_throughput=value, source=old.source if old else "accesses")
            changed.append(f"{tenant}: SLO " + (f"{value:g} ops/s" if value is not None
                                                else "cleared"))
        moved = {t: n for t, n in saved.placements.items()
                 if t in names and n in self.registry.nodes and self.config.tenant(t).node != n}
        if moved:
            self.config.tenants = [t.model_copy(update={"node": moved[t.name]})
                                   if t.name in moved else t for t in self.config.tenants]
            changed += [f"{t}: placed on {n}" for t, n in sorted(moved.items())]
        for scope, mode in saved.modes.items():
            if scope == "" and mode and mode != self.config.control.mode:
                self.config.control.mode = mode
                changed.append(f"controller: mode {mode}")
            elif scope in names and self.config.tenant(scope).mode != mode:
                self.config.tenant(scope).mode = mode
                changed.append(f"{scope}: mode {mode or 'of the controller'}")
        return changed

    def settings_changed(self, kvs) -> list[str]:
        """SLO and mode records changed in the shared store, as the fleet's
        watch read them (controller/fleet.py): another replica's admin
        calls, put in force here as a restart would, unless this replica
        has a newer value of its own on its way to the store."""
        with self.lock:
            changed = self._apply_settings(self.store.accept(kvs))
            for t in self.config.tenants:
                self._export_slo(t.name)
                self.metrics.mode.labels(t.name).set(1 if self.mode_of(t.name) == "recommend"
                                                     else 0)
        for what in changed:
            log.info("set through another replica: %s", what)
        return changed

    def mode_of(self, tenant: str) -> str:
        return self.config.tenant(tenant).mode_in(self.config.control)

    # -- nodes ----------------------------------------------------------------
    def _check_owner(self, node_id: str):
        """A replica serves only the nodes it owns (controller/fleet.py);
        the others are sent to their owner."""
        if self.fleet is not None and not self.fleet.owns(node_id):
            name, address = self.fleet.owner(node_id)
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"node {node_id} is served by replica {name} at {address}",
                          owner=address)

    def register(self, info: NodeInfo, peer: str = ""):
        """Returns (session, interval, the node's tenants as NodeTenants)."""
        self._check_owner(info.node_id)
        adopted = self._read_adopted(info.node_id)
        with self.lock:
            rec = self.registry.register(info)
            rec.peer = peer
            self._note(rec.name, "", "register",
                       f"node {rec.name} registered ({info.backend}, "
                       f"{_mib(info.memory_bytes)}, cache_ext={info.has_cache_ext})")
            if info.memory_bytes < rec.config_memory_bytes and \
                    rec.name not in self._memory_warned:
                # the node cannot hold what the config says: divide what it has
                self._memory_warned.add(rec.name)
                why = (f"node {rec.name} registered {_mib(info.memory_bytes)}, less than the "
                       f"{_mib(rec.config_memory_bytes)} the config gives it: its tenants "
                       f"share {_mib(info.memory_bytes)}")
                log.warning("%s", why)
                self._note(rec.name, "", "memory", why)
            self.store.put_node(rec.name, asdict(info), time.time())
            if adopted is not None and rec.name not in self.serving:
                self._adopt(rec, *adopted)
            self._flush()
            self._export_nodes()
            return (rec.session, self.config.control.interval_s,
                    [t.node_tenant() for t in self.config.tenants_on(rec.name)])

    def report(self, node_id: str, session: str, seq: int, reports: list[TenantReport],
               applied: list[ApplyResult], refused=()):
        """One node's report: returns (directives to send, round, refusals).

        Reports that arrive while a round runs wait in a queue, and the
        next thread to hold the lock takes every waiting report (one per
        node) into one engine round (_decide_batch): a node's decisions
        depend only on its own tenants, so one round over ten nodes
        decides what ten rounds would, for the fixed cost of one.  An idle
        controller still decides each report alone, at once.

        A report that waited longer than `control.shed_after` of an interval
        finds the controller behind (a replica that took over a dead one's
        nodes, a burst of registrations): it is taken and answered without
        a decision -- no directive, so the node keeps what it runs --
        unless its node has gone `shed_max_rounds` reports without one.  A
        report answered late is a report the node counts as lost; one
        answered now with nothing new costs the node a round of decisions,
        and the rounds saved let the queue drain."""
        self._check_owner(node_id)
        item = _Pending(node_id, session, seq, reports, applied, refused, self.clock())
        with self._queue_lock:
            self._queue.append(item)
        while not item.done:
            with self.lock:
                if not item.done:
                    self._run_batch(self._take_batch())
        if item.error is not None:
            raise item.error
        return item.result

    def _take_batch(self) -> list[_Pending]:
        """The waiting reports, the first of each node's (a node that sent
        two at once has the second decided in the next batch)."""
        with self._queue_lock:
            batch, later, seen = [], deque(), set()
            for it in self._queue:
                (later if it.node_id in seen else batch).append(it)
                seen.add(it.node_id)
            self._queue = later
        return batch

    def _run_batch(self, batch: list[_Pending]) -> None:
        """Take each report of `batch` in, shed those that waited too long,
        decide the rest in one round; every item is answered (result or
        error) whatever happens."""
        ready = []
        try:
            ctl = self.config.control
            for it in batch:
                try:
                    rec, reports, refusals = self.registry.accept_report(
                        it.node_id, it.session, it.seq, it.reports, it.applied, it.refused)
                except Exception as err:        # Refused: the caller's gRPC error
                    it.finish(error=err)
                    continue
                self.serving.add(it.node_id)
                self._note_refusals(it.node_id, refusals, it.applied)
                self._observe(reports)
                behind = self.clock() - it.arrived > ctl.shed_after * ctl.interval_s
                if behind and rec.reports - rec.decided_at <= ctl.shed_max_rounds:
                    self._shed_one()
                    it.finish(result=([], self.rounds, refusals))
                    continue
                if not behind and self.shed_since is not None:
                    self._note("", "", "shed", f"caught up: {self.shed} reports answered "
                               f"without a decision since it fell behind")
                    self.shed_since, self.shed = None, 0
                rec.decided_at = rec.reports
                ready.append((it, rec, reports, refusals))
            if ready:
                self._decide_batch(ready)
        except Exception as err:
            # each caller raises it (a gRPC error); the lock's holder goes on
            log.exception("a round over %d report(s) failed", len(batch))
            for it in batch:
                if not it.done:
                    it.finish(error=err)
        finally:
            for it in batch:
                if not it.done:
                    it.finish(error=RuntimeError("the controller dropped this report"))

    def _shed_one(self) -> None:
        self.shed += 1
        self.metrics.shed.inc()
        if self.shed_since is None:
            self.shed_since = self.clock()
            ctl = self.config.control
            self._note("", "", "shed", f"behind: reports that waited over "
                       f"{ctl.shed_after * ctl.interval_s:.1f} s are answered "
                       f"without a decision (each node decided at least every "
                       f"{ctl.shed_max_rounds + 1} reports)")

    def _decide_batch(self, ready) -> None:
        """One engine round over the nodes of `ready` ([(item, node record,
        reports, refusals)]), then each node's directives recorded, saved
        and answered as its own round would have been."""
        placed = {it.node_id: {t.name for t in self.config.tenants_on(it.node_id)}
                  for it, *_ in ready}
        advice = {t for names in placed.values() for t in names
                  if self.mode_of(t) == "recommend"}
        # a node that registered less memory than its config gives it: the less
        smaller = {it.node_id: rec.memory_bytes for it, rec, _, _ in ready
                   if rec.memory_bytes < rec.config_memory_bytes}
        start = time.perf_counter()
        if len(ready) > 1 and hasattr(self.engine, "decide_many"):
            decided = self.engine.decide_many(
                {it.node_id: reports for it, _, reports, _ in ready}, self.config,
                advisory={it.node_id for it, rec, _, _ in ready if rec.advisory},
                **({"recommend": advice} if advice else {}),
                **({"node_memory": smaller} if smaller else {}))
        else:
            decided = {}
            for it, rec, reports, _ in ready:
                mine = advice & placed[it.node_id]
                less = {it.node_id: smaller[it.node_id]} if it.node_id in smaller else None
                decided[it.node_id] = self.engine.decide(
                    it.node_id, reports, self.config, advisory=rec.advisory,
                    **({"recommend": mine} if mine else {}),
                    **({"node_memory": less} if less else {}))
        took = time.perf_counter() - start
        self.metrics.loop_latency.observe(took)
        self.latencies.append(took)
        self.rounds += 1
        trace = getattr(self.engine, "last_trace", None)
        if trace is not None:
            self.store.put_trace(self.rounds, trace.tenants(), trace.encode(),
                                 self.config.trace_rounds())
        every = self.config.control.plan_every_intervals
        for it, rec, reports, refusals in ready:
            node_id = it.node_id
            directives, violations, entries = decided[node_id]
            directives = [d for d in directives if d.tenant in placed[node_id]]
            sent = [d for d in directives if d.tenant not in advice]
            self._record_directives(rec, sent)
            self._record_recommendations([d for d in directives if d.tenant in advice])
            self.last_violations[node_id] = violations
            self.metrics.violations.labels(node_id).set(len(violations))
            for e in entries:
                self._note_engine(node_id, e)
            self._save_round(node_id, directives, advice)
            if self.fleet is not None and every and (rec.reports - 1) % every == 0:
                self._publish_demands(rec, reports)
            it.finish(result=(sent, self.rounds, refusals))
        self._export_nodes()

    def _publish_demands(self, rec, reports):
        """What this node's tenants need, for the leader's plan."""
        from cachepilot.controller.planner import live_demand
        limits = {r.tenant: r.limit_bytes for r in reports}
        state = getattr(self.engine, "state", None)
        out = []
        for spec in self.config.tenants_on(rec.name):
            st = state.tenants.get(spec.name) if state is not None else None
            d = live_demand(self.config, spec, st, limits.get(spec.name, 0))
            out.append({"tenant": d.tenant, "demand_bytes": d.demand_bytes,
                        "policy": d.policy, "why": d.why})
        self.fleet.publish(rec.name, out)

    def plan_fleet(self) -> dict:
        """The leader's consolidation plan over every node's published
        demands (controller/planner.py packs them); logged and put under
        the fleet's `plan` key."""
        from cachepilot.controller.planner import Demand, live_demand, plan
        published = {d["tenant"]: d for ds in self.fleet.read_demands().values() for d in ds}
        demands = []
        for spec in self.config.tenants:
            d = published.get(spec.name)
            if d is None:       # its node has not reported: its floor, for now
                demand = live_demand(self.config, spec, None, 0)
                demand.why = "not reported yet"
            else:
                demand = Demand(spec.name, spec.node, int(d["demand_bytes"]), d["policy"],
                                spec.slo.min_throughput if spec.slo is not None else None,
                                None, "engine", why=d["why"])
            demands.append(demand)
        try:
            result = plan(self.config, demands=demands, method="auto")
        except UserError as err:
            summary = {"time": time.time(), "error": str(err)}
            message = f"consolidation plan: {err}"
        else:
            summary = {"time": time.time(), "method": result.method,
                       "hosts_used": len(result.hosts_used), "hosts": len(self.config.nodes),
                       "lower_bound_hosts": result.lower_bound_hosts,
                       "memory_freed_bytes": result.memory_freed_bytes,
                       "tenants_moved": len(result.moved), "tenants": len(demands),
                       "reported": len(published), "seconds": round(result.seconds, 3)}
            message = (f"consolidation plan ({result.method}, {result.seconds:.2f} s): "
                       f"{len(result.hosts_used)} of {len(self.config.nodes)} hosts would "
                       f"hold every tenant's demand ({len(published)} of {len(demands)} "
                       f"reported); {len(result.moved)} tenant(s) would move, freeing "
                       f"{result.memory_freed_bytes >> 20} MiB")
        self.fleet.put_plan(summary)
        with self.lock:
            self._note("", "", "plan", message, summary)
            self._flush()
        return summary

    def fleet_changed(self, members):
        """The replicas changed: the nodes that moved away are no longer
        served here (if one comes back, what another replica learnt of it
        meanwhile is taken from the store)."""
        with self.lock:
            if self.fleet is not None:
                self.serving = {n for n in self.serving if self.fleet.owns(n)}

    def _read_adopted(self, node: str):
        """For a node this replica does not serve yet, (its tenants' saved
        state or None, why not): read from the shared store before the
        lock is taken, as it asks etcd.  None for a node served already."""
        with self.lock:
            if self.fleet is None or node not in self.registry.nodes or node in self.serving:
                return None
            names = [t.name for t in self.config.tenants_on(node)]
        if not self.fleet.reachable:    # not a timeout for each node registering
            return None, f"{self.fleet.etcd.url} is unreachable"
        try:
            return self.store.load_tenants(names), ""
        except UserError as err:
            return None, str(err)

    def _adopt(self, rec, saved, why):
        """A node registering with this replica may come from another (one
        that died, or the owner before a replica joined): take its
        tenants' last directives and the engine's memory of them (autopilot
        streaks, watchdog holds, the throughput model) from the shared
        store, as they were written by whichever replica served it last
        (`saved`, read by _read_adopted).  What this replica last saved of
        their directives is forgotten: if it served the node before, the
        store has held another's since, so its own are written again at the
        next report, not up to SAVE_EVERY reports later."""
        for t in self.config.tenants_on(rec.name):
            self._last_saved.pop("d:" + t.name, None)
        if saved is None:               # etcd away: start them from the reports
            self._note(rec.name, "", "adopt", f"node {rec.name}: its tenants' saved state "
                       f"could not be read ({why}); they start from the reports")
            return
        if saved.tenants and hasattr(self.engine, "restore"):
            self.engine.restore(saved.tenants, self.rounds, self.config)
        for tenant, d in saved.directives.items():
            if d.node == rec.name and d.sent:
                rec.directives[tenant] = Directive(tenant, d.limit_bytes, d.policy, d.reason)
                self.last_reason[tenant] = d.reason
        if saved.tenants or saved.directives:
            self._note(rec.name, "", "adopt",
                       f"node {rec.name}: took {len(saved.tenants)} tenant record(s) and "
                       f"{len(saved.directives)} directive(s) from the shared store")

    def check_lost(self) -> list[str]:
        with self.lock:
            c = self.config.control
            lost = self.registry.check_lost(c.interval_s, c.lost_after_intervals)
            if self.fleet is not None:
                # the registry marks every silent node lost, another
                # replica's too (its memory is not in this replica's pool);
                # only the owner logs it
                lost = [n for n in lost if self.fleet.owns(n)]
            for name in lost:
                self._note(name, "", "lost", f"node {name} sent no report for "
                           f"{c.lost_after_intervals} intervals; its memory leaves the pool")
            if lost:
                self._flush()
                self._export_nodes()
            return lost

    # -- bookkeeping ----------------------------------------------------------
    def _note_refusals(self, node_id, refusals, applied):
        for tenant, why in refusals:
            self.metrics.refused_entries.labels(node_id).inc()
            self._note(node_id, tenant, "refused", f"{tenant}: report entry refused: {why}")
        for a in applied:
            if not a.ok:
                self._note(node_id, a.tenant, "refused-by-node", a.message)
            if not a.policy_ok:
                self._note(node_id, a.tenant, "refused-by-node", a.policy_message)

    def _observe(self, reports):
        warmup = self.config.control.warmup_intervals
        for r in reports:
            book = self.books[r.tenant]
            book.intervals += 1
            slo = self.config.tenant(r.tenant).slo
            held = r.held_reason
            self.held[r.tenant] = held
            self.metrics.held.labels(r.tenant).set(1 if held else 0)
            if r.throughput is None:
                # unknown: counted neither met nor missed
                self.metrics.throughput.labels(r.tenant).set(float("nan"))
                book.last_met = None
                continue
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
            self.recommended.pop(d.tenant, None)
            self.last_reason[d.tenant] = d.reason
            self.metrics.limit.labels(d.tenant, rec.name).set(d.limit_bytes)
            self.metrics.set_policy(d.tenant, d.policy)

    def _record_recommendations(self, directives):
        for d in directives:
            self.recommended[d.tenant] = d
            self.last_reason[d.tenant] = d.reason
            self.metrics.recommended_limit.labels(d.tenant).set(d.limit_bytes)
            self.metrics.set_policy(d.tenant, d.policy, recommended=True)

    def _save_round(self, node_id, directives, advice):
        """The round's directives, each when its node, policy or whether it
        was sent changed or SAVE_EVERY reports since it was last saved (a
        limit is in the node's next report anyway), and the engine's
        records of their tenants, every round."""
        saved = {}
        for d in directives:
            rec = directive_record(node_id, d, self.rounds, d.tenant not in advice)
            # a limit is in the node's next report anyway: saved with the rest
            if self._changed("d:" + d.tenant, d.tenant, (rec.node, rec.policy, rec.sent)):
                saved[d.tenant] = rec
        # the engine's records, every round: a restart must decide as the
        # controller that kept running would (engine/saved.py)
        records = self.engine.records([d.tenant for d in directives]) \
            if hasattr(self.engine, "records") else {}
        self.store.write_round(self.rounds, saved, records, self._unsaved)
        self._unsaved = []

    def _changed(self, key, tenant, what) -> bool:
        """Whether `what` (a record of `tenant`) must be saved this round,
        and if so remember it as saved."""
        n = self.books[tenant].intervals
        last = self._last_saved.get(key)
        if last is not None and last[0] == what and n - last[1] < SAVE_EVERY:
            return False
        self._last_saved[key] = (what, n)
        return True

    def _flush(self):
        """Log entries made outside a round go to the store at once."""
        if self._unsaved:
            self.store.append_log(self._unsaved)
            self._unsaved = []

    def _append(self, record: LogRecord):
        self.log.append(record)
        self._unsaved.append(record)

    def _note(self, node, tenant, kind, message, detail=None):
        self._append(LogRecord(self.rounds, time.time(), node, tenant, kind, message,
                               detail or {}))

    def _note_engine(self, node, entry):
        if isinstance(entry, LogRecord):
            self._append(entry)
            return
        get = entry.get if isinstance(entry, dict) else (lambda k, d=None: getattr(entry, k, d))
        detail = {k: get(k) for k in ("predicted", "observed", "predicted_gain",
                                      "observed_gain", "before", "after",
                                      "predicted_miss", "observed_miss")
                  if get(k) is not None}
        if get("kind") == "watchdog":
            self.metrics.reverts.labels(get("tenant", "") or "").inc()
        self._append(LogRecord(int(get("round", self.rounds) or self.rounds), time.time(),
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

    def _tenant(self, name):
        try:
            return self.config.tenant(name)
        except KeyError:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"unknown tenant {name!r}") from None

    def close(self):
        with self.lock:
            self._flush()
            self.store.close()


# -- gRPC ------------------------------------------------------------------------
def _guard(controller, context, fn, check=None):
    """Check who calls, then run fn(); turn refusals and malformed input
    into gRPC errors."""
    try:
        if check is not None:
            check()
        return fn()
    except Refused as err:
        controller.metrics.refused.labels(err.code.name).inc()
        if err.owner:
            context.set_trailing_metadata(((OWNER_HEADER, err.owner),))
        context.abort(err.code, err.message)
    except wire.WireError as err:
        controller.metrics.refused.labels("INVALID_ARGUMENT").inc()
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


def _reports_from_pb(msgs):
    """(reports, [(tenant, why)]) : each entry converted on its own, so one
    malformed entry refuses that entry only."""
    reports, refused = [], []
    for msg in msgs:
        try:
            reports.append(wire.report_from_pb(msg))
        except wire.WireError as err:
            refused.append((msg.tenant or "?", str(err)))
    return reports, refused


class NodeServicer(pb_grpc.NodeServicer):
    def __init__(self, controller: Controller, mutual_tls: bool = False):
        self.c = controller
        self.mutual = mutual_tls

    def _as_node(self, context, node_id):
        return (lambda: auth.require_node(context, node_id)) if self.mutual else None

    def Register(self, request, context):
        def run():
            session, interval, tenants = self.c.register(wire.node_info_from_pb(request.node),
                                                         peer=context.peer())
            return pb.RegisterReply(session=session, interval_s=interval, assigns_tenants=True,
                                    tenants=[wire.tenant_to_pb(t) for t in tenants])
        return _guard(self.c, context, run, self._as_node(context, request.node.node_id))

    def Report(self, request, context):
        def run():
            # Convert (and so validate) everything before the core sees any of it.
            reports, refused = _reports_from_pb(request.reports)
            applied = [wire.apply_result_from_pb(a) for a in request.applied]
            directives, rnd, refusals = self.c.report(request.node_id, request.session,
                                                      request.seq, reports, applied, refused)
            return pb.ReportReply(directives=[wire.directive_to_pb(d) for d in directives],
                                  round=rnd, refused=[pb.TenantRefusal(tenant=t, reason=w)
                                                      for t, w in refusals])
        return _guard(self.c, context, run, self._as_node(context, request.node_id))


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(self, controller: Controller, mutual_tls: bool = False):
        self.c = controller
        self.mutual = mutual_tls

    def _call(self, context, fn):
        return _guard(self.c, context, fn,
                      (lambda: auth.require_admin(context)) if self.mutual else None)

    def Explain(self, request, context):
        return self._call(context, lambda: self.c.explain(request.tenant, request.round))

    def Status(self, request, context):
        return self._call(context, self.c.status)

    def Tenants(self, request, context):
        return self._call(context, self.c.tenants)

    def SetSLO(self, request, context):
        return self._call(context, lambda: self.c.set_slo(request.tenant,
                                                          request.min_throughput))

    def ClearSLO(self, request, context):
        return self._call(context, lambda: self.c.clear_slo(request.tenant))

    def DecisionLog(self, request, context):
        return self._call(context, lambda: self.c.decision_log(request.limit, request.tenant,
                                                               request.since))

    def WhatIf(self, request, context):
        return self._call(context, lambda: self.c.what_if(request))

    def Plan(self, request, context):
        return self._call(context, lambda: self.c.plan(request))

    def SetMode(self, request, context):
        return self._call(context, lambda: self.c.set_mode(request.tenant, request.mode))


@dataclass
class Served:
    server: grpc.Server
    controller: Controller
    port: int
    address: str
    stop_event: threading.Event

    def stop(self, grace: float | None = 0.5):
        self.stop_event.set()
        if self.controller.fleet is not None:
            self.controller.fleet.stop()
        self.server.stop(grace).wait()
        self.controller.close()
        recorder = getattr(self.controller.engine, "recorder", None)
        if recorder is not None:
            recorder.close()


def _read(path, what):
    try:
        return path.read_bytes()
    except OSError as err:
        raise UserError(unreadable(path, f"TLS {what}", err)) from None


def _credentials(spec, address, token):
    """The server's credentials (None: plaintext), saying loudly when TLS is off."""
    if spec.insecure:
        log.warning("controller: TLS is OFF (insecure: true) -- plaintext gRPC on %s%s",
                    address, "" if token else ", and no token: anyone who can connect is trusted")
        return None
    pair = [(_read(spec.tls_key, "key"), _read(spec.tls_cert, "certificate"))]
    if spec.mutual_tls:
        return grpc.ssl_server_credentials(pair, root_certificates=_read(spec.client_ca,
                                                                         "client CA"),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials(pair)


WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]", "*")


def _check_advertised(spec, address):
    """A replica on etcd is named, and has its nodes sent, by its
    advertised address: a wildcard listen address (the same on every
    host) cannot be it."""
    if spec.store != "sqlite" and not spec.advertise and \
            address.rsplit(":", 1)[0] in WILDCARD_HOSTS:
        raise UserError(f"controller: listening on {address} (every address) with an etcd "
                        "store needs controller.advertise (or --advertise HOST:PORT): the "
                        "address the other replicas send this one's nodes to, and its name "
                        "among them unless controller.replica (--replica) gives one")


def _join_fleet(config, address, port, server, controller):
    """This process as one of the replicas sharing the fleet's nodes
    (controller/fleet.py); a replica that cannot join does not serve."""
    from cachepilot.controller.etcd import Etcd
    from cachepilot.controller.fleet import Fleet
    from cachepilot.controller.store_etcd import SETTINGS
    spec = config.controller
    host = address.rsplit(":", 1)[0]
    advertise = spec.advertise or f"{host}:{port}"
    follows = hasattr(controller.store, "accept")       # the shared store's records
    try:
        return Fleet(Etcd(spec.store), spec.replica or advertise, advertise,
                     spec.replica_ttl_s or max(1.0, config.control.interval_s / 2),
                     on_change=controller.fleet_changed, watch=SETTINGS if follows else (),
                     on_records=controller.settings_changed).start()
    except UserError as err:        # etcd away, or the name is another's
        server.stop(0)
        controller.close()
        raise UserError(f"controller: cannot join the replicas at {spec.store}: {err}") \
            from None


def plan_loop(controller, stop: threading.Event, every: float) -> None:
    """The leader's consolidation plan every `every` seconds until `stop`.
    A plan that fails is logged (with its traceback when it is not etcd
    away) and the next period plans again: the thread never dies quietly."""
    while not stop.wait(every):
        if not controller.fleet.leading:
            continue
        try:
            controller.plan_fleet()
        except UserError as err:            # etcd away: the next period
            log.warning("consolidation plan: %s", err)
        except Exception:                   # noqa: BLE001 -- see the docstring
            log.exception("consolidation plan failed; planning again in %g s", every)


def _start_watches(config, controller, stop: threading.Event, watch_lost: bool) -> None:
    """The service's background threads: the lost-node watch (checking
    more often than the loss horizon, so a lost node is noticed within one
    interval of crossing it) and, on a fleet, the leader's planning."""
    def watch():
        period = max(0.05, config.control.interval_s / 2)
        while not stop.wait(period):
            controller.check_lost()
    if watch_lost:
        threading.Thread(target=watch, name="lost-node-watch", daemon=True).start()
    every = config.control.plan_every_intervals * config.control.interval_s
    if controller.fleet is not None and every > 0:
        threading.Thread(target=plan_loop, args=(controller, stop, every), name="fleet-plan",
                         daemon=True).start()


def serve(config, listen: str | None = None, engine=None, max_workers: int = 8,
          watch_lost: bool = True, store: StateStore | None = None,
          record: str | None = None) -> Served:
    """Start the controller's gRPC server (and its metrics endpoint when the
    config names a port).  `listen` overrides config.controller.listen;
    port 0 picks a free one (see Served.port).  watch_lost=False leaves out
    the wall-clock lost-node watch, for nodes stepped on a virtual clock.
    `store`: the state store (default: the config's, controller/store.py).
    `record`: a folder to keep a recording of every round in
    (controller/recording.py)."""
    keep_freed_memory()
    if record is not None:
        from cachepilot.controller.recording import Recorder
        if engine is not None:
            raise ValueError("serve: record goes with the default engine")
        engine = Engine(recorder=Recorder(record))
    spec = config.controller
    address = listen or spec.listen
    _check_advertised(spec, address)
    token = None if spec.mutual_tls else spec.token_value()
    creds = _credentials(spec, address, token)
    store = store if store is not None else open_store(config)
    controller = Controller(config, engine=engine, tls=not spec.insecure, store=store)
    interceptors = []
    if token:
        interceptors.append(auth.TokenInterceptor(
            token, on_refuse=lambda: controller.metrics.refused.labels("UNAUTHENTICATED").inc()))
    from concurrent import futures
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         interceptors=interceptors)
    pb_grpc.add_NodeServicer_to_server(NodeServicer(controller, spec.mutual_tls), server)
    pb_grpc.add_AdminServicer_to_server(AdminServicer(controller, spec.mutual_tls), server)
    try:
        port = server.add_insecure_port(address) if creds is None else \
            server.add_secure_port(address, creds)
    except RuntimeError:    # grpc raises, rather than returning 0, on a bad address
        port = 0
    if port == 0:
        controller.close()
        raise UserError(f"controller: cannot listen on {address}")
    if spec.store != "sqlite":
        # joined before serving: no node is taken that another replica owns
        controller.fleet = _join_fleet(config, address, port, server, controller)
    server.start()
    stop = threading.Event()
    _start_watches(config, controller, stop, watch_lost)
    if spec.metrics_port is not None:
        controller.metrics.serve(spec.metrics_port)
    host = address.rsplit(":", 1)[0]
    return Served(server, controller, port, f"{host}:{port}", stop)
