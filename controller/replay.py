"""`cachepilot replay`: a recording's rounds fed to decide() again.

Open loop: each recorded round's reports go to decide() as they were
recorded, whatever the replayed engine directs, so a replay answers "what
would this engine (or this configuration) have decided given these
inputs", not "what would then have happened".  With the recorded
configuration a replay must direct exactly what was directed: a round
is a pure function of its state, reports and config (engine/__init__.py),
and the recording holds all three.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from cachepilot.controller import recording
from cachepilot.core.errors import UserError
from cachepilot.core.units import size as _mib


def register(subparsers):
    p = subparsers.add_parser(
        "replay", help="feed a recording's rounds to the decision engine again",
        description="Feed every recorded round's reports to decide(), round by round, "
                    "and compare what it directs with what was directed.  Open loop: the "
                    "reports are the recorded ones whatever the replay directs, so this "
                    "answers what this engine would have decided given those inputs, not "
                    "what would then have happened.  The last line reads: replayed R "
                    "rounds, D directives, K differ.")
    p.add_argument("recording", metavar="DIR",
                   help="a folder written by `run --record` or `controller --record`")
    p.add_argument("--config", metavar="OTHER.yaml",
                   help="decide with this configuration instead of the recorded one (SLOs "
                        "set through the admin API during the recording still apply)")
    p.add_argument("--json", action="store_true",
                   help='print {"rounds", "directives", "differ", "changes"} as JSON')
    p.add_argument("--show", type=int, default=20, metavar="N",
                   help="list at most N of the directives that differ (default 20)")
    p.set_defaults(func=cmd_replay)


@dataclass
class Replayed:
    rounds: int = 0                 # node rounds: a decide() call over k nodes counts k
    directives: int = 0
    changes: list[dict] = field(default_factory=list)
    # control fields the recording set that this engine no longer has
    # (controller/config.py REMOVED_CONTROL): name -> recorded value
    ignored: dict = field(default_factory=dict)
    # (predicted - observed) / observed of each throughput prediction the
    # replayed engine made with a directive the recording also carried
    # out, scored on the recorded report that followed (the engine's own
    # "observed" entries): how well this engine predicts what came
    errors: dict = field(default_factory=dict)      # (round decided, tenant) -> error
    _differed: set = field(default_factory=set)

    def scored(self) -> dict:
        """{"n", "mean_signed", "mean_abs"} of `errors` (None where empty)."""
        v = list(self.errors.values())
        n = len(v)
        return {"n": n, "mean_signed": sum(v) / n if n else None,
                "mean_abs": sum(abs(e) for e in v) / n if n else None}


def cmd_replay(args) -> int:
    from cachepilot.controller.config import load_config
    other = load_config(args.config) if args.config else None
    out = replay(recording.read(args.recording), other)
    if args.json:
        print(json.dumps({"rounds": out.rounds, "directives": out.directives,
                          "differ": len(out.changes), "changes": out.changes,
                          "ignored_control": out.ignored, "predictions": out.scored()},
                         indent=1))
        return 0
    if out.ignored:
        print("the recording's control sets fields this engine no longer has, ignored: " +
              ", ".join(f"{k}={v}" for k, v in sorted(out.ignored.items())))
    for c in out.changes[:max(args.show, 0)]:
        print(f"round {c['round']} {c['tenant']} ({c['node']}): "
              f"limit {_mib(c['limit_before'])} -> {_mib(c['limit_after'])}, "
              f"policy {c['policy_before']} -> {c['policy_after']}")
    if len(out.changes) > args.show:
        print(f"... and {len(out.changes) - args.show} more (--show, --json)")
    sc = out.scored()
    if sc["n"]:
        print(f"throughput predictions scored on the recorded reports: {sc['n']}, mean "
              f"error {100 * sc['mean_signed']:+.1f}% (|error| {100 * sc['mean_abs']:.1f}%)")
    print(f"replayed {out.rounds} rounds, {out.directives} directives, "
          f"{len(out.changes)} differ")
    return 0




def replay(lines: list[dict], other=None, after_round=None) -> Replayed:
    """Every round of a recording (recording.read) through decide(), with
    the recorded configuration or `other`.  `after_round(line, state,
    cfg)`, if given, is called after each round with the state it left;
    it may return True to stop there."""
    from cachepilot.controller import engine
    from cachepilot.controller.engine import saved
    state, cfg, first, out = engine.EngineState(), None, None, Replayed()
    for line in lines[1:]:
        kind = line.get("type")
        if kind == "config":
            recorded = _config(line, out.ignored)
            first = first or recorded
            cfg = recorded if other is None else _with_slos(other, first, recorded)
        elif kind == "restore":
            _need(cfg)
            saved.restore(state, line["records"], int(line["rounds"]),
                          cfg.control.model_window)
        elif kind == "round":
            _need(cfg)
            state = _round(engine, state, cfg, line, out)
            if after_round is not None and after_round(line, state, cfg):
                break
    return out


def _round(engine, state, cfg, line: dict, out: Replayed):
    reports = {n: [recording.decode_report(r) for r in rs]
               for n, rs in line["reports"].items()}
    d, state = engine.decide(state, reports, cfg, node_memory=line.get("node_memory"),
                             advisory_nodes=set(line.get("advisory") or ()),
                             recommend=set(line.get("recommend") or ()))
    out.rounds += len(reports)
    for e in d.log:
        if e.kind == "observed" and e.predicted is not None and e.observed \
                and e.observed > 0 and (e.decided_round, e.tenant) not in out._differed:
            out.errors[(e.decided_round, e.tenant)] = (e.predicted - e.observed) / e.observed
    now = {x.tenant: x for ds in d.directives.values() for x in ds}
    for node, ds in line["directives"].items():
        for tenant, limit, policy, _ in ds:
            out.directives += 1
            x = now.get(tenant)
            if x is None or (x.limit_bytes, x.policy) != (limit, policy):
                out._differed.add((d.round, tenant))
                out.changes.append({
                    "round": line["round"], "node": node, "tenant": tenant,
                    "limit_before": limit, "policy_before": policy,
                    "limit_after": x.limit_bytes if x else None,
                    "policy_after": x.policy if x else None})
    return state


def _need(cfg) -> None:
    if cfg is None:
        raise UserError("the recording has a round before any configuration line")


def _config(line: dict, ignored: dict):
    """The recorded configuration, less the control fields this engine no
    longer has (kept in `ignored`): a recording made before they became
    fixed figures still replays, and says what it set."""
    from cachepilot.controller.config import REMOVED_CONTROL, config_from_dict
    data = {k: line[k] for k in recording.ENGINE_SECTIONS if k in line}
    control = dict(data.get("control") or {})
    for k in [k for k in control if k in REMOVED_CONTROL]:
        ignored[k] = control.pop(k)
    if "control" in data:
        data["control"] = control
    return config_from_dict(data, "the recording's configuration")


def _with_slos(other, first, now):
    """`other`, with the SLOs that changed during the recording (from its
    first configuration to `now`) changed the same way."""
    if first is now:
        return other
    cfg = other.model_copy(deep=True)
    before = {t.name: t.slo for t in first.tenants}
    for t in now.tenants:
        if t.slo != before.get(t.name):
            try:
                cfg.tenant(t.name).slo = t.slo
            except KeyError:
                pass
    return cfg
