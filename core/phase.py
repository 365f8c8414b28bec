"""When a tenant's operations changed: the rule the agent and the
controller share.

A tenant's operations per page read are steady while its operations are
the same kind (a 64 KiB read is 16 page reads, a 4 KiB lookup one) and
jump when they change (make e2e's search: passes turned into lookups).
Both sides follow a smoothed value and call a reading more than
PHASE_FACTOR away from it a new phase: the controller starts the tenant's
throughput model again and holds its memory, the agent starts its curves'
counts again.  One rule, so the two never disagree about what a phase is."""
from __future__ import annotations

import math

PHASE_FACTOR = 2.0      # operations per page read: a jump this large is a new phase
PHASE_SMOOTHING = 0.2   # weight of a reading in the smoothed value


def follow(ref: float | None, x: float, factor: float = PHASE_FACTOR) -> tuple[float | None, bool]:
    """(the smoothed value after reading `x`, whether `x` began a new
    phase).  A reading that is not a positive number changes nothing; the
    first reading starts the value and is no change."""
    if not (x > 0 and math.isfinite(x)):
        return ref, False
    if ref is None or not ref / factor <= x <= ref * factor:
        return x, ref is not None
    return math.exp((1 - PHASE_SMOOTHING) * math.log(ref) + PHASE_SMOOTHING * math.log(x)), False
