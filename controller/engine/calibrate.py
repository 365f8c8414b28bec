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

It runs only where `control.calibration_window` is above 0.  The currency
is the cgroup's miss ratio, which is the application's only where every
read counts: a key-value store beside a scanner serves its GETs better
under a policy that misses more in total, and calibrated, the policy with
fewer misses in total wins (the README's "End to end" has the run).
"""
from __future__ import annotations

import math

from cachepilot.controller.engine import watchdog
from cachepilot.models.mrc import PAGE_SIZE

MIN_EVIDENCE = 2


def observe(st, report, window: int) -> None:
    """Add this report's error for the policy it ran (st.calib: policy ->
    [[tenant round, observed - predicted], ...], newest last).  Called
    before st.running takes the report's policy: a report whose policy
    differs from it starts that policy's run."""
    if window <= 0:
        return
    if report.policy != st.running:
        st.calib_since = st.rounds
        return
    curve = next((c for c in report.curves if c.policy == report.policy), None)
    m = report.miss_ratio
    if curve is None or not report.accesses_per_s > 0 or not 0.0 <= m <= 1.0:
        return
    limit = report.limit_bytes / PAGE_SIZE if report.limit_bytes > 0 else math.inf
    at = watchdog.held_pages(report, curve, limit)
    if not math.isfinite(at):
        return
    err = float(m) - float(curve.at(at))
    if not math.isfinite(err):
        return
    past = st.calib.get(report.policy, [])
    st.calib[report.policy] = (list(past) + [[st.rounds, err]])[-window:]


def error(st, policy: str, max_age: int) -> float | None:
    """The mean error of `policy`'s curve over its recent evidence, or None
    where it has too little that is recent enough."""
    fresh = [e for r, e in st.calib.get(policy, ()) if st.rounds - r <= max_age]
    if len(fresh) < MIN_EVIDENCE:
        return None
    return math.fsum(fresh) / len(fresh)


def awaited(st, policy: str, window: int) -> bool:
    """Whether `policy`, running, is yet to give the evidence it soon will:
    it started fewer than MIN_EVIDENCE + 1 reports ago and has none."""
    return (window > 0 and st.running == policy and
            st.rounds - st.calib_since <= MIN_EVIDENCE and
            len(st.calib.get(policy, ())) < MIN_EVIDENCE)


def offsets(st, policies, max_age: int) -> dict[str, float]:
    """Per policy, what to add to its curve: its own recent error, else 0."""
    out = {}
    for p in policies:
        e = error(st, p, max_age)
        out[p] = 0.0 if e is None else e
    return out
