"""The miss-ratio curve type shared by every part of cachepilot.

Sizes are in 4 KiB pages, strictly increasing; miss ratios are in [0, 1].
A curve is a step/piecewise-linear function of cache size: between points
it is interpolated linearly, below the first point it is 1.0 at size 0,
beyond the last point it stays at the last value.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

PAGE_SIZE = 4096


def curve_fault(sizes: np.ndarray, miss_ratio: np.ndarray) -> str | None:
    """Why int64 `sizes` and float64 `miss_ratio` are not a curve, or None:
    the rules every MRC keeps, in array operations (a report brings dozens
    of curves)."""
    if sizes.ndim != 1 or sizes.shape != miss_ratio.shape:
        return "sizes and miss ratios must be 1-D and equally long"
    if len(sizes) == 0:
        return "a curve needs at least one point"
    if (sizes[1:] <= sizes[:-1]).any():
        return "sizes are not strictly increasing"
    if sizes[0] < 0:
        return "sizes must be non-negative"
    # NaN fails both comparisons, and so does either infinity one of them
    bad = ~((miss_ratio >= 0.0) & (miss_ratio <= 1.0 + 1e-9))
    if bad.any():
        return (f"miss ratio {float(miss_ratio[bad][0])!r}: miss ratios must be finite "
                "and within [0, 1]")
    return None


@dataclass
class MRC:
    sizes: np.ndarray              # pages, int64, increasing
    miss_ratio: np.ndarray         # float64, same length
    policy: str = "lru"
    method: str = "exact"
    rate: float = 1.0
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.sizes = np.asarray(self.sizes, dtype=np.int64)
        self.miss_ratio = np.asarray(self.miss_ratio, dtype=np.float64)
        why = curve_fault(self.sizes, self.miss_ratio)
        if why is not None:
            raise ValueError(why)

    @classmethod
    def checked(cls, sizes: np.ndarray, miss_ratio: np.ndarray, policy: str = "lru",
                method: str = "exact", rate: float = 1.0, meta: dict | None = None) -> "MRC":
        """A curve from int64 sizes and float64 miss ratios that its caller
        has checked with curve_fault (protocol/wire.py, for every curve of
        every report a controller takes, which says which curve was bad)."""
        c = cls.__new__(cls)
        c.sizes, c.miss_ratio, c.policy, c.method, c.rate = sizes, miss_ratio, policy, \
            method, rate
        c.meta = {} if meta is None else meta
        return c

    # -- reading the curve -------------------------------------------------
    def _points(self):
        """The curve with its implicit (0, 1.0) origin point."""
        if self.sizes[0] > 0:
            return (np.concatenate(([0], self.sizes)),
                    np.concatenate(([1.0], self.miss_ratio)))
        return self.sizes, self.miss_ratio

    def at(self, size_pages):
        """Miss ratio at one size or an array of sizes (pages)."""
        xs, ys = self._points()
        return np.interp(size_pages, xs, ys)

    def at_bytes(self, size_bytes):
        return self.at(np.asarray(size_bytes, dtype=np.float64) / PAGE_SIZE)

    def size_for(self, miss_ratio: float) -> float | None:
        """Least size (pages) whose miss ratio is <= miss_ratio, reading the
        curve backwards; None when even the largest size does not reach it."""
        xs, ys = self._points()
        # Make it non-increasing so "least size" is well defined.
        ys = np.minimum.accumulate(ys)
        if ys[-1] > miss_ratio + 1e-12:
            return None
        if ys[0] <= miss_ratio:
            return float(xs[0])
        i = int(np.argmax(ys <= miss_ratio + 1e-12))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if y0 == y1:
            return float(x1)
        return float(x0 + (y0 - miss_ratio) * (x1 - x0) / (y0 - y1))

    def convex_hull(self) -> "MRC":
        """Lower convex hull (Talus): the curve a partitioned cache can reach."""
        xs, ys = self._points()
        ys = np.minimum.accumulate(ys)
        hull = []
        for p in zip(xs.tolist(), ys.tolist()):
            while len(hull) >= 2:
                (x1, y1), (x2, y2) = hull[-2], hull[-1]
                # drop the middle point if it lies on or above the chord
                if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):
                    hull.pop()
                else:
                    break
            hull.append(p)
        hx = np.array([h[0] for h in hull], dtype=np.int64)
        hy = np.array([h[1] for h in hull])
        keep = hx >= self.sizes[0]
        sizes, ratios = hx[keep], hy[keep]
        if len(sizes) == 0 or sizes[0] != self.sizes[0]:
            sizes = np.concatenate(([self.sizes[0]], sizes))
            ratios = np.concatenate(([np.interp(self.sizes[0], hx, hy)], ratios))
        return MRC(sizes, ratios, self.policy, self.method + "+hull",
                   self.rate, dict(self.meta))

    # -- serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        d = {"policy": self.policy, "method": self.method, "rate": self.rate,
             "sizes": self.sizes.tolist(),
             "miss_ratio": [round(float(v), 12) for v in self.miss_ratio]}
        if self.meta:
            d["meta"] = self.meta
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MRC":
        try:
            return cls(np.asarray(d["sizes"]), np.asarray(d["miss_ratio"], dtype=float),
                       str(d.get("policy", "lru")), str(d.get("method", "exact")),
                       float(d.get("rate", 1.0)), dict(d.get("meta", {})))
        except KeyError as err:
            raise ValueError(f"curve is missing the key {err.args[0]!r}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "MRC":
        return cls.from_dict(json.loads(text))

    def __repr__(self):
        return (f"MRC(policy={self.policy!r}, method={self.method!r}, "
                f"rate={self.rate}, points={len(self.sizes)})")
