"""What the decision engine keeps between rounds and what one round returns.

A round never changes the state it is given: decide() forks it
(EngineState.fork: the round's tenants copied, everyone else shared) and
works on the fork, so what-if and replay call the same function and throw
the new state away.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields, replace

import numpy as np

from cachepilot.controller.engine.watchdog import Probation
from cachepilot.core.units import size
from cachepilot.protocol.types import Directive


CURVE_HISTORY = 8       # reports' curves kept per tenant (TenantState.recent_curves)
OBS_HISTORY = 4         # reports' outcomes kept per tenant (TenantState.recent_obs)
COST_HISTORY = 30       # reports' costs kept per tenant (TenantState.costs)


@dataclass
class TenantState:
    """One tenant's memory across rounds."""
    node: str = ""
    slot: int = -1                  # this tenant's row in EngineState.obs
    a: float = 0.0                  # fitted seconds per op at m = 0
    b: float = 0.0                  # fitted extra seconds per op per unit m
    fitted: bool = False            # (a, b) from data rather than the prior
    running: str | None = None      # policy the node last reported running
    policy: str | None = None       # policy last directed (on advisory nodes
                                    # a recommendation the node cannot follow)
    target_bytes: int | None = None  # where the allocation wants it
    limit_bytes: int | None = None  # limit last directed (after the step)
    streak: int = 0                 # rounds a switch looked worth it (autopilot.py)
    streak_policy: str | None = None
    streak_misses: int = 0          # rounds since the streak began that it did not
    last_round: int = -1
    rounds: int = 0                 # decision rounds this tenant took part in
    # The watchdog (engine/watchdog.py): the switch it is judging, and the
    # policies held off after a switch back -> the last of `rounds` they are.
    probation: Probation | None = None
    held_until: dict[str, int] = field(default_factory=dict)
    # The SLO's feasibility, debounced (engine/round.py size_slos): the
    # verdict in force, the rounds in a row that disagreed with it, the
    # need it had when last feasible (pages), and each round's own verdict
    # over the last SLO_HISTORY rounds (True: a size met it).
    slo_feasible: bool | None = None
    slo_disagree: int = 0
    slo_need_pages: float | None = None
    slo_history: list[bool] = field(default_factory=list)
    # the floor of the allocation's curve (its miss ratio at its largest
    # size) over the last rounds: one still falling is a cache still
    # warming, whose cold misses say nothing of what memory can do
    # (engine/round.py _hold_warming)
    floors: list[float] = field(default_factory=list)
    # what the SLO's misses have added to its safe size (pages), and the
    # safe size last round, which the next interval judges (_slo_feedback)
    slo_extra_pages: float = 0.0
    slo_safe_pages: float | None = None
    spread: float = 0.0             # relative spread of throughput around the model
    # the tenant's operations per page read, smoothed: a jump of more than
    # PHASE_FACTOR says its operations changed (a phase), and the model's
    # observations of the old ones go (engine/round.py fit_models)
    ops_per_access: float | None = None
    ops_pending: float | None = None    # a jump the next report must repeat (core/phase.py)
    # the page cache it held at its last report (pages): a cache that grew
    # since, with nothing evicted, is still filling (engine/round.py
    # _track_filling)
    usage_pages: float | None = None
    # the tenant round its latest phase began, while its limit is held for
    # it (engine/round.py _hold_new_phase); None when none is held
    phase_since: int | None = None
    # the allocation's targets (pages) of the last rounds, before a shrink
    # is confirmed (engine/round.py _confirm_shrinks)
    recent_targets: list[float] = field(default_factory=list)
    # what the curve said the miss ratio would be at the limit last
    # directed (under that policy), and how far the observed miss ratio
    # came out above such predictions in the last rounds
    pred_m: float | None = None
    pred_policy: str | None = None
    pred_pages: float | None = None
    m_errors: list[float] = field(default_factory=list)
    # log(observed / predicted) throughput of its decisions that took
    # effect, the last T_ERRORS of them (engine/emit.py _observed): how far
    # this tenant's predictions are to be trusted (engine/round.py
    # prediction_sigma)
    t_errors: list[float] = field(default_factory=list)
    # the curves of the last reports (what-if reads their mean: one
    # interval's curve is not the long-run miss ratio of a workload whose
    # period is longer than an interval); not saved -- reports bring them
    recent_curves: deque = field(default_factory=lambda: deque(maxlen=CURVE_HISTORY))
    # what the last reports saw: (policy running, limit in bytes, miss
    # ratio, throughput or NaN), the reference a policy trial is judged
    # against (engine/watchdog.py); saved
    recent_obs: deque = field(default_factory=lambda: deque(maxlen=OBS_HISTORY))
    # what the last COST_HISTORY reports cost: (policy running, limit in
    # bytes, throughput or NaN, disk read bytes/s, CPU seconds/s), what an
    # operation costs the disk and cores where the tenant stands
    # (controller/consolidate.py recent); more reports than recent_obs, as
    # a job whose reads come in a cycle reads in bursts four reports do
    # not average (make consolidate: a loop over a file twice its cache
    # read 0 to 6.6 MB/s by report, a cycle of 12); saved
    costs: deque = field(default_factory=lambda: deque(maxlen=COST_HISTORY))
    # whether a policy trial ran in this phase (one a phase, however it
    # ended); saved
    trial_done: bool = False
    # the most a failed switch's curve promised beyond what the tenant then
    # missed, this phase (engine/round.py _hold_siblings); saved
    overpromise: float = 0.0
    baseline_overpromise: float = 0.0  # ... and a failed return to the baseline's

    def copy(self) -> "TenantState":
        """A copy that shares nothing a round changes.  The round replaces
        its histories (slo_history, floors, recent_targets, m_errors,
        t_errors)
        rather than changing them in place,
        and never changes a report's curves, so those are shared; the
        containers it does change in place are copied
        (tests/test_engine_pure.py holds the round to this).  A round
        copies a thousand tenants: fewer new objects, less of the
        garbage collector's time."""
        new = TenantState.__new__(TenantState)
        d = new.__dict__
        d.update(self.__dict__)
        d["held_until"] = dict(self.held_until) if self.held_until else {}
        d["recent_curves"] = deque(self.recent_curves, maxlen=CURVE_HISTORY)
        d["recent_obs"] = deque(self.recent_obs, maxlen=OBS_HISTORY)
        d["costs"] = deque(self.costs, maxlen=COST_HISTORY)
        if self.probation is not None:
            pb = self.probation
            d["probation"] = replace(pb, **{f.name: list(getattr(pb, f.name))
                                            for f in fields(pb)
                                            if isinstance(getattr(pb, f.name), list)})
        return new


@dataclass
class LogEntry:
    """One decision and its predicted effect.  Its observed effect comes
    later, from a report, as an entry of its own (kind "observed", with
    `observed` and `decided_round` set): an entry, once made, never changes."""
    round: int
    node: str
    tenant: str
    kind: str                       # "policy", "limit", "watchdog", "trial" (one kept),
                                    # "phase" or "observed"
    before: str                     # old policy / limit (bytes, as text)
    after: str
    reason: str
    predicted: float | None = None          # modelled throughput after
    predicted_before: float | None = None   # modelled throughput before
    predicted_gain: float | None = None     # predicted / predicted_before - 1
    observed_before: float | None = None    # throughput reported at decision
    observed: float | None = None
    observed_gain: float | None = None
    decided_round: int | None = None        # for "observed": the decision's round
    # for "watchdog": mean miss ratio each policy's curve predicted at the
    # limit, and the mean observed, over the intervals it judged
    predicted_miss: dict[str, float] | None = None
    observed_miss: float | None = None

    @property
    def message(self) -> str:
        return f"{self.tenant}: {self.kind} {_words(self.before)} -> {_words(self.after)}: " \
            f"{self.reason}"


def _words(text: str) -> str:
    """`before` / `after` for a person: a limit in bytes as MiB or GiB."""
    return " ".join(size(int(w)) if w.isdigit() else w for w in text.split())


@dataclass
class Violation:
    """An SLO the allocation cannot meet."""
    tenant: str
    node: str
    required: float                 # SLO minimum throughput
    predicted: float                # modelled throughput at the target size
    shortfall: float                # required - predicted
    reason: str

    @property
    def slo(self) -> float:
        return self.required


@dataclass
class TenantPlan:
    """How the engine sees one tenant this round (for tables and tests)."""
    tenant: str
    node: str
    policy: str                     # policy directed
    curve_policy: str | None        # curve the allocation read (policy in force)
    target_bytes: int               # where the allocation wants the limit
    limit_bytes: int                # limit directed this round (step-limited)
    predicted_throughput: float | None   # at target_bytes
    slo_need_bytes: dict[str, float]    # least limit meeting the SLO, per policy (inf: none)
    model: tuple[float, float, bool]    # (a, b, fitted)
    running_policy: str = ""            # policy the node reported running


@dataclass
class EngineState:
    """Everything carried across rounds, and nothing else: the store keeps
    all of it (engine/saved.py), so a restarted controller decides as one
    that kept running."""
    round: int = 0
    tenants: dict[str, TenantState] = field(default_factory=dict)
    # tenant -> [LogEntry, reports still to wait] awaiting an observed effect
    pending: dict = field(default_factory=dict)
    obs: "Observations | None" = None

    def fork(self, names) -> "EngineState":
        """The state a round over the tenants `names` may change: those
        tenants' records and pending entries copied, the rest shared."""
        new = EngineState(self.round, dict(self.tenants), dict(self.pending),
                          self.obs.copy() if self.obs is not None else None)
        for n in names:
            st = self.tenants.get(n)
            if st is not None:
                new.tenants[n] = st.copy()
            items = self.pending.get(n)
            if items is not None:      # entries are never changed; their waits are
                new.pending[n] = [[e, w] for e, w in items]
        return new


class Observations:
    """Every tenant's throughput-model observations in one ring-buffer
    matrix (a row per tenant, `window` columns): miss ratio and seconds per
    operation.  The order within a row does not matter to a least-squares
    fit, so adding a round's observations is one vectorised write."""

    def __init__(self, window: int, rows: int = 64):
        self.window = window
        self.m = np.zeros((rows, window))
        self.y = np.zeros((rows, window))
        self.count = np.zeros(rows, dtype=np.int64)
        self.next = np.zeros(rows, dtype=np.int64)
        self.used = 0

    def copy(self) -> "Observations":
        new = Observations.__new__(Observations)
        new.window, new.used = self.window, self.used
        new.m, new.y = self.m.copy(), self.y.copy()
        new.count, new.next = self.count.copy(), self.next.copy()
        return new

    def new_slot(self) -> int:
        if self.used == len(self.count):
            grow = len(self.count)
            self.m = np.vstack((self.m, np.zeros((grow, self.window))))
            self.y = np.vstack((self.y, np.zeros((grow, self.window))))
            self.count = np.concatenate((self.count, np.zeros(grow, dtype=np.int64)))
            self.next = np.concatenate((self.next, np.zeros(grow, dtype=np.int64)))
        self.used += 1
        return self.used - 1

    def add_many(self, slot: int, m: np.ndarray, y: np.ndarray) -> None:
        """Several observations of one tenant (a restored history)."""
        for mi, yi in zip(m[-self.window:].tolist(), y[-self.window:].tolist()):
            self.add(np.array([slot]), np.array([mi]), np.array([yi]))

    def forget(self, slot: int) -> None:
        """Drop a tenant's observations (its operations changed)."""
        self.count[slot] = 0
        self.next[slot] = 0

    def add(self, slots: np.ndarray, m: np.ndarray, y: np.ndarray) -> None:
        col = self.next[slots]
        self.m[slots, col] = m
        self.y[slots, col] = y
        self.next[slots] = (col + 1) % self.window
        self.count[slots] = np.minimum(self.count[slots] + 1, self.window)


@dataclass
class Decision:
    round: int
    directives: dict[str, list[Directive]]     # node -> its tenants' directives
    violations: list[Violation]
    log: list[LogEntry]
    notes: list[str]                           # reports ignored, overcommitted nodes
    state: EngineState
    _plans: object = field(default=None, repr=False, compare=False)
    trace: object = field(default=None, repr=False, compare=False)   # engine/trace.py

    @property
    def plans(self) -> dict[str, TenantPlan]:
        """tenant -> TenantPlan, built on first use."""
        if callable(self._plans):
            self._plans = self._plans()
        return self._plans or {}
