"""Per-cgroup curve builders for the agent.

The MRC engine's `MRCBuilder` (models/builder.py) builds them: SHARDS for
the LRU curve plus one miniature simulation per (policy, size) for every
other policy, from sampled page keys and the unsampled access count.  This
module picks its size grid, moves curves from cache sizes to limits, and
observes the miss ratio of the threads a tenant's curves count.
"""
from __future__ import annotations

import numpy as np

from cachepilot.agent.sampler import (OP_ACCESS, OP_INSERT, rate_for_threshold,
                                      threshold_for_rate)
from cachepilot.models.mrc import MRC
from cachepilot.models.shards import counted_reads


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


class CountedMisses:
    """The observed miss ratio of the threads a tenant's curves count
    (`slo_threads`), over one report interval, from the sampler's records.

    The kernel counts a cgroup's reads and inserts, not whose they are;
    its sample says whose.  A sampled access record of a counted thread
    is one of its reads, and a sampled insert record one of its misses,
    both under the one key hash, so each scaled back by the rate they were
    sampled at estimates its whole count.  Their reads are counted as the
    curves count them (models/shards.counted_reads), so the controller's
    model, fitted on the observed ratio, reads the curves right."""

    def __init__(self):
        self.accesses = 0.0          # the cgroup's reads
        self.others = 0.0            # other threads' reads, scaled back
        self.counted = 0.0           # counted threads' reads, scaled back
        self.misses = 0.0            # counted threads' inserts, scaled back
        self.samples = 0             # counted threads' sampled reads
        self.lost = False            # insert records lost to a full ring

    def add(self, recs, tids, rate: float, accesses: int, insert_drops: int = 0) -> None:
        """One tick: its records (None: none), the counted threads (sorted
        uint32), the rate the records were sampled at, the cgroup's reads
        and the insert records lost in it."""
        self.accesses += accesses
        self.lost |= insert_drops > 0
        if recs is None or not len(recs) or not rate > 0:
            return
        mine = np.isin(recs["tid"], tids)
        access = recs["op"] == OP_ACCESS
        n_mine = int((access & mine).sum())
        self.samples += n_mine
        self.counted += n_mine / rate
        self.others += int((access & ~mine).sum()) / rate
        self.misses += int(((recs["op"] == OP_INSERT) & mine).sum()) / rate

    def miss_ratio(self) -> float | None:
        """Their miss ratio, or None where the interval cannot say (no read
        of theirs sampled, insert records lost)."""
        if not self.samples or self.lost:
            return None
        return min(1.0, self.misses / counted_reads(self.accesses, self.counted, self.others))
