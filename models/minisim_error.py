"""How far a miniature simulation's miss ratio is from the full one.

A measured table (models/minisim_error.json, made by
experiments/minisim_error.py) gives, per policy and per sampled cache size
(R x size: the pages the miniature cache holds), the signed error minisim -
full miss ratio: its mean (bias) and standard deviation (sd).  The error is
shaped mostly by that sampled size, so the table is indexed by it alone and
read here by interpolation in log(sampled pages) between its buckets, flat
beyond the ends.  The table is loaded once and cached.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

TABLE = Path(__file__).resolve().with_suffix(".json")
FORMAT_VERSION = 1


def error_sd(policy: str, sampled_pages, path=TABLE) -> np.ndarray:
    """sd of `policy`'s minisim error at `sampled_pages` (scalar or array).
    A policy the table does not have gets the largest sd of any policy at
    that size: an unmeasured policy is trusted least."""
    table = load(path)
    if policy in table:
        return _interp(table[policy], "sd", sampled_pages)
    return np.asarray(np.max([_interp(rows, "sd", sampled_pages)
                              for rows in table.values()], axis=0))


def bias(policy: str, sampled_pages, path=TABLE) -> np.ndarray:
    """Mean of `policy`'s minisim error (minisim - full) at `sampled_pages`.
    A policy the table does not have gets 0: the sign of its bias is
    unknown, so none is corrected (its doubt is in error_sd's worst sd)."""
    table = load(path)
    if policy in table:
        return _interp(table[policy], "bias", sampled_pages)
    return np.zeros_like(np.asarray(sampled_pages, dtype=np.float64))


def _interp(rows: dict, field: str, sampled_pages) -> np.ndarray:
    x = np.log(np.maximum(np.asarray(sampled_pages, dtype=np.float64), 1e-300))
    return np.asarray(np.interp(x, rows["log_pages"], rows[field]), dtype=np.float64)


@functools.lru_cache(maxsize=4)
def load(path=TABLE) -> dict:
    """{policy: {"log_pages", "bias", "sd", "n": arrays}} from the table at
    `path`; ValueError naming the file when it is missing or malformed."""
    try:
        return {str(p): _rows(p, rows) for p, rows in table_policies(path, FORMAT_VERSION).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a usable minisim error table "
                         f"(run experiments/minisim_error.py): {err}") from None


def table_policies(path, version: int) -> dict:
    """The non-empty "policies" mapping of a measured per-policy table
    (this one, models/policy_settling.json) written in format `version`;
    ValueError (or OSError, KeyError) where it is not one."""
    doc = json.loads(Path(path).read_text())
    if doc.get("version") != version:
        raise ValueError(f"format version {doc.get('version')!r}, expected {version}")
    policies = doc["policies"]
    if not isinstance(policies, dict) or not policies:
        raise ValueError("no policies")
    return policies


def _rows(policy, rows) -> dict:
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{policy}: no rows")
    pages = [float(r["sampled_pages"]) for r in rows]
    sd = [float(r["sd"]) for r in rows]
    mean = [float(r["bias"]) for r in rows]
    n = [int(r["n"]) for r in rows]
    if any(p <= 0 for p in pages) or any(b <= a for a, b in zip(pages, pages[1:])):
        raise ValueError(f"{policy}: sampled_pages must be positive and increasing")
    if not all(math.isfinite(v) for v in sd + mean) or min(sd) < 0 or min(n) < 1:
        raise ValueError(f"{policy}: sd, bias and n must be finite, sd >= 0, n >= 1")
    return {"log_pages": np.log(pages), "sd": np.array(sd), "bias": np.array(mean),
            "n": np.array(n)}
