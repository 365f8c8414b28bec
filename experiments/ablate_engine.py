#!/usr/bin/env python3
"""What each rule of the control round is worth: the scenario corpus run
with the engine as it is, then with each rule switched off in turn.

A rule is switched off through the round's fixed figures or functions
(engine/round.py; bench_scenarios.figures sets them for the autopilot run
and puts them back) or through a control field, never by editing the
engine.  Every run is the corpus's own (experiments/scenarios.py; the
autopilot against the static equal split, bench_scenarios.run_scenario),
at the seed offsets asked.  Per rule it prints, beside the full engine's:
the mean and lowest aggregate ratio to the equal split, the runs below
1.0x, the runs whose SLO check fails (an SLO the equal split meets in
>= 95 % of intervals met in fewer), the most policy reverts of one
tenant in a run, and the policy switches and reverts of all runs.  A
rule whose removal loses nothing on any of these is not worth its line
(issue 45).

    experiments/ablate_engine.py --corpus DIR [--seeds 0,1,2] [--only RULE ...]
        [--jobs 2] [--results DIR] [--curve-rate R]

Writes ablation.json and ablation.png (the change in mean ratio and in
failed SLO checks per rule) into --results (default experiments/results).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scenarios  # noqa: E402

from cachepilot.controller.engine import round as _round  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


# -- the rules switched off: functions that stand in for a rule's own --------

def no_filling(R):
    """_track_filling without the hold: no cache counts as filling."""
    _ROUND["_track_filling"](R)
    R.filling = np.zeros(R.n, dtype=bool)


def no_sibling_hold(st, verdict, allowed, baseline):
    """_hold_siblings without the hold: only the policy undone is held off."""


def no_warming_hold(R, ctl):
    """_hold_warming without the hold: an SLO's need as this round sized it."""
    return R.need.copy(), R.need_safe.copy()


def no_phase_hold(R):
    """_hold_new_phase without the hold: a new phase is sized at once."""
    return [None] * R.n


def no_prediction_sigma(R):
    """prediction_sigma without a record: every prediction taken as exact."""
    return np.zeros(R.n)


def no_trial(st, policy, limit_bytes, usable, least=2):
    """watchdog.trial_reference without trials: no reference, no trial."""
    return None


def no_trial_window(raw_scores, cur, share):
    """round._within_window without the window: a challenger's whole lead."""
    return raw_scores


class OneTurnover:
    """models.policy_settling read as one cache's worth of inserts for
    every policy (a class, so the corpus's worker processes can take it)."""

    @staticmethod
    def turnovers(policy):
        return 1.0


def no_phase_pool(R, hist, ctl):
    """round._pool_phase without the pooling: each curve read on its last
    window alone."""


def never_seen_meeting(R, rows, wanted):
    """round._seen_meeting without the evidence: no SLO's safe size is
    capped where the tenant was seen to serve it."""
    return np.full(len(rows), np.inf)


def no_sampling_sd(R, at, m):
    """round._sampling_sd without the sampling error: no curve's doubt
    grows with the error of its sample."""
    return np.zeros(R.bank.n)


def no_taught(R, ctl):
    """round._taught without what failed switches taught."""
    return np.zeros(R.bank.n)


def whole_limit_held(R):
    """_track_filling holding a filling cache's whole limit, not only what
    it reaches within PHASE_HOLD_ROUNDS rounds."""
    _ROUND["_track_filling"](R)
    R.fill_reach = np.full(R.n, np.inf)


def feedback_while_filling(R, ctl):
    """_slo_feedback judging intervals a cache spent filling as well."""
    filling = R.filling
    R.filling = np.zeros(R.n, dtype=bool)
    _ROUND["_slo_feedback"](R, ctl)
    R.filling = filling


# the round's own functions, as imported, for the stand-ins above that
# wrap them (bench_scenarios.figures replaces them by name)
_ROUND = {"_track_filling": _round._track_filling, "_slo_feedback": _round._slo_feedback}


# name -> (what the rule does, round figures / functions, control fields)
RULES = {
    "filling-hold": ("a cache still filling is not cut", {"_track_filling": no_filling}, {}),
    "fill-reach": ("a filling cache keeps only what it reaches within 8 rounds",
                   {"_track_filling": whole_limit_held}, {}),
    "sibling-hold": ("an undone switch holds off its siblings",
                     {"_hold_siblings": no_sibling_hold}, {}),
    "warming-hold": ("an SLO whose curve is still warming keeps its memory",
                     {"_hold_warming": no_warming_hold}, {}),
    "phase-hold": ("a new phase is not cut until its curve reads it",
                   {"_hold_new_phase": no_phase_hold}, {}),
    "shrink-confirm": ("an SLO tenant's shrink waits for a second round",
                       {"SHRINK_ROUNDS": 1}, {}),
    "feasibility-debounce": ("an SLO's feasibility turns after 3 rounds agree",
                             {"FEASIBILITY_ROUNDS": 1}, {}),
    "slo-headroom": ("SLOs sized with headroom over their need",
                     {"SLO_HEADROOM": 0.0, "SLO_HEADROOM_SIGMAS": 0.0}, {}),
    "slo-feedback": ("an SLO's misses raise its safe size", {"FEEDBACK_STEP": 0.0}, {}),
    "slo-seen": ("an SLO's safe size is at most a limit it was seen to serve it at",
                 {"_seen_meeting": never_seen_meeting}, {}),
    "feedback-settled": ("an SLO's misses count only once its cache stopped filling",
                         {"_slo_feedback": feedback_while_filling}, {}),
    "doubt": ("a challenger's curve is scored 0.01 worse", {"DOUBT": 0.0}, {}),
    "phase-pool": ("a sampled curve is read over the windows of its phase, not one",
                   {"_pool_phase": no_phase_pool}, {}),
    "sampling-doubt": ("a challenger's doubt grows with its curve's sampling error",
                       {"_sampling_sd": no_sampling_sd}, {}),
    "overpromise": ("what a failed switch overpromised is read into the policies like it",
                    {"_taught": no_taught}, {}),
    "trials": ("a lead only the doubt hides is tried", {"watchdog:trial_reference": no_trial},
               {}),
    "trial-window": ("a trial's lead counts as far as its policy settles in its window",
                     {"_within_window": no_trial_window}, {}),
    "settling": ("each policy settles in its measured caches' worth of inserts, not one",
                 {"watchdog:policy_settling": OneTurnover}, {}),
    "memory-thrift": ("a tied policy that saves SLO memory earns a switch",
                      {"MEMORY_THRESHOLD": 1e9}, {}),
    "watchdog": ("a switch that does worse than staying is undone",
                 {"WATCHDOG_INTERVALS": 10 ** 9}, {}),
    "baseline-return": ("a policy that no longer earns its hooks goes back to linux", {},
                        {"autopilot_baseline": None}),
    "reallocation-deadband": ("memory moves only for a 3 % modelled gain", {},
                              {"reallocation_gain": 0.0}),
    "prediction-doubt": ("a new division must win by more than its predictions' error",
                         {"prediction_sigma": no_prediction_sigma}, {}),
    "curve-error-stretch": ("sampled curves read as needing 2 standard errors more", {},
                            {"curve_error_sigmas": 0.0}),
    "policies": ("the policy autopilot as a whole (allocation alone)",
                 {"MEMORY_THRESHOLD": 1e9, "watchdog:trial_reference": no_trial},
                 {"autopilot_threshold": 1e9}),
}


def run_corpus(paths, intervals, offsets, classes, fixed, control, jobs,
               curve_rate: float = 1.0) -> list[dict]:
    runs = ("equal", "autopilot")
    out = []
    for offset in offsets:
        todo = [(p, intervals, offset, runs, classes.get(p.stem), control, fixed, curve_rate)
                for p in paths]
        out += list(bench_scenarios.run_isolated(todo, jobs))
    return out


def summary(results: list[dict]) -> dict:
    ratios = [r["ratio_vs_equal"]["autopilot"] for r in results]
    reverts = [max([v["reverts"] for v in r["decisions"]["autopilot"].values()] or [0])
               for r in results]
    return {"runs": len(ratios), "mean": statistics.mean(ratios),
            "median": statistics.median(ratios), "lowest": min(ratios),
            "below_1": sum(x < 1.0 for x in ratios),
            "slo_fails": sum(not r["check_passed"] for r in results),
            "most_reverts": max(reverts),
            "switches": sum(v["switches"] for r in results
                            for v in r["decisions"]["autopilot"].values()),
            "reverts": sum(v["reverts"] for r in results
                           for v in r["decisions"]["autopilot"].values()),
            "ratios": {f"{r['scenario']}@{r['seed_offset']}": x
                       for r, x in zip(results, ratios)}}


def plot(rows: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    full = rows["full engine"]
    names = [n for n in rows if n != "full engine"]
    d_mean = [rows[n]["mean"] - full["mean"] for n in names]
    d_fail = [rows[n]["slo_fails"] - full["slo_fails"] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.4 * len(names) + 1.5), sharey=True)
    y = np.arange(len(names))
    a.barh(y, d_mean, color=["#c44" if v > 0 else "#4a4" for v in d_mean])
    a.set_yticks(y, names)
    a.axvline(0, color="k", lw=0.8)
    a.set_xlabel("mean ratio to the equal split, rule off - full engine\n"
                 "(green, below 0: the rule earns its place)")
    b.barh(y, d_fail, color=["#4a4" if v > 0 else "#c44" if v < 0 else "#999" for v in d_fail])
    b.axvline(0, color="k", lw=0.8)
    b.set_xlabel("runs failing the SLO check, rule off - full engine\n"
                 "(green, above 0: the rule keeps SLOs met)")
    fig.suptitle(f"What each rule is worth: {full['runs']} corpus runs "
                 f"(full engine: mean {full['mean']:.3f}x, {full['slo_fails']} SLO fails)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, metavar="DIR",
                    help="a corpus folder (experiments/scenarios.py --out DIR)")
    ap.add_argument("--seeds", type=bench_scenarios._seeds, default=[0], metavar="K,K,...")
    ap.add_argument("--only", nargs="*", choices=sorted(RULES), metavar="RULE",
                    help=f"rules to switch off (default: all): {', '.join(RULES)}")
    ap.add_argument("--jobs", type=int, default=2, metavar="N")
    ap.add_argument("--results", type=Path, default=RESULTS, metavar="DIR")
    ap.add_argument("--curve-rate", type=float, default=1.0, metavar="R",
                    help="the sim samples accesses at rate R for the curves, as an agent "
                    "does (0.01); default 1: exact curves")
    args = ap.parse_args(argv)
    if not 0 < args.curve_rate <= 1:
        print(f"ablate_engine: --curve-rate {args.curve_rate:g}: expected a rate in (0, 1]",
              file=sys.stderr)
        return 2
    index_file = Path(args.corpus) / "index.json"
    if not index_file.is_file():
        print(f"ablate_engine: {args.corpus} holds no corpus (no index.json); write one "
              f"with experiments/scenarios.py --out {args.corpus}", file=sys.stderr)
        return 2
    index = json.loads(index_file.read_text())
    paths = [Path(args.corpus) / e["file"] for e in index["scenarios"]]
    classes = {e["name"]: {s["tenant"]: s["class"] for s in e["slos"]}
               for e in index["scenarios"]}
    todo = [("full engine", "", {}, {})] + [
        (n, *RULES[n]) for n in (args.only or RULES)]
    rows = {}
    for k, (name, what, fixed, control) in enumerate(todo, 1):
        started = time.monotonic()
        print(f"[{k}/{len(todo)}] {name}{': off -- ' + what if what else ''} ...", flush=True)
        res = run_corpus(paths, index["intervals"], args.seeds, classes, fixed, control,
                         args.jobs, args.curve_rate)
        rows[name] = {"rule": what, **summary(res)}
        r = rows[name]
        print(f"    mean {r['mean']:.3f}x  median {r['median']:.3f}x  lowest "
              f"{r['lowest']:.2f}x  below 1.0x {r['below_1']}  SLO fails {r['slo_fails']}  "
              f"most reverts {r['most_reverts']}  switches {r['switches']}  reverts "
              f"{r['reverts']}  ({time.monotonic() - started:.0f} s)",
              flush=True)
    full = rows["full engine"]
    print(f"\n{'rule switched off':24} {'mean':>7} {'d mean':>7} {'lowest':>7} "
          f"{'<1.0x':>6} {'SLO fails':>9} {'most rv':>8} {'switches':>9} {'reverts':>8}")
    for name, r in rows.items():
        print(f"{name:24} {r['mean']:7.3f} {r['mean'] - full['mean']:+7.3f} "
              f"{r['lowest']:7.2f} {r['below_1']:6d} {r['slo_fails']:9d} "
              f"{r['most_reverts']:8d} {r['switches']:9d} {r['reverts']:8d}")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "ablation.json"
    out.write_text(json.dumps({"corpus": str(args.corpus), "seeds": args.seeds,
                               "curve_rate": args.curve_rate,
                               "corpus_index": {k: v for k, v in index.items()
                                                if k != "scenarios"},
                               "rules": rows}, indent=1))
    plot(rows, args.results / "ablation.png")
    print(f"wrote {out} and ablation.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
