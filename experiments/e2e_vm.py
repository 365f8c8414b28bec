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
from dataclasses import replace
import json
import math
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_lib  # noqa: E402
from e2e_lib import (ANON_MARGIN, MiB, Cgroups, drop_caches, end_run, exit_on_sigterm,  # noqa: E402
                     finish_run, mean, measure_intervals, memory_hierarchy, plot, prepare,
                     run_config, set_static, start_run, tenants, warm_up)

CONFIGS = ("default_equal", "limits_only", "autopilot", "best_static")
# what the controller may choose per tenant (and the sweep tries); "linux"
# is the kernel's own policy
ALLOWED = {"kv": ["linux", "get_scan", "s3fifo"], "search": ["linux", "mru", "s3fifo"],
           "zipf": ["linux", "lfu", "s3fifo"], "stream": ["linux", "mru"]}
# of the equal share, largest first; 0.25 is the tenants' floor, where the
# controller may leave a tenant whose curve says memory buys it little
LIMIT_FACTORS = (2.0, 1.0, 0.5, 0.25)
# each tenant's own disk (io.max): reads and bytes per second, together
# below the data disk's own throttle (the Makefile's E2E_DISK), so that no
# tenant's misses slow another's.  A 4 KiB miss costs 2.5-10 ms, as on a
# network volume: under emulation a cached 4 KiB read costs some 20-30 us
# of CPU, so a miss costs a hundred hits or more, as against an SSD on real
# hardware, and at an equal share every tenant waits on its disk.  search
# reads 8 MiB/s: a pass over its file takes seconds, so its curve and its
# cache both fill within a few intervals.
IO = {"kv": (300, 4 * MiB), "search": (400, 8 * MiB), "zipf": (400, 8 * MiB),
      "stream": (40, 4 * MiB)}
# each tenant's CPU share (cpu.max, in CPUs of the VM's 2): together 1.5,
# which leaves the rest to the agent, the controller and the kernel, as a
# host reserves CPU for its system daemons.  kv has two GET threads and a
# scanner.
CPU = {"kv": 0.5, "search": 0.4, "zipf": 0.5, "stream": 0.1}
# how skewed kv's GETs are (db_bench's read_random_exp_range: key num * e^-r,
# r uniform in [0, KV_SKEW], scattered over the key space)
KV_SKEW = 5.0
# a sweep pass fills its caches, disk limits lifted, until every tenant's
# page cache grew by at most FILL_TOLERANCE of its limit in an interval, for
# at most FILL_MAX_INTERVALS intervals (at its disk's 300 reads a second kv
# would take some two minutes to fill 160 MiB)
FILL_TOLERANCE = 0.01
FILL_MAX_INTERVALS = 24
# ... with every tenant's reads and bytes a second (io.max) raised by these
# factors, together still under the data disk's own throttle (the
# Makefile's E2E_DISK: 8,000 reads and 64 MiB a second)
FILL_SPEEDUP = (4, 2)
# the tenants whose GETs or reads have an SLO (derive_slos sets its level:
# SLO_GAIN times the equal split's, where the sweep found SLO_HEADROOM)
SLO_TENANTS = ("kv", "zipf")
SLO_GAIN, SLO_HEADROOM = 1.15, 1.3
# the cache_ext paper's speedups over the kernel's default for the same
# kind of workload (its sections 6.1-6.2)
PAPER = {"kv": ("GET-SCAN, application-informed policy", 1.70),
         "search": ("file search, MRU", 2.0),
         "zipf": ("YCSB (zipfian), LFU", 1.37),
         "stream": ("no figure for a pure scan", None)}


OVERHEAD_SKIP = 2      # intervals of each readrandom run left out of its mean


def overhead(ts, cg, budget, interval, intervals, reps, work, data) -> dict:
    """The agent's cost to a CPU-bound RocksDB: kv's readrandom alone (no
    scanner, no disk limit, as fast as its CPU share lets it) over its
    database, cached in full, without an agent and with one sampling and
    building curves, `reps` times each in turn."""
    kv = replace(next(t for t in ts if t.name == "kv"), helpers=[])
    cg.unset_io("kv", data)
    ops = {"without_agent": [], "with_agent_sampling": []}
    cpu = []
    try:
        for _ in range(reps):
            for name, config in (("without_agent", "default_equal"),
                                 ("with_agent_sampling", "agent_sampling")):
                drop_caches()
                cg.set_limit("kv", budget)      # what run_config gives it, before
                warm_up(kv, cg, sorted((data / "db").glob("*.sst")))
                r = run_config(config, [kv], cg, budget, interval, intervals, work, {},
                               cold=False)
                # its GET threads take a few seconds to reach speed
                ops[name].append(mean(r["series"]["kv"]["ops_per_s"][OVERHEAD_SKIP:]))
                if name == "with_agent_sampling":
                    cpu.append(r.get("agent_cpu_fraction"))
                print(f"    overhead {name}: {ops[name][-1]:.0f} GETs/s", flush=True)
    finally:
        cg.set_io("kv", data, *IO["kv"])
    without, with_agent = mean(ops["without_agent"]), mean(ops["with_agent_sampling"])
    return {"readrandom_ops_per_s": ops, "without_agent": without,
            "with_agent_sampling": with_agent, "ratio": with_agent / without,
            "agent_cpu_fraction": mean(cpu)}


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


def sweep(ts, cg, budget, interval, warm, meas, work, data, factors=LIMIT_FACTORS,
          rounds: int = 1) -> list[dict]:
    """The offline sweep: the tenants run once; each tenant's allowed
    policies are measured one after another, each over every limit.  A
    policy's pass starts from cold caches with the policy attached to
    the empty cache at the largest limit, filled at full disk speed until
    every tenant's page cache has stopped growing (`fill`), then steps
    down through the limits (`factors` of the equal share, largest first),
    each warmed for `warm` intervals and measured for `meas`.  With a
    two-phase tenant, the sweep runs once per phase, and each phase runs
    the rotation of policies `rounds` times (more than once only in the
    diagnostic runs, to see how far a comparison repeats within one boot).

    Why in passes: a policy swapped in place inherits a cache its
    predecessor filled, and at two shares (160 MiB, a few hundred misses
    a second) a cache takes minutes to turn over.  Measured a minute after
    a swap, a policy read what its predecessor had cached (kv under
    get_scan fell from 680 to 500 GETs/s right after linux), and the
    order of the rotation decided the comparison.  Within a pass only the
    limit moves, and after a shrink the policy itself chooses what stays.
    The pass order rotates in each half (`rotation`)."""
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
            for j in range(width * rounds):
                policy = {t.name: rotation(t.policies, j, half) for t in ts}
                for fi, f in enumerate(factors):
                    limits = {t.name: sweep_limit(f * share, cg.anon_bytes(t.name))
                              for t in ts}
                    static = {t.name: (policy[t.name], limits[t.name])
                              for t in ts if limits[t.name]}
                    label = f"sweep p{half} x{f:g} " + ",".join(p for p, _ in static.values())
                    try:
                        if fi == 0:
                            fill(run, ts, cg, interval, static, data, label)
                        else:
                            set_static(ts, cg, static)
                    except RuntimeError as err:
                        # a setting that cannot be made is no candidate
                        print(f"    {label}: {err}", flush=True)
                        trials.append({"phase": half, "pass": j, "factor": f, "error": str(err),
                                       "settings": {n: list(v) for n, v in static.items()},
                                       "ops": {n: float("nan") for n in static}})
                        continue
                    measure_intervals(run, ts, cg, interval, warm, label=label + " (warm)")
                    s = measure_intervals(run, ts, cg, interval, meas, label=label)
                    trials.append({"phase": half, "pass": j, "factor": f,
                                   "settings": {n: list(v) for n, v in static.items()},
                                   "ops": {n: mean(s[n]["ops_per_s"]) for n in static},
                                   "series": {n: s[n]["ops_per_s"] for n in static}})
    finally:
        for t in ts:
            cg.set_io(t.name, data, *IO[t.name])
        finish_run(run, ts, cg)
    return trials


def fill(run, ts, cg, interval, static, data, label):
    """A policy pass's start: every tenant's policy swapped back to the
    kernel's, the page cache dropped, `static` set (each policy attached
    to an empty cache), and every tenant's disk limits raised by
    FILL_SPEEDUP until every page cache has stopped growing
    (`cache_settled`, at most FILL_MAX_INTERVALS), so that a cache fills
    in well under a minute rather than in the minutes its tenant's misses
    would take; the limits are then set back.  Raised, not lifted: stream,
    unlimited, took the whole disk and the others' caches did not fill in
    two minutes.  What a cache holds when full comes from the tenant's
    own reads either way."""
    set_static(ts, cg, {n: ("linux", lim) for n, (_, lim) in static.items()})
    drop_caches()
    set_static(ts, cg, static)
    for t in ts:
        riops, rbps = IO[t.name]
        cg.set_io(t.name, data, FILL_SPEEDUP[0] * riops, FILL_SPEEDUP[1] * rbps)
    try:
        cache = {n: [] for n in static}
        for _ in range(FILL_MAX_INTERVALS):
            w = measure_intervals(run, ts, cg, interval, 1, label=label + " (filling)")
            for n in static:
                cache[n] += w[n]["cache_bytes"]
            if cache_settled(cache, static):
                break
    finally:
        for t in ts:
            cg.set_io(t.name, data, *IO[t.name])


def filled_run(name, ts, cg, budget, args, work, static, phase_at) -> dict:
    """An uncontrolled run (`--only ... --static ... --fill`) that starts as
    a sweep pass does: `static` attached to empty caches, which `fill`
    fills at raised disk limits, then `args.intervals` measured.  Beside
    the same run filled by the tenants' own reads from cold, it shows what
    the sweep's way of starting does to a comparison of policies."""
    run = start_run(name, ts, cg, budget, args.control_interval, work, {}, static)
    try:
        fill(run, ts, cg, args.interval, static, Path(args.data), f"{name} (fill)")
        series = measure_intervals(run, ts, cg, args.interval, args.intervals, phase_at)
    except BaseException:
        end_run(run, ts, cg)
        raise
    return {"series": series, **finish_run(run, ts, cg)}


def rotation(policies: list[str], j: int, half: int) -> str:
    """The policy of a tenant's `j`-th pass in sweep half `half`: the
    order starts one policy further in each half, so that a one-phase
    tenant's two measurements of a setting, pooled, come from different
    places in the order."""
    return policies[(j + half) % len(policies)]


def cache_settled(cache: dict, static: dict, tol: float = FILL_TOLERANCE) -> bool:
    """Whether every tenant of `static` ({tenant: (policy, limit)}) has
    stopped filling its page cache: over the last interval of `cache`
    ({tenant: page cache bytes at the end of each measured interval}) it
    grew by at most `tol` of its limit.  A cache held below its limit by
    what its tenant reads (a file smaller than the limit) has settled too;
    one interval alone says nothing yet."""
    for name, (_, limit) in static.items():
        c = cache[name]
        if len(c) < 2 or c[-1] - c[-2] > tol * limit:
            return False
    return True


def sweep_limit(limit: float, anon: int) -> int:
    """The limit the sweep sets for a factor's `limit`: no less than the
    tenant's anonymous memory and margin, as the safety rules never set
    less (a fio tenant's at the floor factor); 0 -- not swept, the tenant
    keeps its setting, unmeasured -- when that is over a quarter more than
    the factor's limit (RocksDB's at the floor): it would be another
    factor."""
    need = anon + ANON_MARGIN
    if need > 1.25 * limit:
        return 0
    return int(max(limit, -(-need // MiB) * MiB))


def sweep_table(trials, ts) -> dict:
    """{tenant: {phase: {(policy, factor): mean ops/s}}}; a one-phase
    tenant's measurements from both halves are pooled as phase 0."""
    acc: dict = {}
    for tr in trials:
        for t in ts:
            if t.name not in tr["settings"]:
                continue
            phase = tr["phase"] if t.phase_pidfile else 0
            policy = tr["settings"][t.name][0]
            acc.setdefault(t.name, {}).setdefault(phase, {}).setdefault(
                (policy, tr["factor"]), []).append(tr["ops"][t.name])
    return {n: {p: {k: mean(v) for k, v in d.items()} for p, d in ph.items()}
            for n, ph in acc.items()}


def sweep_error(trials, ts) -> dict:
    """{tenant: {phase: {(policy, factor): standard error of its mean}}}.

    The larger of two: the spread of the measured intervals of the
    setting, and the spread between passes.  A pass fills its caches anew,
    and the passes of one setting stray from each other by more than their
    intervals' spread says (docs/results.md, End to end: a sweep repeated in one boot), so the
    intervals alone make a lead of a few per cent look sure.  The
    passes' spread is a tenant's relative variance between the pass means
    of its settings measured more than once, pooled over them (one or two
    passes a setting give too few to stand alone), scaled to each
    setting's mean and its number of passes; a tenant with no setting
    measured twice has the intervals' spread only."""
    acc: dict = {}
    passes: dict = {}
    for tr in trials:
        for t in ts:
            if t.name not in tr["settings"]:
                continue
            phase = tr["phase"] if t.phase_pidfile else 0
            key = (tr["settings"][t.name][0], tr["factor"])
            acc.setdefault(t.name, {}).setdefault(phase, {}).setdefault(key, []).extend(
                x for x in tr.get("series", {}).get(t.name, []) if x == x)
            ops = tr["ops"][t.name]
            if ops == ops:
                passes.setdefault(t.name, {}).setdefault((phase, key), []).append(ops)
    rel_var = {}
    for name, by in passes.items():
        # per setting measured more than once: its squared deviations
        # relative to its mean, and its degrees of freedom
        dev = [(sum((x - mu) ** 2 for x in v) / mu ** 2, len(v) - 1)
               for v in by.values() if len(v) > 1 and (mu := mean(v)) > 0]
        dof = sum(d for _, d in dev)
        if dof:
            rel_var[name] = sum(ss for ss, _ in dev) / dof

    def err(name, phase, key, v):
        within = stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("inf")
        got = passes.get(name, {}).get((phase, key), [])
        if name not in rel_var or not got:
            return within
        return max(within, mean(got) * math.sqrt(rel_var[name] / len(got)))
    return {n: {p: {k: err(n, p, k, v) for k, v in d.items()} for p, d in ph.items()}
            for n, ph in acc.items()}


def stdev(v):
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def best_policies(at: dict, err: dict) -> list[str]:
    """The policies the sweep cannot tell from the best at one limit: each
    whose mean is within two standard errors of their difference of the
    best's (at, err: {policy: mean ops/s}, {policy: its standard error})."""
    best = max(at, key=at.get)
    return sorted(p for p in at if at[best] - at[p] <=
                  2 * math.sqrt(err.get(best, 0.0) ** 2 + err.get(p, 0.0) ** 2))


def best_static(table, ts, budget, slos: dict | None = None) -> tuple[dict, float]:
    """The oracle: one (policy, limit) per tenant, limits within the
    budget, meeting as many of the SLOs as the sweep says any such choice
    can (as the controller serves SLOs first), and among those maximising
    the mean over tenants of ops relative to the kernel's policy at an
    equal share (a two-phase tenant: the mean of its phases)."""
    share = budget // len(ts)
    slos = slos or {}
    options = {}
    for t in ts:
        ph = table[t.name]
        base = {p: ph[p].get(("linux", 1.0)) or float("nan") for p in ph}
        options[t.name] = [
            (pol, f, mean([ph[p][(pol, f)] / base[p] for p in ph]),
             t.name in slos and mean([ph[p][(pol, f)] for p in ph]) >= slos[t.name])
            for (pol, f) in ph[0] if all((pol, f) in ph[p] for p in ph)]
    best, best_key = None, (-1, -1.0)
    for combo in itertools.product(*(options[t.name] for t in ts)):
        if sum(f for _, f, _, _ in combo) > len(ts) + 1e-9:
            continue
        key = (sum(met for *_, met in combo), mean([s for _, _, s, _ in combo]))
        if key > best_key:
            best, best_key = combo, key
    if best is None:
        raise SystemExit("e2e_vm: the sweep measured no setting that fits the budget")
    return ({t.name: (pol, int(f * share)) for t, (pol, f, _, _) in zip(ts, best)},
            best_key[1])


def nearest_factor(limit: float, share: int, factors=LIMIT_FACTORS) -> float:
    """The sweep's limit factor nearest a limit, on the factors' own
    (geometric) scale; `factors`: those measured."""
    return min(factors, key=lambda f: abs(math.log(f * share / max(limit, 1.0))))


DIAGNOSABLE = ("default_equal", "agent_sampling", "limits_only", "autopilot", "sweep",
               "overhead")


def print_sweep(trials, ts):
    """The sweep's table: per tenant and phase, each (policy, limit factor)
    with its mean ops/s and standard error."""
    table, errors = sweep_table(trials, ts), sweep_error(trials, ts)
    for t in ts:
        for p, row in sorted(table[t.name].items()):
            print(f"    {t.name:<7} p{p}: " + "  ".join(
                f"{pol}@{f:g} {v:.0f}±{errors[t.name][p][(pol, f)]:.0f}"
                for (pol, f), v in sorted(row.items(), key=lambda kv: (-kv[0][1], kv[0][0]))),
                flush=True)


def parse_factors(text: str | None) -> tuple[float, ...]:
    """`--sweep-factors 2,1`: the factors of the equal share a diagnostic
    sweep measures, largest first (a pass fills at the first); LIMIT_FACTORS
    where none are given.  ValueError on one that is not a number in
    (0, 16] or a list not strictly decreasing."""
    if text is None:
        return LIMIT_FACTORS
    try:
        out = tuple(float(f) for f in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a list of numbers") from None
    if not all(0 < f <= 16 for f in out):
        raise ValueError(f"{text!r}: every factor must be in (0, 16]")
    if list(out) != sorted(set(out), reverse=True):
        raise ValueError(f"{text!r}: the factors must be distinct, largest first")
    return out


def parse_static(text: str | None) -> dict:
    """`--static kv=get_scan@2,search=mru@0.5`: {tenant: (policy, factor
    of the equal share)}.  ValueError on a tenant or policy not in
    ALLOWED or an entry not of that form."""
    out = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, rest = item.strip().partition("=")
        policy, at, factor = rest.partition("@")
        if not eq or not at or not policy:
            raise ValueError(f"{item.strip()!r} is not TENANT=POLICY@FACTOR")
        if name not in ALLOWED:
            raise ValueError(f"no tenant {name!r} (have {', '.join(ALLOWED)})")
        if policy not in ALLOWED[name]:
            raise ValueError(f"{name} may run {', '.join(ALLOWED[name])}, not {policy!r}")
        try:
            f = float(factor)
        except ValueError:
            raise ValueError(f"{item.strip()!r}: the factor is not a number") from None
        if not 0 < f <= 16:
            raise ValueError(f"{item.strip()!r}: the factor must be in (0, 16]")
        out[name] = (policy, f)
    return out


def diagnose(args, ts, cg, budget, work, phase_at, win, t_start) -> int:
    """`--only`: the named configurations alone, one after another, each
    tenant's mean ops/s and CPU per phase printed, every interval kept."""
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in DIAGNOSABLE]
    if bad or not names:
        print(f"e2e_vm: --only takes configurations of {', '.join(DIAGNOSABLE)}; "
              f"got {args.only!r}", file=sys.stderr)
        return 2
    static = {n: (policy, int(f * (budget // len(ts))))
              for n, (policy, f) in args.static_settings.items()}
    runs, trials = {}, []
    for name in names:
        print(f"  {name}", flush=True)
        if name == "sweep":
            trials = sweep(ts, cg, budget, args.interval, args.sweep_warm,
                           args.sweep_measure, work, Path(args.data),
                           args.sweep_factor_list, args.sweep_rounds)
            print_sweep(trials, ts)
            continue
        if name == "overhead":
            runs[name] = overhead(ts, cg, budget, args.interval, args.overhead_intervals,
                                  args.overhead_reps, work, Path(args.data))
            print(f"    overhead: {json.dumps(runs[name])}", flush=True)
            continue
        fixed = static if name not in e2e_lib.CONTROLLED else None
        if fixed and args.fill:
            runs[name] = filled_run(name, ts, cg, budget, args, work, fixed, phase_at)
        else:
            runs[name] = run_config(name, ts, cg, budget, args.interval, args.intervals, work,
                                    {}, static=fixed, phase_at=phase_at,
                                    control_interval=args.control_interval)
        s = runs[name]["series"]
        for t in ts:
            ops = phase_means(s[t.name], win, t.phase_pidfile is not None)
            cpu = phase_means({"ops_per_s": s[t.name]["cpu"]}, win,
                              t.phase_pidfile is not None)
            print(f"    {t.name:<7} ops/s " + ", ".join(f"p{p} {v:.0f}" for p, v in ops.items())
                  + "; CPUs " + ", ".join(f"p{p} {v:.2f}" for p, v in cpu.items()), flush=True)
            if "observed_miss_ratio" in s[t.name]:
                # what the agent saw against what each policy's curve said
                # at the limit, per phase
                phased = t.phase_pidfile is not None
                curves = s[t.name]["curves_at_limit"]
                seen = phase_means({"ops_per_s": s[t.name]["observed_miss_ratio"]}, win, phased)
                said = {pol: phase_means({"ops_per_s": [c.get(pol, float("nan")) for c in curves]},
                                         win, phased)
                        for pol in sorted({k for c in curves for k in c})}
                for p, v in seen.items():
                    print(f"            p{p} miss ratio observed {v:.3f}; curves "
                          + ", ".join(f"{pol} {m[p]:.3f}" for pol, m in said.items()), flush=True)
        host = s["_host"]
        print(f"    busy CPUs {mean(host['busy_cpus'][args.warmup:]):.2f}, agent "
              f"{mean(host['agent_cpus'][args.warmup:]):.2f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e_vm_diag.json").write_text(json.dumps(
        {"runs": runs, "sweep": trials, "vm": {"budget_bytes": budget, "interval_s": args.interval,
                              "intervals": args.intervals, "wall_s": time.monotonic() - t_start}},
        indent=1))
    title = " ".join(["make e2e", *argv_of(args)])
    pngs = []
    measured = {n: [r] for n, r in runs.items() if "series" in r}
    if measured:
        plot({"tenants": [{"name": t.name} for t in ts], "runs": measured},
             out / "e2e_vm_diag.png", title, phase_at)
        pngs.append(out / "e2e_vm_diag.png")
    if any("series" in tr for tr in trials):
        plot_sweep(trials, [t.name for t in ts], out / "e2e_vm_diag_sweep.png", title)
        pngs.append(out / "e2e_vm_diag_sweep.png")
    print(f"wrote {out / 'e2e_vm_diag.json'}" + "".join(f" and {p}" for p in pngs)
          + f" ({time.monotonic() - t_start:.0f} s)")
    return 0


def argv_of(args) -> list[str]:
    """The diagnostic options a run was given, as on its command line."""
    out = ["--only", args.only]
    for flag, value in (("--static", args.static), ("--sweep-factors", args.sweep_factors)):
        if value:
            out += [flag, value]
    if args.sweep_rounds != 1:
        out += ["--sweep-rounds", str(args.sweep_rounds)]
    if args.fill:
        out.append("--fill")
    if "sweep" in args.only.split(","):
        out += ["--sweep-warm", str(args.sweep_warm), "--sweep-measure", str(args.sweep_measure)]
    return out


def plot_sweep(trials, names: list[str], path: Path, title: str):
    """A diagnostic sweep, pass by pass: per tenant, each pass's mean ops/s
    at each factor (with its standard error over the measured intervals),
    coloured by the tenant's policy in that pass, in the order the passes
    ran; a dotted line where the phase changed.  Beside the pooled table,
    it shows how far passes of one setting stray from each other."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.6), squeeze=False)
    order = sorted({(tr["phase"], tr.get("pass", 0)) for tr in trials})
    x_of = {k: i for i, k in enumerate(order)}
    factors = sorted({tr["factor"] for tr in trials}, reverse=True)
    markers = dict(zip(factors, "osD^v<>"))
    for ax, n in zip(axes[0], names):
        colours: dict[str, str] = {}
        labelled: set[str] = set()
        for tr in trials:
            v = [x for x in tr.get("series", {}).get(n, []) if x == x]
            if not v:
                continue
            pol = tr["settings"][n][0]
            c = colours.setdefault(pol, f"C{len(colours)}")
            se = stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0
            ax.errorbar(x_of[(tr["phase"], tr.get("pass", 0))], mean(v), yerr=se, color=c,
                        marker=markers[tr["factor"]], linestyle="none",
                        label=None if pol in labelled else pol)
            labelled.add(pol)
        switch = [i for i, (ph, _) in enumerate(order) if ph == 1]
        if switch:
            ax.axvline(switch[0] - 0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_title(n, fontsize=9)
        ax.set_xlabel("pass (in the order run)")
        ax.set_ylabel("ops/s")
        ax.legend(fontsize=7)
    fig.suptitle(title + (f"  (markers: factors {', '.join(f'{f:g}' for f in factors)})"
                          if len(factors) > 1 else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=320, help="node memory budget, MiB (320)")
    ap.add_argument("--interval", type=float, default=5.0,
                    help="measured interval (throughput read from the tenants), s (5)")
    ap.add_argument("--control-interval", type=float, default=10.0,
                    help="the agent's and the controller's interval, s (10)")
    ap.add_argument("--intervals", type=int, default=32,
                    help="measured intervals per configuration, the phase change halfway (32)")
    ap.add_argument("--warmup", type=int, default=4,
                    help="measured intervals left out of means after the start (4: a "
                         "cache fills only as fast as its tenant misses)")
    ap.add_argument("--settle", type=int, default=3,
                    help="measured intervals left out of means after the phase change (3; "
                         "under emulation the second phase's fio takes some 20 s to start)")
    ap.add_argument("--sweep-warm", type=int, default=4,
                    help="sweep: intervals after each limit is set before it is measured (4)")
    ap.add_argument("--sweep-measure", type=int, default=4, help="sweep: measured intervals (4)")
    ap.add_argument("--sweep-factors", default=None, metavar="F,...",
                    help="with --only sweep: sweep these factors of the equal share "
                         f"only (default {','.join(f'{f:g}' for f in LIMIT_FACTORS)})")
    ap.add_argument("--sweep-rounds", type=int, default=1,
                    help="with --only sweep: run each phase's rotation of policies this "
                         "many times (1)")
    ap.add_argument("--overhead-intervals", type=int, default=8,
                    help="overhead: measured intervals of each readrandom run, the first "
                         f"{OVERHEAD_SKIP} left out (8)")
    ap.add_argument("--overhead-reps", type=int, default=3,
                    help="overhead: readrandom runs without and with the agent, each, "
                         "in turn (3)")
    ap.add_argument("--only", default=None, metavar="CONFIG,...",
                    help="a diagnostic run of these configurations alone (of "
                         f"{', '.join(DIAGNOSABLE)}), "
                         "written to e2e_vm_diag.json and .png: per interval each tenant's ops, "
                         "limit, policy and CPU, and the machine's busy CPUs")
    ap.add_argument("--profile-agent", action="store_true",
                    help="with --only: profile the agent's main loop (cProfile), kept "
                         "with its log in e2e_vm_logs/ as <run>-agent.prof")
    ap.add_argument("--static", default=None, metavar="TENANT=POLICY@FACTOR,...",
                    help="with --only: the uncontrolled runs (default_equal, "
                         "agent_sampling) give these tenants this policy and limit (a "
                         "factor of the equal share), as the sweep does; with "
                         "agent_sampling, the agent's curves and observed miss ratio "
                         "under it")
    ap.add_argument("--fill", action="store_true",
                    help="with --only and --static: start each uncontrolled run as a "
                         "sweep pass starts, the caches filled at raised disk limits "
                         "until none grows (instead of by the tenants' own reads "
                         "from cold)")
    ap.add_argument("--data", default="/tmp/data", help="data folder (the VM's data disk)")
    ap.add_argument("--out", default="/tmp/results", help="where the JSON and PNG go")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    if args.static and not args.only:
        ap.error("--static is for the diagnostic runs of --only")
    if args.fill and not args.static:
        ap.error("--fill is for the --static runs of --only")
    if (args.sweep_factors is not None or args.sweep_rounds != 1) and not args.only:
        ap.error("--sweep-factors and --sweep-rounds are for the diagnostic runs of --only")
    try:
        args.sweep_factor_list = parse_factors(args.sweep_factors)
    except ValueError as err:
        ap.error(f"--sweep-factors: {err}")
    if not 1 <= args.sweep_rounds <= 8:
        ap.error("--sweep-rounds must be from 1 to 8")
    try:
        args.static_settings = parse_static(args.static)
    except ValueError as err:
        ap.error(f"--static: {err}")
    if args.profile_agent and not args.only:
        ap.error("--profile-agent goes with --only (a profiled agent runs slower)")
    e2e_lib.PROFILE_AGENT = args.profile_agent
    if args.intervals < 2 * (args.warmup + 1) or args.intervals // 2 <= args.settle:
        ap.error("--intervals must leave measured intervals in both phases")
    t_start = time.monotonic()
    budget = args.budget * MiB
    # every run's logs kept beside the results, the last run's only
    e2e_lib.LOG_DIR = Path(args.out) / "e2e_vm_logs"
    shutil.rmtree(e2e_lib.LOG_DIR, ignore_errors=True)
    scale = budget / (320 * MiB)
    # search's file outgrows its equal share; a pass takes some 25 s at its
    # disk's 4 MiB/s, so a policy that keeps part of it shows within a phase.
    # stream's file is one no configuration reads to its end (at its disk's
    # 4 MiB/s, 6 minutes a pass): a scan no memory helps.  At 512 MiB it was
    # a two-minute loop, which MRU and memory do help, though too slowly to
    # show within a configuration: the autopilot gave it MRU and 250 MiB
    sizes = {"search": int(100 * MiB * scale), "zipf": int(320 * MiB * scale),
             "stream": int(1536 * MiB * scale), "kv_keys": int(500_000 * scale),
             "kv_skew": KV_SKEW}
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

    if args.only:
        return diagnose(args, ts, cg, budget, work, phase_at, win, t_start)

    # the sweep first: the best static choice (d) and the SLOs come from it
    print("  sweep", flush=True)
    trials = sweep(ts, cg, budget, args.interval, args.sweep_warm, args.sweep_measure, work,
                   data)
    table, errors = sweep_table(trials, ts), sweep_error(trials, ts)
    slos = derive_slos(table, SLO_TENANTS)
    static, static_score = best_static(table, ts, budget, slos)
    print(f"  best static: {static} (sweep score {static_score:.3f}); SLOs {slos}", flush=True)
    runs: dict = {}
    cost = {}
    # (a), the agent's cost to RocksDB beside it, (b), (c), (d), and (a)
    # once more for the drift
    for name in ("default_equal", "overhead", "limits_only", "autopilot", "best_static",
                 "default_equal_repeat"):
        print(f"  {name}", flush=True)
        if name == "overhead":
            cost = overhead(ts, cg, budget, args.interval, args.overhead_intervals,
                            args.overhead_reps, work, data)
            continue
        runs[name] = run_config(name.removesuffix("_repeat"), ts, cg, budget, args.interval,
                                args.intervals, work,
                                slos, static=static if name == "best_static" else None,
                                phase_at=phase_at, control_interval=args.control_interval)
    result = summarise(args, ts, runs, trials, table, errors, static, static_score, slos,
                       cost, budget, phase_at, win, time.monotonic() - t_start)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e_vm.json").write_text(json.dumps(result, indent=1))
    normalised = {c: result["configurations"][c]["normalised"] for c in CONFIGS}
    plot(result, out / "e2e_vm.png",
         "e2e_vm: " + ", ".join(f"{c} {normalised[c]:.2f}" for c in CONFIGS) +
         " (normalised to default_equal)", phase_at=phase_at)
    report(result, ts)
    for name in e2e_lib.CONTROLLED:
        kept = e2e_lib.keep_recording(work, name, out, "e2e_vm")
        if kept is not None:
            print(f"kept {name}'s recording in {kept} (cachepilot replay {kept})")
    print(f"wrote {out / 'e2e_vm.json'} and {out / 'e2e_vm.png'} "
          f"({time.monotonic() - t_start:.0f} s)")
    return 0


def derive_slos(table, names) -> dict:
    """An SLO for each of `names` (one-phase tenants): SLO_GAIN times what
    an equal share under the kernel's policy gave it in the sweep, where
    the sweep found a setting at least SLO_HEADROOM times that.  Above the
    equal split, so the controller has to act for it; well below the best,
    so it is feasible with memory left for the others (an SLO at the best
    setting would take all of it).  A tenant no setting serves clearly
    better than the equal split gets none (an SLO within the noise would
    say nothing)."""
    slos = {}
    for n in names:
        row = table[n][0]
        base, best = row.get(("linux", 1.0)), max(row.values())
        if base and best >= SLO_HEADROOM * base:
            slos[n] = SLO_GAIN * base
    return slos


def control_intervals(measured: int | None, interval: float, control: float) -> int | None:
    """How many control intervals `measured` measured intervals make (rounded up)."""
    return None if measured is None else math.ceil(measured * interval / control - 1e-9)


def summarise(args, ts, runs, trials, table, errors, static, static_score, slos, cost,
              budget, phase_at, win, wall_s) -> dict:
    """e2e_vm.json: per configuration and tenant the mean ops/s of each
    measured window, ratios to (a), the SLOs, the policy choices against
    the sweep, the parts, the noise and the overhead."""
    share = budget // len(ts)
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

    def met(c, name, slo, lo=0):
        return [x >= slo for x in runs[c]["series"][name]["ops_per_s"][lo:]]

    def first(c, name, slo, lo):
        return next((i + 1 for i, ok in enumerate(met(c, name, slo, lo)) if ok), None)

    slo_view = {}
    for n, v in slos.items():
        feasible = mean(measured["best_static"][n].values()) >= v
        slo_view[n] = {
            "slo": v,
            "feasible": {"best_static": feasible, "sweep": max(table[n][0].values()) >= v},
            "met_fraction": {c: mean(met(c, n, v, args.warmup)) for c in CONFIGS},
            "first_met_interval": {c: first(c, n, v, 0) for c in CONFIGS},
            "first_met_after_phase_change": {c: first(c, n, v, phase_at) for c in CONFIGS},
            # in the agent's and the controller's intervals, as the targets
            # count them (within 5 of the start, 3 of the phase change)
            "autopilot_control_intervals": {
                "from_start": control_intervals(first("autopilot", n, v, 0), args.interval,
                                                args.control_interval),
                "after_phase_change": control_intervals(
                    first("autopilot", n, v, phase_at), args.interval, args.control_interval)}}
        ci = slo_view[n]["autopilot_control_intervals"]
        slo_view[n]["target_met"] = (not feasible) or (
            ci["from_start"] is not None and ci["from_start"] <= 5 and
            ci["after_phase_change"] is not None and ci["after_phase_change"] <= 3)

    choices, latency = policy_choices(args, ts, runs["autopilot"]["series"], table, errors,
                                      share, phase_at, win)
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
                         "limit_bytes": s[t.name]["limit_bytes"][-1],
                         "cpu": mean(s[t.name]["cpu"][args.warmup:])} for t in ts]}
    return {
        "configurations": configs,
        "choices": choices,
        "switch_latency_intervals": [latency[t.name] for t in ts],
        "slo": slo_view,
        "ratio": ratio,
        "parts": {"allocation (b)/(a)": normalised["limits_only"],
                  "policies (c)/(b)": normalised["autopilot"] / normalised["limits_only"],
                  "autopilot (c)/(a)": normalised["autopilot"],
                  "autopilot (c)/(d)": normalised["autopilot"] / normalised["best_static"]},
        "paper": {t.name: {"workload": PAPER[t.name][0], "speedup": PAPER[t.name][1],
                           "ours_c_over_a": ratio["autopilot"][t.name]}
                  for t in ts if t.name in PAPER},
        # (a) run again at the end, against (a): 1.0 for a run that does
        # not drift; every ratio above carries this much noise
        "noise": {"repeat_over_first": ratio["default_equal_repeat"],
                  "normalised": normalised["default_equal_repeat"]},
        "overhead": {"agent_cpu_fraction_autopilot": runs["autopilot"].get("agent_cpu_fraction"),
                     "agent_cpus_autopilot": mean(
                         runs["autopilot"]["series"]["_host"]["agent_cpus"][args.warmup:]),
                     "readrandom": cost},
        "best_static": {"settings": {n: list(v) for n, v in static.items()},
                        "sweep_score": static_score},
        "sweep": trials,
        "tenants": [{"name": t.name, "unit": t.unit, "allowed": t.policies,
                     "phases": 2 if t.phase_pidfile else 1, "io_max": IO.get(t.name),
                     "cpu_max": CPU.get(t.name)} for t in ts],
        "runs": {c: [r] for c, r in runs.items()},
        "vm": {"budget_bytes": budget, "interval_s": args.interval,
               "control_interval_s": args.control_interval,
               "intervals": args.intervals, "phase_change_after": phase_at,
               "warmup": args.warmup, "settle": args.settle, "wall_s": wall_s},
    }


def policy_choices(args, ts, auto, table, errors, share, phase_at, win):
    """The policy (c) settled on in each tenant phase (the one in force over
    the phase's last `settle` intervals) against the policies the sweep
    cannot tell from the best at the limit (c) gave it then; beside it, the
    share of the phase's intervals whose policy in force was among the best
    at that interval's own limit (a tenant whose limit still moves can run
    the default while every policy ties, as search's passes do while they
    fit), and how many intervals the policy took to settle (from the start,
    and after the phase change for a two-phase tenant)."""
    choices, latency = [], {}
    for t in ts:
        s = auto[t.name]
        pol = ["linux" if x == "none" else x for x in s["policy"]]

        def best_at(p, limit):
            f = nearest_factor(limit, share,
                               sorted({ff for _, ff in table[t.name][p]}, reverse=True))
            at = {q: v for (q, ff), v in table[t.name][p].items() if ff == f}
            se = {q: v for (q, ff), v in errors[t.name][p].items() if ff == f}
            return f, at, se, best_policies(at, se)

        for p, (a, b) in (win.items() if t.phase_pidfile else [(0, (args.warmup,
                                                                     args.intervals))]):
            if b <= a:
                continue
            tail = max(a, b - args.settle)
            settled = pol[tail:b]
            ran = max(set(settled), key=settled.count)
            f, at, se, tied = best_at(p, mean(s["limit_bytes"][tail:b]))
            in_best = [pol[i] in best_at(p, s["limit_bytes"][i])[3] for i in range(a, b)]
            majority = max(set(pol[a:b]), key=pol[a:b].count)
            choices.append({"tenant": t.name, "phase": p, "autopilot_policy": ran,
                            "best_static_policy": max(at, key=at.get),
                            "best_static_policies": tied,
                            "match": ran in tied, "at_limit_factor": f,
                            "majority_policy": majority,
                            "in_best_fraction": mean(in_best),
                            "sweep_ops": at, "sweep_stderr": se,
                            "curves": curve_view(s, a, b, majority)})
        first_final = next((i + 1 for i in range(phase_at)
                            if pol[i] == pol[phase_at - 1]), None)
        latency[t.name] = {"from_start": first_final}
        if t.phase_pidfile:
            latency[t.name]["after_phase_change"] = next(
                (i - phase_at + 1 for i in range(phase_at, args.intervals)
                 if pol[i] != pol[phase_at - 1]), None)
    return choices, latency


def curve_view(s: dict, a: int, b: int, ran: str) -> dict:
    """What the agent's curves said of one tenant over intervals [a, b) of
    a controlled run (series `s`), beside what its cgroup did: the mean
    miss ratio each policy's curve gave at the tenant's limit, and the
    mean observed miss ratio with `ran`, the policy that ran most.  Empty
    for a run whose agent's endpoint was not read."""
    curves = [c for c in s.get("curves_at_limit", [])[a:b] if c]
    if not curves:
        return {}
    return {"ran": ran,
            "observed": mean(s.get("observed_miss_ratio", [])[a:b]),
            "predicted": {p: mean([c[p] for c in curves if p in c])
                          for p in sorted({p for c in curves for p in c})}}


def report(result, ts):
    ratio, choices = result["ratio"], result["choices"]
    print(f"\n{'tenant':<8}" + "".join(f"{c:>15}" for c in CONFIGS) + f"{'paper':>8}")
    for t in ts:
        x = PAPER.get(t.name, ("", None))[1]
        print(f"{t.name:<8}" + "".join(f"{ratio[c][t.name]:>15.2f}" for c in CONFIGS) +
              (f"{x:>8.2f}" if x else f"{'-':>8}"))
    conf = result["configurations"]
    print("normalised: " + ", ".join(f"{c} {conf[c]['normalised']:.3f}" for c in CONFIGS))
    print("geometric mean: " + ", ".join(f"{c} {conf[c]['normalised_geometric']:.3f}"
                                         for c in CONFIGS))
    print("parts: " + ", ".join(f"{k} {v:.3f}" for k, v in result["parts"].items()))
    for c in choices:
        print(f"  {c['tenant']} phase {c['phase']}: autopilot {c['autopilot_policy']}, "
              f"best static {'/'.join(c['best_static_policies'])} (at "
              f"{c['at_limit_factor']:g} x share): {'match' if c['match'] else 'MISMATCH'}; "
              f"ran most {c['majority_policy']}, among the best at its limit in "
              f"{c['in_best_fraction']:.0%} of the phase")
        cv = c.get("curves")
        if cv:
            print("    curves at its limit: " + ", ".join(
                f"{p} {m:.3f}" for p, m in cv["predicted"].items()) +
                f"; observed {cv['observed']:.3f} under {cv['ran']}")
    print("noise, (a) again over (a): " + ", ".join(
        f"{n} {v:.2f}" for n, v in result["noise"]["repeat_over_first"].items()) +
        f", normalised {result['noise']['normalised']:.3f}")
    print(f"SLOs: {json.dumps(result['slo'])}")
    print(f"overhead: {json.dumps(result['overhead'])}")


if __name__ == "__main__":
    sys.exit(main())
