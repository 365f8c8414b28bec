"""The round's mechanisms on the sim, each on a small scenario that fails
without it: what the scenario corpus found (docs/scenarios.md)."""
import yaml

from cachepilot.controller.config import load_config
from cachepilot.run import run_autopilot, run_static_equal

MiB = 1 << 20


def _config(tmp_path, tenants, memory="64MiB", **control):
    cfg = {"control": {"interval_s": 1.0, "max_step_fraction": 0.25, "hysteresis": 0.005,
                       "autopilot_k": 2, "warmup_intervals": 10, "anon_margin_bytes": 0,
                       **control},
           "controller": {"listen": "127.0.0.1:0", "insecure": True},
           "nodes": [{"name": "n", "memory_bytes": memory, "backend": "sim", "seed": 1809}],
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
