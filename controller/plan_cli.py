"""`cachepilot plan`: the fewest hosts that meet every SLO.

    cachepilot plan --config configs/plan-20.yaml [--json plan.json]
                    [--headroom 0.1] [--method auto|milp|ffd] [--confirm]

Prints the placement (tenant -> host, the policy and memory each needs),
the hosts used out of those given, the memory freed, and which method
answered: an exact MILP for small cases, first-fit decreasing beyond.
--confirm replays the placement on the sim backend with every limit held
at its planned demand and says whether each SLO held.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from cachepilot.core.errors import UserError

MiB = 1 << 20


def register(subparsers):
    p = subparsers.add_parser(
        "plan", help="consolidation plan: fewest hosts meeting every SLO",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="YAML config: hosts, tenants, SLOs")
    p.add_argument("--json", metavar="OUT", help="also write the plan as JSON here")
    p.add_argument("--headroom", type=float, default=0.10,
                   help="plan for SLO x (1 + headroom) (default 0.10)")
    p.add_argument("--method", choices=["auto", "milp", "ffd"], default="auto",
                   help="auto: exact MILP when small, first-fit decreasing beyond")
    p.add_argument("--time-limit", type=float, default=20.0,
                   help="seconds the MILP may take (default 20)")
    p.add_argument("--confirm", action="store_true",
                   help="replay the placement on the sim backend and check every SLO")
    p.set_defaults(func=run)


def _mib(b) -> str:
    return "-" if b is None or b == math.inf else f"{b / MiB:.1f}"


def print_plan(plan: dict) -> None:
    """A plan (Plan.to_dict()) for a person: per tenant its host, policy,
    memory, disk and CPU and its predicted throughput against its SLO;
    per host what binds it; the moves in order."""
    pred = plan.get("predictions", {})
    print(f"placement of {len(plan['demands'])} tenants ({plan['method']}, "
          f"{plan['seconds']:.1f} s; packed on {', '.join(plan['resources'])}):")
    print(f"  {'tenant':<14} {'now on':<10} {'-> host':<10} {'policy':<8} "
          f"{'MiB':>7} {'disk MiB/s':>10} {'cores':>5} {'pred ops/s':>10} {'SLO ops/s':>9}")
    for d in sorted(plan["demands"], key=lambda d: (plan["assignment"][d["tenant"]],
                                                     d["tenant"])):
        p = pred.get(d["tenant"], {})
        ops, slo = p.get("predicted_ops"), d["slo"]
        verdict = {True: "", False: "  MISSED", None: ""}[p.get("slo_met")]
        print(f"  {d['tenant']:<14} {d['current_node']:<10} "
              f"{plan['assignment'][d['tenant']]:<10} {d['policy'] or '-':<8} "
              f"{_mib(d['demand_bytes']):>7} {d['disk_bps'] / MiB:>10.1f} {d['cpu']:>5.2f} "
              f"{(f'{ops:,.0f}' if ops else '-'):>10} "
              f"{(f'{slo:,.0f}' if slo else '-'):>9}{verdict}")
    print("hosts:")
    for h in plan["hosts"]:
        if h["tenants"]:
            print(f"  {h['name']:<10} {_mib(h['demand_bytes']):>7} of "
                  f"{_mib(h['memory_bytes'])} MiB planned, {len(h['tenants'])} tenants; "
                  f"binds on {h['binding']} ({h['binding_fraction']:.0%})")
    freed = [h["name"] for h in plan["hosts"] if not h["tenants"]]
    print(f"fewest hosts: {len(plan['hosts_used'])} of {len(plan['hosts'])} "
          f"(lower bound {plan['lower_bound_hosts']}); memory freed "
          f"{_mib(plan['memory_freed_bytes'])} of {_mib(plan['memory_total_bytes'])} MiB"
          + (f" ({', '.join(freed)})" if freed else "")
          + f"; {len(plan['moved'])} tenants move")
    for i, m in enumerate(plan.get("moves", []), 1):
        print(f"  move {i}: {m['tenant']} {m['from']} -> {m['to']} at "
              f"{_mib(m['limit_bytes'])} MiB under {m['policy'] or 'its policy'}")
    if plan.get("forced_hosts"):
        print(f"packed into {plan['forced_hosts']} hosts on request: "
              + ("every SLO still predicted met" if not _breaks(plan) else
                 f"predicted to miss the SLO of {', '.join(_breaks(plan))}"))


def _breaks(plan: dict) -> list[str]:
    return sorted(t for t, p in plan.get("predictions", {}).items() if p["slo_met"] is False)


def run(args) -> int:
    from cachepilot.controller import planner
    from cachepilot.controller.config import load_config

    if not (0 <= args.headroom <= 10) or math.isnan(args.headroom):
        raise UserError(f"--headroom: expected a number in [0, 10], got {args.headroom}")
    if not args.time_limit > 0:
        raise UserError(f"--time-limit: expected seconds > 0, got {args.time_limit}")
    cfg = load_config(args.config)
    result = planner.plan(cfg, headroom=args.headroom, method=args.method,
                          time_limit=args.time_limit)
    print_plan(result.to_dict())
    out = {"plan": result.to_dict(), "headroom": args.headroom}
    code = 0
    if args.confirm:
        check = planner.confirm_with_sim(cfg, result)
        missed = sorted(n for n, v in check.items() if not v["met"])
        for name in sorted(check):
            v = check[name]
            print(f"  sim: {name:<14} lowest {v['min_throughput']:.0f}/s vs SLO "
                  f"{v['slo']:g}/s over {v['intervals']} warm intervals: "
                  f"{'met' if v['met'] else 'MISSED'}")
        print("sim confirms every SLO" if not missed else
              f"sim: SLO missed by {', '.join(missed)}")
        out["sim"] = check
        code = 0 if not missed else 1
    if args.json:
        path = Path(args.json)
        try:
            path.write_text(json.dumps(out, indent=2, default=_json_default))
        except OSError as err:
            raise UserError(f"--json {path}: cannot write: {err.strerror}") from None
        print(f"wrote {path}")
    return code


def _json_default(v):
    if isinstance(v, float) and math.isinf(v):
        return None
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not serialisable: {type(v).__name__}")
