#!/usr/bin/env python3
"""Miniature simulations against full simulations of the same policy code.

For each trace and policy, side by side in one run:
  - full simulation at 16 sizes (models.runtime.full_mrc): the truth, and
    the runtime's per-access cost (accesses/s through the policy callbacks);
  - miniature simulations at R = 0.001, 0.01, 0.1 (models.runtime.minisim_mrc,
    all sizes in one pass): time, and mean/max absolute error against full.
Prints a table with speed ratios and writes experiments/results/
bench_minisim.json and bench_minisim.png.

    .venv/bin/python experiments/bench_minisim.py [--policies fifo,lru,...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cachepilot.models import runtime
from cachepilot.models.traces import read_keys

HERE = Path(__file__).resolve().parent
TRACES = HERE.parents[1] / "shared" / "traces"
RESULTS = HERE / "results"
RATES = (0.001, 0.01, 0.1)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fifo,lru,mru,linux")
    ap.add_argument("--traces", default="OLTP.lis.zst,cloudphysics.txt")
    ap.add_argument("--points", type=int, default=16)
    args = ap.parse_args()
    policies = args.policies.split(",")
    if not TRACES.is_dir():
        print(f"reference traces absent ({TRACES})", file=sys.stderr)
        return 1
    report = {"rates": list(RATES), "traces": {}}
    for name in args.traces.split(","):
        keys = read_keys(TRACES / name)
        unique = len(np.unique(keys))
        sizes = np.unique(np.geomspace(max(100, unique // 200), unique,
                                       args.points).astype(np.int64))
        entry = {"accesses": int(len(keys)), "unique": unique,
                 "sizes": sizes.tolist(), "policies": {}}
        mini_t = {}
        for rate in RATES:
            t, curves = timed(lambda: runtime.minisim_mrc(keys, policies, sizes, rate))
            mini_t[rate] = (t, {c.policy: c for c in curves})
        for policy in policies:
            t_full, full = timed(lambda: runtime.full_mrc(keys, policy, sizes))
            row = {"full_seconds": t_full,
                   "full_accesses_per_s": len(keys) * len(sizes) / t_full,
                   "full": full.miss_ratio.tolist(), "minisim": {}}
            for rate in RATES:
                curve = mini_t[rate][1][policy]
                err = np.abs(curve.miss_ratio - full.miss_ratio)
                row["minisim"][str(rate)] = {
                    "mae": float(err.mean()), "max_error": float(err.max()),
                    "miss_ratio": curve.miss_ratio.tolist()}
            entry["policies"][policy] = row
        entry["minisim_seconds_all_policies"] = {str(r): mini_t[r][0] for r in RATES}
        full_total = sum(r["full_seconds"] for r in entry["policies"].values())
        entry["speedup_minisim_over_full"] = {
            str(r): full_total / mini_t[r][0] for r in RATES}
        report["traces"][name] = entry

        print(f"\n{name}: {len(keys):,} accesses, {unique:,} unique pages, "
              f"{len(sizes)} sizes")
        print(f"{'policy':8} {'full acc/s':>12} " +
              " ".join(f"{'MAE R=' + str(r):>12}" for r in RATES))
        for policy, row in entry["policies"].items():
            print(f"{policy:8} {row['full_accesses_per_s']:12.3g} " +
                  " ".join(f"{row['minisim'][str(r)]['mae']:12.4f}" for r in RATES))
        print("minisim (all policies x sizes, one pass) vs full: " +
              ", ".join(f"R={r}: {entry['speedup_minisim_over_full'][str(r)]:.0f}x"
                        for r in RATES))

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_minisim.json").write_text(json.dumps(report, indent=1))
    plot(report, policies, RESULTS / "bench_minisim.png")
    print(f"\nwrote {RESULTS / 'bench_minisim.json'} and bench_minisim.png")
    return 0


def plot(report, policies, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    traces = list(report["traces"])
    fig, axes = plt.subplots(len(traces), len(policies),
                             figsize=(3.2 * len(policies), 2.8 * len(traces)),
                             squeeze=False)
    for i, name in enumerate(traces):
        entry = report["traces"][name]
        for j, policy in enumerate(policies):
            ax = axes[i][j]
            row = entry["policies"][policy]
            ax.plot(entry["sizes"], row["full"], "k-", lw=2, label="full")
            for rate in report["rates"]:
                m = row["minisim"][str(rate)]
                ax.plot(entry["sizes"], m["miss_ratio"], "--",
                        label=f"R={rate} (MAE {m['mae']:.3f})")
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{policy} / {name.split('.')[0]}", fontsize=9)
            ax.legend(fontsize=6)
            if i == len(traces) - 1:
                ax.set_xlabel("cache size (pages)")
            if j == 0:
                ax.set_ylabel("miss ratio")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
