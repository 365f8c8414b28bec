"""The model watchdog (controller/engine/watchdog.py): on its own, with
reports whose curves and observed miss ratios are set by hand, and inside
decide() in closed loop with a tenant whose curve for one policy lies."""
import numpy as np
import pytest

from cachepilot.protocol.types import TenantReport
from cachepilot.controller import engine
from cachepilot.controller.config import config_from_dict
from cachepilot.controller.engine import round as round_mod, watchdog
from cachepilot.controller.engine.synthetic import SynthTenant, power_curve
from cachepilot.controller.engine.types import TenantState
from cachepilot.models import policy_settling
from cachepilot.models.mrc import MRC

K, MARGIN, COOLDOWN = 3, 0.05, 5
LIMIT = 1000                       # pages


def flat(policy, miss):
    return MRC(np.array([10, 100_000]), np.array([miss, miss]), policy, "synthetic")


def report(policy, observed, predicted):
    """A report of `policy` running and missing `observed`, whose curves
    predict predicted[p] for every policy p at any size."""
    return TenantReport(tenant="t", cgroup="t", interval_s=1.0, accesses_per_s=1e4,
                        inserts_per_s=1e4 * observed, removals_per_s=0.0, refaults_per_s=0.0,
                        limit_bytes=LIMIT * 4096, usage_file_bytes=0, usage_anon_bytes=0,
                        policy=policy, throughput=1e4, miss_ratio=observed,
                        curves=[flat(p, m) for p, m in predicted.items()])


def on_probation():
    """A tenant switched from lru to fifo, whose first report of fifo
    running (the switch's own interval) has come, not counted, and
    turned its cache over."""
    st = TenantState()
    st.rounds = 10
    watchdog.start(st, "fifo", "lru")
    st.probation.running_reports, st.probation.inserted = 1, 1e12
    return st


def feed(st, reports):
    """Run check() over reports, one tenant round each; the verdicts."""
    out = []
    for r in reports:
        st.rounds += 1
        out.append(watchdog.check(st, r, LIMIT, K, MARGIN, COOLDOWN))
    return out


def test_switches_back_when_worse_than_the_old_prediction_by_more_than_the_margin():
    st = on_probation()
    pred = {"fifo": 0.05, "lru": 0.30}
    got = feed(st, [report("fifo", m, pred) for m in (0.40, 0.36, 0.38)])
    assert got[:2] == [None, None]
    v = got[2]
    assert (v.new, v.old, v.intervals) == ("fifo", "lru", 3)
    assert v.observed == pytest.approx(0.38)
    assert v.predicted_new == pytest.approx(0.05) and v.predicted_old == pytest.approx(0.30)
    # the reason carries the three numbers
    for text in ("0.380", "0.050", "0.300", "fifo", "lru"):
        assert text in v.reason
    assert st.probation is None
    assert watchdog.held_off(st) == {"fifo"}


def test_the_first_interval_of_the_new_policy_running_is_not_counted():
    # the interval the switch came in: a cache the old policy filled,
    # reshaping; judged on the K after it, as a trial is
    st = TenantState()
    st.rounds = 10
    watchdog.start(st, "fifo", "lru")
    pred = {"fifo": 0.05, "lru": 0.30}
    got = feed(st, [report("fifo", 0.9, pred)] + [report("fifo", 0.31, pred)] * K)
    assert got == [None] * (K + 1)
    assert st.probation is None and watchdog.held_off(st) == set()
    # counted, that first interval would have undone it
    st = on_probation()
    assert feed(st, [report("fifo", 0.9, pred)] + [report("fifo", 0.31, pred)] * (K - 1)
                )[-1] is not None


def test_a_switch_is_judged_once_its_policy_has_settled():
    # 1,000 pages cached, and fifo measured to settle in T caches' worth
    # of inserts (models/policy_settling.json), inserted over 3.5
    # intervals: the reports after the first count once 1000 T pages have
    # come in since the switch (the fifth), here 0.9 while the cache
    # reshapes, then 0.31
    need = policy_settling.turnovers("fifo") * 1000

    def slow(observed):
        r = report("fifo", observed, {"fifo": 0.05, "lru": 0.30})
        r.usage_file_bytes, r.inserts_per_s = 1000 * 4096, need / 3.5
        return r

    st = TenantState()
    st.rounds = 10
    watchdog.start(st, "fifo", "lru")
    got = feed(st, [slow(0.9)] * 4 + [slow(0.31)] * K)
    assert got == [None] * (4 + K)
    assert st.probation is None and watchdog.held_off(st) == set()
    # a cache that never turns over is judged anyway, past TRIAL_SLACK
    st = TenantState()
    st.rounds = 10
    watchdog.start(st, "fifo", "lru")
    r = slow(0.9)
    r.inserts_per_s = 0.0
    got = feed(st, [r] * (1 + watchdog.TRIAL_SLACK + K))
    assert got[:-1] == [None] * (watchdog.TRIAL_SLACK + K) and got[-1] is not None


def test_no_switch_back_within_the_margin():
    # worse than its own curve promised, and a little worse than the old
    # policy's prediction -- but within the margin: kept
    st = on_probation()
    pred = {"fifo": 0.05, "lru": 0.30}
    got = feed(st, [report("fifo", m, pred) for m in (0.34, 0.35, 0.345)])
    assert got == [None, None, None]
    assert st.probation is None            # the probation is over
    assert watchdog.held_off(st) == set()
    # ... and just over the margin is a switch back
    st = on_probation()
    assert feed(st, [report("fifo", 0.36, pred)] * K)[-1] is not None


def test_a_switch_that_costs_a_met_slo_goes_back_whatever_the_margin():
    # a tenant at a low miss ratio: fifo misses 0.075 where lru's curve
    # says 0.05 -- within the 0.05 margin, yet a third less throughput.
    # Model: 1 us a hit, 100 us more a miss: lru at 0.05 gives 166,667/s,
    # fifo's 0.075 gives 117,647/s, and the SLO is 150,000/s.
    a, b, slo = 1e-6, 1e-4, 150_000.0
    pred = {"fifo": 0.04, "lru": 0.05}

    def run(slo_or_none):
        st = on_probation()
        out = []
        for m in (0.07, 0.08, 0.075):
            r = report("fifo", m, pred)
            r.throughput = 1.0 / (a + b * m)
            st.rounds += 1
            out.append(watchdog.check(st, r, LIMIT, K, MARGIN, COOLDOWN,
                                      slo=slo_or_none, model=(a, b)))
        return st, out

    st, got = run(slo)
    v = got[-1]
    assert got[:2] == [None, None] and v is not None
    assert v.slo == slo and v.throughput == pytest.approx(117_900, rel=0.01)
    assert v.throughput_old == pytest.approx(166_667, rel=0.001)
    assert "SLO" in v.reason and watchdog.held_off(st) == {"fifo"}
    # the same switch for a tenant without an SLO, or one the old policy
    # would not have met either, stands (within the margin)
    assert run(None)[1] == [None, None, None]
    assert run(200_000.0)[1] == [None, None, None]


def test_only_intervals_with_the_new_policy_reported_running_count():
    st = on_probation()
    pred = {"fifo": 0.05, "lru": 0.30}
    # the directive is not applied yet, then refused, then runs
    reports = [report("lru", 0.9, pred), report("lru", 0.9, pred),
               report("fifo", 0.5, pred), report("lru", 0.9, pred),
               report("fifo", 0.5, pred)]
    assert feed(st, reports) == [None] * 5
    assert len(st.probation.observed) == 2
    # an interval without the old policy's curve is not evidence either
    assert feed(st, [report("fifo", 0.5, {"fifo": 0.05})]) == [None]
    assert len(st.probation.observed) == 2
    v = feed(st, [report("fifo", 0.5, pred)])[0]
    assert v is not None and v.intervals == K and v.observed == pytest.approx(0.5)


def test_cooldown_holds_the_policy_off_for_exactly_its_rounds():
    st = on_probation()
    pred = {"fifo": 0.05, "lru": 0.30}
    v = feed(st, [report("fifo", 0.6, pred)] * K)[-1]
    assert v is not None
    switched_back = st.rounds
    held = []
    for _ in range(COOLDOWN + 2):
        st.rounds += 1
        held.append("fifo" in watchdog.held_off(st))
    assert held == [True] * COOLDOWN + [False, False]
    assert st.rounds == switched_back + COOLDOWN + 2
    assert st.held_until == {}


def test_a_later_switch_replaces_the_probation():
    # fifo was heading for a switch back, but the autopilot moved on to
    # s3fifo first: s3fifo is judged against fifo, and fifo is not held off
    st = on_probation()
    pred = {"fifo": 0.30, "lru": 0.10, "s3fifo": 0.20}
    feed(st, [report("fifo", 0.9, pred)] * (K - 1))
    watchdog.start(st, "s3fifo", "fifo")
    assert (st.probation.new, st.probation.old, st.probation.observed) == \
        ("s3fifo", "fifo", [])
    assert feed(st, [report("s3fifo", 0.2, pred)] * K) == [None] * K
    assert watchdog.held_off(st) == set()


# -- inside decide() ---------------------------------------------------------------

GiB = 1 << 30
PAGES = GiB // 4096


class LyingTenant(SynthTenant):
    """Reports `liar`'s curve as a near-zero miss ratio; observes the truth."""

    def report(self, limit_bytes, policy, interval_s=None):
        r = super().report(limit_bytes, policy, interval_s)
        r.curves = [flat(c.policy, 0.01) if c.policy == self.extra.get("liar") else c
                    for c in r.curves]
        return r


def closed_loop(liar_factor, rounds, **control):
    """One tenant, allowed lru and s3fifo, starting on lru, held below its
    footprint by a ceiling; s3fifo's curve says it barely misses; its true
    curve is lru's times liar_factor."""
    lru = power_curve("lru", 0.8 * PAGES, 0.8, 0.01, PAGES)
    s3 = MRC(lru.sizes, np.minimum(lru.miss_ratio * liar_factor, 1.0), "s3fifo", "synthetic")
    t = LyingTenant("a", {"lru": lru, "s3fifo": s3}, extra={"liar": "s3fifo"})
    return run_one(t, "lru", "s3fifo", rounds, control)


def run_one(t, first, other, rounds, control):
    """decide() in closed loop with one synthetic tenant `t`, allowed
    `first` (which it starts on) and `other`, held below its footprint by
    a ceiling of a quarter of its 1 GiB node: (the policy directed each
    round, the policy and watchdog log entries, the engine's state)."""
    cfg = config_from_dict({"control": {"autopilot_k": 2, **control},
                            "nodes": [{"name": "n1", "memory_bytes": GiB}],
                            "tenants": [{"name": t.name, "node": "n1",
                                         "ceiling_bytes": GiB // 4,
                                         "policies": [first, other],
                                         "initial_policy": first}]})
    state, limit, policy = engine.EngineState(), GiB // 4, first
    running, log = [], []
    # the round's watchdog figures as this file's (a shorter cooldown)
    with pytest.MonkeyPatch.context() as mp:
        for name, v in (("WATCHDOG_INTERVALS", K), ("WATCHDOG_MARGIN", MARGIN),
                        ("WATCHDOG_COOLDOWN", COOLDOWN)):
            mp.setattr(round_mod, name, v)
        for _ in range(rounds):
            d, state = engine.decide(state, {"n1": [t.report(limit, policy)]}, cfg)
            x = d.directives["n1"][0]
            limit, policy = x.limit_bytes, x.policy
            running.append(policy)             # what runs in the next interval
            log += [e for e in d.log if e.kind in ("policy", "watchdog")]
    return running, log, state


def test_decide_switches_back_from_a_lying_curve_and_keeps_off_it():
    running, log, state = closed_loop(1.6, 30)
    kinds = [(e.round, e.kind, e.before, e.after) for e in log]
    first, back = kinds[0], kinds[1]
    assert first[1:] == ("policy", "lru", "s3fifo")
    assert back[1:] == ("watchdog", "s3fifo", "lru")
    assert back[0] == first[0] + K + 1       # s3fifo's first interval, then K judged
    e = log[1]
    assert set(e.predicted_miss) == {"s3fifo", "lru"}
    assert e.predicted_miss["s3fifo"] == pytest.approx(0.01)
    assert e.observed_miss > e.predicted_miss["lru"] + MARGIN
    assert f"{e.observed_miss:.3f}" in e.reason
    # not picked again during the cooldown, nor after it: its curve tells
    # the same lie, and what it overpromised by is read into it now
    assert running[back[0]:] == ["lru"] * (len(running) - back[0])
    assert len(running) > back[0] + 2 * COOLDOWN
    assert [k for k in kinds[2:] if k[1] == "policy"] == []
    assert state.tenants["a"].overpromise == pytest.approx(
        e.observed_miss - e.predicted_miss["s3fifo"])


def test_decide_keeps_a_switch_that_is_worse_than_promised_but_within_the_margin():
    running, log, state = closed_loop(1.05, 20)
    assert [(e.kind, e.after) for e in log] == [("policy", "s3fifo")]
    assert running[-1] == "s3fifo"
    assert state.tenants["a"].probation is None      # judged, and kept


def test_a_cache_still_filling_is_judged_at_what_it_holds_not_at_its_limit():
    # make e2e: kv switched to get_scan as its limit rose 118 -> 156 MiB;
    # its cache was still filling, it missed 0.45 where the curves said
    # 0.20 at the limit, and the watchdog sent it back.  Read at the 60 %
    # of the limit it held, the curves say what it observed
    def curve(p, scale):
        sizes = np.array([100, 300, 600, 1000])
        return MRC(sizes, np.array([0.9, 0.6, 0.45, 0.2]) * scale, p, "synthetic",
                   meta={"anon_offset_pages": 50})

    def filling(observed):
        r = report("fifo", observed, {})
        r.curves = [curve("fifo", 1.0), curve("lru", 1.05)]
        r.usage_file_bytes = 550 * 4096         # + 50 offset: 600 of 1000 pages
        return r

    st = on_probation()
    assert feed(st, [filling(0.46)] * 3) == [None] * 3
    assert st.held_until == {}
    # the same intervals with the cache full at the limit: worse than lru
    # would have done, and sent back
    st = on_probation()
    full = [filling(0.46) for _ in range(3)]
    for r in full:
        r.usage_file_bytes = 950 * 4096
    assert feed(st, full)[2] is not None
    # a report without the cache it holds is read at the limit, as before
    assert watchdog.held_pages(report("fifo", 0.1, {}), curve("fifo", 1), LIMIT) == LIMIT


# -- trials (a challenger only the doubt kept out, judged by what ran) --

def trial_report(policy, observed, thr, limit=LIMIT, old_curve=None):
    """A report of `policy` running at `limit` pages, missing `observed`
    and serving `thr` (None: no throughput source); lru's curve is
    `old_curve` (default: flat at 0.1)."""
    r = report(policy, observed, {"fifo": 0.08, "lru": 0.1})
    curves = [flat("fifo", 0.08), old_curve or flat("lru", 0.1)]
    return TenantReport(**{**r.__dict__, "limit_bytes": limit * 4096, "throughput": thr,
                           "curves": curves})


def on_trial(ref_thr=1000.0, ref_miss=0.1):
    st = TenantState()
    st.rounds = 10
    watchdog.start(st, "fifo", "lru", (ref_miss, ref_thr, LIMIT))
    return st


def feed_trial(st, reports, keep_gain=0.025, model=(0.0, 1e-2)):
    out = []
    for r in reports:
        st.rounds += 1
        out.append(watchdog.check(st, r, r.limit_bytes / 4096, K, MARGIN, COOLDOWN,
                                  model=model, keep_gain=keep_gain))
    return out


def test_a_trial_is_kept_on_what_the_tenant_served_its_first_interval_not_counted():
    st = on_trial()
    # the first running interval (the switch mid-way) served little: not counted
    got = feed_trial(st, [trial_report("fifo", 0.5, 10.0)] +
                     [trial_report("fifo", 0.09, t) for t in (1080.0, 1100.0, 1120.0)])
    assert got[:3] == [None] * 3
    v = got[3]
    assert v.trial and v.kept and v.intervals == 3
    assert v.gain == pytest.approx(0.10) and v.throughput == pytest.approx(1100.0)
    assert st.probation is None and not st.held_until
    assert v.reason.endswith(": kept") and "+10.0%" in v.reason


def test_a_trial_is_judged_only_once_its_policy_has_settled():
    # fifo settles in T caches' worth of inserts; 1,000 pages cached and
    # 1000 T / 2.5 inserted an interval: reports 1-3 come before it has
    # settled (serving little, as a loop under mru does before it comes
    # round) and are not counted; the three after them keep it
    need = policy_settling.turnovers("fifo") * 1000

    def slow(observed, thr):
        r = trial_report("fifo", observed, thr)
        return TenantReport(**{**r.__dict__, "usage_file_bytes": 1000 * 4096,
                               "inserts_per_s": need / 2.5})
    st = on_trial()
    got = feed_trial(st, [slow(0.5, 10.0)] * 3 + [slow(0.09, t) for t in (1080.0, 1100.0,
                                                                          1120.0)])
    assert got[:5] == [None] * 5
    v = got[5]
    assert v.trial and v.kept and v.intervals == 3 and v.throughput == pytest.approx(1100.0)
    # counted as soon as it ran a report, the same trial is undone
    st = on_trial()
    fast = [trial_report("fifo", 0.5, 10.0)] * 3 + [trial_report("fifo", 0.09, 1100.0)]
    v = feed_trial(st, fast)[3]
    assert v is not None and not v.kept


def test_a_trial_that_serves_less_than_the_dead_band_more_is_undone_and_held_off():
    st = on_trial()
    got = feed_trial(st, [trial_report("fifo", 0.09, t) for t in (1000.0, 1010.0, 1020.0, 1030.0)])
    v = got[3]
    assert v.trial and not v.kept and v.gain == pytest.approx(0.02)
    assert st.held_until == {"fifo": st.rounds + COOLDOWN}
    assert "needs +2.5%" in v.reason and "held off" in v.reason


def test_a_trial_without_a_throughput_source_is_judged_by_its_misses_through_the_model():
    # a = 0: the model's throughput is 1 / (b m); 0.08 against 0.1 is +25 %
    st = on_trial(ref_thr=float("nan"))
    v = feed_trial(st, [trial_report("fifo", 0.08, None) for _ in range(4)])[3]
    assert v.kept and v.gain == pytest.approx(0.25)
    st = on_trial(ref_thr=float("nan"))
    v = feed_trial(st, [trial_report("fifo", 0.1, None) for _ in range(4)])[3]
    assert not v.kept and v.gain == pytest.approx(0.0)


def test_a_trial_moves_the_reference_by_the_old_curve_where_the_limit_moved_a_little():
    # the limit grew 5 %; lru's curve says that alone takes its misses from
    # 0.1 to 0.08 -- the trial's 0.08 is then no gain at all
    sloped = MRC(np.array([LIMIT, int(LIMIT * 1.05)]), np.array([0.1, 0.08]), "lru", "synthetic")
    grown = int(LIMIT * 1.05)
    st = on_trial(ref_thr=float("nan"))
    v = feed_trial(st, [trial_report("fifo", 0.08, None, grown, sloped) for _ in range(4)])[3]
    assert v.predicted_old == pytest.approx(0.08) and not v.kept
    # throughput likewise: lru would have served 1000 x 0.1 / 0.08 there
    st = on_trial()
    v = feed_trial(st, [trial_report("fifo", 0.08, 1250.0, grown, sloped) for _ in range(4)])[3]
    assert v.gain == pytest.approx(0.0) and not v.kept


def test_a_trial_whose_limit_moved_far_is_not_judged_on_it_and_is_given_up():
    st = on_trial()
    far = int(LIMIT * 1.5)
    got = feed_trial(st, [trial_report("fifo", 0.05, 2000.0, far)
                          for _ in range(K + 1 + watchdog.TRIAL_SLACK + 1)])
    assert got[:-1] == [None] * (len(got) - 1)
    v = got[-1]
    assert v.trial and not v.kept and v.intervals == 0 and "too few to judge" in v.reason
    assert "fifo" in st.held_until


def test_a_trial_reference_is_the_latest_run_at_one_limit_past_the_warm_up():
    st = TenantState()
    for obs in [("lru", 4096e3, 0.3, 500.0), ("lru", 8192e3, 0.2, 900.0),
                ("lru", 8192e3, 0.1, 1000.0), ("lru", 8192e3, 0.12, 1100.0)]:
        st.recent_obs.append(obs)
    ref = watchdog.trial_reference(st, "lru", 8192e3, usable=10)
    assert ref == pytest.approx((0.14, 1000.0, 2000.0))
    # only the reports past the warm-up count; at least two are needed
    assert watchdog.trial_reference(st, "lru", 8192e3, usable=2) == \
        pytest.approx((0.11, 1050.0, 2000.0))
    assert watchdog.trial_reference(st, "lru", 8192e3, usable=1) is None
    # another policy last, or another limit: no reference
    assert watchdog.trial_reference(st, "fifo", 8192e3, usable=10) is None
    assert watchdog.trial_reference(st, "lru", 4096e3, usable=10) is None
    # a report without throughput: judged on misses
    st.recent_obs.append(("lru", 8192e3, 0.1, float("nan")))
    m, thr, _ = watchdog.trial_reference(st, "lru", 8192e3, usable=10)
    assert np.isnan(thr) and m == pytest.approx(0.13)


def test_a_trial_under_way_survives_a_controller_restart():
    from cachepilot.controller.engine import saved
    from cachepilot.controller.engine.types import EngineState
    state = EngineState()
    state.tenants["t"] = st = on_trial(ref_thr=1234.0, ref_miss=0.07)
    feed_trial(st, [trial_report("fifo", 0.05, 1300.0)] * 2)
    rec = saved.tenant_record(state, "t")
    again = EngineState()
    saved.restore(again, {"t": rec}, 5, 8)
    pb = again.tenants["t"].probation
    assert pb.trial and (pb.ref_miss, pb.ref_throughput, pb.ref_pages) == (0.07, 1234.0, LIMIT)
    assert pb.running_reports == 2 and pb.observed == [0.05]
