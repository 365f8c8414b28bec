"""experiments/bench_scenarios.py's check (issue 15, item 7): the whole-node
reference run, the intervals no memory could serve, and the shares the
check reads beside those over every interval."""
import sys
from pathlib import Path

import pytest
import yaml

from cachepilot.controller.config import config_from_dict
from cachepilot.run import run_static_equal, run_static_whole

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import bench_scenarios  # noqa: E402

MiB = 1 << 20
SVC = {"t_hit_s": 1.0e-5, "t_miss_s": 1.0e-4, "concurrency": 8}


def _tenant(name: str, kind: str, footprint: str, **phase) -> dict:
    return {"name": name, "node": "n1", "floor_bytes": "2MiB", "policies": ["linux", "mru"],
            "workload": {"accesses_per_interval": 3000, "service": SVC,
                         "phases": [{"kind": kind, "footprint": footprint, **phase}]}}


def _scenario(slo_hot: float) -> dict:
    hot = _tenant("hot", "zipf", "48MiB", skew=1.2)
    hot.update({"slo": {"min_throughput": slo_hot}, "priority": 2})
    return {
        "control": {"interval_s": 1.0, "max_step_fraction": 0.25, "hysteresis": 0.005,
                    "autopilot_k": 2, "warmup_intervals": 2, "anon_margin_bytes": 0},
        "controller": {"listen": "127.0.0.1:0", "insecure": True},
        "nodes": [{"name": "n1", "memory_bytes": "40MiB", "backend": "sim", "seed": 3}],
        "tenants": [hot, _tenant("loop", "loop", "24MiB")]}


def test_the_whole_run_gives_each_tenant_its_node_less_the_others_floors():
    cfg = config_from_dict(_scenario(500_000))
    whole, equal = run_static_whole(cfg, 12), run_static_equal(cfg, 12)
    for name in ("hot", "loop"):
        assert {r["limit_bytes"] for r in whole[name]} == {38 * MiB}
        assert {r["limit_bytes"] for r in equal[name]} == {20 * MiB}
    # the same draws: the loop (24 MiB) fits in 38 MiB and never in 20, and
    # the zipf tenant misses no more with twice the memory
    assert sum(r["throughput"] for r in whole["loop"][4:]) > \
        2 * sum(r["throughput"] for r in equal["loop"][4:])
    assert all(w["miss_ratio"] <= e["miss_ratio"] + 1e-9
               for w, e in zip(whole["hot"], equal["hot"]))


def test_shares_leave_out_only_the_intervals_no_memory_could_serve():
    rows = [{"interval": i, "throughput": t} for i, t in
            enumerate([90, 95, 120, 130, 99, 140, 150, 160], start=1)]
    whole = [{"interval": i, "throughput": t} for i, t in
             enumerate([95, 99, 200, 200, 200, 200, 200, 200], start=1)]
    gone = bench_scenarios.unreachable(whole, 100)
    assert gone == [1, 2]
    # over every interval 5 of 8; without the two out of reach 5 of 6: the
    # miss in interval 5, which the whole node served, still counts
    assert bench_scenarios.met_share(rows, 100, []) == pytest.approx(5 / 8)
    assert bench_scenarios.met_share(rows, 100, gone) == pytest.approx(5 / 6)
    assert bench_scenarios.met_share(rows[:2], 100, gone) == 1.0


def test_a_scenario_reports_both_shares_and_checks_the_reachable_one(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(_scenario(500_000)))
    r = bench_scenarios.run_scenario(path, 24)
    (row,) = r["slos"]
    assert row["tenant"] == "hot" and r["warmup_intervals"] == 2
    # a zipf tenant over 48 MiB starts cold: its first intervals after the
    # warm-up miss the SLO whatever the memory
    assert row["unreachable_intervals"] and row["unreachable_intervals"][0] == 3
    for k in ("equal", "fixed", "autopilot"):
        assert row[f"{k}_reachable"] >= row[k]
    assert row["required"] == (row["equal_reachable"] >= bench_scenarios.TARGET)
    if row["required"]:
        assert row["ok"] == (row["autopilot_reachable"] >= bench_scenarios.TARGET)
    assert r["check_passed"] == (row["ok"] is not False)


def test_set_overrides_a_control_field_and_refuses_a_bad_one(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(_scenario(500_000)))
    plain = bench_scenarios.run_scenario(path, 4)
    r = bench_scenarios.run_scenario(path, 4, control={"warmup_intervals": 1})
    assert plain["warmup_intervals"] == 2 and r["warmup_intervals"] == 1
    for bad in ("no_such_field=1", "autopilot_k=0", "autopilot_k"):
        with pytest.raises(SystemExit) if "=" not in bad else _nothing():
            code = bench_scenarios.main(["--set", bad, "--results", str(tmp_path)])
            assert code == 2
    err = capsys.readouterr().err
    assert "no_such_field" in err and "autopilot_k" in err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_figures_set_the_rounds_figures_for_a_block_and_put_them_back():
    from cachepilot.controller.engine import round as rnd, watchdog
    before, trial = rnd.DOUBT, watchdog.trial_reference
    with bench_scenarios.figures(DOUBT=0.5, **{"watchdog:trial_reference": None}):
        assert rnd.DOUBT == 0.5 and watchdog.trial_reference is None
    assert rnd.DOUBT == before and watchdog.trial_reference is trial
    with pytest.raises(ValueError, match="has no NO_SUCH_FIGURE"):
        bench_scenarios.figures(NO_SUCH_FIGURE=1)


def test_workload_phases_count_the_changes_within_the_run():
    cfg = config_from_dict({
        "nodes": [{"name": "n", "memory_bytes": "64MiB", "backend": "sim"}],
        "tenants": [
            {"name": "a", "node": "n", "workload": {"phases": [
                {"kind": "zipf", "intervals": 10}, {"kind": "loop", "intervals": 30},
                {"kind": "uniform"}]}},
            {"name": "b", "node": "n", "workload": {"phases": [{"kind": "zipf"}]}}]})
    assert bench_scenarios.workload_phases(cfg, 60) == {"a": 2, "b": 0}
    assert bench_scenarios.workload_phases(cfg, 20) == {"a": 1, "b": 0}
