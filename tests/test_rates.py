"""Per-tenant sampling rates (agent/rates.py) and windows that close on
samples, not on time (MRCBuilder.end_interval): the rule alone, and the
linux backend following it over a cgroup tree with an emulated sampler
that samples and counts as the kernel's does."""
import math
from pathlib import Path

import numpy as np
import pytest

from cachepilot.agent.backends.linux import LinuxBackend
from cachepilot.agent.config import config_from_dict
from cachepilot.agent.curves import make_builder
from cachepilot.agent.rates import (HANDOVER_WINDOWS, MAX_HANDOVER_WINDOWS, REPLAY_INTERVALS,
                                    REPLAY_SAMPLES, RETUNE_INTERVALS, WARM_SHARE, RateTuner,
                                    RETUNE_FACTOR, BUDGET_FLOOR, BUSY_AIM, Replay,
                                    SampleBudget, ladder, warm)
from cachepilot.agent.sampler import OP_ACCESS, Counters, threshold_for_rate
from cachepilot.core.errors import UserError
from cachepilot.models.shards import sample_mask_index, threshold_rate
from cachepilot.models.traces.records import RECORD_DTYPE

from test_cgroups_tree import make_v2

MiB = 1 << 20


def test_the_ladder_is_powers_of_two_within_the_bounds():
    assert ladder(0.3, 1e-3, 1.0) == 0.25
    assert ladder(0.25, 1e-3, 1.0) == 0.25
    assert ladder(0.0624, 1e-3, 1.0) == 0.03125
    assert ladder(5.0, 1e-3, 1.0) == 1.0
    assert ladder(5.0, 1e-3, 0.25) == 0.25
    assert ladder(1e-6, 1 / 1024, 0.25) == 1 / 1024
    assert ladder(0.0, 0.01, 0.25) == 0.01


def test_a_tenant_gets_its_share_of_the_budget_over_its_speed():
    t = RateTuner(100.0, 1 / 1024, 0.25)
    assert t.wanted(800.0) == 0.125            # 100 / 800
    assert t.wanted(40_000.0) == 1 / 512       # 100 / 40,000 = 0.0025
    assert t.wanted(10.0) == 0.25              # capped
    assert t.wanted(1e9) == 1 / 1024           # floored


def test_the_first_speed_sets_the_rate_at_once_later_ones_only_when_far():
    t = RateTuner(100.0, 1 / 1024, 0.25)
    assert t.decide(0.01, 0.0) is None          # idle: no speed to go by
    assert not t.measured
    assert t.decide(0.01, 800.0) == 0.125       # the first measured interval
    assert t.measured
    # twice as fast: the ladder's next step, within RETUNE_FACTOR: stays
    for _ in range(10):
        assert t.decide(0.125, 1_600.0) is None
    # 32 times as fast: over budget 32 times, down at once
    assert t.decide(0.125, 25_600.0) == 1 / 256
    # 32 times slower: up only after RETUNE_INTERVALS intervals in a row
    for _ in range(RETUNE_INTERVALS - 1):
        assert t.decide(1 / 256, 800.0) is None
    assert t.decide(1 / 256, 800.0) == 0.125
    # a near interval between far ones starts the count again
    t2 = RateTuner(100.0, 1 / 1024, 0.25, measured=True)
    assert t2.decide(1 / 256, 800.0) is None
    assert t2.decide(1 / 256, 12_800.0) is None
    for _ in range(RETUNE_INTERVALS - 1):
        assert t2.decide(1 / 256, 800.0) is None
    assert t2.decide(1 / 256, 800.0) == 0.125


def test_a_new_builder_takes_over_once_warm_at_the_limit():
    # before HANDOVER_WINDOWS windows never, after MAX_HANDOVER_WINDOWS always
    assert not warm(1e9, 10.0, 10.0, HANDOVER_WINDOWS - 1)
    assert warm(0.0, 1e9, 1e9, MAX_HANDOVER_WINDOWS)
    # between: once it has seen as many pages as the limit holds ...
    assert not warm(9_999.0, 50_000.0, 10_000.0, HANDOVER_WINDOWS)
    assert warm(10_000.0, 50_000.0, 10_000.0, HANDOVER_WINDOWS)
    # ... or, where the tenant reads fewer pages than its limit holds,
    # nearly as many as the builder it replaces has seen
    assert not warm(8_000.0, 10_000.0, 1e6, HANDOVER_WINDOWS + 3)
    assert warm(WARM_SHARE * 10_000.0, 10_000.0, 1e6, HANDOVER_WINDOWS + 3)


def test_the_replay_keeps_the_last_intervals_within_its_samples():
    r = Replay()
    assert len(r) == 0
    small = (np.arange(1000, dtype=np.uint64),)
    for _ in range(10):
        r.add(small)
        r.next_interval()
    assert len(r) == 10                         # 10,000 keys: all of them
    big = (np.arange(REPLAY_SAMPLES // 2, dtype=np.uint64),)
    r.add(big)
    r.next_interval()
    r.add(big)
    # the interval under way counts; the oldest go first, and what is kept
    # holds at most REPLAY_SAMPLES keys
    assert len(r) == 2 and sum(r.sizes) == REPLAY_SAMPLES
    r.next_interval()
    huge = (np.arange(2 * REPLAY_SAMPLES, dtype=np.uint64),)
    r.add(huge)
    # never fewer than REPLAY_INTERVALS intervals, however many keys
    assert len(r) == REPLAY_INTERVALS and r.intervals[-1][0] is huge
    r.next_interval()
    r.add(small)
    assert len(r) == REPLAY_INTERVALS and r.intervals[0][0] is huge


def test_the_config_checks_the_rate_settings():
    base = {"roots": ["/sys/fs/cgroup"], "prometheus": {"port": 0}}
    for bad, word in (({"samples_per_s": 0}, "samples_per_s"),
                      ({"min_rate": 0.5, "max_rate": 0.25}, "min_rate"),
                      ({"samples_per_s": 50, "max_samples": 4096}, "samples_per_s"),
                      ({"max_window_intervals": 0}, "max_window_intervals")):
        with pytest.raises(UserError, match=word):
            config_from_dict({**base, "sampling": bad})


def zipf_keys(n, pages, rng, offset=1 << 40):
    ranks = np.arange(1, pages + 1, dtype=np.float64)
    p = ranks ** -0.9
    return (rng.choice(pages, size=n, p=p / p.sum()) + offset).astype(np.uint64)


def test_a_window_closes_on_samples_or_after_its_most_intervals():
    rng = np.random.default_rng(3)
    b = make_builder(("lru", "lfu"), rate=0.05, max_pages=20_000)
    keys = zipf_keys(4_000, 8_000, rng)
    b.feed(keys)
    want = len(sample_mask_index(keys, b.threshold))
    assert b.window_samples == want and 100 < want < 400
    # fewer samples than asked: the window stays open, its counts grow
    assert not b.end_interval(min_samples=1_000, max_intervals=4)
    assert b.windows == 0 and b.window_samples == want
    for _ in range(2):
        b.feed(zipf_keys(4_000, 8_000, rng))
        assert not b.end_interval(min_samples=10_000, max_intervals=4)
    b.feed(zipf_keys(4_000, 8_000, rng))
    assert b.end_interval(min_samples=10_000, max_intervals=4)    # the 4th interval
    assert b.windows == 1 and b.window_samples == 0
    b.feed(zipf_keys(40_000, 8_000, rng))
    assert b.end_interval(min_samples=1_000, max_intervals=4)     # enough samples
    # pre-sampled keys count only those under the builder's own threshold
    b2 = make_builder(("lru",), rate=0.01, max_pages=20_000)
    keys = zipf_keys(50_000, 8_000, rng)
    wide = keys[sample_mask_index(keys, threshold_for_rate(0.1))]
    b2.feed(wide, total_accesses=len(keys))
    assert b2.window_samples == len(sample_mask_index(keys, b2.threshold)) < len(wide) / 5


class EmulatedSampler:
    """What the kernel's sampler does, per watched cgroup: count every
    access, hand over the keys under the cgroup's threshold."""

    def __init__(self):
        self.thresholds: dict[int, int] = {}
        self.counts: dict[int, Counters] = {}
        self.pending: dict[int, list] = {}
        self.now_ns = 1_000_000_000

    def watch(self, cgid, threshold):
        self.thresholds[cgid] = int(threshold)
        self.counts.setdefault(cgid, Counters())

    def unwatch(self, cgid):
        self.thresholds.pop(cgid, None)

    def read(self, cgid, keys):
        """The cgroup reads `keys` (one page each)."""
        idx = sample_mask_index(keys, self.thresholds[cgid])
        recs = np.zeros(len(idx), RECORD_DTYPE)
        recs["key"] = keys[idx]
        recs["time_ns"] = self.now_ns + np.arange(len(idx))
        recs["cgroup_id"] = cgid
        recs["op"] = OP_ACCESS
        self.pending.setdefault(cgid, []).append(recs)
        c = self.counts[cgid]
        self.counts[cgid] = Counters(accesses=c.accesses + len(keys),
                                     sampled=c.sampled + len(idx))
        self.now_ns += 10_000_000

    def counters(self):
        return self.now_ns, {cg: (self.thresholds.get(cg, 0), c)
                             for cg, c in self.counts.items()}

    def drain(self):
        out = {cg: np.concatenate(parts) for cg, parts in self.pending.items() if parts}
        self.pending = {}
        return out

    def sketches(self):
        return {}

    def close(self):
        pass


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A backend over two v2 cgroups, `fast` and `slow`, with an emulated
    sampler and a clock the test moves: (backend, sampler, clock, ids)."""
    import cachepilot.agent.backends.linux as linux
    root = tmp_path / "tenants"
    for name in ("fast", "slow"):
        make_v2(root / name, current=40 * MiB, file=30 * MiB, anon=5 * MiB)
    cfg = config_from_dict({
        "roots": [str(root)], "cgroups": ["*"], "memory": "4GiB",
        "policies": ["lru", "lfu"], "prometheus": {"port": 0},
        "sampling": {"rate": 0.01, "samples_per_s": 200, "min_rate": 1 / 1024,
                     "max_rate": 0.25, "min_window_samples": 500,
                     "max_window_intervals": 3},
        "cache_ext": {"calibrate_dir": None}})
    clock = [100.0]
    monkeypatch.setattr(linux.time, "monotonic", lambda: clock[0])
    sampler = EmulatedSampler()
    b = LinuxBackend(cfg, sampler=sampler)
    b._refresh()
    ids = {n: b.watched[n].cgid for n in ("fast", "slow")}
    return b, sampler, clock, ids


def one_interval(b, sampler, clock, ids, speeds, rng, seconds=10.0):
    """Each cgroup reads speeds[name] pages a second for an interval."""
    for name, per_s in speeds.items():
        sampler.read(ids[name], zipf_keys(int(per_s * seconds), 20_000, rng))
    clock[0] += seconds
    return {r.tenant: r for r in b.collect()}


def test_each_tenant_is_sampled_at_its_share_and_a_slow_one_waits_for_samples(host):
    b, sampler, clock, ids = host
    rng = np.random.default_rng(7)
    # every tenant starts at the top rate: moving down is warm at once
    assert sampler.thresholds[ids["fast"]] == threshold_for_rate(0.25)
    assert sampler.thresholds[ids["slow"]] == threshold_for_rate(0.25)
    speeds = {"fast": 40_000, "slow": 800}
    first = b.watched["slow"].builder
    reports = one_interval(b, sampler, clock, ids, speeds, rng)
    # a curve from the first interval for each (slow's 2,000 samples pass
    # min_window_samples; started at 0.01 it had 80, and then a handover)
    assert reports["slow"].curves and reports["fast"].curves
    fast, slow = b.watched["fast"], b.watched["slow"]
    # 200 samples a second: 200 / 40,000 -> 1/256, 200 / 800 -> 1/4
    assert (fast.rate, slow.rate) == (1 / 256, 0.25)
    # fast, down: its new builder took over at once, from its interval again
    assert fast.next_builder is None and fast.builder.total_accesses == 400_000
    assert threshold_rate(fast.builder.threshold) == pytest.approx(1 / 256, rel=1e-6)
    # slow was at its rate from the start: the builder that saw its first
    # interval goes on, and no second one counts beside it
    assert slow.builder is first and slow.next_builder is None
    assert slow.builder.total_accesses == 8_000
    for w in (fast, slow):
        assert sampler.thresholds[w.cgid] == w.wanted_threshold()
    before = {n: sampler.counts[ids[n]].sampled for n in ids}
    reports = one_interval(b, sampler, clock, ids, speeds, rng)
    # the kernel now hands over keys of the same order for each (at one
    # rate of 0.25: 100,000 against 2,000)
    got = {n: sampler.counts[ids[n]].sampled - before[n] for n in ids}
    assert 0.25 < got["fast"] / got["slow"] < 4, got
    assert reports["slow"].curves and reports["fast"].curves
    # a tenant slower still: its window waits for min_window_samples
    windows = slow.builder.windows
    one_interval(b, sampler, clock, ids, {"fast": 40_000, "slow": 100}, rng)
    assert slow.builder.windows == windows and slow.builder.window_samples < 500
    # ... which the second interval at 250 samples brings
    one_interval(b, sampler, clock, ids, {"fast": 40_000, "slow": 100}, rng)
    assert slow.builder.windows == windows + 1


def test_a_tenant_that_slows_down_hands_over_to_a_builder_at_a_higher_rate(host):
    b, sampler, clock, ids = host
    rng = np.random.default_rng(11)
    speeds = {"fast": 32_000, "slow": 800}
    one_interval(b, sampler, clock, ids, speeds, rng)
    fast = b.watched["fast"]
    old = fast.builder
    assert fast.rate == 1 / 256                       # 200 / 32,000
    # fast becomes 40 times slower: nothing moves before RETUNE_INTERVALS
    speeds["fast"] = 800
    for _ in range(RETUNE_INTERVALS - 1):
        one_interval(b, sampler, clock, ids, speeds, rng)
        assert fast.builder is old and fast.next_builder is None
    one_interval(b, sampler, clock, ids, speeds, rng)
    new = fast.next_builder
    assert fast.builder is old and new is not None and fast.rate == 0.25
    # the kernel samples for both: the new builder's higher threshold
    assert sampler.thresholds[ids["fast"]] == new.threshold > old.threshold
    # reports carry the old builder's curves until the new one has counted
    # HANDOVER_WINDOWS windows beside it and seen nearly as many pages as
    # the old one (the tenant's 20,000 keys, fewer than its limit holds),
    # then the new one's
    seen = []
    for _ in range(MAX_HANDOVER_WINDOWS):
        r = one_interval(b, sampler, clock, ids, speeds, rng)["fast"]
        assert r.curves[0].rate == pytest.approx(1 / 256, rel=1e-6)
        # what the handover rule read at the end of the interval
        seen.append((new.windows, new.distinct_pages, old.distinct_pages))
        if fast.next_builder is None:
            break
    assert fast.builder is new and len(seen) >= HANDOVER_WINDOWS
    windows, pages, old_pages = seen[-1]
    assert windows >= HANDOVER_WINDOWS and pages >= WARM_SHARE * old_pages
    assert all(w < HANDOVER_WINDOWS or p < WARM_SHARE * o for w, p, o in seen[:-1])
    assert sampler.thresholds[ids["fast"]] == new.threshold
    r = one_interval(b, sampler, clock, ids, speeds, rng)["fast"]
    assert r.curves[0].rate == pytest.approx(0.25)
    # the new builder's curve is warm: its miniature LFU at 5,000 pages (a
    # quarter of the keys) reads the zipf's hits, not its cold start
    lfu = next(c for c in r.curves if c.policy == "lfu")
    assert float(lfu.at(5_000)) < 0.6


def test_a_tenant_that_speeds_up_moves_down_at_once_from_its_last_intervals(host):
    b, sampler, clock, ids = host
    rng = np.random.default_rng(13)
    speeds = {"fast": 32_000, "slow": 800}
    for _ in range(3):
        one_interval(b, sampler, clock, ids, speeds, rng)
    slow = b.watched["slow"]
    old = slow.builder
    assert slow.rate == 0.25
    speeds["slow"] = 32_000                 # 160 times its budget at 0.25
    one_interval(b, sampler, clock, ids, speeds, rng)
    new = slow.builder
    assert new is not old and slow.next_builder is None and slow.rate == 1 / 256
    assert sampler.thresholds[ids["slow"]] == new.threshold < old.threshold
    # it started from the intervals kept (all four: they hold fewer than
    # REPLAY_SAMPLES keys), fed again one window an interval: warm
    assert new.total_accesses == (32_000 + 3 * 800) * 10
    assert new.windows >= 1
    r = one_interval(b, sampler, clock, ids, speeds, rng)["slow"]
    assert r.curves[0].rate == pytest.approx(1 / 256, rel=1e-6)
    # its curve is the old builder's, give or take the sample: the last
    # intervals were enough to fill its miniatures
    lfu = next(c for c in r.curves if c.policy == "lfu")
    assert float(lfu.at(5_000)) < 0.9


def test_the_rate_keeps_a_miniature_of_a_few_hundred_pages_at_the_limit():
    t = RateTuner(100.0, 1 / 1024, 0.25)
    # 100 / 40,000 would be 1/512, but at a 54 MiB limit (13,824 pages)
    # that leaves 27 pages in the miniature: 128 / 13,824 -> 1/64
    assert t.wanted(40_000.0, limit_pages=13_824) == 1 / 64
    assert t.wanted(40_000.0, limit_pages=1 << 20) == 1 / 512     # 4 GiB: the budget's
    assert t.wanted(40_000.0, limit_pages=100) == 0.25            # never above max_rate


def test_a_tenant_that_floods_an_interval_moves_down_at_the_next_slice(host):
    """The e2e's start: a tenant sampled at 1/4 while it read 300 pages a
    second reads 46,000 once cached.  Fed a whole interval at 1/4, its
    builder cost the agent four intervals; it must move down at the slice
    where its interval's samples pass RETUNE_FACTOR intervals' budget, and
    the builder at the old rate must not be fed that slice."""
    b, sampler, clock, ids = host
    rng = np.random.default_rng(17)
    speeds = {"fast": 32_000, "slow": 800}
    for _ in range(2):
        one_interval(b, sampler, clock, ids, speeds, rng)
    slow = b.watched["slow"]
    old = slow.builder
    assert slow.rate == 0.25
    fed = old.total_accesses
    # a quiet first slice: 800 a second for 2.5 s, 500 samples, under the
    # 4 x 200 x 10 = 8,000 that shed() waits for: nothing moves
    sampler.read(ids["slow"], zipf_keys(2_000, 20_000, rng))
    clock[0] += 2.5
    b.tick()
    assert slow.builder is old and old.total_accesses == fed + 2_000
    # then 32,000 a second: 80,000 reads, 20,000 samples at 1/4
    sampler.read(ids["slow"], zipf_keys(80_000, 20_000, rng))
    clock[0] += 2.5
    b.tick()
    new = slow.builder
    assert new is not old and slow.rate < 0.25 / RETUNE_FACTOR
    assert old.total_accesses == fed + 2_000          # never fed the flood
    assert sampler.thresholds[ids["slow"]] == new.threshold < old.threshold
    # the new builder starts from the kept intervals and this one so far,
    # whose window stays open for the report to close
    assert new.total_accesses == 2 * 8_000 + 82_000
    windows = new.windows
    clock[0] += 5.0
    r = {x.tenant: x for x in b.collect()}["slow"]
    assert r.curves[0].rate == pytest.approx(slow.rate, rel=1e-6)
    assert new.windows == windows + 1
    # the interval's end takes no second step for the same speed
    rate = slow.rate
    one_interval(b, sampler, clock, ids, {"fast": 32_000, "slow": 32_000}, rng)
    assert slow.rate == rate and slow.builder is new


def test_shedding_waits_for_several_intervals_of_budget():
    t = RateTuner(100.0, 1 / 1024, 0.25)
    # 3,999 samples: under 4 intervals of 100 a second over 10 s
    assert t.shed(0.25, 3_999, 16_000, 2.0, 10.0) is None
    # 4,000 samples of 8,000 a second: 100 / 8,000 -> 1/128
    assert t.shed(0.25, 4_000, 16_000, 2.0, 10.0) == 1 / 128
    # a speed that asks for less than RETUNE_FACTOR down keeps the rate
    assert t.shed(0.25, 4_000, 1_000, 2.0, 10.0) is None


def test_the_sample_budget_falls_at_once_and_rises_slowly():
    b = SampleBudget(100.0)
    # within twice the aim: kept
    assert b.after(5.0, 10.0) is None and b.value == 100.0
    # 60 % of the time: one step of RETUNE_FACTOR brings it to 15 %
    assert b.after(6.0, 10.0) == 100.0 / RETUNE_FACTOR
    # 100 s of 110 (an agent that fell behind): as many steps as bring
    # 91 % under the aim, at once
    steps = math.ceil(math.log(100 / 110 / BUSY_AIM, RETUNE_FACTOR))
    assert b.after(100.0, 110.0) == pytest.approx(100.0 / RETUNE_FACTOR ** (1 + steps))
    # never under its floor; there, more shedding changes nothing
    assert b.after(1000.0, 1001.0) == pytest.approx(100.0 * BUDGET_FLOOR)
    assert b.after(1000.0, 1001.0) is None
    # up again only after RETUNE_INTERVALS reports with room for a step up
    low = b.value
    room = BUSY_AIM / RETUNE_FACTOR
    for _ in range(RETUNE_INTERVALS - 1):
        assert b.after(room * 10.0, 10.0) is None
    assert b.after(room * 10.0, 10.0) == pytest.approx(low * RETUNE_FACTOR)
    # a report with too little room starts the count again
    for _ in range(RETUNE_INTERVALS - 1):
        assert b.after(room * 10.0, 10.0) is None
    assert b.after(room * 12.0, 10.0) is None
    for _ in range(RETUNE_INTERVALS - 1):
        assert b.after(room * 10.0, 10.0) is None
    assert b.after(room * 10.0, 10.0) == pytest.approx(low * RETUNE_FACTOR ** 2)
    # and never above the configured figure
    b = SampleBudget(100.0, value=50.0)
    for _ in range(RETUNE_INTERVALS):
        got = b.after(0.0, 10.0)
    assert got == 100.0
    assert all(b.after(0.0, 10.0) is None for _ in range(2 * RETUNE_INTERVALS))
    assert b.after(1.0, 0.0) is None and b.after(float("nan"), 10.0) is None


def test_an_agent_whose_curve_work_outruns_its_interval_samples_less(host):
    """Feeding the builders took most of each interval (the VM's agent,
    behind four busy tenants): every tenant's rate falls in the report that
    measured it, and rises again once the work leaves room."""
    b, sampler, clock, ids = host
    rng = np.random.default_rng(23)
    speeds = {"fast": 40_000, "slow": 800}
    one_interval(b, sampler, clock, ids, speeds, rng)
    rates = {n: w.rate for n, w in b.watched.items()}
    assert rates == {"fast": 1 / 256, "slow": 0.25}
    # each slice's feeding now takes 3 s of wall time (a starved agent)
    tick = b._tick

    def slow_tick():
        tick()
        clock[0] += 3.0
    b._tick = slow_tick
    for _ in range(3):
        clock[0] += 2.5
        b.tick()
    # the same speeds over the 22 s the interval took
    sampler.read(ids["fast"], zipf_keys(880_000, 20_000, rng))
    sampler.read(ids["slow"], zipf_keys(17_600, 20_000, rng))
    clock[0] += 2.5
    b.collect()
    # 12 s of 22: one step of RETUNE_FACTOR, and each rate falls with it
    assert b.budget.value == 200 / RETUNE_FACTOR
    assert all(w.tuner.samples_per_s == b.budget.value for w in b.watched.values())
    assert b.watched["fast"].rate == rates["fast"] / RETUNE_FACTOR
    assert b.watched["slow"].rate == rates["slow"] / RETUNE_FACTOR
    # a tenant that starts now is tuned to the budget as it stands
    make_v2(Path(b.cfg.roots[0]) / "late", current=40 * MiB, file=30 * MiB, anon=5 * MiB)
    b._refresh()
    assert b.watched["late"].tuner.samples_per_s == b.budget.value
    # the work back to nothing: after RETUNE_INTERVALS reports the budget
    # is the configured one again, and the tuners follow
    b._tick = tick
    for _ in range(RETUNE_INTERVALS + 1):
        one_interval(b, sampler, clock, ids, speeds, rng)
    assert b.budget.value == 200
    assert all(w.tuner.samples_per_s == 200 for w in b.watched.values())
