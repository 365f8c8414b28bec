"""How long a policy takes to settle after a switch, in caches' worths.

A measured table (models/policy_settling.json, made by
experiments/policy_settling.py) gives, per policy, the pages a cache
inserts after a switch to it before it serves its steady miss ratio, in
units of the cache's size ("turnovers"): median and p90 over synthetic
workloads where the two policies' steady states differ.  A tenant's
settling in intervals is that times its cache's pages over the pages it
inserts an interval.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

from cachepilot.models.minisim_error import table_policies

TABLE = Path(__file__).resolve().with_suffix(".json")
FORMAT_VERSION = 1


def turnovers(policy: str, path=TABLE) -> float:
    """The median turnovers `policy` needs to settle.  A policy the table
    does not have gets the largest median of any: an unmeasured policy is
    assumed the slowest."""
    table = load(path)
    if policy in table:
        return table[policy]
    return max(table.values())


@functools.lru_cache(maxsize=4)
def load(path=TABLE) -> dict[str, float]:
    """{policy: median turnovers} from the table at `path`; ValueError
    naming the file when it is missing or malformed."""
    try:
        rows = table_policies(path, FORMAT_VERSION)
        out = {str(p): float(r["median"]) for p, r in rows.items()}
        if not all(math.isfinite(v) and v >= 0 for v in out.values()):
            raise ValueError("a median that is not a finite number >= 0")
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a usable policy settling table "
                         f"(run experiments/policy_settling.py): {err}") from None
