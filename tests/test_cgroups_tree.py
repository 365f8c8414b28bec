"""cgroup v1 and v2 code paths against file trees laid out like the kernel's,
the safety rules, and where the machine has one, a real cgroup2 memory
hierarchy."""
import os
from pathlib import Path

import pytest

from cachepilot.agent import cgroups
from cachepilot.agent.cgroups import SafetyRules, safe_limit

MiB = 1 << 20


def make_v2(path: Path, *, max_="max", high="max", current=300 * MiB,
            file=200 * MiB, anon=90 * MiB, refaults=17, shmem=0, file_mapped=0) -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text("memory\n")
    (path / "cgroup.procs").write_text("")
    (path / "memory.max").write_text(f"{max_}\n")
    (path / "memory.high").write_text(f"{high}\n")
    (path / "memory.current").write_text(f"{current}\n")
    (path / "memory.stat").write_text(
        f"anon {anon}\nfile {file}\nkernel 1234\nshmem {shmem}\nfile_mapped {file_mapped}\n"
        f"workingset_refault_anon 3\nworkingset_refault_file {refaults}\n"
        "pgfault 99\n")
    return path


def make_v1(path: Path, *, limit=9223372036854771712, usage=300 * MiB,
            cache=1, rss=2, total_cache=200 * MiB, total_rss=80 * MiB,
            refaults=5, pgpgin=1000, extra="") -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text("")
    (path / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (path / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (path / "memory.stat").write_text(
        f"cache {cache}\nrss {rss}\nworkingset_refault_file 1\npgpgin 7\n"
        f"total_cache {total_cache}\ntotal_rss {total_rss}\n"
        f"total_workingset_refault_file {refaults}\ntotal_pgpgin {pgpgin}\n{extra}")
    return path


def test_v2_stats_from_the_kernel_files(tmp_path):
    cg = make_v2(tmp_path / "web", max_=512 * MiB, high="max")
    assert cgroups.version_of(cg) == 2
    s = cgroups.read_stats(cg)
    assert (s.version, s.limit_bytes, s.high_bytes) == (2, 512 * MiB, 0)
    assert (s.usage_bytes, s.file_bytes, s.anon_bytes, s.refaults) == \
        (300 * MiB, 200 * MiB, 90 * MiB, 17)
    assert s.effective_limit_bytes == 512 * MiB
    assert s.nonfile_bytes == 100 * MiB      # usage - file beats anon alone


def test_shared_memory_and_mapped_files_are_not_sampled_cache(tmp_path):
    # v2: 200 MiB of "file" of which 30 MiB shmem and 20 MiB mapped: only
    # 150 MiB is cache the read-path sampler sees
    cg = make_v2(tmp_path / "web", shmem=30 * MiB, file_mapped=20 * MiB)
    s = cgroups.read_stats(cg)
    assert (s.shmem_bytes, s.mapped_file_bytes) == (30 * MiB, 20 * MiB)
    assert s.sampled_cache_bytes == 150 * MiB
    assert s.nonfile_bytes == 150 * MiB
    # v1 names them total_shmem and total_mapped_file
    v1 = make_v1(tmp_path / "v1", extra="total_shmem 10485760\ntotal_mapped_file 5242880\n")
    s1 = cgroups.read_stats(v1)
    assert (s1.shmem_bytes, s1.mapped_file_bytes) == (10 * MiB, 5 * MiB)
    assert s1.nonfile_bytes == 300 * MiB - (200 - 15) * MiB
    # under a limit the mapped pages nobody uses go: without them
    assert s.unmapped_nonfile_bytes == 130 * MiB
    assert s1.unmapped_nonfile_bytes == 300 * MiB - (200 - 10) * MiB


def test_v2_high_below_max_is_the_effective_limit(tmp_path):
    cg = make_v2(tmp_path / "web", max_=512 * MiB, high=256 * MiB)
    assert cgroups.read_stats(cg).effective_limit_bytes == 256 * MiB


def test_v1_uses_hierarchical_totals_and_maps_unlimited_to_zero(tmp_path):
    cg = make_v1(tmp_path / "db")
    assert cgroups.version_of(cg) == 1
    s = cgroups.read_stats(cg)
    assert s.limit_bytes == 0 and s.effective_limit_bytes == 0
    assert (s.file_bytes, s.anon_bytes, s.refaults, s.pgpgin) == \
        (200 * MiB, 80 * MiB, 5, 1000)


def test_write_limit_v2_max_and_high_and_removal(tmp_path):
    cg = make_v2(tmp_path / "web")
    assert cgroups.write_limit(cg, 256 * MiB) == 256 * MiB
    assert (cg / "memory.max").read_text() == str(256 * MiB)
    assert cgroups.write_limit(cg, 128 * MiB, knob="high") == 128 * MiB
    assert (cg / "memory.high").read_text() == str(128 * MiB)
    assert cgroups.read_limit(cg) == 256 * MiB
    assert cgroups.read_limit(cg, knob="high") == 128 * MiB
    assert cgroups.write_limit(cg, 0) == 0
    assert (cg / "memory.max").read_text() == "max"
    assert cgroups.read_limit(cg) == 0
    with pytest.raises(cgroups.CgroupError, match="knob"):
        cgroups.write_limit(cg, MiB, knob="low")


def test_write_limit_v1_and_removal(tmp_path):
    cg = make_v1(tmp_path / "db")
    assert cgroups.write_limit(cg, 64 * MiB) == 64 * MiB
    assert cgroups.limit_file(cg) == cg / "memory.limit_in_bytes"
    assert cgroups.read_limit(cg) == 64 * MiB
    cgroups.write_limit(cg, 0)
    assert (cg / "memory.limit_in_bytes").read_text() == "-1"


def test_not_a_memory_cgroup_and_gone_are_clear_errors(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(cgroups.CgroupError, match="not a memory cgroup"):
        cgroups.version_of(plain)
    v2_no_mem = tmp_path / "nomem"
    v2_no_mem.mkdir()
    (v2_no_mem / "cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(cgroups.CgroupError, match="without the memory controller"):
        cgroups.version_of(v2_no_mem)
    with pytest.raises(cgroups.CgroupGone):
        cgroups.read_stats(tmp_path / "missing")
    cg = make_v2(tmp_path / "web")
    (cg / "memory.stat").write_text("anon 1\n")
    os.remove(cg / "memory.current")
    with pytest.raises(cgroups.CgroupError, match="memory.current is missing"):
        cgroups.read_stats(cg)


def test_expand_globs_relative_to_roots_and_stays_under_them(tmp_path):
    root = tmp_path / "root"
    for name in ("web-1", "web-2", "db"):
        make_v2(root / name)
    outside = make_v2(tmp_path / "elsewhere")
    assert [Path(p).name for p in cgroups.expand(["web-*"], [str(root)])] == ["web-1", "web-2"]
    assert cgroups.expand([str(root / "db")], [str(root)]) == [str(root / "db")]
    assert cgroups.expand([str(outside)], [str(root)]) == []
    assert cgroups.expand(["../elsewhere"], [str(root)]) == []
    os.symlink(outside, root / "sneaky")
    assert cgroups.expand(["sneaky"], [str(root)]) == []
    assert cgroups.is_under(root / "db", [str(root)])
    assert not cgroups.is_under(tmp_path / "rootless", [str(root)])


RULES = SafetyRules(floor_bytes=64 * MiB, anon_margin_bytes=32 * MiB,
                    anon_margin_ratio=0.1, max_step_bytes=256 * MiB)


def test_safety_floor_and_anonymous_memory_win():
    d = safe_limit(16 * MiB, 128 * MiB, 0, RULES)
    assert d.limit == 64 * MiB and d.clamped and "floor" in d.reason
    d = safe_limit(100 * MiB, 128 * MiB, 100 * MiB, RULES)
    assert d.limit == 132 * MiB and "anonymous" in d.reason
    # a large anonymous set gets a proportional margin
    d = safe_limit(1000 * MiB, 1100 * MiB, 1000 * MiB, RULES)
    assert d.limit == 1100 * MiB
    d = safe_limit(80 * MiB, 128 * MiB, 0, RULES, floor_bytes=96 * MiB)
    assert d.limit == 96 * MiB


def test_safety_step_cap_both_ways_and_from_usage_without_a_limit():
    d = safe_limit(100 * MiB, 1024 * MiB, 0, RULES)
    assert d.limit == 768 * MiB and "step" in d.reason
    d = safe_limit(2048 * MiB, 1024 * MiB, 0, RULES)
    assert d.limit == 1280 * MiB
    d = safe_limit(100 * MiB, 0, 0, RULES, usage_bytes=1024 * MiB)
    assert d.limit == 768 * MiB
    d = safe_limit(512 * MiB, 600 * MiB, 0, RULES)
    assert d.limit == 512 * MiB and not d.clamped


def test_safety_oom_guard_outranks_the_step_cap():
    # anonymous memory grew past the current limit: raise to anon + margin
    # even if that is more than one step
    d = safe_limit(100 * MiB, 128 * MiB, 900 * MiB, RULES)
    assert d.limit >= 900 * MiB + 90 * MiB


def test_safety_ceiling_and_page_rounding():
    d = safe_limit(900 * MiB, 800 * MiB, 0, RULES, ceiling_bytes=850 * MiB)
    assert d.limit == 850 * MiB and "ceiling" in d.reason
    d = safe_limit(100 * MiB + 1, 128 * MiB, 0, RULES)
    assert d.limit % 4096 == 0 and d.limit >= 100 * MiB + 1


def test_real_cgroup2_memory_hierarchy(tmp_path):
    from cachepilot.agent.testbed import v2_memory_root
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root = v2_memory_root()
    if root is None:
        pytest.skip("no cgroup2 hierarchy with the memory controller on this machine "
                    "(memory is on cgroup v1 here)")
    parent = root / f"cp_test_{os.getpid()}"
    parent.mkdir()
    try:
        (parent / "cgroup.subtree_control").write_text("+memory")
        child = parent / "web"
        child.mkdir()
        try:
            assert cgroups.version_of(child) == 2
            assert cgroups.cgroup_id(child) == os.stat(child).st_ino
            assert cgroups.write_limit(child, 64 * MiB) == 64 * MiB
            assert cgroups.write_limit(child, 48 * MiB, knob="high") == 48 * MiB
            s = cgroups.read_stats(child)
            assert s.limit_bytes == 64 * MiB and s.effective_limit_bytes == 48 * MiB
            assert cgroups.write_limit(child, 0) == 0
        finally:
            child.rmdir()
    finally:
        parent.rmdir()
