"""Many miss-ratio curves at once, as padded numpy matrices.

A decision round reads thousands of curves (1,000 tenants x 5 policies);
calling MRC.at / MRC.size_for on each would spend the round in Python.  A
CurveBank stacks them row by row so every question is one vectorised pass.

Each row is the curve with its implicit (0 pages, miss ratio 1.0) origin
prepended, made non-increasing (a larger cache never misses more -- the
same reading MRC.size_for uses), and padded to a common width by repeating
its last point.  Repeated points are harmless to every reader below.
"""
from __future__ import annotations

import numpy as np

from cachepilot.models.mrc import MRC

_EPS = 1e-12


class CurveBank:
    def __init__(self, curves: list[MRC]):
        n = len(curves)
        lens = np.fromiter((len(c.sizes) for c in curves), dtype=np.int64, count=n)
        width = int(lens.max()) + 1 if n else 1
        if n:
            flat_x = np.concatenate([c.sizes for c in curves]).astype(np.float64)
            flat_y = np.concatenate([c.miss_ratio for c in curves])
            starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
            cols = np.minimum(np.arange(width - 1)[None, :], (lens - 1)[:, None])
            idx = starts[:, None] + cols
            xs = np.empty((n, width))
            ys = np.empty((n, width))
            xs[:, 0], ys[:, 0] = 0.0, 1.0
            xs[:, 1:] = flat_x[idx]
            ys[:, 1:] = np.minimum(flat_y[idx], 1.0)
            np.minimum.accumulate(ys, axis=1, out=ys)
        else:
            xs = np.zeros((0, width))
            ys = np.ones((0, width))
        self.xs = xs            # pages, non-decreasing per row
        self.ys = ys            # miss ratio, non-increasing per row
        self.n = n

    @property
    def max_size(self) -> np.ndarray:
        return self.xs[:, -1]

    def rows(self, rows) -> "CurveBank":
        sub = CurveBank.__new__(CurveBank)
        sub.xs, sub.ys = self.xs[rows], self.ys[rows]
        sub.n = len(sub.xs)
        return sub


def miss_at(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Miss ratio of row i at size x[i] (pages), linear between points,
    flat beyond the last point."""
    width = xs.shape[1]
    x = np.asarray(x, dtype=np.float64)
    i = (xs <= x[:, None]).sum(axis=1) - 1
    i = np.clip(i, 0, width - 2)
    r = np.arange(len(xs))
    x0, x1 = xs[r, i], xs[r, i + 1]
    y0, y1 = ys[r, i], ys[r, i + 1]
    span = x1 - x0
    frac = np.where(span > 0, (x - x0) / np.where(span > 0, span, 1.0), 1.0)
    frac = np.clip(frac, 0.0, 1.0)
    return y0 + frac * (y1 - y0)


def size_for(xs: np.ndarray, ys: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least size (pages) at which row i's miss ratio is <= target[i]: the
    curve read backwards.  +inf where even the largest size misses more."""
    target = np.asarray(target, dtype=np.float64)
    ok = ys <= target[:, None] + _EPS
    reachable = ok[:, -1]
    i = np.argmax(ok, axis=1)
    r = np.arange(len(xs))
    prev = np.maximum(i - 1, 0)
    x0, x1 = xs[r, prev], xs[r, i]
    y0, y1 = ys[r, prev], ys[r, i]
    drop = y0 - y1
    frac = np.where(drop > 0, (y0 - target) / np.where(drop > 0, drop, 1.0), 1.0)
    out = np.where(i == 0, xs[:, 0], x0 + np.clip(frac, 0.0, 1.0) * (x1 - x0))
    return np.where(reachable, out, np.inf)
