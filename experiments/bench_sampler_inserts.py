#!/usr/bin/env python3
"""What the sampler's insert records cost a read that misses.

The sampler hands over the pages a read brings into the page cache (one
insert record per sampled page, with the thread that brought it in), so
the agent can tell which threads miss.  bench_agent_overhead.py measures
reads that hit; this measures reads that mostly miss: one thread doing
4 KiB preads at random offsets of a 64 MiB file (read-ahead off) in a
memory cgroup limited to 16 MiB, its page cache dropped before each run,
timing its loop with its own CPU clock (the syscall's page-cache work is
its own; the wait for the disk is not).  Three conditions, interleaved
with the order rotating:

  none      nothing attached
  sampler   the sampler watching the cgroup at R = 0.01, as the agent runs
  every     the sampler at R = 1: every read and every inserted page a
            record, the most the insert path can cost

Prints each condition's CPU per read over `none` (median of runs, with a
95 % bootstrap interval) and the miss ratio the sampler counted; writes
experiments/results/sampler_inserts.{json,png}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

# its reader loop (with "random": read-ahead off) and its ratio statistics
from bench_agent_overhead import (build_pread_loop, first_quartile,  # noqa: E402
                                  ratio_interval)
from cachepilot.agent import damon  # noqa: E402
from cachepilot.agent.sampler import Sampler, threshold_for_rate, why_unavailable  # noqa: E402
from cachepilot.agent.testbed import (SCRATCH, drop_file_cache, in_cgroup,  # noqa: E402
                                      make_file, scratch_cgroup, v1_memory_available)

RESULTS = REPO / "experiments" / "results"
CONDITIONS = {"none": None, "sampler": 0.01, "every": 1.0}

def one_run(exe, cg, path, reads, seed, rate):
    """CPU ns per read of one run, and (with the sampler) the miss ratio and
    insert records it counted."""
    drop_file_cache(path)
    argv = in_cgroup(cg, [str(exe), str(path), str(reads), str(seed), "random"])

    def run():
        res = subprocess.run(argv, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"bench_sampler_inserts: the read loop failed: "
                             f"{res.stderr.strip()[-300:] or res.returncode}")
        return float(res.stdout)

    if rate is None:
        return {"ns_per_read": run()}
    with Sampler() as s:
        cgid = os.stat(cg).st_ino
        s.watch(cgid, threshold_for_rate(rate))
        ns = run()
        c = s.counters()[1][cgid][1]
        s.drain()
    return {"ns_per_read": ns, "miss_ratio": c.inserts / max(c.accesses, 1),
            "sampled_inserts": c.sampled_inserts, "insert_drops": c.insert_drops}


def plot(result, out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    conds = list(result["ns_per_read"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, c in enumerate(conds):
        v = result["ns_per_read"][c]
        ax.scatter([i] * len(v), [x / 1e3 for x in v], alpha=0.5)
        ax.hlines(statistics.median(v) / 1e3, i - 0.3, i + 0.3, colors="k")
    ax.set_xticks(range(len(conds)))
    ax.set_xticklabels([f"{c}\n{result['ratio_of_medians'].get(c, 1.0):.3f}x"
                        for c in conds])
    ax.set_ylabel("reader's CPU per 4 KiB read (us)")
    ax.set_title(f"reads that miss ({result['miss_ratio']:.0%}): insert records' cost",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--reads", type=int, default=20_000, help="reads per run")
    ap.add_argument("--file-mb", type=int, default=64)
    ap.add_argument("--limit-mb", type=int, default=16)
    args = ap.parse_args(argv)
    for reason in (v1_memory_available(), why_unavailable()):
        if reason:
            print(f"bench_sampler_inserts: skipped: {reason}")
            return 0
    path = make_file(SCRATCH / f"inserts-{args.file_mb}m.dat", args.file_mb << 20)
    rows = {c: [] for c in CONDITIONS}
    with damon.paused(), scratch_cgroup("cp_inserts") as cg, \
            tempfile.TemporaryDirectory() as tmp:
        (cg / "memory.limit_in_bytes").write_text(str(args.limit_mb << 20))
        exe = build_pread_loop(Path(tmp))
        conds = list(CONDITIONS)
        for rep in range(args.reps):
            k = rep % len(conds)
            for c in conds[k:] + conds[:k]:
                r = one_run(exe, cg, path, args.reads, rep + 1, CONDITIONS[c])
                rows[c].append(r)
                print(f"rep {rep} {c:8s}: {r['ns_per_read']:8.0f} ns CPU/read"
                      + (f", miss ratio {r['miss_ratio']:.2f}, insert records "
                         f"{r['sampled_inserts']}" if "miss_ratio" in r else ""), flush=True)
    ns = {c: [r["ns_per_read"] for r in v] for c, v in rows.items()}
    med = {c: statistics.median(v) for c, v in ns.items()}
    result = {
        "workload": f"1 thread, random 4 KiB preads (read-ahead off), {args.reads} a run, "
                    f"{args.file_mb} MiB file, {args.limit_mb} MiB memory cgroup, "
                    f"page cache dropped before each run",
        "reps": args.reps, "rates": {c: r for c, r in CONDITIONS.items() if r},
        "ns_per_read": ns, "median_ns_per_read": med,
        "ratio_of_medians": {c: med[c] / med["none"] for c in ns if c != "none"},
        "ratio_of_medians_95ci": {c: ratio_interval(ns[c], ns["none"])
                                  for c in ns if c != "none"},
        "ratio_of_first_quartiles": {c: first_quartile(ns[c]) / first_quartile(ns["none"])
                                     for c in ns if c != "none"},
        "miss_ratio": statistics.median(r["miss_ratio"] for r in rows["every"]),
        "insert_drops": sum(r["insert_drops"] for c in ("sampler", "every") for r in rows[c]),
        "runs": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sampler_inserts.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, RESULTS / "sampler_inserts.png")
    print(f"\nreader's CPU per read (median of {args.reps}): " + ", ".join(
        f"{c} {v:.0f} ns" for c, v in med.items()))
    for c, r in result["ratio_of_medians"].items():
        lo, hi = result["ratio_of_medians_95ci"][c]
        print(f"ratio {c:8s}/ none: {r:.4f} (95 % bootstrap {lo:.3f}-{hi:.3f}), "
              f"of first quartiles {result['ratio_of_first_quartiles'][c]:.4f}")
    print(f"miss ratio the sampler counted: {result['miss_ratio']:.2f}; "
          f"insert records lost: {result['insert_drops']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
