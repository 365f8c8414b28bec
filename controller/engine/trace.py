"""The round's trace: per tenant, what it read, what each step made of it,
and which rule set the limit and the policy.

RoundTrace keeps references to the round's arrays (no copying while the
round runs) and builds one JSON-able record per tenant when asked
(`records()`); `explain()` turns a record into the few lines an operator
reads (`cachepilot admin explain`).  A record's step figures reproduce its
directive's limit to the byte (see `limit_from_record`), so an
explanation is the arithmetic that was done, not a story told after it.
"""
from __future__ import annotations

import math
import zlib

import numpy as np

from cachepilot.models.mrc import PAGE_SIZE

VERSION = 1
MIB = 1 << 20


class RoundTrace:
    """One round's trace over its rows (engine/round.py Round)."""

    def __init__(self, R, decision, ctl):
        self.R, self.number = R, R.number
        self.ctl = ctl
        self.limits = {d.tenant: d.limit_bytes for ds in decision.directives.values()
                       for d in ds}

    def tenants(self) -> list[str]:
        return [spec.name for _, spec, _ in self.R.rows]

    def records(self) -> list[dict]:
        """Every tenant's record, in row order."""
        R = self.R
        if not R.n:
            return []
        cols = _Cols(R)
        return [_record(R, cols, i, self.limits.get(R.rows[i][1].name), self.ctl)
                for i in range(R.n)]


class _Cols:
    """The round's arrays as Python lists, read once for every record."""

    NAMES = ("limit_now", "equal", "ref", "lb", "ub", "current", "slo", "has_slo",
             "a", "b", "spread", "m_spread", "has_curve", "alloc_row", "run_row",
             "target", "x_lo", "granted", "new", "pred_target", "pred_new", "pred_old",
             "m_new", "feasible", "feasible_now", "headroom", "need", "need_safe",
             "target_wanted", "mem_pages", "node_of")

    def __init__(self, R):
        for name in self.NAMES:
            v = getattr(R, name, None)
            setattr(self, name, v.tolist() if v is not None else [None] * R.n)
        n = R.bank.n if R.bank is not None else 0
        self.score = R.score.tolist() if n else []
        self.score_raw = R.score_raw.tolist() if n else []
        self.need_rows = R.need_rows.tolist() if n and R.need_rows is not None else []
        at = np.minimum(R.ref, R.ub)[R.row_tenant] if n else np.zeros(0)
        self.m_scored = R.bank.miss_at(np.arange(n), at, raw=True).tolist() if n else []
        self.kept = R.kept.tolist() if R.kept is not None else [False] * R.n
        self.shrink = R.shrink_held.tolist() if R.shrink_held is not None else [False] * R.n
        step = R.step or {}
        self.step = {k: v.tolist() for k, v in step.items()}


def _num(v):
    """A float for JSON: None where it is not finite."""
    return float(v) if v is not None and math.isfinite(v) else None


def _bytes(pages):
    return None if pages is None or not math.isfinite(pages) else int(round(pages * PAGE_SIZE))


def _record(R, c: _Cols, i: int, limit_b: int | None, ctl) -> dict:
    ni, spec, r = R.rows[i]
    st = R.tstates[i]
    mine = R.row_of[i] if i < len(R.row_of) else {}
    return {
        "version": VERSION, "round": R.number, "node": R.nodes[ni], "tenant": spec.name,
        "inputs": _inputs(r, c, i),
        "model": {"a_s": c.a[i], "b_s": c.b[i], "fitted": bool(st.fitted),
                  "spread": c.spread[i], "curve_error": c.m_spread[i]},
        "bounds": {"node_bytes": _bytes(c.mem_pages[ni]), "floor_bytes": _bytes(c.lb[i]),
                   "ceiling_bytes": _bytes(c.ub[i]), "equal_bytes": _bytes(c.equal[i]),
                   "in_force_bytes": _bytes(c.current[i]),
                   "scored_at_bytes": _bytes(min(c.ref[i], c.ub[i])),
                   "hysteresis_bytes": _bytes(ctl.hysteresis * c.mem_pages[ni])},
        "policy": _policy(R, c, i, mine, ctl),
        "slo": _slo(R, c, i, spec, mine),
        "allocation": _allocation(R, c, i),
        "step": _step(c, i),
        "limit": {"bytes": limit_b, "rule": _limit_rule(R, c, i)},
        "prediction": _prediction(R, c, i),
    }


def _inputs(r, c: _Cols, i: int) -> dict:
    return {
        "policy_running": r.policy, "limit_bytes": int(r.limit_bytes),
        "usage_anon_bytes": int(r.usage_anon_bytes), "usage_file_bytes": int(r.usage_file_bytes),
        "miss_ratio": _num(r.miss_ratio), "throughput": _num(r.throughput),
        "accesses_per_s": _num(r.accesses_per_s), "cpu_per_s": _num(r.cpu_per_s),
        "held_reason": r.held_reason,
        "curves": [{"policy": cv.policy, "method": cv.method, "rate": float(cv.rate),
                    "points": len(cv.sizes), "digest": _digest(cv)} for cv in r.curves],
    }


def _digest(curve) -> str:
    """A short fingerprint of a curve's points: the same curve, the same
    digest (a replay checks it reads what the recording read)."""
    h = zlib.crc32(np.ascontiguousarray(curve.sizes).tobytes())
    return f"{zlib.crc32(np.ascontiguousarray(curve.miss_ratio).tobytes(), h):08x}"


def _policy(R, c: _Cols, i: int, mine: dict, ctl) -> dict:
    ch, r = R.choices[i], R.rows[i][2]
    verdict = R.verdicts[i] if i < len(R.verdicts) else None
    if R.held[i]:
        rule = "held"
    elif ch.switched and verdict is not None and not verdict.kept:
        rule = "revert"
    elif ch.switched:
        rule = "trial" if ch.trial else "switch"
    else:
        rule = "keep"
    st = R.tstates[i]
    return {
        "running": r.policy, "chosen": ch.policy, "rule": rule, "reason": ch.reason,
        "best": ch.best, "gain": _num(ch.gain), "trial": bool(ch.trial),
        "threshold": ctl.autopilot_threshold, "rounds_needed": ctl.autopilot_k,
        "streak": {"policy": st.streak_policy, "rounds": st.streak},
        "advisory": bool(R.advisory[R.rows[i][0]] or R.recommend[i]),
        "allowed": list(R.allowed_of[i]) if i < len(R.allowed_of) else [],
        "held_off": {p: int(u) for p, u in st.held_until.items() if u > st.rounds},
        "scores": {p: _num(c.score[k]) for p, k in mine.items()},
        "scores_raw": {p: _num(c.score_raw[k]) for p, k in mine.items()},
        "miss_at_scored": {p: _num(c.m_scored[k]) for p, k in mine.items()},
    }


def _slo(R, c: _Cols, i: int, spec, mine: dict) -> dict | None:
    if not c.has_slo[i]:
        return None
    return {
        "min_ops": c.slo[i], "priority": spec.priority,
        "need_bytes": _bytes(c.need[i]), "safe_bytes": _bytes(c.need_safe[i]),
        "feasible": bool(c.feasible[i]), "feasible_this_round": bool(c.feasible_now[i]),
        "granted": bool(c.granted[i]), "headroom": _num(c.headroom[i]),
        "need_by_policy": {p: _bytes(max(c.need_rows[k], c.lb[i])) for p, k in mine.items()}
        if c.need_rows else {},
    }


def _allocation(R, c: _Cols, i: int) -> dict:
    hold = R.phase_hold[i] if R.phase_hold else None
    return {
        "after_slos_bytes": _bytes(c.x_lo[i]), "wanted_bytes": _bytes(c.target_wanted[i]),
        "target_bytes": _bytes(c.target[i]), "rule": _target_rule(R, c, i, hold),
        "kept_last_division": bool(c.kept[i]), "shrink_waits": bool(c.shrink[i]),
        "phase_hold": None if hold is None else {"curve_miss": _num(hold[0]),
                                                 "observed_miss": _num(hold[1])},
    }


def _target_rule(R, c: _Cols, i: int, hold) -> str:
    """What set the allocation's target for row i."""
    if R.held[i] or not c.has_curve[i]:
        return "held" if R.held[i] else "no-curve"
    if c.shrink[i]:
        return "shrink-waits"
    tgt, x_lo = c.target[i], c.x_lo[i]
    if tgt > x_lo + 0.5:
        if c.kept[i]:
            return "kept-last-division"
        return "ceiling" if tgt >= c.ub[i] - 0.5 else "throughput"
    if c.granted[i]:
        if not math.isfinite(c.need[i]):
            return "slo-warming"
        return "slo-headroom" if x_lo > c.need[i] + 0.5 else "slo-need"
    if hold is not None and x_lo > c.lb[i] + 0.5:
        return "phase-hold"
    return "floor" if x_lo <= c.lb[i] + 0.5 else "throughput"


def _step(c: _Cols, i: int) -> dict:
    s = c.step
    if not s:
        return {}
    base, want, scale = s["base"][i], s["want"][i], s["scale"][i]
    return {"base_pages": base, "want_pages": want, "scale": scale,
            "cut_pages": base + scale * want - s["stepped"][i],
            "settled": bool(s["settled"][i]), "floor_pages": c.lb[i],
            "in_force_pages": c.current[i]}


def _limit_rule(R, c: _Cols, i: int) -> str:
    """What set the directed limit for row i."""
    if R.held[i]:
        return "held"
    if not c.has_curve[i]:
        return "no-curve"
    new, cur = c.new[i], c.current[i]
    if new == cur:
        return "in-force" if abs(c.target[i] - cur) < 1.0 else "hysteresis"
    if c.step and new > c.step["stepped"][i]:
        return "floor"
    return "target" if abs(new - c.target[i]) < 1.0 else "step"


def _prediction(R, c: _Cols, i: int) -> dict:
    k = c.alloc_row[i]
    return {"policy": R.row_policy[k] if k is not None and k >= 0 else None,
            "miss_ratio": _num(c.m_new[i]), "throughput": _num(c.pred_new[i]),
            "throughput_at_target": _num(c.pred_target[i]),
            "throughput_before": _num(c.pred_old[i])}


def limit_from_record(rec: dict) -> int:
    """The directive's limit, in bytes, from the record's own figures, as
    the round computes it: the node's step moves the limit in force
    (after any safety raise, `base`) by `scale` of the move wanted, less
    what paying for another tenant's safety raise took back (`cut`); never
    below the floor; in whole pages -- or the limit in force, to the byte,
    where that comes out where it was.  Tests hold records to it."""
    inp, step = rec["inputs"], rec["step"]
    if not step:
        return inp["limit_bytes"]
    stepped = step["base_pages"] + step["scale"] * step["want_pages"]
    if step["cut_pages"]:
        stepped = stepped - step["cut_pages"]
    new = max(stepped, step["floor_pages"])
    if new == step["in_force_pages"] and inp["limit_bytes"] > 0:
        return inp["limit_bytes"]
    return max(int(new) * PAGE_SIZE, int(step["floor_pages"]) * PAGE_SIZE)


# -- the words ----------------------------------------------------------------
def mib(b) -> str:
    if b is None:
        return "?"
    return f"{b / (1 << 30):.2f} GiB" if b >= 10 << 30 else f"{b / MIB:.1f} MiB"


def rate(v) -> str:
    return "?" if v is None else f"{v:,.0f} ops/s" if v >= 100 else f"{v:.3g} ops/s"


LIMIT_WORDS = {
    "held": "held where it is: {why}",
    "no-curve": "held where it is: no curve to size it on yet",
    "hysteresis": "kept: the target {target} is within the hysteresis ({hyst}) of it",
    "in-force": "kept: the target is the limit in force",
    "floor": "raised to its safety floor {floor} (the floor, or anonymous memory + margin)",
    "target": "set to the target {target}",
    "step": "stepped from {cur} toward the target {target}: the node's step allows "
            "{scale:.0%} of the move",
}

TARGET_WORDS = {
    "held": "none: the tenant is held", "no-curve": "none: no curve yet",
    "shrink-waits": "a shrink to {wanted} waits until the next round's target agrees",
    "kept-last-division": "the node's last division, kept: the new one would not gain "
                          "enough throughput to be worth the move",
    "ceiling": "its ceiling {ceiling}: every page up to it adds throughput",
    "throughput": "{after_slos} after the SLO stage, plus {extra} where the node's memory "
                  "adds the most throughput",
    "slo-warming": "held for its SLO while its curve is still warming",
    "slo-headroom": "its SLO's need {need} plus headroom, to {safe}",
    "slo-need": "its SLO's need {need} (no memory left for headroom)",
    "phase-hold": "held at {after_slos}: its phase changed and its curve does not yet "
                  "read what it misses",
    "floor": "its floor {floor}: nothing else on the node wants memory less",
}


def explain(rec: dict) -> str:
    """A record as the few lines an operator reads."""
    b, alloc, pol, pred = rec["bounds"], rec["allocation"], rec["policy"], rec["prediction"]
    slo, step, inp = rec["slo"], rec["step"], rec["inputs"]
    figures = {"target": mib(alloc["target_bytes"]), "wanted": mib(alloc["wanted_bytes"]),
               "after_slos": mib(alloc["after_slos_bytes"]), "floor": mib(b["floor_bytes"]),
               "ceiling": mib(b["ceiling_bytes"]), "cur": mib(b["in_force_bytes"]),
               "hyst": mib(b["hysteresis_bytes"]), "scale": (step or {}).get("scale") or 0.0,
               "why": inp["held_reason"],
               "extra": mib((alloc["target_bytes"] or 0) - (alloc["after_slos_bytes"] or 0)),
               "need": mib(slo["need_bytes"]) if slo else "?",
               "safe": mib(slo["safe_bytes"]) if slo else "?"}
    lines = [f"{rec['tenant']} on {rec['node']}, round {rec['round']}: limit "
             f"{mib(rec['limit']['bytes'])}, policy {pol['chosen']}"]
    lines.append("  limit: " + LIMIT_WORDS[rec["limit"]["rule"]].format(**figures))
    lines.append("  target: " + TARGET_WORDS[alloc["rule"]].format(**figures))
    lines.append(f"  bounds: floor {figures['floor']}, ceiling {figures['ceiling']}, "
                 f"equal share {mib(b['equal_bytes'])} of the node's {mib(b['node_bytes'])}")
    if slo:
        lines.append(f"  SLO: {rate(slo['min_ops'])} (priority {slo['priority']}): "
                     + (f"needs {figures['need']} under {pred['policy']}, sized at "
                        f"{figures['safe']}" if slo["feasible"] else
                        "no size within its bounds meets it"))
    lines += _policy_lines(pol, b)
    if pred["throughput"] is not None:
        lines.append(f"  prediction: miss ratio {pred['miss_ratio']:.3f}, "
                     f"{rate(pred['throughput'])} next interval (under {pred['policy']}; "
                     f"{rate(pred['throughput_before'])} as it ran)")
    lines.append(f"  inputs: observed miss ratio {_ratio(inp['miss_ratio'])}, "
                 f"{rate(inp['throughput'])}, limit {mib(inp['limit_bytes'])}, anonymous "
                 f"{mib(inp['usage_anon_bytes'])}, {len(inp['curves'])} curves")
    return "\n".join(lines)


def _ratio(v) -> str:
    return "?" if v is None else f"{v:.3f}"


def _policy_lines(pol: dict, b: dict) -> list[str]:
    how = {"keep": "kept", "switch": "switched", "trial": "tried (judged on what it "
           "serves)", "revert": "switched back by the watchdog", "held": "held"}[pol["rule"]]
    out = [f"  policy: {pol['chosen']}, {how}"
           + (f" ({pol['reason']})" if pol["reason"] and pol["reason"] != "keep" else "")]
    scores = {p: v for p, v in pol["scores"].items() if v is not None}
    if scores:
        top = scores.get(pol["chosen"]) or max(scores.values())
        parts = []
        for p, v in sorted(scores.items(), key=lambda kv: -kv[1]):
            rel = f" ({v / top - 1:+.1%})" if p != pol["chosen"] and top else ""
            off = " held off" if p in pol["held_off"] else ""
            parts.append(f"{p} {rate(v)}{rel}{off}")
        out.append(f"  scored at {mib(b['scored_at_bytes'])}: " + "; ".join(parts))
        out.append(f"  a challenger must lead by {pol['threshold']:.0%} for "
                   f"{pol['rounds_needed']} rounds to be switched to"
                   + (f" (streak: {pol['streak']['policy']}, {pol['streak']['rounds']} "
                      f"round(s))" if pol["streak"]["policy"] else ""))
    return out
