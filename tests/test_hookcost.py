"""The policy hook-cost measurement (agent/hookcost.py) on this host's real
memory cgroups, with a stand-in actuator: the host has no cache_ext, so
what is shown here is the mechanics -- the read loop runs in the scratch
cgroup, its file's pages are charged there (where the policy under test
would see them), every policy is measured in turn, a refused policy is
reported and not measured, and nothing is left behind.  The costs
themselves, on the cache_ext kernel, are measured in make kernel-test
(tests/test_cache_ext_live.py)."""
import os
import time
from pathlib import Path

import pytest

from cachepilot.agent import cgroups, hookcost
from cachepilot.agent.cache_ext import PolicyError


def memory_root() -> Path:
    found = cgroups.memory_hierarchy()
    if os.geteuid() != 0 or found is None:
        pytest.skip("needs root and a memory cgroup hierarchy")
    root = found[0] / "cachepilot-test-hookcost"
    root.mkdir(exist_ok=True)
    if found[1] == 2:
        (found[0] / "cgroup.subtree_control").write_text("+memory")
    return root


class StandIn:
    """Records what it is asked; refuses "bad"; on each switch notes the
    page cache charged to the cgroup it is switching."""
    default = "linux"

    def __init__(self):
        self.calls, self.charged, self.forgotten = [], [], []
        self.running = "linux"

    def apply(self, cgroup, policy, cgid):
        if policy == "bad":
            raise PolicyError("the kernel refused to load it")
        self.charged.append(cgroups.read_stats(cgroup).file_bytes)
        self.calls.append(policy)
        self.running = policy
        return "ok"

    def forget(self, cgid):
        self.forgotten.append(cgid)


def test_every_policy_is_read_under_in_the_scratch_cgroup_and_nothing_is_left(tmp_path):
    root = memory_root()
    try:
        act = StandIn()
        costs = hookcost.measure(act, root, ["linux", "s3fifo", "bad", "lfu"], tmp_path,
                                 reads=500, rounds=2, miss_reads=300, miss_rounds=1)
        assert set(costs.ns_per_access) == {"s3fifo", "lfu"}
        assert all(v >= 0 for v in costs.ns_per_access.values())
        assert costs.baseline_ns > 0
        assert "refused" in costs.failed["bad"]
        # and per read that misses: each a first read of a page from the
        # disk, which costs the reader more than a cached read does
        assert set(costs.ns_per_miss) == {"s3fifo", "lfu"} and not costs.miss_failed
        assert all(v >= 0 for v in costs.ns_per_miss.values())
        assert costs.miss_baseline_ns > 1.5 * costs.baseline_ns
        # two rounds of: none, s3fifo, lfu; one more for the misses; then
        # back to none
        assert act.calls == ["linux", "s3fifo", "lfu"] * 3 + ["linux"]
        # after the first read loop the file's 1 MiB is charged to the
        # scratch cgroup
        assert max(act.charged[1:]) >= hookcost.FILE_PAGES * 4096
        assert not (root / hookcost.SCRATCH).exists()
        assert not list(tmp_path.iterdir())
        assert len(act.forgotten) == 1
    finally:
        root.rmdir()


def test_the_miss_loop_runs_held_to_its_room_and_the_limit_is_lifted_after(tmp_path,
                                                                           monkeypatch):
    """While the miss loop reads, the scratch cgroup's limit is what the
    child uses besides page cache plus the room, so its reads evict; the
    page cache it holds then stays within the room; after, no limit."""
    root = memory_root()
    seen = []
    real = hookcost.cgroups.write_limit

    def spy(path, limit, knob="max"):
        got = real(path, limit, knob)
        seen.append((limit, got, cgroups.read_stats(path).nonfile_bytes))
        return got
    monkeypatch.setattr(hookcost.cgroups, "write_limit", spy)
    try:
        costs = hookcost.measure(StandIn(), root, ["linux", "s3fifo"], tmp_path, reads=100,
                                 rounds=1, miss_reads=300, miss_rounds=1)
        assert set(costs.ns_per_miss) == {"s3fifo"}
        # per miss loop: held, then lifted (0: no limit)
        assert [lim > 0 for lim, _, _ in seen] == [True, False, True, False]
        for lim, got, nonfile in seen[::2]:
            room = hookcost.MISS_ROOM_PAGES * 4096
            assert got >= lim - 4096 and got - nonfile <= room + (1 << 20)
    finally:
        root.rmdir()


def test_a_miss_loop_that_fails_leaves_the_misses_without_figures(tmp_path, monkeypatch):
    """The hits' figures stand; every policy's miss figure is missing, and
    says why; nothing is left behind."""
    root = memory_root()
    monkeypatch.setattr(hookcost, "_MISS_CHILD", "import sys; sys.exit('no disk here')")
    try:
        costs = hookcost.measure(StandIn(), root, ["linux", "s3fifo", "lfu"], tmp_path,
                                 reads=100, rounds=1, miss_reads=100, miss_rounds=2)
        assert set(costs.ns_per_access) == {"s3fifo", "lfu"}
        assert costs.ns_per_miss == {}
        assert set(costs.miss_failed) == {"s3fifo", "lfu"}
        assert all("no disk here" in why for why in costs.miss_failed.values())
        assert not (root / hookcost.SCRATCH).exists() and not list(tmp_path.iterdir())
        # a child that never says it is ready is stopped, not waited on forever
        monkeypatch.setattr(hookcost, "_MISS_CHILD", "import time; time.sleep(60)")
        t0 = time.monotonic()
        with pytest.raises(hookcost.CalibrationError, match="did not start"):
            hookcost._miss_cost(tmp_path / "x", root, 1, 1, 1, timeout=1.0)
        assert time.monotonic() - t0 < 30
    finally:
        root.rmdir()


def test_the_miss_loop_reads_every_page_at_most_once():
    pages, n = hookcost.MISS_FILE_PAGES, hookcost.MISS_WARM + hookcost.MISS_READS
    assert n <= pages and len({(i * 97) % pages for i in range(n)}) == n
    assert hookcost.MISS_WARM > hookcost.MISS_ROOM_PAGES


def test_a_folder_that_cannot_hold_the_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(hookcost.CalibrationError, match="cannot write"):
        hookcost.measure(StandIn(), tmp_path, ["s3fifo"], blocker / "sub")


def test_nothing_to_measure_when_only_the_kernels_policy_is_built_for():
    assert hookcost.measure(StandIn(), "/nonexistent", ["linux"], "/nonexistent") \
        .ns_per_access == {}


def test_cpu_usage_is_read_from_v2_cpu_stat_and_from_v1_cpuacct(tmp_path):
    v2 = tmp_path / "v2" / "t"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "cpu.stat").write_text("usage_usec 123456\nuser_usec 100000\n")
    assert cgroups.cpu_usage_us(v2) == 123456
    mem = tmp_path / "v1" / "memory" / "t"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("1000\n")
    assert cgroups.cpu_usage_us(mem) is None          # no cpuacct namesake
    acct = tmp_path / "v1" / "cpu,cpuacct" / "t"
    acct.mkdir(parents=True)
    (acct / "cpuacct.usage").write_text("5000000\n")
    assert cgroups.cpu_usage_us(mem) == 5000
    assert cgroups.cpu_usage_us(tmp_path / "gone") is None
