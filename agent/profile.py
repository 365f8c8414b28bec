"""One-shot profiling of a running cgroup: watch it for a while, return its
curves and counters (`cachepilot profile`).

A warm-up period can be left out of the curve: misses add up, so the curve
of the measured period is the whole run's miss count minus the warm-up's,
over the measured accesses.  That is how an operator gets the steady-state
curve of a tenant that just started (its first touches are cold misses that
no cache size avoids, and they fade once it runs for long).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from cachepilot.agent import cgroups, mapped
from cachepilot.agent.curves import make_builder, shift_by_anon
from cachepilot.agent.sampler import (Counters, Sampler, SamplerUnavailable, access_batch,
                                      why_unavailable)
from cachepilot.models.mrc import MRC, PAGE_SIZE


@dataclass
class Profile:
    cgroup: str
    cgroup_id: int
    duration_s: float
    counters: Counters
    stats: cgroups.CgroupStats
    curves: list[MRC] = field(default_factory=list)      # cache-size curves
    limit_curves: list[MRC] = field(default_factory=list)  # shifted by what a limit keeps
    nonfile_peak_bytes: int = 0     # all non-file memory at its peak, every mapped page in
    offset_bytes: int = 0           # the part a limit keeps: mapped pages only if used
    floor_bytes: int = 0            # anonymous and shared memory: no reclaim frees it
    mapped_file_bytes: int = 0
    mapped_referenced_bytes: int = 0
    # the curves shifted by floor_bytes and by nonfile_peak_bytes: between
    # them lies the real miss ratio at a limit, whatever reclaim keeps
    band_low: list[MRC] = field(default_factory=list)
    band_high: list[MRC] = field(default_factory=list)

    def to_json(self) -> dict:
        c, s = self.counters, self.stats
        return {
            # the `cachepilot mrc` schema: curves (sizes in 4 KiB pages are
            # memory limits here), accesses, and what the counts mean
            "curves": [m.to_dict() for m in self.limit_curves],
            "accesses": c.accesses,
            "counts": ("accesses = 4 KiB page-cache page accesses of the cgroup "
                       "(miss-ratio denominator); curves: sizes are memory limits "
                       "in pages (cache plus the cgroup's non-file memory); "
                       "cache_curves: sizes are page-cache pages"),
            "cache_curves": [m.to_dict() for m in self.curves],
            # the same curves had the limit kept only what no reclaim frees
            # (low) or every non-file page (high): the band a limit's real
            # miss ratio falls in where the curve meets the non-file floor
            "band": {"low": [m.to_dict() for m in self.band_low],
                     "high": [m.to_dict() for m in self.band_high]},
            "nonfile": {
                "offset_bytes": self.offset_bytes,
                "floor_bytes": self.floor_bytes,
                "peak_bytes": self.nonfile_peak_bytes,
                "mapped_file_bytes": self.mapped_file_bytes,
                "mapped_referenced_bytes": self.mapped_referenced_bytes,
                "why": ("curves are shifted by offset_bytes: anonymous, kernel and "
                        "shared memory at their peak plus the mapped file pages the "
                        "cgroup's processes referenced while profiled; band.low by "
                        "floor_bytes (anonymous and shared memory alone), band.high "
                        "by peak_bytes (every mapped page, used or not)"),
            },
            "cgroup": {
                "path": self.cgroup, "id": self.cgroup_id,
                "version": s.version, "duration_s": self.duration_s,
                "accesses": c.accesses, "inserts": c.inserts, "removals": c.removals,
                "sampled": c.sampled, "drops": c.drops,
                "access_events": c.access_events, "insert_events": c.insert_events,
                "removal_events": c.removal_events,
                "miss_ratio": (c.inserts / c.accesses) if c.accesses else None,
                "limit_bytes": s.effective_limit_bytes, "usage_bytes": s.usage_bytes,
                "usage_file_bytes": s.file_bytes, "usage_anon_bytes": s.anon_bytes,
                "refaults": s.refaults, "nonfile_peak_bytes": self.nonfile_peak_bytes,
            },
        }


def subtract_window(total: list[MRC], total_n: int, early: list[MRC], early_n: int) -> list[MRC]:
    """Curves of the accesses after `early`, from cumulative snapshots."""
    if early_n <= 0 or not early:
        return total
    later_n = total_n - early_n
    if later_n <= 0:
        return []
    by_policy = {m.policy: m for m in early}
    out = []
    for m in total:
        e = by_policy.get(m.policy)
        if e is None:
            continue
        misses = m.miss_ratio * total_n - e.at(m.sizes) * early_n
        ratio = np.clip(misses / later_n, 0.0, 1.0)
        out.append(MRC(m.sizes, np.minimum.accumulate(ratio), m.policy,
                       m.method + "+window", m.rate, dict(m.meta, window_accesses=later_n)))
    return out


def profile_cgroup(path: str, duration_s: float, *, rate: float = 0.01,
                   warmup_s: float = 0.0, policies=("lru",), max_pages: int | None = None,
                   poll_s: float = 0.5, progress=None, sampler: Sampler | None = None,
                   until=None, warmup_until=None) -> Profile:
    """Watch `path` for warmup_s + duration_s seconds and build its curves.
    `warmup_until()` / `until()`, when given, end the warm-up / the run
    instead of the clock."""
    cgroups.version_of(path)
    cgid = cgroups.cgroup_id(path)
    own = sampler is None
    if own:
        reason = why_unavailable()
        if reason:
            raise SamplerUnavailable(reason)
        sampler = Sampler()
    try:
        builder = make_builder(policies, rate=rate, max_pages=max_pages)
        sampler.watch(cgid, int(builder.threshold))
        last_ns, snap = sampler.counters()
        base = snap.get(cgid, (0, Counters()))[1]
        sampler.drain()
        sampler.sketches()          # the first slice starts now
        last = base
        start = time.monotonic()
        early, early_n = None, 0
        fed = 0
        # the limit must hold the cgroup's non-file memory at its peak; of
        # its mapped file pages, only those its processes use (agent/mapped.py)
        first = cgroups.read_stats(path)
        nonfile_peak, unmapped_peak = first.nonfile_bytes, first.unmapped_nonfile_bytes
        floor_peak = first.anon_bytes + first.shmem_bytes
        mapped.clear_referenced(path)
        phase_end = start + warmup_s
        in_warmup = warmup_s > 0 or warmup_until is not None
        while True:
            now = time.monotonic()
            done = (now - start >= warmup_s + duration_s) if until is None \
                else (not in_warmup and until())
            time.sleep(0 if done else poll_s)
            now_ns, snap = sampler.counters()
            cur = snap.get(cgid, (0, last))[1]
            recs = sampler.drain(cgid).get(cgid)
            # each poll is one time slice of the "stack" estimator
            sketch = sampler.sketches().get(cgid)
            d = cur - last
            last = cur
            keys, _, positions = access_batch(recs, last_ns, now_ns, d.accesses)
            last_ns = now_ns
            builder.feed(keys, total_accesses=d.accesses, sketch=sketch, positions=positions)
            fed += d.accesses
            if int(builder.threshold) != sampler_threshold(snap, cgid):
                sampler.watch(cgid, int(builder.threshold))
            if in_warmup and (warmup_until() if warmup_until is not None
                              else time.monotonic() >= phase_end):
                early, early_n = builder.snapshot(), fed
                in_warmup = False
            try:
                now_stats = cgroups.read_stats(path)
                nonfile_peak = max(nonfile_peak, now_stats.nonfile_bytes)
                unmapped_peak = max(unmapped_peak, now_stats.unmapped_nonfile_bytes)
                floor_peak = max(floor_peak, now_stats.anon_bytes + now_stats.shmem_bytes)
            except cgroups.CgroupError:
                pass
            if progress:
                progress(time.monotonic() - start, cur - base, in_warmup)
            if done:
                break
        total = builder.snapshot()
        curves = subtract_window(total, fed, early, early_n) if early is not None else total
        stats = cgroups.read_stats(path)
        referenced = mapped.referenced_bytes(path)
        nonfile_peak = max(nonfile_peak, stats.nonfile_bytes)
        offset = min(nonfile_peak, max(unmapped_peak, stats.unmapped_nonfile_bytes)
                     + min(referenced, stats.mapped_file_bytes))
        floor = min(offset, max(floor_peak, stats.anon_bytes + stats.shmem_bytes))

        def shifted(by):
            return [shift_by_anon(c, by // PAGE_SIZE) for c in curves]
        return Profile(path, cgid, time.monotonic() - start, last - base, stats, curves,
                       shifted(offset), nonfile_peak, offset, floor,
                       stats.mapped_file_bytes, referenced, shifted(floor),
                       shifted(nonfile_peak))
    finally:
        try:
            sampler.unwatch(cgid)
        except SamplerUnavailable:
            pass
        if own:
            sampler.close()


def sampler_threshold(snap, cgid) -> int:
    entry = snap.get(cgid)
    return int(entry[0]) if entry else -1
