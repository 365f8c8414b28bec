#!/usr/bin/env python3
"""The autopilot end to end on the cache_ext kernel (`make e2e`).

Runs inside the qemu VM that `make e2e` boots (kernel/tests/e2e-in-vm.sh:
the host's userland over virtio-9p), with four real tenants in cgroup v2
under one node budget (experiments/e2e_lib.py), each with its own disk
bandwidth (io.max) and its own CPU share (cpu.max), so that a miss costs
what a disk read does and one tenant's misses or hits do not slow another:
kv (RocksDB GETs while a second
reader scans), search (sequential passes that turn into zipf point lookups
halfway: the phase change), zipf (fio random reads) and stream (a scan no
memory helps).

First an offline sweep finds the best static choice: every tenant's
allowed policies x a few limits, measured for real with all tenants
running, each setting warmed up before it is measured.  Then the
configurations run one after another from cold caches, each with the phase
change halfway:

    (a) default_equal   equal split, the kernel's own policy
    (b) limits_only     the controller's limits, the kernel's own policy
    (c) autopilot       the controller's limits and its cache_ext policies,
                        attached and swapped by the agent
    (d) best_static     the sweep's best (policy, limit) per tenant within
                        the budget, set once
    agent_sampling      (a) with an agent sampling and building curves but
                        not acting, right after (a): the agent's cost to
                        RocksDB's GETs
    (a) again           last: how far the same configuration drifts over
                        the run, the noise every ratio carries

Writes e2e_vm.json and e2e_vm.png into --out (make e2e: experiments/results).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_lib import (MiB, Cgroups, finish_run, mean, measure_intervals,  # noqa: E402
                     memory_hierarchy, plot, prepare, run_config, set_static,
                     start_run, tenants)

CONFIGS = ("default_equal", "limits_only", "autopilot", "best_static")
# what the controller may choose per tenant (and the sweep tries); "linux"
# is the kernel's own policy
ALLOWED = {"kv": ["linux", "s3fifo", "lfu"], "search": ["linux", "mru", "s3fifo"],
           "zipf": ["linux", "lfu", "s3fifo"], "stream": ["linux", "mru"]}
LIMIT_FACTORS = (2.0, 1.0, 0.5)      # of the equal share, largest first
# each tenant's own disk (io.max): reads and bytes per second, together
# below the data disk's own throttle (the Makefile's E2E_DISK), so that no
# tenant's misses slow another's.  A 4 KiB miss costs 2.5-5 ms, as on a
# network volume: under emulation a cached 4 KiB read costs some 20-30 us
# of CPU, so a miss costs about a hundred hits, as against an SSD on real
# hardware.  4 MiB/s makes a sequential pass bandwidth-bound.
IO = {"kv": (200, 4 * MiB), "search": (400, 4 * MiB), "zipf": (400, 8 * MiB),
      "stream": (40, 4 * MiB)}
# each tenant's CPU share (cpu.max, in CPUs of the VM's 2): together 1.2,
# which leaves the rest to the agent, the controller and the kernel, as a
# host reserves CPU for its system daemons.  kv has two GET threads and a
# scanner.
CPU = {"kv": 0.45, "search": 0.3, "zipf": 0.3, "stream": 0.15}
# the cache_ext paper's speedups over the kernel's default for the same
# kind of workload (its sections 6.1-6.2)
PAPER = {"kv": ("GET-SCAN, application-informed policy", 1.70),
         "search": ("file search, MRU", 2.0),
         "zipf": ("YCSB (zipfian), LFU", 1.37),
         "stream": ("no figure for a pure scan", None)}


def windows(intervals: int, phase_at: int, warmup: int, settle: int) -> dict:
    """The measured intervals of each phase (0-based, end exclusive): from
    `warmup` after the start to the phase change, and from `settle` after
    it to the end."""
    return {0: (warmup, phase_at), 1: (phase_at + settle, intervals)}


def phase_means(series: dict, win: dict, phased: bool) -> dict:
    """{phase: mean ops/s} of one tenant's series; a one-phase tenant's
    phases are one window from warm-up to the end."""
    ops = series["ops_per_s"]
    if not phased:
        return {0: mean(ops[win[0][0]:])}
    return {p: mean(ops[a:b]) for p, (a, b) in win.items()}


def sweep(ts, cg, budget, interval, warm, meas, work) -> list[dict]:
    """The offline sweep: the tenants run once; every setting of (policy,
    limit) per tenant is applied in place, warmed up for `warm` intervals
    and measured for `meas`.  Limits go from large to small (a shrink
    settles at once; the first setting of each half, where limits grow,
    warms three times as long, since a cache fills only as fast as its
    tenant misses) and policies rotate within each limit; with a two-phase
    tenant, the sweep runs once per phase."""
    share = budget // len(ts)
    run = start_run("sweep", ts, cg, budget, interval, work, {})
    trials = []
    phased = any(t.phase_pidfile for t in ts)
    width = max(len(t.policies) for t in ts)
    try:
        for half in ((0, 1) if phased else (0,)):
            if half:
                for t in ts:
                    t.switch_phase()
            for f in LIMIT_FACTORS:
                for j in range(width):
                    static = {t.name: (t.policies[j % len(t.policies)], int(f * share))
                              for t in ts}
                    label = f"sweep p{half} x{f:g} " + ",".join(p for p, _ in static.values())
                    try:
                        set_static(ts, cg, static)
                    except RuntimeError as err:
                        # a setting that cannot be made is no candidate
                        print(f"    {label}: {err}", flush=True)
                        trials.append({"phase": half, "factor": f, "error": str(err),
                                       "settings": {n: list(v) for n, v in static.items()},
                                       "ops": {t.name: float("nan") for t in ts}})
                        continue
                    first = f == LIMIT_FACTORS[0] and j == 0
                    measure_intervals(run, ts, cg, interval, 3 * warm if first else warm,
                                      label=label + " (warm)")
                    s = measure_intervals(run, ts, cg, interval, meas, label=label)
                    trials.append({"phase": half, "factor": f,
                                   "settings": {n: list(v) for n, v in static.items()},
                                   "ops": {t.name: mean(s[t.name]["ops_per_s"]) for t in ts}})
    finally:
        finish_run(run, ts, cg)
    return trials


def sweep_table(trials, ts) -> dict:
    """{tenant: {phase: {(policy, factor): mean ops/s}}}; a one-phase
    tenant's measurements from both halves are pooled as phase 0."""
    acc: dict = {}
    for tr in trials:
        for t in ts:
            phase = tr["phase"] if t.phase_pidfile else 0
            policy = tr["settings"][t.name][0]
            acc.setdefault(t.name, {}).setdefault(phase, {}).setdefault(
                (policy, tr["factor"]), []).append(tr["ops"][t.name])
    return {n: {p: {k: mean(v) for k, v in d.items()} for p, d in ph.items()}
            for n, ph in acc.items()}


def best_static(table, ts, budget) -> tuple[dict, float]:
    """The oracle: one (policy, limit) per tenant, limits within the
    budget, maximising the mean over tenants of ops relative to the
    kernel's policy at an equal share (a two-phase tenant: the mean of its
    phases)."""
    share = budget // len(ts)
    options = {}
    for t in ts:
        ph = table[t.name]
        base = {p: ph[p].get(("linux", 1.0)) or float("nan") for p in ph}
        options[t.name] = [(pol, f, mean([ph[p][(pol, f)] / base[p] for p in ph]))
                           for (pol, f) in ph[0]]
    best, best_score = None, -1.0
    for combo in itertools.product(*(options[t.name] for t in ts)):
        if sum(f for _, f, _ in combo) > len(ts) + 1e-9:
            continue
        score = mean([s for _, _, s in combo])
        if score > best_score:
            best, best_score = combo, score
    if best is None:
        raise SystemExit("e2e_vm: the sweep measured no setting that fits the budget")
    return {t.name: (pol, int(f * share)) for t, (pol, f, _) in zip(ts, best)}, best_score


def nearest_factor(limit: float, share: int) -> float:
    return min(LIMIT_FACTORS, key=lambda f: abs(f * share - limit))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=320, help="node memory budget, MiB (320)")
    ap.add_argument("--interval", type=float, default=5.0,
                    help="measured interval (throughput read from the tenants), s (5)")
    ap.add_argument("--control-interval", type=float, default=10.0,
                    help="the agent's and the controller's interval, s (10)")
    ap.add_argument("--intervals", type=int, default=48,
                    help="measured intervals per configuration, the phase change halfway (48)")
    ap.add_argument("--warmup", type=int, default=8,
                    help="measured intervals left out of means after the start (8: a "
                         "cache fills only as fast as its tenant misses)")
    ap.add_argument("--settle", type=int, default=5,
                    help="measured intervals left out of means after the phase change (5; "
                         "under emulation the second phase's fio takes some 20 s to start)")
    ap.add_argument("--sweep-warm", type=int, default=3, help="sweep: warm-up intervals (3)")
    ap.add_argument("--sweep-measure", type=int, default=4, help="sweep: measured intervals (4)")
    ap.add_argument("--data", default="/tmp/data", help="data folder (the VM's data disk)")
    ap.add_argument("--out", default="/tmp/results", help="where the JSON and PNG go")
    args = ap.parse_args(argv)
    if args.intervals < 2 * (args.warmup + 1) or args.intervals // 2 <= args.settle:
        ap.error("--intervals must leave measured intervals in both phases")
    t_start = time.monotonic()
    budget = args.budget * MiB
    share = budget // 4
    scale = budget / (320 * MiB)
    # search's file outgrows its equal share; a pass takes some 25 s at its
    # disk's 4 MiB/s, so a policy that keeps part of it shows within a phase
    sizes = {"search": int(100 * MiB * scale), "zipf": int(320 * MiB * scale),
             "stream": int(512 * MiB * scale), "kv_keys": int(250_000 * scale)}
    base, version = memory_hierarchy()
    if version != 2:
        print("e2e_vm: expects cgroup v2 (the VM's)", file=sys.stderr)
        return 2
    cg = Cgroups(base / "cachepilot-e2e", version)
    data = Path(args.data)
    work = data / "run"
    work.mkdir(parents=True, exist_ok=True)
    n_sweep = 2 * len(LIMIT_FACTORS) * max(map(len, ALLOWED.values()))
    print(f"e2e_vm: budget {args.budget} MiB, {args.intervals} x {args.interval:g} s per "
          f"configuration, sweep of {n_sweep} settings", flush=True)
    # the tenants' cgroups first: a kernel without io.max or cpu.max stops
    # the run before the data is written
    for name in IO:
        cg.make(name)
        cg.set_io(name, data, *IO[name])
        cg.set_cpu(name, CPU[name])
    prepare(data, sizes)
    # the workloads outlast every run however long start-up takes: runs stop them
    ts = tenants(data, sizes, 7200, phased=True, policies=ALLOWED)
    phase_at = args.intervals // 2
    win = windows(args.intervals, phase_at, args.warmup, args.settle)

    runs: dict = {}
    slos: dict = {}
    static, trials = None, []
    # (a) and the overhead run beside it, (b), (c) (an autopilot that
    # misbehaves shows early), then the sweep that (d) needs, (d), and (a)
    # once more for the drift
    for name in ("default_equal", "agent_sampling", "limits_only", "autopilot", "sweep",
                 "best_static", "default_equal_repeat"):
        print(f"  {name}", flush=True)
        if name == "sweep":
            trials = sweep(ts, cg, budget, args.interval, args.sweep_warm,
                           args.sweep_measure, work)
            table = sweep_table(trials, ts)
            static, static_score = best_static(table, ts, budget)
            print(f"  best static: {static} (sweep score {static_score:.3f})", flush=True)
            continue
        runs[name] = run_config(name.removesuffix("_repeat"), ts, cg, budget, args.interval,
                                args.intervals, work,
                                slos, static=static if name == "best_static" else None,
                                phase_at=phase_at, control_interval=args.control_interval)
        if name == "default_equal":
            # RocksDB asks for a fifth more GETs than the equal split gave it
            slos["kv"] = 1.2 * phase_means(runs[name]["series"]["kv"], win, False)[0]

    # per tenant (and phase): mean ops/s, ratio to (a), normalised
    measured = {c: {t.name: phase_means(runs[c]["series"][t.name], win,
                                        t.phase_pidfile is not None) for t in ts}
                for c in runs}
    ratio = {c: {n: mean([m[n][p] / measured["default_equal"][n][p] for p in m[n]])
                 for n in m} for c, m in measured.items()}
    normalised = {c: mean(list(r.values())) for c, r in ratio.items()}
    # the geometric mean too: one tenant's large ratio (a loop that comes to
    # fit) cannot hide another's loss in it
    geometric = {c: math.exp(mean([math.log(max(x, 1e-9)) for x in r.values()]))
                 for c, r in ratio.items()}

    def met(c, name, slo, lo=0, hi=None):
        ops = runs[c]["series"][name]["ops_per_s"][lo:hi]
        return [x >= slo for x in ops]

    slo_view = {}
    for n, v in slos.items():
        first = lambda c, lo: next((i + 1 for i, ok in enumerate(met(c, n, v, lo)) if ok),
                                   None)  # noqa: E731
        slo_view[n] = {
            "slo": v,
            "feasible": {"best_static": mean(measured["best_static"][n].values()) >= v,
                         "sweep": max(table[n][0].values()) >= v},
            "met_fraction": {c: mean(met(c, n, v, args.warmup)) for c in CONFIGS},
            "first_met_interval": {c: first(c, 0) for c in CONFIGS},
            "first_met_after_phase_change": {c: first(c, phase_at) for c in CONFIGS}}

    # the policy (c) ran per tenant phase, against the sweep's best at the
    # limit (c) gave it
    auto = runs["autopilot"]["series"]
    choices, latency = [], {}
    for t in ts:
        s = auto[t.name]
        for p, (a, b) in (win.items() if t.phase_pidfile else [(0, (args.warmup,
                                                                     args.intervals))]):
            pols = s["policy"][a:b]
            ran = max(set(pols), key=pols.count) if pols else None
            ran = "linux" if ran == "none" else ran
            f = nearest_factor(mean(s["limit_bytes"][a:b]), share)
            at = {pol: v for (pol, ff), v in table[t.name][p].items() if ff == f}
            best = max(at, key=at.get)
            choices.append({"tenant": t.name, "phase": p, "autopilot_policy": ran,
                            "best_static_policy": best, "at_limit_factor": f,
                            "sweep_ops": at})
        # intervals until the policy that ran settled (from the start, and
        # from the phase change for a two-phase tenant)
        pol = ["linux" if x == "none" else x for x in s["policy"]]
        first_final = next((i + 1 for i in range(phase_at)
                            if pol[i] == pol[phase_at - 1]), None)
        latency[t.name] = {"from_start": first_final}
        if t.phase_pidfile:
            latency[t.name]["after_phase_change"] = next(
                (i - phase_at + 1 for i in range(phase_at, args.intervals)
                 if pol[i] != pol[phase_at - 1]), None)

    configs = {}
    for c in CONFIGS:
        s = runs[c]["series"]
        configs[c] = {
            "aggregate_ops": sum(mean(m.values()) for m in measured[c].values()),
            "normalised": normalised[c],
            "normalised_geometric": geometric[c],
            "tenants": [{"name": t.name, "slo": slos.get(t.name),
                         "ops": mean(measured[c][t.name].values()),
                         "ops_by_phase": measured[c][t.name],
                         "met_fraction": (slo_view[t.name]["met_fraction"][c]
                                          if t.name in slo_view else None),
                         "policy": s[t.name]["policy"][-1],
                         "limit_bytes": s[t.name]["limit_bytes"][-1]} for t in ts]}
    kv_with = mean(measured["agent_sampling"]["kv"].values())
    kv_without = mean(measured["default_equal"]["kv"].values())
    result = {
        "configurations": configs,
        "choices": choices,
        "switch_latency_intervals": [latency[t.name] for t in ts],
        "slo": slo_view,
        "ratio": ratio,
        "parts": {"allocation (b)/(a)": normalised["limits_only"],
                  "policies (c)/(b)": normalised["autopilot"] / normalised["limits_only"],
                  "autopilot (c)/(a)": normalised["autopilot"],
                  "autopilot (c)/(d)": normalised["autopilot"] / normalised["best_static"]},
        "paper": {n: {"workload": w, "speedup": x, "ours_c_over_a": ratio["autopilot"][n]}
                  for n, (w, x) in PAPER.items()},
        # (a) run again at the end, against (a): 1.0 for a run that does
        # not drift; every ratio above carries this much noise
        "noise": {"repeat_over_first": ratio["default_equal_repeat"],
                  "normalised": normalised["default_equal_repeat"]},
        "overhead": {"agent_cpu_fraction_autopilot": runs["autopilot"].get("agent_cpu_fraction"),
                     "readrandom_ops_per_s": {"with_agent_sampling": kv_with,
                                              "without_agent": kv_without,
                                              "ratio": kv_with / kv_without}},
        "best_static": {"settings": {n: list(v) for n, v in static.items()},
                        "sweep_score": static_score},
        "sweep": trials,
        "tenants": [{"name": t.name, "unit": t.unit, "allowed": t.policies,
                     "phases": 2 if t.phase_pidfile else 1} for t in ts],
        "runs": {c: [r] for c, r in runs.items()},
        "vm": {"budget_bytes": budget, "interval_s": args.interval,
               "control_interval_s": args.control_interval,
               "intervals": args.intervals, "phase_change_after": phase_at,
               "warmup": args.warmup, "settle": args.settle,
               "wall_s": time.monotonic() - t_start},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e_vm.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "e2e_vm.png",
         "e2e_vm: " + ", ".join(f"{c} {normalised[c]:.2f}" for c in CONFIGS) +
         " (normalised to default_equal)", phase_at=phase_at)

    print(f"\n{'tenant':<8}" + "".join(f"{c:>15}" for c in CONFIGS) + f"{'paper':>8}")
    for t in ts:
        x = PAPER[t.name][1]
        print(f"{t.name:<8}" + "".join(f"{ratio[c][t.name]:>15.2f}" for c in CONFIGS) +
              (f"{x:>8.2f}" if x else f"{'-':>8}"))
    print("normalised: " + ", ".join(f"{c} {normalised[c]:.3f}" for c in CONFIGS))
    print("geometric mean: " + ", ".join(f"{c} {geometric[c]:.3f}" for c in CONFIGS))
    print("parts: " + ", ".join(f"{k} {v:.3f}" for k, v in result["parts"].items()))
    for c in choices:
        print(f"  {c['tenant']} phase {c['phase']}: autopilot {c['autopilot_policy']}, "
              f"best static {c['best_static_policy']} (at {c['at_limit_factor']:g} x share)")
    print("noise, (a) again over (a): " + ", ".join(
        f"{n} {v:.2f}" for n, v in ratio["default_equal_repeat"].items()) +
        f", normalised {normalised['default_equal_repeat']:.3f}")
    print(f"SLOs: {json.dumps(slo_view)}")
    print(f"overhead: {json.dumps(result['overhead'])}")
    print(f"wrote {out / 'e2e_vm.json'} and {out / 'e2e_vm.png'} "
          f"({time.monotonic() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
