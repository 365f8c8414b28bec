"""The control round's steps, each a function over one Round.

A Round holds one row per (live node, known tenant), in (node, name)
order, and every number the round works with as an array over those rows:
sizes in 4 KiB pages as floats, throughput in the tenant's own operations
per second.  Each step reads the arrays the steps before it filled and
fills its own, so the round reads top to bottom in decide() and every step
can be tested on a Round built by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cachepilot.controller.engine import allocate, model, watchdog
from cachepilot.controller.engine.autopilot import PolicyChoice, choose_policy
from cachepilot.controller.engine.curves import CurveBank
from cachepilot.controller.engine.types import EngineState, Observations, TenantState
from cachepilot.core import phase
from cachepilot.core.phase import PHASE_FACTOR
from cachepilot.models import minisim_error
from cachepilot.models.mrc import MRC, PAGE_SIZE
from cachepilot.protocol.types import TenantReport



@dataclass
class Round:
    """One round's working set.  Per-node lists are indexed by node, the
    arrays by row; `node_of` maps a row to its node."""
    number: int
    notes: list[str] = field(default_factory=list)
    # a what-if of where a placement settles (whatif.allocate): no hold
    # for a phase change under way (_hold_new_phase)
    settled: bool = False
    # (row, ops per page read before, now) of tenants that began a new phase
    phase_changed: list = field(default_factory=list)
    # gather_rows
    nodes: list[str] = field(default_factory=list)
    mem_pages: np.ndarray = None            # per node
    advisory: list[bool] = field(default_factory=list)   # per node: cannot swap
    node_policies: list = field(default_factory=list)    # per node: set or None
    rows: list = field(default_factory=list)  # (node index, tenant spec, report)
    node_of: np.ndarray = None
    tstates: list[TenantState] = field(default_factory=list)
    recommend: list[bool] = field(default_factory=list)  # per row: directives are advice
    held: list[str] = field(default_factory=list)        # per row: why it is held, or ""
    # allocate_memory: per row, (curve, observed) miss ratios of a tenant
    # whose new phase's curve has not caught up with it yet, else None
    phase_hold: list = field(default_factory=list)
    # fit_models: the throughput model's seconds per op at m = 0, and per unit m
    a: np.ndarray = None
    b: np.ndarray = None
    spread: np.ndarray = None               # relative spread around the model
    observed: dict = None                   # the reports' throughput, miss ratio, accesses
    m_spread: np.ndarray = None             # miss ratio above the curve's predictions
    # bank_curves: one bank row per (tenant, allowed policy with a curve)
    bank: CurveBank = None
    row_tenant: np.ndarray = None
    row_policy: list[str] = field(default_factory=list)
    row_of: list[dict[str, int]] = field(default_factory=list)  # policy -> bank row
    allowed_of: list[list[str]] = field(default_factory=list)
    run_row: np.ndarray = None       # bank row of the running policy, or -1
    row_hook_ns: np.ndarray = None   # per bank row: the policy's hook cost per
                                     # cached access on the node (NaN: unknown)
    row_miss_ns: np.ndarray = None   # ... and per read that misses
    # size_bounds
    limit_now: np.ndarray = None     # the limit in force (0: none)
    equal: np.ndarray = None         # an equal share of the node
    ref: np.ndarray = None           # the size policies are scored at
    lb: np.ndarray = None            # floor, or anonymous memory + margin
    ub: np.ndarray = None            # ceiling, at most the node
    current: np.ndarray = None       # the limit in force, or all it may have
    slo: np.ndarray = None           # minimum throughput (0: none)
    has_slo: np.ndarray = None
    # choose_policies
    score: np.ndarray = None         # per bank row: modelled throughput at ref
    score_raw: np.ndarray = None     # ... with only the sampling's part of their doubt
    m_sd: np.ndarray = None          # per bank row: its miss ratio's deviation over windows
    need_low: np.ndarray = None      # per bank row: least size meeting the SLO (hooks
    need_high: np.ndarray = None     # in), the curve erring low / high
    choices: list[PolicyChoice] = field(default_factory=list)
    verdicts: list = field(default_factory=list)      # watchdog.Verdict or None
    before_pol: list[str] = field(default_factory=list)  # the policy a switch leaves
    alloc_row: np.ndarray = None     # bank row the allocation reads, or -1
    has_curve: np.ndarray = None
    # size_slos
    need_rows: np.ndarray = None     # per bank row: least size meeting the SLO
    feasible: np.ndarray = None
    need: np.ndarray = None          # least size meeting the SLO within bounds
    need_safe: np.ndarray = None     # ... with headroom
    headroom: np.ndarray = None      # the headroom's fraction of the SLO
    served_at: np.ndarray = None     # a limit every latest report served it at (_seen_meeting)
    feasible_now: np.ndarray = None  # this round's own verdict (feasible: in force)
    shrink_held: np.ndarray = None   # step_limits: a shrink not yet confirmed
    filling: np.ndarray = None       # size_bounds: its page cache is still filling
    fill_reach: np.ndarray = None    # ... and the pages it reaches while held (_track_filling)
    resident: np.ndarray = None      # size_bounds: pages it holds now, in curve sizes
    fill_rate: np.ndarray = None     # ... pages a cache growing into a raised limit
                                     # gains per second, per unit of miss ratio
    interval_s: np.ndarray = None    # ... the seconds its report covers
    infeasible_share: np.ndarray = None  # share of recent rounds no size met the SLO
    # allocate_memory
    target: np.ndarray = None
    x_lo: np.ndarray = None          # sizes after the SLO stage
    granted: np.ndarray = None
    kept: np.ndarray = None          # the node's last division kept (reallocation_gain)
    kept_shrink: np.ndarray = None   # ... shrunk by this above the floors to fit (1: whole)
    t_sigma: np.ndarray = None       # relative error expected of each modelled throughput
    # step_limits
    target_wanted: np.ndarray = None  # the allocation's target, before a shrink waits
    step: dict = None                # allocate.step_limit's figures per row
    new: np.ndarray = None
    # predict
    pred_target: np.ndarray = None
    pred_new: np.ndarray = None
    pred_old: np.ndarray = None
    m_curve: np.ndarray = None       # the allocation's curve, its mean over the next
                                     # interval as the cache grows (_trajectory)
    m_new: np.ndarray = None         # ... and what the tenant will miss then (_anchored)

    @property
    def n(self) -> int:
        return len(self.rows)

    def column(self, get, dtype=np.float64) -> np.ndarray:
        """An array of get(spec, report) over the rows."""
        return np.fromiter((get(spec, r) for _, spec, r in self.rows), dtype=dtype,
                           count=len(self.rows))


def gather_rows(state: EngineState, reports, specs, node_specs, node_memory,
                advisory_nodes, recommend=()) -> Round:
    """The live nodes and their known tenants, in sorted order; what is
    ignored (unknown nodes and tenants, a tenant reported twice) becomes a
    note.  A row is held (its limit and policy stay) when its report says
    why (TenantReport.held_reason: throughput unknown, curves refused); its
    directives are only recommendations when its tenant is in `recommend`."""
    R = Round(state.round)
    memory = []
    seen: set[str] = set()
    for name in sorted(reports):
        mem = (node_memory or {}).get(name) or \
            (node_specs[name].memory_bytes if name in node_specs else None)
        if not mem:
            R.notes.append(f"node {name!r} is not in the config; its reports are ignored")
            continue
        ni = len(R.nodes)
        R.nodes.append(name)
        memory.append(mem / PAGE_SIZE)
        for r in sorted(reports[name], key=lambda r: r.tenant):
            spec = specs.get(r.tenant)
            if spec is None:
                R.notes.append(f"node {name!r} reported unknown tenant {r.tenant!r}; ignored")
                continue
            if r.tenant in seen:
                R.notes.append(f"tenant {r.tenant!r} reported twice; the first report counts")
                continue
            seen.add(r.tenant)
            R.rows.append((ni, spec, r))
    R.mem_pages = np.asarray(memory, dtype=np.float64)
    R.node_of = np.fromiter((ni for ni, _, _ in R.rows), dtype=np.int64, count=R.n)
    R.advisory = [n in advisory_nodes for n in R.nodes]
    R.recommend = [spec.name in recommend for _, spec, _ in R.rows]
    R.held = [r.held_reason for _, _, r in R.rows]
    R.node_policies = [set(node_specs[n].policies) if n in node_specs and
                       node_specs[n].policies is not None else None for n in R.nodes]
    return R


# The round's fixed figures: each was a control field once, and none moved
# the scenario corpus enough to be worth an operator's attention
# (docs/design.md has the list and what each is worth).
MODEL_MIN_POINTS = 5        # observations before a tenant's own model replaces the prior
MODEL_MIN_SPREAD = 0.05     # ... spanning at least this much miss ratio
DOUBT = 0.01                # miss ratio a challenger's curve is scored worse by (_doubt)
WINDOWS = 8                 # reports' curves a policy is scored over (_window_spread)
WINDOW_SHIFT = 0.05         # miss ratio the running policy's curve moves by in a new phase
MEMORY_THRESHOLD = 0.15     # SLO memory a tied policy must save to earn a switch
WATCHDOG_INTERVALS = 3      # running reports a switch is judged over (engine/watchdog.py)
WATCHDOG_MARGIN = 0.05      # miss ratio a switch may do worse than staying, before undone
WATCHDOG_COOLDOWN = 20      # tenant rounds a policy undone (and its siblings) stays off
SLO_HEADROOM = 0.05         # the least headroom an SLO is sized with (of its throughput)
SLO_HEADROOM_SIGMAS = 1.0   # ... else this many of its throughput's spread around the model
FEASIBILITY_ROUNDS = 3      # rounds in a row that turn an SLO's feasibility verdict
FEEDBACK_STEP = 0.05        # of its node: what an SLO miss adds to the safe size (_slo_feedback)
SHRINK_ROUNDS = 2           # rounds of targets in a row an SLO tenant's shrink waits for


def fit_models(state: EngineState, R: Round, ctl) -> None:
    """Add this round's (miss ratio, seconds per op) observations and refit
    every tenant's throughput model (engine/model.py)."""
    if state.obs is None or state.obs.window != ctl.model_window:
        state.obs = Observations(ctl.model_window)
        for st in state.tenants.values():
            st.slot = -1
    obs = state.obs
    priors = np.zeros((R.n, 2))
    for i, (ni, spec, r) in enumerate(R.rows):
        st = state.tenants.get(spec.name)
        if st is None:
            st = state.tenants[spec.name] = TenantState()
        if st.slot < 0:
            st.slot = obs.new_slot()
        if st.node and st.node != R.nodes[ni] and not R.settled:
            _moved(R, obs, st, spec.name, R.nodes[ni])
        st.node = R.nodes[ni]
        st.rounds += 1
        st.running = r.policy
        st.recent_curves.append(r.curves)
        thr = math.nan if r.throughput is None else float(r.throughput)
        st.recent_obs.append((r.policy, float(r.limit_bytes), float(r.miss_ratio), thr))
        st.costs.append((r.policy, float(r.limit_bytes), thr, r.disk_reads_per_s,
                         float(r.cpu_per_s)))
        p = spec.model or ctl.prior
        priors[i] = (p.t_hit_s / p.concurrency, p.t_miss_s / p.concurrency)
        R.tstates.append(st)
    slots = np.fromiter((t.slot for t in R.tstates), dtype=np.int64, count=R.n)
    thr_obs = R.column(lambda s, r: math.nan if r.throughput is None else r.throughput)
    m_obs = R.column(lambda s, r: r.miss_ratio)
    acc = R.column(lambda s, r: r.accesses_per_s)
    R.observed = {"throughput": thr_obs, "miss_ratio": m_obs, "accesses_per_s": acc}
    valid = (thr_obs > 0) & np.isfinite(thr_obs) & (m_obs >= 0) & (m_obs <= 1) & (acc > 0)
    _follow_phases(R, obs, np.where(valid, thr_obs / np.where(acc > 0, acc, 1.0), np.nan))
    # a report whose operations per page read jumped, unconfirmed, is a
    # transient or a new phase's first: either way not of the phase the
    # model fits (make consolidate: a refilling cache's 265 ops/s at
    # 135 MiB, fitted, made a tenant's SLO look out of reach for 70 rounds)
    valid &= np.fromiter((t.ops_pending is None for t in R.tstates), dtype=bool, count=R.n)
    obs.add(slots[valid], m_obs[valid], 1.0 / thr_obs[valid])
    R.a, R.b, fitted = model.fit(obs.m[slots], obs.y[slots], obs.count[slots],
                                 priors[:, 0], priors[:, 1],
                                 MODEL_MIN_POINTS, MODEL_MIN_SPREAD)
    R.spread = model.relative_spread(obs.m[slots], obs.y[slots], obs.count[slots], R.a, R.b,
                                     MODEL_MIN_POINTS)
    for t, ai, bi, fi, sp in zip(R.tstates, R.a.tolist(), R.b.tolist(), fitted.tolist(),
                                 R.spread.tolist()):
        t.a, t.b, t.fitted, t.spread = ai, bi, fi, sp
    _track_curve_error(R, ctl.warmup_intervals)


def _moved(R: Round, obs, st, name: str, node: str) -> None:
    """A tenant that has moved to another node (a consolidation plan
    carried out) starts its model again: its (miss ratio, seconds per
    op) pairs timed its misses on the old node's disk, beside the old
    node's tenants.  Fitted with the new node's, they drew a line that
    neither node's drew (make consolidate, run K: a reader moved onto a
    busier disk was fitted a = 0.47 us, where the old node's pairs alone
    gave 13 us and, replayed, the new node's 58; its gain from memory read
    convex, and the round cut a neighbour to its floor for it).  Until
    the new node's pairs separate a from b, the prior stands, scaled to
    what the tenant shows there; its last reports' outcomes were the old
    node's too.  Not in a what-if of where
    a placement settles (Round.settled: a plan's prediction of a host):
    there the old node's fit is the best guess of the new node's."""
    obs.forget(st.slot)
    st.recent_obs.clear()
    st.costs.clear()
    R.notes.append(f"tenant {name!r} moved from node {st.node!r} to {node!r}: "
                   f"its throughput model starts again there")


def _follow_phases(R: Round, obs, opa: np.ndarray) -> None:
    """A tenant whose operations per page read jumped, two reports in a
    row (core/phase.py), changed what an operation is (make e2e's search:
    64 KiB sequential reads, 16 pages each, then 4 KiB lookups): the (miss
    ratio, seconds per operation) pairs of the old phase say nothing of
    the new, and fitted together they made the lookups look a sixteenth
    as fast as they were, and cost them their memory.  Its observations are dropped; the
    prior, scaled to what the new phase shows, stands until the new ones
    separate a from b."""
    for i, st in enumerate(R.tstates):
        ref = st.ops_per_access
        st.ops_per_access, changed, st.ops_pending = phase.follow(
            ref, float(opa[i]), PHASE_FACTOR, st.ops_pending)
        if changed:
            obs.forget(st.slot)
            R.phase_changed.append((i, ref, st.ops_per_access))
            st.phase_since = st.rounds
            # what the old phase served is no trial's reference; a trial
            # under way is left to the autopilot's ordinary rules, and the
            # new phase may have one of its own
            st.recent_obs.clear()
            st.costs.clear()
            st.trial_done = False
            st.overpromise = st.baseline_overpromise = 0.0
            st.held_until = {}
            if st.probation is not None and st.probation.trial:
                st.probation = None


M_ERRORS = 20       # rounds of curve prediction errors kept per tenant


def _track_curve_error(R: Round, warmup: int = 0) -> None:
    """How far each tenant's observed miss ratio came out from what its
    curve predicted, last round, for the limit and policy it now runs
    (only when it runs what was directed: a refused or unapplied directive
    says nothing about the curve).  R.m_spread is, over the last M_ERRORS
    rounds, those errors' standard deviation plus their mean where the
    curve was optimistic on average: a tenant whose demand varies over
    time (a trace replay, a phase) misses more than one interval's curve
    says in some intervals, and this is by how much.  Not in a tenant's
    first `warmup` rounds: while its cache fills, it misses more than any
    curve of the steady state says, and those errors (kept M_ERRORS
    rounds) would read as a curve that errs for long after."""
    R.m_spread = np.zeros(R.n)
    for i, (_, _, r) in enumerate(R.rows):
        st = R.tstates[i]
        if st.pred_m is not None and r.policy == st.pred_policy and st.rounds > warmup and \
                r.throughput is not None and 0.0 <= r.miss_ratio <= 1.0 and \
                abs(r.limit_bytes / PAGE_SIZE - (st.pred_pages or 0.0)) <= \
                max(1.0, 0.01 * (st.pred_pages or 0.0)):
            st.m_errors = (list(st.m_errors) + [r.miss_ratio - st.pred_m])[-M_ERRORS:]
        if len(st.m_errors) >= 3:
            e = np.asarray(st.m_errors)
            R.m_spread[i] = max(float(e.mean()), 0.0) + float(e.std(ddof=1))


def bank_curves(R: Round, ctl) -> None:
    """One bank row per (tenant, allowed policy the report has a curve
    for), plus the running policy's curve when it is not allowed: it is
    what the tenant gets until something else runs."""
    curves, row_tenant = [], []
    R.run_row = np.full(R.n, -1, dtype=np.int64)
    for i, (ni, spec, r) in enumerate(R.rows):
        by_policy = {c.policy: c for c in r.curves}
        allowed = sorted(spec.policies if spec.policies is not None else by_policy)
        if R.node_policies[ni] is not None:
            allowed = [p for p in allowed if p in R.node_policies[ni]]
        R.allowed_of.append(allowed)
        mine = {}
        for p in allowed:
            c = by_policy.get(p)
            if c is not None:
                mine[p] = len(curves)
                curves.append(c)
                row_tenant.append(i)
                R.row_policy.append(p)
        R.row_of.append(mine)
        if r.policy in mine:
            R.run_row[i] = mine[r.policy]
        elif r.policy in by_policy:
            R.run_row[i] = len(curves)
            curves.append(by_policy[r.policy])
            row_tenant.append(i)
            R.row_policy.append(r.policy)
    R.bank = CurveBank(curves, ctl.curve_error_sigmas)
    R.row_tenant = np.asarray(row_tenant, dtype=np.int64)
    R.row_hook_ns = np.fromiter((_hook_ns(c) for c in curves), dtype=np.float64,
                                count=len(curves))
    R.row_miss_ns = np.fromiter((_hook_ns(c, "hook_ns_per_miss") for c in curves),
                                dtype=np.float64, count=len(curves))


MAX_HOOK_NS = 1e6       # a millisecond of hooks per cached access is no figure


def _hook_ns(curve, key: str = "hook_ns_per_access") -> float:
    """The curve's `hook_ns_per_access` (or `key`: `hook_ns_per_miss`;
    agent/hookcost.py), or NaN where it has none or one no node could have
    measured."""
    v = _meta_figure(curve, key)
    return v if 0.0 <= v <= MAX_HOOK_NS else math.nan


def _meta_figure(curve, key: str) -> float:
    """The number a curve's meta gives for `key`, or NaN where it gives
    none."""
    v = curve.meta.get(key) if curve.meta else None
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


MIN_HOOK_FACTOR, MAX_HOOK_FACTOR = 0.5, 4.0


def hook_factors(R: Round) -> np.ndarray:
    """Per bank row, how much the policy's hooks stretch the tenant's time
    per operation at m = 0 (the model's a) against the policy running now.

    The tenant's own CPU per page access (report: cpu_per_s over
    accesses_per_s) is what a hit costs it; a policy whose hooks cost h
    nanoseconds more per access than the running one's adds h to that,
    so a CPU-bound hit path slows by 1 + h / (CPU per access).  A tenant
    that waits on its disk has a small a, and the factor barely moves its
    throughput.  1 where either cost or the tenant's CPU is unknown."""
    k = np.ones(R.bank.n if R.bank is not None else 0)
    if not len(k):
        return k
    cpu = R.column(lambda s, r: r.cpu_per_s)
    acc = R.column(lambda s, r: r.accesses_per_s)
    cpu_ns_per_access = np.where((cpu > 0) & (acc > 0),
                                 cpu * 1e9 / np.where(acc > 0, acc, 1.0), np.nan)
    f = 1.0 + _over_running(R, R.row_hook_ns) / cpu_ns_per_access[R.row_tenant]
    return np.where(np.isfinite(f), np.clip(f, MIN_HOOK_FACTOR, MAX_HOOK_FACTOR), 1.0)


def miss_costs(R: Round) -> np.ndarray:
    """Per bank row, the seconds per operation the policy's miss path adds
    to the model's b (time per operation at m = 1) against the policy
    running now.

    A read that misses runs the policy's insertion and, once the cache is
    full, its eviction, in the reading thread, before the read returns; a
    policy whose miss path costs d nanoseconds more than the running one's
    adds d to every miss, whether the tenant then waits on its disk or
    not.  An operation makes accesses_per_s / throughput page accesses, so
    at m = 1 it misses that many times.  Where d dwarfs nothing (misses
    that wait milliseconds on a disk), the term barely moves b; where
    misses are fast (a fast disk, a cache of a cache), it can decide.  0
    where either cost, the running policy or the tenant's rates are
    unknown; never below half of b (a running policy's miss path cannot
    have been more than the misses' whole cost)."""
    d = np.zeros(R.bank.n if R.bank is not None else 0)
    if not len(d):
        return d
    acc = R.column(lambda s, r: r.accesses_per_s)
    thr = R.column(lambda s, r: r.throughput if r.throughput is not None else math.nan)
    per_op = np.where((acc > 0) & (thr > 0), acc / np.where(thr > 0, thr, 1.0), np.nan)
    t = R.row_tenant
    d = _over_running(R, R.row_miss_ns) * 1e-9 * per_op[t]
    d = np.where(np.isfinite(d), d, 0.0)
    return np.maximum(d, -0.5 * np.maximum(R.b[t], 0.0))


def _over_running(R: Round, row_ns: np.ndarray) -> np.ndarray:
    """Per bank row, its policy's figure (`row_ns`) less the figure of the
    policy its tenant runs now; NaN where either is unknown or the running
    policy has no bank row."""
    run = np.where(R.run_row >= 0, row_ns[np.maximum(R.run_row, 0)], np.nan)
    return row_ns - run[R.row_tenant]


def size_bounds(R: Round, ctl) -> None:
    """Each row's limit in force, equal share, safety bounds and the size
    its policies are scored at."""
    node_of, mem = R.node_of, R.mem_pages
    per_node = np.maximum(np.bincount(node_of, minlength=len(R.nodes)), 1)
    R.limit_now = R.column(lambda s, r: r.limit_bytes) / PAGE_SIZE
    prev_target = np.fromiter(((t.target_bytes or 0) for t in R.tstates),
                              dtype=np.float64, count=R.n) / PAGE_SIZE
    R.prev_target = prev_target
    R.equal = mem[node_of] / per_node[node_of] if R.n else np.zeros(0)
    R.ref = np.where(R.limit_now > 0, R.limit_now,
                     np.where(prev_target > 0, prev_target, R.equal))
    lb_bytes = R.column(lambda s, r: max(s.floor_bytes, r.usage_anon_bytes
                                         + ctl.anon_margin_bytes))
    R.lb = np.ceil(lb_bytes / PAGE_SIZE)
    ub = R.column(lambda s, r: s.ceiling_bytes if s.ceiling_bytes is not None
                  else math.inf) / PAGE_SIZE
    ub = np.floor(np.minimum(ub, mem[node_of] if R.n else ub))
    R.ub = np.maximum(ub, R.lb)          # safety wins over a ceiling
    R.current = np.where(R.limit_now > 0, R.limit_now, R.ub)   # no limit: all it may have
    R.slo = R.column(lambda s, r: s.slo.min_throughput if s.slo is not None else 0.0)
    R.has_slo = R.column(lambda s, r: s.slo is not None, dtype=bool)
    _track_filling(R)


def _track_filling(R: Round) -> None:
    """R.filling: per row, whether the tenant's page cache is still
    filling -- it grew since the last report, stays below the limit and
    nothing was evicted.  Every miss of such a cache is a first read, and
    the reuse that would make its pages worth keeping has not come round
    yet (a loop's first pass): its curve says nothing yet of what less
    memory would cost, and cut on it, it never gets the memory that would
    show it.  Such a tenant keeps its limit (allocate_memory) until its
    cache stops growing or evicts -- as much of it as the cache reaches
    within PHASE_HOLD_ROUNDS rounds at the growth it shows (R.fill_reach):
    a cache filling a page a scan at a time holds no claim on what it
    reaches only in forty rounds (corpus scenario 04: held there, it cut
    a loop below its pass).  Beside it, what predict() reads of how
    a cache grows: where it stands (R.resident), how fast misses fill it
    (R.fill_rate) and over how long a report (R.interval_s)."""
    usage = R.column(lambda s, r: r.usage_file_bytes) / PAGE_SIZE
    # a curve's sizes are limits (the agent shifted them by the cgroup's
    # anonymous memory), so the cache stands at file + anon on them
    R.resident = usage + R.column(lambda s, r: r.usage_anon_bytes) / PAGE_SIZE
    ins = R.column(lambda s, r: r.inserts_per_s)
    m = R.observed["miss_ratio"]
    acc = R.observed["accesses_per_s"]
    # pages inserted per second per unit of miss ratio, as measured (a real
    # kernel's readahead inserts more than one page per miss); one per
    # access where nothing missed to measure it by
    rate = np.where((ins > 0) & (m > 0), ins / np.where(m > 0, m, 1.0), np.maximum(acc, 0.0))
    R.fill_rate = np.where(np.isfinite(rate), rate, 0.0)     # no figure: no growth
    iv = R.column(lambda s, r: r.interval_s)
    R.interval_s = np.where(np.isfinite(iv) & (iv > 0), iv, 0.0)
    removals = R.column(lambda s, r: r.removals_per_s)
    before = np.fromiter((-1.0 if t.usage_pages is None else t.usage_pages
                          for t in R.tstates), dtype=np.float64, count=R.n)
    R.filling = (R.limit_now > 0) & (removals <= 0) & (usage > before) & \
        (usage < R.limit_now) & ~np.asarray([bool(h) for h in R.held], dtype=bool)
    R.fill_reach = R.resident + PHASE_HOLD_ROUNDS * np.maximum(usage - before, 0.0)
    for t, u in zip(R.tstates, usage.tolist()):
        t.usage_pages = u


def choose_policies(R: Round, ctl) -> None:
    """Score every allowed policy at the reference size, let the watchdog
    and the autopilot choose, and pick the curve the allocation reads: the
    policy that will be in force (the new one when switching, else the one
    running; on an advisory node always the one running)."""
    bank = R.bank
    if bank.n:
        at = np.minimum(R.ref, R.ub)[R.row_tenant]
        # read as measured: the error's stretch is for buying memory, and
        # it reads every curve at a smaller size than the one compared at;
        # each policy by its curves of the last reports (_window_spread)
        hist = _phase_history(R, at, ctl)
        m, R.m_sd = _window_spread(R, at, hist)
        _pool_phase(R, hist, ctl)
        # each policy's hooks estimated against the running one's
        a_h = R.a[R.row_tenant] * hook_factors(R)
        b_r = R.b[R.row_tenant] + miss_costs(R)
        m_taught = m + _taught(R, ctl)
        doubt, noise = _doubt(R, ctl, at, m)
        R.score = model.throughput(a_h, b_r, m_taught + doubt)
        R.score_raw = model.throughput(a_h, b_r, m_taught + noise)
        R.need_low, R.need_high = _policy_needs(R, a_h, b_r)
    else:
        R.score = R.score_raw = R.need_low = R.need_high = np.zeros(0)
    R.alloc_row = np.full(R.n, -1, dtype=np.int64)
    score_l, current_l, slo_l = R.score.tolist(), R.current.tolist(), R.slo.tolist()
    raw_l = R.score_raw.tolist()
    low_l, high_l, has_slo_l = R.need_low.tolist(), R.need_high.tolist(), R.has_slo.tolist()
    for i, (ni, spec, r) in enumerate(R.rows):
        mine = R.row_of[i]
        if R.held[i]:
            # nothing to decide on: the limit (no curve to allocate on) and
            # the policy stay, and no streak or probation moves
            R.choices.append(PolicyChoice(r.policy, False, None, 0.0, "keep"))
            R.verdicts.append(None)
            R.before_pol.append(r.policy)
            continue
        advice = R.advisory[ni] or R.recommend[i]
        cur, ch, verdict = _choose(R.tstates[i], r, advice, R.allowed_of[i],
                                   {p: score_l[k] for p, k in mine.items()},
                                   current_l[i], ctl,
                                   {p: (low_l[k], high_l[k]) for p, k in mine.items()}
                                   if has_slo_l[i] else None,
                                   slo_l[i] if has_slo_l[i] else None,
                                   {p: raw_l[k] for p, k in mine.items()})
        R.choices.append(ch)
        R.verdicts.append(verdict)
        R.before_pol.append(cur)
        k_run = int(R.run_row[i])
        if R.recommend[i] and not R.advisory[ni]:
            # advice a node could follow: sized for the policy advised
            R.alloc_row[i] = mine.get(ch.policy, k_run)
        elif R.advisory[ni]:
            R.alloc_row[i] = k_run
        elif (ch.switched and not ch.trial) or k_run < 0:
            # a trial is sized as the policy it is judged against ran
            R.alloc_row[i] = mine.get(ch.policy, -1)
        else:
            R.alloc_row[i] = k_run
    R.has_curve = R.alloc_row >= 0


def _phase_history(R: Round, at: np.ndarray, ctl) -> list[list]:
    """Per row, the curves of its last reports (at most WINDOWS) that are
    of its present phase (_phase_windows), oldest first."""
    hist = [recent_curves(st, r)[-WINDOWS:] for st, (_, _, r) in zip(R.tstates, R.rows)]
    first = _phase_windows(R, hist, at, ctl.curve_error_sigmas)
    return [h[f:] for h, f in zip(hist, first)]


def _window_spread(R: Round, at: np.ndarray, hist: list) -> tuple[np.ndarray, np.ndarray]:
    """Per bank row, the mean and the standard deviation of its policy's
    miss ratio at `at` over the tenant's last reports' curves of its
    current phase (`hist`, this report's among them; one curve: its
    value, no deviation).  One interval's curve is one window of a
    workload whose behaviour over longer periods it may not show: under
    mru a loop longer than the window reads as missing nothing in one
    window and everything a few windows on, as the loop comes round, and
    a switch on the best window bought a tenant nothing (corpus scenario
    04).  The deviation across windows measures that, and the sampling's
    own noise with it."""
    bank, owner = _window_bank((hist[t], p) for t, p in
                               zip(R.row_tenant.tolist(), R.row_policy))
    m = np.clip(bank.miss_at(np.arange(bank.n), at[owner], raw=True), 0.0, 1.0)
    count = np.maximum(np.bincount(owner, minlength=R.bank.n), 1)
    mean = np.bincount(owner, weights=m, minlength=R.bank.n) / count
    sq = np.bincount(owner, weights=(m - mean[owner]) ** 2, minlength=R.bank.n)
    return mean, np.sqrt(sq / np.maximum(count - 1, 1))


def _pool_phase(R: Round, hist: list, ctl) -> None:
    """R.bank rebuilt on each (tenant, policy)'s curve pooled over the
    windows of its present phase (`hist`): every point the mean of the
    windows' miss ratios there, weighted by the accesses each window
    counted.  What the round reads of a curve from here on -- the sizes
    SLOs need, the allocation's hulls, the predictions -- then rests on
    all the samples of the phase rather than on one interval's: a tenant
    of a few hundred reads an interval, sampled at 0.01, has a handful
    of samples a window, and a cliff that one window moves by several
    MiB took a loop's memory on a single window's word (corpus scenario
    04 at 0.01).  An exact curve is its window's truth and is read as it
    is: pooled, a cache's filling windows held its curve above what it
    now misses (corpus scenario 13 fell from 3.57x to 2.77x)."""
    curves = []
    for k, (t, p) in enumerate(zip(R.row_tenant.tolist(), R.row_policy)):
        own = R.bank.curves[k]
        mine = [c for cs in hist[t] for c in cs if c.policy == p]
        if len(mine) < 2 or not 0.0 < own.rate < 1.0:
            curves.append(own)
            continue
        counted = [_window_accesses(c) for c in mine]
        weighed = all(v > 0 for v in counted)
        w = np.asarray(counted if weighed else [1.0] * len(mine))
        ys = sum(wi * (c.miss_ratio if c.sizes is own.sizes or np.array_equal(c.sizes, own.sizes)
                       else np.interp(own.sizes, c.sizes, c.miss_ratio))
                 for wi, c in zip(w.tolist(), mine)) / float(w.sum())
        meta = dict(own.meta or {})
        if weighed:
            meta["window_accesses"] = float(sum(counted))
        curves.append(MRC.checked(own.sizes, ys, p, own.method, own.rate, meta))
    R.bank = CurveBank(curves, ctl.curve_error_sigmas)


def _window_bank(groups, sigmas: float = 0.0) -> tuple[CurveBank, np.ndarray]:
    """One bank of the curves of every (windows, policy) group -- the
    group's policy's curve from each of its windows (a report's curves) --
    and, per bank row, the group it came from."""
    curves, owner = [], []
    for k, (windows, policy) in enumerate(groups):
        mine = [c for cs in windows for c in cs if c.policy == policy]
        curves.extend(mine)
        owner.extend([k] * len(mine))
    return CurveBank(curves, sigmas), np.asarray(owner, dtype=np.int64)


def _phase_windows(R: Round, hist: list, at: np.ndarray, sigmas: float) -> list[int]:
    """Per row, the first of its windows (`hist`) in the running policy's
    present phase: after the last whose curve of the running policy read
    more than WINDOW_SHIFT from this report's, at the tenant's `at`, or
    more than `sigmas` of the two windows' sampling error if that is more
    (at 0.01, a window of a few hundred reads counts a handful)."""
    curves, owner, index = [], [], []
    row_at = np.zeros(R.n)
    row_at[R.row_tenant] = at
    for i, (_, _, r) in enumerate(R.rows):
        for j, cs in enumerate(hist[i]):
            c = next((c for c in cs if c.policy == r.policy), None)
            if c is not None:
                curves.append(c)
                owner.append(i)
                index.append(j)
    first = [0] * R.n
    if not curves:
        return first
    bank = CurveBank(curves)
    m = np.clip(bank.miss_at(np.arange(bank.n), row_at[np.asarray(owner)], raw=True), 0.0, 1.0)
    # a window's own sampling error: a move no larger than that is noise,
    # not a phase
    var = _ratio_variance(curves, m)
    now = dict(zip(owner, zip(m.tolist(), var.tolist())))   # the newest window comes last
    for i, j, v, e in zip(owner, index, m.tolist(), var.tolist()):
        shift = max(WINDOW_SHIFT, sigmas * math.sqrt(e + now[i][1]))
        if abs(v - now[i][0]) > shift:
            first[i] = j + 1
    return first


def _doubt(R: Round, ctl, at: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per bank row, the miss ratio its policy is scored worse by, and the
    part of that which is its sampling's own error.  A challenger
    (neither the policy running nor the baseline) is scored worse by DOUBT plus
    `curve_error_sigmas` of its curve's error, which has two parts: the
    spread of its curve over the tenant's last windows (_window_spread),
    and the error a curve sampled at its rate has at its size (_sampling_sd).
    A lead that so small an error in a curve could make is no lead: curves
    of policies that have not run err more than the one that runs, and a
    tenant at a low miss ratio reads a gain of several per cent in a
    difference of 0.005; a curve that swings from window to window is
    worth what its windows say together; and a curve sampled at 0.01 of a
    small cache simulates a few dozen pages, whose miss ratio errs by
    several hundredths however steady it reads.  The baseline is scored as
    it is: going back to it is about the hooks' CPU, not about trusting a
    curve.  A trial (a lead only the doubt hides, judged by what the
    tenant then serves) bets on the doubt's other parts but not on the
    sampling's: a lead a sample could make up is no lead to try either
    (at 0.01, uniform tenants whose policies all miss alike were tried
    on leads of 7 % and sent back).  Exact curves have none."""
    baseline, running = _roles(R, ctl)
    challenger = ~baseline & ~running
    sd, k = _sampling_sd(R, at, m), ctl.curve_error_sigmas
    return (np.where(challenger, DOUBT + k * np.hypot(R.m_sd, sd), 0.0),
            np.where(challenger, k * sd, 0.0))


def _taught(R: Round, ctl) -> np.ndarray:
    """Per bank row, the miss ratio a policy not running is read worse by
    for what the tenant's failed switches taught: a challenger (neither
    the policy running nor the baseline) by the most a failed challenger's
    curve promised beyond what the tenant then missed, this phase; the
    baseline by the same of a failed return to it (_hold_siblings).  It
    is no doubt but a measured error, so a trial (a lead only the doubt
    hides) is read with it too: the same lead on the same evidence is not
    tried again, under the policy that failed or a sibling, nor the same
    return to the baseline."""
    taught = np.fromiter((t.overpromise for t in R.tstates), dtype=np.float64,
                         count=R.n)[R.row_tenant]
    base = np.fromiter((t.baseline_overpromise for t in R.tstates), dtype=np.float64,
                       count=R.n)[R.row_tenant]
    baseline, running = _roles(R, ctl)
    return np.where(running, 0.0, np.where(baseline, base, taught))


def _roles(R: Round, ctl) -> tuple[np.ndarray, np.ndarray]:
    """Per bank row, whether its policy is the baseline, and whether it is
    the one its tenant runs; a challenger is neither."""
    baseline = np.fromiter((p == ctl.autopilot_baseline for p in R.row_policy),
                           dtype=bool, count=R.bank.n)
    return baseline, np.arange(R.bank.n) == R.run_row[R.row_tenant]


def _sampling_sd(R: Round, at: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per bank row, the standard deviation of its curve's miss ratio `m`
    at `at` pages that comes of sampling; 0 for an exact curve.  Two
    errors add: the measured error of its policy's miniature simulation
    (models/minisim_error.json) at the pages its sample holds there (the
    curve's rate x `at`), and a ratio's error over the few accesses it
    was counted on (rate x the window's accesses): a tenant of a few
    hundred accesses a second, sampled at 0.01, is judged on a handful
    (not counted where the curve does not say how many it saw)."""
    curves = R.bank.curves
    rate = np.fromiter((c.rate if 0.0 < c.rate < 1.0 else 1.0 for c in curves),
                       dtype=np.float64, count=R.bank.n)
    sd = np.zeros(R.bank.n)
    sampled = rate < 1.0
    policy = np.asarray(R.row_policy, dtype=object)
    for p in set(policy[sampled].tolist()):
        rows = sampled & (policy == p)
        sd[rows] = minisim_error.error_sd(p, rate[rows] * at[rows])
    return np.hypot(sd, np.sqrt(_ratio_variance(curves, m)))


def _ratio_variance(curves, m: np.ndarray) -> np.ndarray:
    """Per curve, the variance of its miss ratio `m` as a ratio over the
    accesses its window sampled (its rate x the window's accesses); 0 for
    an exact curve, or one that does not say how many it saw."""
    counted = np.fromiter(((c.rate if 0.0 < c.rate < 1.0 else 0.0) * _window_accesses(c)
                           for c in curves), dtype=np.float64, count=len(curves))
    m = np.clip(m, 0.0, 1.0)
    return np.where(counted > 0, m * (1.0 - m) / np.maximum(counted, 1.0), 0.0)


def _window_accesses(curve) -> float:
    """The accesses a curve was made over (its meta's window_accesses),
    0 where it does not say."""
    v = _meta_figure(curve, "window_accesses")
    return v if math.isfinite(v) and v > 0 else 0.0


def _policy_needs(R: Round, a_h: np.ndarray, b_r: np.ndarray):
    """Per bank row, the least size (pages) at which its policy meets the
    tenant's SLO, read on the same curve and hook-stretched model its score
    is, as a range: (if the curve errs low, if it errs high), by the miss
    ratio the tenant's curve has been seen to err (R.m_spread, at least
    NEED_ERROR).  inf where no size does or the tenant has no SLO.  What a
    policy saves in memory when it ties in throughput
    (autopilot.choose_policy) must hold across that range: where a curve
    is flat, a small error in it is a large one in size."""
    s = R.slo[R.row_tenant]
    m_star = model.miss_ratio_for(a_h, b_r, s)
    err = np.maximum(R.m_spread[R.row_tenant] if R.m_spread is not None else 0.0, NEED_ERROR)
    rows = np.arange(R.bank.n)
    out = []
    for m in (m_star + err, m_star - err):
        need = R.bank.size_for(rows, m)
        out.append(np.where((s > 0) & (m_star >= 0) & (m >= 0), need, np.inf))
    return out


NEED_ERROR = 0.01       # miss ratio: the least error assumed of any curve


def _choose(st: TenantState, r: TenantReport, advisory: bool, allowed: list[str],
            scores: dict[str, float], limit_pages: float, ctl,
            needs: dict[str, tuple[float, float]] | None = None,
            slo: float | None = None, raw_scores: dict[str, float] | None = None):
    """One tenant's policy for this round: (the policy in force, the
    choice, the watchdog's verdict or None).

    In force is what the node reports running -- except where directives
    are advice (an advisory node, a tenant in recommend mode): nothing we
    direct runs there, and the autopilot follows its own last
    recommendation instead.  A switch the node carried out goes on
    probation; a failed probation sends the tenant back to the old policy.
    A challenger that only the doubt beyond its sampling's error holds
    back is tried (engine/autopilot.py) where the tenant ran the policy in force at
    this limit over its last reports: what it served then is the trial's
    reference.  One trial a phase: among many policies, whichever curve
    the sampling flattered most leads, and trying each in turn would keep
    the tenant on trial.  Not where an SLO is met (or the reference has
    no throughput to tell): a trial that serves less misses it for the
    intervals it runs, and a met SLO is not traded for a curve's promise."""
    if advisory:
        cur = st.policy if st.policy is not None else r.policy
        return cur, choose_policy(cur, allowed, scores, st, ctl.autopilot_threshold,
                                  ctl.autopilot_k, baseline=ctl.autopilot_baseline,
                                  needs=needs,
                                  memory_threshold=MEMORY_THRESHOLD), None
    cur = r.policy
    verdict = watchdog.check(st, r, limit_pages, WATCHDOG_INTERVALS, WATCHDOG_MARGIN,
                             WATCHDOG_COOLDOWN, slo, (st.a, st.b),
                             ctl.autopilot_threshold / 2)
    if verdict is not None and not verdict.kept and verdict.old in allowed:
        st.streak, st.streak_policy = 0, None
        _hold_siblings(st, verdict, allowed, ctl.autopilot_baseline)
        return cur, PolicyChoice(verdict.old, True, verdict.old, 0.0,
                                 f"watchdog: back to {verdict.old}: {verdict.reason}"), verdict
    reference = watchdog.trial_reference(st, cur, r.limit_bytes,
                                         st.rounds - ctl.warmup_intervals) \
        if st.probation is None and not st.trial_done else None
    if reference is not None and slo is not None and not reference[1] < slo:
        reference = None    # a met SLO (or one it cannot tell) is not risked on a trial
    if reference is not None and raw_scores and cur in raw_scores:
        raw_scores = _within_window(raw_scores, cur, {p: _showable(r, p) for p in raw_scores})
    ch = choose_policy(cur, allowed, scores, st, ctl.autopilot_threshold, ctl.autopilot_k,
                       watchdog.held_off(st), ctl.autopilot_baseline, needs,
                       MEMORY_THRESHOLD, raw_scores, reference is not None)
    if ch.switched and cur in allowed:
        watchdog.start(st, ch.policy, cur, reference if ch.trial else None)
        st.trial_done = st.trial_done or ch.trial
    if verdict is not None and verdict.kept:
        ch.reason = f"{ch.reason}; {verdict.reason}" if ch.reason != "keep" else verdict.reason
    return cur, ch, verdict


def _showable(r: TenantReport, policy: str) -> float:
    """The share of `policy`'s lead a trial of it can show before the
    watchdog judges it: the watchdog waits for a switch to settle
    (watchdog._settled: the caches' worth of inserted pages the policy
    was measured to need, models/policy_settling.json) for at most
    1 + TRIAL_SLACK reports, then judges WATCHDOG_INTERVALS of them; the
    reports judged before the policy settles show none of its lead.  1
    where the report's rates cannot tell (no discount)."""
    rate, seconds = float(r.inserts_per_s), float(r.interval_s)
    pages = float(r.usage_file_bytes) / PAGE_SIZE
    if not (math.isfinite(rate) and math.isfinite(seconds) and rate >= 0 and seconds > 0
            and pages > 0):
        return 1.0
    settle = watchdog.settling_pages(policy, r) / (rate * seconds) if rate > 0 else math.inf
    last = 1 + watchdog.TRIAL_SLACK + WATCHDOG_INTERVALS
    return min(1.0, max(0.0, (last - settle) / WATCHDOG_INTERVALS))


def _within_window(raw_scores: dict[str, float], cur: str,
                   share: dict[str, float]) -> dict[str, float]:
    """Each challenger's score with its lead over `cur` cut to the share
    of it a trial's window can show (_showable): a lead a trial cannot
    show in time is undone by the watchdog however real it is."""
    base = raw_scores[cur]
    return {p: v if p == cur else base + share[p] * (v - base)
            for p, v in raw_scores.items()}


def _hold_siblings(st: TenantState, verdict, allowed: list[str],
                   baseline: str | None) -> None:
    """A switch undone holds off, beside the policy that failed, every
    other challenger (neither the policy gone back to nor the baseline)
    as long: their curves come from the same sampled stream through the
    same kind of miniature simulation, and one that overpromised for this
    tenant says the rest may too.  Tried one after another, siblings that
    overpromise the same way cost the tenant a revert each (issue 45's web
    tenant: six switches and six reverts in 60 intervals).  The holds end
    with the phase (_follow_phases): a new phase is new evidence.

    What the failed policy's curve promised beyond what the tenant then
    missed (the verdict's observed less its curve's prediction) is kept
    too, the most of it this phase (TenantState.overpromise; for a
    return to the baseline that failed, baseline_overpromise): every
    challenger (or the baseline) is read with it from now on (_taught),
    so once the holds end, a lead no larger than the last one that failed
    is not tried again on the same evidence."""
    gap = verdict.observed - verdict.predicted_new
    if math.isfinite(gap) and gap > 0:
        if verdict.new == baseline:
            st.baseline_overpromise = max(st.baseline_overpromise, float(gap))
        else:
            st.overpromise = max(st.overpromise, float(gap))
    until = st.held_until.get(verdict.new)
    if until is None:
        return
    for p in allowed:
        if p not in (verdict.old, baseline, verdict.new):
            st.held_until[p] = max(st.held_until.get(p, until), until)


def size_slos(R: Round, ctl) -> None:
    """Read the allocation's curve backwards for the least size meeting
    each SLO (and, for the record, every policy's curve); with headroom
    where the SLO is feasible.  An SLO no size meets gets no size here: it
    is weighed in the marginal stage instead (allocate_memory).

    Feasibility is debounced (_debounce_feasibility): a round's verdict
    rests on one sampled curve and a model fitted on noisy intervals, and
    taken as it comes it would move a tenant between its SLO's need and
    its curve's best every other round.  The headroom is the tenant's own
    observed spread (R.spread, `slo_headroom_sigmas` of it), at least
    `slo_headroom`."""
    bank, a, b, lb, ub, alloc_row = R.bank, R.a, R.b, R.lb, R.ub, R.alloc_row
    slo, has_slo = R.slo, R.has_slo
    if bank.n:
        m_star = model.miss_ratio_for(a[R.row_tenant], b[R.row_tenant], slo[R.row_tenant])
        R.need_rows = np.where(m_star < 0, np.inf, bank.size_for(np.arange(bank.n), m_star))
        need = np.where(R.has_curve, R.need_rows[np.maximum(alloc_row, 0)], np.inf)
    else:
        R.need_rows = np.zeros(0)
        need = np.full(R.n, np.inf)
    need = np.where(has_slo & (slo <= 0), 0.0, need)
    R.feasible = np.isfinite(need) & (np.maximum(need, lb) <= ub)
    R.feasible_now = R.feasible.copy()
    R.need = np.where(R.feasible, np.maximum(need, lb), np.inf)
    _debounce_feasibility(R, ctl)
    R.need_safe = R.need.copy()
    spread = R.spread if R.spread is not None else np.zeros(R.n)
    R.headroom = np.maximum(SLO_HEADROOM, SLO_HEADROOM_SIGMAS * spread)
    R.headroom = np.minimum(R.headroom, MAX_HEADROOM)
    m_spread = R.m_spread if R.m_spread is not None else np.zeros(R.n)
    hr = np.flatnonzero(R.feasible & has_slo & (slo > 0) & R.has_curve &
                        ((R.headroom > 0) | (m_spread > 0)))
    if len(hr):
        m_safe = model.miss_ratio_for(a[hr], b[hr], slo[hr] * (1 + R.headroom[hr]))
        # and below the SLO's miss ratio by the curve's own observed error
        m_star = model.miss_ratio_for(a[hr], b[hr], slo[hr])
        m_safe = np.where(m_star >= 0, np.minimum(
            m_safe, m_star - SLO_HEADROOM_SIGMAS * m_spread[hr]), m_safe)
        safe = _recent_size_for(R, hr, m_safe, ctl)
        safe = np.where(m_safe < 0, np.inf, safe)
        R.need_safe[hr] = np.where(np.isfinite(safe), np.clip(safe, R.need[hr], ub[hr]),
                                   R.need[hr])
    _slo_feedback(R, ctl)
    R.served_at = np.full(R.n, np.inf)
    if len(hr):
        R.served_at[hr] = _seen_meeting(R, hr, slo[hr] * (1 + R.headroom[hr]))
        R.need_safe[hr] = np.maximum(np.minimum(R.need_safe[hr], R.served_at[hr]),
                                     R.need[hr])
        for i in hr.tolist():
            R.tstates[i].slo_safe_pages = float(R.need_safe[i])


def _seen_meeting(R: Round, rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Per row, the limit (pages) at which the tenant was seen to serve
    `wanted` (its SLO with headroom) in every one of its latest reports
    at the limit it holds (two at least, as many as
    TenantState.recent_obs keeps), under the policy the allocation reads;
    inf where it was not.  A size served is evidence no curve overrules (a
    cache still filling at it will serve more): an SLO tenant's new
    zipf phase, its curve erring by a share of its sizes and read as
    erring by a miss ratio on a flat tail, was sized at 45 MiB where 32
    MiB served it with room in every interval (corpus scenario 03, its
    SLO a little lower; tests/test_engine_mechanisms.py).  Not while the
    SLO feedback holds an extra from intervals missed (_slo_feedback):
    a few reports met do not outweigh a miss rate it is still answering
    (capped there, corpus scenario 09's kv-1 met its SLO in 94 % of the
    intervals the equal split met it in all)."""
    out = np.full(len(rows), np.inf)
    for k, i in enumerate(rows.tolist()):
        st, r = R.tstates[i], R.rows[i][2]
        ar = int(R.alloc_row[i])
        if ar < 0 or R.row_policy[ar] != r.policy or st.slo_extra_pages > 0:
            continue
        served = [t for _, t in watchdog.latest_run(st, r.policy, r.limit_bytes,
                                                    len(st.recent_obs))]
        if len(served) >= 2 and all(math.isfinite(t) and t >= wanted[k] for t in served):
            out[k] = r.limit_bytes / PAGE_SIZE
    return out


def _slo_feedback(R: Round, ctl) -> None:
    """Raise each feasible SLO's safe size by what its misses said.  The
    interval just reported is judged only if the tenant then held at least
    the safe size it was given (else the miss says the node lacked memory,
    not that the size was short), its cache was no longer filling (a miss
    while it fills says the cache has not reached that size yet: judged
    so, a slowly filling SLO was sized half again over its need, out of a
    loop's memory) and it is past warm-up.  The extra moves by
    a stochastic-approximation step toward the size at which the SLO is
    missed in 1 - slo_target_share of the intervals: up on a miss, down a
    little on each met interval, never below nothing."""
    step = FEEDBACK_STEP
    rows = np.flatnonzero(R.feasible & R.has_slo & (R.slo > 0) & R.has_curve)
    for i in rows.tolist():
        st = R.tstates[i]
        r = R.rows[i][2]
        extra = st.slo_extra_pages
        held = st.slo_safe_pages is not None and \
            r.limit_bytes / PAGE_SIZE >= 0.99 * st.slo_safe_pages
        if step > 0 and held and not R.filling[i] and st.rounds > ctl.warmup_intervals and \
                r.throughput is not None and math.isfinite(r.throughput):
            unit = step * float(R.mem_pages[R.node_of[i]])
            missed = r.throughput < R.slo[i]
            extra += unit * (ctl.slo_target_share if missed else ctl.slo_target_share - 1.0)
            extra = min(max(extra, 0.0), float(R.ub[i]))
        R.need_safe[i] = min(float(R.need_safe[i]) + extra, float(R.ub[i]))
        st.slo_extra_pages = extra
        st.slo_safe_pages = float(R.need_safe[i])


def recent_curves(st: TenantState | None, report) -> list:
    """The tenant's recent reports' curves, oldest first, `report`'s last
    (a round has appended it already; a prediction has not)."""
    history = list(st.recent_curves) if st is not None else []
    if not history or history[-1] is not report.curves:
        history.append(report.curves)
    return history


def _recent_size_for(R: Round, rows: np.ndarray, m_safe: np.ndarray, ctl) -> np.ndarray:
    """Pages at which each row's allocation policy misses <= m_safe,
    averaged over the tenant's recent reports' curves of that policy (the
    newest among them; not those of its warm-up).  One interval's sampled
    curve puts the size an SLO needs anywhere within several MiB; sized on
    it alone, an SLO tenant's limit follows that noise down as readily as
    up, and a dip below the real need that two rounds confirm is an
    interval missed.  The average of a few curves moves by a fraction of
    that.  A phase that needs more still gets it at once: the newest
    curve's own need (R.need) is the floor of the safe size.  A curve that
    never gets down to m_safe (its floor, one interval's cold misses, lies
    above it) counts with where it reaches that floor."""
    def group(i):
        st = R.tstates[i]
        keep = min(SAFE_HISTORY, max(1, st.rounds - ctl.warmup_intervals))
        return (recent_curves(st, R.rows[i][2])[-keep:], R.row_policy[int(R.alloc_row[i])])
    hist, owner = _window_bank((group(i) for i in rows.tolist()), ctl.curve_error_sigmas)
    at = np.arange(hist.n)
    floor = hist.ys[hist.end(at)]
    sizes = hist.size_for(at, np.maximum(m_safe[owner], floor + FLOOR_SLACK))
    total = np.bincount(owner, weights=sizes, minlength=len(rows))
    count = np.bincount(owner, minlength=len(rows))
    return np.where(count > 0, total / np.maximum(count, 1), np.inf)


SAFE_HISTORY = 6        # reports' curves an SLO's safe size is averaged over
FLOOR_SLACK = 0.002     # above a curve's floor, where it counts as reaching it
MAX_HEADROOM = 1.0      # an SLO is never sized for more than twice itself
SLO_HISTORY = 20        # rounds of feasibility verdicts kept per tenant


def _debounce_feasibility(R: Round, ctl) -> None:
    """Make R.feasible / R.need the verdict in force rather than this
    round's own: a change takes effect once `slo_feasibility_rounds`
    rounds in a row agree on it.  Until then a tenant judged feasible
    keeps the need it had when last judged so (within its bounds now),
    and one judged infeasible stays served as infeasible.  R.infeasible_share
    is, per row, the share of its last SLO_HISTORY rounds whose own verdict
    was that no size meets the SLO (reported with its violations)."""
    k = FEASIBILITY_ROUNDS
    R.infeasible_share = np.zeros(R.n)
    for i in np.flatnonzero(R.has_slo & (R.slo > 0) & R.has_curve).tolist():
        st = R.tstates[i]
        now = bool(R.feasible[i])
        st.slo_history = (list(st.slo_history) + [now])[-SLO_HISTORY:]
        R.infeasible_share[i] = st.slo_history.count(False) / len(st.slo_history)
        if st.slo_feasible is None or now == st.slo_feasible:
            st.slo_feasible, st.slo_disagree = now, 0
        else:
            st.slo_disagree += 1
            if st.slo_disagree >= k:
                st.slo_feasible, st.slo_disagree = now, 0
        if st.slo_feasible and now:
            st.slo_need_pages = float(R.need[i])
        elif st.slo_feasible and not now:
            held = st.slo_need_pages if st.slo_need_pages is not None else R.ub[i]
            R.need[i] = float(np.clip(held, R.lb[i], R.ub[i]))
            R.feasible[i] = True
        elif not st.slo_feasible and now:
            R.need[i] = np.inf
            R.feasible[i] = False


FLOOR_ROUNDS = 2        # rounds over which a curve's floor is seen to fall
FLOOR_FALL = 0.05       # ... by more than this share of itself: still warming


def _hold_warming(R: Round, ctl) -> tuple[np.ndarray, np.ndarray]:
    """(need, need_safe) for serving SLOs: as sized, except for an SLO no
    size meets whose curve's floor fell by more than FLOOR_FALL over the
    last FLOOR_ROUNDS rounds (or that is too new to tell).  Such a floor
    is the cache's cold misses (pages read for the first time), and they
    fall as it warms, so the verdict says nothing yet: the tenant keeps
    the memory it holds, and its SLO comes before throughput for it, until
    its curve is warm and sizes it.  It is not grown meanwhile: a need
    nobody knows is no claim on another tenant's memory (grown a step a
    round while it missed, such an SLO took a loop's memory the round its
    first pass came round, bench_scenarios corpus scenario 04).  A floor
    that has stopped falling is the tenant's own, and the SLO out of reach
    competes for memory by throughput like any tenant (allocate_memory)."""
    need, need_safe = R.need.copy(), R.need_safe.copy()
    rows = np.flatnonzero(R.has_slo & (R.slo > 0) & R.has_curve)
    floor_of = R.bank.ys[R.bank.end(R.alloc_row[rows])] if len(rows) else np.zeros(0)
    for i, floor in zip(rows.tolist(), floor_of.tolist()):
        st = R.tstates[i]
        floors = (list(st.floors) + [floor])[-(FLOOR_ROUNDS + 1):]
        st.floors = floors
        # a tenant too new to have FLOOR_ROUNDS rounds behind it is warming too
        falling = len(floors) <= FLOOR_ROUNDS or floors[-1] < (1 - FLOOR_FALL) * floors[0]
        if R.feasible[i] or not falling:
            continue
        need[i] = need_safe[i] = float(np.clip(R.current[i], R.lb[i], R.ub[i]))
    return need, need_safe


def allocate_memory(R: Round, ctl) -> None:
    """Targets: SLOs by priority, then the rest by marginal throughput on
    the hulls (engine/allocate.py); a row without a curve keeps its limit."""
    node_of, nn, has_curve, lb = R.node_of, len(R.nodes), R.has_curve, R.lb
    R.target = np.clip(np.where(R.limit_now > 0, R.limit_now, R.equal), lb, R.ub)
    fixed_use = np.bincount(node_of, weights=np.where(has_curve, 0.0, R.target),
                            minlength=nn)
    order = np.arange(R.n)            # rows are already in (node, name) order
    need, need_safe = _hold_warming(R, ctl)
    R.phase_hold = _hold_new_phase(R)
    phase_held = np.fromiter((h is not None for h in R.phase_hold), dtype=bool, count=R.n)
    hold_at = np.minimum(R.limit_now, R.ub)
    hold_at = np.where(phase_held, hold_at, np.minimum(hold_at, R.fill_reach))
    held = phase_held | R.filling
    R.x_lo, R.granted = allocate.serve_slos(
        node_of, R.mem_pages - fixed_use, np.where(has_curve, lb, 0.0),
        need, R.has_slo & has_curve, R.column(lambda s, r: s.priority), order,
        need_safe, np.where(held & has_curve, hold_at, 0.0))
    over = np.bincount(node_of, weights=lb, minlength=nn) > R.mem_pages
    for ni in np.flatnonzero(over).tolist():
        R.notes.append(f"node {R.nodes[ni]!r}: floors and anonymous memory (+ margin) add "
                       f"up to more than the node; limits stay at those safety bounds")
    cr = np.flatnonzero(has_curve)
    if not len(cr):
        return
    budget = (R.mem_pages - fixed_use
              - np.bincount(node_of[cr], weights=R.x_lo[cr], minlength=nn))
    pxs, pys = R.bank.padded(R.alloc_row[cr])
    a_w, b_w = R.a[cr], R.b[cr]
    if ctl.objective == "relative":
        # gains in units of the tenant's own throughput at an equal
        # share: throughput(k a, k b, m) = throughput(a, b, m) / k
        t_eq = model.throughput(a_w, b_w, R.bank.miss_at(R.alloc_row[cr], R.equal[cr]))
        k = np.where(np.isfinite(t_eq) & (t_eq > 0), t_eq, 1.0)
        a_w, b_w = a_w * k, b_w * k
    R.target[cr] = allocate.distribute(node_of[cr], budget, R.x_lo[cr], R.ub[cr],
                                       pxs, pys, a_w, b_w)
    R.t_sigma = prediction_sigma(R)
    if ctl.reallocation_gain > 0:
        # the incumbent is last round's target, not the limits in force:
        # a move the step cut short goes on to where it was decided
        incumbent = np.where(R.prev_target > 0, R.prev_target, R.current)
        detail = {}
        R.target[cr], kept = allocate.keep_unless_better(
            node_of[cr], budget, R.x_lo[cr], R.ub[cr], incumbent[cr], R.target[cr],
            pxs, pys, a_w, b_w, ctl.reallocation_gain, R.t_sigma[cr], detail)
        R.kept = np.zeros(R.n, dtype=bool)
        R.kept[cr] = kept[node_of[cr]]
        R.kept_shrink = np.ones(R.n)
        R.kept_shrink[cr] = detail["shrink"][node_of[cr]]


PRIOR_WEIGHT = 2        # scored predictions the model's own spread counts as (prediction_sigma)


def prediction_sigma(R: Round) -> np.ndarray:
    """Per row, the relative error to expect of the tenant's modelled
    throughput: the root mean square of log(observed / predicted) over
    its scored decisions (TenantState.t_errors), with the model's own
    spread around its observations (R.spread) standing for PRIOR_WEIGHT
    of them -- a tenant with no record is trusted as far as its fit, one
    whose moves keep missing what they promised (a cache that refills
    slowly, a curve that flatters) as far as its record.  The error's
    mean counts, not only its spread: a tenant whose predictions are all
    20 % high is 20 % uncertain to a comparison with others."""
    spread = R.spread if R.spread is not None else np.zeros(R.n)
    out = np.empty(R.n)
    for i, st in enumerate(R.tstates):
        e = st.t_errors
        out[i] = math.sqrt((sum(x * x for x in e) + PRIOR_WEIGHT * float(spread[i]) ** 2)
                           / (len(e) + PRIOR_WEIGHT))
    return out


PHASE_HOLD_ROUNDS = 8   # most rounds a new phase is held, and a filling cache looks ahead
PHASE_CAUGHT_UP = 0.1   # |observed - curve| miss ratio at which its curve has caught up


def _hold_new_phase(R: Round) -> list:
    """Per row, (curve, observed) miss ratio where the tenant's limit is held
    this round, else None.  A tenant whose phase changed (_follow_phases)
    is not cut until its running policy's curve reads the miss ratio it
    observes, at the memory it holds, within PHASE_CAUGHT_UP -- or for
    PHASE_HOLD_ROUNDS rounds at most.  The agent's curves of a new phase
    rest on the old phase's samples for a window or two, and a slow
    tenant's window closes only once it holds enough samples, several
    intervals: make e2e's search, its passes turned into lookups, was read
    by its curves as missing three times what it missed, modelled at a
    fifth of what it served, and cut to a fifth of its file in two rounds
    -- a size where the best policy is another.  Sized on the stale curve
    it is starved; held, it keeps what it had until the curve is its own.
    The report of a jump not yet confirmed (core/phase.py) is held too.
    None in a what-if of where a placement settles (Round.settled): a
    hold lasts a few rounds, and a tenant moved to another host leaves
    the phase change it holds for behind with its cache.
    SLOs' needs come first, their headroom after the hold (make e2e: kv's
    and zipf's headroom cut the held lookups to 24 MiB)."""
    out = [None] * R.n
    if R.settled:
        return out
    for i, (_, _, r) in enumerate(R.rows):
        st = R.tstates[i]
        since = st.phase_since
        if st.ops_pending is not None:
            # a jump the next report must confirm: a new phase's first
            # report, or a cache cut or refilled -- not a steady state to
            # cut on either way
            out[i] = (math.nan, float(r.miss_ratio))
            continue
        if since is None:
            continue
        if st.rounds - since >= PHASE_HOLD_ROUNDS:
            st.phase_since = None
            continue
        # the round that saw the change straddles both phases: not evidence
        predicted = watchdog.curve_at_held(r, R.current[i]) if st.rounds > since else None
        if predicted is not None and abs(predicted - r.miss_ratio) <= PHASE_CAUGHT_UP:
            st.phase_since = None
            continue
        out[i] = (math.nan if predicted is None else predicted, float(r.miss_ratio))
    return out


def step_limits(R: Round, ctl) -> None:
    """Move limits toward the targets under the step limit and hysteresis,
    never below the safety bounds; a shrink only once it is confirmed
    (_confirm_shrinks)."""
    R.target_wanted = R.target.copy()
    _confirm_shrinks(R, ctl)
    R.step = {}
    new = allocate.step_limit(R.node_of, R.mem_pages, R.current, R.target, R.lb, R.ub,
                              ctl.max_step_fraction, ctl.hysteresis, R.step)
    R.step["stepped"] = new
    R.new = np.maximum(new, R.lb)


def _confirm_shrinks(R: Round, ctl) -> None:
    """For a tenant with an SLO, a target below the limit in force counts
    only as far as the last `shrink_after_rounds` rounds' targets all
    agree: the target becomes the largest of them, never above the limit
    in force.  One interval's curve (a phase's first window, a sampled
    curve's noise) can make a tenant's memory look useless for a round;
    taken at once, that moved a tenant 179 -> 97 -> 177 MiB in
    consecutive rounds.  A tenant without an SLO gives memory up at once
    (an SLO's growth does not wait for it), growth is never delayed, and
    the step and safety bounds still apply after this."""
    k = SHRINK_ROUNDS
    R.shrink_held = np.zeros(R.n, dtype=bool)
    for i in np.flatnonzero(R.has_curve & R.has_slo).tolist():
        st = R.tstates[i]
        raw = float(R.target[i])
        recent = list(st.recent_targets)[-(k - 1):] if k > 1 else []
        st.recent_targets = (recent + [raw])[-max(k - 1, 1):] if k > 1 else []
        if raw >= R.current[i] or len(recent) < k - 1:
            continue
        agreed = min(max(recent + [raw]), float(R.current[i]))
        if agreed > raw:
            R.target[i] = agreed
            R.shrink_held[i] = True


OBSERVE_AFTER = 1       # reports after a decision that score its prediction (engine/emit.py)
FILL_STEPS = 32         # steps _trajectory integrates a cache's growth in


def predict(R: Round) -> None:
    """Modelled throughput at the target; at the new limit on the
    allocation's curve over the next interval, whose report scores it
    (a later report would score the next round's decision as much as
    this one's): the mean, over that interval, of what the tenant misses
    as its cache grows into a raised limit (_trajectory) and reshapes
    under its policy (_anchored); and before: the running policy at the
    limit in force.  A mean, not a reading at the interval's middle: a
    loop raised to fit misses every access until one pass is in and none
    after, and read where the cache stood half-way it was predicted to
    miss nothing over an interval whose first third missed everything."""
    R.pred_target = np.full(R.n, np.nan)
    R.pred_new = np.full(R.n, np.nan)
    R.pred_old = np.full(R.n, np.nan)
    a, b, bank = R.a, R.b, R.bank
    R.m_new = np.full(R.n, np.nan)
    R.m_curve = np.full(R.n, np.nan)
    cr = np.flatnonzero(R.has_curve)
    if len(cr):
        ar = R.alloc_row[cr]
        R.pred_target[cr] = model.throughput(a[cr], b[cr], bank.miss_at(ar, R.target[cr]))
        xs, ms, _ = _trajectory(R, cr, OBSERVE_AFTER)
        t = (np.arange(FILL_STEPS)[:, None] + 0.5) * (OBSERVE_AFTER / FILL_STEPS)
        last = t[:, 0] >= OBSERVE_AFTER - 1           # the interval that scores it
        R.m_curve[cr] = ms[last].mean(axis=0)
        R.m_new[cr] = _anchored(R, cr, xs[last], ms[last], t[last]).mean(axis=0)
        R.pred_new[cr] = model.throughput(a[cr], b[cr], R.m_new[cr])
    orr = np.flatnonzero(R.run_row >= 0)
    if len(orr):
        R.pred_old[orr] = model.throughput(a[orr], b[orr],
                                           bank.miss_at(R.run_row[orr], R.current[orr]))


def _trajectory(R: Round, rows: np.ndarray, intervals: float):
    """How each row's cache stands over the next `intervals` report
    intervals on its new limit, in FILL_STEPS equal steps: (sizes at each
    step's start, the allocation's curve read there, the size at the
    end), the first two of shape (FILL_STEPS, len(rows)).  A cut takes
    hold at once; a raise only as fast as misses bring pages in: every
    miss inserts, and a cache that has not evicted holds what an LRU
    cache of its size would, so its curve read at the size it has reached
    says what it misses on the way.  A loop raised to fit misses every
    access until one whole pass is in; predicted at its steady state, it
    promised 50x what came."""
    new = R.new[rows]
    x = np.minimum(R.resident[rows], new)
    ar = R.alloc_row[rows]
    dt = intervals * R.interval_s[rows] / FILL_STEPS
    rate = R.fill_rate[rows]
    xs = np.empty((FILL_STEPS, len(rows)))
    ms = np.empty((FILL_STEPS, len(rows)))
    # Euler steps: each reads the miss ratio at its start, where it is
    # highest, so the growth errs by at most one step's
    for k in range(FILL_STEPS):
        xs[k] = x
        ms[k] = R.bank.miss_at(ar, x)
        x = np.minimum(new, x + dt * rate * ms[k])
    return xs, ms, x


def _missing_now(R: Round, rows: np.ndarray) -> np.ndarray:
    """What each row misses now: the mean of its latest reports at the
    policy and limit it holds (watchdog.recent_mean, over as many as
    TenantState.recent_obs keeps), or, while its cache fills, its last
    report.  One report is one interval's noise, and decisions follow
    noise (an SLO missed raises its size): anchored on it, predictions
    read low."""
    out = R.observed["miss_ratio"][rows].copy()
    for k, i in enumerate(rows.tolist()):
        st, r = R.tstates[i], R.rows[i][2]
        if R.filling[i]:
            continue
        ref = watchdog.recent_mean(st, r.policy, r.limit_bytes, len(st.recent_obs), 1)
        if ref is not None:
            out[k] = ref[0]
    return out


def _anchored(R: Round, rows: np.ndarray, x: np.ndarray, m_to: np.ndarray,
              intervals: float) -> np.ndarray:
    """Miss ratio of each row over `intervals` report intervals after this
    round, at size x where its new curve reads m_to.  A cache reshapes
    only as fast as it evicts, a page a miss: the tenant starts from what
    it misses now (moved as the running policy's curve moves to size x,
    the curve read so that it agrees with that first: _curve_shift)
    and comes to its curve's reading by the share of its cache turned
    over.  So a new policy starts from the cache the old one filled, and a
    curve that reads below what the tenant misses (a switch undone because
    its curve read low; a cache not yet at its steady state) comes true
    only as its cache turns over.  Where the tenant misses what its curve
    says, this is its curve's reading.  A policy switched to (this round,
    or still settling from a recent switch) needs more than one cache's
    worth: the pages it was measured to need (_settling_left).
    x, m_to, and `intervals` may carry a leading axis of times (as
    _trajectory gives them), the rows on the last."""
    m = np.array(m_to, dtype=np.float64)
    rr = R.run_row[rows]
    m_obs = _missing_now(R, rows)
    ok = np.flatnonzero((rr >= 0) & (m_obs >= 0.0) & (m_obs <= 1.0))
    if not len(ok):
        return m
    g = rows[ok]
    x_ok = np.asarray(x, dtype=np.float64)[..., ok]
    held = np.minimum(R.resident[g], R.current[g])      # where it missed m_obs
    scale, rest = _curve_shift(R.bank, rr[ok], m_obs[ok], held)
    m_from = np.clip(R.bank.miss_at(rr[ok], x_ok * scale) + rest, 0.0, 1.0)
    seconds = np.asarray(intervals, dtype=np.float64) * R.interval_s[g]
    to_turn = np.maximum(np.maximum(x_ok, 1.0), _settling_left(R, g))
    turned = np.minimum(1.0, R.fill_rate[g] * m_from * seconds / to_turn)
    m[..., ok] = m_from + (m[..., ok] - m_from) * turned
    return m


def _curve_shift(bank: CurveBank, rows: np.ndarray, m: np.ndarray,
                 held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How curve rows[i] is read to agree with a tenant that missed m[i]
    holding held[i] pages: (scale, rest), the curve read at size x *
    scale, plus rest.  A sampled curve errs in its sizes (SHARDS counts a
    reuse distance to within a share of itself: curves.py), so the
    difference is first taken as a stretch of its sizes: to the size
    where it reads m, the nearest to `held` where a flat stretch reads
    it (a loop's curve that puts its cliff a little late reads 0.74 at a
    size the loop fits in; shifted down by 0.74 instead, every smaller
    size read as hitting everything).  What a stretch cannot explain (m
    beyond anything the curve reads at a size above 0) is added as it is."""
    lo = bank.ys[bank.end(rows)]
    t = np.clip(m, lo, 1.0)
    h = np.clip(held, bank.size_for(rows, t), bank.size_for(rows, t - 1e-6))
    ok = np.isfinite(h) & (h > 0) & (held > 0)
    scale = np.where(ok, h / np.where(held > 0, held, 1.0), 1.0)
    return scale, m - bank.miss_at(rows, held * scale)


def _settling_left(R: Round, rows: np.ndarray) -> np.ndarray:
    """Pages each row's cache must still insert before the policy it will
    run serves its curve: for a switch made this round, the pages that
    policy was measured to need (watchdog.settling_pages,
    models/policy_settling.json); for one made in an earlier round and
    still watched, those less the pages inserted since; none otherwise."""
    out = np.zeros(len(rows))
    for k, i in enumerate(rows.tolist()):
        ar, rr = int(R.alloc_row[i]), int(R.run_row[i])
        if ar < 0:
            continue
        st, r = R.tstates[i], R.rows[i][2]
        policy = R.row_policy[ar]
        if ar != rr:
            out[k] = watchdog.settling_pages(policy, r)
        elif st.probation is not None and st.probation.new == policy:
            out[k] = max(0.0, watchdog.settling_pages(policy, r) - st.probation.inserted)
    return out
