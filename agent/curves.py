"""Per-cgroup curve builders for the agent.

The MRC engine's `MRCBuilder` (models/builder.py) builds them: SHARDS for
the LRU curve plus one miniature simulation per (policy, size) for every
other policy, from sampled page keys and the unsampled access count.  This
module picks its size grid and moves curves from cache sizes to limits.
"""
from __future__ import annotations

import numpy as np

from cachepilot.agent.sampler import rate_for_threshold, threshold_for_rate
from cachepilot.models.mrc import MRC


def size_grid(max_pages: int, points: int = 48, min_pages: int = 256) -> np.ndarray:
    """Log-spaced cache sizes (pages) from 1 MiB to max_pages."""
    top = max(int(max_pages), min_pages + 1)
    return np.unique(np.round(np.geomspace(min_pages, top, points)).astype(np.int64))


def make_builder(policies=("lru",), *, rate: float, max_pages: int | None = None,
                 max_samples: int | None = None, counted: bool = False):
    """The engine's MRCBuilder for `policies`.  An LRU-only builder sizes its
    curve by the pages it has seen; miniature simulations need a fixed grid,
    up to max_pages (default: the host's memory).  `counted`: its curves
    may count some threads' reads only (MRCBuilder.count_threads)."""
    from cachepilot.models.builder import MRCBuilder
    policies = tuple(policies)
    if policies == ("lru",) and not counted:
        return MRCBuilder(policies, rate=rate, max_samples=max_samples)
    return MRCBuilder(policies, rate=rate, max_samples=max_samples,
                      sizes=size_grid(max_pages or _mem_total_pages()), counted=counted)


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
