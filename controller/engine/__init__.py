"""The decision engine: one round from reports to directives.

    decide(state, reports, config) -> Decision

`reports` maps a node id to the TenantReports it sent this interval; only
live nodes are passed (a lost node's memory has left the pool), and nodes
and tenants may come and go between rounds.  `state` (EngineState) carries
the throughput models, autopilot streaks, last targets and the decision log;
decide() updates it in place and also returns it as Decision.state.

The policy in force is the one the node reports running (read back from the
kernel), not the one last directed: a directive that was refused or not yet
applied changes nothing.  On an advisory node -- one that cannot swap
policies, such as a host whose kernel lacks cache_ext -- the engine still
chooses and logs the policy it would run, and keeps its autopilot streak on
that recommendation (so it does not recommend the same switch again every
K rounds), but sizes the tenant on the curve of the policy actually running.

Same state + same reports + same config -> same decision: rows are taken in
sorted order and nothing is random.

A round, per tenant and then per node:
  1. add the (miss ratio, throughput) observation; refit the throughput
     model (engine/model.py);
  2. judge the last switch against what happened (engine/watchdog.py) and
     switch back if it did worse than promised; otherwise score every
     allowed policy at the current size and let the autopilot decide whether
     to switch (engine/autopilot.py);
  3. read the curve of the policy that will be in force backwards for the
     least size meeting the SLO (and, for the record, under every policy);
  4. serve SLOs by priority (one no size meets: toward where its curve
     flattens), give the rest by marginal throughput on the hulls (summed
     as ops/s, or relative to each tenant's equal share: control.objective),
     move limits toward that under the step limit and hysteresis
     (engine/allocate.py);
  5. emit directives, SLO violations and log entries; fill in the observed
     effect of earlier decisions from this round's reports.
"""
from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from cachepilot.protocol.types import Directive, TenantReport
from cachepilot.controller.engine import allocate, model, watchdog
from cachepilot.controller.engine.autopilot import PolicyChoice, choose_policy
from cachepilot.controller.engine.curves import CurveBank
from cachepilot.controller.engine.types import (Decision, EngineState, LogEntry,
                                                Observations, TenantPlan, TenantState,
                                                Violation)

__all__ = ["decide", "Decision", "EngineState", "LogEntry", "TenantPlan",
           "TenantState", "Violation"]

PAGE = 4096


def _keep_freed_memory() -> None:
    """A round allocates a few dozen arrays of megabytes and frees them.
    glibc hands blocks that large back to the kernel on free and maps them
    again on the next round, so every round pays page faults for memory it
    just had -- a third of the round's time on a busy host.  Let the heap
    keep them (up to 256 MiB of free heap; blocks up to 32 MiB from the
    heap).  Process-wide, harmless elsewhere; a no-op without glibc."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):
        pass


_keep_freed_memory()

FLAT = 0.01                # miss ratio within which a curve has stopped improving
OBSERVE_AFTER = 2          # reports to wait before recording an observed effect
PENDING_MAX_AGE = 100      # rounds after which an unobserved decision is dropped


def _refit(obs, slots, priors, ctl):
    a, b, fitted = model.fit(obs.m[slots], obs.y[slots], obs.count[slots],
                             priors[:, 0], priors[:, 1],
                             ctl.model_min_points, ctl.model_min_spread)
    return a, b, fitted


def decide(state: EngineState, reports: dict[str, list[TenantReport]], config,
           node_memory: dict[str, int] | None = None,
           advisory_nodes: Collection[str] = ()) -> Decision:
    """One decision round over the live nodes' reports (see the module doc).

    node_memory overrides the config's memory per node (e.g. the capacity
    a node registered with); nodes in neither are ignored with a note.
    advisory_nodes names the nodes that cannot swap policies (the service
    knows from their registration); every other node is taken to swap."""
    state.round += 1
    rnd = state.round
    ctl = config.control
    notes: list[str] = []
    specs, node_specs = _indexes(state, config)

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
    if state.obs is None or state.obs.window != ctl.model_window:
        state.obs = Observations(ctl.model_window)
        for st in state.tenants.values():
            st.slot = -1
    obs = state.obs
    tstates: list[TenantState] = []
    priors = np.zeros((nt, 2))
    for i, (ni, spec, r) in enumerate(rows):
        st = state.tenants.get(spec.name)
        if st is None:
            st = state.tenants[spec.name] = TenantState()
        if st.slot < 0:
            st.slot = obs.new_slot()
        st.node = nodes[ni]
        st.running = r.policy
        st.rounds += 1
        p = spec.model or ctl.prior
        priors[i] = (p.t_hit_s / p.concurrency, p.t_miss_s / p.concurrency)
        tstates.append(st)
    slots = np.fromiter((t.slot for t in tstates), dtype=np.int64, count=nt)
    thr_obs = np.fromiter((r.throughput for _, _, r in rows), dtype=np.float64, count=nt)
    m_obs = np.fromiter((r.miss_ratio for _, _, r in rows), dtype=np.float64, count=nt)
    acc = np.fromiter((r.accesses_per_s for _, _, r in rows), dtype=np.float64, count=nt)
    valid = (thr_obs > 0) & np.isfinite(thr_obs) & (m_obs >= 0) & (m_obs <= 1) & (acc > 0)
    obs.add(slots[valid], m_obs[valid], 1.0 / thr_obs[valid])
    a, b, fitted = _refit(obs, slots, priors, ctl)
    for t, ai, bi, fi in zip(tstates, a.tolist(), b.tolist(), fitted.tolist()):
        t.a, t.b, t.fitted = ai, bi, fi

    # -- curves: one bank row per (tenant, allowed policy) ------------------
    curves, row_tenant, row_policy = [], [], []
    row_of: list[dict[str, int]] = []          # per tenant: policy -> bank row
    allowed_of: list[list[str]] = []
    # per tenant: the bank row of the running policy's curve, allowed or not
    # (it is what the tenant gets until something else runs)
    run_row = np.full(nt, -1, dtype=np.int64)
    node_pol = [set(node_specs[n].policies) if n in node_specs and
                node_specs[n].policies is not None else None for n in nodes]
    for i, (ni, spec, r) in enumerate(rows):
        by_policy = {c.policy: c for c in r.curves}
        allowed = sorted(spec.policies if spec.policies is not None else by_policy)
        if node_pol[ni] is not None:
            allowed = [p for p in allowed if p in node_pol[ni]]
        allowed_of.append(allowed)
        mine = {}
        for p in allowed:
            c = by_policy.get(p)
            if c is not None:
                mine[p] = len(curves)
                curves.append(c)
                row_tenant.append(i)
                row_policy.append(p)
        row_of.append(mine)
        if r.policy in mine:
            run_row[i] = mine[r.policy]
        elif r.policy in by_policy:
            run_row[i] = len(curves)
            curves.append(by_policy[r.policy])
            row_tenant.append(i)
            row_policy.append(r.policy)
    bank = CurveBank(curves, ctl.curve_error_sigmas)
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
                                 bank.miss_at(np.arange(bank.n), np.minimum(ref, ub)[row_tenant]))
    else:
        score = np.zeros(0)
    # ... and the curve the allocation reads: the policy that will be in
    # force (the new one when switching, else the one reported running; on
    # an advisory node always the one running)
    advisory = [n in advisory_nodes for n in nodes]
    choices: list[PolicyChoice] = []
    verdicts: list[watchdog.Verdict | None] = []
    before_pol: list[str] = []               # the policy a switch leaves
    alloc_row = np.full(nt, -1, dtype=np.int64)
    score_l = score.tolist()
    current_l = current.tolist()
    for i, (ni, spec, r) in enumerate(rows):
        mine = row_of[i]
        cur, ch, verdict = _choose(tstates[i], r, advisory[ni], allowed_of[i],
                                   {p: score_l[k] for p, k in mine.items()},
                                   current_l[i], ctl)
        choices.append(ch)
        verdicts.append(verdict)
        before_pol.append(cur)
        k_run = int(run_row[i])
        if advisory[ni]:
            alloc_row[i] = k_run
        elif ch.switched or k_run < 0:
            alloc_row[i] = mine.get(ch.policy, -1)
        else:
            alloc_row[i] = k_run
    has_curve = alloc_row >= 0

    # -- 3. SLO needs -----------------------------------------------------------
    slo = np.fromiter(((spec.slo.min_throughput if spec.slo is not None else 0.0)
                       for _, spec, _ in rows), dtype=np.float64, count=nt)
    has_slo = np.fromiter((spec.slo is not None for _, spec, _ in rows), dtype=bool, count=nt)
    if bank.n:
        m_star = model.miss_ratio_for(a[row_tenant], b[row_tenant], slo[row_tenant])
        need_rows = bank.size_for(np.arange(bank.n), m_star)
        need_rows = np.where(m_star < 0, np.inf, need_rows)
    else:
        need_rows = np.zeros(0)
    need = np.where(has_curve, need_rows[np.maximum(alloc_row, 0)] if bank.n else np.inf, np.inf)
    need = np.where(has_slo & (slo <= 0), 0.0, need)
    feasible = np.isfinite(need) & (np.maximum(need, lb) <= ub)
    need_c = np.where(feasible, np.maximum(need, lb), np.inf)
    # ... and with headroom, read on the same curve (only the rows used)
    need_safe = need_c.copy()
    hr = np.flatnonzero(feasible & has_slo & (slo > 0))
    if len(hr) and ctl.slo_headroom > 0:
        m_safe = model.miss_ratio_for(a[hr], b[hr], slo[hr] * (1 + ctl.slo_headroom))
        safe = bank.size_for(alloc_row[hr], m_safe)
        safe = np.where(m_safe < 0, np.inf, safe)
        need_safe[hr] = np.where(np.isfinite(safe), np.clip(safe, need_c[hr], ub[hr]),
                                 need_c[hr])

    # ... and for an SLO no size meets, the size that comes closest: where
    # the curve gets within FLAT of its lowest miss ratio
    need_best = np.full(nt, np.inf)
    hopeless = np.flatnonzero(has_slo & has_curve & (slo > 0) & ~feasible)
    if len(hopeless):
        rows_h = alloc_row[hopeless]
        floor_m = bank.ys[bank.end(rows_h)]
        need_best[hopeless] = np.clip(bank.size_for(rows_h, floor_m + FLAT),
                                      lb[hopeless], ub[hopeless])

    # -- 4. allocation ------------------------------------------------------------
    target = np.clip(np.where(limit_now > 0, limit_now, equal), lb, ub)   # fixed rows
    fixed_use = np.bincount(node_of, weights=np.where(has_curve, 0.0, target), minlength=nn)
    order = np.arange(nt)            # rows are already in (node, name) order
    x_lo, granted = allocate.serve_slos(
        node_of, mem_pages - fixed_use, np.where(has_curve, lb, 0.0),
        need_c, has_slo & has_curve, np.fromiter((spec.priority for _, spec, _ in rows),
                                                dtype=np.float64, count=nt), order,
        need_safe, need_best)
    over = np.bincount(node_of, weights=lb, minlength=nn) > mem_pages
    for ni in np.flatnonzero(over).tolist():
        notes.append(f"node {nodes[ni]!r}: floors and anonymous memory (+ margin) add up to "
                     f"more than the node; limits stay at those safety bounds")
    cr = np.flatnonzero(has_curve)
    if len(cr):
        budget = mem_pages - fixed_use - np.bincount(node_of[cr], weights=x_lo[cr], minlength=nn)
        pxs, pys = bank.padded(alloc_row[cr])
        a_w, b_w = a[cr], b[cr]
        if ctl.objective == "relative":
            # gains in units of the tenant's own throughput at an equal
            # share: throughput(k a, k b, m) = throughput(a, b, m) / k
            t_eq = model.throughput(a_w, b_w, bank.miss_at(alloc_row[cr], equal[cr]))
            k = np.where(np.isfinite(t_eq) & (t_eq > 0), t_eq, 1.0)
            a_w, b_w = a_w * k, b_w * k
        target[cr] = allocate.distribute(node_of[cr], budget, x_lo[cr], ub[cr],
                                         pxs, pys, a_w, b_w)
    new = allocate.step_limit(node_of, mem_pages, current, target, lb, ub,
                              ctl.max_step_fraction, ctl.hysteresis)
    new = np.maximum(new, lb)

    # predictions at target, and before/after for the log
    pred_target = np.full(nt, np.nan)
    pred_new = np.full(nt, np.nan)
    pred_old = np.full(nt, np.nan)
    if len(cr):
        ar = alloc_row[cr]
        pred_target[cr] = model.throughput(a[cr], b[cr], bank.miss_at(ar, target[cr]))
        pred_new[cr] = model.throughput(a[cr], b[cr], bank.miss_at(ar, new[cr]))
    # before: the policy running at the limit in force
    orr = np.flatnonzero(run_row >= 0)
    if len(orr):
        pred_old[orr] = model.throughput(a[orr], b[orr],
                                         bank.miss_at(run_row[orr], current[orr]))

    # -- 5. outputs ---------------------------------------------------------------
    log: list[LogEntry] = []
    _observe_effects(state, rows, rnd, log)
    directives: dict[str, list[Directive]] = {n: [] for n in nodes}
    violations: list[Violation] = []
    plan_rows = []
    hyst_b = (ctl.hysteresis * mem_pages * PAGE).tolist()
    # plain Python numbers for the per-tenant loop (numpy scalars are slow)
    need_rows_l = need_rows.tolist()
    pred_old_l, pred_new_l = pred_old.tolist(), pred_new.tolist()
    # sizes as whole MiB for the reasons, formatted once, not per tenant
    to_mib = PAGE / 1048576
    need_mib = np.round(np.where(np.isfinite(need_c), need_c, 0) * to_mib).astype(np.int64)
    extra_mib = np.round((target - x_lo) * to_mib).astype(np.int64)
    target_mib = np.round(target * to_mib).astype(np.int64)
    per_tenant = zip(rows, tstates, choices, new.tolist(), current.tolist(), target.tolist(),
                     lb.tolist(), x_lo.tolist(), slo.tolist(), has_slo.tolist(),
                     has_curve.tolist(), granted.tolist(), feasible.tolist(),
                     alloc_row.tolist(), pred_target.tolist(), need_mib.tolist(),
                     extra_mib.tolist(), target_mib.tolist(), row_of)
    for i, ((ni, spec, r), st, ch, n_i, cur_i, tgt_i, lb_i, xlo_i, slo_i, slo_on, curve_i,
            granted_i, feasible_i, arow, p, need_m, extra_m, tgt_m, mine) in enumerate(per_tenant):
        node = nodes[ni]
        if n_i == cur_i and r.limit_bytes > 0:
            limit_b = int(r.limit_bytes)
        else:
            limit_b = max(int(n_i) * PAGE, int(lb_i) * PAGE)
        target_b = int(tgt_i) * PAGE
        why = []
        if not curve_i:
            why.append(f"no curve for the running {r.policy} yet: limit held"
                       if advisory[ni] else "no curve yet: limit held")
        elif slo_on:
            if granted_i:
                why.append(f"SLO {slo_i:g}/s needs {need_m} MiB under {row_policy[arow]}")
            else:
                why.append(f"SLO {slo_i:g}/s not met")
        if curve_i and tgt_i > xlo_i + 0.5:
            why.append(f"+{extra_m} MiB for throughput")
        if n_i == cur_i and abs(tgt_i - cur_i) >= 1:
            why.append(f"held: {tgt_m} MiB is within the hysteresis")
        elif abs(tgt_i - n_i) >= 1:
            why.append(f"stepping toward {tgt_m} MiB")
        if advisory[ni] and ch.policy != r.policy:
            why.append(f"advisory: the node cannot swap policies; {r.policy} keeps running")
        if ch.reason != "keep" and ch.reason:
            why.append(ch.reason)
        reason = "; ".join(why)
        directives[node].append(Directive(spec.name, limit_b, ch.policy, reason))

        if slo_on and curve_i and not (p >= slo_i * (1 - 1e-9)):
            cause = ("infeasible within its ceiling and the model" if not feasible_i else
                     "not enough memory on the node after higher-priority SLOs")
            violations.append(Violation(spec.name, node, slo_i, p, slo_i - p, cause))

        # log what changed, with its predicted effect
        prev_limit = r.limit_bytes
        moved = limit_b != prev_limit and abs(limit_b - prev_limit) >= hyst_b[ni]
        switched = ch.switched and not advisory[ni]
        if ch.switched and advisory[ni]:
            # A recommendation: the node keeps running what it runs, so there
            # is no effect to observe.  Predictions: each policy's score.
            k_new, k_cur = mine.get(ch.policy), mine.get(before_pol[i])
            pa_ = _num(score_l[k_new]) if k_new is not None else None
            pb_ = _num(score_l[k_cur]) if k_cur is not None else None
            _record(state, log, LogEntry(
                rnd, node, spec.name, "policy", before_pol[i], ch.policy, reason,
                predicted=pa_, predicted_before=pb_,
                predicted_gain=(pa_ / pb_ - 1.0) if pb_ and pa_ is not None else None,
                observed_before=float(r.throughput)), observe=False)
        if switched or moved:
            verdict = verdicts[i]
            kind = "limit" if not switched else "watchdog" if verdict is not None else "policy"
            before = r.policy if switched else str(prev_limit)
            after = ch.policy if switched else str(limit_b)
            pb_, pa_ = _num(pred_old_l[i]), _num(pred_new_l[i])
            gain = (pa_ / pb_ - 1.0) if pb_ and pa_ is not None else None
            e = LogEntry(rnd, node, spec.name, kind, before, after, reason,
                         predicted=pa_, predicted_before=pb_, predicted_gain=gain,
                         observed_before=float(r.throughput))
            if kind == "watchdog":
                e.predicted_miss = {verdict.new: verdict.predicted_new,
                                    verdict.old: verdict.predicted_old}
                e.observed_miss = verdict.observed
            _record(state, log, e)

        st.policy = ch.policy
        st.target_bytes = target_b
        st.limit_bytes = limit_b
        st.last_round = rnd
        plan_rows.append((spec.name, node, ch.policy, row_policy[arow] if curve_i else None,
                          r.policy, target_b, limit_b, p, mine, slo_on, lb_i,
                          st.a, st.b, st.fitted))

    def plans() -> dict[str, TenantPlan]:
        # Built when asked for: tables and tests want them, the control
        # loop does not, and they are a tenth of a round.
        out = {}
        for (name, node, pol, cpol, running, tgt, lim, p, mine, slo_on, lb_i, a_i, b_i,
             fit_i) in plan_rows:
            if slo_on:
                needs = {p_: (max(need_rows_l[k], lb_i) * PAGE if need_rows_l[k] != math.inf
                              else math.inf) for p_, k in mine.items()}
            else:
                needs = dict.fromkeys(mine, lb_i * PAGE)
            out[name] = TenantPlan(name, node, pol, cpol, tgt, lim, _num(p), needs,
                                   (a_i, b_i, fit_i), running)
        return out

    return Decision(rnd, directives, violations, log, notes, state, plans)


def _choose(st: TenantState, r: TenantReport, advisory: bool, allowed: list[str],
            scores: dict[str, float], limit_pages: float, ctl):
    """One tenant's policy for this round: (the policy in force, the
    choice, the watchdog's verdict or None).

    In force is what the node reports running -- except on an advisory
    node, where nothing we direct ever runs and the autopilot follows its
    own last recommendation instead.  A switch the node carried out goes on
    probation; a failed probation sends the tenant back to the old policy."""
    if advisory:
        cur = st.policy if st.policy is not None else r.policy
        return cur, choose_policy(cur, allowed, scores, st, ctl.autopilot_threshold,
                                  ctl.autopilot_k), None
    cur = r.policy
    verdict = watchdog.check(st, r, limit_pages, ctl.watchdog_intervals,
                             ctl.watchdog_margin, ctl.watchdog_cooldown)
    if verdict is not None and verdict.old in allowed:
        st.streak, st.streak_policy = 0, None
        return cur, PolicyChoice(verdict.old, True, verdict.old, 0.0,
                                 f"watchdog: back to {verdict.old}: {verdict.reason}"), verdict
    ch = choose_policy(cur, allowed, scores, st, ctl.autopilot_threshold, ctl.autopilot_k,
                       watchdog.held_off(st))
    if ch.switched and cur in allowed:
        watchdog.start(st, ch.policy, cur)
    return cur, ch, verdict


def _indexes(state: EngineState, config):
    """Name -> spec maps for the config, kept across calls: the service calls
    decide once per node, and rebuilding them for 1,000 tenants each time
    would cost more than the node's own decision."""
    key = (id(config), id(config.tenants), len(config.tenants),
           id(config.nodes), len(config.nodes))
    cached = getattr(state, "_indexes", None)
    if cached is None or cached[0] != key:
        cached = (key, {t.name: t for t in config.tenants},
                  {n.name: n for n in config.nodes})
        state._indexes = cached
    return cached[1], cached[2]


def _num(v) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _record(state: EngineState, log: list, entry: LogEntry, observe: bool = True) -> None:
    """Log a decision; with `observe`, fill in its observed effect from the
    report OBSERVE_AFTER rounds later."""
    log.append(entry)
    state.log.append(entry)
    if observe:
        state.pending.setdefault(entry.tenant, []).append([entry, OBSERVE_AFTER])


def _observe_effects(state: EngineState, rows, rnd: int, log: list) -> None:
    """Record, from this round's reports, the observed effect of decisions
    made OBSERVE_AFTER reports ago."""
    if not state.pending:
        return
    for _, spec, r in rows:
        items = state.pending.get(spec.name)
        if not items:
            continue
        keep = []
        for item in items:
            entry, wait = item
            if wait > 1:
                item[1] = wait - 1
                keep.append(item)
                continue
            entry.observed = float(r.throughput)
            if entry.observed_before:
                entry.observed_gain = entry.observed / entry.observed_before - 1.0
            obs = LogEntry(rnd, entry.node, spec.name, "observed", entry.before, entry.after,
                           f"{entry.kind} change of round {entry.round}: predicted "
                           f"{_fmt(entry.predicted)}/s, observed {entry.observed:.4g}/s",
                           predicted=entry.predicted, predicted_before=entry.predicted_before,
                           predicted_gain=entry.predicted_gain,
                           observed_before=entry.observed_before, observed=entry.observed,
                           observed_gain=entry.observed_gain, decided_round=entry.round)
            log.append(obs)
            state.log.append(obs)
        if keep:
            state.pending[spec.name] = keep
        else:
            del state.pending[spec.name]
    # decisions whose tenant stopped reporting are not waited for forever
    if rnd % PENDING_MAX_AGE == 0:
        for name in [n for n, items in state.pending.items()
                     if all(rnd - e.round > PENDING_MAX_AGE for e, _ in items)]:
            del state.pending[name]


def _fmt(v):
    return "?" if v is None else f"{v:.4g}"
