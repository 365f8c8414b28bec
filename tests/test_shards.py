"""SHARDS against exact LRU.  Accuracy is judged as the mean absolute error
over 50 log-spaced sizes from 1 % to 100 % of the unique pages.

The default estimators ("stack" at a fixed rate, "split" at a fixed size,
models/estimators.py) were chosen on synthetic workloads over many hash salts
(experiments/study_shards_estimators.py); the reference-trace tests below
only measure them."""
import math

import numpy as np
import pytest

from cachepilot.models import generators as gen
from cachepilot.models.exact import (COLD, exact_lru_mrc, misses_from_distances,
                                     stack_distances)
from cachepilot.models import hll
from cachepilot.models.estimators import (DEFAULT_ESTIMATOR, DEFAULT_SIZE_ESTIMATOR,
                                          ESTIMATORS, key_count_factor)
from cachepilot.models.shards import (Shards, curve_from_histogram, hash64, hash_salts,
                                      rate_threshold, sample_mask_index, shards_mrc)
from cachepilot.models.traces import read_keys


def sizes_for(unique):
    return np.unique(np.geomspace(unique / 100, unique, 50).astype(np.int64))


def mae(keys, exact, **kw):
    sizes = sizes_for(exact.meta["unique"])
    approx = shards_mrc(keys, sizes=sizes, **kw)
    return float(np.mean(np.abs(approx.miss_ratio - exact.at(sizes)))), approx


@pytest.fixture(scope="module")
def reference(request):
    """(keys, exact curve) of each reference trace, read once."""
    cache = {}

    def get(path):
        if path not in cache:
            keys = read_keys(path)
            cache[path] = (keys, exact_lru_mrc(keys))
        return cache[path]
    return get


def test_rate_one_is_exact():
    keys = gen.zipf(5000, 0.9, seed=1).next(50000)
    exact = exact_lru_mrc(keys)
    err, approx = mae(keys, exact, rate=1.0)
    assert err == 0.0 and approx.rate == 1.0


@pytest.mark.parametrize("name", ["cloudphysics_txt", "oltp_lis"])
def test_fixed_size_8192_within_001(name, reference, request):
    keys, exact = reference(request.getfixturevalue(name))
    err, approx = mae(keys, exact, max_samples=8192)
    assert approx.meta["estimator"] == DEFAULT_SIZE_ESTIMATOR
    assert err <= 0.01
    assert approx.meta["unique_estimate"] == pytest.approx(exact.meta["unique"], rel=0.1)


def test_fixed_rate_001_within_001_on_oltp(oltp_lis, reference):
    keys, exact = reference(oltp_lis)
    err, approx = mae(keys, exact, rate=0.01)
    assert approx.meta["estimator"] == DEFAULT_ESTIMATOR == "stack"
    # the sketches' count of all pages (186,880 by the ARC paper)
    assert approx.meta["all_keys_estimate"] == pytest.approx(186_880, rel=0.05)
    assert 64 <= approx.meta["slices"] <= 128
    assert err <= 0.01


def test_fixed_rate_001_within_001_on_cloudphysics(cloudphysics_txt, reference):
    # 48,974 unique pages at R = 0.01 leave ~490 sampled keys: an estimator
    # that sees the sample alone cannot expect 0.01 here (the oracles below);
    # "stack" also counts every reference by time slice
    keys, exact = reference(cloudphysics_txt)
    err, approx = mae(keys, exact, rate=0.01)
    assert approx.meta["estimator"] == "stack"
    assert err <= 0.01
    err10, _ = mae(keys, exact, rate=0.1)
    assert err10 <= 0.01


def test_fixed_rate_001_on_cloudphysics_against_the_oracles(cloudphysics_txt, reference):
    # An oracle that knows the exact reuse distance of every sampled
    # reference still has the luck of which keys were drawn: its expected
    # MAE is the floor of any estimator that sees the sample alone
    # (experiments/study_shards_floor.py: 0.031 mean over 20 salts); the
    # issue's 0.01 lies below it, and split, which sees the sample alone,
    # stays near it.  "keys" also sees a sketch of every reference, so its
    # floor is the oracle that divides by the exact key rate instead
    # (0.014); it must beat the sample-alone floor.  "stack" counts every
    # reference by time slice and uses the sample only inside the counts'
    # brackets: it must go below both floors, and below 0.01 on average.
    keys, exact = reference(cloudphysics_txt)
    sizes = sizes_for(exact.meta["unique"])
    truth = exact.at(sizes)
    dist = stack_distances(keys)
    threshold = rate_threshold(0.01)
    unique = exact.meta["unique"]
    split, ours, stacked, oracle, oracle_keys = [], [], [], [], []
    for salt in SALTS:
        salted = keys ^ np.uint64(salt)          # a fresh sample, the same LRU behaviour
        split.append(mae(salted, exact, rate=0.01, estimator="split")[0])
        ours.append(mae(salted, exact, rate=0.01, estimator="keys")[0])
        stacked.append(mae(salted, exact, rate=0.01)[0])
        picked = dist[hash64(salted) < np.uint64(threshold)]
        misses = misses_from_distances(picked, sizes, 0.01 * len(keys))
        oracle.append(float(np.mean(np.abs(misses - truth))))
        drawn = int(np.count_nonzero(picked == COLD))
        misses = misses_from_distances(picked, sizes, len(keys) * drawn / unique)
        oracle_keys.append(float(np.mean(np.abs(misses - truth))))
    print(f"\nR = 0.01 over {len(SALTS)} salts: oracle MAE {np.mean(oracle):.4f}, "
          f"split {np.mean(split):.4f}; key-rate oracle {np.mean(oracle_keys):.4f}, "
          f"keys {np.mean(ours):.4f}; stack {np.mean(stacked):.4f} "
          f"(worst {max(stacked):.4f})")
    assert np.mean(oracle) > 0.01
    assert np.mean(split) <= 1.5 * np.mean(oracle)
    assert np.mean(oracle_keys) < np.mean(ours) < 0.8 * np.mean(oracle)
    assert np.mean(ours) <= 1.8 * np.mean(oracle_keys)
    assert np.mean(stacked) < 0.01 < np.mean(oracle_keys)
    assert max(stacked) < np.mean(oracle_keys)


SALTS = hash_salts(20)      # those of experiments/study_shards_*.py


SYNTHETIC = {
    "zipf": lambda s: gen.zipf(300_000, 0.8, seed=s).next(1_500_000),
    "get-scan": lambda s: gen.get_scan(150_000, 0.9, scan_fraction=0.2,
                                       scan_pages=512, seed=s).next(1_500_000)[0],
    "phases": lambda s: gen.phases([(gen.zipf(100_000, 1.0, seed=s), 500_000),
                                    (gen.loop(120_000), 500_000),
                                    (gen.uniform(200_000, seed=s), 500_000)]).next(1_500_000),
}


# Mean / max MAE bounds for fixed rate R = 0.01.  "phases" contains a loop
# over 120,000 pages: every reference then has the same true distance, and
# the sample's estimate of it is off by +-3 % (1,200 +- 35 sampled keys), so
# the curve's cliff moves and the sizes beside it take errors of ~0.3.  That
# is SHARDS' known weak spot; the fixed-size variant holds 0.01 there.
RATE_BOUNDS = {"zipf": (0.015, 0.03), "get-scan": (0.015, 0.03), "phases": (0.04, 0.05)}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_workloads_average_within_001(name):
    # three seeds each; a seed changes both the workload and which keys the
    # fixed hash samples, so this is not tuned to one lucky sample
    errs_size, errs_rate = [], []
    for seed in (11, 12, 13):
        keys = SYNTHETIC[name](seed)
        exact = exact_lru_mrc(keys)
        errs_size.append(mae(keys, exact, max_samples=8192)[0])
        errs_rate.append(mae(keys, exact, rate=0.01)[0])
    print(name, "fixed size", errs_size, "fixed rate", errs_rate)
    assert np.mean(errs_size) <= 0.01 and max(errs_size) <= 0.02, errs_size
    mean_bound, max_bound = RATE_BOUNDS[name]
    assert np.mean(errs_rate) <= mean_bound and max(errs_rate) <= max_bound, errs_rate


def test_adj_correction_reduces_error_on_average():
    gains = []
    for seed in range(4):
        keys = gen.zipf(200_000, 0.8, seed=seed).next(600_000)
        exact = exact_lru_mrc(keys)
        gains.append(mae(keys, exact, rate=0.01, adj=False)[0] -
                     mae(keys, exact, rate=0.01, adj=True)[0])
    assert np.mean(gains) > 0


def test_fixed_size_bounds_the_sample_and_lowers_the_threshold():
    engine = Shards(max_samples=1000)
    thresholds = []
    stream = gen.uniform(100_000, seed=4)
    for _ in range(20):
        engine.feed(stream.next(20_000))
        assert engine.sampled_keys <= 1000
        thresholds.append(engine.threshold)
    assert all(a >= b for a, b in zip(thresholds, thresholds[1:]))
    assert engine.rate == pytest.approx(1000 / 100_000, rel=0.15)


@pytest.mark.parametrize("estimator", ["stack", "keys"])
def test_presampled_batches_give_the_same_curve(estimator):
    # what the agent feeds -- the kernel's sampled keys of a batch, at a
    # higher rate than ours, and the sketch of all its accesses -- gives the
    # curve of the unsampled batches ("stack": one time slice per batch on
    # both sides)
    keys = gen.zipf(50_000, 0.9, seed=8).next(400_000)
    whole = Shards(rate=0.01, estimator=estimator, slice_refs=0)
    pre = Shards(rate=0.01, estimator=estimator)
    blind = Shards(rate=0.01, estimator=estimator)
    for part in np.array_split(keys, 8):
        whole.feed(part)
        kept = part[sample_mask_index(part, rate_threshold(0.05))]
        sketch = hll.empty()
        hll.add(sketch, part)
        pre.feed(kept, total_accesses=len(part), sketch=sketch)
        blind.feed(kept, total_accesses=len(part))
    a, b = whole.mrc(), pre.mrc()
    assert a.meta["estimator"] == b.meta["estimator"] == estimator
    assert np.array_equal(a.sizes, b.sizes)
    assert np.allclose(a.miss_ratio, b.miss_ratio, atol=1e-12)
    assert pre.accesses == len(keys)
    if estimator == "stack":
        assert b.meta["slices"] == 8
    # without the sketch the sample's key count is all there is: "split",
    # and the curve says so
    c = blind.mrc(a.sizes)
    assert c.meta["estimator"] == "split" and c.meta["estimator_asked"] == estimator
    assert blind.sketch() is None
    assert np.allclose(c.miss_ratio, shards_mrc(keys, 0.01, sizes=a.sizes,
                                                estimator="split").miss_ratio, atol=1e-12)


def test_needs_a_rate_or_a_size():
    with pytest.raises(ValueError):
        Shards()
    with pytest.raises(ValueError):
        Shards(rate=0)
    with pytest.raises(ValueError):
        Shards(rate=1.5)


# -- the "split" estimator --------------------------------------------------

def salted(keys, salt):
    """The same workload with another sample: xor is a bijection, so the
    LRU behaviour is unchanged while the hash picks other keys."""
    return keys ^ np.uint64(salt)


def mae_by_estimator(keys, exact, **kw):
    """MAE of every estimator on one run (they share its histogram)."""
    sizes = sizes_for(exact.meta["unique"])
    truth = exact.at(sizes)
    engine = Shards(**kw, estimator="split")
    engine.feed(keys)
    stats = engine.key_stats()
    hist, bin_pages, rate, accesses = engine.take_histogram()
    return {e: float(np.mean(np.abs(curve_from_histogram(
        hist, bin_pages, rate, accesses, sizes, estimator=e,
        key_stats=stats).miss_ratio - truth))) for e in ESTIMATORS}


def test_split_is_no_worse_than_adj_and_ratio_on_average_over_salts():
    # Small traces, the regime where the estimators differ; workloads and
    # salts other than the study's.  Skewed workloads favour SHARDS_adj,
    # flat ones the ratio estimator; split must match the better of them
    # on average, in both modes.
    workloads = [gen.zipf(50_000, 0.9, seed=31).next(100_000),
                 gen.uniform(50_000, seed=32).next(100_000),
                 gen.loop(30_000).next(100_000),
                 gen.get_scan(40_000, 0.9, scan_fraction=0.2, scan_pages=512,
                              seed=33).next(100_000)[0]]
    rng = np.random.default_rng(2024)
    salts = [int(s) | 1 for s in rng.integers(1, 2**63, 10, dtype=np.uint64)]
    for mode in ({"rate": 0.01}, {"max_samples": 8192}):
        errs = {e: [] for e in ESTIMATORS}
        for keys in workloads:
            exact = exact_lru_mrc(keys)
            for salt in salts:
                for e, v in mae_by_estimator(salted(keys, salt), exact, **mode).items():
                    errs[e].append(v)
        means = {e: float(np.mean(v)) for e, v in errs.items()}
        print(mode, means)
        assert means["split"] <= means["adj"] and means["split"] <= means["ratio"], means


def test_key_count_factor_takes_the_whole_deviation_when_keys_are_alike():
    # every sampled key equally busy: the sample's excess can only be keys
    assert key_count_factor(500, 0.0, 1100.0, 100_000, 0.01) == pytest.approx(1.1)
    # and then split is the ratio estimator: three whole passes of a loop
    # reference every key equally often and give the same curve both ways
    keys = gen.loop(40_000).next(120_000)
    split = shards_mrc(keys, rate=0.01, estimator="split")
    ratio = shards_mrc(keys, rate=0.01, estimator="ratio")
    assert np.allclose(split.miss_ratio, ratio.miss_ratio, atol=1e-9)


def test_key_count_factor_blames_a_large_excess_on_hot_keys():
    keys, rate, accesses = 500, 0.01, 100_000
    sd_count = math.sqrt((1 - rate) / keys)
    excess = math.exp(6 * sd_count)          # 6 sd: implausible as a key count
    flat = key_count_factor(keys, 0.3, accesses * rate * excess, accesses, rate)
    skewed = key_count_factor(keys, 50.0, accesses * rate * excess, accesses, rate)
    # both lie between "all keys" (excess) and "all composition" (1) ...
    assert 1.0 < skewed < flat < excess
    # ... and with a heavy-tailed spread of frequencies, the count part
    # stays within what a binomial key count plausibly does
    assert math.log(skewed) < 2 * sd_count
    # a deficit is treated symmetrically
    low = key_count_factor(keys, 50.0, accesses * rate / excess, accesses, rate)
    assert 1.0 / excess < low < 1.0
    # rate 1 samples every key: nothing to correct
    assert key_count_factor(keys, 50.0, 1234.0, 1000, 1.0) == 1.0


def test_key_count_part_lies_between_nothing_and_everything():
    # whatever the inputs, the key-count part of a deviation is a shrunk
    # share of it: same sign, no larger, finite
    rng = np.random.default_rng(7)
    for _ in range(500):
        keys = int(rng.integers(1, 100_000))
        rate = float(10 ** rng.uniform(-5, -0.01))
        accesses = float(10 ** rng.uniform(0, 9))
        cv2 = 0.0 if rng.random() < 0.1 else float(10 ** rng.uniform(-6, 4))
        dev = float(rng.normal(0, 10 ** rng.uniform(-3, 1)))
        x = math.log(key_count_factor(keys, cv2, accesses * rate * math.exp(dev),
                                      accesses, rate))
        # (1e-12: exp then log is not an exact round trip)
        assert math.isfinite(x) and min(0.0, dev) - 1e-12 <= x <= max(0.0, dev) + 1e-12


@pytest.mark.parametrize("mode", [{"rate": 0.05, "estimator": "keys"}, {"max_samples": 2000}])
def test_per_key_counts_follow_the_sample(mode):
    engine = Shards(**mode)
    stream = gen.zipf(40_000, 0.8, seed=9)
    for _ in range(6):
        engine.feed(stream.next(30_000))
        keys, refs, sum_sq = engine.key_stats()
        assert keys == engine.sampled_keys
        assert sum_sq >= refs >= keys
    if "rate" in mode:
        # fixed rate: the counts are exactly the histogram's references
        hist = engine.take_histogram()[0]
        assert refs == pytest.approx(float(np.sum(hist)))
    engine.take_histogram(reset=True)
    assert engine.key_stats() == (0, 0.0, 0.0)


def test_estimator_names_and_the_adj_keyword():
    keys = gen.zipf(20_000, 0.9, seed=5).next(60_000)
    assert shards_mrc(keys, rate=0.05).meta["estimator"] == DEFAULT_ESTIMATOR == "stack"
    assert shards_mrc(keys, max_samples=500).meta["estimator"] == DEFAULT_SIZE_ESTIMATOR \
        == "split"
    assert shards_mrc(keys, rate=0.05, adj=True).meta["estimator"] == "adj"
    assert shards_mrc(keys, rate=0.05, adj=False).meta["estimator"] == "ratio"
    assert shards_mrc(keys, rate=0.05, adj=True, estimator="split").meta["estimator"] == "split"
    with pytest.raises(ValueError, match="unknown SHARDS estimator"):
        Shards(rate=0.05, estimator="magic")
    with pytest.raises(ValueError, match="needs a fixed rate"):
        Shards(max_samples=500, estimator="stack")
    # at rate 1 the sample is the stream and the curve exact, whatever the
    # estimator
    exact = exact_lru_mrc(keys)
    whole = shards_mrc(keys, rate=1.0, sizes=[10, 100, 1000], estimator="stack")
    assert np.array_equal(whole.miss_ratio, exact.at([10, 100, 1000]))
    hist, bin_pages, rate, accesses = Shards(rate=0.05, adj=True).take_histogram()
    with pytest.raises(ValueError, match="per-key counts"):
        curve_from_histogram(np.array([1.0, 2.0]), 1, 0.05, 100, [1, 2], estimator="split")


def test_builder_uses_the_same_estimators():
    # the agent's MRCBuilder builds its LRU curve with the same default,
    # and still honours adj=True for SHARDS_adj
    from cachepilot.models.builder import MRCBuilder
    keys = gen.zipf(20_000, 0.9, seed=6).next(80_000)
    for kw, name in (({}, DEFAULT_ESTIMATOR), ({"adj": True}, "adj"),
                     ({"estimator": "ratio"}, "ratio")):
        b = MRCBuilder(("lru",), rate=0.05, **kw)
        b.feed(keys[:40_000])
        b.end_window()
        b.feed(keys[40_000:])
        (curve,) = b.snapshot()
        assert curve.meta["estimator"] == name
        assert np.all(np.diff(curve.miss_ratio) <= 1e-12)
