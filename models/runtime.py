"""The cache_ext policy runtime in user space, and the simulations built on it.

Every policy in ``bpf/policies/<name>.bpf.c`` is compiled natively into
``cachepilot.models._runtime`` through ``bpf/include/cache_ext_policy.h`` and
runs here exactly as its BPF build runs in the kernel: the runtime provides
the struct_ops callbacks' host and the eviction-list kfuncs, and drives
reclaim as the kernel does (batches of at most 32 candidates, every candidate
validated, fallback to the oldest page when a policy proposes too few).

- :class:`Cache`      one simulated memory cgroup with one policy instance.
- :func:`full_mrc`    the miss-ratio curve of a policy by full simulation.
- :class:`MiniSim`    miniature simulations (SHARDS-sampled stream at rate R,
                      cache of max(1, round(R*size)) pages) for many policies
                      and sizes at once, streaming.
- :func:`minisim_mrc` sample + miniature simulation in one pass.
- :func:`load_policy_source` compiles a policy file on its own (``cc -shared``)
                      into a cache directory, loads it and returns the name
                      it runs under (it never replaces a shipped policy).

Keys are 64-bit page keys (numpy uint64); tids, when given, are the reading
thread of each access (uint32) and are what the policy sees from
``bpf_get_current_pid_tgid()``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from cachepilot.core.errors import UserError
from cachepilot.models import _runtime, shards
from cachepilot.models.mrc import MRC
from cachepilot.models.mruchain import MRUChain

REPO_ROOT = Path(__file__).resolve().parents[1]
POLICY_INCLUDE = REPO_ROOT / "bpf" / "include"
# Flags for policies compiled on their own; they match setup.py's so a
# policy behaves the same built in or loaded.
POLICY_CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wno-unused-parameter",
                 "-fPIC", "-shared", "-fvisibility=hidden"]

STAT_NAMES = ("accesses", "hits", "misses", "inserts", "evictions",
              "admit_bypassed", "proposed", "accepted", "rejected_not_cached",
              "rejected_duplicate", "rejected_excess", "fallback_evictions",
              "requests", "policy_capacity", "policy_overflow",
              "counted_accesses", "counted_misses")


def available_policies(include_loaded: bool = False) -> list[str]:
    """Names of the shipped policies (bpf/policies, built into the
    runtime), sorted; with include_loaded, also those loaded later with
    load_policy_source."""
    return sorted(_runtime.policies(bool(include_loaded)))


def unknown_policy(names) -> str | None:
    """Why `names` are not all policies of the library ("unknown policy
    'arc'; known: ..."), or None.  For a config's policy lists, which are
    checked where they are read rather than where a curve is asked for."""
    known = set(available_policies())
    bad = [n for n in names if n not in known]
    if not bad:
        return None
    return f"unknown policy {bad[0]!r}; accepted: " + ", ".join(sorted(known))


def _check_policy(name: str) -> str:
    if not isinstance(name, str) or name not in _runtime.policies(True):
        raise UserError(f"unknown policy {name!r}; available: "
                        f"{', '.join(available_policies(True))}")
    return name


def _keys(keys) -> np.ndarray:
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise UserError("keys must be a 1-D array of page keys")
    if arr.dtype != np.uint64:
        if arr.size and arr.dtype.kind == "i" and arr.min() < 0:
            raise UserError("page keys must not be negative")
        if arr.size and arr.dtype.kind not in "iu":
            raise UserError("page keys must be integers")
        arr = arr.astype(np.uint64)
    return np.ascontiguousarray(arr)


# accesses a MiniSim logs to build its deferred caches from (13 bytes
# each at most: key, tid, counted flag); past them it builds them all
LOG_MAX_ACCESSES = 1 << 20

# bit 31 of a simulated access's tid: a thread in the policy's tid map
# (CP_TID_REGISTERED in the application-informed policies; kernel tids
# never have it)
TID_REGISTERED = 1 << 31


def mark_registered(tids: np.ndarray, registered: np.ndarray) -> np.ndarray:
    """A copy of `tids` (uint32, one per access) with TID_REGISTERED set on
    exactly the accesses of a tid in `registered` (sorted uint32)."""
    plain = np.asarray(tids, dtype=np.uint32) & np.uint32(TID_REGISTERED - 1)
    return np.where(np.isin(plain, registered), plain | np.uint32(TID_REGISTERED),
                    plain).astype(np.uint32)


def _tids(tids, n: int) -> np.ndarray | None:
    if tids is None:
        return None
    arr = np.ascontiguousarray(np.asarray(tids), dtype=np.uint32)
    if arr.shape != (n,):
        raise UserError(f"tids must have one entry per key ({n}), "
                        f"not shape {arr.shape}")
    return arr


def _counted(counted, n: int) -> np.ndarray | None:
    if counted is None:
        return None
    arr = np.ascontiguousarray(np.asarray(counted, dtype=bool)).view(np.uint8)
    if arr.shape != (n,):
        raise UserError(f"counted must have one entry per key ({n}), "
                        f"not shape {arr.shape}")
    return arr


def _sizes(sizes) -> np.ndarray:
    arr = np.asarray(sizes)
    if arr.ndim != 1 or arr.size == 0:
        raise UserError("sizes must be a non-empty list of page counts")
    if arr.dtype.kind not in "iu" and not np.all(arr == np.round(arr)):
        raise UserError("sizes must be whole page counts")
    arr = arr.astype(np.int64)
    if np.any(arr < 1) or np.any(np.diff(arr) <= 0):
        raise UserError("sizes must be positive and strictly increasing")
    return arr


def rate_threshold(rate: float) -> int:
    """SHARDS threshold for rate R in (0, 1]: keep keys with hash < R*2^64."""
    try:
        return shards.rate_threshold(rate)
    except ValueError as err:
        raise UserError(str(err)) from None


def sample(keys, rate: float, tids=None):
    """The SHARDS-sampled substream of keys (and tids) at `rate`."""
    keys = _keys(keys)
    tids = _tids(tids, len(keys))
    idx = np.frombuffer(_runtime.sample_index(keys, rate_threshold(rate)),
                        dtype=np.uint64)
    return keys[idx], (None if tids is None else tids[idx])


class Cache:
    """One simulated memory cgroup of `capacity_pages` pages whose eviction
    is driven by one instance of `policy`.

    One access: a hit calls folio_accessed; a miss asks admit_folio,
    reclaims if the cache is full (evict before insert), inserts, then
    calls folio_added and folio_accessed (the read that faults a page in
    marks it accessed, as in the kernel).  With fifo and lru this is
    exactly libCacheSim's FIFO and LRU."""

    def __init__(self, policy: str, capacity_pages: int, scale: float = 1.0,
                 policy_capacity: int | None = None):
        """`scale`: full-scale pages per page of this cache -- 1/R for a
        miniature simulation at rate R -- for policies whose rules depend on
        absolute sizes (cp_full_pages() in the policy header).
        `policy_capacity`: size the policy's per-page maps for this many
        pages for good, as a loader does for a cgroup whose limit is raised
        later; by default they follow the cache's capacity."""
        capacity = int(capacity_pages)
        if capacity < 0:
            raise UserError("capacity must not be negative")
        if not float(scale) > 0:
            raise UserError("scale must be positive")
        fixed = 0 if policy_capacity is None else int(policy_capacity)
        if fixed < 0 or (policy_capacity is not None and fixed == 0):
            raise UserError("policy_capacity must be a positive number of pages")
        try:
            self._c = _runtime.Cache(_check_policy(policy), capacity, float(scale), fixed)
        except ValueError as err:
            raise UserError(str(err)) from None

    def access(self, keys, tids=None, counted=None) -> int:
        """Run a batch of accesses; returns the misses among them.
        `counted` (one bool per key, default all): the accesses the
        counted_accesses and counted_misses stats count."""
        keys = _keys(keys)
        return self._c.access(keys, _tids(tids, len(keys)), _counted(counted, len(keys)))

    def miss_ratio(self, keys, tids=None, counted=None) -> float:
        """Run a batch of accesses; returns the miss ratio of those
        `counted` marks (every one without it, or where it marks none of
        the batch): a tenant's ratio when its throughput counts some
        threads' operations only.  Every access still moves the cache."""
        before = self.stats
        misses = self.access(keys, tids, counted)
        after = self.stats
        done = after["counted_accesses"] - before["counted_accesses"]
        if counted is None or not done:
            return misses / max(1, len(keys))
        return (after["counted_misses"] - before["counted_misses"]) / done

    @property
    def policy(self) -> str:
        return self._c.policy

    @property
    def capacity_pages(self) -> int:
        return self._c.capacity

    @capacity_pages.setter
    def capacity_pages(self, pages: int):
        pages = int(pages)
        if pages < 0:
            raise UserError("capacity must not be negative")
        # lowering it reclaims at once, as writing a memcg limit does
        self._c.capacity = pages

    @property
    def nr_cached(self) -> int:
        return self._c.nr_cached

    @property
    def reclaim_batch(self) -> int:
        """Least pages one reclaim frees when the cache is full: 1 (the
        default, libCacheSim's evict-one-to-insert-one), or the kernel's
        SWAP_CLUSTER_MAX = 32 for a memcg at its limit."""
        return self._c.reclaim_batch

    @reclaim_batch.setter
    def reclaim_batch(self, pages: int):
        try:
            self._c.reclaim_batch = int(pages)
        except ValueError as err:
            raise UserError(str(err)) from None

    def swap_policy(self, policy: str):
        """Live swap: a fresh instance of `policy` receives every cached page
        (folio_added, oldest first), as the kernel does on a link update.
        If the new policy's init fails, the old one is restarted and
        UserError is raised."""
        try:
            self._c.swap_policy(_check_policy(policy))
        except ValueError as err:
            raise UserError(str(err)) from None

    @property
    def stats(self) -> dict:
        """Counters since creation (see STAT_NAMES) plus `cached`.
        policy_capacity is the pages the policy's per-page maps are sized
        for (the cache's capacity, which they follow) and policy_overflow
        the pages it had no room for (cp_stats in the policy header)."""
        return self._c.stats()

    def cached_keys(self) -> np.ndarray:
        """Keys in the cache, oldest insertion first."""
        return np.frombuffer(self._c.cached_keys(), dtype=np.uint64).copy()

    def __repr__(self):
        return (f"Cache(policy={self.policy!r}, capacity_pages="
                f"{self.capacity_pages}, cached={self.nr_cached})")


def full_mrc(keys, policy: str, sizes, tids=None) -> MRC:
    """Miss-ratio curve of `policy` by simulating the whole stream at every
    size (method "full")."""
    _check_policy(policy)
    keys = _keys(keys)
    tids = _tids(tids, len(keys))
    sizes = _sizes(sizes)
    if len(keys) == 0:
        raise UserError("no accesses to simulate")
    ratios = []
    for size in sizes.tolist():
        cache = Cache(policy, size)
        ratios.append(cache.access(keys, tids) / len(keys))
    return MRC(sizes, np.array(ratios), policy, "full", 1.0,
               {"accesses": int(len(keys))})


def warm_miss_ratio(keys, tids, policy: str, pages, counted=None) -> float:
    """Miss ratio over the second half of the stream, the first half having
    warmed the cache: the steady state a tenant settles into.  `counted`
    (one bool per key): the ratio over those accesses only (every access
    still moves the cache; where it counts none of the second half, the
    ratio over every access there)."""
    half = len(keys) // 2
    cache = Cache(policy, max(1, int(pages)))
    cache.access(keys[:half], None if tids is None else tids[:half])
    return cache.miss_ratio(keys[half:], None if tids is None else tids[half:],
                            None if counted is None else np.asarray(counted, bool)[half:])


class MiniSim:
    """Streaming miniature simulations: one small cache per (policy, size),
    of max(1, round(rate*size)) pages, fed the SHARDS-sampled stream.
    Sizes that scale to the same miniature size share one simulation.

    Miss ratio estimate.  When the caller says how many accesses the full
    stream had (``feed(..., accesses=n)``, or :meth:`feed_unsampled`), the
    miniature misses are scaled back by 1/rate and divided by that count:
    this is the SHARDS_adj correction (Waldspurger et al., FAST'15), which
    removes most of the error that a few hot sampled keys cause.  Without
    the count it is sampled misses / sampled accesses
    (meta["estimator"] says which).

    MRU is the exception: its miniature is no model of the full cache (see
    models/mruchain.py), so while every batch came with the positions of
    its sampled keys in the full stream (:meth:`feed_unsampled` knows them;
    :meth:`feed` takes them as `positions`), MRU's curve is the chain
    model's (meta["estimator"] = "chain"); a batch without positions
    falls back to MRU's miniature for good.

    Registered threads.  An application-informed policy (get_scan,
    admit_filter) treats the threads in its tid map specially; in a
    simulation an access marked with CP_TID_REGISTERED (bit 31 of its tid)
    is such a thread's.  :meth:`register_threads` gives one policy its
    threads, as the agent writes the kernel policy's map: that policy's
    miniatures then see those threads' accesses marked, the others'
    unmarked.

    Deferred caches.  A cache whose policy has no admit_folio hook caches
    every miss and evicts only to make room, so until it first fills its
    hits are the stream's re-references, whatever the policy and size.
    Such a cache is built only once the stream's distinct keys are about
    to outgrow it: until then its counts are those (`_cold`), and it is
    built by replaying the batches fed so far (`_log`), which leaves it
    exactly as feeding it all along would have.  The sizes beyond what
    the stream has touched (most of a curve's at a high rate) so take no
    memory until they can make a difference.  The log is bounded: past
    LOG_MAX_ACCESSES every deferred cache is built.

    Counted threads.  A tenant's throughput may count some of its threads'
    operations only: a store's GETs, not the scan beside them.  After
    :meth:`count_threads` every access still moves every miniature cache,
    but the curves count the misses of those threads' accesses only, over
    those accesses in the full stream (see :meth:`curves`).  MRU's chain
    model counts every access."""

    def __init__(self, policies, sizes_pages, rate: float):
        if isinstance(policies, str):
            policies = [policies]
        self.policies = [_check_policy(p) for p in policies]
        if not self.policies:
            raise UserError("MiniSim needs at least one policy")
        self.sizes = _sizes(sizes_pages)
        self.rate = float(rate)
        self.threshold = rate_threshold(rate)
        self.mini_sizes = np.maximum(
            1, np.round(self.rate * self.sizes)).astype(np.int64)
        self._caches = {}      # (policy, mini size) -> Cache, once built
        self._deferred = []    # (policy, mini size) not built yet, smallest first
        for m in np.unique(self.mini_sizes).tolist():
            for p in self.policies:
                if _runtime.admits(p):
                    self._caches[(p, m)] = self._new_cache(p, m)
                else:
                    self._deferred.append((p, m))
        # stats at the window's start
        self._window = {k: None for k in [*self._caches, *self._deferred]}
        self._log = []         # batches fed while a cache is deferred
        self._logged = 0       # accesses in the log
        self._seen = np.empty(0, np.uint64)   # distinct keys in the log, sorted
        self._cold = dict.fromkeys(("accesses", "misses", "counted_accesses",
                                    "counted_misses"), 0)   # a deferred cache's stats
        self._registered: dict[str, np.ndarray] = {}   # policy -> sorted tids
        self._counted: np.ndarray | None = None         # None: every thread
        self.sampled = 0           # sampled accesses in the current window
        self.counted_sampled = 0   # ... of them by counted threads
        self.accesses = 0          # full-stream accesses, when told
        self.chain = MRUChain(self.sizes, self.rate) if "mru" in self.policies else None

    def feed(self, sampled_keys, tids=None, accesses: int | None = None,
             positions=None, repeats: int | None = None):
        """Feed keys that are already sampled (cp_hash64(key) < threshold).
        `accesses`: how many accesses of the full stream this batch stands
        for (sampled or not), for the scaled-back estimate.  `positions`:
        where among those accesses each sampled key was (increasing), and
        `repeats`: how many of them repeated the page of the access before
        -- what MRU's chain model needs (without positions MRU falls back
        to its miniature from here on)."""
        keys = _keys(sampled_keys)
        tids = _tids(tids, len(keys))
        if accesses is not None:
            if int(accesses) < len(keys):
                raise UserError("accesses must count at least the sampled keys")
        if self.chain is not None:
            if positions is None or accesses is None:
                self.chain = None
            else:
                try:
                    self.chain.feed(keys, positions, int(accesses), repeats)
                except ValueError as err:
                    raise UserError(str(err)) from None
        self._feed_caches(keys, tids, accesses)

    def register_threads(self, policy: str, tids) -> None:
        """The threads `policy`'s tid map holds from now on (an empty list
        clears it); a policy this MiniSim does not run is ignored."""
        arr = np.unique(np.asarray(list(tids), dtype=np.uint32))
        if len(arr):
            self._registered[policy] = arr
        else:
            self._registered.pop(policy, None)

    def count_threads(self, tids) -> None:
        """Count only these threads' accesses in the curves from now on;
        None or an empty list counts every access again (a rule that
        matches no thread yet must not leave the curves counting none)."""
        arr = None if tids is None else np.unique(np.asarray(list(tids), dtype=np.uint32))
        self._counted = arr if arr is not None and len(arr) else None

    @property
    def counting(self) -> bool:
        """True while the curves count some threads' accesses only."""
        return self._counted is not None

    def counts_threads(self, policy: str) -> bool:
        """Whether `policy`'s curve counts the named threads' accesses only
        (MRU's chain model counts every access)."""
        return self.counting and self.estimator(policy) != "chain"

    def _feed_caches(self, keys, tids, accesses):
        if accesses is not None:
            self.accesses += int(accesses)
        if len(keys) == 0:
            return
        marked = {}
        counted = None
        if tids is not None:
            for policy, reg in self._registered.items():
                marked[policy] = mark_registered(tids, reg)
            if self._counted is not None:
                plain = tids & np.uint32(TID_REGISTERED - 1)
                counted = np.isin(plain, self._counted).view(np.uint8)
        if self._deferred:
            self._defer(keys, marked, tids, counted)
        for (policy, _), cache in self._caches.items():
            # arguments already checked above
            cache._c.access(keys, marked.get(policy, tids), counted)
        self.sampled += len(keys)
        self.counted_sampled += len(keys) if counted is None else int(counted.sum())

    def feed_unsampled(self, keys, tids=None):
        """Sample the full stream at this MiniSim's rate, then feed it."""
        keys = _keys(keys)
        tids = _tids(tids, len(keys))
        idx = shards.sample_mask_index(keys, self.threshold)
        if self.chain is not None:
            self.chain.feed_unsampled(keys, self.threshold, idx)
        self._feed_caches(keys[idx], None if tids is None else tids[idx], len(keys))

    def reset_counts(self):
        """Start a new counting window; cache contents are kept."""
        for k, cache in self._caches.items():
            self._window[k] = cache.stats
        for k in self._deferred:
            self._window[k] = dict(self._cold)
        if self.chain is not None:
            self.chain.reset_counts()
        self.sampled = 0
        self.counted_sampled = 0
        self.accesses = 0

    def curves(self) -> list[MRC]:
        """One MRC per policy (in the order given), over the current window.
        An empty window gives miss ratio 1 everywhere, with
        meta["sampled_accesses"] = 0 saying so.  meta["est_accesses"] is
        the full stream's accesses the curve counts (the counted threads'
        share of it while counting), meta["est_misses"] their misses."""
        scaled = self.accesses > 0
        counted_full = self.accesses
        if self.counting:
            counted_full = shards.counted_reads(
                self.accesses, self.counted_sampled / self.rate,
                (self.sampled - self.counted_sampled) / self.rate)
        prefix = "counted_" if self.counting else ""
        out = []
        for p in self.policies:
            ratios = []
            misses_full = []
            for m in self.mini_sizes.tolist():
                cache = self._caches.get((p, m))
                st = cache.stats if cache is not None else self._cold
                st0 = self._window[(p, m)]
                acc = st[prefix + "accesses"] - (st0[prefix + "accesses"] if st0 else 0)
                miss = st[prefix + "misses"] - (st0[prefix + "misses"] if st0 else 0)
                if scaled:
                    ratios.append(min(1.0, miss / self.rate / counted_full)
                                  if counted_full > 0 else 1.0)
                else:
                    ratios.append(miss / acc if acc else 1.0)
                misses_full.append(miss / self.rate)
            estimator = self.estimator(p)
            est_accesses = counted_full
            if estimator == "chain":
                ratios = self.chain.miss_ratios().tolist()
                misses_full = [r * self.accesses for r in ratios]
                est_accesses = self.accesses
            meta = {"sampled_accesses": int(self.sampled),
                    "mini_sizes": self.mini_sizes.tolist(),
                    "est_misses": misses_full,
                    "est_accesses": float(est_accesses),
                    "counted": self.counts_threads(p),
                    "estimator": estimator}
            if scaled:
                meta["accesses"] = int(self.accesses)
            out.append(MRC(self.sizes, np.array(ratios), p, "minisim",
                           self.rate, meta))
        return out

    def estimator(self, policy: str) -> str:
        """How `policy`'s curve is estimated now: "chain" (MRU's chain
        model), "scaled" (miniature misses / R over all accesses) or
        "sampled" (miniature misses / sampled accesses)."""
        if policy == "mru" and self.chain is not None and self.sampled:
            return "chain"
        return "scaled" if self.accesses > 0 else "sampled"

    def caches(self) -> dict:
        """The miniature caches, keyed by (policy, miniature size)."""
        self._build(len(self._deferred))
        return dict(self._caches)

    def _new_cache(self, policy: str, mini_size: int) -> Cache:
        return Cache(policy, mini_size, scale=1.0 / self.rate)

    def _defer(self, keys, marked, tids, counted):
        """Before a batch reaches the caches: build the deferred caches it
        could fill (the distinct keys would outnumber their pages), and
        log and count the batch for the others."""
        uniq, first = np.unique(keys, return_index=True)
        new = np.isin(uniq, self._seen, assume_unique=True, invert=True)
        distinct = len(self._seen) + int(new.sum())
        if self._logged + len(keys) > LOG_MAX_ACCESSES:
            self._build(len(self._deferred))
        else:
            self._build(sum(1 for _, m in self._deferred if m < distinct))
        if not self._deferred:
            return
        self._log.append((keys, marked, tids, counted))
        self._logged += len(keys)
        self._seen = np.insert(self._seen, np.searchsorted(self._seen, uniq[new]), uniq[new])
        cold = first[new]          # the batch's first accesses to new keys: its misses
        self._cold["accesses"] += len(keys)
        self._cold["misses"] += len(cold)
        self._cold["counted_accesses"] += len(keys) if counted is None else int(counted.sum())
        self._cold["counted_misses"] += len(cold) if counted is None \
            else int(counted[cold].sum())

    def _build(self, n: int):
        """Build the n smallest deferred caches by replaying the log; with
        none left deferred, drop the log."""
        for policy, m in self._deferred[:n]:
            cache = self._new_cache(policy, m)
            for keys, marked, tids, counted in self._log:
                cache._c.access(keys, marked.get(policy, tids), counted)
            st = cache.stats
            assert all(st[k] == v for k, v in self._cold.items()), \
                f"{policy}: a deferred cache of {m} pages replayed other counts"
            self._caches[(policy, m)] = cache
        del self._deferred[:n]
        if not self._deferred:
            self._log, self._logged = [], 0
            self._seen = np.empty(0, np.uint64)


def minisim_mrc(keys, policies, sizes, rate: float, tids=None) -> list[MRC]:
    """Sample `keys` at `rate` and run the miniature simulations of every
    policy at every size in one pass (method "minisim")."""
    sim = MiniSim(policies, sizes, rate)
    keys = _keys(keys)
    if len(keys) == 0:
        raise UserError("no accesses to simulate")
    sim.feed_unsampled(keys, tids)
    return sim.curves()


# -- policies compiled on their own ----------------------------------------

def policy_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "cachepilot" / "policies"


def _compiler() -> str:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    raise UserError("no C compiler found (set CC)")


def compile_policy_source(path) -> Path:
    """Compile one policy file into a shared object in the cache directory
    (reused while the file, the header and the flags are unchanged)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such policy file")
    source = path.read_bytes()
    cc = _compiler()
    digest = hashlib.sha256()
    digest.update(source)
    for header in sorted(POLICY_INCLUDE.glob("*.h")):
        digest.update(header.read_bytes())
    digest.update(" ".join([cc] + POLICY_CFLAGS).encode())
    out_dir = policy_cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = path.name.split(".")[0] or "policy"
    out = out_dir / f"{stem}-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_out = Path(tmp) / out.name
        proc = subprocess.run(
            [cc, *POLICY_CFLAGS, "-I", str(POLICY_INCLUDE), "-o", str(tmp_out),
             str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
            lines = errors or proc.stderr.strip().splitlines() or ["?"]
            first = lines[0] if errors else lines[-1]
            raise UserError(f"{path}: does not compile: {first}")
        os.replace(tmp_out, out)
    return out


def load_policy_source(path: str) -> str:
    """Compile a policy file natively (``cc -shared -fPIC -I bpf/include``)
    into the cache directory (``$XDG_CACHE_HOME/cachepilot/policies``),
    load it into this process and return the name to use with Cache,
    full_mrc and MiniSim.

    That name is the file's CP_POLICY name, unless a shipped policy has it:
    shipped policies are never replaced, so e.g. a copy of lru.bpf.c loads
    as "lru@<file stem>".  Loading again under a name a loaded policy
    already has replaces it for caches created afterwards.  Loaded policies
    are not in available_policies() unless include_loaded=True."""
    so = compile_policy_source(path)
    tag = Path(path).name.split(".")[0] or "file"
    try:
        return _runtime.load_library(str(so), tag)
    except ValueError as err:
        raise UserError(str(err)) from None
