#!/usr/bin/env python3
"""SLOs on scenarios the controller was not shaped on (issue 15, item 7).

Runs every config in configs/scenarios/ (tenants replaying both shared
traces, phase changes, every policy allowed, nodes of different sizes)
three ways, same seeds, side by side:

    equal      the static equal split, kernel default policy
    fixed      the autopilot as it was before item 7: a fixed 5 % SLO
               headroom, an SLO's feasibility taken as each round judges it
               (slo_headroom_sigmas 0, slo_feasibility_rounds 1)
    autopilot  the autopilot as configured (headroom from the tenant's
               observed spread, feasibility debounced)

and prints per SLO the share of intervals after warm-up it was met, the
check the issue asks for (every SLO the equal split meets in >= 95 % of
intervals is met by the autopilot in >= 95 %), the aggregate throughput
against the equal split, and per SLO tenant how often its limit swung
back (a move of >= 5 % of the node's memory followed at once by one the
other way).

A fourth run, `whole`, gives each tenant its node's whole memory (less
the others' floors): an interval in which an SLO is missed even then is
one no configuration could have held it in (a cache still cold after the
warm-up, a burst of new pages), which the issue asks to report.  Those
intervals are listed per SLO and left out of the check's shares for
every configuration alike (`*_reachable`); the shares over every
interval after warm-up are printed and kept beside them.

`--seed-offset K` adds K to every sim node's and tenant's seed: the same
scenarios with other draws of every generator and trace offset, so that
a check passed on the committed seeds is seen to hold on others too.

Writes experiments/results/scenarios.json and scenarios.png (with an
offset, scenarios-seedK.*).
Usage: experiments/bench_scenarios.py [--intervals N] [--only NAME ...] [--seed-offset K]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cachepilot.controller.config import load_config
from cachepilot.run import run_autopilot, run_static_equal, run_static_whole, summarise

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "configs" / "scenarios"
RESULTS = ROOT / "experiments" / "results"
TARGET = 0.95           # the share of intervals
SWING = 0.05            # of the node's memory: a move that counts toward a swing


def swings(limits: list[int], memory: int) -> int:
    """Moves of >= SWING x memory followed at once by one the other way."""
    d = [b - a for a, b in zip(limits, limits[1:])]
    big = SWING * memory
    return sum(1 for x, y in zip(d, d[1:]) if abs(x) >= big and abs(y) >= big and x * y < 0)


def unreachable(rows: list[dict], slo: float) -> list[int]:
    """The intervals (as the history numbers them) in which a tenant given
    its whole node (`rows`: its `whole` run after warm-up) missed `slo`."""
    return [r["interval"] for r in rows if r["throughput"] < slo]


def met_share(rows: list[dict], slo: float, skip: list[int]) -> float:
    """The share of `rows` (a run after warm-up) that met `slo`, leaving out
    the intervals in `skip`; 1.0 when every one is left out."""
    left = set(skip)
    kept = [r["throughput"] >= slo for r in rows if r["interval"] not in left]
    return sum(kept) / len(kept) if kept else 1.0


def run_scenario(path: Path, intervals: int, seed_offset: int = 0) -> dict:
    cfg = load_config(path)
    for n in cfg.nodes:
        n.seed += seed_offset
    for t in cfg.tenants:
        if t.workload is not None and t.workload.seed is not None:
            t.workload.seed += seed_offset
    warmup = cfg.control.warmup_intervals if intervals > cfg.control.warmup_intervals else 0
    fixed_cfg = cfg.model_copy(deep=True)
    fixed_cfg.control.slo_headroom_sigmas = 0.0
    fixed_cfg.control.slo_feasibility_rounds = 1
    runs, seconds = {}, {}
    for name, fn in (("equal", lambda: run_static_equal(cfg, intervals)),
                     ("whole", lambda: run_static_whole(cfg, intervals)),
                     ("fixed", lambda: run_autopilot(fixed_cfg, intervals)[0]),
                     ("autopilot", lambda: run_autopilot(cfg, intervals)[0])):
        started = time.monotonic()
        runs[name] = summarise(cfg, fn(), warmup)
        seconds[name] = time.monotonic() - started
    whole = runs.pop("whole")[0]
    memory = {n.name: n.memory_bytes for n in cfg.nodes}
    slos = []
    for i, t in enumerate(cfg.tenants):
        if t.slo is None:
            continue
        v = t.slo.min_throughput
        row = {"tenant": t.name, "node": t.node, "slo": v,
               "unreachable_intervals": unreachable(whole[i]["history"][warmup:], v)}
        for name, (tenants, _) in runs.items():
            rec = tenants[i]
            row[name] = rec["met_fraction"]
            row[f"{name}_reachable"] = met_share(rec["history"][warmup:], v,
                                                 row["unreachable_intervals"])
            if name != "equal":
                row[f"{name}_swings"] = swings([h["limit_bytes"] for h in rec["history"]],
                                               memory[t.node])
        row["required"] = row["equal_reachable"] >= TARGET
        row["ok"] = row["autopilot_reachable"] >= TARGET if row["required"] else None
        slos.append(row)
    totals = {name: total for name, (_, total) in runs.items()}
    return {
        "scenario": path.stem,
        "config": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
        "intervals": intervals, "warmup_intervals": warmup, "seed_offset": seed_offset,
        "nodes": {n.name: n.memory_bytes for n in cfg.nodes},
        "slos": slos, "aggregate_throughput": totals,
        "ratio_vs_equal": {k: totals[k] / totals["equal"] for k in ("fixed", "autopilot")},
        "check_passed": all(r["ok"] is not False for r in slos),
        "seconds": seconds,
    }


def plot(results: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results):
        names = [s["tenant"] for s in r["slos"]]
        x = np.arange(len(names))
        for k, (key, colour) in enumerate((("equal", "#999999"), ("fixed", "#e0a040"),
                                           ("autopilot", "#3070c0"))):
            # bars: the check's share (intervals some memory could serve);
            # ticks: every interval after warm-up
            ax.bar(x + (k - 1) * 0.27, [100 * s[f"{key}_reachable"] for s in r["slos"]],
                   0.27, label=key, color=colour)
            ax.scatter(x + (k - 1) * 0.27, [100 * s[key] for s in r["slos"]], marker="_",
                       s=120, color="black", zorder=3,
                       label="every interval" if k == 0 else None)
        ax.axhline(100 * TARGET, color="black", lw=0.8, ls="--")
        ax.set_xticks(x, names)
        ax.set_ylim(0, 105)
        ratio = r["ratio_vs_equal"]
        ax.set_title(f"{r['scenario']}: aggregate {ratio['autopilot']:.2f}x equal "
                     f"(fixed {ratio['fixed']:.2f}x)", fontsize=9)
        ax.set_ylabel("% of intervals the SLO is met\n(bars: those the whole node serves)")
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", type=int, default=100)
    ap.add_argument("--only", nargs="*", help="scenario names (default: all)")
    ap.add_argument("--seed-offset", type=int, default=0, metavar="K",
                    help="add K to every sim seed (default 0: the configs' own)")
    args = ap.parse_args(argv)
    paths = sorted(SCENARIOS.glob("*.yaml"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
        if not paths:
            print(f"bench_scenarios: no scenario named {' '.join(args.only)} in "
                  f"{SCENARIOS}", file=sys.stderr)
            return 2
    results = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem}: {args.intervals} intervals x 3 runs ...",
              flush=True)
        r = run_scenario(path, args.intervals, args.seed_offset)
        results.append(r)
        ratio = r["ratio_vs_equal"]
        print(f"  aggregate vs equal split: autopilot {ratio['autopilot']:.2f}x, "
              f"fixed headroom {ratio['fixed']:.2f}x")
        for s in r["slos"]:
            verdict = "-" if s["ok"] is None else "ok" if s["ok"] else "MISSED"
            print(f"  SLO {s['tenant']:8} {s['slo']:>9,.0f}/s met: equal "
                  f"{100 * s['equal']:5.1f}%  fixed {100 * s['fixed']:5.1f}% "
                  f"(swings {s['fixed_swings']})  autopilot {100 * s['autopilot']:5.1f}% "
                  f"(swings {s['autopilot_swings']})")
            gone = s["unreachable_intervals"]
            which = ", ".join(map(str, gone[:8])) + (", ..." if len(gone) > 8 else "")
            print(f"      {len(gone)} intervals out of reach with the whole node"
                  f"{f' ({which})' if gone else ''}; over the rest: equal "
                  f"{100 * s['equal_reachable']:5.1f}%  fixed "
                  f"{100 * s['fixed_reachable']:5.1f}%  autopilot "
                  f"{100 * s['autopilot_reachable']:5.1f}%  check {verdict}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "scenarios" if not args.only else "scenarios-" + "-".join(p.stem for p in paths)
    if args.seed_offset:
        name += f"-seed{args.seed_offset}"
    (RESULTS / f"{name}.json").write_text(json.dumps(
        {"intervals": args.intervals, "target": TARGET, "seed_offset": args.seed_offset,
         "scenarios": results}, indent=1))
    plot(results, RESULTS / f"{name}.png")
    passed = all(r["check_passed"] for r in results)
    print(f"every SLO the equal split meets in >= {TARGET:.0%} of intervals is met by the "
          f"autopilot in >= {TARGET:.0%}: {'yes' if passed else 'NO'}")
    print(f"wrote {RESULTS / (name + '.json')} and .png")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
