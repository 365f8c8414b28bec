"""SHARDS: approximate LRU miss-ratio curves from a spatial sample.

A key is sampled when cp_hash64(key) < threshold (bpf/include/
cachepilot_hash.h, the same test the kernel sampler does), so a rate R keeps
a fixed set of ~R*M keys and every reference to them.  Stack distances among
sampled keys, divided by R, estimate the full distances (Waldspurger et al.,
"Efficient MRC Construction with SHARDS", FAST'15).

- fixed rate:  threshold = R * 2^64 for the whole run.
- fixed size:  at most S keys are tracked; a new key beyond S evicts the key
  with the largest hash, the threshold drops to that hash and the counts so
  far are rescaled by R_new / R_old.
- SHARDS_adj:  the sampled reference count should be N * R; the difference
  is added to the first histogram bin, which corrects the bias that a few
  hot sampled (or missed) keys cause.  With rescaling, N * R_current stays
  the right expectation in fixed-size mode too.
"""
from __future__ import annotations

import numpy as np

from cachepilot.models import _mrc
from cachepilot.models.exact import (as_keys, auto_sizes, check_sizes,
                                     hist_array, iter_chunks, miss_ratios)
from cachepilot.models.mrc import MRC

THRESHOLD_ALL = (1 << 64) - 1


def rate_threshold(rate: float) -> int:
    """Threshold for a sampling rate in (0, 1]; 1 samples every key."""
    rate = float(rate)
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sampling rate must be within (0, 1], not {rate}")
    if rate == 1.0:
        return THRESHOLD_ALL
    return max(1, min(THRESHOLD_ALL, int(rate * 2.0**64)))


def threshold_rate(threshold: int) -> float:
    return 1.0 if threshold >= THRESHOLD_ALL else threshold / 2.0**64


def hash64(keys):
    """cp_hash64 of an int or of every element of an array (native)."""
    if np.isscalar(keys) and not isinstance(keys, np.ndarray):
        return _mrc.hash64(int(keys))
    src = as_keys(keys)
    out = np.empty_like(src)
    _mrc.hash_into(src, out)
    return out


def sample_mask_index(keys, threshold: int) -> np.ndarray:
    """Indices of the keys with cp_hash64(key) < threshold."""
    return np.frombuffer(_mrc.sample_index(as_keys(keys), int(threshold)), np.uint64)


class Shards:
    """Streaming SHARDS.  Give `rate` (fixed rate), `max_samples` (fixed
    size, starting at rate 1 or at `rate` when both are given), or both."""

    def __init__(self, rate: float | None = None, max_samples: int | None = None,
                 adj: bool = True):
        if rate is None and max_samples is None:
            raise ValueError("SHARDS needs a rate or a max_samples bound")
        if max_samples is not None and int(max_samples) < 1:
            raise ValueError("max_samples must be at least 1")
        threshold = THRESHOLD_ALL if rate is None else rate_threshold(rate)
        self.max_samples = None if max_samples is None else int(max_samples)
        self.adj = adj
        self._sd = _mrc.StackDist(threshold=threshold, max_keys=self.max_samples or 0)
        self.accesses = 0          # unsampled references represented

    @property
    def threshold(self) -> int:
        return self._sd.threshold

    @property
    def rate(self) -> float:
        return threshold_rate(self._sd.threshold)

    @property
    def sampled_keys(self) -> int:
        return self._sd.live

    @property
    def unique_estimate(self) -> float:
        return self._sd.live / self.rate

    def feed(self, keys, total_accesses: int | None = None) -> None:
        """Keys (unsampled, or pre-sampled at a threshold >= ours: they are
        re-filtered).  total_accesses = the unsampled references the batch
        stands for; None = len(keys)."""
        keys = as_keys(keys)
        self._sd.feed(keys)
        self.accesses += len(keys) if total_accesses is None else total_accesses

    def take_histogram(self, reset: bool = False):
        """(histogram at the current rate, bin width in pages, rate, accesses);
        reset=True starts a new window (tracked keys stay)."""
        out = (hist_array(self._sd.hist(reset=reset)), self._sd.bin_pages,
               self.rate, self.accesses)
        if reset:
            self.accesses = 0
        return out

    def mrc(self, sizes=None) -> MRC:
        hist, bin_pages, rate, accesses = self.take_histogram()
        return curve_from_histogram(hist, bin_pages, rate, accesses, sizes,
                                    adj=self.adj, unique=self.unique_estimate,
                                    max_samples=self.max_samples)


def curve_from_histogram(hist, bin_pages, rate, accesses, sizes=None, *,
                         adj=True, unique=None, max_samples=None) -> MRC:
    sizes = auto_sizes(unique or 1) if sizes is None else check_sizes(sizes)
    extra = 0.0
    if adj and accesses:
        extra = accesses * rate - float(np.sum(hist))
    ratios = miss_ratios(hist, bin_pages, sizes, extra)
    meta = {"accesses": int(accesses), "sampled": float(np.sum(hist)),
            "adj": float(extra), "bin_pages": int(bin_pages)}
    if unique is not None:
        meta["unique_estimate"] = float(unique)
    if max_samples:
        meta["max_samples"] = int(max_samples)
    return MRC(sizes, ratios, "lru", "shards", float(rate), meta)


def shards_mrc(source, rate=None, max_samples=None, sizes=None, adj=True) -> MRC:
    """SHARDS LRU MRC of an array, a trace or an iterable of key chunks."""
    engine = Shards(rate, max_samples, adj)
    for chunk in iter_chunks(source):
        engine.feed(chunk)
    return engine.mrc(sizes)
