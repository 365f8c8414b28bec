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

With `--measured RUN.json` (what `make consolidate` wrote beside the
recording), each such round also predicts that run's own placement -- its
plan's hosts, each tenant at its planned size -- and scores the
prediction against what the run measured after the move: the median and
worst relative error over its tenants, with each tenant's per-operation
disk reads and CPU taken over its recent reports (as the planner takes
them) and, beside it, from the last report alone.  A plan made at another
round predicts the same placement from other inputs: how far its
prediction moves with the round is the planner's noise, not the run's.

Writes experiments/results/replan_<name>.{json,png} (`--results`).

    experiments/replan_recording.py \\
        experiments/results/consolidate_host_consolidate.recording --from 180 --to 300
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
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


@contextlib.contextmanager
def one_report():
    """Per-operation costs from each tenant's last report alone, as the
    planner took them before it read them over its recent reports."""
    window = consolidate.recent
    consolidate.recent = lambda st, report: window(None, report)
    try:
        yield
    finally:
        consolidate.recent = window


def score_own(cfg, state, last, run: dict) -> dict:
    """The run's own placement predicted from these inputs, against what
    the run measured after the move (see the module doc): per label,
    {"median", "worst", "errors"}, error = (measured - predicted) /
    predicted."""
    assignment = run["plan"]["assignment"]
    planned = {t["name"]: t for t in run["tenants"]}
    out = {}
    for label, ctx in (("recent", contextlib.nullcontext), ("one_report", one_report)):
        with ctx():
            reg = registry_of(cfg, last)
            demands = consolidate.live_demands(cfg, state, reg)
            placed = [min([d] + list(d.options), key=lambda o, want=planned[d.tenant][
                "planned_limit_bytes"]: abs(o.demand_bytes - want)) for d in demands]
            running = consolidate.as_allocated(cfg, state, reg)(assignment, placed)
            full = planner.host_capacity(cfg)
            got = planner.predict(running, assignment,
                                  {n.name: full[h, 1] for h, n in enumerate(cfg.nodes)},
                                  {n.name: full[h, 2] for h, n in enumerate(cfg.nodes)})
        # over the tenants with both a prediction and a measurement
        errors = {t: (planned[t]["measured_ops"] - p["predicted_ops"]) / p["predicted_ops"]
                  for t, p in got.items() if p["predicted_ops"] and planned[t]["measured_ops"]}
        out[label] = {"median": statistics.median(abs(e) for e in errors.values()),
                      "worst": max(abs(e) for e in errors.values()),
                      "errors": dict(sorted(errors.items()))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--from", dest="first", type=int, default=1)
    ap.add_argument("--to", dest="last", type=int, default=10**9)
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--measured", metavar="RUN.json",
                    help="the run's consolidate_host.json: also score predictions of its "
                         "own placement against what it measured after the move")
    args = ap.parse_args(argv)
    try:
        lines = recording.read(args.recording)
        run = json.loads(Path(args.measured).read_text()) if args.measured else None
    except (OSError, ValueError, UserError) as err:
        print(f"replan: {err}", file=sys.stderr)
        return 2
    if run is not None and not {"plan", "tenants"} <= set(run):
        print(f"replan: {args.measured} is not what make consolidate writes "
              f"(no plan or tenants)", file=sys.stderr)
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
            o, w = got["offers"], got["without"]
            line_ = (f"round {n:5d}: with the offers {o['hosts']} hosts "
                     f"(breaks {o['breaks'] or 'none'}), without {w['hosts']} hosts "
                     f"(breaks {w['breaks'] or 'none'})")
            if run is not None and set(run["plan"]["assignment"]) <= set(last):
                got["own"] = score_own(cfg, state, last, run)
                r_, one = got["own"]["recent"], got["own"]["one_report"]
                line_ += (f"; its own placement off by {100 * r_['median']:.0f}% median, "
                          f"{100 * r_['worst']:.0f}% worst (one report: "
                          f"{100 * one['median']:.0f}%, {100 * one['worst']:.0f}%)")
            rows.append({"round": n, **got})
            print(line_, flush=True)
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
    scored = [r["own"] for r in rows if "own" in r]
    summary = {}
    for label in ("recent", "one_report") if scored else ():
        med = [s_[label]["median"] for s_ in scored]
        worst = [s_[label]["worst"] for s_ in scored]
        summary[label] = {"rounds": len(med), "median_of_medians": statistics.median(med),
                          "rounds_median_within_15pct": sum(m <= 0.15 for m in med),
                          "rounds_worst_within_30pct": sum(w <= 0.30 for w in worst),
                          "largest_worst": max(worst)}
        print(f"its own placement, per-operation costs {label.replace('_', ' ')}: median "
              f"error within 15% in {summary[label]['rounds_median_within_15pct']} of "
              f"{len(med)} rounds, worst within 30% in "
              f"{summary[label]['rounds_worst_within_30pct']}, largest "
              f"{100 * summary[label]['largest_worst']:.0f}%")
    name = Path(args.recording).name.split(".")[0]
    out = Path(args.results) / f"replan_{name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"recording": args.recording, "every": args.every, "plans": rows,
         "fewer_hosts_with_offers": saved, "more_hosts_with_offers": worse,
         "own_placement": summary}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(2 if scored else 1, 1, figsize=(8, 5.5 if scored else 3),
                             sharex=True, squeeze=False)
    ax = axes[0, 0]
    names = {"offers": "with the larger sizes offered",
             "without": "demands alone (a gap: no placement)"}
    for label, style in (("without", "s--"), ("offers", "o-")):
        hosts = [r[label]["hosts"] if r[label]["hosts"] is not None else float("nan")
                 for r in rows]
        ax.plot([r["round"] for r in rows], hosts, style, label=names[label])
    ax.set_ylabel("hosts the plan uses")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"plans replayed from {name}")
    ax.legend()
    if scored:
        ax = axes[1, 0]
        xs = [r["round"] for r in rows if "own" in r]
        for label, colour in (("recent", "C0"), ("one_report", "C3")):
            text = label.replace("_", " ")
            ax.plot(xs, [100 * s_[label]["median"] for s_ in scored], "o-", color=colour,
                     label=f"median, costs from {text}")
            ax.plot(xs, [100 * s_[label]["worst"] for s_ in scored], "^:", color=colour,
                     label=f"worst, costs from {text}")
        ax.axhline(15, color="grey", lw=0.8)
        ax.axhline(30, color="grey", lw=0.8, ls="--")
        ax.set_ylabel("|measured - predicted| %,\nthe run's own placement")
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("round of the recording the plan is made at")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
