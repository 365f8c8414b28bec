"""Curves that count some threads' reads only (a tenant's `slo_threads`):
the native runtime's counted-access mask, MiniSim's and MRCBuilder's
counted curves against exact simulations of the counted accesses, the
config field on both sides of the wire, and the linux backend's wiring
of the rule into its builders."""
import types

import numpy as np
import pytest

from cachepilot.agent import threads as agent_threads
from cachepilot.agent.backends.linux import LinuxBackend
from cachepilot.agent.config import config_from_dict
from cachepilot.agent.curves import make_builder
from cachepilot.core.errors import UserError
from cachepilot.models import generators as gen
from cachepilot.models import runtime
from cachepilot.models.builder import MIN_MINI_PAGES, MRCBuilder
from cachepilot.protocol.tenant import NodeTenant
from cachepilot.protocol.wire import tenant_from_pb, tenant_to_pb

POLICIES = ["lru", "linux", "s3fifo", "get_scan"]
SCAN = np.array([gen.SCAN_TID], np.uint32)


def get_scan_stream(seed: int, n: int = 400_000, n_keys: int = 20_000,
                    scan_fraction: float = 0.5):
    return gen.GetScan(n_keys, skew=0.8, scan_fraction=scan_fraction,
                       scan_pages=2000, seed=seed).next(n)


def exact_counted(keys, tids, policy: str, sizes, counted) -> np.ndarray:
    """Miss ratio of the counted accesses, by simulating the whole stream
    at every size (get_scan knows its scan thread)."""
    if policy == "get_scan":
        tids = runtime.mark_registered(tids, SCAN)
    out = []
    for s in sizes:
        c = runtime.Cache(policy, int(s))
        c.access(keys, tids, counted)
        st = c.stats
        out.append(st["counted_misses"] / st["counted_accesses"])
    return np.array(out)


# -- the native runtime -------------------------------------------------------

@pytest.mark.parametrize("policy", ["lru", "linux", "s3fifo", "mru"])
def test_counted_stats_are_the_misses_of_the_marked_accesses(policy):
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 300, 5000).astype(np.uint64)
    mask = rng.random(5000) < 0.3
    a, b = runtime.Cache(policy, 64), runtime.Cache(policy, 64)
    a.access(keys, None, mask)
    # the same stream one access at a time: which accesses missed
    missed = np.array([b.access(keys[i:i + 1]) for i in range(len(keys))], bool)
    st = a.stats
    assert st["misses"] == b.stats["misses"]          # the mask moves nothing
    assert st["counted_accesses"] == int(mask.sum())
    assert st["counted_misses"] == int((missed & mask).sum())
    assert 0 < st["counted_misses"] < st["misses"]


def test_without_a_mask_every_access_counts():
    c = runtime.Cache("lru", 2)
    c.access(np.array([1, 2, 1, 3, 4], np.uint64))
    st = c.stats
    assert (st["counted_accesses"], st["counted_misses"]) == (st["accesses"], st["misses"])


def test_a_mask_of_the_wrong_length_is_a_clear_error():
    c = runtime.Cache("lru", 2)
    with pytest.raises(UserError, match="counted must have one entry per key"):
        c.access(np.arange(4, dtype=np.uint64), None, [True, False])
    assert c.stats["accesses"] == 0


# -- MiniSim and MRCBuilder ---------------------------------------------------

@pytest.mark.parametrize("seed,rate,scan_fraction,presampled",
                         [(1, 0.05, 0.5, False), (2, 0.1, 0.3, False),
                          (3, 0.02, 0.7, False), (4, 0.05, 0.5, True)])
def test_counted_curves_follow_the_counted_accesses_exact_miss_ratios(seed, rate,
                                                                     scan_fraction,
                                                                     presampled):
    """Fed the whole stream, or (as the agent feeds it) only the sampled
    keys with the count of all accesses, in batches."""
    keys, tids = get_scan_stream(seed, scan_fraction=scan_fraction)
    sizes = np.array([500, 1000, 2000, 4000, 8000, 16000, 24000])
    gets = tids == gen.GET_TID
    b = MRCBuilder(POLICIES, sizes=sizes, rate=rate, counted=True)
    b.register_threads("get_scan", SCAN)
    b.count_threads([gen.GET_TID])
    if presampled:
        from cachepilot.models.shards import sample_mask_index
        for lo in range(0, len(keys), 50_000):
            k, t = keys[lo:lo + 50_000], tids[lo:lo + 50_000]
            idx = sample_mask_index(k, b.threshold)
            b.feed(k[idx], total_accesses=len(k), tids=t[idx])
    else:
        b.feed(keys, tids=tids)
    curves = {c.policy: c for c in b.snapshot()}
    assert curves["lru"].method == "minisim"
    # where the miniatures hold at least the builder's least (32 pages)
    big = rate * sizes >= MIN_MINI_PAGES
    assert big.sum() >= 4
    for p in POLICIES:
        want = exact_counted(keys, tids, p, sizes, gets)
        err = np.abs(curves[p].miss_ratio - want)[big]
        assert curves[p].meta["counted"] is True
        assert err.max() < 0.07 and err.mean() < 0.04, (p, err.round(3))
    # and they are not the every-access curves: the scan's misses are gone
    every = MRCBuilder(POLICIES, sizes=sizes, rate=rate, counted=True)
    every.register_threads("get_scan", SCAN)
    every.feed(keys, tids=tids)
    for c in every.snapshot():
        assert c.meta["counted"] is False
        assert np.max(np.abs(c.miss_ratio - curves[c.policy].miss_ratio)) > 0.05


def test_counting_shows_get_scans_lead_where_the_gets_feel_it():
    """The reason for counting: every policy reads about alike over all
    reads, while get_scan's lead on the GETs is several times larger."""
    keys, tids = get_scan_stream(5)
    sizes = np.array([16000])
    leads = {}
    for counting in (False, True):
        b = MRCBuilder(["linux", "get_scan"], sizes=sizes, rate=0.05, counted=True)
        b.register_threads("get_scan", SCAN)
        if counting:
            b.count_threads([gen.GET_TID])
        b.feed(keys, tids=tids)
        m = {c.policy: float(c.miss_ratio[0]) for c in b.snapshot()}
        leads[counting] = m["linux"] / m["get_scan"]
    assert leads[True] > 2 * leads[False]


def test_a_rule_that_matches_nothing_counts_every_thread():
    keys, tids = get_scan_stream(4, n=100_000)
    sizes = np.array([1000, 4000])
    a = MRCBuilder(["linux", "lru"], sizes=sizes, rate=0.05, counted=True)
    b = MRCBuilder(["linux", "lru"], sizes=sizes, rate=0.05, counted=True)
    b.count_threads([gen.GET_TID])
    b.count_threads([])
    for x in (a, b):
        x.feed(keys, tids=tids)
    for ca, cb in zip(a.snapshot(), b.snapshot()):
        np.testing.assert_array_equal(ca.miss_ratio, cb.miss_ratio)
        assert cb.meta["counted"] is False


def test_windows_weigh_by_the_counted_accesses_they_hold():
    """A window in which the counted threads read nothing adds no counted
    accesses: the snapshot's curve is the window before's, not 1."""
    keys, tids = get_scan_stream(6, n=200_000)
    sizes = np.array([2000, 8000])
    b = MRCBuilder(["linux"], sizes=sizes, rate=0.05, counted=True)
    b.count_threads([gen.GET_TID])
    b.feed(keys, tids=tids)
    before = b.snapshot()[0].miss_ratio
    b.end_window()
    scan_only = tids == gen.SCAN_TID
    b.feed(keys[scan_only][:1000], tids=tids[scan_only][:1000])
    after = b.snapshot()[0].miss_ratio
    assert np.all(after < 0.95)
    np.testing.assert_allclose(after, before, atol=0.02)


def test_count_threads_needs_a_counting_builder():
    b = MRCBuilder(["lru", "linux"], sizes=[100, 200], rate=0.1)
    assert b.snapshot()[0].method == "shards"       # LRU by SHARDS as before
    with pytest.raises(ValueError, match="counted=True"):
        b.count_threads([1])


# -- config and wire ----------------------------------------------------------

def test_slo_threads_load_travel_and_fail_clearly(tmp_path):
    from cachepilot.controller.config import TenantSpec
    spec = TenantSpec(name="kv", node="n1", slo_threads={"cmdline": "*readrandom*"})
    nt = spec.node_tenant()
    assert nt.slo_threads.cmdline == "*readrandom*"
    back = tenant_from_pb(tenant_to_pb(nt))
    assert back.slo_threads == nt.slo_threads
    cfg = config_from_dict({"roots": [str(tmp_path)], "tenants": [
        {"name": "kv", "cgroup": "kv", "slo_threads": {"comm": "db_bench"}}]})
    assert cfg.tenants[0].slo_threads.comm == "db_bench"
    with pytest.raises(UserError, match=r"tenants\[0\]\.slo_threads.*comm.*cmdline"):
        config_from_dict({"roots": [str(tmp_path)], "tenants": [
            {"name": "kv", "cgroup": "kv", "slo_threads": {}}]})
    with pytest.raises(ValueError, match="at most 15 bytes"):
        NodeTenant(name="kv", cgroup="kv", slo_threads={"comm": "a-very-long-thread-name"})


# -- the linux backend --------------------------------------------------------

def test_the_backend_counts_the_threads_the_rule_matches(tmp_path, monkeypatch, caplog):
    cfg = config_from_dict({"roots": [str(tmp_path)], "memory": "1GiB", "tenants": [
        {"name": "kv", "cgroup": "kv", "policies": ["lru", "linux"],
         "slo_threads": {"comm": "db_bench"}},
        {"name": "web", "cgroup": "web", "policies": ["lru", "linux"]}]})
    b = LinuxBackend(cfg, start_sampler=False)
    kv, web = cfg.tenants
    kv_builder, web_builder = b._builder(kv), b._builder(web)
    assert kv_builder.counted and not web_builder.counted
    seen = {}

    def match(path, rule):
        seen["rule"] = rule
        if found is None:
            raise agent_threads.CgroupError("gone")
        return found
    monkeypatch.setattr(agent_threads, "match", match)

    def watched(builder, spec):
        return types.SimpleNamespace(builder=builder, spec=spec, path=tmp_path / "kv",
                                     tenant=spec.name, counted_tids=None,
                                     builders=lambda: [builder])
    found = [11, 12]
    w = watched(kv_builder, kv)
    with caplog.at_level("INFO", logger="cachepilot.agent"):
        b._simulate_thread_rules(w)
        b._simulate_thread_rules(w)          # no change: said once
    assert seen["rule"] == kv.slo_threads
    assert kv_builder.minisim._counted.tolist() == [11, 12]
    assert [r.getMessage() for r in caplog.records if "curves count" in r.getMessage()] \
        == ["tenant kv: curves count 2 threads' reads"]
    found = None                     # the cgroup went: every thread counts again
    b._simulate_thread_rules(w)
    assert not kv_builder.minisim.counting
    seen.clear()
    b._simulate_thread_rules(watched(web_builder, web))
    assert seen == {}


def test_make_builder_counts_an_lru_only_tenant_in_miniature():
    b = make_builder(["lru"], rate=0.01, max_pages=1 << 16, counted=True)
    assert b.counted and b.mini_policies == ["lru"]


# -- the observed miss ratio of the counted threads ---------------------------

def records(*groups):
    """Sampler records: (tid, op, how many) groups."""
    from cachepilot.models.traces.records import RECORD_DTYPE
    out = []
    for tid, op, n in groups:
        r = np.zeros(n, RECORD_DTYPE)
        r["tid"], r["op"] = tid, op
        r["key"] = np.arange(n)
        out.append(r)
    return np.concatenate(out)


def test_counted_misses_over_the_counted_threads_reads():
    from cachepilot.agent.curves import CountedMisses
    tids = np.array([7, 8], np.uint32)
    # every access sampled: 7 and 8 read 100 and missed 20; 9 read 50, missed 40
    m = CountedMisses()
    m.add(records((7, 0, 60), (8, 0, 40), (7, 1, 15), (8, 1, 5), (9, 0, 50), (9, 1, 40)),
          tids, 1.0, 150)
    assert m.miss_ratio() == pytest.approx(20 / 100)
    # sampled at 1/2 over two ticks: the others' reads scale back to 100 of
    # the cgroup's 400, so the counted threads read 300 and missed 2 x 30
    m = CountedMisses()
    m.add(records((7, 0, 50), (7, 1, 20), (9, 0, 30)), tids, 0.5, 250)
    m.add(records((8, 0, 50), (8, 1, 10), (9, 0, 20), (9, 1, 20)), tids, 0.5, 150)
    assert m.miss_ratio() == pytest.approx(60 / 300)
    # never fewer reads than their own sample scaled back
    m = CountedMisses()
    m.add(records((7, 0, 10), (7, 1, 5), (9, 0, 10)), tids, 0.5, 20)
    assert m.miss_ratio() == pytest.approx(10 / 20)


def test_counted_misses_say_nothing_without_a_read_or_with_records_lost():
    from cachepilot.agent.curves import CountedMisses
    tids = np.array([7], np.uint32)
    m = CountedMisses()
    m.add(None, tids, 0.5, 100)
    m.add(records((9, 0, 10), (9, 1, 10)), tids, 0.5, 100)
    assert m.miss_ratio() is None             # only other threads read
    m.add(records((7, 0, 10)), tids, 0.5, 100, insert_drops=3)
    assert m.miss_ratio() is None             # an insert record of theirs may be gone
