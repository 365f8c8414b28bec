"""Exact LRU miss-ratio curves in one pass (Mattson stack distances).

The native core keeps, for every distinct key, the position of its latest
reference in a Fenwick tree; a re-reference's stack distance is one prefix
query, so a trace of N references over M distinct keys costs O(N log M) and
yields the miss ratio at every cache size at once.  The histogram helpers
here are shared with SHARDS (models/shards.py).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from cachepilot.core.errors import UserError
from cachepilot.models import _mrc
from cachepilot.models.mrc import MRC

AUTO_POINTS = 50


def as_keys(keys) -> np.ndarray:
    """A C-contiguous uint64 view/copy of keys (what the native core reads)."""
    arr = np.asarray(keys)
    if arr.dtype != np.uint64:
        if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
            raise ValueError("keys must be non-negative integers")
        if arr.dtype.kind not in "iub" and arr.size:
            raise ValueError(f"keys must be integers, not {arr.dtype}")
        arr = arr.astype(np.uint64)
    return np.ascontiguousarray(arr.reshape(-1))


def iter_chunks(source) -> Iterable[np.ndarray]:
    """Key chunks from an array, a trace (`.chunks()`) or an iterable of arrays."""
    if hasattr(source, "chunks") and callable(source.chunks):
        return source.chunks()
    if isinstance(source, np.ndarray) or (isinstance(source, (list, tuple))
                                         and (not source or np.isscalar(source[0]))):
        return [as_keys(source)]
    return source


def auto_sizes(unique: int, points: int = AUTO_POINTS) -> np.ndarray:
    """~`points` log-spaced sizes from 1 % to 100 % of the unique pages,
    plus a sparser log grid from one page up to 1 % (the full range)."""
    top = max(1, int(unique))
    low = max(1.0, top / 100.0)
    grid = [np.geomspace(low, top, points)]
    if low > 1:
        grid.append(np.geomspace(1, low, 10))
    sizes = np.unique(np.round(np.concatenate(grid)).astype(np.int64))
    return sizes[sizes >= 1]


def check_sizes(sizes) -> np.ndarray:
    sizes = np.unique(np.asarray(sizes, dtype=np.int64).reshape(-1))
    if len(sizes) == 0:
        raise ValueError("at least one cache size is needed")
    if sizes[0] < 0:
        raise ValueError("cache sizes must be non-negative")
    return sizes


def parse_sizes(text: str | None) -> np.ndarray | None:
    """Cache sizes a user wrote (--sizes): comma-separated page counts of
    at least 1, in increasing order; None for "auto" or nothing given (the
    command picks its own)."""
    if text is None or not text.strip() or text.strip().lower() == "auto":
        return None
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--sizes takes 'auto' or comma-separated page counts, "
                        f"not {text!r}") from None
    if not sizes or sizes[0] < 1 or sizes != sorted(set(sizes)):
        raise UserError("--sizes needs page counts of at least 1 in increasing order "
                        "(or 'auto')")
    return np.array(sizes, dtype=np.int64)


def hist_array(raw: bytes) -> np.ndarray:
    """The native histogram: index 0 = first references, b >= 1 = bin b."""
    return np.frombuffer(raw, np.float64).copy()


def coarsen(hist: np.ndarray, factor: int) -> np.ndarray:
    """Re-bin a histogram to bins `factor` (a power of two) times wider."""
    if factor == 1:
        return hist
    bins = hist[1:]
    idx = (np.arange(1, len(bins) + 1) + factor - 1) // factor
    out = np.zeros(int(idx[-1]) + 1 if len(idx) else 1)
    out[0] = hist[0]
    np.add.at(out, idx, bins)
    return out


def miss_ratios(hist: np.ndarray, bin_pages: int, sizes: np.ndarray,
                extra_hits: float = 0.0) -> np.ndarray:
    """Miss ratio at each size from a distance histogram.  A reference in bin
    b (scaled distance in ((b-1)w, bw]) hits every cache of >= b*w pages.
    `extra_hits` (the SHARDS_adj correction) joins the first bin."""
    cold, bins = float(hist[0]), hist[1:]
    cum = np.concatenate(([0.0], np.cumsum(bins)))
    total = cold + cum[-1] + extra_hits
    if total <= 0:
        return np.ones(len(sizes))
    b = np.minimum(np.asarray(sizes) // int(bin_pages), len(bins))
    hits = cum[b] + np.where(b >= 1, extra_hits, 0.0)
    return np.clip(1.0 - hits / total, 0.0, 1.0)


class ExactLRU:
    """Streaming exact LRU MRC: feed key chunks, read the curve at any time."""

    def __init__(self):
        self._sd = _mrc.StackDist(exact=True)

    def feed(self, keys) -> None:
        self._sd.feed(as_keys(keys))

    @property
    def accesses(self) -> int:
        return self._sd.seen

    @property
    def unique(self) -> int:
        return self._sd.live

    def histogram(self) -> np.ndarray:
        """Counts by stack distance: [first references, d=1, d=2, ...]."""
        return hist_array(self._sd.hist())

    def mrc(self, sizes=None) -> MRC:
        """The curve at `sizes` (pages); None = every size 1..unique."""
        sizes = (np.arange(1, max(1, self.unique) + 1) if sizes is None
                 else check_sizes(sizes))
        ratios = miss_ratios(self.histogram(), 1, sizes)
        return MRC(sizes, ratios, "lru", "exact", 1.0,
                   {"accesses": self.accesses, "unique": self.unique})


def exact_lru_mrc(source, sizes=None) -> MRC:
    """Exact LRU MRC of an array, a trace or an iterable of key chunks."""
    engine = ExactLRU()
    for chunk in iter_chunks(source):
        engine.feed(chunk)
    return engine.mrc(sizes)


COLD = np.iinfo(np.int64).max     # stack_distances' mark of a first reference


def stack_distances(keys, progress=None) -> np.ndarray:
    """Exact LRU stack distance of every reference (distinct other keys since
    the key's previous reference; COLD for a first reference): a cache of C
    pages hits a reference exactly when its distance is below C.  Plain
    Python over a Fenwick tree of last-occurrence positions, about 1 us a
    reference: a reference for studies, not the engine's fast path."""
    keys = as_keys(keys)
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, ids = np.unique(keys, return_inverse=True)
    last = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    tree = [0] * (n + 1)                # Fenwick over positions 1..n
    out = np.empty(n, dtype=np.int64)
    live = 0                            # marked positions: one per key seen
    for t, k in enumerate(ids.tolist()):
        p = int(last[k])
        if p < 0:
            out[t] = COLD
            live += 1
        else:
            # marked positions after p = keys referenced since p
            i, before = p + 1, 0
            while i > 0:
                before += tree[i]
                i -= i & -i
            out[t] = live - before
            i = p + 1
            while i <= n:
                tree[i] -= 1
                i += i & -i
        i = t + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
        last[k] = t
        if progress and t % 200_000 == 0:
            progress(t, n)
    return out


def misses_from_distances(dist, sizes, denominator: float) -> np.ndarray:
    """Misses at each cache size among references with these stack
    distances (a reference misses when its distance is at least the size),
    over `denominator`."""
    d = np.sort(np.asarray(dist))
    hits = np.searchsorted(d, np.asarray(sizes), side="left")    # distances < size
    return (len(d) - hits) / denominator
