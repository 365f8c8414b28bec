"""Issue 15, item 4: recommend mode.

A whole `cachepilot run` (controller and sim nodes over loopback gRPC) in
recommend mode applies no limit or policy change, and the decision log
holds the directives that would have been sent; `admin set-mode enforce`
mid-run applies them, stepwise (no node's limits move by more than the
step in one interval).
"""
from cachepilot.controller.config import config_from_dict
from cachepilot.run import run_autopilot

MiB = 1 << 20
MEMORY = 32 * MiB
STEP = 0.25


def _config(mode):
    svc = {"t_hit_s": 1.0e-5, "t_miss_s": 1.0e-4, "concurrency": 8}
    tenants = [
        {"name": "hot", "node": "n1", "slo": {"min_throughput": 250000}, "priority": 2,
         "policies": ["linux", "lru", "fifo", "mru"],
         "workload": {"accesses_per_interval": 3000, "service": svc,
                      "phases": [{"kind": "zipf", "skew": 0.9, "footprint": "40MiB"}]}},
        {"name": "scan", "node": "n1", "policies": ["linux", "lru", "fifo", "mru"],
         "workload": {"accesses_per_interval": 3000, "service": svc,
                      "phases": [{"kind": "loop", "footprint": "24MiB"}]}},
        {"name": "cold", "node": "n1", "policies": ["linux", "lru", "fifo"],
         "workload": {"accesses_per_interval": 3000, "service": svc,
                      "phases": [{"kind": "uniform", "footprint": "64MiB"}]}},
    ]
    return config_from_dict({
        "control": {"interval_s": 1.0, "max_step_fraction": STEP, "hysteresis": 0.005,
                    "autopilot_k": 2, "warmup_intervals": 2, "anon_margin_bytes": 0,
                    "mode": mode},
        "controller": {"listen": "127.0.0.1:0", "insecure": True},
        "nodes": [{"name": "n1", "memory_bytes": MEMORY, "backend": "sim", "seed": 5}],
        "tenants": tenants})


def test_recommend_mode_applies_nothing_then_enforce_applies_stepwise():
    cfg = _config("recommend")
    switch = 8
    seen = {}

    def on_interval(i, history, controller):
        if i == switch - 1:
            view = {t.name: t for t in controller.tenants().tenants}
            seen["view"] = view
            seen["metrics"] = controller.metrics.exposition().decode()
            controller.set_mode("", "enforce")
    history, log, controller = run_autopilot(cfg, switch + 8, on_interval=on_interval)

    initial = {t.name: (MEMORY // 3, "linux") for t in cfg.tenants}
    for name, rows in history.items():
        before = [(r["limit_bytes"], r["policy"]) for r in rows[:switch]]
        # recommend mode: every interval runs what the node started with
        assert set(before) == {initial[name]}, (name, before)
    # ... while the log holds what would have been sent, and admin tenants
    # and the metrics show it
    recs = [e for e in log if e.kind == "recommend" and e.round <= switch]
    assert {e.tenant for e in recs} >= {"hot"}
    hot = seen["view"]["hot"]
    assert hot.mode == "recommend" and hot.recommended_limit_bytes > MEMORY // 3
    assert hot.limit_bytes == MEMORY // 3          # what is in force, not the advice
    assert 'cachepilot_recommended_limit_bytes{tenant="hot"}' in seen["metrics"]
    assert any(e.kind == "mode" and "recommend -> enforce" in e.message for e in log)

    # enforce: the limits move, and by no more than the step per interval
    # (growth and shrinkage each, summed over the node's tenants)
    after = {name: [r["limit_bytes"] for r in rows[switch - 1:]]
             for name, rows in history.items()}
    assert after["hot"][-1] > MEMORY // 3
    for k in range(1, len(after["hot"])):
        deltas = [v[k] - v[k - 1] for v in after.values()]
        up, down = sum(d for d in deltas if d > 0), -sum(d for d in deltas if d < 0)
        assert max(up, down) <= STEP * MEMORY + 3 * 4096, (k, up, down)
    # the first directive sent in enforce mode is in force from the
    # interval after it (a report shows the limit it was collected under)
    assert any(v[2] != v[0] for v in after.values())
