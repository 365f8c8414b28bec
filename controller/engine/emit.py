"""The round's outputs: directives with their reasons, SLO violations,
the decision log (with the observed effect of earlier decisions filled in
from this round's reports) and the per-tenant plans."""
from __future__ import annotations

import math

import numpy as np

from cachepilot.controller.engine.round import FEASIBILITY_ROUNDS, OBSERVE_AFTER, Round
from cachepilot.controller.engine.types import (Decision, EngineState, LogEntry,
                                                TenantPlan, Violation)
from cachepilot.models.mrc import PAGE_SIZE
from cachepilot.protocol.types import Directive

T_ERRORS = 20              # a tenant's scored throughput predictions kept
PENDING_MAX_AGE = 100      # rounds after which an unobserved decision is dropped
MIB = 1048576


def emit(state: EngineState, R: Round, ctl) -> Decision:
    log: list[LogEntry] = []
    _observe_effects(state, R.rows, R.number, log)
    for i, before, now in R.phase_changed:
        name = R.rows[i][1].name
        _record(state, log, LogEntry(
            R.number, R.nodes[R.rows[i][0]], name, "phase", f"{before:.3g}", f"{now:.3g}",
            f"{name}: {before:.3g} -> {now:.3g} operations per page read: a new phase; "
            f"its throughput model starts again"), observe=False)
    directives: dict[str, list[Directive]] = {n: [] for n in R.nodes}
    violations: list[Violation] = []
    plan_rows = []
    # plain Python numbers for the per-tenant loop (numpy scalars are slow)
    col = _Columns(R, ctl)
    for i, (ni, spec, r) in enumerate(R.rows):
        node, st, ch = R.nodes[ni], R.tstates[i], R.choices[i]
        if col.new[i] == col.current[i] and r.limit_bytes > 0:
            limit_b = int(r.limit_bytes)
        else:
            limit_b = max(int(col.new[i]) * PAGE_SIZE, int(col.lb[i]) * PAGE_SIZE)
        reason = _reason(R, col, i)
        directives[node].append(Directive(spec.name, limit_b, ch.policy, reason))
        p = col.pred_target[i]
        if col.has_slo[i] and col.has_curve[i] and not (p >= col.slo[i] * (1 - 1e-9)):
            cause = ("infeasible within its ceiling and the model" if not col.feasible[i]
                     else "not enough memory on the node after higher-priority SLOs"
                     if col.feasible_now[i] else
                     f"no memory meets it this round; its last need stays until "
                     f"{FEASIBILITY_ROUNDS} rounds in a row agree")
            share = col.infeasible_share[i]
            if share > 0:
                cause += (f"; no memory meets it in {share:.0%} of the last "
                          f"{len(st.slo_history)} rounds")
            violations.append(Violation(spec.name, node, col.slo[i], p, col.slo[i] - p,
                                        cause))
        _log_changes(state, R, col, i, limit_b, reason, log)
        st.policy = ch.policy
        st.target_bytes = int(col.target[i]) * PAGE_SIZE
        st.limit_bytes = limit_b
        st.last_round = R.number
        if col.has_curve[i] and not R.recommend[i]:
            st.pred_m = R.m_curve[i].item()
            st.pred_policy = R.row_policy[col.alloc_row[i]]
            st.pred_pages = limit_b / PAGE_SIZE
        else:
            st.pred_m = st.pred_policy = st.pred_pages = None
        arow = col.alloc_row[i]
        plan_rows.append((spec.name, node, ch.policy,
                          R.row_policy[arow] if col.has_curve[i] else None,
                          r.policy, st.target_bytes, limit_b, p, R.row_of[i],
                          col.has_slo[i], col.lb[i], st.a, st.b, st.fitted))
    need_rows_l = R.need_rows.tolist()

    def plans() -> dict[str, TenantPlan]:
        # Built when asked for: tables and tests want them, the control
        # loop does not, and they are a tenth of a round.
        return _plans(plan_rows, need_rows_l)

    return Decision(R.number, directives, violations, log, R.notes, state, plans)


class _Columns:
    """The Round's per-row arrays as Python lists, and sizes as whole MiB
    for the reasons, converted once rather than per tenant."""

    def __init__(self, R: Round, ctl):
        for name in ("new", "current", "target", "lb", "x_lo", "slo", "has_slo",
                     "has_curve", "granted", "feasible", "alloc_row", "pred_target",
                     "pred_new", "pred_old", "score", "infeasible_share", "feasible_now"):
            setattr(self, name, getattr(R, name).tolist())
        to_mib = PAGE_SIZE / MIB
        known = np.isfinite(R.need)
        # an SLO granted without a size it needs: its curve is still warming
        # (engine/round.py _hold_warming), and it is held or grown meanwhile
        self.need_known = known.tolist()
        self.need_mib = np.round(np.where(known, R.need, 0) * to_mib).astype(np.int64).tolist()
        self.extra_mib = np.round((R.target - R.x_lo) * to_mib).astype(np.int64).tolist()
        self.target_mib = np.round(R.target * to_mib).astype(np.int64).tolist()
        self.hysteresis_bytes = (ctl.hysteresis * R.mem_pages * PAGE_SIZE).tolist()


def _reason(R: Round, col: _Columns, i: int) -> str:
    """Why a tenant gets this limit and policy, in words."""
    ni, _, r = R.rows[i]
    ch, advisory = R.choices[i], R.advisory[ni]
    new, cur, tgt = col.new[i], col.current[i], col.target[i]
    why = []
    if R.held[i]:
        why.append(f"held: {R.held[i]}")
    elif not col.has_curve[i]:
        why.append(f"no curve for the running {r.policy} yet: limit held"
                   if advisory else "no curve yet: limit held")
    elif col.has_slo[i]:
        if col.granted[i] and not col.need_known[i]:
            why.append(f"SLO {col.slo[i]:g}/s: its curve is still warming (its floor "
                       f"falling), so no size is known to meet it yet: held")
        elif col.granted[i]:
            why.append(f"SLO {col.slo[i]:g}/s needs {col.need_mib[i]} MiB under "
                       f"{R.row_policy[col.alloc_row[i]]}")
        elif not col.feasible[i] and col.slo[i] > 0:
            why.append(f"SLO {col.slo[i]:g}/s not met: no size meets it; its memory "
                       f"is weighed by throughput")
        else:
            why.append(f"SLO {col.slo[i]:g}/s not met")
    hold = R.phase_hold[i] if R.phase_hold else None
    if hold is not None and col.has_curve[i]:
        curve_m, seen_m = hold
        held = "cut only for SLOs" if new < cur else "not cut"
        why.append(f"its operations per page read just jumped (a new phase, or its cache "
                   f"cut or refilled): {held} until its curve reads what it misses"
                   if math.isnan(curve_m) else
                   f"its phase changed and its curve does not yet read what it misses "
                   f"({curve_m:.2f} against {seen_m:.2f}): {held}")
    if col.has_curve[i] and tgt > col.x_lo[i] + 0.5:
        why.append(f"+{col.extra_mib[i]} MiB for throughput")
    if R.shrink_held is not None and R.shrink_held[i]:
        why.append("a shrink waits until the next round's target agrees")
    if new == cur and abs(tgt - cur) >= 1:
        why.append(f"held: {col.target_mib[i]} MiB is within the hysteresis")
    elif abs(tgt - new) >= 1:
        why.append(f"stepping toward {col.target_mib[i]} MiB")
    if advisory and ch.policy != r.policy:
        why.append(f"advisory: the node cannot swap policies; {r.policy} keeps running")
    if R.recommend[i]:
        why.append("recommend mode: not sent")
    if ch.reason != "keep" and ch.reason:
        why.append(ch.reason)
    return "; ".join(why)


def _log_changes(state: EngineState, R: Round, col: _Columns, i: int, limit_b: int,
                 reason: str, log: list) -> None:
    """Log what changed for a tenant, with its predicted effect."""
    ni, spec, r = R.rows[i]
    node, ch = R.nodes[ni], R.choices[i]
    advisory = R.advisory[ni] or R.recommend[i]
    prev_limit = r.limit_bytes
    moved = limit_b != prev_limit and abs(limit_b - prev_limit) >= col.hysteresis_bytes[ni]
    switched = ch.switched and not advisory
    if R.recommend[i]:
        _log_recommendation(state, R, col, i, limit_b, reason, log)
        return
    if ch.switched and advisory:
        # A recommendation: the node keeps running what it runs, so there
        # is no effect to observe.  Predictions: each policy's score.
        mine = R.row_of[i]
        k_new, k_cur = mine.get(ch.policy), mine.get(R.before_pol[i])
        pa_ = _num(col.score[k_new]) if k_new is not None else None
        pb_ = _num(col.score[k_cur]) if k_cur is not None else None
        _record(state, log, LogEntry(
            R.number, node, spec.name, "policy", R.before_pol[i], ch.policy, reason,
            predicted=pa_, predicted_before=pb_,
            predicted_gain=(pa_ / pb_ - 1.0) if pb_ and pa_ is not None else None,
            observed_before=_num(r.throughput)), observe=False)
    verdict = R.verdicts[i]
    if verdict is not None and verdict.kept:
        _record(state, log, LogEntry(R.number, node, spec.name, "trial", verdict.new,
                                     verdict.new, verdict.reason), observe=False)
    if not (switched or moved):
        return
    reverted = verdict is not None and not verdict.kept
    kind = "limit" if not switched else "watchdog" if reverted else "policy"
    before = r.policy if switched else str(prev_limit)
    after = ch.policy if switched else str(limit_b)
    pb_, pa_ = _num(col.pred_old[i]), _num(col.pred_new[i])
    gain = (pa_ / pb_ - 1.0) if pb_ and pa_ is not None else None
    e = LogEntry(R.number, node, spec.name, kind, before, after, reason,
                 predicted=pa_, predicted_before=pb_, predicted_gain=gain,
                 observed_before=_num(r.throughput))
    if kind == "watchdog":
        e.predicted_miss = {verdict.new: verdict.predicted_new,
                            verdict.old: verdict.predicted_old}
        e.observed_miss = verdict.observed
    _record(state, log, e)


def _log_recommendation(state: EngineState, R: Round, col: _Columns, i: int, limit_b: int,
                        reason: str, log: list) -> None:
    """Recommend mode: log the directive that would have been sent, when it
    differs from what runs and from the last one logged.  Nothing takes
    effect, so there is no effect to observe."""
    ni, spec, r = R.rows[i]
    st, ch = R.tstates[i], R.choices[i]
    differs = ch.policy != r.policy or (
        limit_b != r.limit_bytes and abs(limit_b - r.limit_bytes) >= col.hysteresis_bytes[ni])
    if not differs or (st.limit_bytes, st.policy) == (limit_b, ch.policy):
        return
    pb_, pa_ = _num(col.pred_old[i]), _num(col.pred_new[i])
    _record(state, log, LogEntry(
        R.number, R.nodes[ni], spec.name, "recommend", f"{r.limit_bytes} {r.policy}",
        f"{limit_b} {ch.policy}", reason, predicted=pa_, predicted_before=pb_,
        predicted_gain=(pa_ / pb_ - 1.0) if pb_ and pa_ is not None else None,
        observed_before=_num(r.throughput)), observe=False)


def _plans(plan_rows, need_rows_l) -> dict[str, TenantPlan]:
    out = {}
    for (name, node, pol, cpol, running, tgt, lim, p, mine, slo_on, lb_i, a_i, b_i,
         fit_i) in plan_rows:
        if slo_on:
            needs = {p_: (max(need_rows_l[k], lb_i) * PAGE_SIZE
                          if need_rows_l[k] != math.inf else math.inf)
                     for p_, k in mine.items()}
        else:
            needs = dict.fromkeys(mine, lb_i * PAGE_SIZE)
        out[name] = TenantPlan(name, node, pol, cpol, tgt, lim, _num(p), needs,
                               (a_i, b_i, fit_i), running)
    return out


def _num(v) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def _record(state: EngineState, log: list, entry: LogEntry, observe: bool = True) -> None:
    """Log a decision; with `observe`, fill in its observed effect from the
    report OBSERVE_AFTER rounds later."""
    log.append(entry)
    if observe:
        state.pending.setdefault(entry.tenant, []).append([entry, OBSERVE_AFTER])


def _observe_effects(state: EngineState, rows, rnd: int, log: list) -> None:
    """Record, from this round's reports, the observed effect of decisions
    made OBSERVE_AFTER reports ago."""
    if not state.pending:
        return
    for _, spec, r in rows:
        items = state.pending.get(spec.name)
        if not items or r.throughput is None:
            continue        # unknown throughput: wait for a report that says
        keep = []
        for item in items:
            entry, wait = item
            if wait > 1:
                item[1] = wait - 1
                keep.append(item)
                continue
            _observed(state, entry, spec.name, r, rnd, log)
        if keep:
            state.pending[spec.name] = keep
        else:
            del state.pending[spec.name]
    # decisions whose tenant stopped reporting are not waited for forever
    if rnd % PENDING_MAX_AGE == 0:
        for name in [n for n, items in state.pending.items()
                     if all(rnd - e.round > PENDING_MAX_AGE for e, _ in items)]:
            del state.pending[name]


def _observed(state: EngineState, entry: LogEntry, tenant: str, r, rnd: int,
              log: list) -> None:
    """The observed effect of `entry`, as an entry of its own (a decision
    already made is never changed)."""
    observed = float(r.throughput)
    gain = observed / entry.observed_before - 1.0 if entry.observed_before else None
    st = state.tenants.get(tenant)
    if st is not None and entry.predicted and entry.predicted > 0 and observed > 0 and \
            math.isfinite(entry.predicted):
        st.t_errors = (list(st.t_errors) + [math.log(observed / entry.predicted)])[-T_ERRORS:]
    obs = LogEntry(rnd, entry.node, tenant, "observed", entry.before, entry.after,
                   f"{entry.kind} change of round {entry.round}: predicted "
                   f"{_fmt(entry.predicted)}/s, observed {observed:.4g}/s",
                   predicted=entry.predicted, predicted_before=entry.predicted_before,
                   predicted_gain=entry.predicted_gain,
                   observed_before=entry.observed_before, observed=observed,
                   observed_gain=gain, decided_round=entry.round)
    log.append(obs)


def _fmt(v):
    return "?" if v is None else f"{v:.4g}"
