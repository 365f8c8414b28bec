"""Curve calibration: what each policy really missed against its curve.

A policy's curve comes from a miniature simulation, and some policies
simulate better than others.  The kernel's own reclaim is the hardest: the
"linux" curve is a model of it, and on one workload the real kernel misses
less than that model says, on another more.  Two curves that differ by a
few percent then say nothing about which policy is really better, and the
autopilot, reading them raw, can leave the better policy for the worse.

The cure is the evidence a tenant produces anyway.  While a policy runs,
every report carries its observed miss ratio beside that policy's curve;
their difference at the memory the tenant holds (watchdog.held_pages) is
the curve's error for this workload now.  The last `window` such errors
per policy are kept, and their mean is added to that policy's curve
wherever the autopilot scores it and the watchdog judges against it:

  * a policy that has run is scored by its curve plus its own error;
  * a policy that has not run (or whose evidence is older than `max_age`
    of the tenant's rounds) is scored by its curve as it is.

So the policy in force is weighed by what it really does and every other
by what its curve promises.  Where the running policy does better than its
curve, a rival has to promise more to be tried; where it does worse, a
rival is tried sooner -- and once tried, it too is weighed by what it did,
so the autopilot goes back if the promise was hollow and does not try it
again while that evidence is fresh.  A policy just switched to keeps the
score it was chosen by until its own evidence is in: it is not judged
twice by different rules.

The first report after a policy starts running is not evidence (its
interval mixes two policies), nor is one without that policy's curve or
with no accesses.  Evidence needs MIN_EVIDENCE reports before it counts,
and until the running policy's is in (MIN_EVIDENCE + 1 reports after it
started, at most) the autopilot does not switch away from it -- a policy
is not left before it has been seen to run; the rounds that wanted the
switch still count, and the first round with the evidence decides.
Offsets are additive and read at any size: an error measured near the
limit the tenant holds is what the comparison at that limit needs.

It runs only where `control.calibration_window` is above 0, in one of two
currencies (`control.calibration_currency`):

  * "miss_ratio": the evidence is the curve's error against the cgroup's
    miss ratio, added to the curve (offsets()).  That is the application's
    currency only where every read counts: a key-value store beside a
    scanner serves its GETs better under a policy that misses more in
    total, and calibrated so, the policy with fewer misses in total wins
    (the README's "End to end" has the run);
  * "throughput": the evidence is the log of the tenant's own operations
    per second over what its model made of the policy's curve at the
    memory held, and a policy that ran is scored by the model times the
    exponential of its mean (factors()).  The model is fitted on the
    cgroup's miss ratio under whatever ran, so one policy's factor alone
    says little; two policies' factors say which served more operations
    for the misses their curves promised.  The hooks' cost needs no
    estimate for a policy with evidence: it is in what was served.
"""
from __future__ import annotations

import math

from cachepilot.controller.engine import watchdog
from cachepilot.models.mrc import PAGE_SIZE

MIN_EVIDENCE = 2


def _store(st, currency: str) -> dict:
    return st.served if currency == "throughput" else st.calib


def observe(st, report, window: int, currency: str = "miss_ratio") -> None:
    """Add this report's evidence for the policy it ran (st.calib or, by
    throughput, st.served: policy -> [[tenant round, evidence], ...],
    newest last).  Called before st.running takes the report's policy and
    before this round's model fit: a report whose policy differs from
    st.running starts that policy's run, and throughput is weighed against
    the model as it stood when the policy's interval ran."""
    if window <= 0:
        return
    if report.policy != st.running:
        st.calib_since = st.rounds
        return
    limit = report.limit_bytes / PAGE_SIZE if report.limit_bytes > 0 else math.inf
    predicted = watchdog.curve_at_held(report, limit)
    if predicted is None:
        return
    m = report.miss_ratio
    if currency == "throughput":
        thr, per_op = report.throughput, st.a + st.b * predicted
        if thr is None or not (math.isfinite(thr) and thr > 0) or not per_op > 0:
            return
        value = math.log(thr * per_op)      # log(observed / modelled)
    else:
        value = float(m) - predicted
    if not math.isfinite(value):
        return
    store = _store(st, currency)
    store[report.policy] = (list(store.get(report.policy, [])) +
                            [[st.rounds, value]])[-window:]


def error(st, policy: str, max_age: int, currency: str = "miss_ratio") -> float | None:
    """The mean of `policy`'s recent evidence (by miss ratio, its curve's
    error; by throughput, the log of served over modelled), or None where
    it has too little that is recent enough."""
    fresh = [e for r, e in _store(st, currency).get(policy, ()) if st.rounds - r <= max_age]
    if len(fresh) < MIN_EVIDENCE:
        return None
    return math.fsum(fresh) / len(fresh)


def awaited(st, policy: str, window: int, currency: str = "miss_ratio") -> bool:
    """Whether `policy`, running, is yet to give the evidence it soon will:
    it started fewer than MIN_EVIDENCE + 1 reports ago and has none."""
    return (window > 0 and st.running == policy and
            st.rounds - st.calib_since <= MIN_EVIDENCE and
            len(_store(st, currency).get(policy, ())) < MIN_EVIDENCE)


def offsets(st, policies, max_age: int) -> dict[str, float]:
    """Per policy, what to add to its curve: its own recent error, else 0."""
    out = {}
    for p in policies:
        e = error(st, p, max_age)
        out[p] = 0.0 if e is None else e
    return out


def factors(st, policies, max_age: int) -> dict[str, float]:
    """Calibrating by throughput: per policy with recent evidence, what its
    modelled throughput is multiplied by (served over modelled, the
    geometric mean of its last reports); a policy without any is absent."""
    out = {}
    for p in policies:
        e = error(st, p, max_age, "throughput")
        if e is not None:
            out[p] = math.exp(e)
    return out
