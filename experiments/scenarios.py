#!/usr/bin/env python3
"""A seeded corpus of sim scenarios for the autopilot (docs/scenarios.md).

Writes DIR/scenario-NN.yaml (configs of the same schema as
configs/scenarios/*.yaml, controller/config.py) and DIR/index.json.  Every
scenario has 1-3 sim nodes of 32 MiB to 1 GiB and 3-10 tenants spread over
them, with:

  - workloads of every kind the sim runs (zipf, uniform, scan, loop,
    get-scan, trace) across the corpus, both shared traces
    (../shared/traces/OLTP.lis.zst and cloudphysics.csv, referenced by a
    path relative to DIR, never copied), and tenants that change phase;
  - service costs drawn per tenant (t_hit_s, t_miss_s, concurrency);
  - mixed priorities;
  - every policy allowed (no `policies` list) in the even-numbered
    scenarios, a restricted list per tenant (always with `linux`, the
    baseline) in the odd ones;
  - SLOs placed relative to what the static equal split gives each tenant
    (run_static_equal on the scenario without SLOs, mean throughput after
    the warm-up): easy (0.75-0.85x, lowered where needed to the equal
    split's 10th percentile, so that the equal split meets it in >= 90 %
    of the intervals after warm-up), tight (1.1-1.3x, only on a tenant
    that the equal split holds below it in >= half those intervals and
    that, given its whole node in the same draws, meets it in >= 80 %) or
    infeasible (>= 3x and >= 1.1x the best interval of that whole-node
    run, so no memory can meet it).  The class, factor and both reference
    runs' figures are in the file's header comment and in index.json.

Scenario NN depends only on (--seed, NN): --count 30 writes the same first
20 files as --count 20, and the same --seed writes byte-identical files
(Python's `random.random()`, whose sequence for a seed is guaranteed across
versions; the calibration runs are the seeded sim).  Coverage does not
rest on luck: scenario NN's first tenant runs kind KINDS[NN % 6], its first
SLO is of class CLASSES[NN % 3] and it has at least one tenant of several
phases, so any 6 consecutive scenarios hold every kind and class.

Accesses per interval and footprints are sized to a budget so that one
scenario of --intervals control intervals (default 60) stays well under a
minute of CPU in `run_autopilot` and its RSS modest: the sim's cost grows
with accesses x allowed policies x curve sizes, its memory with the pages
each miniature cache holds (see `cost`).

A trace phase starts at an offset drawn over the trace's page accesses
(`trace_offset`, which the replay wraps round), and bench_scenarios'
--seed-offset moves it on.

Usage: experiments/scenarios.py --out DIR [--seed S] [--count N]
                                [--intervals N] [--traces DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

import yaml

MiB = 1 << 20
PAGE = 4096
ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
TRACE_FILES = ("OLTP.lis.zst", "cloudphysics.csv")

KINDS = ("zipf", "uniform", "scan", "loop", "get-scan", "trace")
CLASSES = ("easy", "tight", "infeasible")
DEFAULT_SEED = 0
DEFAULT_COUNT = 20
DEFAULT_INTERVALS = 60
WARMUP = 10
VERSION = 1
ATTEMPTS = 40           # draws of a scenario before giving up on its SLO class

# Node sizes, drawn small three times in four: the sim keeps, per tenant and
# allowed policy, a full-size miniature cache at each of 28 sizes up to its
# node's memory, so memory pressure on a large node costs gigabytes of RSS
# (see `cost`); the large nodes' tenants mostly fit.
SMALL_MIB = (32, 40, 48, 56, 64, 80, 96, 128)
LARGE_MIB = (160, 192, 256, 384, 512, 768, 1024)
NODE_MIB = SMALL_MIB + LARGE_MIB
NODE_NAMES = ("node-a", "node-b", "node-c")

# Service costs drawn per tenant (controller/config.py ModelPrior).
# A miss costs 5 to 100 hits: where it costs little more than a hit, memory
# hardly moves a tenant's throughput.
T_HIT = (2e-6, 5e-6, 1e-5, 2e-5)
MISS_OVER_HIT = (5, 10, 20, 50, 100)
CONCURRENCY = (1, 2, 4, 8, 16)

# The budget.  CPU: the sim feeds every access to a miniature cache per
# allowed policy and curve size (sim/backend.py curve_sizes: 28 sizes), so
# a run's cost is about sum(accesses x policies) per interval; memory: each
# of those caches holds up to min(its size, the pages the tenant touched)
# entries.  Both limits were set by measurement (docs/scenarios.md): a
# unit costs roughly 6-20 us of CPU per interval in run_autopilot, an
# entry roughly 180 bytes of RSS.
CPU_UNITS = 16_000         # sum over tenants of accesses_per_interval x policies
MEM_ENTRIES = 8_000_000    # sum over tenants, policies, curve sizes of pages held
MIN_ACCESSES = 300
MAX_ACCESSES = 4000
MIN_FOOTPRINT = 2 * MiB
MAX_FOOTPRINT = 256 * MiB

# SLO classes: the factor range on the equal split's mean throughput.
EASY = (0.75, 0.85)
TIGHT = (1.1, 1.3)
TIGHT_WHOLE_MET = 0.8      # a tight SLO's tenant meets it given its whole node,
TIGHT_EQUAL_MET = 0.5      # and not at an equal share
INFEASIBLE_MIN = 3.0
INFEASIBLE_OVER_BEST = 1.1


class Draw:
    """Draws from `random.Random(...).random()` only: the one method whose
    sequence Python keeps for a seed across versions (choice, randint and
    uniform are built here on top of it)."""

    def __init__(self, seed: int, index: int):
        self.rng = random.Random(f"cachepilot-scenarios:{seed}:{index}")

    def random(self) -> float:
        return self.rng.random()

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.random()

    def randint(self, a: int, b: int) -> int:
        return a + min(b - a, int(self.random() * (b - a + 1)))

    def choice(self, seq):
        return seq[min(len(seq) - 1, int(self.random() * len(seq)))]

    def sample(self, seq, k: int) -> list:
        pool, out = list(seq), []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(min(len(pool) - 1, int(self.random() * len(pool)))))
        return out

    def shuffled(self, seq) -> list:
        return self.sample(seq, len(seq))


def all_policies() -> list[str]:
    from cachepilot.models.runtime import available_policies
    return list(available_policies())


def _mib(n_bytes: int) -> str:
    return f"{n_bytes // MiB}MiB"


def _round_sig(x: float, digits: int = 3, down: bool = False) -> int:
    """x rounded (`down`: toward 0) to `digits` significant figures, as an
    integer."""
    if x <= 0:
        return 0
    exp = max(0, int(math.floor(math.log10(x))) - digits + 1)
    q = x / 10 ** exp
    return int((math.floor(q) if down else round(q)) * 10 ** exp)


# -- drawing a scenario ------------------------------------------------------------

def _draw_phase(d: Draw, kind: str, share: int, trace_pick: str | None) -> dict:
    """One phase; `share` is the tenant's equal share of its node (bytes).
    Footprints are relative to it and trimmed to the budget later."""
    if kind == "trace":
        return {"kind": "trace", "trace": trace_pick}
    factor = {"zipf": (0.5, 3.0), "uniform": (0.6, 2.0), "scan": (2.0, 6.0),
              "loop": (0.6, 1.6), "get-scan": (0.5, 2.0)}[kind]
    ph = {"kind": kind, "footprint": int(share * d.uniform(*factor))}
    if kind in ("zipf", "get-scan"):
        ph["skew"] = round(d.uniform(0.6, 1.3), 2)
    if kind == "get-scan":
        ph["scan_fraction"] = round(d.uniform(0.1, 0.5), 2)
        ph["scan_length"] = d.randint(1, 8) * MiB
    return ph


def _draw(d: Draw, index: int, policies: list[str], trace_rel: dict[str, str],
          intervals: int) -> dict:
    """A scenario's nodes and tenants (no SLOs yet), as plain data."""
    n_nodes = 1 + index % 3
    every = index % 2 == 0
    # every policy costs 11 curves a tenant: fewer tenants there
    n_tenants = 3 if index == 0 else 10 if index == 1 else \
        d.randint(max(3, n_nodes), 6 if every else 10)
    sizes = [d.choice(SMALL_MIB if d.random() < 0.75 else LARGE_MIB)
             for _ in range(n_nodes)]
    if index % 5 == 0:
        sizes[0] = NODE_MIB[0]          # the smallest and the largest node
    elif index % 5 == 1:
        sizes[-1] = NODE_MIB[-1]
    nodes = [{"name": NODE_NAMES[k], "memory_bytes": sizes[k] * MiB, "backend": "sim",
              "seed": d.randint(1, 9999)} for k in range(n_nodes)]
    # every node gets a tenant, the rest go anywhere
    placement = list(range(n_nodes)) + [d.randint(0, n_nodes - 1)
                                        for _ in range(n_tenants - n_nodes)]
    placement = d.shuffled(placement)
    on_node = [placement.count(k) for k in range(n_nodes)]
    kinds = [KINDS[index % len(KINDS)]] + [d.choice(KINDS) for _ in range(n_tenants - 1)]
    # index % 6 == 5 is a trace scenario: alternate the two traces there
    first_trace = TRACE_FILES[(index // len(KINDS)) % 2]
    multi = {d.randint(0, n_tenants - 1)}          # at least one changes phase
    multi |= {j for j in range(n_tenants) if d.random() < 0.25}
    tenants = []
    counts: dict[str, int] = {}
    for j in range(n_tenants):
        node = nodes[placement[j]]
        share = node["memory_bytes"] // on_node[placement[j]]
        first = kinds[j]
        pick = first_trace if j == 0 else d.choice(TRACE_FILES)
        phases = [_draw_phase(d, first, share, trace_rel[pick])]
        if j in multi:
            for _ in range(d.randint(1, 2)):
                later = d.choice(KINDS) if d.random() < 0.2 else \
                    d.choice([k for k in KINDS if k != "trace"])
                phases.append(_draw_phase(d, later, share,
                                          trace_rel[d.choice(TRACE_FILES)]))
            # every phase begins within the run, the first after the warm-up
            span = max(WARMUP + 2, (intervals - 15) // (len(phases) - 1))
            for ph in phases[:-1]:
                ph["intervals"] = d.randint(WARMUP + 2, span)
        stem = {"get-scan": "kv", "trace": "oltp" if "OLTP" in str(phases[0].get("trace"))
                else "vm"}.get(first, first)
        counts[stem] = counts.get(stem, 0) + 1
        name = f"{stem}-{counts[stem]}"
        if every:
            allowed = None
        else:
            extra = [p for p in policies if p != "linux"]
            allowed = ["linux"] + sorted(d.sample(extra, d.randint(1, 4)))
            if any(ph["kind"] == "get-scan" for ph in phases) and "get_scan" in policies \
                    and "get_scan" not in allowed and d.random() < 0.5:
                allowed = sorted(allowed + ["get_scan"])
        tenants.append({
            "name": name, "node": node["name"], "floor_bytes": 2 * MiB,
            "priority": d.randint(0, 1),
            "policies": allowed,
            "workload": {
                "accesses_per_interval": int(math.exp(d.uniform(math.log(500),
                                                                math.log(MAX_ACCESSES)))),
                "phases": phases,
                "service": _service(d)}})
    return {"nodes": nodes, "tenants": tenants, "every_policy": every}


def _service(d: Draw) -> dict:
    t_hit = d.choice(T_HIT)
    return {"t_hit_s": t_hit, "t_miss_s": float(f"{t_hit * d.choice(MISS_OVER_HIT):.3g}"),
            "concurrency": d.choice(CONCURRENCY)}


def _distinct_pages(ph: dict, accesses: int, intervals: int) -> int:
    """At most the pages a phase touches in a run: what each of its
    miniature caches may come to hold."""
    reach = accesses * intervals
    if ph["kind"] == "trace":
        # cloudphysics.csv holds 48,974 distinct pages; OLTP's first
        # requests are nearly all new ones
        return min(reach, 48_974) if "cloudphysics" in str(ph["trace"]) else reach
    pages = ph["footprint"] // PAGE
    if ph["kind"] == "get-scan":        # GETs, and scans over a region 10x as large
        f = ph["scan_fraction"]
        return min(pages, int((1 - f) * reach)) + min(10 * pages, int(f * reach) + 1)
    return min(pages, reach)


def cost(scenario: dict, policies: list[str], intervals: int) -> tuple[int, int]:
    """(CPU units, cache entries) of a drawn scenario: sum of accesses per
    interval x allowed policies, and sum over tenants, policies and curve
    sizes of the pages each miniature cache may hold."""
    from cachepilot.sim.backend import curve_sizes
    memory = {n["name"]: n["memory_bytes"] for n in scenario["nodes"]}
    cpu = entries = 0
    for t in scenario["tenants"]:
        n_pol = len(t["policies"] or policies)
        w = t["workload"]
        cpu += w["accesses_per_interval"] * n_pol
        sizes = curve_sizes(memory[t["node"]])
        # phases touch distinct pages (sim/backend.py), and a large cache
        # keeps an old phase's pages beside the new one's
        held, left = 0, intervals
        for ph in w["phases"]:
            span = min(left, ph.get("intervals") or left)
            held += _distinct_pages(ph, w["accesses_per_interval"], span)
            left -= span
        entries += n_pol * int(sum(min(int(s), held) for s in sizes))
    return cpu, entries


def _roomy_nodes(scenario: dict) -> set[str]:
    """Nodes whose memory holds every tenant's largest footprint at once."""
    need: dict[str, int] = {}
    for t in scenario["tenants"]:
        big = max(ph.get("footprint", 0) if ph["kind"] != "trace" else 256 * MiB
                  for ph in t["workload"]["phases"])
        need[t["node"]] = need.get(t["node"], 0) + big
    return {n["name"] for n in scenario["nodes"] if need.get(n["name"], 0) <= n["memory_bytes"]}


def _fit_budget(scenario: dict, policies: list[str], intervals: int) -> None:
    """Scale accesses to the CPU budget, cap footprints at what a run can
    warm, then shrink the largest holders of cache entries to the memory
    budget.  Deterministic arithmetic on the drawn figures."""
    tenants = scenario["tenants"]
    cpu, _ = cost(scenario, policies, intervals)
    if cpu > CPU_UNITS:
        scale = CPU_UNITS / cpu
        for t in tenants:
            w = t["workload"]
            w["accesses_per_interval"] = max(MIN_ACCESSES,
                                             int(w["accesses_per_interval"] * scale) // 10 * 10)
    for t in tenants:
        w = t["workload"]
        reach = w["accesses_per_interval"] * intervals * PAGE
        for ph in w["phases"]:
            if ph["kind"] == "trace":
                continue
            # a run reads a loop over at least 4 times, a uniform footprint
            # 3 times, a zipf one twice: the caches warm within the run
            cap = {"loop": reach // 4, "uniform": reach // 3,
                   "scan": MAX_FOOTPRINT}.get(ph["kind"], reach // 2)
            ph["footprint"] = max(MIN_FOOTPRINT, min(ph["footprint"], cap, MAX_FOOTPRINT))
    stuck: set[int] = set()
    for _ in range(500):
        _, entries = cost(scenario, policies, intervals)
        if entries <= MEM_ENTRIES:
            break
        left = [j for j in range(len(tenants)) if j not in stuck]
        if not left:
            break
        # shrink first where it changes least: tenants on a node whose
        # tenants' footprints all fit in it (no pressure to lose there)
        roomy = _roomy_nodes(scenario)
        j = max(left, key=lambda j: (tenants[j]["node"] in roomy,
                                     cost({"nodes": scenario["nodes"], "tenants": [tenants[j]]},
                                          policies, intervals)[1]))
        w = tenants[j]["workload"]
        shrunk = False
        for ph in w["phases"]:
            if ph["kind"] != "trace" and ph["footprint"] > MIN_FOOTPRINT:
                ph["footprint"] = max(MIN_FOOTPRINT, int(ph["footprint"] * 0.8))
                shrunk = True
        if not shrunk:      # a trace (or footprints at their least): fewer accesses
            if w["accesses_per_interval"] <= MIN_ACCESSES:
                stuck.add(j)
            else:
                w["accesses_per_interval"] = max(MIN_ACCESSES,
                                                 int(w["accesses_per_interval"] * 0.8))
    for t in tenants:
        for ph in t["workload"]["phases"]:
            if "footprint" in ph:       # whole MiB, for a readable file
                ph["footprint"] = max(MIN_FOOTPRINT, ph["footprint"] // MiB * MiB)
            if ph["kind"] == "get-scan":
                ph["scan_length"] = min(ph["scan_length"], ph["footprint"])


# -- the YAML document -----------------------------------------------------------

CONTROL = {"interval_s": 1.0, "max_step_fraction": 0.25, "hysteresis": 0.005,
           "autopilot_k": 2, "warmup_intervals": WARMUP, "anon_margin_bytes": 0}


def document(scenario: dict) -> dict:
    """The config as the YAML file holds it (sizes as MiB strings)."""
    nodes = [{**n, "memory_bytes": _mib(n["memory_bytes"])} for n in scenario["nodes"]]
    tenants = []
    for t in scenario["tenants"]:
        out = {"name": t["name"], "node": t["node"], "floor_bytes": _mib(t["floor_bytes"])}
        if t.get("slo") is not None:
            out["slo"] = {"min_throughput": t["slo"]}
        out["priority"] = t["priority"]
        if t["policies"] is not None:
            out["policies"] = list(t["policies"])
        w = t["workload"]
        phases = []
        for ph in w["phases"]:
            p = dict(ph)
            for k in ("footprint", "scan_length"):
                if k in p:
                    p[k] = _mib(p[k])
            phases.append(p)
        out["workload"] = {"accesses_per_interval": w["accesses_per_interval"],
                           "phases": phases, "service": dict(w["service"])}
        tenants.append(out)
    return {"control": dict(CONTROL),
            "controller": {"listen": "127.0.0.1:0", "insecure": True},
            "nodes": nodes, "tenants": tenants}


def _config(scenario: dict, base: Path):
    """A validated Config of the drawn scenario, trace paths resolved
    against `base` as load_config resolves them against the file."""
    from cachepilot.controller.config import config_from_dict
    from cachepilot.core.config import resolve_paths
    cfg = config_from_dict(document(scenario), "<scenario>")
    resolve_paths(cfg, base)
    return cfg


# -- SLOs relative to the equal split --------------------------------------------

def calibrate(cfg, intervals: int) -> dict[str, dict]:
    """Per tenant, the static equal split's and the whole-node run's
    throughput after the warm-up (same seeds as the scenario's own)."""
    from cachepilot.run import run_static_equal, run_static_whole
    warm = WARMUP if intervals > WARMUP else 0
    equal = run_static_equal(cfg, intervals)
    whole = run_static_whole(cfg, intervals)
    return {t.name: {"equal": [r["throughput"] for r in equal[t.name][warm:]],
                     "whole": [r["throughput"] for r in whole[t.name][warm:]]}
            for t in cfg.tenants}


def _share(rows: list[float], slo: float) -> float:
    return sum(r >= slo for r in rows) / len(rows) if rows else 0.0


def _slo_for(cls: str, d: Draw, ref: dict) -> tuple[float, int] | None:
    """(factor, SLO) of class `cls` for a tenant with reference runs `ref`,
    or None where the class does not fit it (tight: the whole node would
    not meet it)."""
    mean = sum(ref["equal"]) / len(ref["equal"])
    if cls == "easy":
        # 0.75-0.85x, or lower where the equal split's throughput swings
        # (a trace, a phase change): no more than its 10th percentile
        f = d.uniform(*EASY)
        low = sorted(ref["equal"])[len(ref["equal"]) // 10]
        f = min(f, low / mean)
        return f, _round_sig(f * mean, down=True)
    if cls == "tight":
        f = d.uniform(*TIGHT)
        slo = _round_sig(f * mean)
        fits = _share(ref["whole"], slo) >= TIGHT_WHOLE_MET and \
            _share(ref["equal"], slo) <= TIGHT_EQUAL_MET
        return (f, slo) if fits else None
    best = max(ref["whole"])
    f = max(INFEASIBLE_MIN, INFEASIBLE_OVER_BEST * best / mean)
    f = math.ceil(f * 10) / 10
    return f, _round_sig(f * mean) + 1     # rounding must not bring it below


def place_slos(d: Draw, scenario: dict, refs: dict, index: int) -> list[dict] | None:
    """Give some tenants SLOs; None when the scenario has no tenant that
    fits its required class (the caller draws again)."""
    tenants = scenario["tenants"]
    n = len(tenants)
    k = d.randint(1, max(1, min(4, (n + 1) // 2)))
    order = d.shuffled(range(n))
    need = CLASSES[index % len(CLASSES)]
    placed: list[dict] = []
    taken: set[int] = set()
    for j in order:                     # the required class first
        got = _slo_for(need, d, refs[tenants[j]["name"]])
        if got is not None:
            placed.append({"j": j, "class": need, "factor": got[0], "slo": got[1]})
            taken.add(j)
            break
    if not placed:
        return None
    for j in order:
        if len(placed) >= k:
            break
        if j in taken:
            continue
        for cls in d.shuffled(CLASSES):
            got = _slo_for(cls, d, refs[tenants[j]["name"]])
            if got is not None:
                placed.append({"j": j, "class": cls, "factor": got[0], "slo": got[1]})
                taken.add(j)
                break
    out = []
    for p in placed:
        t = tenants[p["j"]]
        ref = refs[t["name"]]
        t["slo"] = p["slo"]
        t["priority"] = d.randint(1, 3)
        out.append({"tenant": t["name"], "class": p["class"], "factor": round(p["factor"], 3),
                    "min_throughput": p["slo"],
                    "equal_mean": round(sum(ref["equal"]) / len(ref["equal"]), 1),
                    "whole_mean": round(sum(ref["whole"]) / len(ref["whole"]), 1),
                    "equal_met": round(_share(ref["equal"], p["slo"]), 3),
                    "whole_met": round(_share(ref["whole"], p["slo"]), 3)})
    out.sort(key=lambda s: [x["name"] for x in tenants].index(s["tenant"]))
    return out


# -- one scenario, the corpus ----------------------------------------------------

def build(seed: int, index: int, out_dir: Path, traces: Path = TRACES,
          intervals: int = DEFAULT_INTERVALS, policies: list[str] | None = None):
    """(YAML text, index entry) of scenario `index` for `seed`, its trace
    paths relative to `out_dir`."""
    policies = policies or all_policies()
    out_dir = Path(out_dir)
    rel = {name: os.path.relpath(Path(traces).resolve() / name, out_dir.resolve())
           for name in TRACE_FILES}
    d = Draw(seed, index)
    offsets = Draw(seed, f"{index}:trace-offsets")
    for attempt in range(ATTEMPTS):
        scenario = _draw(d, index, policies, rel, intervals)
        _fit_budget(scenario, policies, intervals)
        _trace_offsets(offsets, scenario, traces)
        refs = calibrate(_config(scenario, out_dir), intervals)
        slos = place_slos(d, scenario, refs, index)
        if slos is not None:
            break
    else:
        raise RuntimeError(f"scenario {index}: no tenant fits a "
                           f"{CLASSES[index % len(CLASSES)]} SLO in {ATTEMPTS} draws")
    name = f"scenario-{index:02d}"
    cpu, entries = cost(scenario, policies, intervals)
    kinds = sorted({ph["kind"] for t in scenario["tenants"] for ph in t["workload"]["phases"]})
    traces_used = sorted({Path(ph["trace"]).name for t in scenario["tenants"]
                          for ph in t["workload"]["phases"] if ph["kind"] == "trace"})
    entry = {
        "name": name, "file": f"{name}.yaml", "index": index, "attempts": attempt + 1,
        "nodes": [{"name": n["name"], "memory_mib": n["memory_bytes"] // MiB,
                   "tenants": sum(t["node"] == n["name"] for t in scenario["tenants"])}
                  for n in scenario["nodes"]],
        "tenants": len(scenario["tenants"]),
        "kinds": kinds, "traces": traces_used,
        "phase_changes": sum(len(t["workload"]["phases"]) > 1 for t in scenario["tenants"]),
        "priorities": sorted({t["priority"] for t in scenario["tenants"]}),
        "every_policy": scenario["every_policy"],
        "policies": {t["name"]: t["policies"] for t in scenario["tenants"]
                     if t["policies"] is not None},
        "accesses_per_interval": sum(t["workload"]["accesses_per_interval"]
                                     for t in scenario["tenants"]),
        "cost_cpu_units": cpu, "cost_cache_entries": entries,
        "slo_classes": sorted({s["class"] for s in slos}, key=CLASSES.index),
        "slos": slos,
    }
    return _text(name, seed, intervals, entry, document(scenario)), entry


_TRACE_ACCESSES: dict[str, int] = {}


def _trace_offsets(d: Draw, scenario: dict, traces: Path) -> None:
    """Each trace phase starts at an offset drawn over its trace's page
    accesses (from a stream of draws of its own, so the rest of a scenario
    is what it was before offsets were drawn)."""
    from cachepilot.models.traces import open_trace
    for t in scenario["tenants"]:
        for ph in t["workload"]["phases"]:
            if ph["kind"] != "trace":
                continue
            name = Path(ph["trace"]).name
            if name not in _TRACE_ACCESSES:
                tr = open_trace(Path(traces) / name)
                for _ in tr.chunks_with_tids():
                    pass
                _TRACE_ACCESSES[name] = max(1, tr.accesses)
            ph["trace_offset"] = d.randint(0, _TRACE_ACCESSES[name] - 1)


def _text(name: str, seed: int, intervals: int, entry: dict, doc: dict) -> str:
    lines = [f"# {name}: generated by experiments/scenarios.py --seed {seed} "
             f"(docs/scenarios.md); do not edit.",
             f"# {len(entry['nodes'])} node(s), {entry['tenants']} tenants; kinds: "
             f"{', '.join(entry['kinds'])}; every policy allowed: "
             f"{'yes' if entry['every_policy'] else 'no'}.",
             f"# SLOs against the static equal split's mean throughput after a "
             f"{WARMUP}-interval warm-up over {intervals} intervals"
             f" (whole: the tenant given its whole node):"]
    for s in entry["slos"]:
        lines.append(f"#   {s['tenant']}: {s['class']}, {s['factor']:.2f}x "
                     f"{s['equal_mean']:.0f}/s = {s['min_throughput']}/s; equal split meets "
                     f"it in {100 * s['equal_met']:.0f}% of intervals, whole node in "
                     f"{100 * s['whole_met']:.0f}%")
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    return "\n".join(lines) + "\n\n" + body


def generate(out_dir, seed: int = DEFAULT_SEED, count: int = DEFAULT_COUNT,
             intervals: int = DEFAULT_INTERVALS, traces: Path = TRACES,
             progress=None) -> dict:
    """Write the corpus into out_dir; returns the index (also index.json).
    Every file is read back with load_config: one that fails is an error."""
    from cachepilot.controller.config import load_config
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TRACE_FILES:
        if not (Path(traces) / name).is_file():
            raise FileNotFoundError(f"{Path(traces) / name}: the shared trace is absent "
                                    f"(see ../shared/traces/README.md)")
    policies = all_policies()
    entries = []
    for i in range(count):
        text, entry = build(seed, i, out_dir, traces, intervals, policies)
        path = out_dir / entry["file"]
        path.write_text(text)
        load_config(path)               # raises UserError naming the key
        entries.append(entry)
        if progress:
            progress(entry)
    index = {"generator": "experiments/scenarios.py", "version": VERSION, "seed": seed,
             "count": count, "intervals": intervals, "warmup_intervals": WARMUP,
             "policies": policies, "classes": list(CLASSES), "kinds": list(KINDS),
             "scenarios": entries}
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder to write into")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT)
    ap.add_argument("--intervals", type=int, default=DEFAULT_INTERVALS,
                    help="run length the SLOs and the budget are set for")
    ap.add_argument("--traces", type=Path, default=TRACES,
                    help=f"the shared traces folder (default {TRACES})")
    args = ap.parse_args(argv)
    if args.count < 1:
        ap.error("--count must be at least 1")

    def show(e):
        slos = ", ".join(f"{s['tenant']} {s['class']}" for s in e["slos"])
        print(f"{e['file']}: {len(e['nodes'])} node(s) "
              f"{'/'.join(str(n['memory_mib']) for n in e['nodes'])} MiB, "
              f"{e['tenants']} tenants, {'every policy' if e['every_policy'] else 'restricted'}, "
              f"kinds {','.join(e['kinds'])}; SLOs: {slos}", flush=True)

    index = generate(args.out, args.seed, args.count, args.intervals, args.traces, show)
    kinds = sorted({k for e in index["scenarios"] for k in e["kinds"]})
    classes = sorted({c for e in index["scenarios"] for c in e["slo_classes"]})
    print(f"wrote {args.count} scenarios and index.json to {args.out} "
          f"(kinds: {', '.join(kinds)}; SLO classes: {', '.join(classes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
