#!/usr/bin/env python3
"""The policy library against libCacheSim, side by side in one run.

For every library policy with a libCacheSim algorithm of the same name
(s3fifo, lfu, lhd, hyperbolic; lru as the control), a full simulation of
our kernel-style policy (the same source the kernel runs, through the
native runtime) and of libCacheSim's algorithm at the same sizes on the
CloudPhysics sample; prints both curves, their difference at each size and
the time each took, and writes experiments/results/bench_policies.json and
bench_policies.png.  The policies without a libCacheSim twin (mglru,
get_scan, admit_filter, linux, mru, fifo) are simulated too, for the plot.

    .venv/bin/python experiments/bench_policies.py [--trace PATH]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from cachepilot.models import runtime
from cachepilot.models.libcachesim_oracle import miss_ratios

HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = HERE.parents[1] / "shared" / "traces" / "cloudphysics.txt"
RESULTS = HERE / "results"
SIZES = [500, 1000, 2500, 5000, 10000]
TWINS = {"lru": "LRU", "s3fifo": "S3FIFO", "lfu": "LFU", "lhd": "LHD",
         "hyperbolic": "Hyperbolic"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    args = ap.parse_args()
    keys = np.loadtxt(args.trace, dtype=np.uint64)
    result = {"trace": Path(args.trace).name, "accesses": int(len(keys)),
              "distinct": int(len(np.unique(keys))), "sizes": SIZES,
              "policies": {}}
    print(f"{result['trace']}: {len(keys)} accesses, {result['distinct']} "
          f"distinct pages; sizes {SIZES}")
    for ours in runtime.available_policies():
        t0 = time.process_time()
        curve = runtime.full_mrc(keys, ours, SIZES).miss_ratio
        t_ours = time.process_time() - t0
        entry = {"miss_ratio": curve.tolist(), "cpu_s": t_ours}
        line = f"{ours:>12}: " + " ".join(f"{m:.4f}" for m in curve)
        if ours in TWINS:
            t0 = time.process_time()
            theirs = miss_ratios(keys, TWINS[ours], SIZES)
            t_theirs = time.process_time() - t0
            diff = curve - theirs
            entry.update(libcachesim=TWINS[ours],
                         libcachesim_miss_ratio=theirs.tolist(),
                         diff=diff.tolist(),
                         max_abs_diff=float(np.abs(diff).max()),
                         libcachesim_cpu_s=t_theirs)
            line += (f"  | libCacheSim {TWINS[ours]}: " +
                     " ".join(f"{m:.4f}" for m in theirs) +
                     f"  | max |diff| {np.abs(diff).max():.4f}"
                     f"  | time ratio {t_theirs / max(t_ours, 1e-9):.1f}x")
        print(line)
        result["policies"][ours] = entry
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_policies.json").write_text(json.dumps(result, indent=2))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (name, e) in enumerate(sorted(result["policies"].items())):
        color = plt.cm.tab20(i % 20)
        ax.plot(SIZES, e["miss_ratio"], "-o", color=color, label=name, ms=3)
        if "libcachesim_miss_ratio" in e:
            ax.plot(SIZES, e["libcachesim_miss_ratio"], "--x", color=color,
                    label=f"libCacheSim {e['libcachesim']}", ms=4)
    ax.set_xscale("log")
    ax.set_xlabel("cache size (4 KiB pages)")
    ax.set_ylabel("miss ratio")
    ax.set_title(f"policy library vs libCacheSim, {result['trace']} "
                 "(solid: ours, dashed: libCacheSim)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "bench_policies.png", dpi=120)
    print(f"wrote {RESULTS / 'bench_policies.json'} and bench_policies.png")


if __name__ == "__main__":
    main()
