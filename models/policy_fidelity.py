"""The library's policies against libCacheSim's algorithms of the same name.

What the fidelity test (tests/test_policies_vs_libcachesim.py) and the
benchmark (experiments/bench_policies.py) share: which of our policies has a
twin in libCacheSim, the cache sizes a comparison runs at (fractions of a
trace's distinct pages, from 1 % to all of them: the whole range a cgroup's
limit can take), the tolerance, and a set of generated workloads.

The generated workloads are there so that agreement is not an accident of
the two shared traces: seeded mixes of the streams in models/generators.py
(skewed and flat popularity, scans that pollute a hot set, loops larger
than most sizes, phase changes, a key-value store's GETs beside scans).  No
policy constant was chosen by looking at them.  `long_workload` runs past
several of LHD's model reconfigurations (one per 2^20 accesses), which the
shared traces, both shorter, never reach.
"""
from __future__ import annotations

import numpy as np

from cachepilot.models import generators as gen
from cachepilot.models import runtime
from cachepilot.models.libcachesim_oracle import miss_ratios

FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0)
# ours -> libCacheSim's class
TWINS = {"lru": "LRU", "s3fifo": "S3FIFO", "lfu": "LFU", "lhd": "LHD",
         "hyperbolic": "Hyperbolic"}
TOLERANCE = 0.03


def sizes_for(keys, fractions=FRACTIONS) -> list[int]:
    """Cache sizes in pages: each fraction of the distinct keys, at least 1."""
    distinct = len(np.unique(np.asarray(keys, dtype=np.uint64)))
    return [max(1, round(f * distinct)) for f in fractions]


def compare(keys, policy: str, sizes) -> dict:
    """Full simulations of our `policy` and of its libCacheSim twin at each
    size: both curves, the difference and its largest magnitude."""
    ours = runtime.full_mrc(keys, policy, sizes).miss_ratio
    theirs = miss_ratios(keys, TWINS[policy], sizes)
    diff = ours - theirs
    worst = int(np.abs(diff).argmax())
    return {"sizes": [int(s) for s in sizes], "ours": ours.tolist(),
            "libcachesim": theirs.tolist(), "diff": diff.tolist(),
            "max_abs_diff": float(abs(diff[worst])), "worst_size": int(sizes[worst])}


def _keys(stream, n: int) -> np.ndarray:
    return gen.keys(stream, n)


def generated_workloads(accesses: int = 200_000) -> dict[str, np.ndarray]:
    """Seeded synthetic traces of `accesses` keys each, by name."""
    n = int(accesses)
    return {
        "zipf-0.8": _keys(gen.zipf(30_000, 0.8, seed=11), n),
        "zipf-1.1+scan": _keys(gen.mix([(gen.zipf(5_000, 1.1, seed=12), 0.6),
                                        (gen.scan(1, base=1 << 40), 0.4)], seed=12), n),
        "loop+zipf": _keys(gen.mix([(gen.loop(20_000), 0.5),
                                    (gen.zipf(20_000, 1.0, seed=13, base=1 << 40), 0.5)],
                                   seed=13), n),
        "phases": _keys(gen.phases([(gen.zipf(20_000, 0.9, seed=14), n // 3),
                                    (gen.uniform(40_000, seed=14, base=1 << 40), n // 3),
                                    (gen.loop(15_000, base=1 << 41), n)]), n),
        "get-scan": _keys(gen.get_scan(20_000, 1.0, scan_fraction=0.3, scan_pages=512,
                                       seed=15), n),
    }


def long_workload(accesses: int = 3_200_000) -> np.ndarray:
    """A hot set polluted by scans, long enough for LHD to learn (3
    reconfigurations at the default length)."""
    return _keys(gen.mix([(gen.zipf(25_000, 1.0, seed=16), 0.7),
                          (gen.scan(1, base=1 << 40), 0.3)], seed=16), accesses)
