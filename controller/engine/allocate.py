"""Dividing each node's memory among its tenants: three pure functions over
arrays (a row per tenant, sizes in 4 KiB pages, `node` the row's node).

1. serve_slos: every tenant at its lower bound; feasible SLOs raised to
   their need by priority (smallest extra need first within one), then
   toward their headroom with what is left.  A need that does not fit is
   skipped, not half-served.
2. distribute: the rest where modelled throughput gains most, on each
   curve's concave hull: the greedy over hull segments, steepest first,
   which is optimal for such gains (a node's few tenants walk it in
   Python; a round's thousand use its Lagrangian dual, bisected per
   node).  Memory nobody gains from goes by headroom under the ceiling.
3. step_limit: limits move toward the targets by at most
   max_step_fraction of the node's memory in one interval, every move
   scaled alike; moves within the hysteresis are not made; a safety raise
   is never delayed, and shrinking tenants pay for it.
"""
from __future__ import annotations

import numpy as np

from cachepilot.controller.engine.curves import miss_at
from cachepilot.controller.engine.model import throughput


def serve_slos(node, memory, lb, need, has_slo, priority, order, need_safe=None, hold=None):
    """Returns (x_lo, granted): the size each tenant is raised to before the
    marginal stage and whether its SLO need was granted.

    node: node index per row; memory: pages per node; lb: lower bound per
    row; need: least size meeting the SLO (inf if impossible); order: a
    stable tie-break rank per row (e.g. position of the name in sort order).
    need_safe: optionally, a larger size meeting the SLO with headroom;
    granted tenants are raised toward it, again by priority, only with
    memory left once every SLO that fits has its plain need -- headroom for
    one never costs another its SLO.
    hold: optionally, a size per row to keep (0 where none: a tenant whose
    new phase its curve does not read yet, engine/round.py); raised toward
    after every SLO's plain need and before any headroom.
    """
    x_lo = lb.copy()
    granted = np.zeros(len(lb), dtype=bool)
    free = memory - np.bincount(node, weights=lb, minlength=len(memory))

    def raise_toward(rows, goal):
        # each row in turn toward its goal, with what its node has left
        for i in rows:
            more = min(goal[i] - x_lo[i], free[node[i]])
            if more > 0:
                free[node[i]] -= more
                x_lo[i] += more

    extra = np.maximum(need - lb, 0.0)
    want = np.flatnonzero(has_slo & np.isfinite(need))
    # node, then priority (high first), then smallest extra, then name
    seq = want[np.lexsort((order[want], extra[want], -priority[want], node[want]))]
    for i in seq.tolist():
        n = node[i]
        if extra[i] <= free[n] + 1e-9:
            free[n] -= extra[i]
            x_lo[i] = lb[i] + extra[i]
            granted[i] = True
    if hold is not None:
        raise_toward(np.flatnonzero(hold > x_lo).tolist(), hold)
    if need_safe is not None:
        raise_toward(seq[granted[seq]].tolist(), need_safe)
    return x_lo, granted


def _grid(xs, ys, a, b, x_lo, x_hi):
    """Candidate sizes per row (the curve's points inside [x_lo, x_hi], and
    both ends) and the modelled throughput gain over x_lo at each."""
    m_lo = miss_at(xs, ys, x_lo)
    m_hi = miss_at(xs, ys, x_hi)
    inside = np.clip(xs, x_lo[:, None], x_hi[:, None])
    m_in = np.where(xs < x_lo[:, None], m_lo[:, None],
                    np.where(xs > x_hi[:, None], m_hi[:, None], ys))
    X = np.concatenate((x_lo[:, None], inside, x_hi[:, None]), axis=1)
    M = np.concatenate((m_lo[:, None], m_in, m_hi[:, None]), axis=1)
    T = throughput(a[:, None], b[:, None], M)
    return X - x_lo[:, None], T - T[:, :1]


# Up to this many rows the greedy walks the hulls in Python; beyond, the
# vectorised dual is faster.  Both give the same allocation.
SMALL = 32


def distribute(node, budget, x_lo, x_hi, xs, ys, a, b, iterations=28, small=SMALL):
    """Sizes (pages) per row: x_lo plus a share of each node's `budget`."""
    nn = len(budget)
    D, G = _grid(xs, ys, a, b, x_lo, x_hi)
    budget = np.maximum(budget, 0.0)
    if len(x_lo) <= small:
        add, free, left = _greedy_on_hulls(node, budget, D, G)
    else:
        add, free, left = _dual(node, budget, D, G, iterations)
    x = x_lo + add

    # slack nobody gains from: in proportion to headroom under the ceiling
    slack_nodes = free & (left > 1e-9)
    if slack_nodes.any():
        room = np.where(slack_nodes[node], np.maximum(x_hi - x, 0.0), 0.0)
        total = np.bincount(node, weights=room, minlength=nn)
        share = np.where(total > 0, np.minimum(left / np.where(total > 0, total, 1.0), 1.0), 0.0)
        x += room * share[node]
    return x


def _greedy_on_hulls(node, budget, D, G):
    """The greedy itself: each row's upper concave hull of (added size,
    throughput gain), every rising hull segment of a node taken steepest
    first until the node's budget runs out (the last one partly).
    Returns (added size per row, nodes with budget to spare, budget left)."""
    segs = []                       # (node, -slope, row, length)
    wanted = np.zeros(len(budget))
    for i, (xs, gs) in enumerate(zip(D.tolist(), G.tolist())):
        hull = []
        for p in zip(xs, gs):
            if hull and p[0] == hull[-1][0]:
                if p[1] <= hull[-1][1]:
                    continue
                hull.pop()
            while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= \
                    (p[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0]):
                hull.pop()
            hull.append(p)
        n = int(node[i])
        for (x0, y0), (x1, y1) in zip(hull, hull[1:]):
            if y1 <= y0:
                break               # concave: nothing further rises
            segs.append((n, -(y1 - y0) / (x1 - x0), i, x1 - x0))
            wanted[n] += x1 - x0
    segs.sort()
    add = np.zeros(len(node))
    left = budget.copy()
    for n, _, i, length in segs:
        take = min(length, left[n])
        if take > 0:
            add[i] += take
            left[n] -= take
    return add, wanted <= budget + 1e-9, left


def _dual(node, budget, D, G, iterations):
    """The same greedy through its Lagrangian dual (see the module doc)."""
    nn = len(budget)
    r = np.arange(len(node))

    def choose(lam_node):
        V = G - lam_node[node][:, None] * D
        j = V.argmax(axis=1)        # ties: the smallest size
        return j, np.bincount(node, weights=D[r, j], minlength=nn)

    zero = np.zeros(nn)
    j0, s0 = choose(zero)
    free = s0 <= budget + 1e-9          # everyone gets all they gain from
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.where(D > 0, G / np.where(D > 0, D, 1.0), 0.0)
    lam_max = np.zeros(nn)
    np.maximum.at(lam_max, node, slopes.max(axis=1, initial=0.0))
    lo, hi = zero.copy(), lam_max * (1 + 1e-9) + 1e-300
    if not free.all():
        for _ in range(iterations):
            mid = np.where(free, 0.0, 0.5 * (lo + hi))
            _, s = choose(mid)
            ok = s <= budget + 1e-9
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid)
    j_hi, s_hi = choose(np.where(free, 0.0, hi))
    j_lo, _ = choose(np.where(free, 0.0, lo))
    add = D[r, j_hi].copy()
    left = budget - s_hi

    # the partial, last segments: slope order within each node
    d_hi, d_lo = D[r, j_hi], D[r, j_lo]
    marginal = np.flatnonzero(~free[node] & (d_lo > d_hi + 1e-12))
    if len(marginal):
        seg = (G[marginal, j_lo[marginal]] - G[marginal, j_hi[marginal]]) / \
            (d_lo[marginal] - d_hi[marginal])
        for i in marginal[np.lexsort((marginal, -seg, node[marginal]))].tolist():
            n = node[i]
            take = min(d_lo[i] - d_hi[i], max(left[n], 0.0))
            add[i] += take
            left[n] -= take
    return add, free, left


def keep_unless_better(node, budget, x_lo, x_hi, incumbent, target, xs, ys, a, b,
                       min_gain, sigma=None, detail: dict | None = None):
    """Per node, `target` where it is modelled to gain more than `min_gain`
    (relative) over the `incumbent` division (last round's targets, within
    [x_lo, x_hi], where they fit the node's `budget` above x_lo), and more
    than the gain's own uncertainty, else the incumbent; `budget`, xs, ys,
    a, b as for distribute.  A deadband on the objective, not on sizes:
    the hysteresis keeps small moves from happening, this keeps large ones
    that buy nothing from happening -- two divisions of a node that are
    worth about the same swap places on one interval's noise, and each
    swap evicts a cache that has to be read back from disk.

    `sigma`, per row: the standard deviation of log(observed /
    predicted) throughput (round.prediction_sigma).  The gain is a sum of
    each tenant's change, and each change is only as sure as its
    tenant's model: one sigma short of a log-normal prediction is
    1 - exp(-sigma) of it, never all of it, and a division that moves
    much memory between tenants whose predictions have erred by tens of
    per cent must win by more than those shortfalls of the changes taken
    together (as independent errors, in quadrature) -- a move wins at the
    pessimistic end or is not made; a tenant whose predictions err
    wildly still moves for a gain many times what it risks.  Throughput
    maximised on 1/(a + b m) favours whoever holds the most (the more it
    holds, the more the next page buys it), so without this, the node's
    spare memory went to one tenant whole and back to the other on the
    next swing of their models (make consolidate: 151 MiB between two
    tenants every 100 s).
    An incumbent that no longer fits (a tenant joined the node, an SLO's
    need rose) is shrunk to fit, every row's part above x_lo alike, and
    kept only where the model rates it above the target: memory moves
    either way, so the deadband's reason (a move that buys nothing) is
    gone, but the greedy's target, exact on concave curves only, is no
    better than the division the node held, cut to fit (make consolidate:
    a 16 MiB tenant moved onto a node made the round deal 130 MiB from one
    SLO tenant to the other, a division its own model rated a fifth
    lower than the shrunk one; held to the deadband as well, a shrunk
    division kept where the target was a little better cost the demo
    0.08x of its aggregate).  With `detail`, its "shrink" is that factor
    per node (1 where the incumbent fits).
    Returns (sizes, nodes kept)."""
    nn = len(budget)
    stay = np.clip(incumbent, x_lo, x_hi)
    above = np.bincount(node, weights=stay - x_lo, minlength=nn)
    shrink = np.where(above > budget, np.maximum(budget, 0.0) / np.maximum(above, 1e-9), 1.0)
    stay = x_lo + (stay - x_lo) * shrink[node]
    if detail is not None:
        detail["shrink"] = shrink
    t_stay = throughput(a, b, miss_at(xs, ys, stay))
    t_target = throughput(a, b, miss_at(xs, ys, target))
    total_stay = np.bincount(node, weights=t_stay, minlength=nn)
    total_target = np.bincount(node, weights=t_target, minlength=nn)
    doubt = np.zeros(nn)
    if sigma is not None:
        change = t_target - t_stay
        change = np.where(np.isfinite(change), change, 0.0)
        short = -np.expm1(-np.maximum(sigma, 0.0))
        doubt = np.sqrt(np.bincount(node, weights=(change * short) ** 2, minlength=nn))
    kept = np.where(shrink < 1.0, total_target < total_stay,
                    total_target <= total_stay * (1.0 + min_gain) + doubt)
    return np.where(kept[node], stay, target), kept


def step_limit(node, memory, current, target, lb, ub, max_step_fraction, hysteresis,
               detail: dict | None = None):
    """New limits (pages) moved from `current` toward `target` under the
    per-node step budget and hysteresis (see the module comment).  With
    `detail`, each row's figures go in it: `base` (the limit in force after
    a safety raise), `want` (the move asked, 0 when settled by the
    hysteresis), `scale` (the share of it the node's step allows) and
    `settled`; the new limit is base + scale * want, less what paying for a
    safety raise took back."""
    nn = len(memory)
    forced = np.maximum(lb - current, 0.0)           # safety raises
    base = current + forced
    want = target - base
    settled = (np.abs(target - current) < hysteresis * memory[node]) & \
        (forced == 0) & (current <= ub)
    want = np.where(settled, 0.0, want)
    step = max_step_fraction * memory
    up_room = np.maximum(step - np.bincount(node, weights=forced, minlength=nn), 0.0)
    up = np.bincount(node, weights=np.maximum(want, 0.0), minlength=nn)
    down = np.bincount(node, weights=np.maximum(-want, 0.0), minlength=nn)
    f = np.minimum(np.where(up > up_room, up_room / np.where(up > 0, up, 1.0), 1.0),
                   np.where(down > step, step / np.where(down > 0, down, 1.0), 1.0))
    new = base + f[node] * want
    # The limits must not add up to more than before (or than the node):
    # a safety raise, or a shrink the hysteresis held back, may have pushed
    # them over.  Cancel growth first, then move shrinking tenants further
    # toward their targets; the latter may exceed the step, since a safety
    # raise has to be paid for.
    cap = np.maximum(memory, np.bincount(node, weights=current, minlength=nn))
    excess = np.maximum(np.bincount(node, weights=new, minlength=nn) - cap, 0.0)
    for room in (lambda: np.maximum(new - base, 0.0),
                 lambda: np.maximum(new - np.maximum(target, lb), 0.0)):
        if not (excess > 1e-9).any():
            break
        r = room()
        total = np.bincount(node, weights=r, minlength=nn)
        cut = np.where(total > 0, np.minimum(excess / np.where(total > 0, total, 1.0), 1.0), 0.0)
        new = new - r * cut[node]
        excess = np.maximum(excess - total * cut, 0.0)
    if detail is not None:
        detail.update(base=base, want=want, scale=f[node], settled=settled)
    return new
