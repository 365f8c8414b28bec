"""What-if: the engine's answers to an operator's question, with nothing
changed.

    tenant(...)     one tenant at another limit and/or policy: the miss
                    ratio its current curve for that policy gives at the
                    limit, the throughput its fitted model gives at that
                    miss ratio, and whether that meets its SLO;
    node_free(...)  a node giving up some memory: the round's allocation
                    (SLOs first, then marginal throughput) with the node's
                    memory as it is and with that much less, and what each
                    tenant would get under each.

Both read the curves of the last reports and the engine's state (the
fitted throughput models) and write nothing.  A predicted miss ratio is
the mean, over the tenant's last CURVE_HISTORY reports that have the
policy's curve, of that curve at the limit: a report's curve covers one
interval, and a workload whose period is longer (a loop read half a pass
per interval) misses in the long run what its intervals miss on average,
not what the last one did; and anchored on what the tenant has shown it
misses (anchored_miss).  The allocation is the round's own: decide()
on the node's last reports at the memory asked about, its new state
thrown away (a round never changes the state it is given).  The curves are
read as they are, not shifted by their sampling error as the allocation's
safety margin reads them: a prediction is the best estimate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cachepilot.controller.engine import model, watchdog
from cachepilot.controller.engine.round import recent_curves
from cachepilot.controller.engine.types import EngineState, TenantState
from cachepilot.core.units import size
from cachepilot.models.mrc import PAGE_SIZE


@dataclass
class Prediction:
    tenant: str
    node: str
    policy: str
    limit_bytes: int
    miss_ratio: float
    throughput: float
    slo: float | None               # the SLO's minimum throughput, if it has one
    fitted: bool                    # the model comes from data, not the prior

    @property
    def slo_met(self) -> bool | None:
        return None if self.slo is None else self.throughput >= self.slo


class WhatIfError(ValueError):
    """A question the current state cannot answer (said in words)."""


def _model(state: EngineState, name: str, spec, ctl):
    st = state.tenants.get(name)
    if st is not None and (st.a > 0 or st.b > 0):
        return st.a, st.b, st.fitted
    p = spec.model or ctl.prior          # never decided on: the prior as written
    return p.t_hit_s / p.concurrency, p.t_miss_s / p.concurrency, False


def tenant(state: EngineState, spec, report, ctl, limit_bytes: int | None = None,
           policy: str | None = None) -> Prediction:
    """`spec`'s tenant at `limit_bytes` (default: the limit in force) under
    `policy` (default: the one running), from `report`'s curves."""
    if report is None:
        raise WhatIfError(f"tenant {spec.name!r} has not been reported yet: no curves")
    policy = policy or report.policy
    curves = {c.policy: c for c in report.curves}
    if policy not in curves:
        have = ", ".join(sorted(curves)) or "none"
        raise WhatIfError(f"tenant {spec.name!r}: no curve for policy {policy!r} in its "
                          f"last report (curves: {have})")
    if curves[policy].meta.get("window_accesses", 1.0) <= 0:
        raise WhatIfError(no_data(spec.name))
    limit = int(limit_bytes) if limit_bytes else int(report.limit_bytes)
    if limit <= 0:
        raise WhatIfError(f"tenant {spec.name!r} has no limit in force: give --limit")
    m = anchored_miss(state.tenants.get(spec.name), report, policy, limit / PAGE_SIZE)
    a, b, fitted = _model(state, spec.name, spec, ctl)
    thr = float(model.throughput(a, b, m))
    slo = spec.slo.min_throughput if spec.slo is not None else None
    return Prediction(spec.name, spec.node, policy, limit, m, thr, slo, fitted)


def no_data(name: str) -> str:
    return (f"tenant {name!r}: its curves rest on no page accesses yet; what-if waits for "
            f"a report of an interval in which it reads files")


def mean_miss(st: TenantState | None, report, policy: str, pages: float) -> float:
    """The miss ratio `policy`'s curves give at `pages`, averaged over the
    tenant's recent reports (the last one, `report`, always among them)."""
    at = [float(c.at(pages)) for curves in recent_curves(st, report) for c in curves
          if c.policy == policy]
    return float(np.mean(at)) if at else math.nan


def anchored_miss(st: TenantState | None, report, policy: str, pages: float) -> float:
    """What the tenant will miss at `pages` under `policy` once its cache
    has settled: the curve's reading (mean_miss), moved by how far the
    tenant's own reports sit from its running policy's curve where its
    cache stands (missing_now), as the round anchors what it predicts
    (round._anchored).  A tenant that misses more than its curves say
    (readahead, a footprint the sample undercounts) misses more at any
    size (make consolidate's zipf reader, left where it was at the limit
    it had, was predicted far above what it went on doing).  The curve's
    reading alone where the tenant has not shown what it misses."""
    m = mean_miss(st, report, policy, pages)
    now = missing_now(st, report)
    if now is None:
        return m
    resident = (report.usage_file_bytes + report.usage_anon_bytes) / PAGE_SIZE
    held = min(resident, report.limit_bytes / PAGE_SIZE)
    offset = now - mean_miss(st, report, report.policy, held)
    return float(np.clip(m + offset, 0.0, 1.0)) if math.isfinite(offset) else m


def missing_now(st: TenantState | None, report) -> float | None:
    """What the tenant misses where its cache stands: the mean of its
    latest reports at the policy and limit it holds
    (watchdog.recent_mean); None where there is no such run of
    reports, or while its cache still fills (every miss a first read: no
    steady state to show)."""
    if st is None:
        return None
    resident = (report.usage_file_bytes + report.usage_anon_bytes) / PAGE_SIZE
    if report.removals_per_s <= 0 and resident < report.limit_bytes / PAGE_SIZE:
        return None
    ref = watchdog.recent_mean(st, report.policy, float(report.limit_bytes),
                               len(st.recent_obs))
    return None if ref is None else ref[0]


def node_free(state: EngineState, config, node: str, reports, memory_bytes: int,
              free_bytes: int, advisory: bool = False):
    """[(before, after)] Predictions per tenant of `node`: the allocation at
    `memory_bytes` and at `memory_bytes - free_bytes`."""
    if not 0 < free_bytes < memory_bytes:
        raise WhatIfError(f"node {node!r}: --free must be more than 0 and less than its "
                          f"{size(memory_bytes)}")
    if not reports:
        raise WhatIfError(f"node {node!r} has not reported: no curves")
    before = allocate(state, config, node, reports, memory_bytes, advisory)
    after = allocate(state, config, node, reports, memory_bytes - free_bytes, advisory)
    return list(zip(before, after))


def allocate(state: EngineState, config, node: str, reports, memory_bytes: int,
             advisory: bool = False, settled: bool = False) -> list[Prediction]:
    """The round itself (decide) on `node`'s last reports with the node's
    memory at `memory_bytes`; its new state is thrown away.  `settled`:
    where the division settles, without the holds of a phase change under
    way (decide's `settled`)."""
    from cachepilot.controller.engine import decide
    d, _ = decide(state, {node: reports}, config, node_memory={node: memory_bytes},
                  advisory_nodes={node} if advisory else (), settled=settled)
    by_name = {r.tenant: r for r in reports}
    out = []
    # the allocation's own target (before a shrink waits for the next
    # round to agree: a question is not asked twice)
    for rec in d.trace.records():
        r, spec = by_name[rec["tenant"]], config.tenant(rec["tenant"])
        a, b, fitted = _model(state, spec.name, spec, config.control)
        policy = rec["prediction"]["policy"]
        target = rec["allocation"]["wanted_bytes"]
        # allocated as the round allocates; predicted on the recent reports'
        # curves, anchored on what the tenant misses (anchored_miss)
        mi = anchored_miss(state.tenants.get(spec.name), r, policy, target / PAGE_SIZE) \
            if policy is not None else float(r.miss_ratio)
        thr = float(model.throughput(a, b, mi))
        out.append(Prediction(spec.name, node, policy or r.policy, int(target), mi, thr,
                              spec.slo.min_throughput if spec.slo else None, bool(fitted)))
    return out
