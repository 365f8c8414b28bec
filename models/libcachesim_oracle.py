"""libCacheSim (PyPI `libcachesim`) as an independent oracle for our
simulations: one full simulation of one of its algorithms per cache size.

Only tests and experiments use this; libcachesim is in the `test` extra,
not a runtime dependency, so it is imported when first called.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from cachepilot.core.errors import UserError
from cachepilot.models.traces import write_oracle_general


def _module():
    try:
        import libcachesim
    except ImportError as exc:
        raise UserError("libcachesim is not installed (pip install "
                        "'cachepilot[test]'): it is only needed to compare "
                        "against libCacheSim") from exc
    return libcachesim


def miss_ratios(keys, algorithm: str, sizes) -> np.ndarray:
    """libCacheSim's `algorithm` (its class name: "LRU", "S3FIFO", ...)
    replaying `keys`, one unit-size object per key, at each cache size in
    objects: the miss ratio per size."""
    lcs = _module()
    if not hasattr(lcs, algorithm):
        raise UserError(f"libcachesim has no algorithm {algorithm!r}")
    keys = np.asarray(keys, dtype=np.uint64)
    fd, path = tempfile.mkstemp(suffix=".oracleGeneral")
    os.close(fd)
    try:
        write_oracle_general(path, keys, obj_size=1)
        out = []
        for size in sizes:
            reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
            cache = getattr(lcs, algorithm)(cache_size=int(size))
            out.append(cache.process_trace(reader)[0])
        return np.array(out, dtype=np.float64)
    finally:
        os.unlink(path)
