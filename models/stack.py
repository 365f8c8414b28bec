"""The "stack" SHARDS estimator: the sample, post-stratified by a stack of
distinct-key sketches of time slices.

At a low rate a SHARDS sample holds few keys, and which keys it drew
decides much of the curve (experiments/study_shards_floor.py).  The kernel
sampler and the native core already put every reference, sampled or not,
into a HyperLogLog sketch.  With one sketch per time slice, the union
counts of runs of slices say, without sampling error, how many re-uses
fall between any two slices and between which bounds their distances lie;
the sample is left to say only where inside those brackets the distances
fall, per lag between the slices.  That makes it the default estimator at
a fixed rate (models/estimators.py).

More slices narrow the brackets, but the union counts of S slices cost
O(S * registers) (models/native/mrc/hllstack.c), so at most MAX_SLICES are
kept, neighbours merging in pairs when full.  The agent's builder keeps
slices across windows, each with a counting weight (Slices).

The derivation, the estimate (stack_misses) and why it is the default:
docs/internals.md#models-stack.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from cachepilot.models import _mrc, hll

MAX_SLICES = 128           # kept slices (64..128 after a merge)
FIRST_SLICE_REFS = 256     # references of a trace's first automatic slices
COLD_SLICE = 0xFFFFFFFF    # a record's previous slice for a first reference

RECORD_DTYPE = np.dtype([("prev", "<u4"), ("slice", "<u4"), ("between", "<u8")])


def as_records(raw) -> np.ndarray:
    """Records from the native core's bytes (or an array already)."""
    if isinstance(raw, np.ndarray):
        return raw.astype(RECORD_DTYPE, copy=False)
    return np.frombuffer(raw, RECORD_DTYPE)


@dataclass
class Slices:
    """Closed time slices, oldest first: one sketch each (S x registers),
    the references each stands for, the first slice number each covers
    (records name slices by number), and how much each slice's references
    count in the curve (1 = fully; 0 = history only: its keys still bound
    later distances)."""
    sketches: np.ndarray
    accesses: np.ndarray
    first: np.ndarray
    weight: np.ndarray

    def __post_init__(self):
        self.sketches = np.ascontiguousarray(self.sketches, dtype=np.uint8)
        if self.sketches.ndim != 2 or self.sketches.shape[1] != hll.REGISTERS:
            raise ValueError(f"slices need sketches of {hll.REGISTERS} registers")
        n = len(self.sketches)
        self.accesses = np.asarray(self.accesses, dtype=np.float64).reshape(n)
        self.first = np.asarray(self.first, dtype=np.int64).reshape(n)
        self.weight = np.asarray(self.weight, dtype=np.float64).reshape(n)
        if n and np.any(np.diff(self.first) <= 0):
            raise ValueError("slice numbers must increase")

    def __len__(self) -> int:
        return len(self.sketches)

    @functools.cached_property
    def distinct(self) -> float:
        """Distinct keys of all the slices."""
        return hll.estimate(self.sketches.max(axis=0)) if len(self) else 0.0

    @classmethod
    def empty(cls) -> "Slices":
        return cls(np.zeros((0, hll.REGISTERS), np.uint8), [], [], [])

    @classmethod
    def concat(cls, parts) -> "Slices":
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        return cls(np.concatenate([p.sketches for p in parts]),
                   np.concatenate([p.accesses for p in parts]),
                   np.concatenate([p.first for p in parts]),
                   np.concatenate([p.weight for p in parts]))

    def weighted(self, factor: float) -> "Slices":
        return Slices(self.sketches, self.accesses, self.first, self.weight * factor)

    def coarsen(self, max_slices: int = MAX_SLICES) -> "Slices":
        """At most max_slices: every run of equal weight (a window's
        slices) is halved, neighbours merging in pairs (register maximum,
        a run's odd one out staying), until few enough; a window's
        references keep their own counting weight."""
        out = self
        while len(out) > max_slices:
            w = out.weight
            n = len(out)
            # pair k = slices 2k, 2k+1 of a run; a run's odd one out stays
            starts = np.flatnonzero(np.concatenate(([True], w[1:] != w[:-1])))
            run_pos = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
            group = np.cumsum(run_pos % 2 == 0) - 1
            if group[-1] == n - 1:
                break                   # every run is one slice long
            heads = np.flatnonzero(run_pos % 2 == 0)
            pair = np.append(group[1:] == group[:-1], False)[heads]  # has a partner
            sketches = out.sketches[heads]
            sketches[pair] = np.maximum(sketches[pair], out.sketches[heads[pair] + 1])
            out = Slices(sketches, np.add.reduceat(out.accesses, heads),
                         out.first[heads], out.weight[heads])
        return out

    def union_counts(self) -> np.ndarray:
        """C[i, j] = distinct keys of slices i..j (i <= j), 0 below."""
        s = len(self)
        if s == 0:
            return np.zeros((0, 0))
        raw = _mrc.hll_union_matrix(self.sketches, s)
        return np.frombuffer(raw, np.float64).reshape(s, s)



def sampled_keys(slices: Slices, records: np.ndarray) -> int:
    """Distinct sampled keys of the slices: references in them whose
    previous one is older than the first slice (or absent)."""
    rec = as_records(records)
    if not len(slices) or not len(rec):
        return 0
    inside = rec["slice"].astype(np.int64) >= slices.first[0]
    older = (rec["prev"] == COLD_SLICE) | (rec["prev"].astype(np.int64) < slices.first[0])
    return int(np.count_nonzero(inside & older))


def lag_class(lag):
    """Lags 0, 1, 2, 3 are classes of their own, then one class per
    power of two (4-7, 8-15, ...)."""
    lag = np.asarray(lag, dtype=np.int64)
    return np.where(lag < 4, lag,
                    2 + np.floor(np.log2(np.maximum(lag, 1))).astype(np.int64))


@functools.lru_cache(maxsize=8)
def _pairs(s: int):
    """Slice pairs i < j of s slices and their lag classes."""
    i, j = np.triu_indices(s, k=1)
    return i, j, lag_class(j - i)


def _bracket(C: np.ndarray, i: np.ndarray, j: np.ndarray):
    """Where the reuse distance of a key last seen in slice i and seen again
    in slice j >= i lies: at least the keys of the slices strictly between
    (none when i + 1 >= j), below all keys of slices i..j."""
    s = len(C)
    low = np.where(i + 1 < j, C[np.minimum(i + 1, s - 1), np.maximum(j - 1, 0)], 0.0)
    return low, C[i, j]


def _strata(C: np.ndarray, accesses: np.ndarray, weight: np.ndarray):
    """What the counts say, as strata of references: (references, bracket
    low, bracket high, lag class) for every slice pair i < j and for re-use
    within each slice, weighted by the later slice's counting weight; and
    the weighted first references."""
    s = len(C)
    i, j, cls = _pairs(s)
    diag = np.diag(C)
    nxt = np.minimum(i + 1, s - 1)
    new_i = C[i, j] - C[i, j - 1]              # keys of j not in slices i..j-1
    new_next = np.where(i + 1 < j, C[nxt, j] - C[nxt, j - 1], diag[j])
    first = diag.copy()                        # keys of j not in slices 0..j-1
    first[1:] = C[0, 1:] - C[0, :-1]
    refs = np.concatenate(((new_next - new_i) * weight[j],
                           np.maximum(accesses - diag, 0.0) * weight))
    within = np.arange(s)
    low, high = (np.concatenate(pair) for pair in zip(_bracket(C, i, j),
                                                       _bracket(C, within, within)))
    classes = np.concatenate((cls, np.zeros(s, np.int64)))
    return refs, low, np.maximum(high, low), classes, float(np.dot(first, weight))


class _Shapes:
    """Where distances fall inside their brackets, per lag class: the
    weighted empirical distribution of the sample's u, as P(u >= x).  A
    class the sample never saw spreads evenly over its bracket, except lag
    0, whose references the sample missed are hits (lag0_scale = the
    sample's lag-0 re-uses over the count's)."""

    def __init__(self, cls, u, w, n_classes: int, lag0_scale: float):
        order = np.lexsort((u, cls))
        # class c's values laid in [2c, 2c + 1]: one search serves them all
        self.key = cls[order] * 2.0 + u[order]
        self.cum = np.concatenate(([0.0], np.cumsum(w[order])))
        self.start = np.searchsorted(self.key, 2.0 * np.arange(n_classes + 1))
        self.total = self.cum[self.start[1:]] - self.cum[self.start[:-1]]
        self.lag0_scale = lag0_scale

    def survival(self, cls: np.ndarray, x: np.ndarray) -> np.ndarray:
        """P(u >= x) for x in (0, 1) of each class."""
        total = self.total[cls]
        below = (self.cum[np.searchsorted(self.key, cls * 2.0 + x, side="left")]
                 - self.cum[self.start[cls]])
        p = np.where(total > 0, 1.0 - below / np.where(total > 0, total, 1.0),
                     np.where(cls == 0, 0.0, 1.0 - x))
        lag0 = cls == 0
        p[lag0] = np.minimum(1.0, p[lag0] * self.lag0_scale)
        return p


def stack_misses(slices: Slices, records: np.ndarray, key_rate: float,
                 sizes) -> tuple[np.ndarray, float, dict]:
    """Estimated misses at each size (pages, increasing) among the
    references of the counted slices, those references' count, and facts
    for the curve's meta.  `records` are the sampled references
    (RECORD_DTYPE, slice numbers), `key_rate` the realised R'.

    With C(i, j) the distinct keys of slices i..j, N(i, j) the keys of
    slice j last seen in slice i, x(c) a size's place in that pair's
    bracket and P_lag the sample's distribution of places per lag class
    (_Shapes), each reference weighted by its slice's counting weight:

        misses(c) = sum over j of [first references
                                   + sum over i < j of N(i, j) P_lag(u >= x(c))
                                   + (refs(j) - C(j, j)) P_0(u >= c / C(j, j))]

    A reference whose previous one is older than the kept slices joins the
    first references' count, split from them by the sample's share of such
    re-uses, with the sample's own distances.  The derivation:
    docs/internals.md#models-stack."""
    sizes = np.asarray(sizes, dtype=np.float64)
    n_sizes = len(sizes)
    s = len(slices)
    if s == 0 or not key_rate > 0:
        raise ValueError("the stack estimator needs slices and a key rate")
    C = slices.union_counts()
    refs, low, high, classes, new_keys = _strata(C, slices.accesses, slices.weight)
    w = slices.weight

    # --- the sample: each record's slices, bracket and place in it
    rec = as_records(records)
    col = np.searchsorted(slices.first, rec["slice"].astype(np.int64), side="right") - 1
    rec, col = rec[col >= 0], col[col >= 0]
    first_ref = rec["prev"] == COLD_SLICE
    prev = np.searchsorted(slices.first, rec["prev"].astype(np.int64), side="right") - 1
    beyond = ~first_ref & (prev < 0)
    reuse = ~first_ref & ~beyond
    rw = w[col]
    dist = rec["between"].astype(np.float64) / key_rate
    ri, rj = prev[reuse], col[reuse]
    lo, hi = _bracket(C, ri, rj)
    width = hi - lo
    u = np.clip((dist[reuse] - lo) / np.where(width > 0, width, np.inf), 0.0, 1.0)
    rcls = lag_class(rj - ri)
    uw = rw[reuse]
    found = float(refs[classes == 0].sum())
    lag0 = float(uw[rcls == 0].sum()) / key_rate
    shapes = _Shapes(rcls, u, uw, int(classes.max()) + 1,
                     lag0 / found if found > 0 else 1.0)

    # --- the strata: sizes at or below a bracket's low end miss, those at
    # or above its high end (every key of the two slices and those between)
    # hit, those inside as the shape says
    a = np.searchsorted(sizes, low, side="right")
    b = np.maximum(a, np.searchsorted(sizes, high, side="left"))
    misses = np.zeros(n_sizes + 1)
    misses[0] = refs.sum()
    misses -= np.bincount(a, weights=refs, minlength=n_sizes + 1)
    misses = np.cumsum(misses)[:n_sizes]
    span = b - a
    inside = int(span.sum())
    if inside:
        sid = np.repeat(np.arange(len(refs)), span)
        idx = np.arange(inside) - np.repeat(np.cumsum(span) - span, span) + a[sid]
        x = (sizes[idx] - low[sid]) / (high[sid] - low[sid])
        p = shapes.survival(classes[sid], x)
        misses += np.bincount(idx, weights=refs[sid] * p, minlength=n_sizes)

    # --- first references, and re-uses older than the kept slices
    n_first = float(rw[first_ref].sum())
    n_beyond = float(rw[beyond].sum())
    share = n_beyond / (n_first + n_beyond) if n_beyond > 0 else 0.0
    misses += new_keys * (1.0 - share)
    if share > 0:
        order = np.argsort(dist[beyond], kind="stable")
        d = dist[beyond][order]
        cum = np.concatenate(([0.0], np.cumsum(rw[beyond][order])))
        misses += new_keys * share * (1.0 - cum[np.searchsorted(d, sizes, side="left")] / cum[-1])

    # counts carry a little sketch noise; a curve never rises
    misses = np.minimum.accumulate(np.maximum(misses, 0.0))
    meta = {"slices": s, "within_slice_scale": shapes.lag0_scale,
            "sampled_reuses": int(reuse.sum()), "beyond_share": share}
    return misses, float(np.dot(w, slices.accesses)), meta
