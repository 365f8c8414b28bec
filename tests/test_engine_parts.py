"""The engine's building blocks against independent oracles: the vectorised
curve readers against MRC.at / MRC.size_for, the closed-form NNLS against
scipy.optimize.nnls, the hull-greedy allocation against exhaustive search."""
import itertools

import numpy as np
import pytest
from scipy.optimize import nnls

from cachepilot.controller.engine import allocate, model
from cachepilot.controller.engine.curves import CurveBank, miss_at
from cachepilot.models import policy_settling
from cachepilot.models.mrc import MRC


def random_curve(rng, policy="lru"):
    k = int(rng.integers(1, 40))
    sizes = np.unique(rng.integers(0, 5000, size=k))
    # not necessarily monotone: the readers must make it so, like MRC does
    miss = np.sort(rng.uniform(0, 1, size=len(sizes)))[::-1]
    miss = np.clip(miss + rng.normal(0, 0.05, size=len(sizes)), 0, 1)
    return MRC(sizes, miss, policy)


def test_curve_bank_reads_like_mrc():
    rng = np.random.default_rng(7)
    curves = [random_curve(rng) for _ in range(300)]
    bank = CurveBank(curves)
    rows = np.arange(len(curves))
    pxs, pys = bank.padded(rows)
    for trial in range(5):
        x = rng.uniform(0, 6000, size=len(curves))
        got = bank.miss_at(rows, x)
        # MRC.at interpolates the raw points; the bank reads the monotone
        # (min-accumulated) curve, which is what size_for uses too.
        want = [np.interp(xi, *_mono(c)) for c, xi in zip(curves, x)]
        np.testing.assert_allclose(got, want, atol=1e-12)
        np.testing.assert_allclose(miss_at(pxs, pys, x), want, atol=1e-12)
        # a subset, in another order
        sub = rows[::-7]
        np.testing.assert_allclose(bank.miss_at(sub, x[sub]), np.asarray(want)[sub], atol=1e-12)
        t = rng.uniform(-0.1, 1.1, size=len(curves))
        t[::5] = [c.miss_ratio[len(c.miss_ratio) // 2] for c in curves[::5]]  # on a point
        got = bank.size_for(rows, t)
        for c, ti, g in zip(curves, t, got):
            w = c.size_for(float(ti))
            if w is None:
                assert g == np.inf
            else:
                assert g == pytest.approx(w, abs=1e-6)


def _mono(c):
    xs, ys = c._points()
    return xs.astype(float), np.minimum.accumulate(ys)


def test_curve_bank_on_monotone_curves_matches_at_exactly():
    sizes = np.array([10, 20, 40, 80])
    c = MRC(sizes, [0.9, 0.5, 0.3, 0.1])
    bank = CurveBank([c, MRC([0, 5], [1.0, 0.2])])
    x = np.array([30.0, 7.0])
    np.testing.assert_allclose(bank.miss_at(np.arange(2), x), [c.at(30.0), 0.2])
    assert bank.size_for(np.array([0]), np.array([0.3]))[0] == c.size_for(0.3) == 40


def test_nnls2_matches_scipy():
    rng = np.random.default_rng(3)
    for _ in range(400):
        n = int(rng.integers(1, 30))
        m = rng.uniform(0, 1, size=n) * rng.choice([1.0, 0.01])
        # true coefficients of either sign so that constraints bind
        y = rng.normal(0, 1) + rng.normal(0, 2) * m + rng.normal(0, 0.3, size=n)
        a, b = model.nnls2(n, m.sum(), (m * m).sum(), y.sum(), (m * y).sum(), (y * y).sum())
        A = np.c_[np.ones(n), m]
        ref, _ = nnls(A, y)
        got_err = np.sum((A @ [float(a), float(b)] - y) ** 2)
        ref_err = np.sum((A @ ref - y) ** 2)
        assert a >= 0 and b >= 0
        assert got_err <= ref_err + 1e-9 * max(1.0, ref_err)


def fit_one(ms, thr, prior=(2e-6, 1e-4), min_points=5, min_spread=0.05):
    w = len(ms)
    om = np.asarray(ms, dtype=float)[None, :] if w else np.zeros((1, 1))
    oy = 1.0 / np.asarray(thr, dtype=float)[None, :] if w else np.zeros((1, 1))
    a, b, fitted = model.fit(om, oy, np.array([w]), np.array([prior[0]]),
                             np.array([prior[1]]), min_points, min_spread)
    return float(a[0]), float(b[0]), bool(fitted[0])


def test_fit_recovers_the_service_model():
    t_hit, t_miss = 5e-6, 3e-4
    ms = np.linspace(0.1, 0.6, 8)
    thr = 1.0 / (t_hit + ms * t_miss)
    a, b, fitted = fit_one(ms, thr)
    assert fitted
    assert a == pytest.approx(t_hit, rel=1e-6) and b == pytest.approx(t_miss, rel=1e-6)


def test_fit_keeps_the_prior_until_enough_spread_and_points():
    t_hit, t_miss = 5e-6, 3e-4
    # no observation: the prior as is
    assert fit_one([], []) == (2e-6, 1e-4, False)
    # many points but all at one miss ratio: prior shape through their level
    ms = np.full(10, 0.3)
    thr = 1.0 / (t_hit + ms * t_miss)
    a, b, fitted = fit_one(ms, thr)
    assert not fitted
    assert b / a == pytest.approx(1e-4 / 2e-6)
    assert 1.0 / (a + b * 0.3) == pytest.approx(thr[0])
    # spread but too few points
    a, b, fitted = fit_one([0.1, 0.6], 1.0 / (t_hit + np.array([0.1, 0.6]) * t_miss))
    assert not fitted


def test_throughput_and_its_inverse():
    a, b = np.array([1e-5, 1e-5, 1e-5]), np.array([1e-4, 1e-4, 0.0])
    s = np.array([1.0 / (1e-5 + 0.25e-4), 1e6, 1e4])
    m = model.miss_ratio_for(a, b, s)
    assert m[0] == pytest.approx(0.25)
    assert m[1] < 0                 # faster than an all-hit cache can go
    assert m[2] == np.inf           # no miss dependence, and fast enough
    np.testing.assert_allclose(model.throughput(a[:1], b[:1], m[:1]), s[:1])


# -- allocation ------------------------------------------------------------------

def test_serve_slos_priority_then_smallest_need():
    node = np.array([0, 0, 0, 0])
    lb = np.full(4, 10.0)
    need = np.array([60.0, 40.0, 30.0, np.inf])
    has = np.array([True, True, True, True])
    prio = np.array([0.0, 5.0, 0.0, 9.0])
    x, granted = allocate.serve_slos(node, np.array([100.0]), lb, need, has, prio,
                                     np.arange(4))
    # lb uses 40; free 60.  prio 9 is infeasible (skipped); prio 5 takes 30
    # extra; then among prio 0 the smaller need (20 extra) fits, 50 does not.
    assert granted.tolist() == [False, True, True, False]
    assert x.tolist() == [10.0, 40.0, 30.0, 10.0]


def test_serve_slos_headroom_only_from_what_is_left():
    node = np.zeros(3, dtype=np.int64)
    lb = np.zeros(3)
    need = np.array([40.0, 50.0, 30.0])
    safe = np.array([48.0, 60.0, 35.0])
    has = np.ones(3, dtype=bool)
    prio = np.array([9.0, 0.0, 0.0])
    # 130 pages hold all plain needs; 10 are left for headroom, and the
    # top-priority tenant's 8 come first, then 2 for the next in line
    x, granted = allocate.serve_slos(node, np.array([130.0]), lb, need, has, prio,
                                     np.arange(3), safe)
    assert granted.all()
    assert x.tolist() == [48.0, 50.0, 32.0]
    # with 100 pages one plain need must go: headroom never takes an SLO's place
    x, granted = allocate.serve_slos(node, np.array([100.0]), lb, need, has, prio,
                                     np.arange(3), safe)
    assert granted.tolist() == [True, False, True]
    assert x.tolist() == [48.0, 0.0, 35.0]


def test_serve_slos_holds_a_new_phase_after_plain_needs_before_headroom():
    # rows 0 and 1 have SLOs (needs 40 and 30, with headroom to 70 and 50);
    # row 2 changed phase and holds 60 pages (engine/round.py _hold_new_phase)
    node = np.zeros(3, dtype=np.int64)
    lb = np.array([0.0, 0.0, 10.0])
    need = np.array([40.0, 30.0, np.inf])
    safe = np.array([70.0, 50.0, np.inf])
    has = np.array([True, True, False])
    hold = np.array([0.0, 0.0, 60.0])
    args = (node, np.array([150.0]), lb, need, has, np.zeros(3), np.arange(3), safe)
    x, granted = allocate.serve_slos(*args, hold)
    assert granted[:2].all()
    assert x.tolist() == [40.0, 50.0, 60.0]        # the 20 left go to headroom
    x, _ = allocate.serve_slos(*args)
    assert x.tolist() == [70.0, 50.0, 10.0]        # unheld, headroom takes them
    # with 110 pages the plain needs still come first, the hold gets the rest
    x, granted = allocate.serve_slos(node, np.array([110.0]), *args[2:], hold)
    assert granted[:2].all() and x.tolist() == [40.0, 30.0, 40.0]


def upper_hull(pts):
    """Upper (concave) hull of points sorted by x: a monotone-chain scan."""
    hull = []
    for p in pts:
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= \
                (p[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0]):
            hull.pop()
        hull.append(p)
    return hull


def hull_points(c, a, b):
    """Vertices of the concave hull of (size, modelled throughput)."""
    xs, ys = _mono(c)
    t = 1.0 / (a + b * ys)
    return upper_hull(sorted(zip(xs.tolist(), t.tolist())))


def hull_value(c, a, b, x):
    hx, hy = zip(*hull_points(c, a, b))
    return float(np.interp(x, hx, hy))


def max_hull_step(c, a, b):
    """Largest throughput gain of one hull segment."""
    hy = [p[1] for p in hull_points(c, a, b)]
    return float(np.max(np.diff(hy))) if len(hy) > 1 else 0.0


# small=0 forces the vectorised dual, small=10**6 the Python walk over hulls
BOTH = pytest.mark.parametrize("small", [0, 10**6], ids=["dual", "hull-walk"])


@BOTH
def test_distribute_matches_exhaustive_search(small):
    rng = np.random.default_rng(11)
    for trial in range(30):
        k = 3
        curves = [MRC(np.arange(10, 110, 10), np.sort(rng.uniform(0, 1, 10))[::-1])
                  for _ in range(k)]
        a = rng.uniform(1e-6, 1e-5, k)
        b = rng.uniform(1e-5, 1e-3, k)
        budget = float(rng.integers(20, 250))
        pxs, pys = CurveBank(curves).padded(np.arange(k))
        lo, hi = np.zeros(k), np.full(k, 100.0)
        x = allocate.distribute(np.zeros(k, dtype=np.int64), np.array([budget]), lo, hi,
                                pxs, pys, a, b, small=small)
        assert x.sum() <= budget + 1e-6
        assert np.all(x >= lo - 1e-9) and np.all(x <= hi + 1e-9)
        got = sum(hull_value(c, a[i], b[i], x[i]) for i, c in enumerate(curves))
        # best allocation over the curves' own points, by brute force
        best = 0.0
        grid = [0] + list(range(10, 110, 10))
        for combo in itertools.product(grid, repeat=k):
            if sum(combo) <= budget:
                v = sum(1.0 / (a[i] + b[i] * curves[i].at(s)) for i, s in enumerate(combo))
                best = max(best, v)
        assert got >= best * (1 - 1e-9)
        # The real curves lie below their hulls only inside the one partial
        # segment the greedy ends on: the real value is short of the optimum
        # by at most one hull segment's gain.
        true = sum(1.0 / (a[i] + b[i] * c.at(x[i])) for i, c in enumerate(curves))
        seg = max(max_hull_step(c, a[i], b[i]) for i, c in enumerate(curves))
        assert true >= best - seg - 1e-9


@BOTH
def test_distribute_gives_memory_nobody_gains_from_by_headroom(small):
    flat = MRC([10, 20], [0.5, 0.5])          # no gain past 10 pages
    pxs, pys = CurveBank([flat, flat]).padded(np.arange(2))
    x = allocate.distribute(np.zeros(2, dtype=np.int64), np.array([100.0]),
                            np.zeros(2), np.array([30.0, 90.0]), pxs, pys,
                            np.full(2, 1e-6), np.full(2, 1e-4), small=small)
    assert x.sum() == pytest.approx(100.0)
    assert x[1] > x[0] and x[0] <= 30 and x[1] <= 90


def moved(new, cur):
    """Memory moved between tenants: what was raised, and what was lowered."""
    d = np.asarray(new) - np.asarray(cur)
    return d[d > 0].sum(), -d[d < 0].sum()


def test_step_limit_moves_at_most_the_step_and_raises_safety_first():
    mem = np.array([1000.0, 1000.0])
    node = np.array([0, 0, 0, 1, 1])
    cur = np.array([500.0, 300.0, 200.0, 500.0, 500.0])
    tgt = np.array([100.0, 500.0, 400.0, 502.0, 498.0])
    lb = np.array([0.0, 0.0, 250.0, 0.0, 0.0])
    ub = np.full(5, 1000.0)
    new = allocate.step_limit(node, mem, cur, tgt, lb, ub, 0.1, 0.005)
    # the safety raise of 50 happens, and uses the step first
    assert new[2] >= 250
    up, down = moved(new[:3], cur[:3])
    assert up <= 100 + 1e-9 and down <= 100 + 1e-9
    # the raise is paid for by the shrinking tenant before anyone grows
    assert new[0] < cur[0] and cur[1] <= new[1] < tgt[1]
    assert (new[1] - cur[1]) < (cur[0] - new[0]) - 50 + 1e-9
    assert new[:3].sum() <= 1000.0 + 1e-9
    # node 1's wanted changes are under the hysteresis (5 pages): no move
    assert new[3:].tolist() == [500.0, 500.0]


def test_step_limit_without_safety_raises_is_a_convex_step():
    mem = np.array([1000.0])
    node = np.zeros(3, dtype=np.int64)
    cur = np.array([400.0, 300.0, 300.0])
    tgt = np.array([100.0, 600.0, 300.0])
    new = allocate.step_limit(node, mem, cur, tgt, np.zeros(3), np.full(3, 1000.0), 0.2, 0.0)
    assert moved(new, cur) == pytest.approx((200.0, 200.0))
    np.testing.assert_allclose(new, cur + (tgt - cur) * 2 / 3)
    # a step large enough reaches the targets at once
    new = allocate.step_limit(node, mem, cur, tgt, np.zeros(3), np.full(3, 1000.0), 0.3, 0.0)
    np.testing.assert_allclose(new, tgt)


def greedy_on_hull_segments(c, a, b, lo, hi, budget):
    """Reference: literal greedy over the segments of each tenant's concave
    hull of (size, throughput) from its lower bound to its ceiling, one node.
    Returns each tenant's hull (to value the result) and the allocation."""
    hulls, segs = [], []
    for i in range(len(c)):
        xs, ys = _mono(c[i])

        def thr(x):
            return 1.0 / (a[i] + b[i] * np.interp(x, xs, ys))
        pts = [(lo[i], thr(lo[i]))] + [(x, thr(x)) for x in xs if lo[i] < x < hi[i]] + \
            [(hi[i], thr(hi[i]))]
        h = upper_hull(pts)
        hulls.append(h)
        for (x0, y0), (x1, y1) in zip(h, h[1:]):
            if x1 > x0:
                segs.append(((y1 - y0) / (x1 - x0), i, x1 - x0))
    x = list(lo)
    left = budget
    for slope, i, length in sorted(segs, key=lambda s: -s[0]):
        if slope <= 0 or left <= 0:
            break
        take = min(length, left)
        x[i] += take
        left -= take
    return hulls, np.array(x)


def on_hull(h, x):
    hx, hy = zip(*h)
    return float(np.interp(x, hx, hy))


@BOTH
def test_distribute_equals_greedy_over_hull_segments_per_node(small):
    rng = np.random.default_rng(21)
    k = 8
    curves = [MRC(np.arange(10, 210, 10), np.sort(rng.uniform(0, 1, 20))[::-1])
              for _ in range(k)]
    a = rng.uniform(1e-6, 1e-5, k)
    b = rng.uniform(1e-5, 1e-3, k)
    node = np.array([0, 0, 0, 1, 1, 1, 1, 2])
    lo = rng.uniform(0, 40, k)
    hi = lo + rng.uniform(60, 160, k)
    budget = np.array([150.0, 200.0, 500.0])     # node 2 has more than it can use
    pxs, pys = CurveBank(curves).padded(np.arange(k))
    x = allocate.distribute(node, budget, lo, hi, pxs, pys, a, b, small=small)
    for n in range(2):
        idx = np.flatnonzero(node == n)
        hulls, ref = greedy_on_hull_segments([curves[i] for i in idx], a[idx], b[idx],
                                             lo[idx], hi[idx], budget[n])
        got = sum(on_hull(h, x[i]) for h, i in zip(hulls, idx))
        want = sum(on_hull(h, r) for h, r in zip(hulls, ref))
        assert got == pytest.approx(want, rel=1e-9)
        assert (x[idx] - lo[idx]).sum() == pytest.approx(budget[n])
    # a node with spare memory: every tenant reaches its best, then the
    # rest is handed out up to the ceiling
    assert x[7] == pytest.approx(hi[7])


def test_the_two_greedy_implementations_agree_at_scale():
    rng = np.random.default_rng(8)
    k, nodes = 300, 30
    curves = []
    for _ in range(k):
        sizes = np.unique(rng.integers(1, 400, 40))
        curves.append(MRC(sizes, np.sort(rng.uniform(0, 1, len(sizes)))[::-1]))
    a = rng.uniform(1e-6, 1e-5, k)
    b = rng.uniform(1e-5, 1e-3, k)
    node = np.sort(rng.integers(0, nodes, k))
    lo = rng.uniform(0, 50, k)
    hi = lo + rng.uniform(50, 350, k)
    budget = rng.uniform(100, 1500, nodes)
    pxs, pys = CurveBank(curves).padded(np.arange(k))
    dual = allocate.distribute(node, budget, lo, hi, pxs, pys, a, b, small=0)
    walk = allocate.distribute(node, budget, lo, hi, pxs, pys, a, b, small=10**6)
    D, G = allocate._grid(pxs, pys, a, b, lo, hi)

    def value(x):          # each row's gain on its own hull, summed per node
        out = np.zeros(nodes)
        for i in range(k):
            h = upper_hull(sorted(zip(D[i].tolist(), G[i].tolist())))
            hx, hy = zip(*h)
            out[node[i]] += np.interp(x[i] - lo[i], hx, hy)
        return out
    np.testing.assert_allclose(value(dual), value(walk), rtol=1e-7)
    np.testing.assert_allclose(np.bincount(node, dual, nodes), np.bincount(node, walk, nodes))


def test_curve_bank_stretches_sampled_curves_by_their_size_error():
    from cachepilot.controller.engine.curves import MAX_STRETCH
    sizes = np.array([10, 1_000, 100_000])
    exact = MRC(sizes, [0.9, 0.5, 0.1], "lru", "exact", 1.0)
    sampled = MRC(sizes, [0.9, 0.5, 0.1], "lru", "shards", 0.01)
    bank = CurveBank([exact, sampled], sigmas=2.0)
    xs, _ = bank.padded(np.arange(2))
    assert list(xs[0, 1:]) == [10, 1_000, 100_000]          # exact: as it is
    err = np.sqrt(0.99 / (0.01 * sizes))
    assert xs[1, 1:] == pytest.approx(sizes * (1 + np.minimum(2 * err, MAX_STRETCH)))
    assert xs[1, 1] == pytest.approx(10 * (1 + MAX_STRETCH))  # capped
    # reading backwards agrees: the sampled curve needs more for the same miss ratio
    need = bank.size_for(np.array([0, 1]), np.array([0.1, 0.1]))
    assert need[1] == pytest.approx(100_000 * (1 + 2 * err[2]))
    assert need[0] == pytest.approx(100_000)
    assert list(CurveBank([sampled]).padded(np.arange(1))[0][0, 1:]) == [10, 1_000, 100_000]


def test_a_tenant_restored_again_keeps_its_row_of_observations():
    """A replica that takes back a node it served before restores its
    tenants over their old state: the same row, emptied, not a new one."""
    from cachepilot.controller.engine import saved
    from cachepilot.controller.engine.types import EngineState
    state = EngineState()
    rec = {"rounds": 3, "obs_m": [0.1, 0.2, 0.3], "obs_y": [1.0, 2.0, 3.0]}
    saved.restore(state, {"a": rec, "b": rec}, 3, window=8)
    rows, slot = state.obs.used, state.tenants["a"].slot
    for _ in range(5):
        saved.restore(state, {"a": {**rec, "obs_m": [0.5, 0.6], "obs_y": [5.0, 6.0]}}, 3, 8)
    assert state.obs.used == rows and state.tenants["a"].slot == slot
    a, b = saved.tenant_record(state, "a")["obs"], saved.tenant_record(state, "b")["obs"]
    assert a["m"][:a["count"]] == [0.5, 0.6]
    assert b["m"][:b["count"]] == [0.1, 0.2, 0.3]


def test_costs_are_kept_apart_and_older_records_give_back_what_they_held():
    """A report's costs (throughput, disk reads, CPU) are kept apart from
    its outcome, over more reports.  A record written when they rode in
    recent_obs's fifth and sixth fields gives them back as costs; one
    older still, four fields, has none."""
    from cachepilot.controller.engine import saved
    from cachepilot.controller.engine.types import COST_HISTORY, EngineState
    state = EngineState()
    oldest = {"rounds": 3, "recent_obs": [["lru", 4096.0, 0.5, 100.0]]}
    saved.restore(state, {"a": oldest}, 3, window=8)
    assert list(state.tenants["a"].recent_obs) == [("lru", 4096.0, 0.5, 100.0)]
    assert not state.tenants["a"].costs
    older = {"rounds": 3, "recent_obs": [["lru", 4096.0, 0.5, 100.0, 2e6, 0.25]]}
    saved.restore(state, {"b": older}, 3, window=8)
    assert list(state.tenants["b"].recent_obs) == [("lru", 4096.0, 0.5, 100.0)]
    assert list(state.tenants["b"].costs) == [("lru", 4096.0, 100.0, 2e6, 0.25)]
    rec = saved.tenant_record(state, "b")
    assert rec["costs"] == [["lru", 4096.0, 100.0, 2e6, 0.25]]
    rec["costs"] = [["lru", 4096.0, float(k), 1e6, 0.1] for k in range(COST_HISTORY + 5)]
    saved.restore(state, {"c": rec}, 3, window=8)
    got = state.tenants["c"].costs
    assert len(got) == COST_HISTORY and got[0][2] == 5.0


def _fill_round(curve, resident, new, fill_rate, interval_s=1.0, running=None,
                observed=None, current=None):
    """A one-row Round with what round._trajectory and round._anchored read:
    `curve` is the allocation's, `running` the running policy's (bank
    row 1; default: the same curve, row 0)."""
    from types import SimpleNamespace
    from cachepilot.controller.engine.round import Round
    R = Round(1)
    R.rows = [(0, None, SimpleNamespace(interval_s=interval_s, policy=curve.policy,
                                        limit_bytes=0, usage_file_bytes=resident * 4096))]
    R.bank = CurveBank([curve] + ([running] if running is not None else []))
    R.row_policy = [curve.policy] + ([running.policy] if running is not None else [])
    R.alloc_row = np.array([0])
    R.run_row = np.array([1 if running is not None else 0])
    R.new, R.resident = np.array([float(new)]), np.array([float(resident)])
    R.current = np.array([float(resident if current is None else current)])
    R.fill_rate = np.array([float(fill_rate)])
    R.interval_s = np.array([float(interval_s)])
    R.observed = {"miss_ratio": np.array([np.nan if observed is None else float(observed)])}
    R.filling = np.array([False])
    from cachepilot.controller.engine.types import TenantState
    R.tstates = [TenantState()]
    return R


def _filled(R, rows, intervals):
    """Where round._trajectory has each row's cache `intervals` after the round."""
    from cachepilot.controller.engine.round import _trajectory
    return _trajectory(R, rows, intervals)[2]


def test_a_raised_limit_is_predicted_where_its_misses_can_have_filled_it():
    loop = MRC(np.array([999, 1000, 4000]), np.array([1.0, 0.0, 0.0]), "lru")
    rows = np.array([0])
    # a loop of 1,000 pages held at 500, raised to 1,200: the misses of
    # half an interval bring in 100 pages, so the next interval still
    # misses every access (its steady state hits every one)
    R = _fill_round(loop, 500, 1200, fill_rate=200)
    x = _filled(R, rows, 0.5)
    assert x[0] == pytest.approx(600)
    assert R.bank.miss_at(np.array([0]), x)[0] == 1.0
    # fast enough, the cache reaches the new limit and the loop fits
    assert _filled(_fill_round(loop, 500, 1200, fill_rate=1e5), rows, 0.5)[0] == 1200
    # a cut takes hold at once, whatever the fill rate
    assert _filled(_fill_round(loop, 1000, 700, fill_rate=0), rows, 0.5)[0] == 700
    # a cache that hits everything it holds does not grow: its working set
    # fits (its curve is at its floor where it stands)
    flat = MRC(np.array([100, 4000]), np.array([0.0, 0.0]), "lru")
    assert _filled(_fill_round(flat, 300, 3000, fill_rate=1e6), rows, 0.5)[0] == 300


def test_a_filling_cache_grows_between_its_miss_ratios_at_either_end():
    # uniform over 4,000 pages: misses 1 - x / 4000.  Grown for t seconds
    # at `rate` pages per unit miss ratio, it gains at most what it would
    # at its starting miss ratio and at least what it would at its end's
    uni = MRC(np.array([0, 4000]), np.array([1.0, 0.0]), "lru")
    rows = np.array([0])
    for x0, new, rate, t in ((1000, 3000, 2000, 0.5), (500, 3900, 3000, 1.5),
                             (2000, 2500, 100, 0.5)):
        x = _filled(_fill_round(uni, x0, new, rate), rows, t)[0]
        hi = min(new, x0 + rate * t * (1 - x0 / 4000))
        assert x0 < x <= hi + 1e-9
        # the exact growth: dx/dt = rate (1 - x / 4000)
        exact = min(new, 4000 - (4000 - x0) * np.exp(-rate * t / 4000))
        assert x == pytest.approx(exact, rel=0.02)


def test_a_prediction_starts_from_what_the_tenant_misses_and_turns_over_to_its_curve():
    from cachepilot.controller.engine.round import _anchored
    rows, x = np.array([0]), np.array([1000.0])
    new = MRC(np.array([0, 4000]), np.array([0.2, 0.2]), "mru")      # reads 0.2
    old = MRC(np.array([0, 4000]), np.array([0.9, 0.9]), "lru")      # reads 0.9

    def at(rate, observed, running=old, t=0.5):
        R = _fill_round(new, 1000, 1000, rate, running=running, observed=observed)
        return _anchored(R, rows, x, R.bank.miss_at(np.array([0]), x), t)[0]
    # a switch whose cache does not turn over misses what it missed: the
    # new policy has evicted nothing yet
    assert at(0.0, 0.9) == pytest.approx(0.9)
    # ... and as much of the way as the cache turned over, counted in the
    # caches' worth mru was measured to need to settle: 200 pages a second
    # at 0.9 miss ratio, half a second, 90 pages of 1,000 x that many
    need = 1000 * policy_settling.turnovers("mru")
    assert need > 1000
    assert at(200.0, 0.9) == pytest.approx(0.9 + (0.2 - 0.9) * 90 / need)
    # a cache turned over whole (as many times as mru needs) is at the new curve
    assert at(1e6, 0.9) == pytest.approx(0.2)
    # it starts from what it misses, not from its running curve's level:
    # a switch undone because its curve read low (it misses 0.9 where its
    # curve reads 0.2) goes back from 0.9
    undo = _fill_round(old, 1000, 1000, 0.0, running=new, observed=0.9)
    assert _anchored(undo, rows, x, np.array([0.9]), 0.5)[0] == pytest.approx(0.9)
    # where the tenant misses what its curve says, it is its curve's reading
    assert at(200.0, 0.2, running=None) == pytest.approx(0.2)
    # an observation outside [0, 1] is no start: the curve's reading
    assert at(200.0, 1.7) == pytest.approx(0.2)


def test_a_switch_still_settling_is_predicted_on_what_it_has_left_to_insert():
    # mru switched to in an earlier round, on probation with some of the
    # pages it needs inserted: the cache comes to mru's curve over what it
    # still needs (at least the cache once over, as a cache under a
    # policy it has run long does); with no switch and nothing watched, a
    # cache's worth
    from cachepilot.controller.engine.round import _anchored
    from cachepilot.controller.engine import watchdog
    rows, x = np.array([0]), np.array([1000.0])
    mru = MRC(np.array([0, 4000]), np.array([0.2, 0.2]), "mru")
    need = 1000 * policy_settling.turnovers("mru")
    for inserted, left in ((0.0, need), (need - 1500, 1500), (need - 200, 1000),
                           (need + 50, 1000)):
        R = _fill_round(mru, 1000, 1000, 200.0, observed=0.9)
        watchdog.start(R.tstates[0], "mru", "lru")
        R.tstates[0].probation.inserted = inserted
        got = _anchored(R, rows, x, np.array([0.2]), 0.5)[0]
        assert got == pytest.approx(0.9 + (0.2 - 0.9) * 90 / left)
    R = _fill_round(mru, 1000, 1000, 200.0, observed=0.9)
    assert _anchored(R, rows, x, np.array([0.2]), 0.5)[0] == \
        pytest.approx(0.9 + (0.2 - 0.9) * 90 / 1000)


def test_a_raise_is_predicted_at_its_mean_over_the_interval_not_at_its_middle():
    # a loop of 1,000 pages held at 600 (missing every access), raised to
    # 1,000, misses 1,000 pages a second: it misses everything until the
    # 400 pages it lacks are in, 0.4 s, and nothing after (the model's
    # steps err by at most one step's reading)
    from cachepilot.controller.engine import round as rnd
    loop = MRC(np.array([999, 1000, 4000]), np.array([1.0, 0.0, 0.0]), "lru")
    R = _fill_round(loop, 600, 1000, 1000.0, observed=1.0, current=600)
    xs, ms, end = rnd._trajectory(R, np.array([0]), 1.0)
    assert end[0] == 1000
    assert abs(ms[:, 0].mean() - 0.4) <= 1.0 / rnd.FILL_STEPS
    # read at the interval's middle the cache was full: no misses at all
    assert R.bank.miss_at(np.array([0]), _filled(R, np.array([0]), 0.5))[0] == 0.0


def test_a_cut_is_predicted_from_what_the_tenant_misses_moved_by_its_curve():
    from cachepilot.controller.engine.round import _anchored
    uni = MRC(np.array([0, 4000]), np.array([1.0, 0.0]), "lru")
    # held at 3,000 pages (curve 0.25) it misses 0.35, what the curve reads
    # at 2,600: its sizes read as 13 % too large, so cut to 2,000 (curve
    # 0.5) it starts from the curve at 1,733 (0.567), and turns over
    # toward 0.5
    R = _fill_round(uni, 3000, 2000, 0.0, observed=0.35, current=3000)
    x = np.array([2000.0])
    assert _anchored(R, np.array([0]), x, np.array([0.5]), 0.5)[0] == \
        pytest.approx(1 - 2000 * 2600 / 3000 / 4000)
    R.fill_rate[:] = 1e6
    assert _anchored(R, np.array([0]), x, np.array([0.5]), 0.5)[0] == pytest.approx(0.5)


def test_a_curve_that_misplaces_a_cliff_is_read_with_its_sizes_moved():
    # a loop of 2,048 pages whose sampled curve puts its cliff at 2,100:
    # held at 2,048 it hits everything where the curve reads 1.  Cut to
    # 530 or 1,500 it misses everything: the curve read at sizes moved by
    # 2,100 / 2,048 (not moved down by 1, which reads every smaller size
    # as hitting everything); raised, it still hits
    from cachepilot.controller.engine.round import _anchored, _curve_shift
    loop = MRC(np.array([2099, 2100, 8000]), np.array([1.0, 0.0, 0.0]), "lru")
    rows = np.array([0])
    for x, want in ((530.0, 1.0), (1500.0, 1.0), (4000.0, 0.0)):
        R = _fill_round(loop, 2048, x, 0.0, observed=0.0, current=2048)
        assert _anchored(R, rows, np.array([x]), R.bank.miss_at(rows, np.array([x])),
                         0.5)[0] == pytest.approx(want, abs=0.01)
    bank = CurveBank([loop])
    # the cliff read late (it misses everything where the curve says it fits)
    scale, rest = _curve_shift(bank, rows, np.array([1.0]), np.array([2400.0]))
    assert scale[0] * 2400 == pytest.approx(2099, abs=0.01) and abs(rest[0]) < 1e-5
    # on the curve's floor, where it agrees, nothing moves
    scale, rest = _curve_shift(bank, rows, np.array([0.0]), np.array([5000.0]))
    assert scale[0] == 1.0 and rest[0] == 0.0
    # a miss ratio the curve reads at no size above 0 is added as it is
    flat = CurveBank([MRC(np.array([0, 4000]), np.array([0.2, 0.2]), "mru")])
    scale, rest = _curve_shift(flat, rows, np.array([0.9]), np.array([1000.0]))
    assert scale[0] == 1.0 and rest[0] == pytest.approx(0.7)


def test_a_filling_cache_is_anchored_where_it_stood_not_at_its_limit():
    # uniform over 4,000 pages, limit 3,000, the cache still at 2,000 and
    # missing 0.5 there: grown to 2,500 it misses 0.375, whatever its
    # curve reads at the limit it has not reached
    from cachepilot.controller.engine.round import _anchored
    uni = MRC(np.array([0, 4000]), np.array([1.0, 0.0]), "lru")
    R = _fill_round(uni, 2000, 3000, 0.0, observed=0.5, current=3000)
    x = np.array([2500.0])
    assert _anchored(R, np.array([0]), x, np.array([0.375]), 0.5)[0] == pytest.approx(0.375)


def test_what_a_tenant_misses_now_is_the_mean_of_its_reports_at_what_it_holds():
    from cachepilot.controller.engine.round import _missing_now
    uni = MRC(np.array([0, 4000]), np.array([1.0, 0.0]), "lru")
    R = _fill_round(uni, 2000, 2000, 0.0, observed=0.5)
    rows = np.array([0])
    report = R.rows[0][2]
    report.policy, report.limit_bytes = "lru", 8.0
    obs = R.tstates[0].recent_obs
    for rec in (("lru", 9.0, 0.9, 1.0), ("lru", 8.0, 0.3, 1.0), ("lru", 8.0, 0.5, 1.0)):
        obs.append(rec)
    # the last two held what it holds now; the one before held more
    assert _missing_now(R, rows)[0] == pytest.approx(0.4)
    # another policy now: only its own report
    obs.append(("s3fifo", 8.0, 0.2, 1.0))
    report.policy = "s3fifo"
    R.observed["miss_ratio"][:] = 0.2
    assert _missing_now(R, rows)[0] == pytest.approx(0.2)
    # a cache still filling misses less each report: its last one
    obs.append(("s3fifo", 8.0, 0.1, 1.0))
    R.observed["miss_ratio"][:] = 0.1
    assert _missing_now(R, rows)[0] == pytest.approx(0.15)
    R.filling[:] = True
    assert _missing_now(R, rows)[0] == pytest.approx(0.1)


def test_switching_trials_off_leaves_what_a_tenant_misses_now_alone(monkeypatch):
    # the trials ablation patches watchdog.trial_reference; predictions
    # read watchdog.recent_mean, so the ablation measures trials alone
    from cachepilot.controller.engine import watchdog
    from cachepilot.controller.engine.round import _missing_now
    uni = MRC(np.array([0, 4000]), np.array([1.0, 0.0]), "lru")
    R = _fill_round(uni, 2000, 2000, 0.0, observed=0.5)
    R.rows[0][2].policy, R.rows[0][2].limit_bytes = "lru", 8.0
    R.tstates[0].recent_obs.extend([("lru", 8.0, 0.3, 1.0), ("lru", 8.0, 0.5, 1.0)])
    monkeypatch.setattr(watchdog, "trial_reference", lambda *a, **k: None)
    assert _missing_now(R, np.array([0]))[0] == pytest.approx(0.4)


def test_a_trials_window_shows_the_share_of_its_lead_the_policy_settles_in_time():
    from types import SimpleNamespace
    from cachepilot.controller.engine import round as rnd, watchdog
    from cachepilot.models import policy_settling

    def rep(rate, seconds, pages=1000):
        return SimpleNamespace(inserts_per_s=rate, interval_s=seconds,
                               usage_file_bytes=pages * 4096)
    last = 1 + watchdog.TRIAL_SLACK + rnd.WATCHDOG_INTERVALS
    need = policy_settling.turnovers("mru") * 1000             # pages to settle
    # settles half-way through the judged reports: half the lead shows
    half = need / (last - rnd.WATCHDOG_INTERVALS / 2)
    assert rnd._showable(rep(half, 1.0), "mru") == pytest.approx(0.5)
    assert rnd._showable(rep(need, 1.0), "mru") == 1.0       # settled in one: the whole lead
    assert rnd._showable(rep(need / (last + 1), 1.0), "mru") == 0.0  # settles too late
    assert rnd._showable(rep(0.0, 1.0), "mru") == 0.0        # a cache that never turns over
    # the same tenant, a policy measured to settle slower shows less
    table = policy_settling.load()
    fast, slow = min(table, key=table.get), max(table, key=table.get)
    assert policy_settling.turnovers(slow) > policy_settling.turnovers(fast)
    r = rep(policy_settling.turnovers(slow) * 1000 / (last - 1), 1.0)
    assert rnd._showable(r, slow) < rnd._showable(r, fast) == 1.0
    for junk in (rep(float("nan"), 1.0), rep(5.0, float("inf")), rep(-1.0, 1.0),
                 rep(5.0, 0.0), rep(5.0, 1.0, pages=0)):
        assert rnd._showable(junk, "mru") == 1.0             # cannot tell: no discount
    scores = {"linux": 100.0, "s3fifo": 120.0, "lfu": 90.0}
    cut = rnd._within_window(scores, "linux", {"linux": 1.0, "s3fifo": 0.25, "lfu": 0.25})
    assert cut == {"linux": 100.0, "s3fifo": 105.0, "lfu": 97.5}
    assert rnd._within_window(scores, "linux", dict.fromkeys(scores, 1.0)) == scores


def test_an_slo_is_seen_served_only_where_every_latest_report_at_its_limit_served_it():
    # round._seen_meeting: the limit the tenant holds, when every one of
    # its latest reports there (two at least, under the policy the
    # allocation reads) served the SLO with its headroom; not while the
    # SLO feedback still holds an extra from misses
    from collections import deque
    from types import SimpleNamespace
    from cachepilot.controller.engine.round import Round, _seen_meeting
    from cachepilot.controller.engine.types import OBS_HISTORY, TenantState
    lim = 64 << 20

    def seen(obs, extra=0.0, policy="linux", alloc="linux"):
        R = Round(1)
        R.rows = [(0, None, SimpleNamespace(policy=policy, limit_bytes=lim))]
        R.row_policy, R.alloc_row = [alloc], np.array([0])
        st = TenantState()
        st.recent_obs = deque(obs, maxlen=OBS_HISTORY)
        st.slo_extra_pages = extra
        R.tstates = [st]
        return _seen_meeting(R, np.array([0]), np.array([1050.0]))[0]
    at = lambda thr, limit=lim, p="linux": (p, float(limit), 0.1, float(thr))  # noqa: E731
    assert seen([at(1100), at(1060)]) == lim / 4096
    # an older report at another limit does not count, nor break the run
    assert seen([at(900, 32 << 20), at(1100), at(1060)]) == lim / 4096
    # one report short of the headroom, or only one report, or another
    # policy running, or an extra from misses: no cap
    assert seen([at(1100), at(1040)]) == np.inf
    assert seen([at(1100)]) == np.inf
    assert seen([at(1100, p="mru"), at(1060)]) == np.inf
    assert seen([at(1100), at(1060)], policy="mru", alloc="linux") == np.inf
    assert seen([at(1100), at(1060)], extra=10.0) == np.inf
    assert seen([at(1100), at(float("nan"))]) == np.inf
