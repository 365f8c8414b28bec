"""Consolidation planner: the fewest hosts on which every SLO is still met.

Input is an ordinary config: `nodes` are the hosts that exist (memory, and
disk bandwidth and cores where known), `tenants` say where each runs now,
its SLO, floor, ceiling and allowed policies.  A tenant's demand is a
vector: memory, disk reads per second, cores.  Offline (`cachepilot plan`)
it is the least memory with which one allowed policy meets its SLO in
every phase of its workload or curves file (tenant_demands); live
(`admin plan`) it is built from what the agents report
(controller/consolidate.py).  The vectors are packed onto the hosts
(controller/packing.py), each tenant's throughput on its host is predicted
from its model and its fair share of the host's disk and cores (predict),
and the moves are put in an order that can be carried out (order_moves).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cachepilot.controller import packing
from cachepilot.controller.config import Config
from cachepilot.core.errors import UserError
from cachepilot.models.mrc import MRC, PAGE_SIZE
from cachepilot.sim.backend import PhaseStream, SimBackend

EXACT_LIMIT = 600          # row (a demand or an option) x host pairs up to which the MILP runs
MILP_TIME_LIMIT_S = 20.0


@dataclass
class Demand:
    tenant: str
    current_node: str
    demand_bytes: int
    policy: str | None              # the policy the demand is for
    slo: float | None
    predicted_throughput: float | None   # modelled, at the demand, worst phase
    source: str                     # "workload", "curves_file" or "floor"
    feasible: bool = True
    why: str = ""
    per_policy: dict = field(default_factory=dict)   # policy -> bytes (inf: cannot)
    # The rest of its vector, at demand_bytes and its predicted throughput:
    disk_bps: float = 0.0           # bytes/s it reads from disk
    cpu: float = 0.0                # CPU cores
    # Its fitted throughput model, 1 / (a + b m), at the predicted miss
    # ratio m, and what an operation costs at m: disk bytes and CPU
    # seconds (planner.predict shares a host's disk and cores by them).
    miss_ratio: float | None = None
    a: float | None = None
    b: float | None = None
    disk_per_op: float = 0.0
    cpu_per_op: float = 0.0
    # Where its model was fitted on a disk that ran full: the bytes/s it
    # read there.  Its misses then took the time to read through that
    # share, and on a host where it gets more of a disk they take less.
    disk_share_fitted: float | None = None
    # The same tenant at more memory, each a whole Demand (more memory, less
    # disk): the packing may place one of them instead where a host's disk
    # binds and its memory does not (packing's rows per tenant).
    options: list = field(default_factory=list)


@dataclass
class Plan:
    method: str                     # "milp (optimal)", "milp (time limit)", "first-fit decreasing"
    hosts_used: list[str]
    assignment: dict[str, str]      # tenant -> host
    hosts: list[dict]               # per host: name, memory, demand, tenants, binding
    memory_total_bytes: int
    memory_freed_bytes: int         # memory of the hosts no longer needed
    lower_bound_hosts: int
    moved: list[str]
    demands: list[Demand]
    seconds: float
    resources: list[str] = field(default_factory=lambda: ["memory"])
    # per tenant: its host, predicted throughput there, SLO, met or not
    predictions: dict[str, dict] = field(default_factory=dict)
    moves: list[dict] = field(default_factory=list)   # in the order to carry out
    forced_hosts: int | None = None  # packed into this many, SLOs or not

    @property
    def breaks(self) -> list[str]:
        """Tenants whose SLO the plan predicts it misses."""
        return sorted(t for t, p in self.predictions.items() if p["slo_met"] is False)

    def to_dict(self) -> dict:
        d = asdict(self)
        for x in d["demands"]:
            for y in [x] + x.get("options", []):
                y["per_policy"] = {k: (None if v == math.inf else v)
                                   for k, v in y["per_policy"].items()}
        return d


# -- demands -----------------------------------------------------------------------

def _service(config, spec):
    if spec.model is not None:
        return spec.model
    if spec.workload is not None:
        return spec.workload.service
    return config.control.prior


def _target_miss(service, slo: float) -> float:
    """Highest miss ratio at which the service model still delivers slo."""
    if slo <= 0:
        return math.inf
    per_op = service.concurrency / slo
    return (per_op - service.t_hit_s) / service.t_miss_s


def _load_curves(path: Path, tenant: str) -> list[MRC]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"tenant {tenant!r}: curves_file {path}: no such file") from None
    except (OSError, ValueError) as err:
        raise UserError(f"tenant {tenant!r}: curves_file {path}: not readable JSON "
                        f"({err})") from None
    items = data.get("curves") if isinstance(data, dict) else data
    if isinstance(data, dict) and items is None and "sizes" in data:
        items = [data]
    if not isinstance(items, list) or not items:
        raise UserError(f"tenant {tenant!r}: curves_file {path}: expected a list of "
                        f"curves or an object with a \"curves\" list")
    out = []
    for i, item in enumerate(items):
        try:
            out.append(MRC.from_dict(item))
        except (ValueError, TypeError, AttributeError) as err:
            raise UserError(f"tenant {tenant!r}: curves_file {path}: curve {i}: "
                            f"{err}") from None
    return out


def warm_accesses(phase, accesses_per_interval: int) -> int:
    """Accesses after which a cache under this phase is taken as warm: three
    passes over its footprint's worth of accesses (at least two intervals,
    at most 200,000)."""
    pages = max(1, phase.footprint // PAGE_SIZE)
    return int(min(max(3 * pages, 2 * accesses_per_interval), 200_000))


class _Prober:
    """Steady-state miss ratio of one workload phase under one policy at a
    given limit, by simulation: warm the cache, then measure in windows of
    one control interval's accesses and keep the worst window -- an SLO is
    judged interval by interval, so the plan must hold in the noisy ones."""

    WINDOWS = 6

    def __init__(self, phase, seed: int, accesses: int, policy: str):
        self.warm = warm_accesses(phase, accesses)
        self.window = int(accesses)
        stream = PhaseStream(phase, seed, key_base=0)
        self.keys, self.tids = stream.next(self.warm + self.WINDOWS * self.window)
        self.policy = policy
        self.cache_ = {}

    def miss(self, pages: int) -> float:
        from cachepilot.models.runtime import Cache
        pages = max(1, int(pages))
        if pages not in self.cache_:
            c = Cache(self.policy, pages)
            w = self.warm
            c.access(self.keys[:w], None if self.tids is None else self.tids[:w])
            worst = 0.0
            for k in range(self.WINDOWS):
                a, b = w + k * self.window, w + (k + 1) * self.window
                tids = None if self.tids is None else self.tids[a:b]
                worst = max(worst, c.access(self.keys[a:b], tids) / (b - a))
            self.cache_[pages] = worst
        return self.cache_[pages]


def _least_pages(prober: _Prober, target: float, hi_pages: int) -> int | None:
    """Least limit (pages) whose steady miss ratio is <= target, to within
    1 % of the limit; None when even hi_pages does not reach it."""
    if prober.miss(hi_pages) > target:
        return None
    lo, hi = 0, hi_pages
    while hi - lo > max(8, hi // 100):
        mid = (lo + hi) // 2
        if prober.miss(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def _needs(spec, allowed: list[str], target: float, cap: int, index: int,
           seed_offset: int) -> tuple[str, dict[str, float]]:
    """(where they came from, per allowed policy the bytes at which the
    tenant misses at most `target` in its worst phase, inf where none up
    to `cap` does).

    - `curves_file`: a JSON list of curves (as `cachepilot mrc --json`
      writes them, or {"curves": [...]}), read backwards as they are;
    - `workload`: profiled phase by phase, with the same streams the sim
      backend replays, through the policy runtime's Cache under a memory
      limit -- warmed first, then measured, so the miss ratio is the steady
      state the tenant would see (_Prober).  The least limit meeting the
      SLO is searched for directly (bisection on the limit: _least_pages)
      instead of sweeping a whole curve, since that one point is all the
      plan needs."""
    per_policy: dict[str, float] = {}
    if spec.curves_file is not None:
        curves = {c.policy: c for c in _load_curves(spec.curves_file, spec.name)}
        for p in allowed:
            c = curves.get(p)
            if c is None:
                continue
            need = c.size_for(min(target, 1.0)) if target >= 0 else None
            per_policy[p] = math.inf if need is None else need * PAGE_SIZE
        return "curves_file", per_policy
    if spec.workload is None:
        raise UserError(f"tenant {spec.name!r}: the planner needs its curves: give "
                        f"a `workload` or a `curves_file`")
    w = spec.workload
    seed = (w.seed if w.seed is not None else index) + seed_offset
    for p in allowed:
        worst = 0
        for k, phase in enumerate(w.phases):
            if target < 0:
                worst = math.inf
                break
            prober = _Prober(phase, seed * 1009 + k, w.accesses_per_interval, p)
            pages = _least_pages(prober, target, cap // PAGE_SIZE)
            if pages is None:
                worst = math.inf
                break
            worst = max(worst, pages * PAGE_SIZE)
        per_policy[p] = worst
    return "workload", per_policy


def tenant_demands(config, headroom: float = 0.10, policies: list[str] | None = None,
                   seed_offset: int = 0x5EED) -> list[Demand]:
    """Each tenant's demand: the least memory with which one allowed policy
    meets its SLO (raised by `headroom`) in every phase of its workload --
    one (policy, size) pair that needs no autopilot to stay safe.  Tenants
    without an SLO demand what the engine would never go below anyway
    (floor, at least the anonymous-memory margin).  `policies`: what the
    hosts can run when the config does not say (default: the policy
    runtime's)."""
    if policies is None:
        from cachepilot.models.runtime import available_policies
        policies = list(available_policies())
    max_host = max(n.memory_bytes for n in config.nodes)
    out = []
    for i, spec in enumerate(config.tenants):
        node = config.node(spec.node)
        offered = node.policies if node.policies is not None else policies
        allowed = [p for p in (spec.policies or offered) if p in offered]
        if not allowed:
            raise UserError(f"tenant {spec.name!r}: none of its policies "
                            f"({', '.join(spec.policies or [])}) is offered by "
                            f"{spec.node!r} ({', '.join(offered)})")
        lb = max(spec.floor_bytes, config.control.anon_margin_bytes)
        cap = min(spec.ceiling_bytes or max_host, max_host)
        if spec.slo is None or spec.slo.min_throughput <= 0:
            out.append(Demand(spec.name, spec.node, _page_up(lb), None,
                              spec.slo.min_throughput if spec.slo else None, None, "floor",
                              why="no SLO: its floor"))
            continue
        service = _service(config, spec)
        slo = spec.slo.min_throughput
        target = _target_miss(service, slo * (1 + headroom))
        source, per_policy = _needs(spec, allowed, target, cap, i, seed_offset)
        if not per_policy:
            raise UserError(f"tenant {spec.name!r}: no curve for any allowed policy "
                            f"({', '.join(allowed)})")
        best = min(sorted(per_policy), key=lambda p: per_policy[p])
        need = per_policy[best]
        if need == math.inf or max(need, lb) > cap:
            out.append(Demand(spec.name, spec.node, _page_up(cap), None, slo, None, source,
                              feasible=False, per_policy=per_policy,
                              why="no allowed policy meets the SLO within "
                                  f"{cap} bytes"))
            continue
        demand = _page_up(max(need, lb))
        # at the demand the miss ratio is at most the target (the worst phase)
        floor_thr = service.throughput(min(max(target, 0.0), 1.0))
        out.append(Demand(spec.name, spec.node, demand, best, slo, floor_thr, source,
                          per_policy=per_policy,
                          why=f"{best} meets {slo:g}/s (+{headroom:.0%}) "
                              f"in every phase"))
    return out


def _page_up(b: float) -> int:
    return int(math.ceil(b / PAGE_SIZE)) * PAGE_SIZE


def live_demand(config, spec, st, limit_bytes: int) -> Demand:
    """A running tenant's demand from what the engine has learnt of it
    (its TenantState): an SLO tenant needs the size its SLO was last
    judged feasible at, under the policy directed; one whose SLO no size
    meets keeps the limit it has; a tenant without an SLO, its floor.
    The controller's leader plans from these (no profiling: the curves
    the replicas see every interval already said it)."""
    lb = max(spec.floor_bytes, config.control.anon_margin_bytes)
    slo = spec.slo.min_throughput if spec.slo is not None else None
    if not slo:
        return Demand(spec.name, spec.node, _page_up(lb), None, slo, None, "floor",
                      why="no SLO: its floor")
    need = getattr(st, "slo_need_pages", None) if st is not None else None
    if st is not None and st.slo_feasible and need is not None and math.isfinite(need):
        return Demand(spec.name, spec.node, _page_up(max(need * PAGE_SIZE, lb)),
                      st.policy or st.running, slo, None, "engine",
                      why=f"the engine's need for {slo:g}/s under {st.policy or st.running}")
    return Demand(spec.name, spec.node, _page_up(max(limit_bytes, lb)), None, slo, None,
                  "engine", why="SLO not judged feasible: keeps its limit")


# -- packing ---------------------------------------------------------------------

# the share of its disk a host may be packed to, lowered while a
# prediction breaks an SLO (the last is a host per tenant for the heavy)
DISK_BUSY_STEPS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)


def host_capacity(config, resources=None) -> np.ndarray:
    """Per host (config.nodes order): memory bytes, disk read bytes/s,
    cores; inf where not known.  `resources`: node name -> (disk, cores)
    as registered, used where the config gives none."""
    rows = []
    for n in config.nodes:
        disk, cores = (resources or {}).get(n.name, (0.0, 0.0))
        disk = n.disk_read_bytes_per_s or disk
        cores = n.cores or cores
        rows.append([n.memory_bytes, disk or math.inf, cores or math.inf])
    return np.array(rows, dtype=float)


def _allowed(config, demands) -> np.ndarray:
    ok = np.ones((len(demands), len(config.nodes)), dtype=bool)
    for t, d in enumerate(demands):
        for h, host in enumerate(config.nodes):
            if d.policy and host.policies is not None and d.policy not in host.policies:
                ok[t, h] = False
    return ok


def predict(demands, assignment: dict[str, str], capacity: dict[str, float],
            cores: dict[str, float] | None = None) -> dict:
    """Each tenant's throughput on its planned host: what it does on its
    own, x0 = 1 / (a + b m) at the planned miss ratio m (its fitted model;
    without one, the rate it runs at now), cut to what its share of the
    host's disk and of its cores pays for.  The shares are max-min fair
    (a throttled disk and CFS hand out what the light do not use to the
    heavy); a tenant cut by one resource asks less of the other, so the
    shares are dealt again until they settle.  The model is fitted where
    the tenant runs now: more of a resource than it had there is not
    counted on, less is -- except a disk that ran full there (see
    _alone).  `capacity` and `cores`: host -> bytes/s and CPUs (inf or
    absent: not known, not shared)."""
    out = {}
    for host in set(assignment.values()):
        mine = [d for d in demands if assignment[d.tenant] == host]
        bw = capacity.get(host, math.inf)
        cpus = (cores or {}).get(host, math.inf)
        alone = {d.tenant: _alone(d, bw) for d in mine}
        cpu: dict = {}
        for _ in range(2 * len(mine) + 2):
            # each resource dealt to what the other lets each tenant do
            disk = _fair(bw, {d.tenant: (_capped(alone[d.tenant], d, {}, cpu) or 0.0) *
                              d.disk_per_op for d in mine})
            new = _fair(cpus, {d.tenant: (_capped(alone[d.tenant], d, disk, {}) or 0.0) *
                               d.cpu_per_op for d in mine})
            if new == cpu:
                break
            cpu = new
        thr = {d.tenant: _capped(alone[d.tenant], d, disk, cpu) for d in mine}
        used = [sum((thr[d.tenant] or 0.0) * getattr(d, k) for d in mine)
                for k in ("disk_per_op", "cpu_per_op")]
        for d in mine:
            v = thr[d.tenant]
            out[d.tenant] = {"host": host, "predicted_ops": None if v is None else float(v),
                             "slo": d.slo, "limit_bytes": d.demand_bytes,
                             "miss_ratio": d.miss_ratio, "disk_busy": _share(used[0], bw),
                             "cpu_busy": _share(used[1], cpus),
                             "slo_met": None if not d.slo or v is None else bool(v >= d.slo)}
    return out


def _alone(d: Demand, disk: float = math.inf):
    """What d does with a host of `disk` bytes/s to itself.  A model fitted
    on a disk that ran full has, in its b, the time a miss waited for the
    tenant's share of that disk: with the whole of this one, a miss takes
    that time scaled by the share over this disk's rate (make consolidate:
    a tenant fitted on a full disk and moved beside light readers ran far
    above its unscaled prediction).  Its fair share of the disk then cuts
    it as any other's (predict)."""
    if d.a is not None and d.miss_ratio is not None:
        b = d.b
        if d.disk_share_fitted and 0 < disk < math.inf:
            b *= min(1.0, d.disk_share_fitted / disk)
        return 1.0 / max(d.a + b * d.miss_ratio, 1e-12)
    return d.predicted_throughput


def _capped(x, d: Demand, disk: dict, cpu: dict):
    if x is None:
        return None
    if d.disk_per_op > 0 and d.tenant in disk:
        x = min(x, disk[d.tenant] / d.disk_per_op)
    if d.cpu_per_op > 0 and d.tenant in cpu:
        x = min(x, cpu[d.tenant] / d.cpu_per_op)
    return x


def _fair(total: float, wants: dict) -> dict:
    """Max-min fair shares of `total`: the smallest wants in full, the
    rest split evenly among the others; only the tenants it holds below
    what they want (none when `total` is not known)."""
    if not (math.isfinite(total) and total > 0):
        return {}
    out, left, todo = {}, total, sorted(wants, key=wants.get)
    while todo:
        share = left / len(todo)
        t = todo.pop(0)
        if wants[t] > share * (1 + 1e-9):
            out[t] = share
        left -= min(wants[t], share)
    return out


def _share(used: float, total: float) -> float:
    return round(used / total, 3) if math.isfinite(total) and total > 0 else 0.0


def _overcommitted(config, demands, assignment, predictions) -> dict:
    """On a host whose tenants' memory demands exceed its memory (a forced
    plan) no tenant is sure of its demand: each SLO there is predicted
    missed."""
    for node in config.nodes:
        mine = [d for d in demands if assignment[d.tenant] == node.name]
        if sum(d.demand_bytes for d in mine) > node.memory_bytes:
            for d in mine:
                p = predictions[d.tenant]
                p["memory_overcommitted"] = True
                if d.slo:
                    p["slo_met"] = False
    return predictions


def _disk_share(full: np.ndarray, demands, share: float) -> np.ndarray:
    """The capacities with each disk cut to `share` of its bandwidth, but
    never below the largest tenant's reads: a tenant that needs more than
    the share alone may still have a host to itself."""
    cap = full.copy()
    heaviest = max(min([d.disk_bps] + [o.disk_bps for o in d.options]) for d in demands)
    known = np.isfinite(full[:, 1])            # an unknown disk stays unbounded
    cap[known, 1] = np.minimum(full[known, 1], np.maximum(full[known, 1] * share, heaviest))
    return cap


def _vectors(demands, memory_only: bool) -> np.ndarray:
    rows = [[d.demand_bytes, d.disk_bps, d.cpu] for d in demands]
    out = np.array(rows, dtype=float)
    return out[:, :1] if memory_only else out


def _rows(demands, memory_only: bool) -> tuple[list[Demand], np.ndarray]:
    """Every row the packing may place (each demand, then its options;
    the demand alone where memory is all that is packed) and its tenant."""
    rows, owner = [], []
    for t, d in enumerate(demands):
        for r in [d] + ([] if memory_only else list(d.options)):
            rows.append(r)
            owner.append(t)
    return rows, np.array(owner, dtype=np.int64)


def _pack(config, demands, allowed, cap, method, exact_limit, time_limit, hosts):
    """(assignment by name, method used, the demands placed: each tenant's
    own or the option chosen) or (None, why, demands)."""
    names = [d.tenant for d in demands]
    where = {n.name: i for i, n in enumerate(config.nodes)}
    current = [where.get(d.current_node, -1) for d in demands]
    rows, owner = _rows(demands, cap.shape[1] == 1)
    dem = _vectors(rows, cap.shape[1] == 1)
    ok = packing.compatible(dem, cap, allowed[owner])
    for t, d in enumerate(demands):
        if not ok[owner == t].any():
            raise UserError(f"plan: tenant {d.tenant!r} needs {d.demand_bytes >> 20} MiB"
                            f" under {d.policy} (and its disk and CPU), which no host offers")
    got, used = None, None
    pairs = len(rows) * len(config.nodes)
    if method == "milp" or (method == "auto" and pairs <= exact_limit):
        got, optimal = packing.milp(dem, cap, ok, current, time_limit, hosts, owner)
        if got is not None:
            used = "milp (optimal)" if optimal else \
                f"milp (time limit {time_limit:g}s, best found)"
        elif method == "milp":
            return None, "the MILP found no feasible placement", demands
    if got is None:
        got = packing.first_fit_decreasing(dem, cap, ok, current, names, hosts, owner)
        used = "first-fit decreasing" + (
            "" if method == "ffd" or pairs > exact_limit else " (MILP gave no answer)")
    if got is None and hosts:
        # a forced plan is packed on memory alone: one row per tenant
        got, used = packing.crowd(dem[:, 0], cap[:, 0], ok, current, hosts), \
            f"{hosts} hosts forced: memory overcommitted"
    if got is None:
        return None, "the tenants do not fit on the hosts given", demands
    placed = list(demands)
    for k in got:
        placed[owner[k]] = rows[k]
    return ({names[owner[k]]: config.nodes[h].name for k, h in got.items()}, used, placed)


def plan(config, headroom: float = 0.10, method: str = "auto",
         exact_limit: int = EXACT_LIMIT, time_limit: float = MILP_TIME_LIMIT_S,
         demands: list[Demand] | None = None, resources: dict | None = None,
         memory_only: bool = False, hosts: int | None = None, refine=None) -> Plan:
    """The fewest hosts meeting every SLO: the tenants' demand vectors
    (memory; and, unless memory_only, disk reads and CPU) packed onto the
    hosts (controller/packing.py: exact MILP for small cases, first-fit
    decreasing beyond; fewest hosts, then fewest moves).  Each tenant's
    throughput on its host is then predicted (predict); while one breaks
    its SLO on a busier disk, the disk share a host may be packed to is
    lowered and the packing redone.  A demand's `options` (the tenant at
    more memory, reading less) are rows the packing may place instead; the
    plan gives each tenant the one placed.  `hosts`: force that many, and report
    what breaks (packed on memory alone: a plan the planner would refuse).
    `refine(assignment, demands)`: the demands as each host would really
    run them (the controller's allocation of its memory), to predict from."""
    if method not in ("auto", "milp", "ffd"):
        raise UserError(f"plan: method must be auto, milp or ffd, got {method!r}")
    if not config.tenants:
        raise UserError("plan: the config has no tenants to place")
    start = time.perf_counter()
    if demands is None:
        demands = tenant_demands(config, headroom)
    bad = [d for d in demands if not d.feasible]
    if bad:
        names = ", ".join(f"{d.tenant} ({d.why})" for d in bad)
        raise UserError(f"plan: these SLOs cannot be met on any host: {names}")
    full = host_capacity(config, resources)
    disk = {n.name: full[h, 1] for h, n in enumerate(config.nodes)}
    cores = {n.name: full[h, 2] for h, n in enumerate(config.nodes)}
    allowed = _allowed(config, demands)
    steps = (1.0,) if memory_only or hosts is not None else DISK_BUSY_STEPS
    found = None
    for share in steps:
        cap = full[:, :1] if memory_only or hosts else _disk_share(full, demands, share)
        try:
            assignment, used, placed = _pack(config, demands, allowed, cap, method,
                                             exact_limit, time_limit, hosts)
        except UserError:
            if found is None:
                raise
            break               # a tenant alone no longer fits: the last plan stands
        if assignment is None:
            if found is None:
                raise UserError(f"plan: {used}" + (f" on {hosts} hosts" if hosts else ""))
            break
        running = refine(assignment, placed) if refine is not None else placed
        found = assignment, used, placed, _overcommitted(
            config, placed, assignment, predict(running, assignment, disk, cores))
        if not any(p["slo_met"] is False for p in found[3].values()):
            break
    assignment, used, placed, predictions = found
    return _result(config, placed, assignment, used, full, predictions,
                   memory_only or bool(hosts), hosts, time.perf_counter() - start)


def _result(config, demands, assignment, used, full, predictions, memory_only, hosts,
            seconds) -> Plan:
    dem = _vectors(demands, False)
    per_host = []
    for h, node in enumerate(config.nodes):
        members = [t for t, d in enumerate(demands) if assignment[d.tenant] == node.name]
        res, frac = packing.binding(dem, full[h], members)
        per_host.append({"name": node.name, "memory_bytes": node.memory_bytes,
                         "disk_read_bytes_per_s": _finite(full[h, 1]),
                         "cores": _finite(full[h, 2]),
                         "demand_bytes": int(dem[members, 0].sum()),
                         "disk_bps": float(dem[members, 1].sum()),
                         "cpu": float(dem[members, 2].sum()),
                         "binding": res, "binding_fraction": round(frac, 3),
                         "tenants": sorted(demands[t].tenant for t in members)})
    used_hosts = [h["name"] for h in per_host if h["tenants"]]
    total = sum(h.memory_bytes for h in config.nodes)
    freed = sum(h["memory_bytes"] for h in per_host if not h["tenants"])
    moved = sorted(d.tenant for d in demands if assignment[d.tenant] != d.current_node)
    cap = full[:, :1] if memory_only else full
    lb = packing.lower_bound(_vectors(demands, memory_only), cap)
    return Plan(used, used_hosts, dict(sorted(assignment.items())), per_host, total, freed,
                lb, moved, demands, seconds,
                resources=["memory"] if memory_only else list(packing.RESOURCES),
                predictions=predictions, moves=order_moves(config, demands, assignment,
                                                           predictions),
                forced_hosts=hosts)


def _finite(v: float):
    return None if not math.isfinite(v) else float(v)


def order_moves(config, demands, assignment, predictions) -> list[dict]:
    """The moves in an order that keeps every host within its memory at
    each step: next, a move whose destination has room for it with what
    is there at that point (hosts being emptied give theirs up as their
    tenants leave); the smallest when none has."""
    mem = {n.name: n.memory_bytes for n in config.nodes}
    held = {n.name: 0 for n in config.nodes}
    for d in demands:
        held[d.current_node] = held.get(d.current_node, 0) + d.demand_bytes
    todo = [d for d in demands if assignment[d.tenant] != d.current_node]
    out = []
    while todo:
        fits = [d for d in todo if held[assignment[d.tenant]] + d.demand_bytes
                <= mem.get(assignment[d.tenant], 0)]
        d = min(fits or todo, key=lambda d: (d.demand_bytes, d.tenant))
        todo.remove(d)
        dest = assignment[d.tenant]
        held[d.current_node] -= d.demand_bytes
        held[dest] += d.demand_bytes
        p = predictions.get(d.tenant, {})
        out.append({"tenant": d.tenant, "from": d.current_node, "to": dest,
                    "limit_bytes": d.demand_bytes, "policy": d.policy,
                    "predicted_ops": p.get("predicted_ops"), "slo": d.slo,
                    "slo_met": p.get("slo_met")})
    return out


# -- confirmation on the sim -------------------------------------------------

def placed_config(config, result: Plan):
    """The config as the plan leaves it: only the hosts used, every tenant
    on its planned host, starting at its demand under its planned policy."""
    demands = {d.tenant: d for d in result.demands}
    data = config.model_dump(mode="python", exclude={"source"})
    data["nodes"] = [n for n in data["nodes"] if n["name"] in result.hosts_used]
    for t in data["tenants"]:
        d = demands[t["name"]]
        t["node"] = result.assignment[t["name"]]
        t["initial_limit_bytes"] = d.demand_bytes
        if d.policy is not None:
            t["initial_policy"] = d.policy
    return Config.model_validate(data)


def confirm_with_sim(config, result: Plan, intervals: int | None = None) -> dict[str, dict]:
    """Run the placement on the sim backend with every limit held at the
    planned demand (the strictest reading of the plan: no controller
    handing out the hosts' spare memory) and report, per tenant with an
    SLO, the lowest throughput of any interval once its cache is warm (the
    same warm-up the planner's profiling used, again after each phase
    change, since a new phase reads new data)."""
    placed = placed_config(config, result)
    cold: dict[str, set[int]] = {}
    longest = 0
    for t in placed.tenants:
        if t.workload is None:
            continue
        w, at, skip = t.workload, 0, set()
        for p in w.phases:
            warm = -(-warm_accesses(p, w.accesses_per_interval) // w.accesses_per_interval)
            skip.update(range(at, at + warm))
            at += p.intervals or warm + 10
        cold[t.name] = skip
        longest = max(longest, at)
    n = intervals or longest
    out = {}
    for host in result.hosts_used:
        sim = SimBackend(placed, host, curves=False)
        seen: dict[str, list] = {}
        for _ in range(n):
            for r in sim.collect():
                seen.setdefault(r.tenant, []).append(r.throughput)
        for name, tenant in sim.tenants.items():
            spec = placed.tenant(name)
            if spec.slo is None:
                continue
            counted = [thr for i, thr in enumerate(seen[name]) if i not in cold[name]]
            low = min(counted) if counted else None
            out[name] = {"host": host, "slo": spec.slo.min_throughput,
                         "limit_bytes": tenant.limit_bytes, "policy": tenant.policy,
                         "min_throughput": low, "intervals": len(counted),
                         "met": low is not None and low >= spec.slo.min_throughput}
    return out
