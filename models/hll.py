"""How many distinct keys a stream holds, from a HyperLogLog sketch.

SHARDS keeps a sample of the keys; the sketch sees every reference and
answers one question the sample cannot answer well: how many keys there
are.  The sketch's registers are updated by the same C code in the kernel
sampler and in the native core (bpf/include/cachepilot_hll.h: 4096 one-byte
registers, index and rank from a remix of cp_hash64 independent of the
sampling test).  Sketches of the same window merge by taking the larger
register (per-CPU copies, several batches).

The count is Ertl's "improved" estimator (O. Ertl, "New cardinality
estimation algorithms for HyperLogLog sketches", 2017): one formula, no
empirical bias tables, unbiased from a handful of keys up to far beyond the
register count.  Standard error 1.04 / sqrt(4096) = 1.6 %.
"""
from __future__ import annotations

import math

import numpy as np

from cachepilot.models import _mrc
from cachepilot.models.exact import as_keys

BITS = _mrc.HLL_BITS
REGISTERS = _mrc.HLL_REGS
ALPHA_INF = 1.0 / (2.0 * math.log(2.0))


def empty() -> np.ndarray:
    return np.zeros(REGISTERS, dtype=np.uint8)


def as_registers(regs) -> np.ndarray:
    """A sketch from bytes or an array, checked."""
    arr = np.frombuffer(regs, np.uint8) if isinstance(regs, (bytes, bytearray)) \
        else np.asarray(regs)
    if arr.shape != (REGISTERS,):
        raise ValueError(f"a sketch has {REGISTERS} registers, not {arr.size}")
    if arr.size and int(arr.max()) > 65 - BITS:
        raise ValueError(f"sketch register above the largest rank {65 - BITS}")
    return arr.astype(np.uint8, copy=False)


def merge(*sketches) -> np.ndarray:
    """The sketch of the union of the streams."""
    out = empty()
    for s in sketches:
        np.maximum(out, as_registers(s), out=out)
    return out


def add(regs: np.ndarray, keys) -> None:
    """Count keys (uint64 array) into `regs` in place (native)."""
    if regs.dtype != np.uint8 or regs.shape != (REGISTERS,) or not regs.flags.writeable:
        raise ValueError(f"expected a writable uint8 array of {REGISTERS} registers")
    _mrc.hll_add(as_keys(keys), regs)


def _sigma(x: float) -> float:
    # x + sum_k x^(2^k) 2^(k-1); x = share of empty registers
    if x >= 1.0:
        return math.inf
    y, z = 1.0, x
    while True:
        x *= x
        z_next = z + x * y
        y += y
        if z_next == z:
            return z
        z = z_next


def _tau(x: float) -> float:
    # (1 - x - sum_k (1 - x^(2^-k))^2 2^-k) / 3; x = share of registers
    # not at the largest rank
    if x <= 0.0 or x >= 1.0:
        return 0.0
    y, z = 1.0, 1.0 - x
    while True:
        x = math.sqrt(x)
        y *= 0.5
        z_next = z - (1.0 - x) ** 2 * y
        if z_next == z:
            return z / 3.0
        z = z_next


def estimate(regs) -> float:
    """Distinct keys counted into the sketch (0.0 for an empty one)."""
    arr = as_registers(regs)
    m = float(REGISTERS)
    q = 64 - BITS
    counts = np.bincount(arr, minlength=q + 2).astype(np.float64)
    if counts[0] == m:
        return 0.0
    z = m * _tau(1.0 - counts[q + 1] / m)
    for k in range(q, 0, -1):
        z = 0.5 * (z + counts[k])
    z += m * _sigma(counts[0] / m)
    return ALPHA_INF * m * m / z


def count(keys) -> float:
    """Estimated distinct keys of an array (one sketch, then estimate)."""
    regs = empty()
    add(regs, keys)
    return estimate(regs)
