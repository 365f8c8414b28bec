#!/usr/bin/env python3
"""The autopilot's limits against an equal split, for real, on this host.

Four real tenants share one memory budget on this machine's stock kernel
(its memory controller on cgroup v1 here, v2 elsewhere):

    kv      RocksDB db_bench `readwhilescanning`: point lookups while one
            thread scans the same database (GET-SCAN)
    search  fio sequential passes over a file larger than its share
    zipf    fio 4 KiB random reads, zipf-distributed
    stream  fio sequential reads of a file no share can hold

each through `cachepilot exporter`, so its throughput is the application's
own operations.  Two configurations run interleaved, same tenants, same
budget, caches dropped before each run:

    (a) default_equal   the budget split equally, the kernel's own policy
    (b) limits_only     the controller and the agent as separate processes,
                        gRPC with TLS and a token on loopback, the agent
                        sampling with eBPF and setting limits; the kernel's
                        own policy (this kernel has no cache_ext)

Beside the measurement sits the sim's prediction for the same scenario
(synthetic workloads of the same shapes, the host's measured hit and miss
costs): `cachepilot run`'s machinery under both configurations, so the gap
between the sim and reality is a number.

Writes experiments/results/e2e_host.json and .png.
Usage: experiments/e2e_host.py [--budget MIB] [--interval S] [--intervals N]
                               [--rounds R] [--data DIR] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_lib import (MiB, RESULTS, exit_on_sigterm, host_workspace, measure,  # noqa: E402
                     keep_recording, mean_after, met_fraction, plot, prepare, run_config,
                     tenants)


# the GET tenant asks for this much more than the equal split gave it, in
# the real run and in the sim's alike
KV_SLO_GAIN = 1.2


def sim_prediction(ts, budget: int, intervals: int, warmup: int,
                   service: dict) -> tuple[dict, dict, dict]:
    """The same scenario on the sim backend: equal split vs the controller's
    limits, the kernel's policy only.  kv's SLO is set by the real run's
    rule, KV_SLO_GAIN times what the sim's equal split gave it, so the sim's
    controller weighs the same demand the real one did (without it the sim
    sizes kv by marginal throughput alone).  Returns per tenant ops/s
    under both, the SLOs in the sim's units, and the share of the counted
    intervals each was met in under the controller's limits."""
    from cachepilot.controller.config import config_from_dict
    from cachepilot.run import run_autopilot, run_static_equal, summarise

    def config(slos):
        return config_from_dict({
            "control": {"interval_s": 1.0, "max_step_fraction": 0.25, "hysteresis": 0.01,
                        "warmup_intervals": 2, "anon_margin_bytes": 0},
            "nodes": [{"name": "host", "memory_bytes": budget, "backend": "sim", "seed": 7}],
            "tenants": [{"name": t.name, "node": "host", "floor_bytes": budget // 16,
                         "policies": ["linux"],
                         **({"slo": {"min_throughput": slos[t.name]}} if t.name in slos else {}),
                         # the sim's get-scan threads are `get` and `scan`:
                         # its throughput counts the GETs, as the real one does
                         **({"slo_threads": {"comm": "get"}}
                            if t.slo_threads and t.sim["kind"] == "get-scan" else {}),
                         "workload": {"accesses_per_interval": 20000,
                                      "phases": [t.sim], "service": service}} for t in ts]},
            "e2e_host-sim")

    plain = config({})
    rows, _ = summarise(plain, run_static_equal(plain, intervals), warmup)
    out = {"default_equal": {r["name"]: r["throughput"] for r in rows}}
    slos = {"kv": KV_SLO_GAIN * out["default_equal"]["kv"]}
    cfg = config(slos)
    auto_hist, _, _ = run_autopilot(cfg, intervals)
    rows, _ = summarise(cfg, auto_hist, warmup)
    out["limits_only"] = {r["name"]: r["throughput"] for r in rows}
    met = {r["name"]: r["met_fraction"] for r in rows if r["slo"] is not None}
    return out, slos, met


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=512, help="node memory budget, MiB (512)")
    ap.add_argument("--interval", type=float, default=5.0, help="control interval, s (5)")
    ap.add_argument("--intervals", type=int, default=24, help="intervals per run (24)")
    ap.add_argument("--warmup", type=int, default=6, help="intervals left out of means (6)")
    ap.add_argument("--rounds", type=int, default=2, help="(a),(b) pairs, interleaved (2)")
    ap.add_argument("--data", default="/var/tmp/cachepilot-e2e", help="data folder")
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (smoke)")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    if os.geteuid() != 0:
        print("e2e_host: needs root (cgroups, BPF, drop_caches)", file=sys.stderr)
        return 2
    for tool in ("fio", "db_bench", "openssl"):
        if not shutil.which(tool):
            print(f"e2e_host: {tool} is not installed (make deps)", file=sys.stderr)
            return 2
    if args.quick:
        args.budget, args.intervals, args.warmup, args.rounds = 128, 14, 4, 1
        args.interval = 3.0
    budget = args.budget * MiB
    sizes, cg, version, data, work = host_workspace(budget, 800_000, "cachepilot-e2e",
                                                    args.data)
    print(f"e2e_host: cgroup v{version}, budget {args.budget} MiB, "
          f"{args.intervals} x {args.interval:g} s per run, {args.rounds} round(s)")
    prepare(data, sizes)
    # the workloads outlast the run however long start-up takes: the run
    # stops them
    ts = tenants(data, sizes, int(args.intervals * args.interval + 600))
    for t in ts:
        cg.make(t.name)
    runs = {"default_equal": [], "limits_only": []}
    slos: dict = {}
    for rnd in range(args.rounds):
        for name in runs:
            print(f"  round {rnd + 1}: {name}", flush=True)
            res = run_config(name, ts, cg, budget, args.interval, args.intervals, work, slos)
            runs[name].append(res)
            if name == "default_equal" and not slos:
                slos["kv"] = KV_SLO_GAIN * mean_after(res["series"]["kv"]["ops_per_s"],
                                                      args.warmup)
    measured, ratio, normalised = measure(runs, ts, args.warmup)
    # the host's costs for the sim: a 4 KiB read from memory and from disk
    service = {"t_hit_s": 2e-6, "t_miss_s": 8e-5, "concurrency": 1}
    sim, sim_slo, sim_met = sim_prediction(ts, budget, args.intervals, args.warmup, service)
    sim_ratio = {t.name: sim["limits_only"][t.name] / sim["default_equal"][t.name] for t in ts}
    sim_norm = sum(sim_ratio.values()) / len(sim_ratio)
    result = {
        "host": {"cgroup_version": version, "budget_bytes": budget, "interval_s": args.interval,
                 "intervals": args.intervals, "warmup": args.warmup, "rounds": args.rounds},
        "tenants": [{"name": t.name, "unit": t.unit, "command": t.command} for t in ts],
        "measured_ops_per_s": measured, "ratio": ratio, "normalised": normalised,
        "slo": slos, "slo_met_fraction": met_fraction(runs, slos, args.warmup),
        "agent_cpu_fraction": [r.get("agent_cpu_fraction") for r in runs["limits_only"]],
        "sim": {"ops_per_s": sim, "ratio": sim_ratio, "normalised": sim_norm,
                "service": service, "slo": sim_slo, "slo_met_fraction": sim_met},
        "sim_error": {"normalised": sim_norm - normalised["limits_only"],
                      "per_tenant": {t: sim_ratio[t] - ratio["limits_only"][t]
                                     for t in sim_ratio}},
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("e2e_host_quick.json" if args.quick else "e2e_host.json")
    out.write_text(json.dumps(result, indent=1))
    kept = keep_recording(work, "limits_only", RESULTS,
                          "e2e_host_quick" if args.quick else "e2e_host")
    if kept is not None:
        print(f"kept limits_only's recording (its last round) in {kept}")
    plot(result, out.with_suffix(".png"),
         f"e2e_host: limits only / equal split, normalised {normalised['limits_only']:.3f} "
         f"(sim {sim_norm:.3f})")
    print(f"\n{'tenant':<8} {'equal':>10} {'limits':>10} {'ratio':>7} {'sim ratio':>10}")
    for t in ts:
        print(f"{t.name:<8} {measured['default_equal'][t.name]:>10.0f} "
              f"{measured['limits_only'][t.name]:>10.0f} {ratio['limits_only'][t.name]:>7.3f} "
              f"{sim_ratio[t.name]:>10.3f}")
    print(f"normalised (b)/(a): measured {normalised['limits_only']:.3f}, sim {sim_norm:.3f} "
          f"(sim error {sim_norm - normalised['limits_only']:+.3f})")
    print(f"SLO met fraction: {result['slo_met_fraction']} (sim, under its limits: {sim_met})")
    print(f"agent CPU: {result['agent_cpu_fraction']} of one core")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
