"""Sizes and rates as a person reads them: MiB or GiB, ops/s.  Every
command's text output uses these; JSON outputs keep bytes and plain
numbers."""
from __future__ import annotations

import math

MIB, GIB = 1 << 20, 1 << 30


def size(n) -> str:
    """Bytes as "48.0 MiB", or "12.50 GiB" from 10 GiB up; "-" for none."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "-"
    return f"{n / GIB:.2f} GiB" if abs(n) >= 10 * GIB else f"{n / MIB:.1f} MiB"


def rate(v) -> str:
    """Operations per second: "12,345 ops/s", "3.2 ops/s"; "-" for none."""
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:,.0f} ops/s" if abs(v) >= 100 else f"{v:.3g} ops/s"
