"""Pin the one hash (bpf/include/cachepilot_hash.h) with test vectors.

The reference below is written from the published splitmix64 definition in
pure Python with explicit 64-bit masking; it shares no code with the C
header.  cp_hash64(x) is splitmix64's output for state x (the state is
advanced by the golden-ratio increment first), so the first outputs of
splitmix64 seeded with 0 are also published vectors for it.
"""
import random

import numpy as np
import pytest

from cachepilot.models import _mrc
from cachepilot.models.shards import hash64, rate_threshold, sample_mask_index

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def ref_hash64(x: int) -> int:
    z = (x + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


# splitmix64 seeded with 0: its n-th output is cp_hash64((n - 1) * GOLDEN).
SPLITMIX64_SEED0 = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_reference_matches_published_splitmix64_outputs():
    for n, expected in enumerate(SPLITMIX64_SEED0):
        assert ref_hash64((n * GOLDEN) & MASK) == expected


@pytest.mark.parametrize("x", [0, 1, 2, 4095, 4096, 42932745, 186880,
                               GOLDEN, MASK, MASK - 1, 1 << 63, (1 << 32) - 1])
def test_native_scalar_matches_reference(x):
    assert _mrc.hash64(x) == ref_hash64(x)


def test_native_vector_matches_reference():
    rng = random.Random(7)
    xs = [rng.getrandbits(64) for _ in range(2000)] + list(range(100))
    got = hash64(np.array(xs, dtype=np.uint64))
    assert got.dtype == np.uint64
    assert [int(v) for v in got] == [ref_hash64(x) for x in xs]


def test_published_vectors_through_the_c_build():
    for n, expected in enumerate(SPLITMIX64_SEED0):
        assert _mrc.hash64((n * GOLDEN) & MASK) == expected


def test_sampling_filter_is_hash_below_threshold():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 1 << 63, 50000, dtype=np.uint64)
    for rate in (1.0, 0.5, 0.01):
        thr = rate_threshold(rate)
        idx = sample_mask_index(keys, thr)
        expect = [i for i, k in enumerate(keys.tolist()) if ref_hash64(k) < thr]
        assert idx.tolist() == expect
    # rate 1 keeps every key, including those whose hash is 2^64 - 2
    assert len(sample_mask_index(keys, rate_threshold(1.0))) == len(keys)


def test_hash_is_well_spread():
    # a sampling rate R must keep about R of any key set, sequential included
    keys = np.arange(1_000_000, dtype=np.uint64)
    kept = len(sample_mask_index(keys, rate_threshold(0.01)))
    assert abs(kept - 10_000) < 5 * np.sqrt(10_000)
