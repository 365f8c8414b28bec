"""Seeded synthetic page-key generators.

Every generator is a stream: `next(n)` returns the next n keys as a numpy
uint64 array (GET-SCAN returns `(keys, tids)`), `chunks(total, chunk)`
iterates over a fixed number of keys, `take(n)` is `next(n)` by another
name.  The same seed gives the same stream.

    zipf(n_keys, skew)        popularity ~ 1 / rank^skew over n_keys keys,
                              ranks scattered over the key space
    uniform(n_keys)           every key equally likely
    scan(n_keys)              sequential, never re-reading: passes of n_keys
                              new keys each (a one-shot stream)
    loop(n_keys)              0, 1, ..., n_keys-1, 0, 1, ... (cyclic)
    get_scan(n_keys, skew, scan_fraction, scan_pages)
                              zipf GETs from one thread mixed with sequential
                              scan runs from another; tids mark which is which
    phases([(stream, n), ...])  stream 1 for n keys, then stream 2, ...
    mix([(stream, weight), ...])  each key from stream i with probability
                              weight_i / sum of weights, interleaved
    trace_stream(path)        a trace file replayed (looping) as a stream
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

GET_TID = 1001       # tid annotation of GET requests in get_scan
SCAN_TID = 2002      # tid annotation of the scan thread's requests


class KeyStream:
    """Base: subclasses implement _next(n) -> keys or (keys, tids)."""

    with_tids = False

    def next(self, n: int):
        n = int(n)
        if n < 0:
            raise ValueError("n must be non-negative")
        return self._next(n)

    take = next

    def chunks(self, total: int, chunk: int = 1 << 20) -> Iterator:
        left = int(total)
        while left > 0:
            k = min(chunk, left)
            left -= k
            yield self.next(k)

    def _next(self, n):
        raise NotImplementedError


def _check_keys(n_keys) -> int:
    n_keys = int(n_keys)
    if n_keys < 1:
        raise ValueError("n_keys must be at least 1")
    return n_keys


class Zipf(KeyStream):
    def __init__(self, n_keys: int, skew: float = 1.0, seed: int = 0, base: int = 0):
        self.n_keys = _check_keys(n_keys)
        if skew < 0:
            raise ValueError("zipf skew must be >= 0")
        self.skew = float(skew)
        self.rng = np.random.default_rng(seed)
        weights = np.arange(1, self.n_keys + 1, dtype=np.float64) ** -self.skew
        self.cdf = np.cumsum(weights)
        self.cdf /= self.cdf[-1]
        # Rank r is key perm[r]: popular keys are scattered, not adjacent.
        self.perm = self.rng.permutation(self.n_keys).astype(np.uint64) + np.uint64(base)

    def _next(self, n):
        ranks = np.searchsorted(self.cdf, self.rng.random(n), side="right")
        return self.perm[np.minimum(ranks, self.n_keys - 1)]


class Uniform(KeyStream):
    def __init__(self, n_keys: int, seed: int = 0, base: int = 0):
        self.n_keys = _check_keys(n_keys)
        self.base = base
        self.rng = np.random.default_rng(seed)

    def _next(self, n):
        return self.rng.integers(0, self.n_keys, n, dtype=np.uint64) + np.uint64(self.base)


class Scan(KeyStream):
    """Sequential pages that are never read again."""

    def __init__(self, n_keys: int, seed: int = 0, base: int = 0):
        self.n_keys = _check_keys(n_keys)
        self.pos = int(base)

    def _next(self, n):
        out = np.arange(self.pos, self.pos + n, dtype=np.uint64)
        self.pos += n
        return out


class Loop(KeyStream):
    """Cyclic pass over the same n_keys pages (LRU's worst case)."""

    def __init__(self, n_keys: int, seed: int = 0, base: int = 0):
        self.n_keys = _check_keys(n_keys)
        self.base = base
        self.pos = 0

    def _next(self, n):
        out = (np.arange(self.pos, self.pos + n, dtype=np.uint64) % np.uint64(self.n_keys)
               + np.uint64(self.base))
        self.pos = (self.pos + n) % self.n_keys
        return out


class GetScan(KeyStream):
    """A key-value store: zipf point GETs, and a scan thread reading runs of
    scan_pages sequential pages from a separate (scan_space-page) region at
    random starting points.  Each request is a scan request with probability
    scan_fraction; scan requests continue the current run in order."""

    with_tids = True

    def __init__(self, n_keys: int, skew: float = 1.0, scan_fraction: float = 0.3,
                 scan_pages: int = 1024, scan_space: int | None = None,
                 seed: int = 0, base: int = 0):
        if not 0.0 <= scan_fraction <= 1.0:
            raise ValueError("scan_fraction must be within [0, 1]")
        self.gets = Zipf(n_keys, skew, seed=seed, base=base)
        self.scan_fraction = float(scan_fraction)
        self.scan_pages = max(1, int(scan_pages))
        self.scan_space = max(self.scan_pages, int(scan_space or 10 * n_keys))
        self.scan_base = int(base) + int(n_keys)     # disjoint from GET keys
        self.rng = np.random.default_rng([seed, 1])
        self.scan_done = 0                  # scan requests issued so far
        self.run_start = 0

    def _scan_keys(self, k):
        out = np.empty(k, dtype=np.uint64)
        filled = 0
        while filled < k:
            offset = self.scan_done % self.scan_pages
            if offset == 0:
                self.run_start = int(self.rng.integers(0, self.scan_space - self.scan_pages + 1))
            m = min(k - filled, self.scan_pages - offset)
            first = self.scan_base + self.run_start + offset
            out[filled:filled + m] = np.arange(first, first + m, dtype=np.uint64)
            filled += m
            self.scan_done += m
        return out

    def _next(self, n):
        is_scan = self.rng.random(n) < self.scan_fraction
        keys = np.empty(n, dtype=np.uint64)
        keys[~is_scan] = self.gets.next(int(n - is_scan.sum()))
        keys[is_scan] = self._scan_keys(int(is_scan.sum()))
        tids = np.where(is_scan, SCAN_TID, GET_TID).astype(np.uint32)
        return keys, tids


class Phases(KeyStream):
    """Streams one after another: [(stream, n_keys), ...]; the last one
    goes on for ever.  Mixed tid/no-tid streams give tids (0 where absent)."""

    def __init__(self, parts):
        self.parts = [(s, int(n)) for s, n in parts]
        if not self.parts:
            raise ValueError("phases needs at least one (stream, n) pair")
        self.with_tids = any(s.with_tids for s, _ in self.parts)
        self.index = 0
        self.used = 0

    def _next(self, n):
        keys, tids = [], []
        while n > 0:
            stream, length = self.parts[self.index]
            last = self.index == len(self.parts) - 1
            k = n if last else min(n, length - self.used)
            out = stream.next(k)
            if isinstance(out, tuple):
                keys.append(out[0])
                tids.append(out[1])
            else:
                keys.append(out)
                tids.append(np.zeros(len(out), np.uint32))
            n -= k
            self.used += k
            if not last and self.used == length:
                self.index += 1
                self.used = 0
        k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        if not self.with_tids:
            return k
        return k, (np.concatenate(tids) if tids else np.zeros(0, np.uint32))


class Mix(KeyStream):
    """Streams interleaved at random: each key comes from stream i with
    probability weight_i / the sum of the weights, and each stream goes on
    where it left off.  Tids as in Phases."""

    def __init__(self, parts, seed: int = 0):
        self.streams = [s for s, _ in parts]
        weights = np.array([float(w) for _, w in parts], dtype=np.float64)
        if not len(weights) or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError("mix needs (stream, weight) pairs with positive total weight")
        self.cdf = np.cumsum(weights) / weights.sum()
        self.with_tids = any(s.with_tids for s in self.streams)
        self.rng = np.random.default_rng([seed, 2])

    def _next(self, n):
        which = np.searchsorted(self.cdf, self.rng.random(n), side="right")
        which = np.minimum(which, len(self.streams) - 1)
        keys = np.empty(n, dtype=np.uint64)
        tids = np.zeros(n, dtype=np.uint32)
        for i, stream in enumerate(self.streams):
            at = which == i
            out = stream.next(int(at.sum()))
            if isinstance(out, tuple):
                keys[at], tids[at] = out
            else:
                keys[at] = out
        return (keys, tids) if self.with_tids else keys


class TraceStream(KeyStream):
    """A trace replayed as a stream (from the start again when it ends),
    from its `skip`-th page access on."""

    def __init__(self, path, format: str | None = None, loop: bool = True, skip: int = 0):
        from cachepilot.models.traces import open_trace
        self.trace = open_trace(path, format)
        self.loop = loop
        self.with_tids = self.trace.format == "cpaccess"
        self._it = None
        self._buf_keys = np.zeros(0, np.uint64)
        self._buf_tids = np.zeros(0, np.uint32)
        self._skip = int(skip)

    def _refill(self):
        while True:
            if self._it is None:
                self._it = self.trace.chunks_with_tids()
            try:
                keys, tids = next(self._it)
            except StopIteration:
                self._it = None
                if not self.loop or self.trace.accesses == 0:
                    return False
                continue
            tids = np.zeros(len(keys), np.uint32) if tids is None else tids
            self._buf_keys = np.concatenate((self._buf_keys, keys))
            self._buf_tids = np.concatenate((self._buf_tids, tids))
            return True

    def _next(self, n):
        while self._skip:
            while not len(self._buf_keys) and self._refill():
                pass
            if not len(self._buf_keys):
                break
            drop = min(self._skip, len(self._buf_keys))
            self._buf_keys, self._buf_tids = self._buf_keys[drop:], self._buf_tids[drop:]
            self._skip -= drop
        while len(self._buf_keys) < n and self._refill():
            pass
        k, t = self._buf_keys[:n], self._buf_tids[:n]
        self._buf_keys, self._buf_tids = self._buf_keys[n:], self._buf_tids[n:]
        return (k, t) if self.with_tids else k


# -- the public constructors ---------------------------------------------------
def zipf(n_keys: int, skew: float = 1.0, seed: int = 0, base: int = 0) -> Zipf:
    return Zipf(n_keys, skew, seed, base)


def uniform(n_keys: int, seed: int = 0, base: int = 0) -> Uniform:
    return Uniform(n_keys, seed, base)


def scan(n_keys: int, seed: int = 0, base: int = 0) -> Scan:
    return Scan(n_keys, seed, base)


def loop(n_keys: int, seed: int = 0, base: int = 0) -> Loop:
    return Loop(n_keys, seed, base)


def get_scan(n_keys: int, skew: float = 1.0, scan_fraction: float = 0.3,
             scan_pages: int = 1024, scan_space: int | None = None,
             seed: int = 0, base: int = 0) -> GetScan:
    return GetScan(n_keys, skew, scan_fraction, scan_pages, scan_space, seed, base)


def phases(parts) -> Phases:
    return Phases(parts)


def mix(parts, seed: int = 0) -> Mix:
    return Mix(parts, seed)


def trace_stream(path, format: str | None = None, loop: bool = True,
                 skip: int = 0) -> TraceStream:
    return TraceStream(path, format, loop, skip)


def keys(stream: KeyStream, n: int) -> np.ndarray:
    """n keys of a stream as one array (tids dropped)."""
    out = stream.next(n)
    return out[0] if isinstance(out, tuple) else out
