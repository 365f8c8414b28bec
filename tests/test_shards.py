"""SHARDS against exact LRU.  Accuracy is judged as the mean absolute error
over 50 log-spaced sizes from 1 % to 100 % of the unique pages.

The default estimator ("split", models/shards.py) was chosen on synthetic
workloads over many hash salts (experiments/study_shards_estimators.py);
the reference-trace tests below only measure it."""
import math

import numpy as np
import pytest

from cachepilot.models import generators as gen
from cachepilot.models.exact import exact_lru_mrc, stack_distances
from cachepilot.models.shards import (DEFAULT_ESTIMATOR, ESTIMATORS, Shards,
                                      curve_from_histogram, key_count_factor,
                                      hash64, rate_threshold, sample_mask_index, shards_mrc)
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
    assert approx.meta["estimator"] == DEFAULT_ESTIMATOR
    assert err <= 0.01
    assert approx.meta["unique_estimate"] == pytest.approx(exact.meta["unique"], rel=0.1)


def test_fixed_rate_001_within_001_on_oltp(oltp_lis, reference):
    keys, exact = reference(oltp_lis)
    err, _ = mae(keys, exact, rate=0.01)
    assert err <= 0.01


def test_fixed_rate_001_on_cloudphysics_is_sampling_noise_bound(cloudphysics_txt, reference):
    # Issue 2 asks 0.01 here; it is not met (0.0287 with the shipped hash)
    # and no estimator studied meets it other than by luck.  48,974 unique
    # pages at R = 0.01 leave ~490 sampled keys and ~1,140 sampled
    # references, so one miss ratio has a standard error of ~0.02-0.03.
    # Re-salting the hash over 20 draws gives a mean MAE of 0.038 (split),
    # 0.035 (SHARDS_adj) and 0.084 (ratio): the ratio estimator's 0.009 on
    # the unsalted sample is one lucky draw (its sampled keys happen to
    # have the population's mean frequency), not a better estimator.  We
    # hold it to the noise bound instead and meet 0.01 with the fixed-size
    # variant above.
    keys, exact = reference(cloudphysics_txt)
    err, _ = mae(keys, exact, rate=0.01)
    assert err <= 0.05
    err10, _ = mae(keys, exact, rate=0.1)
    assert err10 <= 0.02


def test_fixed_rate_001_on_cloudphysics_is_near_what_an_oracle_could_do(cloudphysics_txt,
                                                                         reference):
    # An oracle that knows the exact reuse distance of every sampled
    # reference still has the luck of which keys were drawn: its expected
    # MAE is the floor of any estimator that sees the sample alone
    # (experiments/study_shards_floor.py: 0.031 mean over 20 salts).  The
    # issue's 0.01 lies below that floor; our estimator stays near it.
    keys, exact = reference(cloudphysics_txt)
    sizes = sizes_for(exact.meta["unique"])
    truth = exact.at(sizes)
    dist = stack_distances(keys)
    threshold = rate_threshold(0.01)
    ours, oracle = [], []
    for salt in SALTS:
        salted = keys ^ np.uint64(salt)          # a fresh sample, the same LRU behaviour
        ours.append(mae(salted, exact, rate=0.01)[0])
        d = np.sort(dist[hash64(salted) < np.uint64(threshold)])
        misses = (len(d) - np.searchsorted(d, sizes, side="left")) / (0.01 * len(keys))
        oracle.append(float(np.mean(np.abs(misses - truth))))
    print(f"\nR = 0.01 over {len(SALTS)} salts: oracle MAE {np.mean(oracle):.4f}, "
          f"ours {np.mean(ours):.4f}")
    assert np.mean(oracle) > 0.01
    assert np.mean(ours) <= 1.5 * np.mean(oracle)


def study_salts(n=20, seed=20260401):
    """The salts of experiments/study_shards_*.py: odd 64-bit constants;
    keys xor salt re-draws the sample."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(1, 2**63, n, dtype=np.uint64) * 2 + 1]


SALTS = study_salts()
