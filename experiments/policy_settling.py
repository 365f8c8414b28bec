#!/usr/bin/env python3
"""How long each policy takes to reach its steady state after a switch.

A policy swapped in on a live cache (models.runtime.Cache.swap_policy, as
the kernel hands a new policy the cached pages) does not serve its steady
miss ratio at once: it inherits a cache the old policy filled, with none
of its own history, and some policies (mru's fresh list, a frequency
count) throw that cache away before they keep anything.  Until then a
switch neither gains nor can be judged.  This measures it, per policy: on
synthetic workloads of every kind at three cache sizes, the kernel's own
policy (linux) is run to steady state, the policy is swapped in, and the
pages inserted until its miss ratio (over the next four chunks of an
eighth of the cache) is within max(0.01, 20 % of the gap) of what it
misses when run alone are counted, in caches' worths ("turnovers").  Only
cases where the two policies' steady miss ratios differ by at least 0.02
count (elsewhere there is nothing to settle to); linux's own row is the
return to it from every other policy.

Writes models/policy_settling.json (per policy: median and p90 turnovers
over those cases, n; read by models/policy_settling.py),
experiments/results/policy_settling.json (every case) and a PNG, and
prints the table.  --quick runs one seed on smaller footprints and writes
only the *_quick results.

    .venv/bin/python experiments/policy_settling.py [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

from cachepilot.models import generators as gen
from cachepilot.models import runtime
from cachepilot.models.policy_settling import FORMAT_VERSION, TABLE

RESULTS = Path(__file__).resolve().parent / "results"
FRACTIONS = (0.25, 0.5, 0.9)     # cache size / footprint
MIN_GAP = 0.02                   # miss ratio the two policies must differ by to count
WARM = 30                        # footprints of accesses run before measuring
AFTER = 20                       # footprints of accesses run after the swap


def workloads(pages: int, seed: int) -> dict:
    """name -> a fresh stream factory, every kind the corpus runs."""
    return {
        "zipf-0.6": lambda: gen.zipf(pages, 0.6, seed=seed),
        "zipf-0.9": lambda: gen.zipf(pages, 0.9, seed=seed),
        "zipf-1.2": lambda: gen.zipf(pages, 1.2, seed=seed),
        "uniform": lambda: gen.uniform(pages, seed=seed),
        "loop": lambda: gen.loop(pages, seed=seed),
        "get-scan": lambda: gen.get_scan(pages, 0.9, scan_fraction=0.3,
                                         scan_pages=pages // 4, seed=seed),
        "zipf+scan": lambda: gen.mix([(gen.zipf(pages, 0.9, seed=seed), 0.7),
                                      (gen.scan(pages * 4, seed=seed, base=pages), 0.3)],
                                     seed=seed),
    }


def run(stream, cache, accesses: int, chunk: int, policy: str) -> np.ndarray:
    """Miss ratio of each chunk of `accesses` through `cache`; a get-scan
    stream's scan thread is registered with get_scan, as the sim does."""
    out = []
    for _ in range(accesses // chunk):
        got = stream.next(chunk)
        keys, tids = got if isinstance(got, tuple) else (got, None)
        keys = np.asarray(keys, dtype=np.uint64)
        if tids is not None and policy == "get_scan":
            tids = runtime.mark_registered(np.asarray(tids, dtype=np.uint32),
                                           np.array([gen.SCAN_TID], dtype=np.uint32))
        out.append(cache.access(keys, tids))
    return np.asarray(out, dtype=np.float64) / chunk


def settle_case(make, policy: str, pages: int, frac: float, frm: str = "linux",
                steady: dict | None = None) -> dict | None:
    """One (workload, size, policy) case, the switch from `frm`; None
    where the two do not differ by MIN_GAP there.  `steady`: the steady
    miss ratios already run on this workload and size, by policy (filled
    in here), so that each policy is run alone once."""
    size = max(16, int(pages * frac))
    chunk = max(64, size // 8)
    tail = max(4, 8 * pages // chunk)
    steady = {} if steady is None else steady
    if policy not in steady:
        steady[policy] = run(make(), runtime.Cache(policy, size), WARM * pages, chunk,
                             policy)[-tail:].mean()
    alone = steady[policy]
    stream = make()
    cache = runtime.Cache(frm, size)
    before = run(stream, cache, WARM * pages, chunk, frm)[-tail:].mean()
    if abs(before - alone) < MIN_GAP:
        return None
    cache.swap_policy(policy)
    seq = run(stream, cache, AFTER * pages, chunk, policy)
    tol = max(0.01, 0.2 * abs(before - alone))
    idx = next((i for i in range(len(seq) - 4) if abs(seq[i:i + 4].mean() - alone) <= tol),
               None)
    turnovers = float("inf") if idx is None else float(seq[:idx].sum() * chunk / size)
    return {"policy": policy, "from": frm, "fraction": frac, "before": float(before),
            "alone": float(alone), "turnovers": turnovers, "accesses_per_footprint":
            float("inf") if idx is None else idx * chunk / pages}


def table(cases: list[dict]) -> dict:
    """policy -> {median, p90, n} over its finite cases; a case that never
    settled within AFTER footprints counts as AFTER's worth of turnovers."""
    out = {}
    for p in sorted({c["policy"] for c in cases}):
        v = np.array([min(c["turnovers"], AFTER / c["fraction"]) for c in cases
                      if c["policy"] == p])
        out[p] = {"median": round(float(np.median(v)), 3),
                  "p90": round(float(np.quantile(v, 0.9)), 3), "n": int(len(v))}
    return out


def plot(cases: list[dict], rows: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted(rows)
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, p in enumerate(names):
        v = [min(c["turnovers"], AFTER / c["fraction"]) for c in cases if c["policy"] == p]
        ax.scatter([k] * len(v), v, s=12, alpha=0.6)
        ax.plot([k - 0.3, k + 0.3], [rows[p]["median"]] * 2, color="black")
    ax.set_xticks(range(len(names)), names, rotation=30)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("caches' worth of inserts to settle")
    ax.set_title("Settling after a live switch from linux (linux: back to it; line: median)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed, small footprints")
    args = ap.parse_args(argv)
    t0 = time.time()
    pages, seeds = (2048, (0,)) if args.quick else (8192, (0, 1))
    policies = [p for p in runtime.available_policies() if p != "linux"]
    cases = []
    jobs = [(s, w, f) for s in seeds for w in workloads(pages, 0) for f in FRACTIONS]
    for k, (seed, name, frac) in enumerate(jobs):
        make = workloads(pages, seed)[name]
        steady = {}
        for p in policies:
            # to p from the kernel's own policy, and back from p to it
            for c in (settle_case(make, p, pages, frac, steady=steady),
                      settle_case(make, "linux", pages, frac, frm=p, steady=steady)):
                if c is not None:
                    cases.append({**c, "workload": name, "seed": seed})
        print(f"[{k + 1}/{len(jobs)}] {name} at {frac:.2f} of its footprint, seed {seed}",
              file=sys.stderr, flush=True)
    rows = table(cases)
    suffix = "_quick" if args.quick else ""
    made = {"command": "experiments/policy_settling.py" + (" --quick" if args.quick else ""),
            "date": datetime.date.today().isoformat(), "seconds": round(time.time() - t0, 1),
            "pages": pages, "seeds": list(seeds)}
    doc = {"version": FORMAT_VERSION, "about": (
        "caches' worth of pages inserted after a switch from linux (for linux: to it) "
        "before a policy serves its steady miss ratio, over cases where the two differ "
        "by 0.02 or more"),
        "made": made, "policies": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"policy_settling{suffix}.json").write_text(
        json.dumps({**doc, "cases": cases}, indent=1, default=str) + "\n")
    plot(cases, rows, RESULTS / f"policy_settling{suffix}.png")
    if not args.quick:
        TABLE.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'policy':14s} {'median':>8s} {'p90':>8s} {'n':>4s}")
    for p, r in rows.items():
        print(f"{p:14s} {r['median']:8.2f} {r['p90']:8.2f} {r['n']:4d}")
    print(f"({time.time() - t0:.0f} s; wrote {RESULTS / f'policy_settling{suffix}.json'}"
          + ("" if args.quick else f" and {TABLE}") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
