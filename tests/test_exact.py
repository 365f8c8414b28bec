"""Exact LRU curves: against a naive LRU stack written here, and against
libCacheSim (test-only oracle) on the reference traces.

How libCacheSim counts, so that the comparison is like for like:
- a plain-text trace (PLAIN_TXT_TRACE) gives every request obj_size = 1,
  so `cache_size` is a number of objects = 4 KiB pages;
- for OLTP we write the expanded page keys as an oracleGeneral trace with
  obj_size = 4096 and give libCacheSim cache_size = pages * 4096 bytes;
- its miss ratio is misses / requests over every request it reads, cold
  misses included; ours is the same over page accesses (for these traces
  each request is one page).
"""
import numpy as np
import pytest

from cachepilot.models.exact import (COLD, ExactLRU, auto_sizes, exact_lru_mrc,
                                    misses_from_distances, stack_distances)
from cachepilot.models.traces import open_trace, read_keys, write_oracle_general
from lru_oracle import naive_lru_miss_ratio


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_lru_at_every_size(seed):
    rng = np.random.default_rng(seed)
    keys = np.concatenate([rng.zipf(1.3, 3000) % 400,
                           np.arange(500, 800), rng.integers(0, 900, 2000)])
    curve = exact_lru_mrc(keys.astype(np.uint64))
    assert curve.meta["unique"] == len(np.unique(keys))
    kl = keys.tolist()
    for size in [1, 2, 3, 10, 50, 99, 200, 400, 899, 2000]:
        assert curve.at(size) == pytest.approx(naive_lru_miss_ratio(kl, size), abs=1e-12)


def test_renumbering_keeps_distances_exact():
    # few keys, many references: positions are renumbered hundreds of times
    rng = np.random.default_rng(5)
    keys = np.concatenate([np.tile(np.arange(40), 300), rng.integers(0, 60, 30000)])
    engine = ExactLRU()
    for part in np.array_split(keys.astype(np.uint64), 17):     # streaming
        engine.feed(part)
    curve = engine.mrc()
    kl = keys.tolist()
    for size in [1, 5, 20, 39, 40, 41, 59, 60]:
        assert curve.at(size) == pytest.approx(naive_lru_miss_ratio(kl, size), abs=1e-12)


def test_histogram_counts_every_reference():
    keys = np.random.default_rng(9).integers(0, 1000, 20000).astype(np.uint64)
    engine = ExactLRU()
    engine.feed(keys)
    hist = engine.histogram()
    assert hist.sum() == len(keys) and hist[0] == len(np.unique(keys))
    assert engine.accesses == len(keys)


SIZES_FRACTIONS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0]


def test_equals_libcachesim_on_cloudphysics(cloudphysics_txt):
    lcs = pytest.importorskip("libcachesim")
    curve = exact_lru_mrc(open_trace(cloudphysics_txt))
    unique = curve.meta["unique"]
    sizes = sorted({max(1, int(f * unique)) for f in SIZES_FRACTIONS})
    assert len(sizes) >= 5
    reader = lcs.TraceReader(str(cloudphysics_txt), lcs.TraceType.PLAIN_TXT_TRACE)
    for size in sizes:
        theirs, _ = lcs.LRU(cache_size=size).process_trace(reader)
        assert curve.at(size) == pytest.approx(theirs, abs=1e-9), size


def test_equals_libcachesim_on_oltp(oltp_lis, tmp_path):
    lcs = pytest.importorskip("libcachesim")
    keys = read_keys(oltp_lis)
    binary = tmp_path / "oltp.oracleGeneral.bin"
    write_oracle_general(binary, keys, obj_size=4096)
    curve = exact_lru_mrc(keys)
    unique = curve.meta["unique"]
    sizes = sorted({max(1, int(f * unique)) for f in SIZES_FRACTIONS})
    reader = lcs.TraceReader(str(binary), lcs.TraceType.ORACLE_GENERAL_TRACE)
    for size in sizes:
        theirs, _ = lcs.LRU(cache_size=size * 4096).process_trace(reader)
        assert curve.at(size) == pytest.approx(theirs, abs=1e-9), size


def test_auto_sizes_span_one_percent_to_all():
    sizes = auto_sizes(186_880)
    assert sizes[0] == 1 and sizes[-1] == 186_880
    assert np.all(np.diff(sizes) > 0)
    assert np.sum(sizes >= 1868) >= 45


def test_any_64_bit_key_works():
    rng = np.random.default_rng(12)
    pool = np.concatenate([rng.integers(0, 1 << 64, 300, dtype=np.uint64, endpoint=False),
                           np.array([0, 1, (1 << 64) - 1, (1 << 63)], dtype=np.uint64)])
    keys = pool[rng.integers(0, len(pool), 20_000)]
    curve = exact_lru_mrc(keys)
    assert curve.meta["unique"] == len(np.unique(keys))
    kl = keys.tolist()
    for size in [1, 10, 100, 250, 304]:
        assert curve.at(size) == pytest.approx(naive_lru_miss_ratio(kl, size), abs=1e-12)


def test_per_reference_stack_distances_agree_with_the_curve():
    assert stack_distances([1, 2, 1, 3, 2, 2]).tolist() == [COLD, COLD, 1, COLD, 2, 0]
    assert len(stack_distances([])) == 0
    rng = np.random.default_rng(5)
    keys = rng.zipf(1.3, 20_000).astype(np.uint64) % 3000
    d = stack_distances(keys)
    exact = exact_lru_mrc(keys)
    sizes = np.arange(1, 3001, 37)
    misses = misses_from_distances(d, sizes, len(d))
    assert np.max(np.abs(misses - exact.at(sizes))) < 1e-12
