"""Full simulations of the library's kernel-style policies against
libCacheSim's algorithms of the same name, on both shared traces
(../shared/traces: the CloudPhysics sample and the ARC paper's OLTP), at
12 cache sizes from 1 % to 100 % of each trace's distinct pages: the whole
range a cgroup's limit can take, where a policy's warm-up, its split of the
cache and its sampling all show.  Where our version differs by design, the
policy file's header comment says how; the curves must still agree within
0.03 miss ratio at every size."""
import numpy as np
import pytest

libcachesim = pytest.importorskip("libcachesim")

from cachepilot.models import runtime  # noqa: E402
from cachepilot.models.libcachesim_oracle import miss_ratios  # noqa: E402
from cachepilot.models.traces.readers import read_keys  # noqa: E402

FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0)
TOLERANCE = 0.03
# ours -> libCacheSim's class
PAIRS = {"s3fifo": "S3FIFO", "lfu": "LFU", "lhd": "LHD",
         "hyperbolic": "Hyperbolic"}
# libCacheSim's LHD and Hyperbolic evict the worst of 64 objects drawn at
# random from the whole cache; a cache_ext policy can only score a window
# of its lists.  Where ours part from them by more than the tolerance
# somewhere in the middle of the curve, the gap is known and open (strict:
# the marker fails once they agree).
SAMPLED = {"lhd", "hyperbolic"}
OPEN_GAPS = {("lhd", "cloudphysics"), ("hyperbolic", "cloudphysics"), ("lhd", "oltp")}


@pytest.fixture(scope="module", params=["cloudphysics", "oltp"])
def trace(request):
    path = request.getfixturevalue(
        "cloudphysics_txt" if request.param == "cloudphysics" else "oltp_lis")
    keys = read_keys(path)
    distinct = len(np.unique(keys))
    return request.param, keys, [max(1, round(f * distinct)) for f in FRACTIONS]


_ORACLE = {}


def oracle(name: str, algorithm: str, keys, sizes) -> np.ndarray:
    if (name, algorithm) not in _ORACLE:
        _ORACLE[name, algorithm] = miss_ratios(keys, algorithm, sizes)
    return _ORACLE[name, algorithm]


def compare(ours: str, trace) -> tuple[float, str]:
    name, keys, sizes = trace
    curve = runtime.full_mrc(keys, ours, sizes).miss_ratio
    theirs = oracle(name, PAIRS[ours], keys, sizes)
    table = ", ".join(f"{s}: {a:.4f} vs {b:.4f}" for s, a, b in zip(sizes, curve, theirs))
    return float(np.abs(curve - theirs).max()), f"{ours} vs {PAIRS[ours]} on {name}: {table}"


@pytest.mark.parametrize("ours", sorted(set(PAIRS) - SAMPLED))
def test_full_simulation_matches_libcachesim_at_every_size(ours, trace):
    worst, table = compare(ours, trace)
    assert worst <= TOLERANCE, table


@pytest.mark.parametrize("ours", sorted(SAMPLED))
def test_sampled_policies_match_libcachesim_at_every_size(ours, trace, request):
    if (ours, trace[0]) in OPEN_GAPS:
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="a list window is not 64 objects drawn from the "
                                "whole cache (open)"))
    worst, table = compare(ours, trace)
    assert worst <= TOLERANCE, table


def test_the_comparison_can_tell_policies_apart(trace):
    """The tolerance is not so loose that any policy passes: LRU is further
    than 0.03 from libCacheSim's S3FIFO somewhere on each trace."""
    name, keys, sizes = trace
    lru = runtime.full_mrc(keys, "lru", sizes).miss_ratio
    assert np.abs(lru - oracle(name, "S3FIFO", keys, sizes)).max() > TOLERANCE
