"""The arithmetic of `make chaos` (experiments/chaos.py): what each fault
kind's row counts, and that a fault the system did not recover from by
itself is a restart by hand.  The campaign itself is make chaos."""
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import chaos  # noqa: E402


def fault(kind, rec, lost=0, intervals=5):
    return {"kind": kind, "detail": "", "duration_s": 1.0, "recovery_s": rec,
            "intervals": intervals, "reports_lost": lost}


def test_rows_per_kind_and_totals():
    faults = [fault("agent_kill", 4.0, 2), fault("agent_kill", 6.0, 3),
              fault("agent_kill", 5.0, 1), fault("partition", None, 9),
              fault("sampler_kill", 1.0, None)]
    events = [
        {"kind": "limit", "fault": "agent_kill", "step_violation": False, "below_anon": False},
        {"kind": "limit", "fault": "partition", "step_violation": True, "below_anon": True},
        {"kind": "oom", "fault": "anon_growth", "count": 2},
        {"kind": "limit", "fault": "none", "step_violation": True, "below_anon": False},
        {"kind": "oom", "fault": "none", "count": 1}]
    args = SimpleNamespace(seed=1, interval=1.0, budget=256)
    r = chaos.summarise(faults, events, args, 600.0, {"agent": 3, "controller": 0}, 5e6)
    ak = r["per_kind"]["agent_kill"]
    assert (ak["faults"], ak["recovery_median_s"], ak["recovery_max_s"], ak["reports_lost"]) \
        == (3, 5.0, 6.0, 6)
    p = r["per_kind"]["partition"]
    assert (p["unrecovered"], p["recovery_median_s"], p["step_violations"], p["below_anon"]) \
        == (1, None, 1, 1)
    assert r["per_kind"]["anon_growth"]["oom_kills"] == 2
    assert r["per_kind"]["sampler_kill"]["reports_lost"] == 0     # unknown counts none
    t = r["totals"]
    # events outside any fault count in the totals too
    assert (t["faults"], t["unrecovered"], t["manual_restarts"], t["step_violations"],
            t["below_anon"], t["oom_kills"]) == (5, 1, 1, 2, 1, 3)
    assert r["minutes"] == 10.0 and set(r["per_kind"]) == set(chaos.KINDS)
