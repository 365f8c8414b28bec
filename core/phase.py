"""When a tenant's operations changed: the rule the agent and the
controller share.

A tenant's operations per page read are steady while its operations are
the same kind (a 64 KiB read is 16 page reads, a 4 KiB lookup one) and
jump when they change (make e2e's search: passes turned into lookups).
Both sides follow a smoothed value and call two readings in a row more
than PHASE_FACTOR away from it, and within that factor of each other, a
new phase: the controller starts the tenant's throughput model again and
holds its memory, the agent starts its curves' counts again.  One reading
alone is not a phase: a cache cut or refilled in one interval reads many
pages for each operation while it does (make consolidate: 0.6 -> 0.04 ->
0.5 operations per page read in three rounds, each time a tenant's
memory moved), and taken as a phase it threw away a model and the curves
that were right.  One rule, so the two never disagree about what a phase
is."""
from __future__ import annotations

import math

PHASE_FACTOR = 2.0      # operations per page read: a jump this large is a new phase
PHASE_SMOOTHING = 0.2   # weight of a reading in the smoothed value


def follow(ref: float | None, x: float, factor: float = PHASE_FACTOR,
           pending: float | None = None) -> tuple[float | None, bool, float | None]:
    """(the smoothed value after reading `x`, whether `x` confirmed a new
    phase, the reading that awaits confirmation).  `pending` is the last
    call's third value: a reading outside the band that the next one must
    repeat.  A reading that is not a positive number changes nothing; the
    first reading starts the value and is no change."""
    if not (x > 0 and math.isfinite(x)):
        return ref, False, pending
    if ref is None:
        return x, False, None
    if ref / factor <= x <= ref * factor:
        return math.exp((1 - PHASE_SMOOTHING) * math.log(ref)
                        + PHASE_SMOOTHING * math.log(x)), False, None
    if pending is not None and pending / factor <= x <= pending * factor:
        return math.sqrt(pending * x), True, None
    return ref, False, x
