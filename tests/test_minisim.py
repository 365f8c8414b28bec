"""Miniature simulations (SHARDS-sampled stream at rate R, caches of
max(1, round(R*size)) pages, misses scaled back) against full simulation of
the same policy code."""
from pathlib import Path

import numpy as np
import pytest

from cachepilot.models import runtime as rt
from cachepilot.models.traces import read_keys

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(),
                                  reason=f"reference traces absent ({TRACES})")

OLTP_UNIQUE = 186_880          # ARC paper, Table III
SIZES = np.unique(np.geomspace(1000, OLTP_UNIQUE, 10).astype(np.int64))


@pytest.fixture(scope="module")
def oltp():
    if not TRACES.is_dir():
        pytest.skip(f"reference traces absent ({TRACES})")
    keys = read_keys(TRACES / "OLTP.lis.zst")
    assert len(np.unique(keys)) == OLTP_UNIQUE
    return keys


@pytest.fixture(scope="module")
def oltp_minisims(oltp):
    return {c.policy: c for c in rt.minisim_mrc(oltp, ["fifo", "lru", "mru", "linux"],
                                                SIZES, 0.01)}


@needs_traces
@pytest.mark.parametrize("policy", ["fifo", "lru", "linux", "mru"])
def test_minisim_mae_on_oltp(oltp, oltp_minisims, policy):
    full = rt.full_mrc(oltp, policy, SIZES)
    mini = oltp_minisims[policy]
    assert mini.method == "minisim" and mini.rate == 0.01
    # MRU's miniature is no model of the full cache: its curve comes from
    # the chain model (models/mruchain.py)
    assert mini.meta["estimator"] == ("chain" if policy == "mru" else "scaled")
    mae = float(np.mean(np.abs(full.miss_ratio - mini.miss_ratio)))
    assert mae <= 0.02, f"{policy}: MAE {mae:.4f}"


def synthetic(n=200_000, universe=20_000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.2, n) % universe).astype(np.uint64)


def test_streaming_equals_one_pass():
    keys = synthetic()
    sizes = [200, 1000, 5000]
    one = rt.minisim_mrc(keys, ["lru", "linux"], sizes, 0.05)
    sim = rt.MiniSim(["lru", "linux"], sizes, 0.05)
    for part in np.array_split(keys, 13):
        sim.feed_unsampled(part)
    for a, b in zip(one, sim.curves()):
        np.testing.assert_array_equal(a.miss_ratio, b.miss_ratio)


def test_presampled_feed_matches_and_windows_reset():
    keys = synthetic(seed=1)
    sim = rt.MiniSim(["fifo"], [300, 3000], 0.1)
    kept, _ = rt.sample(keys, 0.1)
    assert 0 < len(kept) < len(keys)
    # every kept key passes the one hash test the kernel sampler uses
    assert np.array_equal(rt.sample(kept, 0.1)[0], kept)
    sim.feed(kept, accesses=len(keys))
    ref = rt.minisim_mrc(keys, ["fifo"], [300, 3000], 0.1)[0]
    np.testing.assert_array_equal(sim.curves()[0].miss_ratio, ref.miss_ratio)
    # sampled-only estimate when the full count is unknown
    plain = rt.MiniSim(["fifo"], [300, 3000], 0.1)
    plain.feed(kept)
    c = plain.curves()[0]
    assert c.meta["estimator"] == "sampled"
    caches = plain.caches()
    st = caches[("fifo", 30)].stats
    assert c.miss_ratio[0] == st["misses"] / st["accesses"]
    # a new window counts only what comes after, with contents kept
    plain.reset_counts()
    assert plain.curves()[0].meta["sampled_accesses"] == 0
    plain.feed(kept)
    warm = plain.curves()[0]
    assert np.all(warm.miss_ratio < c.miss_ratio)


def test_miniature_sizes_and_sharing():
    sim = rt.MiniSim(["lru", "fifo"], [10, 40, 60, 1000], 0.02)
    assert sim.mini_sizes.tolist() == [1, 1, 1, 20]
    assert sorted(sim.caches()) == [("fifo", 1), ("fifo", 20), ("lru", 1), ("lru", 20)]
    curves = sim.curves()
    assert [c.policy for c in curves] == ["lru", "fifo"]
    assert all(c.meta["sampled_accesses"] == 0 for c in curves)


def mru_hits_by_recursion(keys, capacity):
    """Which accesses an MRU cache of `capacity` pages hits, without
    simulating it.  A miss with the cache full evicts the most recently used
    page, the previous access's; so a page survives from one use to the next
    exactly when the access right after the first use hits (or is the same
    page, or comes while the cache is still filling)."""
    last, hit = {}, np.zeros(len(keys), bool)
    distinct, full_from = 0, None
    for t, k in enumerate(keys.tolist()):
        p = last.get(k)
        if p is None:
            if distinct >= capacity and full_from is None:
                full_from = t           # from here on a miss evicts
            distinct += 1
        elif p == t - 1:
            hit[t] = True
        else:
            hit[t] = hit[p + 1] or full_from is None or p + 1 < full_from
        last[k] = t
    return hit


def test_mru_hit_is_the_hit_of_the_access_after_the_previous_use():
    # Why MRU's miniature cannot be right: the full cache's outcome for a
    # page hangs on the very next access, almost always an unsampled page.
    keys = synthetic(n=30_000, universe=3_000, seed=2)
    for capacity in (40, 400, 2_000):
        misses = rt.Cache("mru", capacity).access(keys)
        assert misses == int(np.count_nonzero(~mru_hits_by_recursion(keys, capacity)))


def test_registered_threads_reach_only_their_policy():
    """A GET-SCAN stream: once get_scan's miniatures know the scan thread
    (as the agent registers the threads a tenant's rule names), its curve is
    the full simulation's with the scan accesses marked, and it beats the
    unmarked one; the other policies' curves do not move, and the
    registration can be taken back."""
    from cachepilot.models import generators as gen
    keys, tids = gen.get_scan(20_000, skew=0.0, scan_fraction=0.5, scan_pages=20_000,
                              scan_space=200_000, seed=3).next(400_000)
    sizes = np.array([4_000, 8_000, 16_000])
    rate = 0.05

    def curves(register):
        sim = rt.MiniSim(["get_scan", "lfu"], sizes, rate)
        if register is not None:
            sim.register_threads("get_scan", register)
        sim.feed_unsampled(keys, tids)
        return {c.policy: np.asarray(c.miss_ratio) for c in sim.curves()}

    plain, marked, cleared = curves(None), curves([gen.SCAN_TID]), curves([])
    full = rt.full_mrc(keys, "get_scan", sizes,
                       rt.mark_registered(tids, np.array([gen.SCAN_TID], np.uint32)))
    assert np.abs(marked["get_scan"] - np.asarray(full.miss_ratio)).max() < 0.05
    assert np.all(marked["get_scan"] <= plain["get_scan"] + 0.005)
    assert marked["get_scan"][-1] < plain["get_scan"][-1] - 0.03
    assert np.array_equal(marked["lfu"], plain["lfu"])
    assert np.array_equal(cleared["get_scan"], plain["get_scan"])


def test_mark_registered_sets_bit_31_on_exactly_those_threads():
    tids = np.array([5, 7, 5 | rt.TID_REGISTERED, 9], dtype=np.uint32)
    out = rt.mark_registered(tids, np.array([5], np.uint32))
    assert out.tolist() == [5 | rt.TID_REGISTERED, 7, 5 | rt.TID_REGISTERED, 9]


def test_deferred_caches_give_the_curves_of_caches_built_at_once(monkeypatch):
    """Caches of policies without an admit hook are built only when the
    stream's distinct keys are about to outgrow them, by replaying what
    was fed before: every window's curves are those of caches fed from the
    start (LOG_MAX_ACCESSES 0 builds them all at the first batch), with
    threads registered and counted, the counted set changing midway."""
    from cachepilot.models import generators as gen
    keys, tids = gen.get_scan(3_000, skew=0.8, scan_fraction=0.3, scan_pages=500,
                              scan_space=20_000, seed=4).next(40_000)
    policies = ["get_scan", "lfu", "s3fifo", "admit_filter", "mru"]
    sizes = [100, 1_000, 5_000, 20_000, 60_000]

    def windows(log_max):
        monkeypatch.setattr(rt, "LOG_MAX_ACCESSES", log_max)
        sim = rt.MiniSim(policies, sizes, 1.0)
        sim.register_threads("get_scan", [gen.SCAN_TID])
        out, deferred = [], []
        for i, (k, t) in enumerate(zip(np.array_split(keys, 20), np.array_split(tids, 20))):
            if i == 10:
                sim.count_threads([gen.GET_TID])
            sim.feed_unsampled(k, t)
            deferred.append(len(sim._deferred))
            out.append([(c.policy, c.miss_ratio.tolist(), c.meta["est_misses"])
                        for c in sim.curves()])
            sim.reset_counts()
        return out, deferred

    lazy, deferred = windows(rt.LOG_MAX_ACCESSES)
    eager, none = windows(0)
    assert lazy == eager
    assert not any(none)
    # the larger sizes stay deferred while the stream has not filled them,
    # admit_filter's (an admit hook) never are
    assert deferred[0] > 0 and deferred[-1] > 0 and deferred[-1] < deferred[0]
    assert all(p != "admit_filter" for p, _ in rt.MiniSim(policies, sizes, 1.0)._deferred)
