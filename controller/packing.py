"""Vector bin packing: tenants' demands onto the fewest hosts.

A demand is a row of resources (memory bytes, disk read bytes per second,
CPU cores) and a host a row of capacities, inf where a capacity is not
known.  A host holds a set of tenants when their sum fits every capacity.
Solved exactly as an integer programme (scipy.optimize.milp: fewest hosts,
then fewest tenants moved) while the case is small, by first-fit
decreasing on the largest share of any resource beyond.  The planner
(controller/planner.py) builds the rows; nothing here knows what they mean.
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


def first_fit_decreasing(demand, capacity, allowed, current, names, hosts=None):
    """Tenants by largest share, biggest first, into the first open host
    with room in every resource; a new host (largest memory first, the
    tenant's current host on ties) when none has.  `hosts` caps how many
    may be opened.  {tenant index: host index}, or None when one fits
    nowhere."""
    free = capacity.astype(float).copy()
    opened: list[int] = []
    share = _share(demand, capacity)
    order = sorted(range(len(demand)), key=lambda t: (-share[t], names[t]))
    by_size = sorted(range(len(capacity)), key=lambda h: -capacity[h, 0])
    out = {}
    for t in order:
        room = [h for h in opened if allowed[t, h] and np.all(free[h] >= demand[t] - 1e-9)]
        if room:
            spot = room[0]
        else:
            fresh = [h for h in by_size if h not in opened and allowed[t, h]]
            if not fresh or (hosts is not None and len(opened) >= hosts):
                return None
            cur = [h for h in fresh if h == current[t]
                   and capacity[h, 0] == capacity[fresh[0], 0]]
            spot = cur[0] if cur else fresh[0]
            opened.append(spot)
        free[spot] -= demand[t]
        out[t] = spot
    return out


def milp(demand, capacity, allowed, current, time_limit: float, hosts=None):
    """Exact packing.  ({tenant index: host index}, proved optimal), or
    (None, False) when the solver found no placement in time."""
    from scipy.optimize import Bounds, LinearConstraint, milp as solve
    from scipy.sparse import lil_matrix

    T, H = len(demand), len(capacity)
    R = demand.shape[1]
    nx = T * H
    scale = np.where(demand.max(axis=0) > 0, demand.max(axis=0), 1.0)
    dem, cap = demand / scale, capacity / scale
    c = np.zeros(nx + H)
    c[nx:] = 1.0                                  # hosts used ...
    for t in range(T):                            # ... then (less than one) moves
        for h in range(H):
            c[t * H + h] = 0.0 if h == current[t] else 1.0 / (T + 1)
    rows = [(r, h) for h in range(H) for r in range(R) if np.isfinite(cap[h, r])]
    A = lil_matrix((T + len(rows) + T * H + 1, nx + H))
    lo, hi = [], []
    for t in range(T):                            # each tenant on one host
        A[len(lo), t * H:(t + 1) * H] = 1
        lo.append(1), hi.append(1)
    for r, h in rows:                             # what an open host holds
        for t in range(T):
            A[len(lo), t * H + h] = dem[t, r]
        A[len(lo), nx + h] = -cap[h, r]
        lo.append(-np.inf), hi.append(1e-9)
    for t in range(T):                            # x <= y (tightens the relaxation)
        for h in range(H):
            A[len(lo), t * H + h], A[len(lo), nx + h] = 1, -1
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
    x = np.round(res.x[:nx]).reshape(T, H)
    return {t: int(np.argmax(x[t])) for t in range(T)}, res.status == 0


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
