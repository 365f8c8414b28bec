#!/usr/bin/env python3
"""The policy library against libCacheSim, side by side in one run, and
each policy's simulation speed.

Fidelity: for every library policy with a libCacheSim algorithm of the
same name (s3fifo, lfu, lhd, hyperbolic; lru as the control), a full
simulation of our kernel-style policy (the same source the kernel runs,
through the native runtime) and of libCacheSim's algorithm at 12 sizes
from 1 % to 100 % of the trace's distinct pages (models/policy_fidelity.py),
on each shared trace found and on generated workloads no policy was tuned
on, plus a long one that takes LHD through several model
reconfigurations; prints both curves and the largest difference per policy
and trace.  The policies without a twin are simulated on the shared traces
too, for the plot.

Speed: every policy's full simulation of a miss-heavy stream (uniform
over four times the cache) at 65,536 pages, a 256 MiB cgroup, in accesses
per second of CPU time (best of three), and its ratio to fifo's.

Writes experiments/results/bench_policies.json and bench_policies.png.

    .venv/bin/python experiments/bench_policies.py [--trace PATH ...] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from cachepilot.models import policy_fidelity as fid
from cachepilot.models import runtime
from cachepilot.models.traces.readers import read_keys

import study_output

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "traces"
DEFAULT_TRACES = [SHARED / "cloudphysics.txt", SHARED / "OLTP.lis.zst"]
RESULTS = HERE / "results"
SPEED_PAGES = 65_536
SPEED_ACCESSES = 2_000_000
SPEED_REPEATS = 3


def fidelity(name: str, keys, all_policies: bool) -> dict:
    """Both curves of every twin (and, with all_policies, our curve of every
    other policy) at the 12 sizes of one trace."""
    sizes = fid.sizes_for(keys)
    out = {"trace": name, "accesses": int(len(keys)),
           "distinct": int(len(np.unique(keys))), "sizes": sizes, "policies": {}}
    print(f"{name}: {out['accesses']} accesses, {out['distinct']} distinct pages; "
          f"sizes {sizes}", flush=True)
    for ours in runtime.available_policies():
        if ours in fid.TWINS:
            c = fid.compare(keys, ours, sizes)
            entry = {"miss_ratio": c["ours"], "libcachesim": fid.TWINS[ours],
                     "libcachesim_miss_ratio": c["libcachesim"], "diff": c["diff"],
                     "max_abs_diff": c["max_abs_diff"], "worst_size": c["worst_size"]}
            print(f"{ours:>12}: " + " ".join(f"{m:.3f}" for m in c["ours"]) +
                  f"\n{'libCacheSim':>12}: " + " ".join(f"{m:.3f}" for m in c["libcachesim"]) +
                  f"   max |diff| {c['max_abs_diff']:.4f} at {c['worst_size']} pages",
                  flush=True)
        elif all_policies:
            curve = runtime.full_mrc(keys, ours, sizes).miss_ratio
            entry = {"miss_ratio": curve.tolist()}
            print(f"{ours:>12}: " + " ".join(f"{m:.3f}" for m in curve), flush=True)
        else:
            continue
        out["policies"][ours] = entry
    return out


def speed() -> dict:
    """Accesses per CPU second of a full simulation at SPEED_PAGES pages of
    a uniform stream over four times as many: three misses in four."""
    keys = np.random.default_rng(1).integers(0, 4 * SPEED_PAGES, SPEED_ACCESSES,
                                             dtype=np.uint64)
    out = {}
    for name in runtime.available_policies():
        best = None
        for _ in range(SPEED_REPEATS):
            cache = runtime.Cache(name, SPEED_PAGES)
            t0 = time.process_time()
            cache.access(keys)
            cpu = time.process_time() - t0
            best = cpu if best is None else min(best, cpu)
        s = cache.stats
        out[name] = {"accesses_per_s": SPEED_ACCESSES / best,
                     "miss_ratio": s["misses"] / s["accesses"],
                     "fallback_evictions": s["fallback_evictions"]}
    fifo = out["fifo"]["accesses_per_s"]
    print(f"\nfull simulation at {SPEED_PAGES} pages, {SPEED_ACCESSES} uniform accesses "
          f"over {4 * SPEED_PAGES} pages (best of {SPEED_REPEATS}):")
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
    panels = len(traces) + 2
    cols = 3
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 5 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, tr in zip(flat, traces):
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
    ax = flat[len(traces)]
    worst = result["largest_difference"]
    names = sorted(worst)
    labels = sorted({t for d in worst.values() for t in d})
    for j, t in enumerate(labels):
        ax.bar([i + (j - len(labels) / 2) * 0.8 / len(labels) for i in range(len(names))],
               [worst[n].get(t, 0) for n in names], 0.8 / len(labels), label=t)
    ax.axhline(fid.TOLERANCE, color="red", linestyle=":", label="tolerance")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("largest |ours - libCacheSim| over the sizes")
    ax.legend(fontsize=6)
    ax = flat[len(traces) + 1]
    names = sorted(result["speed"], key=lambda n: result["speed"][n]["accesses_per_s"])
    ax.barh(names, [result["speed"][n]["accesses_per_s"] / 1e6 for n in names])
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("M accesses per CPU second")
    ax.set_title(f"full simulation, {SPEED_PAGES} pages, 3 misses in 4", fontsize=9)
    for ax in flat[panels:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", type=Path,
                    help="a trace to compare on (repeatable; default: the shared traces)")
    ap.add_argument("--quick", action="store_true",
                    help="shared traces and speed only (no generated workloads)")
    args = ap.parse_args(argv)
    paths = args.trace or [p for p in DEFAULT_TRACES if p.exists()]
    if not paths:
        print("bench_policies: no trace (../shared/traces is absent); give --trace",
              file=sys.stderr)
        return 2
    result = {"fractions": list(fid.FRACTIONS), "tolerance": fid.TOLERANCE,
              "traces": [fidelity(p.name, read_keys(p), True) for p in paths]}
    if not args.quick:
        generated = fid.generated_workloads()
        generated["long zipf+scan"] = fid.long_workload()
        for name, keys in generated.items():
            result["traces"].append(fidelity(name, keys, False))
    worst = {}
    for tr in result["traces"]:
        for name, e in tr["policies"].items():
            if "max_abs_diff" in e:
                worst.setdefault(name, {})[tr["trace"]] = e["max_abs_diff"]
    result["largest_difference"] = worst
    print("\nlargest |ours - libCacheSim| per policy and trace:")
    for n, d in sorted(worst.items()):
        print(f"{n:>12}: " + ", ".join(f"{t} {v:.4f}" for t, v in d.items()) +
              f"   (largest {max(d.values()):.4f})")
    result["speed"] = speed()
    study_output.write(RESULTS / "bench_policies", result, lambda png: plot(result, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
