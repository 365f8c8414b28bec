#!/usr/bin/env python3
"""How close can any SHARDS estimator get at a fixed rate?  An oracle bound.

SHARDS at rate R keeps the references of the keys whose hash falls under
the threshold, and estimates each one's reuse distance from the sampled
stream.  Give an estimator more than it can have -- the *exact* reuse
distance of every sampled reference, measured on the full trace -- and
its remaining error is only the luck of which keys were drawn.  No
estimator that sees the sampled keys alone can expect to do better (the
rest of its error, from estimating the distances, comes on top).

For each reference trace this computes every reference's exact LRU stack
distance (a Fenwick tree over last-occurrence positions), then, for the
shipped hash and for SALTS hash salts (keys xored with a random constant,
a fresh but equally likely sample), the MAE against the exact curve at 50
log-spaced sizes from 1 % to 100 % of the unique pages (the sizes the
issue's target is stated at) of two oracle estimates:

  rate    misses of the sampled references / (R x all references)
  ratio   misses of the sampled references / sampled references
  keys    misses of the sampled references / (R' x all references), R' the
          realised key rate (sampled keys / all keys, exact): the floor of
          estimators that also count all keys, as "keys" does with its
          sketch

Beside them, measured and no oracle: the shipped "stack" estimator
(models/stack.py), which also counts every reference by time slice and so
is held to neither floor.

Writes experiments/results/study_shards_floor.json and .png.

    .venv/bin/python experiments/study_shards_floor.py [--rate 0.01] [--salts 20] [--oltp]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from cachepilot.models.exact import (COLD, as_keys, misses_from_distances,
                                    stack_distances)
from cachepilot.models.shards import hash64, hash_salts, rate_threshold, shards_mrc

import study_output

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ESTIMATES = ("rate", "ratio", "keys")
MEASURED = "stack"          # not an oracle: the shipped estimator, for comparison
TRACES = HERE.parents[1] / "shared" / "traces"


def study(keys: np.ndarray, rate: float, n_salts: int) -> dict:
    dist = stack_distances(keys, lambda t, n: print(f"\r  distances {t:,}/{n:,}",
                                                     end="", file=sys.stderr))
    print(file=sys.stderr)
    unique = int(np.count_nonzero(dist == COLD))
    sizes = np.unique(np.geomspace(unique / 100, unique, 50).astype(np.int64))
    exact = misses_from_distances(dist, sizes, len(dist))
    threshold = rate_threshold(rate)
    rows = []
    for salt in [0] + hash_salts(n_salts):
        h = hash64(keys ^ np.uint64(salt) if salt else keys)
        picked = h < np.uint64(threshold)
        sampled = dist[picked]
        keys_drawn = int(np.count_nonzero(sampled == COLD))
        def mae(denominator):
            return float(np.mean(np.abs(misses_from_distances(sampled, sizes, denominator)
                                        - exact)))
        curve = shards_mrc(keys ^ np.uint64(salt) if salt else keys, rate=rate,
                           sizes=sizes, estimator=MEASURED)
        rows.append({"salt": salt, "sampled_refs": int(picked.sum()),
                     "sampled_keys": keys_drawn, "rate": mae(rate * len(dist)),
                     "ratio": mae(max(1, len(sampled))),
                     "keys": mae(len(dist) * max(1, keys_drawn) / unique),
                     MEASURED: float(np.mean(np.abs(curve.miss_ratio - exact)))})
    salted = rows[1:] or rows
    return {
        "references": int(len(dist)), "unique": unique,
        "shipped_hash": rows[0],
        "over_salts": {e: {"mean": float(np.mean([r[e] for r in salted])),
                           "p90": float(np.percentile([r[e] for r in salted], 90))}
                       for e in ESTIMATES + (MEASURED,)},
        "sampled_keys_over_salts": [r["sampled_keys"] for r in salted],
        "rows": rows,
    }


def plot(results: dict, rate: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(results)
    shown = ESTIMATES + (MEASURED,)
    for i, name in enumerate(names):
        for j, est in enumerate(shown):
            vals = [r[est] for r in results[name]["rows"][1:]] or \
                [results[name]["rows"][0][est]]
            x = i * (len(shown) + 1) + j
            ax.scatter([x] * len(vals), vals, s=12, alpha=0.6,
                       label=(f"oracle-{est}" if est != MEASURED else f"{est} (measured)")
                       if i == 0 else None,
                       color=("tab:blue", "tab:orange", "tab:green", "tab:purple")[j])
            ax.scatter([x], [results[name]["shipped_hash"][est]], marker="x", s=60,
                       color="black", label="shipped hash" if i == 0 and j == 0 else None)
    ax.axhline(0.01, color="red", linestyle="--", label="target 0.01")
    ax.set_xticks([i * (len(shown) + 1) + 1.5 for i in range(len(names))], names)
    ax.set_ylabel("MAE vs exact LRU (1-100 % of unique pages)")
    ax.set_title(f"SHARDS at R = {rate}: oracles with exact distances (the sampling "
                 f"floors) and {MEASURED}")
    study_output.save_figure(fig, ax, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--salts", type=int, default=20)
    ap.add_argument("--oltp", action="store_true",
                    help="also OLTP (millions of page references: a few minutes)")
    ap.add_argument("--out", default=str(RESULTS / "study_shards_floor"))
    args = ap.parse_args(argv)
    if not 0 < args.rate <= 1 or args.salts < 0:
        print("error: --rate must be in (0, 1] and --salts at least 0", file=sys.stderr)
        return 2
    from cachepilot.models.traces import read_keys
    names = ["cloudphysics.txt"] + (["OLTP.lis.zst"] if args.oltp else [])
    results = {}
    t0 = time.perf_counter()
    for name in names:
        path = TRACES / name
        if not path.is_file():
            print(f"{path} is absent: skipped", file=sys.stderr)
            continue
        print(f"{name}:", file=sys.stderr)
        r = study(as_keys(read_keys(path)), args.rate, args.salts)
        results[name] = r
        s, o = r["shipped_hash"], r["over_salts"]
        print(f"{name}: {r['references']:,} references, {r['unique']:,} unique pages; "
              f"R = {args.rate} draws {s['sampled_keys']} keys with the shipped hash "
              f"({min(r['sampled_keys_over_salts'] or [0])}-"
              f"{max(r['sampled_keys_over_salts'] or [0])} over salts)")
        print("  oracle MAE, shipped hash: "
              + "  ".join(f"{e} {s[e]:.4f}" for e in ESTIMATES))
        print(f"  oracle MAE over {args.salts} salts (mean/p90): "
              + "  ".join(f"{e} {o[e]['mean']:.4f}/{o[e]['p90']:.4f}" for e in ESTIMATES))
        print(f"  measured {MEASURED} estimator (no oracle): shipped hash {s[MEASURED]:.4f}, "
              f"over salts {o[MEASURED]['mean']:.4f}/{o[MEASURED]['p90']:.4f}")
    if not results:
        print("error: no reference trace found under " + str(TRACES), file=sys.stderr)
        return 1
    study_output.write_salted(args, t0, lambda png: plot(results, args.rate, png),
                              traces=results, sizes="50 log-spaced, 1-100 % of unique pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
