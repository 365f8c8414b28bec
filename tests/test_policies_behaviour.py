"""Behaviour of the policy library in the simulator: each policy with a
signature shows it, against a baseline (LRU or FIFO) that does not, so the
test can tell a working policy from one that silently degrades to LRU."""
import numpy as np
import pytest

from cachepilot.models import runtime
from cachepilot.models.policy_cli import CP_TID_REGISTERED, mark_registered

LIBRARY = ["lfu", "s3fifo", "lhd", "mglru", "hyperbolic", "get_scan",
           "admit_filter"]
GET_TID = 1001
SCAN_TID = 2002


def keys(*parts):
    return np.concatenate([np.asarray(p, dtype=np.uint64) for p in parts])


def cached(cache):
    return set(cache.cached_keys().tolist())


@pytest.mark.parametrize("policy", LIBRARY)
def test_policy_is_built_in(policy):
    assert policy in runtime.available_policies()


@pytest.mark.parametrize("policy", LIBRARY)
def test_policy_proposes_every_victim_itself(policy):
    """Over a mixed stream and a limit cut (batches of 32), the policy alone
    chooses victims: nothing rejected, no fallback to the host's LRU, the
    cache never above its limit."""
    rng = np.random.default_rng(7)
    stream = keys(rng.zipf(1.3, 30000) % 5000,
                  np.arange(10**6, 10**6 + 5000),
                  rng.integers(0, 8000, 20000))
    cache = runtime.Cache(policy, 1000)
    cache.access(stream)
    assert cache.nr_cached == 1000
    cache.capacity_pages = 300
    assert cache.nr_cached == 300
    cache.access(stream[:10000])
    st = cache.stats
    assert st["evictions"] == st["inserts"] - 300 > 20000
    assert st["fallback_evictions"] == 0
    assert st["rejected_not_cached"] == 0
    assert st["rejected_duplicate"] == 0
    assert st["rejected_excess"] == 0
    assert st["accepted"] == st["evictions"]


@pytest.mark.parametrize("policy", LIBRARY)
def test_policy_is_deterministic_and_instances_are_independent(policy):
    rng = np.random.default_rng(3)
    stream = rng.zipf(1.2, 20000) % 4000
    a, b = runtime.Cache(policy, 500), runtime.Cache(policy, 500)
    other = runtime.Cache(policy, 50)
    misses_a = []
    for chunk in np.array_split(stream, 10):
        misses_a.append(a.access(chunk))
        other.access(chunk[::-1])      # interleaved use of another instance
    misses_b = b.access(stream)
    assert sum(misses_a) == misses_b
    assert np.array_equal(a.cached_keys(), b.cached_keys())


@pytest.mark.parametrize("policy", LIBRARY)
def test_policy_takes_over_a_full_cache(policy):
    """A live swap hands every cached page to the new policy, which must
    then be able to evict them."""
    cache = runtime.Cache("lru", 400)
    cache.access(np.arange(400))
    cache.swap_policy(policy)
    cache.access(np.arange(1000, 2000))
    st = cache.stats
    assert cache.nr_cached == 400
    assert st["fallback_evictions"] == 0


@pytest.mark.parametrize("capacity", [500, 2000])
def test_lfu_keeps_hot_pages_across_a_scan(capacity):
    """Hot pages read five times survive a one-pass scan of 10x the cache;
    LRU loses them all.  2000 pages exceeds the scoring window (512), so the
    sweep over the list is exercised too."""
    hot = np.arange(capacity // 5)
    warm = np.tile(hot, 5)
    scan = np.arange(10**6, 10**6 + 10 * capacity)
    results = {}
    for policy in ("lfu", "lru"):
        cache = runtime.Cache(policy, capacity)
        cache.access(keys(warm, scan))
        results[policy] = cache.access(hot)
    assert results["lfu"] == 0
    assert results["lru"] == len(hot)


def test_s3fifo_drops_one_hit_wonders_before_repeated_pages():
    capacity = 1000
    repeated = np.arange(300)
    wonders = np.arange(10**6, 10**6 + 20000)
    stream = keys(np.repeat(repeated, 3), wonders)
    kept = {}
    for policy in ("s3fifo", "fifo", "lru"):
        cache = runtime.Cache(policy, capacity)
        cache.access(stream)
        kept[policy] = cached(cache)
    rep = set(repeated.tolist())
    assert rep <= kept["s3fifo"]
    # the wonders that filled the cache first became main at the first
    # reclaim (as libCacheSim's S3FIFO puts them there once small is full);
    # every later one-hit wonder passed through small only, so of those
    # just the newest are held (at most the cache minus the repeated pages)
    first_fill = set(wonders[:capacity - len(repeated)].tolist())
    newest = set(wonders[-(capacity - len(repeated)):].tolist())
    assert kept["s3fifo"] - rep - first_fill <= newest
    assert len(kept["s3fifo"] - rep - first_fill) > 0
    assert not rep & kept["fifo"]
    assert not rep & kept["lru"]


def test_s3fifo_ghost_readmits_to_main():
    """A page evicted from the small queue and read again soon enters main:
    it then survives a burst of new pages that flushes the small queue."""
    capacity = 100
    cache = runtime.Cache("s3fifo", capacity)
    victim = np.array([5_000_000])
    # fill, then push the victim out of small with one-hit wonders (fewer
    # than the ghost set's 90 entries after it)
    cache.access(keys(victim, np.arange(1, 150)))
    assert 5_000_000 not in cached(cache)
    cache.access(victim)                    # ghost hit: goes to main
    cache.access(np.arange(1000, 1050))     # 50 new pages churn small
    assert 5_000_000 in cached(cache)
    plain = runtime.Cache("fifo", capacity)
    plain.access(keys(victim, np.arange(1, 150), victim,
                      np.arange(1000, 1100)))
    assert 5_000_000 not in cached(plain)


def test_mru_keeps_the_first_pages_of_a_loop_larger_than_memory():
    capacity, loop = 1000, 1500
    stream = np.tile(np.arange(loop), 4)
    hits = {}
    for policy in ("mru", "lru"):
        cache = runtime.Cache(policy, capacity)
        misses = cache.access(stream)
        hits[policy] = len(stream) - misses
        if policy == "mru":
            # each pass gives up the page it touched last before missing
            assert set(range(capacity - 10)) <= cached(cache)
    # after the first pass MRU hits on ~capacity pages per pass, LRU never
    assert hits["mru"] >= 3 * (capacity - 10)
    assert hits["lru"] == 0


def _get_scan_stream(n_get=600, n_scan=20000):
    # GET pages read once, like the scan's: only the registration tells
    # them apart (LFU alone cannot)
    gets = np.arange(n_get)
    scan = np.arange(10**6, 10**6 + n_scan)
    k = keys(gets, scan)
    t = np.concatenate([np.full(len(gets), GET_TID, np.uint32),
                        np.full(len(scan), SCAN_TID, np.uint32)])
    return k, t, np.arange(n_get)


def test_get_scan_protects_get_pages_from_a_registered_scan_thread():
    k, t, get_pages = _get_scan_stream()
    annotated = mark_registered(t, [SCAN_TID])
    assert np.all(annotated[t == SCAN_TID] & CP_TID_REGISTERED)
    assert np.all(annotated[t == GET_TID] == GET_TID)
    get_tids = np.full(len(get_pages), GET_TID, np.uint32)

    cache = runtime.Cache("get_scan", 1000)
    cache.access(k, annotated)
    assert cache.access(get_pages, get_tids) == 0
    st = cache.stats
    assert st["fallback_evictions"] == 0

    # the same stream without the registration: the scan is just more GETs
    unregistered = runtime.Cache("get_scan", 1000)
    unregistered.access(k, t)
    assert unregistered.access(get_pages, get_tids) > len(get_pages) // 2
    lru = runtime.Cache("lru", 1000)
    lru.access(k, annotated)
    assert lru.access(get_pages, get_tids) == len(get_pages)


def test_get_scan_promotes_a_scan_page_a_get_reads():
    cache = runtime.Cache("get_scan", 100)
    scan_tid = np.uint32(SCAN_TID | CP_TID_REGISTERED)
    cache.access(np.array([7]), np.array([scan_tid]))
    cache.access(np.array([7]), np.array([GET_TID], np.uint32))  # now GET
    cache.access(np.arange(1000, 1500),
                 np.full(500, scan_tid, np.uint32))
    assert 7 in cached(cache)


def test_admit_filter_keeps_a_registered_threads_pages_out():
    compaction = 4242
    fg = np.arange(500)
    bg = np.arange(10**6, 10**6 + 3000)
    k = keys(fg, bg, fg)
    t = np.concatenate([np.full(500, GET_TID, np.uint32),
                        np.full(3000, compaction, np.uint32),
                        np.full(500, GET_TID, np.uint32)])
    annotated = mark_registered(t, [compaction])
    cache = runtime.Cache("admit_filter", 1000)
    misses = cache.access(k, annotated)
    st = cache.stats
    assert not set(bg.tolist()) & cached(cache)
    assert st["admit_bypassed"] == 3000
    assert misses == 500 + 3000           # second pass over fg all hits
    # a registered thread still hits on what is cached
    assert cache.access(fg[:10], np.full(10, compaction | CP_TID_REGISTERED,
                                         np.uint32)) == 0
    # unregistered, the same reads would be cached and push fg out
    plain = runtime.Cache("admit_filter", 1000)
    plain.access(k[:3500], t[:3500])
    assert set(bg[-1000:].tolist()) == cached(plain)


def test_mark_registered_refuses_tids_with_the_annotation_bit():
    with pytest.raises(Exception):
        mark_registered(np.array([1, 2], np.uint32), [CP_TID_REGISTERED | 5])


def test_mglru_protects_pages_in_read_tiers():
    """Pages read again while they sit in the oldest generation are
    promoted to a younger one instead of being evicted, so a hot set read
    now and then survives a stream of single-use pages; FIFO evicts every
    page once per lap of the cache, read or not."""
    capacity = 1000
    hot = np.arange(200)
    once = np.arange(10**6, 10**6 + 20000)
    rng = np.random.default_rng(5)
    hot_misses = {}
    for policy in ("mglru", "fifo"):
        cache = runtime.Cache(policy, capacity)
        cache.access(np.tile(hot, 4))
        misses = 0
        for chunk in np.array_split(once, 200):
            cache.access(chunk)
            misses += cache.access(rng.choice(hot, 20))
        hot_misses[policy] = misses
        assert cache.stats["fallback_evictions"] == 0
    assert hot_misses["mglru"] < hot_misses["fifo"] / 2


def test_hyperbolic_prefers_pages_with_more_hits_per_age():
    """Two sets inserted together; one is read again and again.  After a
    flood of new pages the re-read set remains, the other is gone."""
    capacity = 400
    a = np.arange(100)
    b = np.arange(100, 200)
    flood = np.arange(10**6, 10**6 + 3000)
    stream = [a, b]
    for chunk in np.array_split(flood, 30):
        stream.append(a)
        stream.append(chunk)
    cache = runtime.Cache("hyperbolic", capacity)
    cache.access(keys(*stream))
    c = cached(cache)
    assert set(a.tolist()) <= c
    assert not set(b.tolist()) & c


def test_lhd_learns_that_a_scan_has_low_hit_density():
    """A hot set polluted by a scan, 3 M accesses: LHD starts from its
    prior and relearns its densities every 2^20 accesses; by the last
    million it misses less than it did in the first and less than LRU,
    which never learns."""
    rng = np.random.default_rng(1)
    n = 3_000_000
    hot = rng.zipf(1.2, n) % 3000
    scan = 10**7 + np.arange(n)
    stream = np.where(rng.random(n) < 0.5, hot, scan).astype(np.uint64)
    first, last = {}, {}
    for p in ("lhd", "lru"):
        cache = runtime.Cache(p, 1000)
        first[p] = cache.access(stream[:n // 3]) / (n // 3)
        cache.access(stream[n // 3:-n // 3])
        last[p] = cache.access(stream[-n // 3:]) / (n // 3)
    assert last["lhd"] < first["lhd"] - 0.01
    assert last["lhd"] < last["lru"] - 0.02
