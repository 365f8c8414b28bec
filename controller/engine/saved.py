"""The engine's memory of a tenant as a plain record, and back.

A record holds every field of TenantState (but its row number in the
observations matrix, which is the process's own), the tenant's row of
throughput-model observations as it lies in the ring, and its decisions
still waiting for their observed effect: everything a round reads from
one round to the next.  A controller restarted from these records decides
exactly as one that kept running (tests/test_restart_equivalence.py).  A
record is JSON-able; the state store keeps one per tenant
(controller/store.py).
"""
from __future__ import annotations

import base64
from collections import deque
from dataclasses import asdict, fields

import numpy as np
import zstandard

from cachepilot.controller.engine.types import (COST_HISTORY, CURVE_HISTORY, OBS_HISTORY,
                                                EngineState, LogEntry, Observations,
                                                TenantState)
from cachepilot.controller.engine.watchdog import Probation
from cachepilot.models.mrc import MRC

RECORD_VERSION = 2
# fields a record carries in a form of their own, and the one it leaves out
_OWN = ("probation", "recent_curves", "recent_obs", "costs", "held_until", "slot")
PLAIN = tuple(f.name for f in fields(TenantState) if f.name not in _OWN)


def tenant_record(state: EngineState, name: str) -> dict:
    st = state.tenants[name]
    rec = {k: getattr(st, k) for k in PLAIN}
    rec["version"] = RECORD_VERSION
    rec["held_until"] = dict(st.held_until)
    rec["probation"] = asdict(st.probation) if st.probation is not None else None
    rec["recent_curves"] = pack_curves(st.recent_curves)
    rec["recent_obs"] = [list(o) for o in st.recent_obs]
    rec["costs"] = [list(o) for o in st.costs]
    obs = state.obs
    if obs is not None and st.slot >= 0:
        rec["obs"] = {"m": obs.m[st.slot].tolist(), "y": obs.y[st.slot].tolist(),
                      "count": int(obs.count[st.slot]), "next": int(obs.next[st.slot])}
    rec["pending"] = [[asdict(e), int(w)] for e, w in state.pending.get(name, ())]
    return rec


def pack_curves(history) -> dict:
    """The last reports' curves, compact: each curve's policy, method, rate
    and meta in JSON, its points as the exact int64 sizes and float64 miss
    ratios, all zstd-compressed (the sizes grids repeat from report to
    report, so they cost little); a tenant's eight reports of five 50-point
    curves are a few kilobytes rather than sixty of JSON numbers."""
    head, parts = [], []
    for curves in history:
        head.append([[c.policy, c.method, float(c.rate), c.meta or {}, len(c.sizes)]
                     for c in curves])
        for c in curves:
            parts += [np.asarray(c.sizes, dtype=np.int64).tobytes(),
                      np.asarray(c.miss_ratio, dtype=np.float64).tobytes()]
    return {"head": head, "points": base64.b64encode(zstandard.ZstdCompressor(level=3).compress(
        b"".join(parts))).decode() if parts else ""}


def unpack_curves(packed) -> list[list[MRC]]:
    if not packed or not packed.get("head"):
        return []
    raw = zstandard.ZstdDecompressor().decompress(base64.b64decode(packed["points"]))
    out, at = [], 0
    for report in packed["head"]:
        curves = []
        for policy, method, rate, meta, n in report:
            sizes = np.frombuffer(raw, dtype=np.int64, count=n, offset=at).copy()
            at += 8 * n
            miss = np.frombuffer(raw, dtype=np.float64, count=n, offset=at).copy()
            at += 8 * n
            curves.append(MRC.checked(sizes, miss, policy, method, float(rate), meta))
        out.append(curves)
    return out



def restore(state: EngineState, records: dict[str, dict], rounds: int, window: int) -> None:
    """Fill an EngineState from saved records (unknown keys, from a newer
    or older controller, are ignored); a tenant it knows already is
    replaced by its record."""
    state.round = max(state.round, rounds)
    if state.obs is None:
        state.obs = Observations(window)
    for name, rec in records.items():
        st = TenantState()
        for k in PLAIN:
            if k in rec:
                setattr(st, k, rec[k])
        st.held_until = {str(p): int(r) for p, r in (rec.get("held_until") or {}).items()}
        pb = rec.get("probation")
        if pb:
            known = {f.name for f in fields(Probation)}
            st.probation = Probation(**{k: v for k, v in pb.items() if k in known})
        st.recent_curves = deque(unpack_curves(rec.get("recent_curves")),
                                 maxlen=CURVE_HISTORY)
        old = [tuple(o) for o in rec.get("recent_obs") or ()]
        st.recent_obs = deque((o[:4] for o in old), maxlen=OBS_HISTORY)
        # a record saved before the costs were kept apart has them, if
        # any, in its recent_obs (disk reads and CPU fifth and sixth)
        costs = rec.get("costs")
        if costs is None:
            costs = [(o[0], o[1], o[3], o[4], o[5]) for o in old if len(o) >= 6]
        st.costs = deque((tuple(o) for o in costs), maxlen=COST_HISTORY)
        st.slot = _slot(state, name)
        _restore_obs(state.obs, st.slot, rec)
        state.tenants[name] = st
        pending = [[LogEntry(**e), int(w)] for e, w in rec.get("pending") or ()]
        if pending:
            state.pending[name] = pending
        else:
            state.pending.pop(name, None)


def _restore_obs(obs: Observations, slot: int, rec: dict) -> None:
    """The tenant's row as it lay in the ring (the fit sums it in that
    order), or, from an older record, its points in order."""
    row = rec.get("obs")
    if row and len(row["m"]) == obs.window == len(row["y"]):
        obs.m[slot], obs.y[slot] = row["m"], row["y"]
        obs.count[slot], obs.next[slot] = row["count"], row["next"]
        return
    m = np.asarray(rec.get("obs_m") or [], dtype=np.float64)[-obs.window:]
    y = np.asarray(rec.get("obs_y") or [], dtype=np.float64)[-obs.window:]
    if len(m) and len(m) == len(y):
        obs.add_many(slot, m, y)


def _slot(state: EngineState, name: str) -> int:
    """The tenant's row of observations, emptied: its own when the engine
    knows it already (a replica taking back a node it served before), so
    rows do not leak one per adoption; else a new one."""
    old = state.tenants.get(name)
    if old is None or old.slot < 0:
        return state.obs.new_slot()
    obs = state.obs
    obs.m[old.slot], obs.y[old.slot], obs.count[old.slot], obs.next[old.slot] = 0, 0, 0, 0
    return old.slot
