"""Consolidation planner: the fewest hosts on which every SLO is still met.

Input is an ordinary config: `nodes` are the hosts that exist (their
memory), `tenants` say where each runs now, its SLO, floor, ceiling and
allowed policies, and where its curves come from: a `curves_file`, or a
`workload` the planner profiles itself (_needs).  A tenant's demand is the
least memory with which one allowed policy meets its SLO in every phase of
its workload (tenant_demands): one (policy, size) pair that needs no
autopilot to stay safe.  Packing the demands onto hosts is bin packing,
solved exactly while the case is small and by first-fit decreasing beyond
(plan).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cachepilot.controller.config import Config
from cachepilot.core.errors import UserError
from cachepilot.models.mrc import MRC, PAGE_SIZE
from cachepilot.sim.backend import PhaseStream, SimBackend

EXACT_LIMIT = 600          # tenant x host pairs up to which the MILP is tried
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


@dataclass
class Plan:
    method: str                     # "milp (optimal)", "milp (time limit)", "first-fit decreasing"
    hosts_used: list[str]
    assignment: dict[str, str]      # tenant -> host
    hosts: list[dict]               # per host: name, memory, demand, tenants
    memory_total_bytes: int
    memory_freed_bytes: int         # memory of the hosts no longer needed
    lower_bound_hosts: int
    moved: list[str]
    demands: list[Demand]
    seconds: float

    def to_dict(self) -> dict:
        d = asdict(self)
        for x in d["demands"]:
            x["per_policy"] = {k: (None if v == math.inf else v)
                               for k, v in x["per_policy"].items()}
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

def _compatible(config, demands) -> np.ndarray:
    """allowed[t, h]: tenant t may run on host h (memory and policy)."""
    hosts = config.nodes
    ok = np.ones((len(demands), len(hosts)), dtype=bool)
    for t, d in enumerate(demands):
        for h, host in enumerate(hosts):
            if d.demand_bytes > host.memory_bytes:
                ok[t, h] = False
            elif d.policy and host.policies is not None and d.policy not in host.policies:
                ok[t, h] = False
    return ok


def _lower_bound(caps: list[int], total: int) -> int:
    acc, k = 0, 0
    for c in sorted(caps, reverse=True):
        if acc >= total:
            break
        acc += c
        k += 1
    return k if acc >= total else len(caps) + 1


def first_fit_decreasing(config, demands, allowed) -> dict[str, str] | None:
    """Tenants by demand, largest first, into the first open host with room;
    a new host (largest first, the tenant's current host on ties) when none
    has.  None when some tenant fits nowhere."""
    hosts = config.nodes
    free = {h.name: h.memory_bytes for h in hosts}
    opened: list[int] = []
    order = sorted(range(len(demands)), key=lambda t: (-demands[t].demand_bytes,
                                                        demands[t].tenant))
    by_size = sorted(range(len(hosts)), key=lambda h: (-hosts[h].memory_bytes, hosts[h].name))
    out = {}
    for t in order:
        d = demands[t]
        spot = next((h for h in opened if allowed[t, h]
                     and free[hosts[h].name] >= d.demand_bytes), None)
        if spot is None:
            fresh = [h for h in by_size if h not in opened and allowed[t, h]
                     and hosts[h].memory_bytes >= d.demand_bytes]
            if not fresh:
                return None
            cur = [h for h in fresh if hosts[h].name == d.current_node
                   and hosts[h].memory_bytes == hosts[fresh[0]].memory_bytes]
            spot = cur[0] if cur else fresh[0]
            opened.append(spot)
        free[hosts[spot].name] -= d.demand_bytes
        out[d.tenant] = hosts[spot].name
    return out


def milp_pack(config, demands, allowed, time_limit: float = MILP_TIME_LIMIT_S):
    """Exact bin packing with scipy.optimize.milp.  Returns (assignment,
    optimal) or (None, False) when no feasible plan was found."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    hosts = config.nodes
    T, H = len(demands), len(hosts)
    nx = T * H
    unit = float(1 << 20)                       # MiB keeps the numbers tame
    dem = np.array([d.demand_bytes / unit for d in demands])
    cap = np.array([h.memory_bytes / unit for h in hosts])
    # objective: hosts, then (less than one host's worth) tenants moved
    c = np.zeros(nx + H)
    c[nx:] = 1.0
    eps = 1.0 / (T + 1)
    for t, d in enumerate(demands):
        for h, host in enumerate(hosts):
            if host.name != d.current_node:
                c[t * H + h] = eps
    rows = T + H + T * H
    A = lil_matrix((rows, nx + H))
    lo = np.zeros(rows)
    hi = np.zeros(rows)
    r = 0
    for t in range(T):                          # each tenant on one host
        for h in range(H):
            A[r, t * H + h] = 1
        lo[r] = hi[r] = 1
        r += 1
    for h in range(H):                          # capacity of used hosts
        for t in range(T):
            A[r, t * H + h] = dem[t]
        A[r, nx + h] = -cap[h]
        lo[r], hi[r] = -np.inf, 1e-9
        r += 1
    for t in range(T):                          # x <= y (tightens the LP)
        for h in range(H):
            A[r, t * H + h] = 1
            A[r, nx + h] = -1
            lo[r], hi[r] = -np.inf, 0
            r += 1
    ub = np.ones(nx + H)
    ub[:nx] = allowed.reshape(-1).astype(float)
    res = milp(c, constraints=LinearConstraint(A.tocsr(), lo, hi),
               integrality=np.ones(nx + H), bounds=Bounds(np.zeros(nx + H), ub),
               options={"time_limit": time_limit, "disp": False})
    if res.x is None:
        return None, False
    x = np.round(res.x[:nx]).reshape(T, H)
    assignment = {demands[t].tenant: hosts[int(np.argmax(x[t]))].name for t in range(T)}
    return assignment, res.status == 0


def plan(config, headroom: float = 0.10, method: str = "auto",
         exact_limit: int = EXACT_LIMIT, time_limit: float = MILP_TIME_LIMIT_S,
         demands: list[Demand] | None = None) -> Plan:
    """The fewest hosts meeting every SLO: the tenants' demands packed onto
    the hosts.  For small cases the packing is solved exactly as an integer
    programme with scipy.optimize.milp (HiGHS): minimise hosts used, and
    among plans with that many hosts, tenants moved from where they run
    now.  Beyond `exact_limit` tenant x host pairs (or when the solver
    cannot prove optimality within `time_limit`) first-fit decreasing is
    used, and the result says which."""
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
    allowed = _compatible(config, demands)
    for t, d in enumerate(demands):
        if not allowed[t].any():
            raise UserError(f"plan: tenant {d.tenant!r} needs {d.demand_bytes} bytes"
                            f" under {d.policy}, which no host offers")
    hosts = config.nodes
    assignment, used_method = None, None
    pairs = len(demands) * len(hosts)
    if method == "milp" or (method == "auto" and pairs <= exact_limit):
        assignment, optimal = milp_pack(config, demands, allowed, time_limit)
        if assignment is not None:
            used_method = "milp (optimal)" if optimal else \
                f"milp (time limit {time_limit:g}s, best found)"
        elif method == "milp":
            raise UserError("plan: the MILP found no feasible placement")
    if assignment is None:
        assignment = first_fit_decreasing(config, demands, allowed)
        used_method = "first-fit decreasing" + (
            "" if method == "ffd" or pairs > exact_limit else " (MILP gave no answer)")
        if assignment is None:
            raise UserError("plan: the tenants do not fit on the hosts given")
    per_host = []
    for h in hosts:
        mine = sorted(t for t, n in assignment.items() if n == h.name)
        dsum = sum(d.demand_bytes for d in demands if d.tenant in mine)
        per_host.append({"name": h.name, "memory_bytes": h.memory_bytes,
                         "demand_bytes": dsum, "tenants": mine})
    used = [h["name"] for h in per_host if h["tenants"]]
    total = sum(h.memory_bytes for h in hosts)
    freed = sum(h["memory_bytes"] for h in per_host if not h["tenants"])
    moved = sorted(d.tenant for d in demands if assignment[d.tenant] != d.current_node)
    lb = _lower_bound([h.memory_bytes for h in hosts], sum(d.demand_bytes for d in demands))
    return Plan(used_method, used, dict(sorted(assignment.items())), per_host, total, freed,
                lb, moved, demands, time.perf_counter() - start)


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
