#!/usr/bin/env python3
"""The autopilot against the static equal split on the demo host.

Runs `cachepilot run` headless on configs/demo.yaml (controller + two sim
nodes over loopback gRPC), then the same hosts and seeds under a static
equal split of each node's memory with the kernel default policy, and
prints side by side: aggregate throughput and its ratio, SLO attainment per
tenant, and how often the autopilot's policy matches an offline sweep (full
simulation of each tenant phase's exact access stream, at the size the
tenant ended the phase with, under every allowed policy; a policy within the
autopilot threshold of the best counts as a match).

Writes experiments/results/autopilot_vs_equal.json and .png.
Usage: experiments/bench_autopilot_vs_equal.py [--intervals N] [--config FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from cachepilot.sim.backend import SimBackend
from cachepilot.controller.config import load_config
from cachepilot.run import run_command, write_plots
from cachepilot.models.mrc import PAGE_SIZE
from cachepilot.models.runtime import available_policies, warm_miss_ratio

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def policy_sweep(cfg, result):
    tol = cfg.control.autopilot_threshold
    hist = {t["name"]: t["history"] for t in result["tenants"]}
    rows = []
    for spec in cfg.tenants:
        sim = SimBackend(cfg, spec.node, curves=False).tenants[spec.name]
        allowed = [p for p in (spec.policies or available_policies())
                   if p in available_policies()]
        for idx, start, end in spec.workload.phase_spans(result["intervals"]):
            n = min(200_000, (end - start + 1) * spec.workload.accesses_per_interval)
            keys, tids, counted = sim.replay(idx, n)
            size = hist[spec.name][end - 1]["limit_bytes"] // PAGE_SIZE
            tput = {p: spec.workload.service.throughput(
                        warm_miss_ratio(keys, tids, p, size, counted))
                    for p in allowed}
            best = max(tput, key=tput.get)
            chosen = hist[spec.name][end - 1]["policy"]
            rows.append({"tenant": spec.name, "phase": idx, "intervals": [start, end],
                         "size_bytes": size * PAGE_SIZE, "chosen": chosen, "best": best,
                         "offline_throughput": tput,
                         "match": tput[chosen] * (1 + tol) >= tput[best]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--intervals", type=int, default=40)
    args = ap.parse_args(argv)
    console = Console(width=120)
    cfg = load_config(args.config)
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = run_command(cfg, intervals=args.intervals, live=False, console=console)
    sweep = policy_sweep(cfg, result)
    match = sum(r["match"] for r in sweep) / len(sweep)
    summary = {
        "config": str(Path(args.config).resolve().relative_to(ROOT))
        if Path(args.config).resolve().is_relative_to(ROOT) else args.config,
        "intervals": args.intervals,
        "aggregate_throughput": result["aggregate_throughput"],
        "baseline_aggregate_throughput": result["baseline_aggregate_throughput"],
        "throughput_ratio": result["throughput_ratio"],
        "slo": [{"tenant": t["name"], "slo": t["slo"], "met_fraction": t["met_fraction"],
                 "first_met_interval": t["first_met_interval"],
                 "baseline_met_fraction": b["met_fraction"]}
                for t, b in zip(result["tenants"], result["baseline"]["tenants"]) if t["slo"]],
        "policy_match_fraction": match,
        "policy_sweep": sweep,
        "wall_seconds": result["wall_seconds"],
        "run": {k: v for k, v in result.items() if k != "decisions"},
    }
    (RESULTS / "autopilot_vs_equal.json").write_text(json.dumps(summary, indent=1))
    png = write_plots(cfg, result, RESULTS)[0]
    png.replace(RESULTS / "autopilot_vs_equal.png")
    console.print(f"aggregate throughput: autopilot {result['aggregate_throughput']:,.0f} ops/s, "
                  f"static equal {result['baseline_aggregate_throughput']:,.0f} ops/s "
                  f"-> {result['throughput_ratio']:.2f}x")
    for s in summary["slo"]:
        console.print(f"  SLO {s['tenant']:8} {s['slo']:>9,.0f} ops/s: met "
                      f"{100 * s['met_fraction']:.0f}% (equal split "
                      f"{100 * s['baseline_met_fraction']:.0f}%), first met at interval "
                      f"{s['first_met_interval']}")
    console.print(f"policy matches the offline sweep in {sum(r['match'] for r in sweep)}"
                  f"/{len(sweep)} tenant phases ({100 * match:.0f}%)")
    for r in sweep:
        if not r["match"]:
            console.print(f"  mismatch: {r['tenant']} phase {r['phase']}: chose {r['chosen']}, "
                          f"best {r['best']}")
    console.print(f"wrote {RESULTS / 'autopilot_vs_equal.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
