"""Issue 15, item 7: SLOs that hold on workloads the controller was not
shaped on.  decide() in closed loop (tests/test_engine_decide.py's Loop)
over synthetic tenants whose reports are noisy the way real ones are:

- an SLO's feasibility, judged each round on a sampled curve, does not
  flip the tenant's memory back and forth (a real run went 179 -> 97 ->
  177 MiB in consecutive rounds);
- an SLO that truly cannot be held is reported as such, with the share
  of rounds in which no memory met it;
- the headroom comes from the tenant's observed spread: a tenant whose
  demand varies by +-15 % per interval still meets its SLO in >= 95 % of
  intervals, where the fixed 5 % headroom does not.
"""
import dataclasses
import sys
from pathlib import Path

import numpy as np

from cachepilot.controller.engine.synthetic import power_curve

sys.path.insert(0, str(Path(__file__).parent))
from test_engine_decide import PAGES, GiB, Loop, make, tenant  # noqa: E402


class Alternating:
    """A tenant whose reported curve alternates between two shapes, one
    round each (a sampled curve's noise around an SLO's edge)."""

    def __init__(self, a, b, pattern):
        self.a, self.b, self.pattern, self.calls = a, b, pattern, 0
        self.curves = a.curves

    def throughput(self, m):
        return self.a.throughput(m)

    def report(self, limit, policy):
        src = self.a if self.pattern(self.calls) else self.b
        self.calls += 1
        return src.report(limit, policy)


def _flipping_loop(feasibility_rounds, pattern, shrink_after=1):
    # x's SLO is met at 40 % of the node on its real curve; every other
    # round its sampled curve floors above the miss ratio the SLO needs
    # (infeasible).  z, steep and without an SLO, takes whatever x is not
    # given, so x's memory is what its SLO buys.
    good = tenant("x", 0.8, 0.9)
    slo = good.throughput(float(good.curves["linux"].at(0.4 * PAGES)))
    bad = dataclasses.replace(good, curves={"linux": power_curve(
        "linux", 0.8 * PAGES, 0.9, 0.5, PAGES)})
    synth = {"x": Alternating(good, bad, pattern),
             "z": tenant("z", 0.9, 1.6, t_hit=1e-6, t_miss=4e-4)}
    cfg = make([{"name": "x", "node": "n1", "slo": {"min_throughput": slo}},
                {"name": "z", "node": "n1"}], max_step_fraction=1.0,
               slo_feasibility_rounds=feasibility_rounds, shrink_after_rounds=shrink_after)
    return Loop(cfg, synth), slo


def test_feasibility_flipping_every_round_does_not_move_the_memory():
    # x's SLO needs ~0.4 of the node (its real curve); its allocation may
    # vary with what each round's curve says it gains beyond that, but it
    # never drops below the need because one round judged the SLO
    # infeasible
    loop, _ = _flipping_loop(3, lambda k: k % 2 == 0)
    limits = []
    for _ in range(14):
        loop.step()
        limits.append(loop.limit["x"])
    assert min(limits[4:]) >= 0.38 * GiB, [v >> 20 for v in limits]
    # the same reports taken at face value (a verdict in force after one
    # round) drop the tenant to its curve's best every other round: what
    # the debounce is for (179 -> 97 -> 177 MiB in a real run)
    loop1, _ = _flipping_loop(1, lambda k: k % 2 == 0)
    raw = []
    for _ in range(14):
        loop1.step()
        raw.append(loop1.limit["x"])
    assert min(raw[4:]) < 0.2 * GiB, [v >> 20 for v in raw]


def test_an_slo_that_stays_infeasible_is_served_as_such_and_reported():
    # feasible for 6 rounds, then infeasible for good
    loop, slo = _flipping_loop(3, lambda k: k < 6)
    for _ in range(6):
        loop.step()
    seen = []
    for _ in range(8):
        d = loop.step()
        seen.append((loop.limit["x"], [v for v in d.violations if v.tenant == "x"]))
    # two rounds in a row judged infeasible: still served at its need, and
    # the violation says the verdict is not in force yet
    for lim, vs in seen[:2]:
        assert lim >= 0.38 * GiB
        assert vs and "no memory meets it this round" in vs[0].reason
    # from the third, served as infeasible (where its curve flattens) and said so
    lim, vs = seen[-1]
    assert lim < 0.2 * GiB
    assert vs and vs[0].reason.startswith("infeasible")
    assert "no memory meets it in 57% of the last 14 rounds" in vs[0].reason


class Noisy:
    """A tenant whose demand varies interval to interval: its throughput
    is the model's times a factor drawn in [1 - w, 1 + w]."""

    def __init__(self, inner, width, seed):
        self.inner, self.width = inner, width
        self.rng = np.random.default_rng(seed)
        self.curves = inner.curves
        self.last = 1.0

    def throughput(self, m):
        return self.inner.throughput(m)

    def report(self, limit, policy):
        r = self.inner.report(limit, policy)
        self.last = float(self.rng.uniform(1 - self.width, 1 + self.width))
        r.throughput *= self.last
        r.accesses_per_s *= self.last
        return r

    def met(self, limit, slo):
        """One more interval at `limit`: is the SLO met?"""
        m = float(self.inner.curves["linux"].at(limit / 4096))
        return self.inner.throughput(m) * self.rng.uniform(1 - self.width, 1 + self.width) >= slo


def _attainment(noisy, sigmas, feedback=0.0):
    """Share of intervals after warm-up x meets its SLO when its reports
    are made `noisy` (a wrapper of the true tenant); and x's state."""
    # x is slow (its pages are worth little throughput), z fast: beyond
    # its SLO x gets no memory for throughput, only its headroom
    x = tenant("x", 0.8, 0.9, t_hit=3e-5, t_miss=2e-3)
    slo = x.throughput(float(x.curves["linux"].at(0.3 * PAGES)))
    synth = {"x": noisy(x), "z": tenant("z", 0.9, 1.6, t_hit=1e-6, t_miss=4e-4)}
    cfg = make([{"name": "x", "node": "n1", "slo": {"min_throughput": slo}},
                {"name": "z", "node": "n1"}], slo_headroom=0.05,
               slo_headroom_sigmas=sigmas, max_step_fraction=0.2,
               slo_feedback_step=feedback)
    loop = Loop(cfg, synth)
    met = []
    for k in range(60):
        loop.step()
        # the interval after the directive: the tenant varies again
        if k >= 15:
            met.append(synth["x"].met(loop.limit["x"], slo))
    return float(np.mean(met)), loop.state.tenants["x"]


def test_headroom_follows_the_observed_spread():
    def noisy(x):
        return Noisy(x, 0.15, seed=7)
    share, st = _attainment(noisy, sigmas=2.0)
    # a uniform +-15 % factor has a relative spread of 0.15 / sqrt(3)
    assert 0.06 < st.spread < 0.12
    assert share >= 0.95
    fixed, _ = _attainment(noisy, sigmas=0.0)
    assert fixed < 0.9, fixed


def test_misses_raise_the_safe_size_until_the_slo_holds():
    """With no headroom from the spread at all, the SLO's misses alone
    (slo_feedback_step) raise its safe size toward where it is missed in
    1 - slo_target_share of the intervals."""
    def noisy(x):
        return Noisy(x, 0.15, seed=7)
    off, _ = _attainment(noisy, sigmas=0.0)
    on, st = _attainment(noisy, sigmas=0.0, feedback=0.05)
    assert off < 0.8 and on >= 0.9, (off, on)
    assert st.slo_extra_pages > 0


class CurveNoise:
    """A tenant whose miss ratio at a given size varies interval to
    interval (demand that changes over time, as a trace replay's does):
    observed miss ratio = the curve's times a factor in [1 - w, 1 + w],
    throughput as the service model gives at it.  Its reported curve is
    the average one, so the model fits it perfectly and only the curve's
    predictions come out wrong."""

    def __init__(self, inner, width, seed):
        self.inner, self.width = inner, width
        self.rng = np.random.default_rng(seed)
        self.curves = inner.curves

    def throughput(self, m):
        return self.inner.throughput(m)

    def draw(self, m):
        return float(min(1.0, m * self.rng.uniform(1 - self.width, 1 + self.width)))

    def met(self, limit, slo):
        """One more interval at `limit`: is the SLO met?"""
        m = self.draw(float(self.inner.curves["linux"].at(limit / 4096)))
        return self.inner.throughput(m) >= slo

    def report(self, limit, policy):
        r = self.inner.report(limit, policy)
        m = self.draw(r.miss_ratio)
        thr = self.inner.throughput(m)
        r.miss_ratio, r.throughput, r.accesses_per_s = m, thr, thr
        r.inserts_per_s = r.removals_per_s = thr * m
        return r


def test_headroom_follows_the_curves_observed_error():
    # the throughput model fits exactly (its spread is ~0): what varies is
    # the miss ratio at a size, and the headroom has to come from that
    def noisy(x):
        return CurveNoise(x, 0.3, seed=11)
    share, st = _attainment(noisy, sigmas=2.0)
    assert st.spread < 0.01 and len(st.m_errors) >= 10
    assert share >= 0.95, share
    fixed, _ = _attainment(noisy, sigmas=0.0)
    assert fixed < 0.9, fixed


def _marginal_loop(shrink_after, pattern):
    # x's SLO is easy: its memory beyond is what its curve says it gains;
    # every other round its curve looks flat (a phase's first window)
    good = tenant("x", 0.5, 1.2)
    flat = dataclasses.replace(good, curves={"linux": power_curve(
        "linux", 0.5 * PAGES, 1.2, 0.6, PAGES)})
    synth = {"x": Alternating(good, flat, pattern), "z": tenant("z", 0.9, 0.7)}
    easy = good.throughput(float(good.curves["linux"].at(0.02 * PAGES)))
    cfg = make([{"name": "x", "node": "n1", "slo": {"min_throughput": easy}},
                {"name": "z", "node": "n1"}],
               max_step_fraction=1.0, shrink_after_rounds=shrink_after)
    return Loop(cfg, synth)


def test_a_one_round_dip_in_a_curve_does_not_shrink_the_tenant():
    limits = {}
    for k in (1, 2):
        loop = _marginal_loop(k, lambda c: c % 2 == 0)
        limits[k] = []
        for _ in range(12):
            loop.step()
            limits[k].append(loop.limit["x"])
    swing = {k: max(v[3:]) / min(v[3:]) for k, v in limits.items()}
    assert swing[1] > 1.5, [v >> 20 for v in limits[1]]     # at once: it swings
    assert swing[2] < 1.05, [v >> 20 for v in limits[2]]    # confirmed: it holds
    # a curve that stays flat is believed from the second round
    loop = _marginal_loop(2, lambda c: c < 4)
    seq = []
    for _ in range(8):
        loop.step()
        seq.append(loop.limit["x"])
    assert seq[4] == seq[3] and seq[5] < 0.8 * seq[3], [v >> 20 for v in seq]


class Jittered(CurveNoise):
    """A tenant whose reported curve is its true curve with the size axis
    stretched by a random factor each round (a sampled curve's noise);
    what it serves follows the true curve."""

    def report(self, limit, policy):
        r = self.inner.report(limit, policy)
        k = float(self.rng.uniform(1 - self.width, 1 + self.width))
        r.curves = [dataclasses.replace(c, sizes=np.maximum(c.sizes * k, 1).astype(np.int64))
                    for c in r.curves]
        return r


def _limits_under_jitter(monkeypatch, history):
    from cachepilot.controller.engine import round as rnd
    monkeypatch.setattr(rnd, "SAFE_HISTORY", history)
    x = tenant("x", 0.8, 0.9, t_hit=3e-5, t_miss=2e-3)
    slo = x.throughput(float(x.curves["linux"].at(0.3 * PAGES)))
    synth = {"x": Jittered(x, 0.25, seed=3),
             "z": tenant("z", 0.9, 1.6, t_hit=1e-6, t_miss=4e-4)}
    cfg = make([{"name": "x", "node": "n1", "slo": {"min_throughput": slo}},
                {"name": "z", "node": "n1"}], slo_headroom=0.05, max_step_fraction=0.5,
               slo_feedback_step=0.0, warmup_intervals=3)
    loop = Loop(cfg, synth)
    out = []
    for k in range(50):
        loop.step()
        if k >= 15:
            out.append(loop.limit["x"])
    return np.asarray(out, dtype=np.float64)


def test_an_slos_safe_size_is_read_off_its_recent_curves_not_the_last_alone(monkeypatch):
    """The safe size is averaged over the tenant's recent curves: under a
    sampled curve's noise its limit moves far less than when it is read
    off each round's curve alone."""
    one = _limits_under_jitter(monkeypatch, 1)
    six = _limits_under_jitter(monkeypatch, 6)
    assert six.std() < 0.6 * one.std(), (six.std() / PAGES, one.std() / PAGES)
