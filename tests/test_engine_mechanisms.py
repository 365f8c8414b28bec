"""The round's mechanisms on the sim, each on a small scenario that fails
without it: what the scenario corpus found (docs/scenarios.md)."""
import numpy as np
import yaml

from cachepilot.controller.config import load_config
from cachepilot.run import run_autopilot, run_static_equal

MiB = 1 << 20


def _config(tmp_path, tenants, memory="64MiB", seed=1809, **control):
    cfg = {"control": {"interval_s": 1.0, "max_step_fraction": 0.25, "hysteresis": 0.005,
                       "autopilot_k": 2, "warmup_intervals": 10, "anon_margin_bytes": 0,
                       **control},
           "controller": {"listen": "127.0.0.1:0", "insecure": True},
           "nodes": [{"name": "n", "memory_bytes": memory, "backend": "sim", "seed": seed}],
           "tenants": tenants}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(path)


def _tenant(name, kind, footprint, accesses, t_hit, t_miss, concurrency, **more):
    return {"name": name, "node": "n", "floor_bytes": "2MiB", "policies": ["linux"],
            "workload": {"accesses_per_interval": accesses,
                         "phases": [{"kind": kind, "footprint": footprint, **more}],
                         "service": {"t_hit_s": t_hit, "t_miss_s": t_miss,
                                     "concurrency": concurrency}}}


def test_a_cache_still_filling_is_not_cut(tmp_path):
    # A 17 MiB loop read 300 pages an interval takes 15 intervals to come
    # round: until then every read misses and its curve says memory is
    # worth nothing to it.  Cut on that curve (as before the filling hold),
    # it lost its memory in the warm-up and never hit again; held while its
    # cache grows with nothing evicted, it keeps its equal share through
    # its first pass and hits from then on.
    cfg = _config(tmp_path, [
        _tenant("loop", "loop", "17MiB", 300, 5e-6, 5e-5, 4),
        _tenant("kv", "zipf", "48MiB", 1500, 5e-6, 5e-4, 2, skew=0.9),
        _tenant("uni", "uniform", "35MiB", 800, 5e-6, 5e-4, 2)])
    intervals = 30
    auto = run_autopilot(cfg, intervals)[0]
    equal = run_static_equal(cfg, intervals)
    share = 64 * MiB // 3
    first_hit = next(i for i, h in enumerate(auto["loop"]) if h["miss_ratio"] < 0.5)
    assert first_hit >= 10, "the loop came round within the warm-up: nothing tested"
    assert all(h["limit_bytes"] >= share for h in auto["loop"][:first_hit + 1])
    late = slice(first_hit + 1, None)
    mean = lambda rows: sum(h["throughput"] for h in rows) / len(rows)   # noqa: E731
    assert mean(auto["loop"][late]) >= 0.9 * mean(equal["loop"][late])


def _scenario_04_node_a(tmp_path):
    # corpus scenario 04's node-a: a tight SLO (uniform, needs ~24 MiB of
    # 64), a loop of 17 MiB and a get-scan whose scans fill its cache a few
    # hundred pages an interval, so it stays "filling" for forty intervals
    slo = dict(_tenant("uni", "uniform", "35MiB", 530, 5e-6, 5e-4, 2),
               slo={"min_throughput": 12000}, priority=2)
    return _config(tmp_path, [
        slo,
        _tenant("loop", "loop", "17MiB", 300, 5e-6, 5e-5, 4),
        _tenant("kv", "get-scan", "40MiB", 500, 2e-5, 1e-3, 16, skew=1.26,
                scan_fraction=0.17, scan_length="2MiB")])


def test_a_slowly_filling_cache_keeps_only_what_it_will_reach(tmp_path):
    # Held at its whole limit while it filled, kv kept 21 MiB it would take
    # forty intervals to use; the SLO's need and headroom came first, and
    # the loop was cut below its pass (0.58x the equal split).  Held at
    # what it reaches within the hold's horizon, kv gives the loop room.
    cfg = _scenario_04_node_a(tmp_path)
    intervals = 60
    auto = run_autopilot(cfg, intervals)[0]
    equal = run_static_equal(cfg, intervals)
    late = slice(20, None)
    mean = lambda rows: sum(h["throughput"] for h in rows) / len(rows)   # noqa: E731
    assert mean(auto["loop"][late]) >= 0.95 * mean(equal["loop"][late])
    assert min(h["limit_bytes"] for h in auto["loop"][15:]) >= 17 * MiB
    met = sum(h["throughput"] >= 12000 for h in auto["uni"][late])
    met_equal = sum(h["throughput"] >= 12000 for h in equal["uni"][late])
    assert met > met_equal


def _after_slo_sizing(monkeypatch, name, pick):
    """A list that gets pick(R, row) for tenant `name` each round, once its
    SLO is sized (after engine/round.py's _slo_feedback)."""
    from cachepilot.controller.engine import round as round_mod
    seen, real = [], round_mod._slo_feedback

    def spy(R, ctl):
        real(R, ctl)
        seen.extend(pick(R, i) for i, (_, spec, _) in enumerate(R.rows) if spec.name == name)
    monkeypatch.setattr(round_mod, "_slo_feedback", spy)
    return seen


def test_an_slo_missed_while_its_cache_fills_does_not_raise_its_size(tmp_path, monkeypatch):
    # uni misses its SLO while its raised limit fills (a uniform tenant's
    # cache grows a few hundred pages an interval): those misses say the
    # cache has not reached its size yet, not that the size is short.
    # Judged as misses, they raised its safe size by half again its need
    # (34 MiB for a need of 24), out of the loop's memory.
    cfg = _scenario_04_node_a(tmp_path)
    seen = _after_slo_sizing(monkeypatch, "uni", lambda R, i: (bool(R.filling[i]),
                                                             R.tstates[i].slo_extra_pages))
    run_autopilot(cfg, 45)
    assert any(f for f, _ in seen), "uni never filled: nothing tested"
    assert max(extra for _, extra in seen) * 4096 <= 2 * MiB


def test_a_policy_that_cannot_settle_before_it_is_judged_is_not_tried(tmp_path):
    # corpus scenario 10's node-b: a 16 MiB loop read 360 pages an
    # interval in an 11 MiB share misses every read under linux, and
    # mru's curve leads, within its doubt.  But mru, handed linux's cache,
    # evicts it first and hits only once the loop has come round on pages
    # it inserted itself (models/policy_settling.json: about two caches'
    # worth of inserts, here some fifteen intervals), long after the
    # watchdog has judged a trial.  Tried anyway (as when a trial's lead
    # counted as far as its window turned the cache over, or in full),
    # it was undone and held off at every seed: a switch and a revert
    # for nothing.
    from conftest import shared_trace
    oltp = dict(_tenant("oltp", "uniform", "1MiB", 300, 5e-6, 5e-4, 16), priority=1)
    oltp["workload"]["phases"] = [{"kind": "trace", "trace": str(shared_trace("OLTP.lis.zst")),
                                   "trace_offset": 436143}]
    uni = dict(_tenant("uni", "uniform", "15MiB", 300, 2e-5, 2e-4, 1), priority=1,
               slo={"min_throughput": 14400})
    loop = dict(_tenant("loop", "loop", "16MiB", 360, 2e-5, 2e-3, 16), priority=0)
    for t in (oltp, uni, loop):
        del t["policies"]                       # every policy allowed
    cfg = _config(tmp_path, [oltp, uni, loop], memory="32MiB", seed=3456)
    history, log, _ = run_autopilot(cfg, 40)
    assert "mru" in {h["policy"] for h in history["loop"]}, "mru never led: nothing tested"
    undone = [e.message for e in log if e.message.startswith("loop: watchdog")]
    assert not undone, undone


def test_a_sampled_curve_is_read_over_its_phase_not_one_window(tmp_path, monkeypatch):
    # At a sampling rate of 0.01 a tenant of 530 reads an interval has
    # five samples a window: read on the last window alone, the size its
    # SLO needs moved by some 19 MiB from one round to the next, and the
    # SLO took a loop's memory on one window's word (corpus scenario 04 at
    # 0.01).  Pooled over the windows of its present phase (and a window
    # that differs from the last by no more than its sampling noise is of
    # the same phase), the need moves by a fraction of that.
    from cachepilot.controller.engine import round as round_mod
    sizing = round_mod._slo_feedback

    def needs_swing(pool):
        cfg = _scenario_04_node_a(tmp_path)
        monkeypatch.setattr(round_mod, "_slo_feedback", sizing)     # one spy at a time
        needs = _after_slo_sizing(monkeypatch, "uni", lambda R, i: float(R.need[i]) * 4096 / MiB)
        monkeypatch.setattr(round_mod, "_pool_phase", pool)
        run_autopilot(cfg, 60, curve_rate=0.01)
        late = [x for x in needs if x < float("inf")][10:]
        assert len(late) >= 15, "the SLO was seldom sized: nothing tested"
        return sum(abs(a - b) for a, b in zip(late, late[1:])) / (len(late) - 1)

    pooled = needs_swing(round_mod._pool_phase)
    one_window = needs_swing(lambda R, hist, ctl: None)
    assert one_window >= 5.0, f"one window's need moved {one_window:.1f} MiB: nothing tested"
    assert pooled <= 0.5 * one_window, (pooled, one_window)


def test_a_lead_the_sampling_could_make_is_not_tried(tmp_path, monkeypatch):
    # corpus scenario 19's node-a at 0.01: a uniform tenant, whose policies
    # all miss alike, beside a loop with an SLO.  Its sampled curves put
    # one challenger or another some 7 % ahead, within the doubt, and a
    # trial of it was made and undone at every seed: a switch and a
    # revert for a lead the sampling made.  A trial may bet on the rest of
    # the doubt, not on the sampling's error (round._doubt).
    from cachepilot.controller.engine import round as round_mod
    loop = dict(_tenant("loop", "loop", "43MiB", 1050, 5e-6, 5e-5, 1), priority=1,
                slo={"min_throughput": 22500},
                policies=["linux", "admit_filter", "get_scan", "lhd", "mru"])
    uni = dict(_tenant("uni", "uniform", "64MiB", 840, 2e-5, 2e-4, 2), priority=1,
               policies=["linux", "lfu", "lhd", "mglru", "s3fifo"])
    doubt = round_mod._doubt

    def no_sampling_part(R, ctl, at, m):
        whole, sampling = doubt(R, ctl, at, m)
        return whole, sampling * 0.0

    def tried(bet_on_sampling):
        cfg = _config(tmp_path, [loop, uni], memory="80MiB", seed=9359)
        monkeypatch.setattr(round_mod, "_doubt", no_sampling_part if bet_on_sampling else doubt)
        history, log, _ = run_autopilot(cfg, 60, curve_rate=0.01)
        return {h["policy"] for h in history["uni"]} - {"linux"}, log

    before, log = tried(True)
    assert before, "no challenger was tried on sampled leads: nothing tested"
    now, log = tried(False)
    assert not now, [e.message for e in log if e.tenant == "uni" and e.kind != "limit"]


SLO_UNI = 23500


def test_an_slo_is_not_sized_past_a_limit_it_was_seen_to_serve_with_room(tmp_path, monkeypatch):
    # corpus scenario 03, its SLO tenant's SLO a little lower: a loop with
    # an SLO, a scan that turns into a get-scan, and an SLO tenant whose
    # uniform reads turn into a zipf over 94 MiB at interval 32.  At its
    # equal share of 32 MiB it serves its SLO with room in every interval.
    # Its new phase's curve then errs by a share of its sizes; read as
    # erring by a miss ratio on a flat zipf tail, the pessimistic size
    # came to 45 MiB, taken from the others for an SLO already served.
    # Capped at a limit every one of its latest reports served it at
    # (with its headroom, round._seen_meeting), it stays at 32 MiB.
    from cachepilot.controller.engine import round as round_mod
    cfg = {"control": {"interval_s": 1.0, "max_step_fraction": 0.25, "hysteresis": 0.005,
                       "autopilot_k": 2, "warmup_intervals": 10, "anon_margin_bytes": 0},
           "controller": {"listen": "127.0.0.1:0", "insecure": True},
           "nodes": [{"name": "n", "memory_bytes": "96MiB", "backend": "sim", "seed": 2950}],
           "tenants": [
               {"name": "loop", "node": "n", "floor_bytes": "2MiB", "priority": 3,
                "slo": {"min_throughput": 1180000},
                "policies": ["linux", "admit_filter", "get_scan", "mru"],
                "workload": {"accesses_per_interval": 501,
                             "phases": [{"kind": "loop", "footprint": "29MiB"}],
                             "service": {"t_hit_s": 1e-5, "t_miss_s": 5e-5,
                                         "concurrency": 16}}},
               {"name": "scan", "node": "n", "floor_bytes": "2MiB", "priority": 1,
                "policies": ["linux", "lfu", "lhd", "mru", "s3fifo"],
                "workload": {"accesses_per_interval": 570,
                             "phases": [{"kind": "scan", "footprint": "133MiB",
                                         "intervals": 35},
                                        {"kind": "get-scan", "footprint": "37MiB",
                                         "skew": 0.69, "scan_fraction": 0.25,
                                         "scan_length": "7MiB"}],
                             "service": {"t_hit_s": 5e-6, "t_miss_s": 1e-4,
                                         "concurrency": 8}}},
               {"name": "uni", "node": "n", "floor_bytes": "2MiB", "priority": 1,
                "slo": {"min_throughput": SLO_UNI},
                "policies": ["linux", "hyperbolic", "mru", "s3fifo"],
                "workload": {"accesses_per_interval": 2667,
                             "phases": [{"kind": "uniform", "footprint": "23MiB",
                                         "intervals": 32},
                                        {"kind": "zipf", "footprint": "94MiB",
                                         "skew": 1.15}],
                             "service": {"t_hit_s": 2e-5, "t_miss_s": 0.002,
                                         "concurrency": 8}}}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    seen = round_mod._seen_meeting

    def uni(capped):
        monkeypatch.setattr(round_mod, "_seen_meeting", seen if capped else
                            lambda R, rows, wanted: np.full(len(rows), np.inf))
        history, _, _ = run_autopilot(load_config(path), 52)
        return history["uni"][40:]
    free, capped = uni(False), uni(True)
    top = lambda rows: max(h["limit_bytes"] for h in rows) / MiB        # noqa: E731
    assert top(free) >= top(capped) + 4, (top(free), top(capped))
    # and the SLO is served as it was
    assert all(h["throughput"] >= SLO_UNI for h in capped)
