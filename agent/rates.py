"""Per-tenant sampling rates: every tenant sampled at about the same
number of accesses a second (config `sampling.samples_per_s`).

A curve's error follows the sampled accesses it rests on, and so does the
agent's CPU (every sampled access runs through one miniature cache per
policy and size).  One rate for all tenants spends both badly: a fast
tenant gets more samples than its curve needs, a slow one too few to tell
its policies apart.  So each tenant's rate is its share of a budget over
its own speed, on a ladder of powers of two so that small changes in speed
never move it, and never so low that the miniature cache at the tenant's
limit shrinks to a handful of pages.

A builder's state is tied to its rate (a miniature cache holds the pages
sampled at that rate), so a new rate means a new builder, whose miniatures
start empty while the tenant's page cache is full.  So rates move seldom:
down after one interval (or within one, when the tenant speeds up by far),
the new builder warmed from a replay of the last intervals; up only after
RETUNE_INTERVALS intervals, the old builder reporting until the new one is
warm.  No report carries a cold curve, nor one that lost what the builder
before it saw.  The rules: RateTuner; the runs behind them:
docs/internals.md#agent-rates.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

RETUNE_FACTOR = 4.0
RETUNE_INTERVALS = 3
HANDOVER_WINDOWS = 2            # the least windows a new builder counts beside the old
MAX_HANDOVER_WINDOWS = 30       # ... and the most, warm or not
WARM_SHARE = 0.9                # of the old builder's distinct pages, when fewer than the limit
REPLAY_INTERVALS = 2            # the least intervals kept for a builder at a lower rate
REPLAY_SAMPLES = 1 << 17        # ... and the most sampled keys kept, if more intervals hold them
# the share of the agent's wall time its curve work (feeding the builders,
# reading the curves) aims at; past twice that, the budget is shed
BUSY_AIM = 0.25
# the least budget, as a share of the configured one: where the agent is
# still busy at 1/64 of its samples, the samples are not what keeps it so
BUDGET_FLOOR = 1 / 64
# the least pages a miniature cache at the tenant's own limit holds: below
# a hundred or so, which pages the hash happened to draw decides its curve
MIN_MINI_PAGES = 128


def ladder(rate: float, lo: float, hi: float) -> float:
    """The power of two at or below `rate`, within [lo, hi]."""
    if not rate > 0:
        return lo
    step = 2.0 ** math.floor(math.log2(min(rate, 1.0)))
    return min(max(step, lo), hi)


@dataclass
class RateTuner:
    """Decides one tenant's sampling rate from how fast it reads.

    A tenant starts at the top rate (Sampling.start_rate), since moving down
    is warm at once and moving up is not; its first interval's speed sets
    the rate at once; later a rate moves only when its tenant's speed has
    asked for one at least RETUNE_FACTOR away.  The two directions differ
    (agent/backends/linux.py does both):

    - down (the tenant got faster): after one interval, since every
      interval at the old rate costs the agent RETUNE_FACTOR times its
      budget or more.  The new builder is fed the tenant's last intervals
      again (Replay: as many as REPLAY_SAMPLES keys hold, at least
      REPLAY_INTERVALS), one window an interval as they came; it keeps the
      keys under its own, lower threshold and starts as warm as that
      history makes it.  A tenant that speeds up by far within an interval
      does not wait for its end: once the samples of the interval under way
      come to RETUNE_FACTOR intervals' budget (`shed`), the agent moves it
      down at the next slice, from what it sampled so far -- the decision
      the interval's end would take, taken sooner;
    - up (the tenant got slower, or, under a fixed starting rate, its first
      interval asked for more): after RETUNE_INTERVALS intervals in a row
      (the first at once).  The keys kept were sampled at the old, lower
      rate, too few for the new one, so the new builder counts beside the
      old, whose curves are reported until the new one is warm (`warm`): it
      has seen as many distinct pages as the tenant's limit holds, or nearly
      as many as the old one has, after HANDOVER_WINDOWS windows at least
      and MAX_HANDOVER_WINDOWS at most."""
    samples_per_s: float
    min_rate: float
    max_rate: float
    measured: bool = False       # the rate has been set from a measured speed
    streak: int = 0              # intervals in a row that asked for a far rate

    def wanted(self, accesses_per_s: float, limit_pages: float | None = None) -> float:
        """The budget's rate at this speed, on the ladder; never so low that
        the miniature at `limit_pages` (the tenant's limit) holds fewer than
        MIN_MINI_PAGES pages, nor outside [min_rate, max_rate]."""
        floor = self.min_rate
        if limit_pages and limit_pages > 0:
            floor = max(floor, 2.0 ** math.ceil(math.log2(MIN_MINI_PAGES / limit_pages)))
        return ladder(self.samples_per_s / accesses_per_s, min(floor, self.max_rate),
                      self.max_rate)

    def shed(self, current: float, sampled: int, accesses: int, elapsed_s: float,
             interval_s: float, limit_pages: float | None = None) -> float | None:
        """The rate to move down to at once, in an interval under way that has
        sampled `sampled` of `accesses` accesses over `elapsed_s`, or None:
        only once its samples come to RETUNE_FACTOR intervals of the budget,
        and only a move RETUNE_FACTOR down or more (what decide() does at the
        interval's end)."""
        if sampled < RETUNE_FACTOR * self.samples_per_s * interval_s or not elapsed_s > 0:
            return None
        want = self.wanted(accesses / elapsed_s, limit_pages)
        if want * RETUNE_FACTOR > current:
            return None
        self.measured, self.streak = True, 0
        return want

    def decide(self, current: float, accesses_per_s: float,
               limit_pages: float | None = None) -> float | None:
        """The rate to move to after an interval at `accesses_per_s`, or
        None to keep `current`.  An idle interval says nothing of speed."""
        if not accesses_per_s > 0 or not math.isfinite(accesses_per_s):
            self.streak = 0
            return None
        want = self.wanted(accesses_per_s, limit_pages)
        if not self.measured:
            self.measured = True
            return want if want != current else None
        if want * RETUNE_FACTOR <= current:
            self.streak = 0
            return want
        self.streak = self.streak + 1 if want >= RETUNE_FACTOR * current else 0
        if self.streak >= RETUNE_INTERVALS:
            self.streak = 0
            return want
        return None


def warm(new_pages: float, old_pages: float, limit_pages: float, windows: int) -> bool:
    """Whether a builder counting beside another may take over, after
    `windows` windows: it has seen `new_pages` distinct pages, the one it
    replaces `old_pages`.  Warm at the limit: its miniature caches at the
    tenant's limit are full, or the tenant has few more pages than it saw."""
    if windows < HANDOVER_WINDOWS:
        return False
    if windows >= MAX_HANDOVER_WINDOWS:
        return True
    return new_pages >= min(limit_pages, WARM_SHARE * old_pages)


class Replay:
    """A tenant's last intervals of sampled batches, as they were fed, for
    a builder at a lower rate to start from: the interval under way and
    those before it, the oldest dropped while they hold more than
    REPLAY_SAMPLES keys, down to REPLAY_INTERVALS intervals."""

    def __init__(self):
        self.intervals: deque = deque([[]])
        self.sizes: deque = deque([0])
        self.total = 0                  # keys held, sum(self.sizes)

    def add(self, batch) -> None:
        """One batch (keys first) of the interval under way."""
        self.intervals[-1].append(batch)
        self.sizes[-1] += len(batch[0])
        self.total += len(batch[0])
        self._trim()

    def next_interval(self) -> None:
        self.intervals.append([])
        self.sizes.append(0)
        self._trim()

    def _trim(self) -> None:
        while len(self.intervals) > REPLAY_INTERVALS and self.total > REPLAY_SAMPLES:
            self.intervals.popleft()
            self.total -= self.sizes.popleft()

    def __len__(self) -> int:
        """Intervals held, the one under way among them if it has a batch."""
        return len(self.intervals) - (0 if self.intervals[-1] else 1)


@dataclass
class SampleBudget:
    """The node's samples a second per tenant: `sampling.samples_per_s`
    while the agent keeps up, less while feeding the curves takes more of
    its time than it has.

    A sample's cost is one access through every policy's miniature caches,
    a few microseconds on a host's CPU and tens of times that under
    emulation, and the CPU the agent gets is what its tenants leave it.
    Its work follows the samples over the wall time an interval covers, so
    an agent that falls behind covers more time the next interval, samples
    more and falls further behind: in the VM (make e2e), run behind four
    busy tenants, its intervals took 100 to 200 s of 10, and its node was
    marked lost again and again.  So the budget follows the share of the
    wall time since the last report that the curve work took (`busy`): past
    twice BUSY_AIM it falls at once by powers of RETUNE_FACTOR until the
    work would be within the aim (each tenant's rate then falls by as much:
    RateTuner), and it rises again by RETUNE_FACTOR only after
    RETUNE_INTERVALS reports in a row with room for that, never above the
    configured figure, nor below BUDGET_FLOOR of it; and a tenant's rate
    never falls so low that its miniature caches at its limit empty
    (RateTuner.wanted)."""
    ceiling: float
    value: float = 0.0
    calm: int = 0                # reports in a row with room to rise

    def __post_init__(self):
        self.value = self.value or self.ceiling

    def after(self, busy_s: float, elapsed_s: float) -> float | None:
        """The new budget after a report whose curve work took `busy_s` of
        `elapsed_s` of wall time, or None to keep it."""
        if not elapsed_s > 0 or not busy_s >= 0:
            return None
        share = busy_s / elapsed_s
        if share > 2 * BUSY_AIM:
            self.calm = 0
            steps = math.ceil(math.log(share / BUSY_AIM, RETUNE_FACTOR))
            floor = self.ceiling * BUDGET_FLOOR
            if self.value <= floor:
                return None
            self.value = max(floor, self.value / RETUNE_FACTOR ** steps)
            return self.value
        if self.value >= self.ceiling or share * RETUNE_FACTOR > BUSY_AIM:
            self.calm = 0
            return None
        self.calm += 1
        if self.calm < RETUNE_INTERVALS:
            return None
        self.calm = 0
        self.value = min(self.ceiling, self.value * RETUNE_FACTOR)
        return self.value
