"""MRCBuilder: same curves as the one-shot engines, pre-sampled input,
threshold for the kernel, and ageing that lets a phase change show."""
import numpy as np
import pytest

from cachepilot.models import hll
from cachepilot.models import generators as gen
from cachepilot.models import runtime
from cachepilot.models.builder import MRCBuilder
from cachepilot.models.exact import exact_lru_mrc
from cachepilot.models.shards import rate_threshold, sample_mask_index, shards_mrc


def test_lru_snapshot_is_the_shards_curve():
    keys = gen.zipf(30_000, 0.9, seed=1).next(300_000)
    b = MRCBuilder(("lru",), max_samples=4096)
    for part in np.array_split(keys, 7):
        b.feed(part)
    (curve,) = b.snapshot()
    ref = shards_mrc(keys, max_samples=4096, sizes=curve.sizes)
    assert curve.method == "shards" and curve.policy == "lru"
    assert np.allclose(curve.miss_ratio, ref.miss_ratio, atol=1e-12)
    assert curve.rate == pytest.approx(ref.rate)


def test_other_policies_are_the_miniature_simulations():
    keys, tids = gen.get_scan(20_000, 0.9, scan_fraction=0.3, scan_pages=256, seed=2).next(200_000)
    sizes = np.array([500, 2000, 8000, 20000])
    b = MRCBuilder(("lru", "fifo", "mru"), rate=0.05, sizes=sizes)
    for k, t in zip(np.array_split(keys, 5), np.array_split(tids, 5)):
        b.feed(k, tids=t)
    curves = b.snapshot()
    assert [c.policy for c in curves] == ["lru", "fifo", "mru"]
    ref = runtime.minisim_mrc(keys, ["fifo", "mru"], sizes, 0.05, tids=tids)
    for mine, theirs in zip(curves[1:], ref):
        assert mine.method == "minisim"
        assert np.allclose(mine.miss_ratio, theirs.miss_ratio, atol=1e-12)


def test_threshold_is_what_every_consumer_needs_and_drops_in_fixed_size():
    b = MRCBuilder(("lru", "fifo"), max_samples=500, sizes=[1000, 4000])
    assert b.threshold == (1 << 64) - 1
    b.feed(gen.uniform(50_000, seed=3).next(100_000))
    assert b.shards.threshold < b.minisim_threshold == b.threshold
    lru_only = MRCBuilder(("lru",), max_samples=500)
    lru_only.feed(gen.uniform(50_000, seed=3).next(100_000))
    assert lru_only.threshold == lru_only.shards.threshold < rate_threshold(0.05)


@pytest.mark.parametrize("estimator", ["stack", "keys"])
def test_presampled_batches_match_unsampled_feeding(estimator):
    # what the agent feeds (the kernel's sampled keys of a batch and the
    # sketch of all its accesses) gives the curve of the unsampled batch;
    # "stack" cuts a time slice per batch on both sides (slice_refs=0)
    keys = gen.zipf(40_000, 0.8, seed=4).next(400_000)
    a = MRCBuilder(("lru", "fifo"), rate=0.02, sizes=[400, 4000, 40000],
                   estimator=estimator, slice_refs=0)
    b = MRCBuilder(("lru", "fifo"), rate=0.02, sizes=[400, 4000, 40000],
                   estimator=estimator)
    for i, part in enumerate(np.array_split(keys, 10)):
        a.feed(part)
        kept = part[sample_mask_index(part, b.threshold)]     # what the kernel sends
        sketch = hll.empty()                                  # ... with its sketch
        hll.add(sketch, part)
        b.feed(kept, total_accesses=len(part), sketch=sketch)
        if i == 4:
            a.end_window()
            b.end_window()
    for ca, cb in zip(a.snapshot(), b.snapshot()):
        assert np.allclose(ca.miss_ratio, cb.miss_ratio, atol=1e-12)
    lru = b.snapshot()[0]
    assert lru.meta["estimator"] == estimator
    if estimator == "stack":
        # both windows' slices, the earlier weighted by what the current
        # one has not filled yet (here nothing: equal windows)
        assert lru.meta["slices"] == 10


def mae(curve, exact):
    return float(np.mean(np.abs(curve.miss_ratio - exact.at(curve.sizes))))


def test_a_phase_change_shows_within_one_window():
    window = 400_000
    a = gen.zipf(20_000, 1.1, seed=5).next(window)                  # small, hot
    bkeys = gen.uniform(60_000, seed=6, base=10**9).next(window)     # large, flat
    sizes = np.unique(np.geomspace(600, 60_000, 30).astype(np.int64))
    builder = MRCBuilder(("lru",), max_samples=8192, sizes=sizes)
    builder.feed(a)
    builder.end_window()
    builder.feed(bkeys[: window // 2])
    halfway = builder.snapshot()[0]
    builder.feed(bkeys[window // 2:])
    builder.end_window()
    after = builder.snapshot()[0]
    only_a, only_b = exact_lru_mrc(a), exact_lru_mrc(bkeys)
    # one window after the change the curve is phase B's, not A's
    assert mae(after, only_b) <= 0.02
    assert mae(after, only_a) > 0.2
    # halfway, it lies between the two
    mid = halfway.at(6000)
    assert min(only_a.at(6000), only_b.at(6000)) < mid < max(only_a.at(6000), only_b.at(6000))


@pytest.mark.parametrize("policies", [("lru",), ("lru", "fifo")])
def test_new_phase_lets_one_interval_replace_a_long_window(policies):
    # an agent's slow tenant: a window closes once it holds enough samples,
    # here after 6 intervals, and one more such window would be needed
    # before the curve read the new phase; after new_phase(), one interval
    # of the new phase's accesses replaces the old ones
    interval = 40_000
    a = gen.zipf(20_000, 1.1, seed=5).next(6 * interval)            # small, hot
    bkeys = gen.uniform(60_000, seed=6, base=10**9).next(3 * interval)  # large, flat
    sizes = np.unique(np.geomspace(600, 60_000, 30).astype(np.int64))

    def run(tell):
        b = MRCBuilder(policies, rate=0.1, sizes=sizes)
        for k in range(6):
            b.feed(a[k * interval:(k + 1) * interval])
            b.end_interval(min_samples=10**9, max_intervals=6)
        b.feed(bkeys[:interval])
        b.end_interval(min_samples=10**9, max_intervals=6)
        if tell:
            b.new_phase()
        b.feed(bkeys[interval:2 * interval])
        one = {c.policy: c for c in b.snapshot()}
        b.end_interval(min_samples=10**9, max_intervals=6)
        return one

    only_a = exact_lru_mrc(a)
    only_b = exact_lru_mrc(bkeys[:2 * interval])
    told = run(True)
    untold = run(False)
    # an interval after the change, told, the curves read phase B ...
    assert mae(told["lru"], only_b) <= 0.05, (mae(told["lru"], only_b), mae(told["lru"], only_a))
    if "fifo" in told:
        assert told["fifo"].at(6000) > 0.8 > only_a.at(6000)
    # ... and untold, still mostly A (the window before held 6 of A's intervals)
    assert mae(untold["lru"], only_a) < mae(untold["lru"], only_b)


def test_window_in_accesses_rotates_by_itself():
    b = MRCBuilder(("lru",), rate=0.1, window=10_000)
    b.feed(gen.uniform(1000, seed=7).next(25_000))
    assert b.windows == 2
    assert b.snapshot()[0].meta["window_accesses"] == pytest.approx(10_000)


def test_half_life_keeps_a_decaying_past():
    sizes = [500, 5000]
    fast = MRCBuilder(("lru",), rate=0.1, sizes=sizes)
    slow = MRCBuilder(("lru",), rate=0.1, sizes=sizes, half_life=4)
    hot = gen.zipf(1000, 1.2, seed=8).next(100_000)
    flat = gen.uniform(50_000, seed=9, base=10**9).next(100_000)
    for b in (fast, slow):
        b.feed(hot)
        b.end_window()
        b.feed(flat)
        b.end_window()
    # the slowly decaying builder still remembers the hot phase
    assert slow.snapshot()[0].at(500) < fast.snapshot()[0].at(500) - 0.1


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown policy 'nope'; accepted: "):
        MRCBuilder(("lru", "nope"), sizes=[10])
    with pytest.raises(ValueError, match="sizes or max_pages"):
        MRCBuilder(("fifo",))
    b = MRCBuilder(("lru",))
    with pytest.raises(ValueError, match="tids"):
        b.feed(np.arange(5, dtype=np.uint64), tids=np.arange(4))
    with pytest.raises(ValueError, match="total_accesses"):
        b.feed(np.arange(5, dtype=np.uint64), total_accesses=-1)
    # counters read a moment before the ring buffer: the batch counts as itself
    b.feed(np.arange(5, dtype=np.uint64), total_accesses=3)
    assert b.total_accesses == 5


def test_an_lru_builder_keeps_its_size_grid_across_windows():
    # the sketch counts one window; the auto size grid must still cover every
    # key tracked, also right after a window ended
    from cachepilot.models.builder import MRCBuilder
    keys = gen.zipf(30_000, 0.9, seed=9).next(200_000)
    b = MRCBuilder(("lru",), rate=0.05)
    b.feed(keys)
    (before,) = b.snapshot()
    b.end_window()
    (after,) = b.snapshot()
    distinct = len(np.unique(keys))
    assert before.sizes[-1] == pytest.approx(distinct, rel=0.1)
    assert after.sizes[-1] == pytest.approx(distinct, rel=0.1)


def test_stack_keeps_the_past_window_as_history_and_bounds_a_decaying_one():
    keys = gen.zipf(20_000, 0.9, seed=12).next(400_000)
    # sliding: the current window almost full weighs the past at 1 %, yet
    # its slices stay, so no re-use of its keys looks older than the history
    b = MRCBuilder(("lru",), rate=0.05)
    b.feed(keys[:100_000])
    b.end_window()
    b.feed(keys[100_000:199_000])
    (curve,) = b.snapshot()
    assert curve.meta["estimator"] == "stack"
    assert curve.meta["beyond_share"] == 0.0
    assert curve.meta["accesses"] == pytest.approx(99_000 + 0.01 * 100_000, rel=1e-6)
    # decaying: every window joins the past, the faded ones leave
    d = MRCBuilder(("lru",), rate=0.05, half_life=0.5)
    for part in np.array_split(keys, 20):
        d.feed(part)
        d.end_window()
    slices, records = d._past.stack
    assert len(slices) <= 128
    # 2^-(2 * 5) < 1e-3: no more than the last five windows are left
    assert slices.accesses.sum() <= 5 * 20_000
    assert records["slice"].min() >= slices.first[0]
    (curve,) = d.snapshot()
    assert curve.meta["estimator"] == "stack" and 0 < curve.meta["beyond_share"] < 1


def test_presampled_batches_with_positions_give_mru_its_chain_model():
    # the agent's batches: the kernel's sampled keys with positions (from
    # their times) -- MRU's curve is the chain model's, as it is when the
    # whole stream is fed; without positions it is the miniature's
    keys = gen.get_scan(30_000, 0.9, seed=5).next(300_000)[0]
    sizes = [300, 3000, 30000]
    whole = MRCBuilder(("fifo", "mru"), rate=0.05, sizes=sizes)
    located = MRCBuilder(("fifo", "mru"), rate=0.05, sizes=sizes)
    blind = MRCBuilder(("fifo", "mru"), rate=0.05, sizes=sizes)
    for part in np.array_split(keys, 6):
        whole.feed(part)
        idx = sample_mask_index(part, located.threshold).astype(np.int64)
        located.feed(part[idx], total_accesses=len(part), positions=idx)
        blind.feed(part[idx], total_accesses=len(part))
    w, l, b = (x.snapshot()[1] for x in (whole, located, blind))
    assert w.meta["estimator"] == l.meta["estimator"] == "chain"
    assert b.meta["estimator"] == "scaled"
    # the same but for the repeats, which only the whole stream counts
    assert np.abs(w.miss_ratio - l.miss_ratio).max() <= 0.02
    with pytest.raises(ValueError, match="positions"):
        located.feed(keys[:3], total_accesses=10, positions=[1, 2])
