"""Many miss-ratio curves at once.

A decision round reads thousands of curves (1,000 tenants x 5 policies);
calling MRC.at / MRC.size_for on each would spend the round in Python.  A
CurveBank lays them end to end in flat arrays, each curve with its implicit
(0 pages, miss ratio 1.0) origin in front and made non-increasing (a larger
cache never misses more -- the same reading MRC.size_for uses).  Questions
about one point per curve are then a single searchsorted over keys that
keep the curves apart:

    reading forwards:  curve_id * SPAN + size       (sizes increase)
    reading backwards: curve_id * 4 + (1 - miss)    (miss ratios fall)

For the allocation, which walks all points of a few curves, `padded`
returns them as rows of equal width (the last point repeated).

A sampled curve's sizes are estimates: SHARDS at rate R counts about R x
of the pages within a reuse distance x, so x is known to a relative
sqrt((1 - R) / (R x)).  With `sigmas`, every point is read as if it
needed that many standard errors more memory (at most MAX_STRETCH more):
a cliff (a loop that fits) read at its estimated edge may buy nothing at
its real one.  That is a reading for buying memory; curves compared at
one size (which policy serves a tenant best) are read as measured
(`miss_at(..., raw=True)`).  Exact curves (R = 1) are read as they are.
"""
from __future__ import annotations

import numpy as np

from cachepilot.models.mrc import MRC

_EPS = 1e-11
MAX_STRETCH = 0.25


class CurveBank:
    def __init__(self, curves: list[MRC], sigmas: float = 0.0):
        n = len(curves)
        self.n = n
        self.curves = curves
        sizes = [c.sizes for c in curves]
        lens = np.fromiter(map(len, sizes), dtype=np.int64, count=n) + 1
        self.lens = lens
        self.start = np.zeros(n, dtype=np.int64)
        if n:
            self.start[1:] = np.cumsum(lens)[:-1]
        total = int(lens.sum())
        cid = np.repeat(np.arange(n), lens)
        origin = np.zeros(total, dtype=bool)
        origin[self.start] = True
        xs = np.zeros(total)
        ys = np.ones(total)
        rises = np.zeros(0, dtype=bool)
        if n:
            xs[~origin] = np.concatenate(sizes)
            if sigmas > 0:
                xs = _stretch(xs, origin, lens, curves, sigmas)
            ys[~origin] = np.minimum(np.concatenate([c.miss_ratio for c in curves]), 1.0)
            rises = np.diff(ys) > 0
            rises[self.start[1:] - 1] = False       # into the next curve's origin
            if rises.any():
                # Cumulative minimum within each curve: lift every curve above
                # the ones after it so one global accumulate stays segmented,
                # then take the (exact) original value at each running minimum.
                lifted = ys + 2.0 * (n - 1 - cid)
                at_min = lifted <= np.minimum.accumulate(lifted)
                ys = ys[np.maximum.accumulate(np.where(at_min, np.arange(total), 0))]
        self.xs, self.ys, self.cid = xs, ys, cid
        self.span = float(xs.max()) + 2.0 if total else 1.0
        self.fkey = cid * self.span + xs
        # the sizes as measured, for comparing curves at one size (miss_at
        # raw=True): stretching both of two curves reads them at a smaller
        # size than the one asked, where a loop that fits looks as if it
        # did not and a curve without a cliff wins on that alone
        self.xs_raw, self.fkey_raw = xs, self.fkey
        if n and sigmas > 0:
            self.xs_raw = np.zeros(total)
            self.xs_raw[~origin] = np.concatenate(sizes)
            self.fkey_raw = cid * self.span + self.xs_raw
        self.bkey = cid * 4.0 + (1.0 - ys)
        if rises.any():     # lifting may tie values closer than its rounding
            self.bkey = np.maximum.accumulate(self.bkey)

    def end(self, rows):
        return self.start[rows] + self.lens[rows] - 1

    def miss_at(self, rows: np.ndarray, x: np.ndarray, raw: bool = False) -> np.ndarray:
        """Miss ratio of curve rows[i] at size x[i] (pages); `raw`: on the
        sizes as measured, not stretched by their error."""
        xs, fkey = (self.xs_raw, self.fkey_raw) if raw else (self.xs, self.fkey)
        x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
        xq = np.minimum(x, self.span - 1.0)
        i = np.searchsorted(fkey, rows * self.span + xq, side="right") - 1
        j = np.minimum(i + 1, self.end(rows))
        x0, x1, y0, y1 = xs[i], xs[j], self.ys[i], self.ys[j]
        span = x1 - x0
        frac = np.where(span > 0, (x - x0) / np.where(span > 0, span, 1.0), 0.0)
        return y0 + np.clip(frac, 0.0, 1.0) * (y1 - y0)

    def size_for(self, rows: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Least size (pages) at which curve rows[i] misses <= target[i]:
        the curve read backwards; +inf where no size reaches it."""
        t = np.clip(np.asarray(target, dtype=np.float64), -1.0, 2.0)
        first, last = self.start[rows], self.end(rows)
        j = np.searchsorted(self.bkey, rows * 4.0 + (1.0 - t) - _EPS, side="left")
        reachable = j <= last
        j = np.minimum(j, last)
        i = np.maximum(j - 1, first)
        x0, x1, y0, y1 = self.xs[i], self.xs[j], self.ys[i], self.ys[j]
        drop = y0 - y1
        frac = np.where(drop > 0, (y0 - t) / np.where(drop > 0, drop, 1.0), 1.0)
        out = np.where(j == first, self.xs[first], x0 + np.clip(frac, 0.0, 1.0) * (x1 - x0))
        return np.where(reachable, out, np.inf)

    def padded(self, rows: np.ndarray):
        """(xs, ys) matrices, one row per curve in rows, equal width."""
        if len(rows) == 0:
            return np.zeros((0, 1)), np.ones((0, 1))
        lens = self.lens[rows]
        width = int(lens.max())
        idx = self.start[rows][:, None] + np.minimum(np.arange(width)[None, :],
                                                     (lens - 1)[:, None])
        return self.xs[idx], self.ys[idx]


def _stretch(xs, origin, lens, curves, sigmas):
    """Every sampled curve's sizes moved up by `sigmas` standard errors of
    their estimate (module doc); exact curves and origins stay."""
    rate = np.repeat(np.fromiter((min(max(c.rate, 1e-9), 1.0) for c in curves),
                                 dtype=np.float64, count=len(curves)), lens)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.sqrt((1.0 - rate) / (rate * np.maximum(xs, 1.0)))
    grow = np.where(origin, 0.0, np.minimum(sigmas * err, MAX_STRETCH))
    return xs * (1.0 + grow)


def miss_at(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Padded rows: miss ratio of row i at size x[i] (pages), linear between
    points, flat beyond the last point."""
    width = xs.shape[1]
    x = np.asarray(x, dtype=np.float64)
    i = (xs <= x[:, None]).sum(axis=1) - 1
    i = np.clip(i, 0, width - 2) if width > 1 else np.zeros_like(i)
    r = np.arange(len(xs))
    j = np.minimum(i + 1, width - 1)
    x0, x1 = xs[r, i], xs[r, j]
    y0, y1 = ys[r, i], ys[r, j]
    span = x1 - x0
    frac = np.where(span > 0, (x - x0) / np.where(span > 0, span, 1.0), 1.0)
    frac = np.clip(frac, 0.0, 1.0)
    return y0 + frac * (y1 - y0)
