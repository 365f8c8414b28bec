"""The decision engine: one round from reports to directives.

    decide(state, reports, config) -> Decision

`reports` maps a node id to the TenantReports it sent this interval; only
live nodes are passed (a lost node's memory has left the pool), and nodes
and tenants may come and go between rounds.  `state` (EngineState) carries
the throughput models, autopilot streaks, last targets and the decision log;
decide() updates it in place and also returns it as Decision.state.

Same state + same reports + same config -> same decision: rows are taken in
sorted order and nothing is random.

A round, per tenant and then per node:
  1. add the (miss ratio, throughput) observation; refit the throughput
     model (engine/model.py);
  2. score every allowed policy at the current size; the autopilot decides
     whether to switch (engine/autopilot.py);
  3. read the curve of the policy that will be in force backwards for the
     least size meeting the SLO (and, for the record, under every policy);
  4. serve SLOs by priority, give the rest by marginal throughput on the
     hulls, move limits toward that under the step limit and hysteresis
     (engine/allocate.py);
  5. emit directives, SLO violations and log entries; fill in the observed
     effect of earlier decisions from this round's reports.
"""
from __future__ import annotations

import math

import numpy as np

from cachepilot.agent.types import Directive, TenantReport
from cachepilot.controller.engine import allocate, model
from cachepilot.controller.engine.autopilot import choose_policy
from cachepilot.controller.engine.curves import CurveBank, miss_at, size_for
from cachepilot.controller.engine.types import (Decision, EngineState, LogEntry,
                                                TenantPlan, TenantState, Violation)

__all__ = ["decide", "Decision", "EngineState", "LogEntry", "TenantPlan",
           "TenantState", "Violation"]

PAGE = 4096
OBSERVE_AFTER = 2          # reports to wait before recording an observed effect
PENDING_MAX_AGE = 100      # rounds after which an unobserved decision is dropped


def _mib(pages: float) -> str:
    return "inf" if pages == math.inf else f"{pages * PAGE / 1048576:.0f} MiB"


def _valid_observation(r: TenantReport) -> bool:
    return (r.throughput > 0 and math.isfinite(r.throughput)
            and 0.0 <= r.miss_ratio <= 1.0 and r.accesses_per_s > 0)


def _refit(ts: list[TenantState], priors: np.ndarray, ctl) -> None:
    w = max((len(t.obs_m) for t in ts), default=0)
    n = len(ts)
    om, oy = np.zeros((n, max(w, 1))), np.zeros((n, max(w, 1)))
    count = np.zeros(n, dtype=np.int64)
    for i, t in enumerate(ts):
        k = len(t.obs_m)
        if k:
            om[i, :k], oy[i, :k], count[i] = t.obs_m, t.obs_y, k
    a, b, fitted = model.fit(om, oy, count, priors[:, 0], priors[:, 1],
                             ctl.model_min_points, ctl.model_min_spread)
    for i, t in enumerate(ts):
        t.a, t.b, t.fitted = float(a[i]), float(b[i]), bool(fitted[i])


def decide(state: EngineState, reports: dict[str, list[TenantReport]], config,
           node_memory: dict[str, int] | None = None) -> Decision:
    """One decision round over the live nodes' reports (see the module doc).

    node_memory overrides the config's memory per node (e.g. the capacity
    a node registered with); nodes in neither are ignored with a note."""
    state.round += 1
    rnd = state.round
    ctl = config.control
    notes: list[str] = []
    specs = {t.name: t for t in config.tenants}
    node_specs = {n.name: n for n in config.nodes}

    # -- rows: live nodes, their known tenants, in sorted order -------------
    nodes: list[str] = []
    memory: list[float] = []
    rows: list[tuple[int, object, TenantReport]] = []
    seen: set[str] = set()
    for name in sorted(reports):
        mem = (node_memory or {}).get(name) or \
            (node_specs[name].memory_bytes if name in node_specs else None)
        if not mem:
            notes.append(f"node {name!r} is not in the config; its reports are ignored")
            continue
        ni = len(nodes)
        nodes.append(name)
        memory.append(mem / PAGE)
        for r in sorted(reports[name], key=lambda r: r.tenant):
            spec = specs.get(r.tenant)
            if spec is None:
                notes.append(f"node {name!r} reported unknown tenant {r.tenant!r}; ignored")
                continue
            if r.tenant in seen:
                notes.append(f"tenant {r.tenant!r} reported twice; the first report counts")
                continue
            seen.add(r.tenant)
            rows.append((ni, spec, r))
    nn, nt = len(nodes), len(rows)
    mem_pages = np.asarray(memory, dtype=np.float64)
    node_of = np.fromiter((ni for ni, _, _ in rows), dtype=np.int64, count=nt)

    # -- 1. throughput models -------------------------------------------------
    tstates: list[TenantState] = []
    priors = np.zeros((nt, 2))
    window = ctl.model_window
    for i, (ni, spec, r) in enumerate(rows):
        st = state.tenants.get(spec.name)
        if st is None:
            st = state.tenants[spec.name] = TenantState()
        st.node = nodes[ni]
        if _valid_observation(r):
            st.obs_m = np.append(st.obs_m, r.miss_ratio)[-window:]
            st.obs_y = np.append(st.obs_y, 1.0 / r.throughput)[-window:]
        p = spec.model or ctl.prior
        priors[i] = (p.t_hit_s / p.concurrency, p.t_miss_s / p.concurrency)
        tstates.append(st)
    _refit(tstates, priors, ctl)
    a = np.fromiter((t.a for t in tstates), dtype=np.float64, count=nt)
    b = np.fromiter((t.b for t in tstates), dtype=np.float64, count=nt)

    # -- curves: one bank row per (tenant, allowed policy) ------------------
    curves, row_tenant, row_policy = [], [], []
    first_row = [0] * (nt + 1)
    allowed_of: list[list[str]] = []
    for i, (ni, spec, r) in enumerate(rows):
        node_pol = node_specs[nodes[ni]].policies if nodes[ni] in node_specs else None
        by_policy = {c.policy: c for c in r.curves}
        allowed = spec.policies if spec.policies is not None else sorted(by_policy)
        if node_pol is not None:
            allowed = [p for p in allowed if p in node_pol]
        allowed = sorted(allowed)
        allowed_of.append(allowed)
        for p in allowed:
            c = by_policy.get(p)
            if c is not None:
                curves.append(c)
                row_tenant.append(i)
                row_policy.append(p)
        first_row[i + 1] = len(curves)
    bank = CurveBank(curves)
    row_tenant = np.asarray(row_tenant, dtype=np.int64)

    # sizes that matter per tenant, in pages
    per_node = np.maximum(np.bincount(node_of, minlength=nn), 1)
    limit_now = np.fromiter((r.limit_bytes for _, _, r in rows), dtype=np.float64, count=nt) / PAGE
    prev_target = np.fromiter(((t.target_bytes or 0) for t in tstates), dtype=np.float64,
                              count=nt) / PAGE
    equal = mem_pages[node_of] / per_node[node_of] if nt else np.zeros(0)
    ref = np.where(limit_now > 0, limit_now, np.where(prev_target > 0, prev_target, equal))
    lb_bytes = np.fromiter((max(spec.floor_bytes, r.usage_anon_bytes + ctl.anon_margin_bytes)
                            for _, spec, r in rows), dtype=np.float64, count=nt)
    lb = np.ceil(lb_bytes / PAGE)
    ub = np.fromiter(((spec.ceiling_bytes if spec.ceiling_bytes is not None else math.inf)
                      for _, spec, _ in rows), dtype=np.float64, count=nt) / PAGE
    ub = np.floor(np.minimum(ub, mem_pages[node_of] if nt else ub))
    ub = np.maximum(ub, lb)          # safety wins over a ceiling
    current = np.where(limit_now > 0, limit_now, ub)   # no limit: all it may have

    # -- 2. autopilot ---------------------------------------------------------
    if bank.n:
        score = model.throughput(a[row_tenant], b[row_tenant],
                                 miss_at(bank.xs, bank.ys, np.minimum(ref, ub)[row_tenant]))
    else:
        score = np.zeros(0)
    choices = []
    for i, (ni, spec, r) in enumerate(rows):
        st = tstates[i]
        cur = st.policy if st.policy is not None else r.policy
        s, e = first_row[i], first_row[i + 1]
        scores = dict(zip(row_policy[s:e], score[s:e].tolist()))
        choices.append(choose_policy(cur, allowed_of[i], scores, st,
                                     ctl.autopilot_threshold, ctl.autopilot_k))

    # the curve the allocation reads: the policy that will be in force
    alloc_row = np.full(nt, -1, dtype=np.int64)
    for i, (_, _, r) in enumerate(rows):
        s, e = first_row[i], first_row[i + 1]
        pols = row_policy[s:e]
        ch = choices[i]
        want = ch.policy if (ch.switched or r.policy not in pols) else r.policy
        if want in pols:
            alloc_row[i] = s + pols.index(want)
    has_curve = alloc_row >= 0

    # -- 3. SLO needs -----------------------------------------------------------
    slo = np.fromiter(((spec.slo.min_throughput if spec.slo is not None else 0.0)
                       for _, spec, _ in rows), dtype=np.float64, count=nt)
    has_slo = np.fromiter((spec.slo is not None for _, spec, _ in rows), dtype=bool, count=nt)
    if bank.n:
        m_star = model.miss_ratio_for(a[row_tenant], b[row_tenant], slo[row_tenant])
        need_rows = size_for(bank.xs, bank.ys, np.clip(m_star, -1.0, 2.0))
        need_rows = np.where(m_star < 0, np.inf, need_rows)
    else:
        need_rows = np.zeros(0)
    need = np.where(has_curve, need_rows[np.maximum(alloc_row, 0)] if bank.n else np.inf, np.inf)
    need = np.where(has_slo & (slo <= 0), 0.0, need)
    feasible = np.isfinite(need) & (np.maximum(need, lb) <= ub)
    need_c = np.where(feasible, np.maximum(need, lb), np.inf)

    # -- 4. allocation ------------------------------------------------------------
    target = np.clip(np.where(limit_now > 0, limit_now, equal), lb, ub)   # fixed rows
    fixed_use = np.bincount(node_of, weights=np.where(has_curve, 0.0, target), minlength=nn)
    order = np.arange(nt)            # rows are already in (node, name) order
    x_lo, granted = allocate.serve_slos(
        node_of, mem_pages - fixed_use, np.where(has_curve, lb, 0.0),
        need_c, has_slo & has_curve, np.fromiter((spec.priority for _, spec, _ in rows),
                                                dtype=np.float64, count=nt), order)
    cr = np.flatnonzero(has_curve)
    if len(cr):
        budget = mem_pages - fixed_use - np.bincount(node_of[cr], weights=x_lo[cr], minlength=nn)
        ar = alloc_row[cr]
        target[cr] = allocate.distribute(node_of[cr], budget, x_lo[cr], ub[cr],
                                         bank.xs[ar], bank.ys[ar], a[cr], b[cr])
    new = allocate.step_limit(node_of, mem_pages, current, target, lb, ub,
                              ctl.max_step_fraction, ctl.hysteresis)
    new = np.maximum(new, lb)

    # predictions at target, and before/after for the log
    pred_target = np.full(nt, np.nan)
    pred_new = np.full(nt, np.nan)
    pred_old = np.full(nt, np.nan)
    if len(cr):
        ar = alloc_row[cr]
        xs, ys = bank.xs[ar], bank.ys[ar]
        pred_target[cr] = model.throughput(a[cr], b[cr], miss_at(xs, ys, target[cr]))
        pred_new[cr] = model.throughput(a[cr], b[cr], miss_at(xs, ys, new[cr]))
    # before: the policy in force at the limit in force
    old_row = np.full(nt, -1, dtype=np.int64)
    for i, (_, _, r) in enumerate(rows):
        s, e = first_row[i], first_row[i + 1]
        if r.policy in row_policy[s:e]:
            old_row[i] = s + row_policy[s:e].index(r.policy)
    orr = np.flatnonzero(old_row >= 0)
    if len(orr):
        pred_old[orr] = model.throughput(a[orr], b[orr], miss_at(
            bank.xs[old_row[orr]], bank.ys[old_row[orr]], current[orr]))

    # -- 5. outputs ---------------------------------------------------------------
    log: list[LogEntry] = []
    _observe_effects(state, rows, rnd, log)
    directives: dict[str, list[Directive]] = {n: [] for n in nodes}
    violations: list[Violation] = []
    plans = {}
    hyst_b = (ctl.hysteresis * mem_pages * PAGE).tolist()
    # plain Python numbers for the per-tenant loop (numpy scalars are slow)
    L = {k: v.tolist() for k, v in dict(
        new=new, current=current, target=target, lb=lb, x_lo=x_lo, need_c=need_c,
        slo=slo, has_slo=has_slo, has_curve=has_curve, granted=granted,
        feasible=feasible, alloc_row=alloc_row, pred_target=pred_target,
        pred_new=pred_new, pred_old=pred_old, need_rows=need_rows).items()}
    for i, (ni, spec, r) in enumerate(rows):
        st, ch = tstates[i], choices[i]
        node = nodes[ni]
        n_i, cur_i, tgt_i, lb_i = L["new"][i], L["current"][i], L["target"][i], L["lb"][i]
        curve_i, slo_i = L["has_curve"][i], L["slo"][i]
        if n_i == cur_i and r.limit_bytes > 0:
            limit_b = int(r.limit_bytes)
        else:
            limit_b = max(int(n_i) * PAGE, int(lb_i) * PAGE)
        target_b = int(tgt_i) * PAGE
        why = []
        if not curve_i:
            why.append("no curve yet: limit held")
        elif L["has_slo"][i]:
            if L["granted"][i]:
                why.append(f"SLO {slo_i:g}/s needs {_mib(L['need_c'][i])} under "
                           f"{row_policy[L['alloc_row'][i]]}")
            else:
                why.append(f"SLO {slo_i:g}/s not met")
        if curve_i and tgt_i > L["x_lo"][i] + 0.5:
            why.append(f"+{_mib(tgt_i - L['x_lo'][i])} for throughput")
        if abs(tgt_i - n_i) >= 1:
            why.append(f"stepping toward {_mib(tgt_i)}")
        if ch.reason != "keep" and ch.reason:
            why.append(ch.reason)
        reason = "; ".join(why)
        directives[node].append(Directive(spec.name, limit_b, ch.policy, reason))

        p = L["pred_target"][i]
        if L["has_slo"][i] and curve_i and not (p >= slo_i * (1 - 1e-9)):
            cause = ("infeasible within its ceiling and the model"
                     if not L["feasible"][i] else "not enough memory on the node "
                     "after higher-priority SLOs")
            violations.append(Violation(spec.name, node, slo_i, p, slo_i - p, cause))

        # log what changed, with its predicted effect
        prev_limit = r.limit_bytes
        moved = limit_b != prev_limit and abs(limit_b - prev_limit) >= hyst_b[ni]
        if ch.switched or moved:
            kind = "policy" if ch.switched else "limit"
            before = r.policy if ch.switched else str(prev_limit)
            after = ch.policy if ch.switched else str(limit_b)
            pb_, pa_ = _num(L["pred_old"][i]), _num(L["pred_new"][i])
            gain = (pa_ / pb_ - 1.0) if pb_ and pa_ is not None else None
            e = LogEntry(rnd, node, spec.name, kind, before, after, reason,
                         predicted=pa_, predicted_before=pb_, predicted_gain=gain,
                         observed_before=float(r.throughput))
            log.append(e)
            state.log.append(e)
            state.pending.append([spec.name, e, OBSERVE_AFTER])

        st.policy = ch.policy
        st.target_bytes = target_b
        st.limit_bytes = limit_b
        st.last_round = rnd
        needs = {}
        if L["has_slo"][i]:
            for k in range(first_row[i], first_row[i + 1]):
                v = L["need_rows"][k]
                needs[row_policy[k]] = max(v, lb_i) * PAGE if v != math.inf else math.inf
        else:
            for k in range(first_row[i], first_row[i + 1]):
                needs[row_policy[k]] = lb_i * PAGE
        plans[spec.name] = TenantPlan(
            spec.name, node, ch.policy,
            row_policy[L["alloc_row"][i]] if curve_i else None,
            target_b, limit_b, _num(p), needs, (st.a, st.b, st.fitted))

    return Decision(rnd, directives, violations, log, plans, notes, state)


def _num(v) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _observe_effects(state: EngineState, rows, rnd: int, log: list) -> None:
    """Record, from this round's reports, the observed effect of decisions
    made OBSERVE_AFTER reports ago."""
    if not state.pending:
        return
    by_name = {spec.name: r for _, spec, r in rows}
    keep = []
    for item in state.pending:
        name, entry, wait = item
        r = by_name.get(name)
        if r is None:
            if rnd - entry.round <= PENDING_MAX_AGE:
                keep.append(item)
            continue
        wait -= 1
        if wait > 0:
            item[2] = wait
            keep.append(item)
            continue
        entry.observed = float(r.throughput)
        if entry.observed_before:
            entry.observed_gain = entry.observed / entry.observed_before - 1.0
        obs = LogEntry(rnd, entry.node, name, "observed", entry.before, entry.after,
                            f"{entry.kind} change of round {entry.round}: predicted "
                            f"{_fmt(entry.predicted)}/s, observed {entry.observed:.4g}/s",
                            predicted=entry.predicted, predicted_before=entry.predicted_before,
                            predicted_gain=entry.predicted_gain,
                            observed_before=entry.observed_before, observed=entry.observed,
                            observed_gain=entry.observed_gain, decided_round=entry.round)
        log.append(obs)
        state.log.append(obs)
    state.pending = keep


def _fmt(v):
    return "?" if v is None else f"{v:.4g}"
