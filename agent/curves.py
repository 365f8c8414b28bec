"""Per-cgroup curve builders for the agent.

The MRC engine's `MRCBuilder` (models/builder.py) is the builder of record:
SHARDS for the LRU curve plus one miniature simulation per (policy, size)
for every other policy.  When that module is not available (an older
checkout), the agent falls back to `LruShards` below, a small fixed-rate
SHARDS LRU builder with the SHARDS_adj correction, so a host still gets its
LRU curve.  Both take sampled page keys and the unsampled access count.
"""
from __future__ import annotations

import numpy as np

from cachepilot.agent.sampler import rate_for_threshold, threshold_for_rate
from cachepilot.models.mrc import MRC


class LruShards:
    """Fixed-rate SHARDS, LRU only: exact stack distances of the sampled
    keys (a Fenwick tree over last-access times), scaled by 1/R."""

    def __init__(self, rate: float, max_pages: int | None = None, points: int = 128):
        self.threshold = threshold_for_rate(rate)
        self.rate = rate_for_threshold(self.threshold)
        self.max_pages = max_pages
        self.points = points
        self._last: dict[int, int] = {}     # key -> time of its last access
        self._tree = np.zeros(1 << 16, dtype=np.int64)
        self._now = 0
        self._hist: dict[int, int] = {}     # sampled stack distance -> count
        self._cold = 0
        self._sampled = 0
        self._total = 0

    # Fenwick tree over access times: 1 where a time is some key's latest.
    def _add(self, i: int, v: int):
        tree, n = self._tree, len(self._tree)
        i += 1
        while i < n:
            tree[i] += v
            i += i & -i

    def _prefix(self, i: int) -> int:
        tree, s = self._tree, 0
        i += 1
        while i > 0:
            s += int(tree[i])
            i -= i & -i
        return s

    def _grow(self):
        # rebuild compactly: live times renumbered 0..k-1 in order
        items = sorted(self._last.items(), key=lambda kv: kv[1])
        size = 1 << max(16, (2 * len(items) + 1).bit_length())
        self._tree = np.zeros(size, dtype=np.int64)
        self._last = {}
        self._now = 0
        for key, _ in items:
            self._last[key] = self._now
            self._add(self._now, 1)
            self._now += 1

    def feed(self, keys, total_accesses=None, tids=None):
        keys = np.asarray(keys, dtype=np.uint64)
        self._total += int(total_accesses) if total_accesses is not None \
            else int(round(len(keys) / self.rate))
        hist, last = self._hist, self._last
        for key in keys.tolist():
            if self._now + 1 >= len(self._tree) - 1:
                self._grow()
            t = last.get(key)
            if t is None:
                self._cold += 1
            else:
                # distinct keys touched since t, this one included
                d = len(last) - self._prefix(t) + 1
                hist[d] = hist.get(d, 0) + 1
                self._add(t, -1)
            last[key] = self._now
            self._add(self._now, 1)
            self._now += 1
        self._sampled += len(keys)

    def end_window(self):
        pass

    def snapshot(self) -> list[MRC]:
        if self._sampled == 0:
            return []
        R = self.rate
        ds = np.array(sorted(self._hist), dtype=np.int64)
        counts = np.array([self._hist[d] for d in ds], dtype=np.float64)
        # SHARDS_adj: the sampled set's share of accesses differs from R by
        # chance; put the difference on the smallest distance.
        expected = self._total * R if self._total else self._sampled
        total = float(expected)
        adj = expected - self._sampled
        if len(counts):
            counts[0] += adj
        else:
            total = float(self._sampled)
        # a reuse at stack distance d hits in any cache of >= d / R pages
        sizes_all = np.maximum(1, np.round(ds / R)).astype(np.int64)
        hits = np.cumsum(counts)
        top = int(max(sizes_all[-1] if len(sizes_all) else 1,
                      round(len(self._last) / R)))
        if self.max_pages:
            top = min(top, self.max_pages)
        grid = np.unique(np.linspace(1, max(top, 2), self.points).astype(np.int64))
        idx = np.searchsorted(sizes_all, grid, side="right") - 1
        hit_at = np.where(idx >= 0, hits[np.clip(idx, 0, None)] if len(hits) else 0, 0)
        miss = np.clip(1.0 - hit_at / total, 0.0, 1.0)
        miss = np.minimum.accumulate(miss)
        return [MRC(grid, miss, "lru", "shards-fixed-rate", R,
                    {"sampled": self._sampled, "accesses": self._total,
                     "distinct_sampled": len(self._last)})]


def size_grid(max_pages: int, points: int = 48, min_pages: int = 256) -> np.ndarray:
    """Log-spaced cache sizes (pages) from 1 MiB to max_pages."""
    top = max(int(max_pages), min_pages + 1)
    return np.unique(np.round(np.geomspace(min_pages, top, points)).astype(np.int64))


def make_builder(policies=("lru",), *, rate: float, max_pages: int | None = None,
                 max_samples: int | None = None):
    """The engine's MRCBuilder when present, else the LRU-only fallback.
    An LRU-only builder sizes its curve by the pages it has seen; miniature
    simulations need a fixed grid, up to max_pages."""
    try:
        from cachepilot.models.builder import MRCBuilder
    except ImportError:
        if max_samples:
            raise ValueError("fixed-size sampling (max_samples) needs the MRC "
                             "engine's builder (models/builder.py)") from None
        return LruShards(rate, max_pages=max_pages)
    policies = tuple(policies)
    if policies == ("lru",):
        return MRCBuilder(policies, rate=rate, max_samples=max_samples)
    return MRCBuilder(policies, rate=rate, max_samples=max_samples,
                      sizes=size_grid(max_pages or _mem_total_pages()))


def _mem_total_pages() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 4
    return 1 << 20


def shift_by_anon(curve: MRC, anon_pages: int) -> MRC:
    """The curve against the limit an operator sets: a limit L leaves
    L - anon pages for the cache, so every size moves up by anon_pages."""
    if anon_pages <= 0:
        meta = dict(curve.meta, anon_offset_pages=0)
        return MRC(curve.sizes, curve.miss_ratio, curve.policy, curve.method,
                   curve.rate, meta)
    sizes = curve.sizes + int(anon_pages)
    meta = dict(curve.meta, anon_offset_pages=int(anon_pages))
    # a limit at or below the anonymous memory leaves no cache at all
    return MRC(np.concatenate(([int(anon_pages)], sizes)) if sizes[0] > anon_pages
               else sizes,
               np.concatenate(([1.0], curve.miss_ratio)) if sizes[0] > anon_pages
               else curve.miss_ratio,
               curve.policy, curve.method, curve.rate, meta)
