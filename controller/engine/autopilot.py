"""Policy autopilot: when to switch a tenant's eviction policy.

Every allowed policy with a curve is scored by the modelled throughput it
would give at the tenant's current size (engine/round.py reads it over
the tenant's recent windows, a challenger with its doubt).  The best
replaces the policy in force only when it beats it by more than
`autopilot_threshold` in `autopilot_k` rounds before as many rounds have
not shown it: one noisy window never flips a policy, a phase change does
within K windows.  Ties go to the policy in force, then the
alphabetically first.  Three more ways to switch, each counted the same:
for an SLO tenant, a policy tied in throughput that meets the SLO in
clearly less memory (_thriftiest); back to the baseline, the kernel's
own policy with no hooks, once no other earns its hooks' CPU
(_back_to_baseline); and a *trial* of a challenger only its doubt holds
back, judged by the watchdog on what the tenant then serves (_to_try).
A policy the tenant may no longer use, or that the watchdog holds off,
is left at once.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from cachepilot.controller.engine.types import TenantState


@dataclass
class PolicyChoice:
    policy: str                 # the policy to direct this round
    switched: bool
    best: str | None            # best-scoring policy this round
    gain: float                 # predicted relative gain of best over current
    reason: str
    trial: bool = False         # a switch to try, judged by what it serves


def choose_policy(current: str, allowed: list[str], scores: dict[str, float],
                  st: TenantState, threshold: float, k: int,
                  held_off: Collection[str] = (), baseline: str | None = None,
                  needs: dict[str, tuple[float, float]] | None = None,
                  memory_threshold: float = 0.15,
                  raw_scores: dict[str, float] | None = None,
                  can_try: bool = False) -> PolicyChoice:
    """Update st's streak and say which policy to direct.

    current: the policy in force (decide() says which that is);
    allowed: policies the tenant may use (sorted); scores: modelled
    throughput at the current size for each allowed policy with a curve;
    held_off: policies the watchdog does not let it use for now;
    baseline: the policy to go back to when no other earns its hooks;
    needs: for a tenant with an SLO, the least size meeting it under each
    policy, as a range (low, high) for the curve's error (inf where none
    does); memory_threshold: the saving in it that earns a switch among
    policies tied in throughput; raw_scores: the scores with only the
    sampling's part of the challengers' doubt (round._doubt), and
    can_try: whether a lead only they show may be tried (module doc)."""
    if held_off:
        allowed = [p for p in allowed if p not in held_off]
        scores = {p: v for p, v in scores.items() if p not in held_off}
        raw_scores = {p: v for p, v in (raw_scores or {}).items() if p not in held_off}
    if not scores:
        _reset(st)
        return PolicyChoice(current, False, None, 0.0, "no curves to compare")
    top = max(scores.values())
    best = current if scores.get(current, -1.0) >= top * (1 - 1e-12) else \
        min(p for p, v in scores.items() if v >= top * (1 - 1e-12))
    if current not in allowed:
        _reset(st)
        why = "is held off by the watchdog" if current in held_off else \
            "is not an allowed policy"
        return PolicyChoice(best, True, best, float("inf"), f"{current} {why}")
    base = scores.get(current)
    gain = float("inf") if not base else top / base - 1.0
    saving = 0.0
    if (best == current or gain <= threshold) and needs and base and memory_threshold > 0:
        thrifty, saving = _thriftiest(current, scores, needs, top, threshold)
        if saving > memory_threshold:
            best, gain = thrifty, scores[thrifty] / base - 1.0
    if saving <= memory_threshold and (best == current or gain <= threshold):
        trial = _to_try(current, raw_scores, threshold / 2, baseline) \
            if can_try and base else None
        if trial is not None:
            return _count(st, trial[0], trial[1], current, k, baseline, trial=True)
        if baseline is not None and current != baseline and scores.get(baseline) and base:
            if not memory_threshold or \
                    _saving(needs or {}, current, baseline) <= memory_threshold / 2:
                return _back_to_baseline(current, baseline, base / scores[baseline] - 1.0,
                                         st, threshold, k, best, gain)
        _miss(st, k, baseline)
        return _keep(current, best, gain, threshold)
    if saving > memory_threshold:
        return _count(st, best, gain, current, k, baseline, saving=saving)
    return _count(st, best, gain, current, k, baseline, no_curve=base is None)


def _count(st: TenantState, best: str, gain: float, current: str, k: int,
           baseline: str | None, saving: float = 0.0, no_curve: bool = False,
           trial: bool = False) -> PolicyChoice:
    """One more round toward switching to `best`; the switch once K have."""
    if st.streak_policy is not None and st.streak_policy == baseline != best:
        st.streak, st.streak_misses = 0, 0   # the rounds counted were toward the baseline
    st.streak += 1
    st.streak_policy = best
    if saving:
        why = f"{best} meets the SLO in {saving:.0%} less memory than {current} " \
              f"(scores {gain:+.1%})"
        done, so_far = f"{why} for {k} intervals", f"{why} ({st.streak}/{k} intervals)"
    elif trial:
        why = f"{best} leads {current} by {gain:.1%} on its curve, within its doubt"
        done = f"{why}, for {k} intervals: tried against what {current} served"
        so_far = f"{why} ({st.streak}/{k} intervals)"
    else:
        what = "no curve for it" if no_curve else f"+{gain:.1%}"
        done = f"{best} beats {current} ({what}) for {k} intervals"
        so_far = f"{best} beats {current} by {gain:.1%} ({st.streak}/{k} intervals)"
    if st.streak >= k:
        _reset(st)
        return PolicyChoice(best, True, best, gain, done, trial=trial)
    return PolicyChoice(current, False, best, gain, so_far)


def _to_try(current: str, raw_scores: dict[str, float] | None, threshold: float,
            baseline: str | None) -> tuple[str, float] | None:
    """The challenger (neither the policy in force nor the baseline, which
    no doubt weighs and which is gone back to without earning it) leading
    the policy in force by more than `threshold` on the scores without
    doubt, and its lead; None where none does (ties to the alphabetically
    first)."""
    mine = (raw_scores or {}).get(current)
    others = {p: v for p, v in (raw_scores or {}).items() if p not in (current, baseline)}
    if not mine or not others:
        return None
    top = max(others.values())
    lead = top / mine - 1.0
    if lead <= threshold:
        return None
    return min(p for p, v in others.items() if v >= top * (1 - 1e-12)), lead


def _saving(needs: dict[str, tuple[float, float]], p: str, than: str) -> float:
    """How much less memory (relative to `than`'s) policy p meets the SLO
    in, at the least: p's need at the high end of its range against
    `than`'s at the low end.  inf where only p meets it, 0 where neither
    does or p may need more."""
    mine = needs.get(p, (math.inf, math.inf))[1]
    theirs = needs.get(than, (math.inf, math.inf))[0]
    if not math.isfinite(mine):
        return 0.0
    if not math.isfinite(theirs):
        return math.inf
    return max(0.0, 1.0 - mine / theirs) if theirs > 0 else 0.0


def _thriftiest(current: str, scores: dict[str, float],
                needs: dict[str, tuple[float, float]],
                top: float, threshold: float) -> tuple[str, float]:
    """Among the policies scoring within half the threshold of the best,
    the one meeting the SLO in the least memory (ties to the policy in
    force, then the alphabetically first), and its saving over current."""
    tied = [p for p, v in scores.items() if v >= top * (1 - threshold / 2)]
    pick = min(tied, key=lambda p: (needs.get(p, (math.inf,) * 2)[1], p != current, p))
    return pick, _saving(needs, pick, current)


def _keep(current: str, best: str, gain: float, threshold: float) -> PolicyChoice:
    """No switch this round; where another policy scores higher, the reason
    says by how much (the decision log then shows a lead that never
    reached the threshold)."""
    if best == current or gain <= 0:
        return PolicyChoice(current, False, best, 0.0, "keep")
    return PolicyChoice(current, False, best, gain,
                        f"{best} leads {current} by {gain:.1%} (a switch needs "
                        f"{threshold:.0%})")


def _reset(st: TenantState) -> None:
    st.streak, st.streak_policy, st.streak_misses = 0, None, 0


def _miss(st: TenantState, k: int, baseline: str | None) -> None:
    """A round in which no switch looked worth it: a streak toward one
    survives up to k - 1 such rounds (a streak back to the baseline, which
    _back_to_baseline counts, does not)."""
    if st.streak and st.streak_misses + 1 < k and st.streak_policy not in (None, baseline):
        st.streak_misses += 1
    else:
        _reset(st)


def _back_to_baseline(current: str, baseline: str, lead: float, st: TenantState,
                      threshold: float, k: int, best: str, gain: float) -> PolicyChoice:
    """The baseline is allowed and scored, and no policy beats the one in
    force by the threshold: count the rounds in which the policy in force
    leads the baseline by at most half the threshold."""
    if lead > threshold / 2:
        _miss(st, k, baseline)
        return _keep(current, best, gain, threshold)
    if st.streak_policy != baseline:
        _reset(st)
    st.streak += 1
    st.streak_policy = baseline
    if st.streak >= k:
        _reset(st)
        return PolicyChoice(baseline, True, best, -lead,
                            f"{current} leads {baseline} by {lead:+.1%} only, for {k} "
                            f"intervals: back to {baseline}, which runs no policy hooks")
    return PolicyChoice(current, False, best, 0.0,
                        f"{current} leads {baseline} by {lead:+.1%} only "
                        f"({st.streak}/{k} intervals)")
