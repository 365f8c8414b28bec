"""The round's trace: per tenant, what it read, what each step made of it,
and which rule set the limit and the policy.

A round's trace is kept as columns -- the round's own arrays, one entry a
tenant, and one a (tenant, policy) curve -- and packed as one compressed
blob (`encode`): a thousand tenants' trace costs a few milliseconds, not
a thousand nested records.  `record(columns, i)` builds tenant i's
JSON-able record from them when one is asked for, and `explain()` turns a
record into the few lines an operator reads (`cachepilot admin explain`).
A record's step figures reproduce its directive's limit to the byte
(`limit_from_record`): an explanation is the arithmetic that was done,
not a story told after it.
"""
from __future__ import annotations

import base64
import json
import math

import numpy as np
import zstandard

from cachepilot.controller.engine.emit import _num
from cachepilot.core import units
from cachepilot.models.mrc import PAGE_SIZE

VERSION = 1

# per-row arrays of the Round (engine/round.py) the trace keeps
ROW_ARRAYS = ("limit_now", "equal", "ref", "lb", "ub", "current", "slo", "has_slo", "a", "b",
              "spread", "m_spread", "has_curve", "alloc_row", "run_row", "target", "x_lo",
              "granted", "new", "pred_target", "pred_new", "pred_old", "m_new", "feasible",
              "feasible_now", "headroom", "need", "need_safe", "target_wanted", "kept",
              "kept_shrink", "shrink_held", "filling", "t_sigma", "served_at")
STEP_ARRAYS = ("base", "want", "scale", "stepped", "settled")


class RoundTrace:
    """One round's trace (see the module doc)."""

    def __init__(self, R, decision, ctl):
        self.R, self.directives, self.ctl = R, decision.directives, ctl

    def tenants(self) -> list[str]:
        return [spec.name for _, spec, _ in self.R.rows]

    def columns(self) -> dict:
        """The trace as columns: numbers as float arrays, the rest as lists."""
        R, ctl = self.R, self.ctl
        n, num = R.n, {}
        for name in ROW_ARRAYS:
            v = getattr(R, name, None)
            num[name] = np.asarray(v, dtype=np.float64) if v is not None else np.full(n, np.nan)
        for name in STEP_ARRAYS:
            v = (R.step or {}).get(name)
            num["step_" + name] = np.asarray(v, dtype=np.float64) if v is not None \
                else np.full(n, np.nan)
        num["node_pages"] = R.mem_pages[R.node_of] if n else np.zeros(0)
        num["node"] = R.node_of.astype(np.float64)
        num["r_limit_bytes"] = R.limit_now * PAGE_SIZE
        for name, col in (R.observed or {}).items():
            num["r_" + name] = col
        for name, get in REPORT_NUMBERS.items():
            num["r_" + name] = R.column(get)
        sts = R.tstates
        num["fitted"] = np.fromiter((t.fitted for t in sts), dtype=np.float64, count=n)
        num["streak"] = np.fromiter((t.streak for t in sts), dtype=np.float64, count=n)
        num["priority"] = R.column(lambda s, r: s.priority)
        limits = {d.tenant: d.limit_bytes for ds in self.directives.values() for d in ds}
        hold = R.phase_hold or [None] * n
        text = {
            "tenant": self.tenants(),
            "running": [r.policy for _, _, r in R.rows],
            "held_reason": list(R.held),
            "chosen": [c.policy for c in R.choices], "best": [c.best for c in R.choices],
            "reason": [c.reason for c in R.choices],
            "policy_rule": [_policy_rule(R, i) for i in range(n)],
            "streak_policy": [t.streak_policy for t in sts],
        }
        obj = {
            "limit_bytes": [limits.get(t) for t in text["tenant"]],
            "gain": [_num(c.gain) for c in R.choices],
            "trial": [bool(c.trial) for c in R.choices],
            "allowed": R.allowed_of,
            "held_off": [{p: u for p, u in t.held_until.items() if u > t.rounds}
                         if t.held_until else {} for t in sts],
            "phase_hold": [None if h is None else [_num(h[0]), _num(h[1])] for h in hold],
            "advisory": [bool(R.advisory[R.rows[i][0]] or R.recommend[i]) for i in range(n)],
        }
        return {"version": VERSION, "round": R.number, "nodes": list(R.nodes),
                "ctl": {"threshold": ctl.autopilot_threshold, "k": ctl.autopilot_k,
                        "hysteresis": ctl.hysteresis},
                "num": num, "text": text, "obj": obj, "bank": _bank(R)}

    def encode(self) -> bytes:
        """The columns as one zstd-compressed blob (decode() reads it)."""
        cols = self.columns()
        cols["num"] = {k: _pack(v) for k, v in cols["num"].items()}
        cols["bank"] = {k: _pack(v) if isinstance(v, np.ndarray) else v
                        for k, v in cols["bank"].items()}
        # a compressor a call: one object is not to be shared between threads
        return zstandard.ZstdCompressor(level=1).compress(
            json.dumps(cols, separators=(",", ":")).encode())

    def records(self) -> list[dict]:
        """Every tenant's record, in row order."""
        cols = plain(self.columns())
        mine: dict[int, list[int]] = {}
        for k, row in enumerate(cols["bank"]["row"]):
            mine.setdefault(int(row), []).append(k)
        return [record(cols, i, mine.get(i, [])) for i in range(self.R.n)]


# report figures the round has no array of already (fit_models keeps the
# observed miss ratio, throughput and accesses in R.observed)
REPORT_NUMBERS = {
    "anon_bytes": lambda s, r: r.usage_anon_bytes,
    "file_bytes": lambda s, r: r.usage_file_bytes,
    "cpu_per_s": lambda s, r: r.cpu_per_s,
}

def _pack(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.float64).tobytes()).decode()


def _unpack(text: str) -> list:
    return np.frombuffer(base64.b64decode(text), dtype=np.float64).tolist()



def decode(blob: bytes) -> dict:
    """A blob from encode() as plain columns (lists), ready for record()."""
    cols = json.loads(zstandard.ZstdDecompressor().decompress(blob))
    if cols.get("version") != VERSION:
        raise ValueError(f"a trace of version {cols.get('version')}; this reads {VERSION}")
    cols["num"] = {k: _unpack(v) for k, v in cols["num"].items()}
    cols["bank"] = {k: _unpack(v) if isinstance(v, str) else v
                    for k, v in cols["bank"].items()}
    return cols


def plain(cols: dict) -> dict:
    """columns() with the arrays as lists (what decode() gives)."""
    out = dict(cols)
    out["num"] = {k: v.tolist() for k, v in cols["num"].items()}
    out["bank"] = {k: v.tolist() if isinstance(v, np.ndarray) else v
                   for k, v in cols["bank"].items()}
    return out


def find(cols: dict, tenant: str) -> int | None:
    try:
        return cols["text"]["tenant"].index(tenant)
    except ValueError:
        return None


def _bank(R) -> dict:
    """Per (tenant, policy) curve the round read: its tenant's row, policy,
    score, score with only its sampling's doubt (a trial's), miss ratio
    where scored, least size meeting the SLO, and a fingerprint of its
    points."""
    bank = R.bank
    k = bank.n if bank is not None else 0
    if not k:
        return {"row": np.zeros(0), "policy": [], "score": np.zeros(0),
                "score_raw": np.zeros(0), "m_scored": np.zeros(0), "need": np.zeros(0),
                "points": np.zeros(0), "digest": np.zeros(0)}
    at = np.minimum(R.ref, R.ub)[R.row_tenant]
    return {"row": R.row_tenant.astype(np.float64), "policy": list(R.row_policy),
            "score": R.score, "score_raw": R.score_raw,
            "m_scored": bank.miss_at(np.arange(k), at, raw=True),
            "need": R.need_rows if R.need_rows is not None else np.full(k, np.nan),
            "points": (bank.lens - 1).astype(np.float64), "digest": _digests(bank)}


def _digests(bank) -> np.ndarray:
    """A fingerprint of each curve's points as the round read them (its
    sizes and miss ratios weighed by a fixed sequence over its points), as
    64 bits in a float's place: the same curve, the same digest, so a
    replay can tell it read the same curve."""
    pos = np.arange(len(bank.xs)) - bank.start[bank.cid]
    w = (pos * 0.6180339887498949) % 1.0 + 0.5
    fx = np.bincount(bank.cid, weights=bank.xs_raw * w, minlength=bank.n)
    fy = np.bincount(bank.cid, weights=bank.ys * w, minlength=bank.n)
    h = fx.view(np.uint64) ^ (fy.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return h.view(np.float64)


def _hex(digest: float) -> str:
    return f"{np.float64(digest).view(np.uint64):016x}"


def _policy_rule(R, i: int) -> str:
    ch = R.choices[i]
    verdict = R.verdicts[i] if i < len(R.verdicts) else None
    if R.held[i]:
        return "held"
    if ch.switched and verdict is not None and not verdict.kept:
        return "revert"
    if ch.switched:
        return "trial" if ch.trial else "switch"
    return "keep"


def _bytes(pages):
    return None if pages is None or not math.isfinite(pages) else int(round(pages * PAGE_SIZE))


# -- one tenant's record ---------------------------------------------------------
def record(cols: dict, i: int, mine: list[int] | None = None) -> dict:
    """Row i of plain columns (plain() or decode()) as a JSON-able record;
    `mine`: its curves' entries in cols["bank"], where already known."""
    v = {k: col[i] for k, col in cols["num"].items()}
    t = {k: col[i] for k, col in cols["text"].items()}
    o = {k: col[i] for k, col in cols["obj"].items()}
    bank = cols["bank"]
    if mine is None:
        mine = [k for k, row in enumerate(bank["row"]) if row == i]
    ctl = cols["ctl"]
    return {
        "version": VERSION, "round": cols["round"], "node": cols["nodes"][int(v["node"])],
        "tenant": t["tenant"],
        "inputs": _inputs(v, t, o, bank, mine),
        "model": {"a_s": v["a"], "b_s": v["b"], "fitted": bool(v["fitted"]),
                  "spread": _num(v["spread"]), "curve_error": _num(v["m_spread"]),
                  "prediction_error": _num(v.get("t_sigma", math.nan))},
        "bounds": {"node_bytes": _bytes(v["node_pages"]), "floor_bytes": _bytes(v["lb"]),
                   "ceiling_bytes": _bytes(v["ub"]), "equal_bytes": _bytes(v["equal"]),
                   "in_force_bytes": _bytes(v["current"]),
                   "scored_at_bytes": _bytes(min(v["ref"], v["ub"])),
                   "hysteresis_bytes": _bytes(ctl["hysteresis"] * v["node_pages"])},
        "policy": _policy(v, t, o, bank, mine, ctl),
        "slo": _slo(v, bank, mine) if v["has_slo"] else None,
        "allocation": _allocation(v, t, o),
        "step": _step(v),
        "limit": {"bytes": o["limit_bytes"], "rule": _limit_rule(v, t)},
        "prediction": {"policy": bank["policy"][int(v["alloc_row"])]
                       if v["alloc_row"] >= 0 else None,
                       "miss_ratio": _num(v["m_new"]), "throughput": _num(v["pred_new"]),
                       "throughput_at_target": _num(v["pred_target"]),
                       "throughput_before": _num(v["pred_old"])},
    }


def _inputs(v, t, o, bank, mine) -> dict:
    return {
        "policy_running": t["running"], "limit_bytes": int(v["r_limit_bytes"]),
        "usage_anon_bytes": int(v["r_anon_bytes"]), "usage_file_bytes": int(v["r_file_bytes"]),
        "miss_ratio": _num(v["r_miss_ratio"]), "throughput": _num(v["r_throughput"]),
        "accesses_per_s": _num(v["r_accesses_per_s"]), "cpu_per_s": _num(v["r_cpu_per_s"]),
        "held_reason": t["held_reason"],
        "curves": {bank["policy"][k]: {"points": int(bank["points"][k]),
                                       "digest": _hex(bank["digest"][k]),
                                       "miss_at_scored": _num(bank["m_scored"][k])}
                   for k in mine},
    }


def _policy(v, t, o, bank, mine, ctl) -> dict:
    return {
        "running": t["running"], "chosen": t["chosen"], "rule": t["policy_rule"],
        "reason": t["reason"], "best": t["best"], "gain": o["gain"], "trial": o["trial"],
        "threshold": ctl["threshold"], "rounds_needed": ctl["k"],
        "streak": {"policy": t["streak_policy"], "rounds": int(v["streak"])},
        "advisory": o["advisory"], "allowed": o["allowed"], "held_off": o["held_off"],
        "scores": {bank["policy"][k]: _num(bank["score"][k]) for k in mine},
        "scores_raw": {bank["policy"][k]: _num(bank["score_raw"][k]) for k in mine},
    }


def _slo(v, bank, mine) -> dict:
    return {
        "min_ops": v["slo"], "priority": int(v["priority"]),
        "need_bytes": _bytes(v["need"]), "safe_bytes": _bytes(v["need_safe"]),
        "feasible": bool(v["feasible"]), "feasible_this_round": bool(v["feasible_now"]),
        "granted": bool(v["granted"]), "headroom": _num(v["headroom"]),
        "served_at_bytes": _bytes(v.get("served_at")),
        "need_by_policy": {bank["policy"][k]: _bytes(max(bank["need"][k], v["lb"]))
                           for k in mine},
    }


def _allocation(v, t, o) -> dict:
    hold = o["phase_hold"]
    return {
        "after_slos_bytes": _bytes(v["x_lo"]), "wanted_bytes": _bytes(v["target_wanted"]),
        "target_bytes": _bytes(v["target"]), "rule": _target_rule(v, t, hold),
        "kept_last_division": v["kept"] == 1.0,
        "kept_shrunk_to": _num(v["kept_shrink"]) if v["kept"] == 1.0 and
        v["kept_shrink"] < 1.0 else None, "shrink_waits": v["shrink_held"] == 1.0,
        "phase_hold": None if hold is None else {"curve_miss": hold[0],
                                                 "observed_miss": hold[1]},
    }


def _target_rule(v, t, hold) -> str:
    """What set the allocation's target."""
    if t["held_reason"] or not v["has_curve"]:
        return "held" if t["held_reason"] else "no-curve"
    if v["shrink_held"] == 1.0:
        return "shrink-waits"
    tgt, x_lo = v["target"], v["x_lo"]
    if tgt > x_lo + 0.5:
        if v["kept"] == 1.0:
            return "kept-shrunk-division" if v["kept_shrink"] < 1.0 else "kept-last-division"
        return "ceiling" if tgt >= v["ub"] - 0.5 else "throughput"
    if v["granted"]:
        if not math.isfinite(v["need"]):
            return "slo-warming"
        return "slo-headroom" if x_lo > v["need"] + 0.5 else "slo-need"
    if v.get("filling") == 1.0 and x_lo > v["lb"] + 0.5:
        return "filling-hold"
    if hold is not None and x_lo > v["lb"] + 0.5:
        return "phase-hold"
    return "floor" if x_lo <= v["lb"] + 0.5 else "throughput"


def _step(v) -> dict:
    base, want, scale = v["step_base"], v["step_want"], v["step_scale"]
    if not math.isfinite(base):
        return {}
    return {"base_pages": base, "want_pages": want, "scale": scale,
            "cut_pages": base + scale * want - v["step_stepped"],
            "settled": v["step_settled"] == 1.0, "floor_pages": v["lb"],
            "in_force_pages": v["current"]}


def _limit_rule(v, t) -> str:
    """What set the directed limit."""
    if t["held_reason"]:
        return "held"
    if not v["has_curve"]:
        return "no-curve"
    new, cur = v["new"], v["current"]
    if new == cur:
        return "in-force" if abs(v["target"] - cur) < 1.0 else "hysteresis"
    if new > v["step_stepped"]:
        return "floor"
    return "target" if abs(new - v["target"]) < 1.0 else "step"


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
mib, rate = units.size, units.rate


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
                          "enough throughput, beyond the error of the tenants' "
                          "predictions, to be worth the move",
    "kept-shrunk-division": "the node's last division, no longer fitting it, shrunk to fit "
                            "({shrunk} of each share above the floors) and kept: the "
                            "model rates the new one lower",
    "ceiling": "its ceiling {ceiling}: every page up to it adds throughput",
    "throughput": "{after_slos} after the SLO stage, plus {extra} where the node's memory "
                  "adds the most throughput",
    "slo-warming": "held for its SLO while its curve is still warming",
    "slo-headroom": "its SLO's need {need} plus headroom, to {safe}",
    "slo-need": "its SLO's need {need} (no memory left for headroom)",
    "filling-hold": "held at {after_slos}: its cache is still filling (nothing evicted "
                    "yet), so no curve says yet what less memory would cost it",
    "phase-hold": "held at {after_slos}: its operations per page read jumped (a new "
                  "phase, or its cache cut or refilled) and its curve does not yet read "
                  "what it misses",
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
               "shrunk": f"{100 * (alloc.get('kept_shrunk_to') or 1.0):.1f} %",
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
                        "no size within its bounds meets it")
                     + (f" (at most {mib(slo['served_at_bytes'])}, the limit its latest "
                        f"reports all served it at with room)"
                        if slo["feasible"] and slo.get("served_at_bytes") is not None
                        and slo["served_at_bytes"] <= (slo["safe_bytes"] or 0) else ""))
    lines += _policy_lines(pol, b)
    if pred["throughput"] is not None:
        err = rec["model"].get("prediction_error")
        lines.append(f"  prediction: miss ratio {pred['miss_ratio']:.3f}, "
                     f"{rate(pred['throughput'])} next interval (under {pred['policy']}; "
                     f"{rate(pred['throughput_before'])} as it ran)"
                     + (f", trusted to +/-{100 * err:.0f} %" if err is not None else ""))
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
