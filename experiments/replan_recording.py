#!/usr/bin/env python3
"""A consolidation plan made again from a recorded controller, at many
rounds, with and without the larger sizes a demand offers the packing.

`make consolidate` keeps its controller's recording.  This replays it
(`cachepilot replay`'s own loop, restores and all) and, every `--every` rounds from
`--from` to `--to`, builds the live demands from the reports replayed so
far (`consolidate.live_demands`), plans from them as the controller's
leader does (`planner.plan` with `consolidate.as_allocated`), and plans
again with every demand's options taken away.  It prints, per round, the
hosts each plan uses and the SLOs it predicts broken, and the count of
rounds where the offers saved a host.  One plan is one moment of noisy
inputs; many rounds of one recording show whether a change of the
planner holds beyond the moment a run happened to plan at.

Writes experiments/results/replan_<name>.{json,png} (`--results`).

    experiments/replan_recording.py \\
        experiments/results/consolidate_host_consolidate.recording --from 180 --to 300
"""
from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

from cachepilot.controller import consolidate, planner, recording, replay
from cachepilot.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def registry_of(cfg, last: dict) -> types.SimpleNamespace:
    """The controller's registry as far as planning reads it: per node, its
    tenants' latest reports and its memory (no registration: the config
    gives disks and cores)."""
    nodes = {}
    for name, report in last.items():
        node = cfg.tenant(name).node
        nodes.setdefault(node, types.SimpleNamespace(
            tenants={}, memory_bytes=cfg.node(node).memory_bytes, info=None))
        nodes[node].tenants[name] = report
    return types.SimpleNamespace(nodes=nodes)


def plan_both(cfg, state, last) -> dict:
    reg = registry_of(cfg, last)
    demands = consolidate.live_demands(cfg, state, reg)
    refine = consolidate.as_allocated(cfg, state, reg)
    out = {}
    for label in ("offers", "without"):
        if label == "without":
            for d in demands:
                d.options = []
        try:
            p = planner.plan(cfg, demands=demands, refine=refine)
            out[label] = {"hosts": len(p.hosts_used), "breaks": p.breaks,
                          "sizes_mib": {d.tenant: d.demand_bytes >> 20 for d in p.demands}}
        except UserError as err:
            out[label] = {"hosts": None, "breaks": [], "error": str(err)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--from", dest="first", type=int, default=1)
    ap.add_argument("--to", dest="last", type=int, default=10**9)
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = ap.parse_args(argv)
    try:
        lines = recording.read(args.recording)
    except (OSError, ValueError, UserError) as err:
        print(f"replan: {err}", file=sys.stderr)
        return 2
    last, rows = {}, []

    def after_round(line, state, cfg) -> bool:
        n = line["round"]
        if n > args.last:
            return True
        for reports in line["reports"].values():
            for r in reports:
                rep = recording.decode_report(r)
                last[rep.tenant] = rep
        if n >= args.first and (n - args.first) % args.every == 0:
            got = plan_both(cfg, state, last)
            rows.append({"round": n, **got})
            o, w = got["offers"], got["without"]
            print(f"round {n:5d}: with the offers {o['hosts']} hosts "
                  f"(breaks {o['breaks'] or 'none'}), without {w['hosts']} hosts "
                  f"(breaks {w['breaks'] or 'none'})", flush=True)
        return False
    try:
        replay.replay(lines, after_round=after_round)
    except UserError as err:
        print(f"replan: {err}", file=sys.stderr)
        return 2
    if not rows:
        print("replan: no round in that range", file=sys.stderr)
        return 2
    saved = sum(1 for r in rows if r["offers"]["hosts"] is not None and (
        r["without"]["hosts"] is None or r["offers"]["hosts"] < r["without"]["hosts"]))
    worse = sum(1 for r in rows if r["without"]["hosts"] is not None and (
        r["offers"]["hosts"] is None or r["offers"]["hosts"] > r["without"]["hosts"]))
    print(f"{len(rows)} plans: the offers used fewer hosts in {saved}, more in {worse}")
    name = Path(args.recording).name.split(".")[0]
    out = Path(args.results) / f"replan_{name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"recording": args.recording, "every": args.every, "plans": rows,
         "fewer_hosts_with_offers": saved, "more_hosts_with_offers": worse}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(8, 3))
    names = {"offers": "with the larger sizes offered",
             "without": "demands alone (a gap: no placement)"}
    for label, style in (("without", "s--"), ("offers", "o-")):
        hosts = [r[label]["hosts"] if r[label]["hosts"] is not None else float("nan")
                 for r in rows]
        ax.plot([r["round"] for r in rows], hosts, style, label=names[label])
    ax.set_xlabel("round of the recording the plan is made at")
    ax.set_ylabel("hosts the plan uses")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"plans replayed from {name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
