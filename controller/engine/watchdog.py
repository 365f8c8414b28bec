"""Model watchdog: undo a policy switch that does worse than promised.

A curve can be wrong (a miniature simulation that models a policy badly,
a sample that missed part of the workload), and then a switch costs what
it was meant to gain.  So every switch the node carries out goes on
probation: over its running reports once it has settled (_settled: not
the interval the switch came in, and only once the pages the new policy
was measured to need to reach its steady state have been inserted
since), the tenant's observed miss ratio is set beside what the old
policy's curve predicted at the memory it held; worse by more than a
margin, or an SLO missed that the old policy was predicted to meet, and
the switch is undone and the policy held off for a cooldown of the
tenant's rounds (check()).  A *trial* (a lead only the autopilot's doubt
hides) is judged, once settled too, on what the tenant served against
what the old policy served just before it (_check_trial()).  Only
reports of the new policy running count; nothing here is random.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from cachepilot.models import policy_settling
from cachepilot.models.mrc import PAGE_SIZE


@dataclass
class Probation:
    """A switch being watched: the evidence gathered so far."""
    new: str                        # the policy switched to
    old: str                        # the policy switched from
    since: int                      # tenant round of the switch
    observed: list[float] = field(default_factory=list)        # miss ratios
    predicted_new: list[float] = field(default_factory=list)   # at the limit
    predicted_old: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)      # observed ops/s
    throughput_old: list[float] = field(default_factory=list)  # old's, modelled
    # a trial: the old policy's mean outcome over the reports before the
    # switch, and the limit (pages) it held then
    trial: bool = False
    ref_miss: float = math.nan
    ref_throughput: float = math.nan    # NaN: the tenant reports none
    ref_pages: float = 0.0
    running_reports: int = 0            # reports with `new` running so far
    inserted: float = 0.0               # pages they inserted (a switch's settling)


@dataclass
class Verdict:
    """The finding that a switch did worse than the old policy's curve
    promised, with the means it was judged on."""
    new: str
    old: str
    intervals: int
    observed: float                 # mean observed miss ratio under `new`
    predicted_new: float            # mean miss ratio new's curve predicted
    predicted_old: float            # ... and old's curve
    margin: float
    cooldown: int
    slo: float | None = None        # set when the switch cost a met SLO:
    throughput: float = math.nan    # mean observed throughput under `new`
    throughput_old: float = math.nan  # ... and old's, modelled
    trial: bool = False             # a trial's verdict: gain is what it measured
    kept: bool = False              # ... and it was kept
    gain: float = math.nan

    @property
    def reason(self) -> str:
        if self.trial and not math.isfinite(self.gain):
            return (f"trial of {self.new}: {self.intervals} intervals at a limit near "
                    f"the one {self.old} was seen at, too few to judge (or no model to "
                    f"judge them by); {self.new} held off for {self.cooldown} rounds")
        if self.trial:
            what = "throughput" if math.isfinite(self.throughput) else "modelled throughput"
            head = (f"trial of {self.new}: over {self.intervals} intervals it missed "
                    f"{self.observed:.3f} where {self.old} would have missed "
                    f"{self.predicted_old:.3f}, {what} {self.gain:+.1%}")
            return (f"{head}: kept" if self.kept else
                    f"{head} (needs {self.margin:+.1%}); {self.new} held off for "
                    f"{self.cooldown} rounds")
        slo = ""
        if self.slo is not None:
            slo = (f"; {self.throughput:.4g}/s against an SLO of {self.slo:.4g}/s, which "
                   f"{self.old} was predicted to meet ({self.throughput_old:.4g}/s)")
        if self.slo is None and math.isfinite(self.throughput):
            slo = (f"; served {self.throughput:.4g}/s where {self.old} was modelled to "
                   f"serve {self.throughput_old:.4g}/s")
        return (f"{self.new} missed {self.observed:.3f} over {self.intervals} intervals; "
                f"curves predicted {self.predicted_new:.3f} under {self.new}, "
                f"{self.predicted_old:.3f} under {self.old} (margin {self.margin:g}){slo}; "
                f"{self.new} held off for {self.cooldown} rounds")


TRIAL_LIMIT_MOVE = 0.1   # a limit moved by more than this since the reference: not counted
TRIAL_SLACK = 4          # rounds beyond `intervals` (and the skipped first) a trial may take,
                         # and running reports past the first a switch may wait to settle


def start(st, new: str, old: str, reference: tuple[float, float, float] | None = None) -> None:
    """Put a switch from `old` to `new` on probation (replacing any other);
    with `reference` (the old policy's mean miss ratio, mean throughput or
    NaN, and the limit in pages it held), as a trial."""
    st.probation = Probation(new, old, st.rounds)
    if reference is not None:
        pb = st.probation
        pb.trial = True
        pb.ref_miss, pb.ref_throughput, pb.ref_pages = (float(v) for v in reference)


def trial_reference(st, policy: str, limit_bytes: float, usable: int,
                    least: int = 2) -> tuple[float, float, float] | None:
    """What `policy` did before a trial, for the trial to be judged
    against (recent_mean). Kept apart from recent_mean so that switching
    trials off (experiments/ablate_engine.py) leaves predictions alone."""
    return recent_mean(st, policy, limit_bytes, usable, least)


def recent_mean(st, policy: str, limit_bytes: float, usable: int,
                least: int = 2) -> tuple[float, float, float] | None:
    """What `policy` did over the tenant's last reports: (mean miss ratio,
    mean throughput or NaN, limit in pages), from the run of at least
    `least` latest reports in which it ran at this limit (within 1 %),
    among the last `usable` (those past the warm-up); None where there is
    no such run."""
    run = latest_run(st, policy, limit_bytes, usable)
    if len(run) < least:
        return None
    thr = [t for _, t in run]
    mean_thr = math.fsum(thr) / len(thr) if all(math.isfinite(t) and t > 0 for t in thr) \
        else math.nan
    return math.fsum(m for m, _ in run) / len(run), mean_thr, limit_bytes / PAGE_SIZE


def latest_run(st, policy: str, limit_bytes: float, usable: int) -> list[tuple[float, float]]:
    """(miss ratio, throughput) of the tenant's latest reports, newest
    first, among the last `usable`, for as long as they ran `policy` at
    this limit (within 1 %) with a miss ratio in [0, 1]."""
    run = []
    for pol, lim, m, thr, *_ in list(reversed(st.recent_obs))[:max(usable, 0)]:
        if pol != policy or not limit_bytes > 0 or abs(lim / limit_bytes - 1.0) > 0.01 \
                or not 0.0 <= m <= 1.0:
            break
        run.append((m, thr))
    return run


def held_off(st) -> set[str]:
    """Policies the tenant may not be switched to in this round."""
    if not st.held_until:
        return set()
    for p in [p for p, until in st.held_until.items() if st.rounds > until]:
        del st.held_until[p]
    return set(st.held_until)


def held_pages(report, curve, limit_pages: float) -> float:
    """Where to read the curves for one interval: the memory the tenant
    held, in the curves' own units (file cache plus the offset the agent
    shifted them by), when that is less than its limit.  A cache still
    filling -- a limit just raised, a switch that came with more memory --
    misses more than the curve at the limit says of a warm cache, and that
    is no fault of the policy."""
    if report.usage_file_bytes <= 0:
        return limit_pages
    offset = curve.meta.get("anon_offset_pages") if curve.meta else None
    if not isinstance(offset, (int, float)) or not 0 <= offset < float("inf"):
        offset = report.usage_anon_bytes / PAGE_SIZE
    return min(limit_pages, report.usage_file_bytes / PAGE_SIZE + offset)


def curve_at_held(report, limit_pages: float) -> float | None:
    """What the running policy's curve says the tenant missed over the
    report's interval, read at the memory it held (held_pages), to set
    beside the miss ratio it observed; None where the report is no such
    evidence: no curve for the policy it ran, no accesses, a miss ratio
    outside [0, 1], or nowhere finite to read."""
    curve = next((c for c in report.curves if c.policy == report.policy), None)
    if curve is None or not report.accesses_per_s > 0 or not 0.0 <= report.miss_ratio <= 1.0:
        return None
    at = held_pages(report, curve, limit_pages)
    return float(curve.at(at)) if math.isfinite(at) else None


def check(st, report, limit_pages: float, intervals: int, margin: float,
          cooldown: int, slo: float | None = None, model=None,
          keep_gain: float = 0.0) -> Verdict | None:
    """Count this report toward st's probation, if it has one.

    slo: the tenant's minimum throughput, if it has one; model: its
    fitted (a, b) (seconds per operation a + b x miss ratio), which turns
    the old policy's predicted miss ratio into a throughput.  keep_gain:
    the gain a trial must measure to be kept.

    Returns a Verdict (and holds the new policy off for `cooldown` rounds)
    when the probation ends with the new policy worse than the old policy's
    prediction by more than `margin`; None otherwise."""
    pb = st.probation
    if pb is None or report.policy != pb.new:
        return None
    pb.running_reports += 1
    if pb.trial:
        return _check_trial(st, report, limit_pages, intervals, keep_gain, cooldown, model)
    settled = _settled(pb, report)
    curves = {c.policy: c for c in report.curves}
    m = report.miss_ratio
    if pb.new not in curves or pb.old not in curves or not (0.0 <= m <= 1.0) or \
            not settled:
        return None             # nothing to judge this interval by
    at = held_pages(report, curves[pb.new], limit_pages)
    pb.observed.append(float(m))
    pb.predicted_new.append(float(curves[pb.new].at(at)))
    pb.predicted_old.append(min(max(float(curves[pb.old].at(at)), 0.0), 1.0))
    thr = report.throughput
    if slo and model is not None and thr is not None and math.isfinite(thr) and thr >= 0:
        a, b = model
        t_old = a + b * pb.predicted_old[-1]
        if t_old > 0:
            pb.throughput.append(float(thr))
            pb.throughput_old.append(1.0 / t_old)
    if len(pb.observed) < intervals:
        return None
    st.probation = None
    observed, pred_new, pred_old = (math.fsum(v) / len(v) for v in
                                    (pb.observed, pb.predicted_new, pb.predicted_old))
    cost_slo, worse, got = None, observed > pred_old + margin, None
    if len(pb.throughput) == len(pb.observed):
        got = math.fsum(pb.throughput) / len(pb.throughput)
        old = math.fsum(pb.throughput_old) / len(pb.throughput_old)
        if slo and got < slo <= old:
            cost_slo = (slo, got, old)
    if not worse and cost_slo is None:
        return None
    st.held_until[pb.new] = st.rounds + cooldown
    v = Verdict(pb.new, pb.old, len(pb.observed), observed, pred_new, pred_old,
                margin, cooldown)
    if cost_slo is not None:
        v.slo, v.throughput, v.throughput_old = cost_slo
    return v


def settling_pages(policy: str, report) -> float:
    """The pages a switch to `policy` must insert into the report's cache
    before the policy serves its steady state: the caches' worth it was
    measured to need (models/policy_settling.json) times the pages the
    cache holds."""
    return float(report.usage_file_bytes) / PAGE_SIZE * policy_settling.turnovers(policy)


def _settled(pb: Probation, report) -> bool:
    """Whether this running report shows the new policy settled: not the
    first (the interval the switch came in), and after the reports before
    it inserted the caches' worth of pages the new policy was measured to
    need to reach its steady state (models/policy_settling.json: a new
    policy reshapes the cache a page per miss, and some discard what they
    are handed; until then what it misses is partly the old policy's
    doing); past TRIAL_SLACK reports, settled or not.  Counts this
    report's insertions toward the next."""
    pages = settling_pages(pb.new, report)
    done = pb.running_reports > 1 and (pb.inserted >= pages or
                                       pb.running_reports > 1 + TRIAL_SLACK)
    ins = float(report.inserts_per_s) * float(report.interval_s)
    if math.isfinite(ins) and ins > 0:
        pb.inserted += ins
    return done


def _check_trial(st, report, limit_pages: float, intervals: int, keep_gain: float,
                 cooldown: int, model) -> Verdict | None:
    """Count this report toward st's trial; a Verdict once it is decided,
    kept or not.  The curves could not tell the two policies apart, so
    only what ran can: each running report once the new policy has
    settled (_settled; never the first, the switch mid-interval) is set
    beside the old policy's mean outcome over the reports before the
    switch, moved by what the old policy's curve says the limit's move
    since then changes (a move over TRIAL_LIMIT_MOVE does not count).
    The currency is the tenant's throughput where it reports one, else
    its miss ratio through its model.  Kept where the mean gain is at least `keep_gain`;
    otherwise, or with no verdict within TRIAL_SLACK rounds of those
    wanted, undone and the challenger held off like any failed switch."""
    pb = st.probation
    curves = {c.policy: c for c in report.curves}
    m = report.miss_ratio
    counts = _settled(pb, report) and pb.old in curves and 0.0 <= m <= 1.0 and \
        pb.ref_pages > 0 and abs(limit_pages / pb.ref_pages - 1.0) <= TRIAL_LIMIT_MOVE
    if counts:
        old = curves[pb.old]
        moved = float(old.at(limit_pages)) - float(old.at(pb.ref_pages))
        pb.observed.append(float(m))
        pb.predicted_old.append(min(max(pb.ref_miss + moved, 0.0), 1.0))
        pb.predicted_new.append(float(curves[pb.new].at(limit_pages))
                                if pb.new in curves else math.nan)
        thr = report.throughput
        if thr is not None and math.isfinite(thr) and thr >= 0:
            pb.throughput.append(float(thr))
    if len(pb.observed) < intervals and st.rounds - pb.since <= intervals + 1 + TRIAL_SLACK:
        return None
    st.probation = None
    a, b = model if model is not None else (0.0, 0.0)
    n = len(pb.observed)
    observed = math.fsum(pb.observed) / n if n else math.nan
    old_m = math.fsum(pb.predicted_old) / n if n else math.nan
    gain, got, old_thr = -math.inf, math.nan, math.nan
    if n >= intervals:
        if math.isfinite(pb.ref_throughput) and len(pb.throughput) == n:
            # the old policy's throughput moved to each interval's limit by
            # the model: what it served, times t(ref) / t(moved)
            t_ref = a + b * pb.ref_miss
            olds = [pb.ref_throughput * (t_ref / (a + b * x) if a + b * x > 0 and t_ref > 0
                                         else 1.0) for x in pb.predicted_old]
            got, old_thr = math.fsum(pb.throughput) / n, math.fsum(olds) / n
            gain = got / old_thr - 1.0 if old_thr > 0 else -math.inf
        elif a + b * observed > 0:
            gain = (a + b * old_m) / (a + b * observed) - 1.0
    kept = gain >= keep_gain
    if not kept:
        st.held_until[pb.new] = st.rounds + cooldown
    v = Verdict(pb.new, pb.old, n, observed,
                math.fsum(pb.predicted_new) / n if n else math.nan, old_m,
                keep_gain, cooldown, throughput=got, throughput_old=old_thr)
    v.trial, v.kept, v.gain = True, kept, gain
    return v
