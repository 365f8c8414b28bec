#!/usr/bin/env python3
"""Error of each policy's miniature simulation, by sampled cache size.

The controller trusts a minisim curve (models.runtime.minisim_mrc at rate R)
as far as its error allows, and that error is mostly a matter of how many
sampled pages the miniature cache holds (R x size).  This measures it: for
every policy of the library, over many workloads (slices of the shared
traces, synthetic streams from models.generators) and several hash salts
(keys xored with a constant: a fresh, equally likely SHARDS sample), the
signed error minisim - full at sizes where R x size is exactly one of the
buckets 8, 16, ..., 4096 sampled pages.  Rates and sizes are powers of two,
so one full curve per policy and workload serves every rate; the policies
look at keys only as identities, so salting leaves the full curve as it is.
Small buckets are reached by the low rates too, whose samples of these
0.07-0.6 M-access workloads are a few hundred accesses: there the table
reads pessimistic for an agent that samples a long window.

Writes models/minisim_error.json (per policy and bucket: bias, sd, n; read
by models/minisim_error.py), experiments/results/minisim_error.json (the
raw curves) and minisim_error.png, and prints the table.  --quick is a
fast, coarse run that writes *_quick files and leaves the shipped table.

    .venv/bin/python experiments/minisim_error.py [--quick] [--salts 3]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench_minisim import RESULTS, TRACES
from cachepilot.models import generators as gen
from cachepilot.models import runtime
from cachepilot.models.minisim_error import TABLE
from cachepilot.models.shards import hash_salts
from cachepilot.models.traces import read_keys

BUCKETS = tuple(2 ** k for k in range(3, 13))      # sampled pages, 8 .. 4096
RATES = tuple(2.0 ** -k for k in (10, 8, 6, 4))    # ~0.001, 0.004, 0.016, 0.06
MIN_POINTS = 8        # fewer points in a bucket than this: left out of the table
FORMAT_VERSION = 1


@dataclass
class Workload:
    name: str
    keys: np.ndarray
    tids: np.ndarray | None = None


def trace_workloads(rng, quick: bool) -> list[Workload]:
    """Slices of the shared traces at random offsets and lengths."""
    plan = {"OLTP.lis.zst": (1, 150_000, 150_000) if quick else (3, 300_000, 600_000),
            "cloudphysics.txt": (1, 60_000, 60_000) if quick else (2, 60_000, 100_000)}
    if not TRACES.is_dir():
        print(f"reference traces absent ({TRACES}): synthetic workloads only",
              file=sys.stderr)
        return []
    out = []
    for name, (count, lo, hi) in plan.items():
        keys = read_keys(TRACES / name)
        for _ in range(count):
            length = min(len(keys), int(rng.integers(lo, hi + 1)))
            start = int(rng.integers(0, len(keys) - length + 1))
            out.append(Workload(f"{name.split('.')[0]}[{start}:+{length}]",
                                keys[start:start + length]))
    return out


def synthetic_workloads(quick: bool, seed: int) -> list[Workload]:
    """Zipf of several skews, uniform, loop, and scan mixes; the get_scan
    workload's scan thread is registered (bit 31 of its tid), so the
    application-informed policies run their own rules on it."""
    n = 150_000 if quick else 600_000
    streams = {
        "zipf0.6": lambda s: gen.zipf(100_000, 0.6, seed=s),
        "zipf0.9": lambda s: gen.zipf(100_000, 0.9, seed=s),
        "zipf1.2": lambda s: gen.zipf(100_000, 1.2, seed=s),
        "uniform": lambda s: gen.uniform(60_000, seed=s),
        "loop": lambda s: gen.loop(40_000, seed=s),
        "zipf+scan": lambda s: gen.mix([(gen.zipf(60_000, 0.9, seed=s), 0.7),
                                        (gen.scan(1, base=1 << 40), 0.3)], seed=s),
        "zipf+loop": lambda s: gen.mix([(gen.zipf(60_000, 1.0, seed=s), 0.5),
                                        (gen.loop(30_000, base=1 << 40), 0.5)], seed=s),
        "get_scan": lambda s: gen.get_scan(50_000, 0.9, 0.3, scan_pages=256, seed=s),
    }
    if quick:
        streams = {k: streams[k] for k in ("zipf0.9", "loop", "get_scan")}
    out = []
    for i, (name, make) in enumerate(streams.items()):
        got = make(seed + i).next(n)
        keys, tids = got if isinstance(got, tuple) else (got, None)
        if tids is not None:
            tids = runtime.mark_registered(tids, np.array([gen.SCAN_TID], np.uint32))
        out.append(Workload(f"{name}(seed {seed + i})", keys, tids))
    return out


def rounded(ratios) -> list[float]:
    return [round(float(x), 6) for x in ratios]


def full_sizes(unique: int, rates=RATES, buckets=BUCKETS) -> np.ndarray:
    """Every size b/R (pages) up to the workload's distinct pages."""
    sizes = {int(round(b / r)) for b in buckets for r in rates}
    return np.array(sorted(s for s in sizes if s <= unique), np.int64)


def measure(w: Workload, policies, rates=RATES, buckets=BUCKETS, salts=3,
            progress=None) -> dict:
    """Full curves of `w` and its minisim curves at every rate and salt
    (the first salt is 0: the keys as they are).  Raw figures, one dict."""
    unique = len(np.unique(w.keys))
    sizes = full_sizes(unique, rates, buckets)
    raw = {"name": w.name, "accesses": len(w.keys), "unique": unique,
           "sizes": sizes.tolist(), "full": {}, "minisim": []}
    if not len(sizes):
        return raw
    for p in policies:
        if progress:
            progress(f"{w.name}: full {p}")
        raw["full"][p] = rounded(runtime.full_mrc(w.keys, p, sizes, w.tids).miss_ratio)
    for i, salt in enumerate([0] + hash_salts(salts)):
        keys = w.keys ^ np.uint64(salt)
        for rate in rates:
            if progress:
                progress(f"{w.name}: minisim salt {i} R=2^{np.log2(rate):.0f}")
            curves = runtime.minisim_mrc(keys, policies, sizes, rate, w.tids)
            raw["minisim"].append({
                "salt": i, "rate": rate,
                "sampled_accesses": curves[0].meta["sampled_accesses"],
                "miss_ratio": {c.policy: rounded(c.miss_ratio) for c in curves}})
    return raw


def errors(raw: dict, buckets=BUCKETS):
    """(policy, sampled pages, rate, signed error) of every point of one
    workload whose sampled size is a bucket."""
    sizes = np.array(raw["sizes"], np.float64)
    for run in raw["minisim"]:
        sampled = sizes * run["rate"]
        for p, mini in run["miss_ratio"].items():
            err = np.array(mini) - np.array(raw["full"][p])
            for b in buckets:
                for j in np.flatnonzero(np.isclose(sampled, b)):
                    yield p, b, run["rate"], float(err[j])


def summarise(raws, buckets=BUCKETS, min_points=MIN_POINTS) -> dict:
    """Per policy, rows {sampled_pages, bias, sd, n} over every workload."""
    pooled: dict = {}
    for raw in raws:
        for p, b, _, e in errors(raw, buckets):
            pooled.setdefault(p, {}).setdefault(b, []).append(e)
    table = {}
    for p in sorted(pooled):
        table[p] = [{"sampled_pages": b, "bias": round(float(np.mean(v)), 6),
                     "sd": round(float(np.std(v, ddof=1)), 6), "n": len(v)}
                    for b, v in sorted(pooled[p].items()) if len(v) >= min_points]
    return table


def progress_printer(total: int):
    began = time.monotonic()
    state = {"done": 0}
    end = "\r" if sys.stderr.isatty() else "\n"

    def show(what: str, step: bool = False):
        state["done"] += step
        if end == "\n" and not step:
            return       # not a terminal: a line per workload is enough
        print(f"[{state['done']}/{total} workloads, {time.monotonic() - began:5.0f} s] "
              f"{what[:70]:70}", end=end, file=sys.stderr, flush=True)
    return show


def print_table(table: dict):
    policies = list(table)
    buckets = sorted({r["sampled_pages"] for rows in table.values() for r in rows})
    for field in ("sd", "bias"):
        print(f"\n{field} of minisim - full miss ratio, by sampled pages (R x size)")
        print(f"{'sampled':>8} " + " ".join(f"{p[:8]:>8}" for p in policies))
        for b in buckets:
            cells = []
            for p in policies:
                row = next((r for r in table[p] if r["sampled_pages"] == b), None)
                cells.append(f"{row[field]:8.4f}" if row else f"{'-':>8}")
            print(f"{b:8d} " + " ".join(cells))


def plot(table: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_sd, ax_bias) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.get_cmap("tab20").colors
    for i, (p, rows) in enumerate(table.items()):
        x = [r["sampled_pages"] for r in rows]
        style = dict(color=colors[i % len(colors)], marker="o", ms=3,
                     ls="-" if i % 2 == 0 else "--", label=p)
        ax_sd.plot(x, [r["sd"] for r in rows], **style)
        ax_bias.plot(x, [r["bias"] for r in rows], **style)
    for ax, what in ((ax_sd, "sd"), (ax_bias, "bias (mean)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sampled pages in the miniature cache (R x size)")
        ax.set_ylabel(f"{what} of minisim - full miss ratio")
        ax.grid(alpha=0.3)
    ax_bias.axhline(0, color="k", lw=0.8)
    ax_sd.legend(fontsize=7, ncol=2)
    fig.suptitle("Miniature-simulation error by sampled cache size, per policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast, coarse run")
    ap.add_argument("--salts", type=int, default=None,
                    help="hash salts besides the keys as they are (default 3, quick 1)")
    ap.add_argument("--seed", type=int, default=1, help="slices and synthetic seeds")
    args = ap.parse_args(argv)
    salts = args.salts if args.salts is not None else (1 if args.quick else 3)
    began = time.monotonic()
    rng = np.random.default_rng(args.seed)
    workloads = trace_workloads(rng, args.quick) + synthetic_workloads(args.quick, args.seed)
    policies = runtime.available_policies()
    print(f"{len(workloads)} workloads x {len(policies)} policies x {len(RATES)} rates "
          f"x {salts + 1} salts", file=sys.stderr)
    show = progress_printer(len(workloads))
    raws = []
    for w in workloads:
        raws.append(measure(w, policies, salts=salts, progress=show))
        show(f"{w.name} done", step=True)
    print(file=sys.stderr)
    table = summarise(raws)
    seconds = round(time.monotonic() - began, 1)
    suffix = "_quick" if args.quick else ""
    made = {"command": " ".join([".venv/bin/python experiments/minisim_error.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "seconds": seconds, "rates": list(RATES), "salts": salts,
            "workloads": [{"name": r["name"], "accesses": r["accesses"],
                           "unique": r["unique"]} for r in raws]}
    doc = {"version": FORMAT_VERSION,
           "about": "signed error of the miniature-simulation miss ratio "
                    "(minisim - full, same policy code) by sampled pages "
                    "(R x size): bias = mean, sd = standard deviation, n = points, "
                    "pooled over workloads, rates and hash salts",
           "made": made, "policies": table}
    RESULTS.mkdir(exist_ok=True)
    table_path = RESULTS / "minisim_error_table_quick.json" if args.quick else TABLE
    table_path.write_text(json.dumps(doc, indent=1) + "\n")
    (RESULTS / f"minisim_error{suffix}.json").write_text(
        json.dumps({"made": made, "workloads": raws}) + "\n")
    plot(table, RESULTS / f"minisim_error{suffix}.png")
    print_table(table)
    print(f"\n{len(workloads)} workloads, {len(policies)} policies, {seconds:.0f} s; "
          f"wrote {table_path}, {RESULTS}/minisim_error{suffix}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
