"""The cache_ext policy runtime: policies against independent reference
models, the kernel-style handling of misbehaving policies, live swaps,
capacity changes, per-instance isolation, and loading policies from source."""
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from cachepilot.core.errors import UserError
from cachepilot.models import runtime as rt

TEST_POLICIES = Path(__file__).resolve().parent / "policies"


def load_test_policy(name):
    return rt.load_policy_source(str(TEST_POLICIES / f"{name}.bpf.c"))


def stream(n=20000, universe=600, seed=1):
    """Skewed random keys: some reuse at every distance."""
    rng = np.random.default_rng(seed)
    hot = rng.integers(0, universe // 10, n)
    cold = rng.integers(0, universe, n)
    return np.where(rng.random(n) < 0.5, hot, cold).astype(np.uint64)


# -- reference models, written from the policy definitions -----------------

def run_test_policy(name, seed, pages):
    """A test policy run over a seeded stream: (cache, keys, misses, stats)."""
    load_test_policy(name)
    keys = stream(seed=seed)
    cache = rt.Cache(name, pages)
    misses = cache.access(keys)
    return cache, keys, misses, cache.stats


def ref_misses(policy, keys, capacity):
    """Miss count of a textbook fifo / lru / mru cache, evict-before-insert."""
    cache = OrderedDict()          # first = next victim for fifo / lru
    misses = 0
    for k in keys.tolist():
        if k in cache:
            if policy == "lru":
                cache.move_to_end(k)
            elif policy == "mru":
                cache.move_to_end(k)
            continue
        misses += 1
        if len(cache) >= capacity:
            if policy == "mru":
                cache.popitem(last=True)     # most recently used
            else:
                cache.popitem(last=False)
        cache[k] = True
    return misses


def ref_lfu_misses(keys, capacity):
    """LFU, ties to the least recently accessed; the read that brings a
    page in counts as its first access (as in the kernel)."""
    meta = {}
    misses = 0
    for t, k in enumerate(keys.tolist(), start=1):
        if k in meta:
            c, _ = meta[k]
            meta[k] = (c + 1, t)
            continue
        misses += 1
        if len(meta) >= capacity:
            victim = min(meta, key=lambda x: meta[x])
            del meta[victim]
        meta[k] = (1, t)
    return misses


@pytest.mark.parametrize("policy", ["fifo", "lru", "mru"])
@pytest.mark.parametrize("capacity", [1, 7, 64, 250])
def test_policies_match_reference_models(policy, capacity):
    keys = stream()
    cache = rt.Cache(policy, capacity)
    misses = cache.access(keys)
    assert misses == ref_misses(policy, keys, capacity)
    st = cache.stats
    assert st["accesses"] == len(keys)
    assert st["hits"] + st["misses"] == len(keys)
    # a well-behaved policy never needs the fallback
    assert st["fallback_evictions"] == 0
    assert st["accepted"] == st["evictions"] == st["inserts"] - st["cached"]
    assert st["cached"] == min(capacity, len(np.unique(keys)))


def test_batches_do_not_change_results():
    keys = stream(seed=3)
    whole = rt.Cache("lru", 50)
    whole.access(keys)
    parts = rt.Cache("lru", 50)
    for chunk in np.array_split(keys, 37):
        parts.access(chunk)
    assert whole.stats == parts.stats
    assert np.array_equal(whole.cached_keys(), parts.cached_keys())


def test_instances_are_independent():
    """Interleaving two instances of the same policy (state, lists, maps
    per instance) must not change either one's results."""
    a_keys, b_keys = stream(seed=4), stream(seed=5, universe=2000)
    for policy in ["lru", "linux"]:
        alone_a, alone_b = rt.Cache(policy, 40), rt.Cache(policy, 90)
        alone_a.access(a_keys)
        alone_b.access(b_keys)
        a, b = rt.Cache(policy, 40), rt.Cache(policy, 90)
        for ca, cb in zip(np.array_split(a_keys, 50), np.array_split(b_keys, 50)):
            a.access(ca)
            b.access(cb)
        assert a.stats == alone_a.stats
        assert b.stats == alone_b.stats


def test_score_kfunc_and_maps_with_lfu_test_policy():
    load_test_policy("score_lfu")
    keys = stream(n=6000, seed=6)
    for capacity in [1, 16, 100]:
        cache = rt.Cache("score_lfu", capacity)
        assert cache.access(keys) == ref_lfu_misses(keys, capacity)
        assert cache.stats["fallback_evictions"] == 0


def test_admission_and_tids():
    load_test_policy("admit_tid")
    keys = np.arange(100, dtype=np.uint64)
    tids = np.where(keys % 2 == 0, 7, 3).astype(np.uint32)
    cache = rt.Cache("admit_tid", 1000)
    assert cache.access(keys, tids) == 100
    st = cache.stats
    assert st["admit_bypassed"] == 50
    cached = set(cache.cached_keys().tolist())
    assert cached == set(range(1, 100, 2))
    # bypassed pages miss again; admitted ones hit
    assert cache.access(keys, np.full(100, 3, np.uint32)) == 50


# -- misbehaving policies --------------------------------------------------

def test_policy_proposing_duplicates():
    cache, keys, misses, st = run_test_policy("bad_claims", 7, 64)
    # the first copy is accepted, the others ignored and counted; with one
    # page needed per miss the duplicates never show, so lower the limit
    assert st["rejected_duplicate"] == 0
    # every call claims 1000 candidates: a request for one page sees 999
    # of them as beyond its request
    excess = st["rejected_excess"]
    assert excess == 999 * st["requests"]
    cache.capacity_pages = 10          # one reclaim of 54 pages: 32 + 22
    st = cache.stats
    assert st["cached"] == 10
    assert st["rejected_duplicate"] == 31 + 21
    assert st["fallback_evictions"] == 31 + 21
    assert st["requests"] == (misses - 64) + 2
    # it evicts in FIFO order through the fallback too, so the survivors
    # are the 10 newest pages
    ref = rt.Cache("fifo", 64)
    ref.access(keys)
    ref.capacity_pages = 10
    assert np.array_equal(np.sort(cache.cached_keys()), np.sort(ref.cached_keys()))
    # the claims beyond each request (1000 - 32, 1000 - 22) are counted apart
    assert st["rejected_excess"] - excess == 968 + 978


def test_policy_proposing_pages_not_cached():
    cache, keys, misses, st = run_test_policy("bad_not_cached", 8, 50)
    evictions = misses - 50
    assert st["evictions"] == st["fallback_evictions"] == evictions
    assert st["accepted"] == 0
    # each request: the last evicted folio (after the first eviction) and a
    # fake folio -- but only `request` (1) is looked at
    assert st["rejected_not_cached"] == evictions
    # fallback evicts the oldest page: FIFO
    assert misses == ref_misses("fifo", keys, 50)


def test_policy_proposing_nothing():
    cache, keys, misses, st = run_test_policy("bad_none", 9, 30)
    assert st["proposed"] == 0
    assert st["fallback_evictions"] == st["evictions"] == misses - 30
    assert st["requests"] == misses - 30
    assert misses == ref_misses("fifo", keys, 30)


def test_policy_proposing_too_many():
    cache, keys, misses, st = run_test_policy("bad_claims", 10, 30)
    assert st["requests"] == misses - 30
    # each request wants 1, gets a claim of 1000: 999 ignored
    assert st["rejected_excess"] == 999 * st["requests"]
    assert st["accepted"] == st["evictions"] == misses - 30
    assert st["fallback_evictions"] == 0
    assert misses == ref_misses("fifo", keys, 30)


def test_failing_init():
    load_test_policy("bad_init")
    with pytest.raises(UserError, match="init"):
        rt.Cache("bad_init", 10)
    cache = rt.Cache("lru", 10)
    cache.access(np.arange(20, dtype=np.uint64))
    with pytest.raises(UserError):
        cache.swap_policy("bad_init")
    # the old policy is back, with the cached pages
    assert cache.policy == "lru"
    assert cache.access(np.arange(10, 20, dtype=np.uint64)) == 0


# -- host behaviour --------------------------------------------------------

def test_lowering_capacity_reclaims_like_a_limit():
    cache = rt.Cache("lru", 100)
    cache.access(np.arange(100, dtype=np.uint64))
    cache.access(np.arange(50, dtype=np.uint64))      # 0..49 most recent
    cache.capacity_pages = 40
    assert cache.nr_cached == 40
    assert set(cache.cached_keys().tolist()) == set(range(10, 50))
    st = cache.stats
    assert st["requests"] == 2                          # 32 + 28 pages
    cache.capacity_pages = 80                           # raising evicts nothing
    assert cache.nr_cached == 40


def test_swap_policy_hands_pages_over_in_order():
    keys = stream(seed=11)
    cache = rt.Cache("lru", 80)
    cache.access(keys)
    before = cache.cached_keys()
    cache.swap_policy("fifo")
    assert cache.policy == "fifo"
    assert np.array_equal(cache.cached_keys(), before)
    # fifo now evicts in the handed-over (insertion) order
    new = np.arange(10**6, 10**6 + 20, dtype=np.uint64)
    cache.access(new)
    assert np.array_equal(cache.cached_keys(), np.concatenate([before[20:], new]))
    assert cache.stats["fallback_evictions"] == 0


def test_zero_capacity_caches_nothing():
    cache = rt.Cache("lru", 0)
    assert cache.access(np.array([1, 1, 1], np.uint64)) == 3
    assert cache.nr_cached == 0


# -- the linux policy ------------------------------------------------------

def test_linux_protects_pages_used_twice_from_a_scan():
    hot = np.arange(40, dtype=np.uint64)
    scan = np.arange(1000, 3000, dtype=np.uint64)   # read once each
    seq = np.concatenate([hot, hot, scan, hot])
    lx = rt.Cache("linux", 100)
    lru = rt.Cache("lru", 100)
    lx.access(seq[:-40])
    lru.access(seq[:-40])
    # active pages survive the one-pass scan, LRU loses them all
    assert lx.access(hot) == 0
    assert lru.access(hot) == 40


def test_linux_refault_activation():
    """A page evicted and read again within the active list's size enters
    the active list directly (and survives a scan); one refaulting from
    further away enters the inactive list (and does not)."""
    cap = 100
    hot = np.arange(40, dtype=np.uint64)
    warm = np.concatenate([hot, hot,                    # 40 active pages
                           np.arange(100, 200, dtype=np.uint64)])
    # 100..159 filled the inactive list, then 100..139 were evicted
    near = np.arange(130, 140, dtype=np.uint64)        # evicted last
    far = np.arange(100, 110, dtype=np.uint64)         # evicted first
    scan = np.arange(5000, 5100, dtype=np.uint64)
    for pages, survive in [(near, True), (far, False)]:
        lx = rt.Cache("linux", cap)
        lx.access(warm)
        assert lx.access(pages) == 10
        lx.access(scan)
        assert lx.access(pages) == (0 if survive else 10)
    lru = rt.Cache("lru", cap)
    lru.access(np.concatenate([warm, near, scan]))
    assert lru.access(near) == 10


def test_linux_list_balance():
    """Under steady reclaim the inactive list is not left shorter than the
    active one (inactive_is_low with ratio 1 below 1 GiB)."""
    keys = stream(n=30000, universe=3000, seed=12)
    lx = rt.Cache("linux", 500)
    lx.access(keys)
    st = lx.stats
    assert st["fallback_evictions"] == 0
    assert st["accepted"] == st["evictions"]


# -- input checking and loading ---------------------------------------------

def test_bad_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="unknown policy"):
        rt.Cache("no-such-policy", 10)
    with pytest.raises(UserError):
        rt.Cache("lru", 10).access(np.array([-1, 2]))
    with pytest.raises(UserError):
        rt.Cache("lru", 10).access(np.array([1, 2]), tids=np.array([1]))
    with pytest.raises(UserError):
        rt.full_mrc(np.arange(10), "lru", [5, 3])
    broken = tmp_path / "broken.bpf.c"
    broken.write_text('#include "cache_ext_policy.h"\nthis is not C;\n')
    with pytest.raises(UserError, match="does not compile") as err:
        rt.load_policy_source(str(broken))
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="no such"):
        rt.load_policy_source(str(tmp_path / "missing.bpf.c"))
    empty = tmp_path / "empty.bpf.c"
    empty.write_text('#include "cache_ext_policy.h"\nint x;\n')
    with pytest.raises(UserError, match="defines no policy"):
        rt.load_policy_source(str(empty))


def test_load_policy_source_of_a_shipped_policy(tmp_path, monkeypatch):
    """A policy file compiled on its own behaves exactly like the built-in
    build of the same file."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = Path(rt.REPO_ROOT) / "bpf" / "policies" / "mru.bpf.c"
    copy = tmp_path / "mru_copy.bpf.c"
    copy.write_text(src.read_text().replace("CP_POLICY(mru,", "CP_POLICY(mru_copy,"))
    assert rt.load_policy_source(str(copy)) == "mru_copy"
    assert list(tmp_path.glob("cachepilot/policies/*.so"))
    keys = stream(seed=13)
    assert rt.Cache("mru_copy", 64).access(keys) == rt.Cache("mru", 64).access(keys)


def test_shipped_policies_are_registered():
    assert {"fifo", "lru", "mru", "linux"} <= set(rt.available_policies())


def test_loaded_policies_never_replace_shipped_ones(tmp_path, monkeypatch):
    """Loading policies (tests, `policy check`) must not change what the
    rest of the process runs under a shipped name, nor the shipped list."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shipped = rt.available_policies()
    load_test_policy("bad_none")
    assert "bad_none" not in rt.available_policies()
    assert "bad_none" in rt.available_policies(include_loaded=True)
    # a file whose CP_POLICY name is a shipped one: mru's code named "lru"
    src = Path(rt.REPO_ROOT) / "bpf" / "policies" / "mru.bpf.c"
    clash = tmp_path / "lru_variant.bpf.c"
    clash.write_text(src.read_text().replace("CP_POLICY(mru,", "CP_POLICY(lru,"))
    name = rt.load_policy_source(str(clash))
    assert name == "lru@lru_variant"
    assert rt.available_policies() == shipped
    keys = stream(seed=14)
    assert rt.Cache("lru", 64).access(keys) == ref_misses("lru", keys, 64)
    variant = rt.Cache(name, 64)
    assert variant.policy == name
    assert variant.access(keys) == ref_misses("mru", keys, 64)


def test_caches_run_in_parallel_threads():
    """Batches run without the GIL; each thread has its own current
    instance, so concurrent caches give the results they give alone."""
    import threading
    keys = [stream(n=200_000, universe=5000, seed=s) for s in range(4)]
    alone = [rt.Cache("linux", 300).access(k) for k in keys]
    caches = [rt.Cache("linux", 300) for _ in keys]
    got = [None] * len(keys)

    def run(i):
        got[i] = sum(caches[i].access(part) for part in np.array_split(keys[i], 20))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(keys))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == alone


def test_linux_balance_follows_full_scale_size():
    """inactive_is_low keeps more pages active in caches of several GiB
    (ratio int_sqrt(10 * GiB)); a miniature cache standing for one
    (scale = 1/R, cp_full_pages) must balance like it, not like its own
    few pages."""
    hot = np.arange(700, dtype=np.uint64)
    scan = np.arange(10_000, 15_000, dtype=np.uint64)
    small = rt.Cache("linux", 1000)                  # 4 MB: ratio 1
    big = rt.Cache("linux", 1000, scale=1000)        # stands for ~3.8 GiB: ratio 5
    for c in (small, big):
        c.access(np.concatenate([hot, hot, scan]))
    assert small.access(hot) == 200                  # active cut to 500 of 1000
    assert big.access(hot) == 0


@pytest.mark.parametrize("gib", range(1, 13))
def test_linux_balance_ratio_is_int_sqrt_of_ten_gib(gib):
    """inactive_is_low's ratio is floor(sqrt(10 * GiB)) at every size (the
    policy's branch-free square root once gave 16 instead of 8 at 7 GiB).
    A hot set of 950 active pages in a full 1000-page cache, then a scan:
    reclaim deactivates active pages until inactive * ratio >= active, so
    ceil(1000 / (ratio + 1)) pages end up inactive and the scan flushes the
    hot pages among them."""
    hot = np.arange(950, dtype=np.uint64)
    scan = np.arange(10_000, 15_000, dtype=np.uint64)
    cache = rt.Cache("linux", 1000, scale=math.ceil(gib * (1 << 18) / 1000) + 1)
    cache.access(np.concatenate([hot, hot, scan]))
    ratio = math.isqrt(10 * gib)
    inactive = -(-1000 // (ratio + 1))
    assert cache.access(hot) == 950 - (1000 - inactive)


def test_swaps_between_policies_with_maps_keep_working():
    keys = stream(n=30_000, universe=2000, seed=15)
    cache = rt.Cache("lru", 300)
    for i, policy in enumerate(["linux", "mru", "linux", "fifo", "lru"]):
        cache.access(keys[i * 5000:(i + 1) * 5000])
        before = cache.cached_keys()
        cache.swap_policy(policy)
        assert cache.policy == policy
        assert np.array_equal(cache.cached_keys(), before)
    cache.access(keys[25_000:])
    st = cache.stats
    assert st["fallback_evictions"] == 0 and st["rejected_not_cached"] == 0
    assert st["cached"] == 300


def test_linux_refaults_deactivate_in_proportion():
    """Refault activations since the last reclaim make reclaim deactivate
    about request * active / inactive active pages even when the inactive
    list is not low.  Worked by hand from that rule (ratio 6 at ~4.6 GiB):
      A twice: 100 active.  B once: 20 inactive, B0..B19 evicted.
      B0 refaults (distance 21 <= 100): active 101, inactive 19.
      B1's reclaim: refault pending -> ceil(101/19) = 6 (A0..A5) deactivated;
      B1 refaults: active 96, inactive 24.
      The scan's first reclaim: ceil(96/24) = 4 more (A6..A9); afterwards
      inactive * 6 >= active, so nothing else; the scan flushes the inactive
      list, and exactly A0..A9 miss."""
    A = np.arange(100, dtype=np.uint64)
    B = np.arange(1000, 1040, dtype=np.uint64)
    S = np.arange(5000, 5200, dtype=np.uint64)
    lx = rt.Cache("linux", 120, scale=10_000)
    lx.access(np.concatenate([A, A, B]))
    assert lx.access(B[:2]) == 2
    lx.access(S)
    assert lx.access(A) == 10


def test_kernel_style_reclaim_batch():
    """reclaim_batch 32 frees 32 pages at once when the cache is full (the
    kernel's SWAP_CLUSTER_MAX), then inserts without reclaim until full."""
    cache = rt.Cache("fifo", 100)
    cache.reclaim_batch = 32
    cache.access(np.arange(100, dtype=np.uint64))
    cache.access(np.array([100], np.uint64))
    assert cache.nr_cached == 100 - 32 + 1
    assert cache.cached_keys()[0] == 32             # 0..31 went, oldest first
    cache.access(np.arange(101, 132, dtype=np.uint64))
    assert cache.nr_cached == 100 and cache.stats["requests"] == 1
    with pytest.raises(UserError):
        cache.reclaim_batch = 0


# -- capacity ----------------------------------------------------------------

# policies that keep an entry for every page they hold (mru keeps one only
# for pages not read yet)
PER_PAGE_STATE = ["get_scan", "hyperbolic", "lfu", "lhd", "linux", "mglru", "s3fifo"]


@pytest.mark.parametrize("policy", PER_PAGE_STATE + ["mru"])
def test_policy_maps_follow_the_cache_size(policy):
    cache = rt.Cache(policy, 300)
    cache.access(stream(seed=21, universe=2000))
    assert cache.stats["policy_capacity"] == 300
    cache.capacity_pages = 900
    cache.access(stream(seed=22, universe=2000))
    st = cache.stats
    assert st["policy_capacity"] == 900 and st["cached"] == 900
    assert st["policy_overflow"] == 0 and st["fallback_evictions"] == 0
    cache.capacity_pages = 100
    assert cache.stats["policy_capacity"] == 100


@pytest.mark.parametrize("policy", PER_PAGE_STATE)
def test_a_policy_without_room_for_every_page_counts_them_and_keeps_going(policy):
    """Maps sized for 250 pages in a cache of 1000 (a loader's capacity,
    then the limit raised): every page beyond the room is counted when it
    comes in, reclaim still goes through the policy, which evicts those
    pages where it looks first, and the cache keeps its size."""
    keys = stream(n=60000, universe=5000, seed=23)
    cramped = rt.Cache(policy, 1000, policy_capacity=250)
    misses = cramped.access(keys)
    st = cramped.stats
    assert st["policy_capacity"] == 250 and st["cached"] == 1000
    assert 1000 - 250 <= st["policy_overflow"] <= st["inserts"]
    assert st["fallback_evictions"] == 0
    assert st["accepted"] == st["evictions"] == misses - 1000
    roomy = rt.Cache(policy, 1000)
    roomy.access(keys)
    assert roomy.stats["policy_overflow"] == 0


def test_policy_capacity_must_be_positive():
    with pytest.raises(UserError, match="policy_capacity"):
        rt.Cache("lfu", 10, policy_capacity=0)
