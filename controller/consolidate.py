"""Consolidation from live data: the demand vectors of the tenants the
controller is running, for the planner (controller/planner.py).

A tenant's memory demand is what the engine last judged its SLO to need
(planner.live_demand).  At that size its latest curves and fitted
throughput model (engine/whatif.py, as `admin what-if` reads them) give a
miss ratio and a throughput; its last report gives what an operation
costs besides: the disk bytes it reads (scaled from now to that miss
ratio) and CPU seconds.  So a demand is (memory, disk reads per second,
cores): an SLO tenant's at its SLO, with the model the planner needs to
predict it on a shared disk and cores; any other's at what it does now.
Each also offers the packing the same tenant at a few larger sizes, where
it reads less (_more_memory). A tenant not reported yet demands its floor
and nothing else.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from cachepilot.controller import planner
from cachepilot.controller.engine import whatif
from cachepilot.controller.planner import Demand, live_demand
from cachepilot.models.mrc import PAGE_SIZE


def node_resources(registry) -> dict[str, tuple[float, float]]:
    """node -> (disk read bytes/s, cores) as its agent registered them."""
    return {name: (rec.info.disk_read_bytes_per_s, rec.info.cores)
            for name, rec in registry.nodes.items() if rec.info is not None}


def live_demands(config, state, registry, headroom: float = 0.10) -> list[Demand]:
    """Every configured tenant's demand vector from what the controller
    knows of it now (see the module's docstring)."""
    disks = planner.host_capacity(config, node_resources(registry))[:, 1]
    full = _full_disks(config, state, registry, disks)
    out = []
    for spec in config.tenants:
        rec = registry.nodes.get(spec.node)
        report = rec.tenants.get(spec.name) if rec is not None else None
        st = _state_of(state, spec.name)
        d = live_demand(config, spec, st, report.limit_bytes if report else 0)
        if report is None:
            d.why = "not reported yet: its floor"
        else:
            now = _vector(d, spec, report, state, config, headroom)
            if spec.node in full and d.a is not None and now.reads > 0:
                d.disk_share_fitted = now.reads
            d.options = _more_memory(d, spec, report, state, config, headroom)
        out.append(d)
    return out


OPTIONS = 4     # larger sizes a demand offers the packing, up to the largest host


def _more_memory(d: Demand, spec, report, state, config, headroom) -> list[Demand]:
    """d at OPTIONS larger sizes, spaced evenly in ratio up to the largest
    host, each kept where it reads less from the disk than the size below:
    a host whose memory has room and whose disk has none can take a
    tenant at more memory (run G of make consolidate kept three hosts on
    the disks, with 130 MiB of memory to spare on two)."""
    if d.miss_ratio is None or d.demand_bytes <= 0:
        return []
    top = max(n.memory_bytes for n in config.nodes)
    out, last = [], d
    for size in _sizes_up(d.demand_bytes, top, OPTIONS):
        if size <= last.demand_bytes:
            continue
        trial = dataclasses.replace(d, demand_bytes=size, options=[], miss_ratio=None)
        _vector(trial, spec, report, state, config, headroom)
        if trial.miss_ratio is None or not trial.disk_bps < last.disk_bps * 0.99:
            continue
        trial.why = f"{d.why}; {size >> 20} MiB, so that it reads less from the disk"
        out.append(trial)
        last = trial
    return out


def _full_disks(config, state, registry, disks) -> set[str]:
    """Nodes whose tenants read their disk at the packing's top step
    (planner.DISK_BUSY_STEPS[0]) of its rate or more: full, so that the
    misses of the models fitted there waited for their share of it
    (planner._alone)."""
    out = set()
    for h, n in enumerate(config.nodes):
        rec = registry.nodes.get(n.name)
        if rec is None or not math.isfinite(disks[h]):
            continue
        reads = sum(recent(_state_of(state, name), r).reads for name, r in rec.tenants.items())
        if reads >= planner.DISK_BUSY_STEPS[0] * disks[h]:
            out.add(n.name)
    return out


def _sizes_up(start: int, top: int, steps: int):
    """`steps` sizes above `start`, spaced evenly in ratio up to `top`, each
    rounded down to whole pages."""
    for k in range(1, steps + 1):
        yield int(start * (top / start) ** (k / steps)) // PAGE_SIZE * PAGE_SIZE


def _vector(d: Demand, spec, report, state, config, headroom: float) -> Recent:
    """Fill d's miss ratio and costs per operation; its model where it has
    an SLO; and its disk and CPU: an SLO tenant's at SLO x (1 + headroom)
    (what it must be given: a closed-loop one takes more when there is
    more), any other's at its throughput now (what it takes from others).
    Returns what the tenant does now (recent), which they are scaled from."""
    st = _state_of(state, spec.name)
    now = recent(st, report)
    policy = d.policy or report.policy
    try:
        p = whatif.tenant(state, spec, report, config.control, d.demand_bytes, policy)
    except whatif.WhatIfError as err:
        d.why += f"; no prediction ({err})"
        return now
    d.policy, d.miss_ratio = policy, p.miss_ratio
    d.disk_per_op = _disk_per_op(report, now, p.miss_ratio, _miss_now(st, report))
    d.cpu_per_op = now.cpu / now.ops if now.ops > 0 else 0.0
    rate_now = now.ops
    if d.slo:
        a, b, _ = whatif._model(state, spec.name, spec, config.control)
        d.a, d.b = a, b
        d.predicted_throughput = p.throughput if math.isfinite(p.throughput) else None
        rate = d.slo * (1 + headroom)
    else:
        d.predicted_throughput = rate = rate_now
    d.disk_bps, d.cpu = rate * d.disk_per_op, rate * d.cpu_per_op
    return now


class Recent(NamedTuple):
    """What a tenant does per second where it stands now."""
    ops: float          # operations
    reads: float        # disk bytes read
    cpu: float          # CPU seconds


def recent(st, report) -> Recent:
    """The means over the tenant's last reports (TenantState.costs) at the
    limit and policy of this one, not one interval's readings: a
    fixed-rate job read 98/s in the interval a plan was made and ran at
    127/s before and after; an application's operations and the agent's
    disk counters are read at different moments, so one interval's
    bytes per operation ranged from 340 to 980 for a tenant whose reads
    held steady (make consolidate, run K).  The report's own where no
    report kept holds all three."""
    same = [o for o in (st.costs if st is not None else ())
            if o[0] == report.policy and o[1] == float(report.limit_bytes)
            and math.isfinite(o[2]) and o[2] > 0
            and math.isfinite(o[3]) and math.isfinite(o[4])]
    if not same:
        return Recent(report.throughput or 0.0, report.disk_reads_per_s, report.cpu_per_s)
    n = len(same)
    return Recent(*(math.fsum(o[k] for o in same) / n for k in (2, 3, 4)))


def as_allocated(config, state, registry):
    """The planner's `refine`: for a placement, each host's tenants as the
    controller would run them there -- its round (engine/whatif.allocate)
    dealing the host's memory among their last reports, SLOs first -- so
    a tenant is predicted at the memory it would hold, not at its demand
    alone (the spare memory of a host is handed out), once its division
    settles: a hold for a phase change under way is not counted (make
    consolidate: a scan whose read-ahead made one report read no misses
    was held in the round a plan was made, and the tenant moved beside it
    was predicted at the memory the scan then kept).  A tenant never
    reported stays as it is."""
    reports = {name: r for rec in registry.nodes.values() for name, r in rec.tenants.items()}

    def refine(assignment: dict, demands: list[Demand]) -> list[Demand]:
        out = {d.tenant: d for d in demands}
        for host in set(assignment.values()):
            mine = [reports[d.tenant] for d in demands
                    if assignment[d.tenant] == host and d.tenant in reports
                    and d.miss_ratio is not None]
            if not mine:
                continue
            rec = registry.nodes.get(host)
            memory = rec.memory_bytes if rec is not None else config.node(host).memory_bytes
            try:
                got = whatif.allocate(state, config, host, mine, memory, settled=True)
            except whatif.WhatIfError:
                continue
            for p in got:
                r, st = reports[p.tenant], _state_of(state, p.tenant)
                out[p.tenant] = dataclasses.replace(
                    out[p.tenant], demand_bytes=p.limit_bytes, miss_ratio=p.miss_ratio,
                    disk_per_op=_disk_per_op(r, recent(st, r), p.miss_ratio,
                                             _miss_now(st, r)))
        return [out[d.tenant] for d in demands]
    return refine


def _state_of(state, name: str):
    """The engine's TenantState of `name`, if it has one."""
    return state.tenants.get(name) if state is not None else None


def _miss_now(st, report) -> float:
    """The miss ratio its predictions start from (whatif.missing_now: the
    mean of its latest reports where its cache stands), else its report's:
    one interval's miss ratio swings (a fixed-rate scan read 0.0 and 1.0
    in turn under read-ahead), and disk reads scaled by it would swing
    with it."""
    now = whatif.missing_now(st, report)
    return float(report.miss_ratio) if now is None else now


def _disk_per_op(report, now: Recent, m: float, m_now: float) -> float:
    """Disk bytes an operation reads at miss ratio m: what it reads now
    per operation (`now`: recent; its disk reads where known, else the
    pages put in its cache, read-ahead and all), scaled by m over its miss
    ratio now (`m_now`: _miss_now); a page per miss where it reads nothing
    now."""
    if now.ops > 0 and now.reads > 0 and m_now > 0:
        return now.reads / now.ops * m / m_now
    accesses_per_op = report.accesses_per_s / now.ops if now.ops > 0 else 1.0
    return accesses_per_op * m * PAGE_SIZE
