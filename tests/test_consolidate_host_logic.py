"""experiments/consolidate_host.py's bookkeeping, on made-up figures:
what counts as met, the prediction's error, and the issue's checks
(`make consolidate` itself runs real tenants and is not part of make test).
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import consolidate_host as ch  # noqa: E402


def _plan(pred: dict, hosts: dict) -> dict:
    return {"assignment": hosts,
            "predictions": {n: {"predicted_ops": v, "slo_met": None if v is None else True}
                            for n, v in pred.items()}}


def test_summary_leaves_out_the_warm_up_and_counts_met_intervals():
    names = [t[0] for t in ch.TENANTS]
    plan = _plan({n: 100.0 for n in names}, {n: "h1" for n in names})
    series = {n: [1.0, 1.0, 120.0, 80.0, None, 100.0] for n in names}
    series.update({f"limit:{n}": [1, 1, 4, 6, None, 8] for n in names})
    series["disk:h1"] = [5.0] * 6
    rows = {r["name"]: r for r in ch.summary(plan, series, {"kv-a": 90.0}, warm=2)}
    assert set(rows) == set(names)                           # not the limits, nor disks
    kv = rows["kv-a"]
    assert kv["limit_bytes"] == pytest.approx(6.0)           # 4, 6, 8 after warm-up
    assert kv["measured_ops"] == pytest.approx(100.0)       # 120, 80, 100: None left out
    assert kv["met_fraction"] == pytest.approx(2 / 3)       # 80 < 90
    assert kv["error"] == pytest.approx(0.0)
    assert rows["kv-b"]["met_fraction"] is None              # no SLO


def _result(after: dict, pred: dict, tighter_met: float, hosts_after=2) -> dict:
    names = list(after)
    slos = {"a": 10.0}
    plan = _plan(pred, {n: "h1" for n in names})
    series = {n: [after[n]] * 4 for n in names}
    tighter = {n: [after[n] * tighter_met] * 4 for n in names}
    return {"hosts_before": 3, "hosts_after": hosts_after, "plan": plan,
            "tenants": ch.summary(plan, series, slos, 0),
            "tighter": {"tenants": ch.summary(plan, tighter, slos, 0)}}


def test_the_checks_pass_and_fail_on_their_own_figures():
    good = ch.checks(_result({"a": 11.0, "b": 50.0, "c": 100.0},
                             {"a": 11.5, "b": 52.0, "c": 95.0}, tighter_met=0.5))
    assert good["frees_a_host"] and good["promised_slos_met_95pct"]
    assert good["median_error_within_15pct"] and good["every_error_within_30pct"]
    assert good["tighter_misses_an_slo"]
    bad = ch.checks(_result({"a": 9.0, "b": 50.0, "c": 100.0},
                            {"a": 11.5, "b": 80.0, "c": 60.0}, tighter_met=1.2,
                            hosts_after=3))
    assert not any(bad[k] for k in ("frees_a_host", "promised_slos_met_95pct",
                                    "median_error_within_15pct", "every_error_within_30pct",
                                    "tighter_misses_an_slo"))


def test_processes_left_in_a_hosts_cgroup_are_killed_before_it_is_removed():
    """A tenant's process that outlived its exporter stays in its cgroup,
    and the next run made that cgroup again by name around it: the
    teardown kills every member first (real cgroups of this machine)."""
    import os
    import subprocess
    import time
    from cachepilot.agent import cgroups
    found = cgroups.memory_hierarchy()
    if os.geteuid() != 0 or found is None:
        pytest.skip("needs root and a memory cgroup hierarchy")
    base, _ = found
    top = base / f"cachepilot-test-kill-{os.getpid()}"
    inner = top / "h1" / "t1"
    inner.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        (inner / "cgroup.procs").write_text(str(proc.pid))
        assert ch._remove_tree(top) == 1
        assert proc.wait(timeout=5) == -9
        assert not top.exists()
        assert ch._remove_tree(top) == 0            # nothing left to kill
    finally:
        if proc.poll() is None:
            proc.kill()
        for d in (inner, inner.parent, top):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
