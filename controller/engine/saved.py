"""The engine's memory of a tenant as a plain record, and back.

What a restarted controller must not forget about a tenant is what the
reports cannot tell it again: the autopilot's streak, the watchdog's
probation and holds (a policy held off stays held off), the last target
and directive, the tenant's own round count (holds are counted in it),
the curves' calibration (engine/calibrate.py: what a policy that ran
missed is not seen again until it runs again), and the throughput
model's observations (so the model need not be learnt again from the
prior).  A record is JSON-able; the state store keeps one
per tenant (controller/store.py).
"""
from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np

from cachepilot.controller.engine.types import EngineState, Observations, TenantState
from cachepilot.controller.engine.watchdog import Probation

# TenantState fields a record carries as they are
_PLAIN = ("node", "policy", "target_bytes", "limit_bytes", "streak", "streak_policy",
          "streak_misses", "rounds", "held_until", "slo_feasible", "slo_disagree",
          "slo_need_pages", "slo_history", "spread", "recent_targets", "pred_m",
          "pred_policy", "pred_pages", "m_errors", "running", "calib", "calib_since",
          "served", "slo_extra_pages", "slo_safe_pages", "ops_per_access", "phase_since",
          "floors", "trial_done")


def tenant_record(state: EngineState, name: str) -> dict:
    st = state.tenants[name]
    rec = {k: getattr(st, k) for k in _PLAIN if hasattr(st, k)}
    rec["probation"] = asdict(st.probation) if st.probation is not None else None
    obs = state.obs
    if obs is not None and st.slot >= 0:
        n = int(obs.count[st.slot])
        rec["obs_m"] = obs.m[st.slot, :n].tolist()
        rec["obs_y"] = obs.y[st.slot, :n].tolist()
    return rec


def restore(state: EngineState, records: dict[str, dict], rounds: int, window: int) -> None:
    """Fill an EngineState from saved records (unknown keys, from a newer
    or older controller, are ignored); a tenant it knows already is
    replaced by its record."""
    state.round = max(state.round, rounds)
    if state.obs is None:
        state.obs = Observations(window)
    known = {f.name for f in fields(TenantState)}
    for name, rec in records.items():
        st = TenantState()
        for k in _PLAIN:
            if k in rec and k in known:
                setattr(st, k, rec[k])
        st.held_until = {str(p): int(r) for p, r in (rec.get("held_until") or {}).items()}
        pb = rec.get("probation")
        if pb:
            st.probation = Probation(**{k: pb[k] for k in
                                        ("new", "old", "since", "observed", "predicted_new",
                                         "predicted_old", "throughput", "throughput_old",
                                         "trial", "ref_miss", "ref_throughput", "ref_pages",
                                         "running_reports")
                                        if k in pb})
        m = np.asarray(rec.get("obs_m") or [], dtype=np.float64)[-window:]
        y = np.asarray(rec.get("obs_y") or [], dtype=np.float64)[-window:]
        st.slot = _slot(state, name)
        if len(m) and len(m) == len(y):
            state.obs.add_many(st.slot, m, y)
        state.tenants[name] = st


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
