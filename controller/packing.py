"""Vector bin packing: tenants' demands onto the fewest hosts.

A demand is a row of resources (memory bytes, disk read bytes per second,
CPU cores) and a host a row of capacities, inf where a capacity is not
known.  A host holds a set of tenants when their sum fits every capacity.
Solved exactly as an integer programme (scipy.optimize.milp: fewest hosts,
then fewest tenants moved) while the case is small, by first-fit
decreasing on the largest share of any resource beyond.  The planner
(controller/planner.py) builds the rows; nothing here knows what they mean.

A tenant may offer several rows, `owner[k]` naming the tenant of row k:
more memory that reads less from the disk, say.  Exactly one row of each
tenant is placed; among placements equal in hosts and moves, the least
memory.  The answer maps each placed row to its host.
"""
from __future__ import annotations

import numpy as np

RESOURCES = ("memory", "disk", "cpu")


def compatible(demand: np.ndarray, capacity: np.ndarray, extra=None) -> np.ndarray:
    """ok[t, h]: tenant t alone fits host h (and `extra[t, h]`, if given)."""
    ok = np.all(demand[:, None, :] <= capacity[None, :, :] * (1 + 1e-12), axis=2)
    return ok if extra is None else ok & extra


def lower_bound(demand: np.ndarray, capacity: np.ndarray) -> int:
    """Hosts that must be open at least, resource by resource (largest hosts
    first); len(hosts) + 1 when even all of them cannot hold the total."""
    need = 0
    for r in range(demand.shape[1]):
        total = demand[:, r].sum()
        caps = sorted(capacity[:, r], reverse=True)
        acc, k = 0.0, 0
        for c in caps:
            if acc >= total:
                break
            acc, k = acc + c, k + 1
        need = max(need, k if acc >= total else len(caps) + 1)
    return need


def _share(demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Each tenant's largest fraction of the largest host, over resources."""
    top = np.where(np.isfinite(capacity), capacity, 0).max(axis=0)
    top = np.where(top > 0, top, 1.0)
    return (demand / top).max(axis=1)


def _owners(demand, owner):
    owner = np.arange(len(demand)) if owner is None else np.asarray(owner)
    rows = [np.flatnonzero(owner == t) for t in range(int(owner.max()) + 1 if len(owner) else 0)]
    # a tenant's rows, least memory first
    return owner, [r[np.argsort(demand[r, 0], kind="stable")] for r in rows]


def first_fit_decreasing(demand, capacity, allowed, current, names, hosts=None, owner=None):
    """Tenants by largest share (of their first row), biggest first, into
    the first open host with room in every resource for one of their
    rows (the least memory that fits); a new host (largest memory first,
    the tenant's current host on ties) when none has, with the least
    memory allowed there.  `hosts` caps how many may be opened.
    `allowed` is per row and host, `current` and `names` per tenant.
    {row index: host index}, or None when a tenant fits nowhere."""
    owner, rows = _owners(demand, owner)
    free = capacity.astype(float).copy()
    opened: list[int] = []
    share = _share(demand, capacity)
    order = sorted(range(len(rows)), key=lambda t: (-share[rows[t][0]], names[t]))
    by_size = sorted(range(len(capacity)), key=lambda h: -capacity[h, 0])
    out = {}
    for t in order:
        spot = next(((h, k) for h in opened for k in rows[t]
                     if allowed[k, h] and np.all(free[h] >= demand[k] - 1e-9)), None)
        if spot is None:
            fresh = [h for h in by_size if h not in opened and allowed[rows[t], h].any()]
            if not fresh or (hosts is not None and len(opened) >= hosts):
                return None
            cur = [h for h in fresh if h == current[t]
                   and capacity[h, 0] == capacity[fresh[0], 0]]
            h = cur[0] if cur else fresh[0]
            spot = (h, next(k for k in rows[t] if allowed[k, h]))
            opened.append(h)
        h, k = spot
        free[h] -= demand[k]
        out[k] = h
    return out


def milp(demand, capacity, allowed, current, time_limit: float, hosts=None, owner=None):
    """Exact packing.  ({row index: host index}, proved optimal), or
    (None, False) when the solver found no placement in time.  `allowed`
    is per row and host, `current` per tenant."""
    from scipy.optimize import Bounds, LinearConstraint, milp as solve
    from scipy.sparse import lil_matrix

    owner, rows_of = _owners(demand, owner)
    K, H, T = len(demand), len(capacity), len(rows_of)
    R = demand.shape[1]
    nx = K * H
    scale = np.where(demand.max(axis=0) > 0, demand.max(axis=0), 1.0)
    dem, cap = demand / scale, capacity / scale
    c = np.zeros(nx + H)
    c[nx:] = 1.0                                  # hosts used, then (less than one) moves,
    for k in range(K):                            # then (less than one move) memory
        t = owner[k]
        for h in range(H):
            c[k * H + h] = (0.0 if h == current[t] else 1.0 / (T + 1)) + \
                dem[k, 0] / (T + 1) ** 2 / max(K, 1)
    rows = [(r, h) for h in range(H) for r in range(R) if np.isfinite(cap[h, r])]
    A = lil_matrix((T + len(rows) + K * H + 1, nx + H))
    lo, hi = [], []
    for t in range(T):                            # each tenant on one host, one row
        for k in rows_of[t]:
            A[len(lo), k * H:(k + 1) * H] = 1
        lo.append(1), hi.append(1)
    for r, h in rows:                             # what an open host holds
        for k in range(K):
            A[len(lo), k * H + h] = dem[k, r]
        A[len(lo), nx + h] = -cap[h, r]
        lo.append(-np.inf), hi.append(1e-9)
    for k in range(K):                            # x <= y (tightens the relaxation)
        for h in range(H):
            A[len(lo), k * H + h], A[len(lo), nx + h] = 1, -1
            lo.append(-np.inf), hi.append(0)
    A[len(lo), nx:] = 1                           # at most `hosts` open
    lo.append(0), hi.append(H if hosts is None else hosts)
    ub = np.ones(nx + H)
    ub[:nx] = allowed.reshape(-1).astype(float)
    res = solve(c, constraints=LinearConstraint(A.tocsr(), np.array(lo), np.array(hi)),
                integrality=np.ones(nx + H), bounds=Bounds(np.zeros(nx + H), ub),
                options={"time_limit": time_limit, "disp": False})
    if res.x is None:
        return None, False
    x = np.round(res.x[:nx]).reshape(K, H)
    return {k: int(np.argmax(x[k])) for k in range(K) if x[k].max() > 0.5}, res.status == 0


def crowd(memory, capacity, allowed, current, hosts: int) -> dict[int, int]:
    """Every tenant on `hosts` hosts whatever their capacities: the largest
    hosts (those holding most now on ties), each tenant, largest first,
    onto the one with the most memory left (it may go below zero).  What
    a plan forced tighter than memory allows carries out."""
    held = np.zeros(len(capacity))
    for t, h in enumerate(current):
        if h >= 0:
            held[h] += memory[t]
    chosen = sorted(range(len(capacity)), key=lambda h: (-capacity[h], -held[h]))[:hosts]
    left = {h: float(capacity[h]) for h in chosen}
    out = {}
    for t in sorted(range(len(memory)), key=lambda t: -memory[t]):
        spots = [h for h in chosen if allowed[t, h]] or chosen
        h = max(spots, key=lambda h: (left[h], h == current[t]))
        left[h] -= memory[t]
        out[t] = h
    return out


def binding(demand, capacity, members: list[int]) -> tuple[str, float]:
    """The resource a host is fullest in, and how full (0..1)."""
    if not members:
        return "", 0.0
    used = demand[members].sum(axis=0)
    frac = np.where(np.isfinite(capacity) & (capacity > 0), used / np.where(
        capacity > 0, capacity, 1.0), 0.0)
    r = int(np.argmax(frac))
    return RESOURCES[r], float(frac[r])
