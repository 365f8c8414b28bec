#!/usr/bin/env python3
"""The autopilot end to end on the cache_ext kernel (`make e2e`).

Runs inside the qemu VM that `make e2e` boots (kernel/tests/e2e-in-vm.sh:
the host's userland over virtio-9p, the data disk throttled so that a miss
costs what a disk read does), with the same four real tenants as
experiments/e2e_host.py in cgroup v2 under one node budget, and the
configurations of experiments/e2e_lib.py run one after the other from cold
caches:

    (a) default_equal   equal split, the kernel's own policy
    (b) limits_only     the controller's limits, the kernel's own policy
    (c) autopilot       the controller's limits and its cache_ext policies,
                        attached and swapped by the agent

Writes e2e_vm.json and e2e_vm.png into --out (make e2e: experiments/results).
The best static choice per tenant (d), which needs a sweep of every allowed
policy x a few limits, is not measured by this script yet.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_lib import (MiB, Cgroups, measure, mean_after, memory_hierarchy,  # noqa: E402
                     met_fraction, plot, prepare, run_config, tenants)

CONFIGS = ("default_equal", "limits_only", "autopilot")


def switch_latency(series: dict, interval_count: int) -> dict:
    """Per tenant: the first interval in which a policy other than the
    kernel's own ran, or None."""
    out = {}
    for name, s in series.items():
        out[name] = next((i + 1 for i, p in enumerate(s["policy"][:interval_count])
                          if p not in ("none", "")), None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=320, help="node memory budget, MiB (320)")
    ap.add_argument("--interval", type=float, default=5.0, help="control interval, s (5)")
    ap.add_argument("--intervals", type=int, default=24, help="intervals per run (24)")
    ap.add_argument("--warmup", type=int, default=6, help="intervals left out of means (6)")
    ap.add_argument("--data", default="/tmp/data", help="data folder (the VM's data disk)")
    ap.add_argument("--out", default="/tmp/results", help="where the JSON and PNG go")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    budget = args.budget * MiB
    # kv's two RocksDB processes hold some 30 MiB of anonymous memory each,
    # so an equal share must leave them room for page cache
    scale = budget / (320 * MiB)
    sizes = {"search": int(208 * MiB * scale), "zipf": int(320 * MiB * scale),
             "stream": int(512 * MiB * scale), "kv_keys": int(250_000 * scale)}
    base, version = memory_hierarchy()
    if version != 2:
        print("e2e_vm: expects cgroup v2 (the VM's)", file=sys.stderr)
        return 2
    cg = Cgroups(base / "cachepilot-e2e", version)
    data = Path(args.data)
    work = data / "run"
    work.mkdir(parents=True, exist_ok=True)
    print(f"e2e_vm: budget {args.budget} MiB, {args.intervals} x {args.interval:g} s per run",
          flush=True)
    prepare(data, sizes)
    # the workloads outlast the run however long start-up takes: the run
    # stops them
    ts = tenants(data, sizes, int(args.intervals * args.interval + 1800))
    for t in ts:
        cg.make(t.name)
    runs = {c: [] for c in CONFIGS}
    slos: dict = {}
    for name in CONFIGS:
        print(f"  {name}", flush=True)
        res = run_config(name, ts, cg, budget, args.interval, args.intervals, work, slos)
        runs[name].append(res)
        if name == "default_equal":
            slos["kv"] = 1.2 * mean_after(res["series"]["kv"]["ops_per_s"], args.warmup)
    measured, ratio, normalised = measure(runs, ts, args.warmup)
    auto = runs["autopilot"][0]
    choices = [{"tenant": t.name, "phase": 0,
                "autopilot_policy": max(set(auto["series"][t.name]["policy"][args.warmup:]),
                                        key=auto["series"][t.name]["policy"][args.warmup:].count),
                "best_static_policy": None} for t in ts]
    configs = {}
    for name in CONFIGS:
        s = runs[name][0]["series"]
        configs[name] = {
            "aggregate_ops": sum(measured[name].values()),
            "normalised": normalised[name],
            "tenants": [{"name": t.name, "slo": slos.get(t.name), "ops": measured[name][t.name],
                         "met_fraction": met_fraction(runs, slos, args.warmup)[name].get(t.name),
                         "policy": s[t.name]["policy"][-1], "limit_bytes": s[t.name]["limit_bytes"][-1]}
                        for t in ts]}
    result = {
        "configurations": configs,
        "choices": choices,
        "switch_latency_intervals": list(switch_latency(auto["series"], args.intervals).values()),
        "not_measured": {"best_static": "the offline sweep of (d) is not implemented yet"},
        "agent_cpu_fraction": {c: runs[c][0].get("agent_cpu_fraction") for c in CONFIGS},
        "tenants": [{"name": t.name, "unit": t.unit, "allowed": t.policies} for t in ts],
        "ratio": ratio, "slo": slos, "runs": runs,
        "vm": {"budget_bytes": budget, "interval_s": args.interval,
               "intervals": args.intervals, "warmup": args.warmup,
               "wall_s": time.monotonic() - t_start},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e_vm.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "e2e_vm.png",
         "e2e_vm: " + ", ".join(f"{c} {normalised[c]:.3f}" for c in CONFIGS) +
         " (normalised to default_equal)")
    print(f"\n{'tenant':<8}" + "".join(f"{c:>15}" for c in CONFIGS))
    for t in ts:
        print(f"{t.name:<8}" + "".join(f"{measured[c][t.name]:>15.0f}" for c in CONFIGS))
    print("normalised: " + ", ".join(f"{c} {normalised[c]:.3f}" for c in CONFIGS))
    print(f"autopilot policies: {[(c['tenant'], c['autopilot_policy']) for c in choices]}")
    print(f"wrote {out / 'e2e_vm.json'} and {out / 'e2e_vm.png'} "
          f"({time.monotonic() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
