#!/usr/bin/env python3
"""The policy library against libCacheSim, side by side in one run, and
each policy's simulation speed.

Fidelity: for every library policy with a libCacheSim algorithm of the
same name (s3fifo, lfu, lhd, hyperbolic; lru as the control), a full
simulation of our kernel-style policy (the same source the kernel runs,
through the native runtime) and of libCacheSim's algorithm at 12 sizes
from 1 % to 100 % of the trace's distinct pages, on each shared trace
found; prints both curves and the largest difference per policy and trace.
The policies without a twin are simulated too, for the plot.

Speed: every policy's full simulation of a miss-heavy stream (uniform
over four times the cache) at 65,536 pages, a 256 MiB cgroup, in accesses
per second of CPU time, and its ratio to fifo's.

Writes experiments/results/bench_policies.json and bench_policies.png.

    .venv/bin/python experiments/bench_policies.py [--trace PATH ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cachepilot.models import runtime
from cachepilot.models.libcachesim_oracle import miss_ratios
from cachepilot.models.traces.readers import read_keys

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "traces"
DEFAULT_TRACES = [SHARED / "cloudphysics.txt", SHARED / "OLTP.lis.zst"]
RESULTS = HERE / "results"
FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0)
TWINS = {"lru": "LRU", "s3fifo": "S3FIFO", "lfu": "LFU", "lhd": "LHD",
         "hyperbolic": "Hyperbolic"}
SPEED_PAGES = 65_536
SPEED_ACCESSES = 2_000_000


def fidelity(path: Path) -> dict:
    """Both curves of every policy at the 12 sizes of one trace."""
    keys = read_keys(path)
    distinct = int(len(np.unique(keys)))
    sizes = [max(1, round(f * distinct)) for f in FRACTIONS]
    out = {"trace": path.name, "accesses": int(len(keys)), "distinct": distinct,
           "sizes": sizes, "policies": {}}
    print(f"{path.name}: {len(keys)} accesses, {distinct} distinct pages; sizes {sizes}")
    for ours in runtime.available_policies():
        curve = runtime.full_mrc(keys, ours, sizes).miss_ratio
        entry = {"miss_ratio": curve.tolist()}
        line = f"{ours:>12}: " + " ".join(f"{m:.3f}" for m in curve)
        if ours in TWINS:
            theirs = miss_ratios(keys, TWINS[ours], sizes)
            diff = curve - theirs
            worst = int(np.abs(diff).argmax())
            entry.update(libcachesim=TWINS[ours], libcachesim_miss_ratio=theirs.tolist(),
                         diff=diff.tolist(), max_abs_diff=float(abs(diff[worst])),
                         worst_size=sizes[worst])
            line += (f"\n{'libCacheSim':>12}: " + " ".join(f"{m:.3f}" for m in theirs) +
                     f"   max |diff| {abs(diff[worst]):.4f} at {sizes[worst]} pages")
        print(line, flush=True)
        out["policies"][ours] = entry
    return out


def speed() -> dict:
    """Accesses per CPU second of a full simulation at SPEED_PAGES pages of
    a uniform stream over four times as many: three misses in four."""
    keys = np.random.default_rng(1).integers(0, 4 * SPEED_PAGES, SPEED_ACCESSES,
                                             dtype=np.uint64)
    out = {}
    for name in runtime.available_policies():
        cache = runtime.Cache(name, SPEED_PAGES)
        t0 = time.process_time()
        cache.access(keys)
        cpu = time.process_time() - t0
        s = cache.stats
        out[name] = {"accesses_per_s": SPEED_ACCESSES / cpu,
                     "miss_ratio": s["misses"] / s["accesses"],
                     "fallback_evictions": s["fallback_evictions"]}
    fifo = out["fifo"]["accesses_per_s"]
    print(f"\nfull simulation at {SPEED_PAGES} pages, {SPEED_ACCESSES} uniform accesses "
          f"over {4 * SPEED_PAGES} pages:")
    for name, e in sorted(out.items(), key=lambda kv: -kv[1]["accesses_per_s"]):
        e["ratio_to_fifo"] = e["accesses_per_s"] / fifo
        print(f"{name:>12}: {e['accesses_per_s'] / 1e6:6.2f} M accesses/s "
              f"({e['ratio_to_fifo']:.2f} x fifo), miss ratio {e['miss_ratio']:.3f}, "
              f"{e['fallback_evictions']} fallback evictions")
    return out


def plot(result: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    traces = result["traces"]
    fig, axes = plt.subplots(1, len(traces) + 1, figsize=(6 * (len(traces) + 1), 5.5),
                             squeeze=False)
    for ax, tr in zip(axes[0], traces):
        for i, (name, e) in enumerate(sorted(tr["policies"].items())):
            color = plt.cm.tab20(i % 20)
            ax.plot(tr["sizes"], e["miss_ratio"], "-o", color=color, label=name, ms=3)
            if "libcachesim_miss_ratio" in e:
                ax.plot(tr["sizes"], e["libcachesim_miss_ratio"], "--x", color=color,
                        label=f"libCacheSim {e['libcachesim']} "
                              f"(max |diff| {e['max_abs_diff']:.3f})", ms=4)
        ax.set_xscale("log")
        ax.set_xlabel("cache size (4 KiB pages)")
        ax.set_ylabel("miss ratio")
        ax.set_title(f"{tr['trace']}: ours solid, libCacheSim dashed", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        ax.grid(True, alpha=0.3)
    ax = axes[0][-1]
    names = sorted(result["speed"], key=lambda n: result["speed"][n]["accesses_per_s"])
    ax.barh(names, [result["speed"][n]["accesses_per_s"] / 1e6 for n in names])
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("M accesses per CPU second")
    ax.set_title(f"full simulation, {SPEED_PAGES} pages, 3 misses in 4", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", type=Path,
                    help="a trace to compare on (repeatable; default: the shared traces)")
    args = ap.parse_args(argv)
    paths = args.trace or [p for p in DEFAULT_TRACES if p.exists()]
    if not paths:
        print("bench_policies: no trace (../shared/traces is absent); give --trace",
              file=sys.stderr)
        return 2
    result = {"fractions": list(FRACTIONS), "traces": [fidelity(p) for p in paths]}
    worst = {}
    for tr in result["traces"]:
        for name, e in tr["policies"].items():
            if "max_abs_diff" in e:
                worst.setdefault(name, {})[tr["trace"]] = e["max_abs_diff"]
    result["largest_difference"] = worst
    print("\nlargest |ours - libCacheSim| per policy: " + "; ".join(
        f"{n} " + ", ".join(f"{t} {v:.4f}" for t, v in d.items()) for n, d in worst.items()))
    result["speed"] = speed()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_policies.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / "bench_policies.png")
    print(f"wrote {RESULTS / 'bench_policies.json'} and bench_policies.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
