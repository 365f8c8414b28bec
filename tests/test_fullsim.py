"""Full simulation against libCacheSim (test-only oracle): same cache
semantics -- one page per request, capacity in pages, evict before insert
on a miss -- must give the same miss ratios to 1e-9."""
from pathlib import Path

import numpy as np
import pytest

from cachepilot.models import runtime as rt
from cachepilot.models.libcachesim_oracle import miss_ratios
from cachepilot.models.traces import read_keys

lcs = pytest.importorskip("libcachesim")

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.is_dir(),
                                reason=f"reference traces absent ({TRACES})")

FRACTIONS = (0.005, 0.02, 0.08, 0.25, 0.5, 0.9)   # of the unique pages


@pytest.fixture(scope="module", params=["cloudphysics.txt", "OLTP.lis.zst"])
def trace_keys(request):
    return request.param, read_keys(TRACES / request.param)


@pytest.mark.parametrize("policy,algo", [("fifo", "FIFO"), ("lru", "LRU")])
def test_full_simulation_equals_libcachesim(trace_keys, policy, algo):
    name, keys = trace_keys
    unique = len(np.unique(keys))
    sizes = np.array(sorted({max(1, int(unique * f)) for f in FRACTIONS}))
    assert len(sizes) >= 5
    mine = rt.full_mrc(keys, policy, sizes)
    ref = miss_ratios(keys, algo, sizes)
    assert mine.method == "full" and mine.policy == policy
    np.testing.assert_allclose(mine.miss_ratio, ref, rtol=0, atol=1e-9,
                               err_msg=f"{policy} on {name}")
    # sanity of the oracle itself: misses fall with size, all are real
    assert np.all(np.diff(ref) <= 1e-12) and ref[-1] < ref[0]
