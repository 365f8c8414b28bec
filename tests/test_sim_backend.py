"""The sim backend: emulated tenants under their limits, live policy swaps,
phase changes, curves in the reports, seeds."""
from __future__ import annotations

import numpy as np
import pytest

from cachepilot.sim.backend import SimBackend
from cachepilot.protocol.types import Directive
from cachepilot.controller.config import config_from_dict
from cachepilot.core.errors import UserError

MiB = 1 << 20


def config(tenants, memory="32MiB", seed=5):
    return config_from_dict({
        "control": {"interval_s": 1.0},
        "nodes": [{"name": "n", "memory_bytes": memory, "seed": seed}],
        "tenants": [dict(t, node="n") for t in tenants]}, "sim-test.yaml")


def tenant(name, phases, policy="lru", limit="16MiB", n=8000, **kw):
    return dict({"name": name, "policies": ["lru", "fifo", "mru"], "initial_policy": policy,
                 "initial_limit_bytes": limit,
                 "workload": {"phases": phases, "accesses_per_interval": n,
                              "service": {"t_hit_s": 1e-6, "t_miss_s": 1e-4,
                                          "concurrency": 2}}}, **kw)


def run(backend, k):
    return [backend.collect() for _ in range(k)]


def test_uniform_tenant_misses_in_proportion_to_what_does_not_fit():
    # 4096 of 8192 equally likely pages fit: about half the accesses miss
    # once the cache is warm, under any policy that keeps it full.
    b = SimBackend(config([tenant("u", [{"kind": "uniform", "footprint": "32MiB"}])]), "n")
    rows = run(b, 8)
    (r,) = rows[-1]
    assert r.limit_bytes == 16 * MiB and r.policy == "lru"
    late = np.mean([rows[i][0].miss_ratio for i in range(4, 8)])
    assert 0.45 < late < 0.55
    # Throughput follows the tenant's service model from the observed ratio.
    assert r.throughput == pytest.approx(2 / (1e-6 + r.miss_ratio * 1e-4))
    assert r.usage_file_bytes == 16 * MiB
    # every miss reads a page from the emulated disk, at the service
    # model's rate of operations
    assert r.read_bytes_per_s == pytest.approx(r.throughput * r.miss_ratio * 4096)
    assert r.read_bytes_per_s > 0
    # the cache takes in the pages of the accesses it simulated that
    # missed: what a raised limit fills at (engine/round.py _trajectory)
    n = b.tenants["u"].workload.accesses_per_interval
    assert r.inserts_per_s == pytest.approx(n * r.miss_ratio / r.interval_s)


def test_limit_directive_changes_what_the_tenant_gets():
    b = SimBackend(config([tenant("u", [{"kind": "uniform", "footprint": "32MiB"}])]), "n")
    run(b, 4)
    (res,) = b.apply([Directive("u", 28 * MiB, "lru", "more")])
    assert res.ok and res.applied_limit_bytes == 28 * MiB
    rows = run(b, 6)
    late = np.mean([r[0].miss_ratio for r in rows[3:]])
    assert 0.08 < late < 0.20          # 1 - 28/32 = 0.125
    assert rows[-1][0].limit_bytes == 28 * MiB


def test_live_policy_swap_rescues_a_loop():
    # A cyclic pass over 24 MiB with 16 MiB of cache: LRU misses every
    # access; MRU keeps most of the loop resident.
    b = SimBackend(config([tenant("l", [{"kind": "loop", "footprint": "24MiB"}])]), "n")
    rows = run(b, 4)
    assert rows[-1][0].miss_ratio > 0.99
    (res,) = b.apply([Directive("l", 16 * MiB, "mru", "loop")])
    assert res.ok and res.applied_policy == "mru"
    rows = run(b, 4)
    assert rows[-1][0].policy == "mru" and rows[-1][0].miss_ratio < 0.5
    # The curves saw it too: MRU's curve is below LRU's at the limit.
    curves = {c.policy: c for c in rows[-1][0].curves}
    assert set(curves) == {"lru", "fifo", "mru"}
    assert curves["mru"].at(4096) < curves["lru"].at(4096) - 0.3


def test_phase_changes_at_interval_boundaries():
    phases = [{"kind": "zipf", "skew": 1.2, "footprint": "16MiB", "intervals": 3},
              {"kind": "scan", "footprint": "64MiB"}]
    b = SimBackend(config([tenant("p", phases)]), "n")
    rows = run(b, 6)
    assert [h["phase"] for h in b.tenants["p"].history] == [0, 0, 0, 1, 1, 1]
    # A hot zipf set fits; a scan never hits.
    assert rows[2][0].miss_ratio < 0.2
    assert rows[5][0].miss_ratio == 1.0


def test_refused_and_clamped_directives_are_reported_not_raised():
    t = tenant("c", [{"kind": "uniform", "footprint": "8MiB"}], floor_bytes="4MiB",
               ceiling_bytes="20MiB", policies=["lru", "fifo"])
    b = SimBackend(config([t]), "n")
    low, high, bad, ghost = b.apply([Directive("c", 1 * MiB, "lru"),
                                     Directive("c", 30 * MiB, "lru"),
                                     Directive("c", 8 * MiB, "mru"),
                                     Directive("nobody", 8 * MiB, "lru")])
    assert low.applied_limit_bytes == 4 * MiB and "floor" in low.message
    assert high.applied_limit_bytes == 20 * MiB and "ceiling" in high.message
    assert not bad.ok and bad.applied_policy == "lru" and "not allowed" in bad.message
    assert not ghost.ok
    assert b.current()["c"] == {"limit_bytes": 8 * MiB, "policy": "lru", "phase": -1}


def test_reports_say_the_policy_that_runs_not_the_one_directed():
    # The controller takes the reported policy as the one in force: after a
    # refused swap the sim must go on reporting what it runs.
    t = tenant("c", [{"kind": "uniform", "footprint": "8MiB"}], policies=["lru", "fifo"])
    b = SimBackend(config([t]), "n")
    (res,) = b.apply([Directive("c", 8 * MiB, "mru")])
    assert not res.ok
    assert run(b, 1)[0][0].policy == "lru"
    (res,) = b.apply([Directive("c", 8 * MiB, "fifo")])
    assert res.ok and res.applied_policy == "fifo"
    assert run(b, 1)[0][0].policy == "fifo"
    assert b.tenants["c"].cache.policy == "fifo"          # the cache really swapped


def test_same_seed_same_run_and_different_seed_differs():
    tl = [tenant("z", [{"kind": "zipf", "skew": 0.9, "footprint": "64MiB"}])]
    a = [r[0].miss_ratio for r in run(SimBackend(config(tl, seed=3), "n"), 3)]
    b = [r[0].miss_ratio for r in run(SimBackend(config(tl, seed=3), "n"), 3)]
    c = [r[0].miss_ratio for r in run(SimBackend(config(tl, seed=4), "n"), 3)]
    assert a == b and a != c


def test_info_and_bad_setup():
    b = SimBackend(config([tenant("u", [{"kind": "uniform", "footprint": "8MiB"}])]), "n")
    info = b.info()
    assert info.node_id == "n" and info.memory_bytes == 32 * MiB and info.backend == "sim"
    assert {"lru", "fifo", "mru"} <= set(info.policies)
    # a node spec that names no disk or cores registers them as not known
    assert (info.disk_read_bytes_per_s, info.cores) == (0.0, 0.0)
    with pytest.raises(UserError, match="no node named"):
        SimBackend(config([tenant("u", [{"kind": "uniform"}])]), "other")
    with pytest.raises(UserError, match="needs a `workload`"):
        SimBackend(config([{"name": "w"}]), "n")


def test_trace_phase_replays_the_trace(cloudphysics_txt):
    from cachepilot.models.runtime import Cache
    from cachepilot.models.traces import open_trace
    t = tenant("tr", [{"kind": "trace", "trace": str(cloudphysics_txt)}], n=5000,
               limit="4MiB")
    b = SimBackend(config([t]), "n")
    got = [r[0].miss_ratio for r in run(b, 2)]
    # The same accesses through a cache of the same size, read independently.
    keys = np.concatenate([k for k, _ in open_trace(cloudphysics_txt).chunks_with_tids()])[:10000]
    cache = Cache("lru", 1024)
    want = [cache.access(keys[:5000]) / 5000, cache.access(keys[5000:]) / 5000]
    assert got == want


def test_missing_trace_is_a_clear_error(tmp_path):
    t = tenant("tr", [{"kind": "trace", "trace": str(tmp_path / "absent.txt")}])
    with pytest.raises(UserError, match="absent.txt: no such file"):
        SimBackend(config([t]), "n")


def test_get_scan_knows_the_scan_thread_of_a_get_scan_workload():
    """A get-scan workload registers its scan thread with get_scan, as the
    cache_ext paper's RocksDB does: the emulated kernel policy and its
    curve both keep GET pages over scan pages.  Without the registration
    get_scan would treat the scan as GETs and do no better than lfu."""
    phases = [{"kind": "get-scan", "skew": 0.0, "footprint": "16MiB",
               "scan_fraction": 0.7, "scan_length": "8MiB"}]

    def late_miss(policy, register=True):
        b = SimBackend(config([tenant("kv", phases, policy=policy, limit="12MiB",
                                      policies=["get_scan", "lfu"])]), "n")
        if not register:
            run(b, 1)
            b.tenants["kv"].stream.registered = {}
            b.tenants["kv"].builder.register_threads("get_scan", [])
        rows = run(b, 10)
        return np.mean([r[0].miss_ratio for r in rows[5:]]), rows[-1][0]

    get_scan, report = late_miss("get_scan")
    unregistered, _ = late_miss("get_scan", register=False)
    lfu, _ = late_miss("lfu")
    assert get_scan < unregistered - 0.04 and get_scan < lfu - 0.04
    # the curve says so too: get_scan's curve at the limit is below lfu's
    curves = {c.policy: c for c in report.curves}
    at = 12 * MiB // 4096
    assert curves["get_scan"].at(at) < curves["lfu"].at(at) - 0.03


# -- slo_threads: the throughput counts the threads the rule names ------------

KV = [{"kind": "get-scan", "skew": 0.6, "footprint": "16MiB",
       "scan_fraction": 0.5, "scan_length": "8MiB"}]


def exact_by_interval(keys, tids, counted, pages, n):
    """Per interval of n accesses, (counted threads' miss ratio, every
    access's), from one full lru simulation of the replayed stream."""
    from cachepilot.models.runtime import Cache
    c, out = Cache("lru", pages), []
    for i in range(0, len(keys), n):
        st0 = c.stats
        miss = c.access(keys[i:i + n], tids[i:i + n], counted[i:i + n])
        st1 = c.stats
        out.append(((st1["counted_misses"] - st0["counted_misses"])
                    / (st1["counted_accesses"] - st0["counted_accesses"]), miss / n))
    return out


def test_sim_counts_the_named_threads_as_a_hosts_agent_does():
    b = SimBackend(config([tenant("kv", KV, limit="10MiB", policies=["lru", "fifo"],
                                  slo_threads={"comm": "get"})]), "n")
    rows = run(b, 6)
    t = b.tenants["kv"]
    keys, tids, counted = t.replay(0, 6 * 8000)
    assert counted is not None and 0.4 < counted.mean() < 0.6    # the GETs only
    exact = exact_by_interval(keys, tids, counted, 10 * MiB // 4096, 8000)
    for (r,), (get_m, all_m) in zip(rows, exact):
        assert r.miss_ratio == pytest.approx(get_m, abs=1e-12)
        assert r.throughput == pytest.approx(2 / (1e-6 + get_m * 1e-4))
    # the scan misses far more than the GETs: counting them would be another figure
    assert np.mean([a - g for g, a in exact[2:]]) > 0.1
    # the curves count the GETs too: lru's at the limit reads the GET ratio
    # of the interval it was built on, not every access's
    curves = {c.policy: c for c in rows[-1][0].curves}
    at = 10 * MiB // 4096
    get_m, all_m = exact[-1]
    assert abs(curves["lru"].at(at) - get_m) < abs(curves["lru"].at(at) - all_m) / 3


@pytest.mark.parametrize("rule, kind", [({"comm": "nothing*"}, "get-scan"),
                                        ({"comm": "get"}, "zipf")])
def test_a_rule_that_names_no_thread_counts_every_access(rule, kind):
    phases = KV if kind == "get-scan" else [{"kind": "zipf", "footprint": "16MiB"}]
    b = SimBackend(config([tenant("kv", phases, limit="10MiB", slo_threads=rule)]), "n")
    rows = run(b, 3)
    keys, tids, counted = b.tenants["kv"].replay(0, 3 * 8000)
    assert counted is None
    from cachepilot.models.runtime import Cache
    c = Cache("lru", 10 * MiB // 4096)
    for i, (r,) in enumerate(rows):
        k = slice(i * 8000, (i + 1) * 8000)
        assert r.miss_ratio == c.access(keys[k], None if tids is None else tids[k]) / 8000


def test_warm_miss_ratio_counts_the_marked_accesses():
    from cachepilot.models.runtime import Cache, warm_miss_ratio
    b = SimBackend(config([tenant("kv", KV, slo_threads={"comm": "get"})]), "n")
    keys, tids, counted = b.tenants["kv"].replay(0, 40_000)
    c = Cache("lru", 2048)
    c.access(keys[:20_000], tids[:20_000])
    st0 = c.stats
    c.access(keys[20_000:], tids[20_000:], counted[20_000:])
    st1 = c.stats
    want = (st1["counted_misses"] - st0["counted_misses"]) / \
        (st1["counted_accesses"] - st0["counted_accesses"])
    assert warm_miss_ratio(keys, tids, "lru", 2048, counted) == pytest.approx(want)
    assert warm_miss_ratio(keys, tids, "lru", 2048, counted) < \
        warm_miss_ratio(keys, tids, "lru", 2048) - 0.05
    # a mask that counts nothing falls back to every access
    assert warm_miss_ratio(keys, tids, "lru", 2048, np.zeros(len(keys), bool)) == \
        warm_miss_ratio(keys, tids, "lru", 2048)
