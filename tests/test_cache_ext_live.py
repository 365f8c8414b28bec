"""The agent drives cache_ext on a live kernel: its directives attach, swap
and detach policies on cgroup v2 tenants, a policy outlives a killed agent,
refusals change nothing, and a cgroup deleted under its policy is let go.

Needs the cache_ext kernel (kernel/), cgroup v2 with the memory controller,
root, bpf/out/policyctl and the kernel build's cxtest.  `make kernel-test`
runs this file in the VM from the host's userland (kernel/tests/
agent-in-vm.sh); elsewhere it skips and says why.

Residency is read the way kernel/tests/run-tests.sh reads it: a tenant
whose limit is a quarter of a file reads it front to back a page at a time
(readahead off); mincore then gives the resident percent of the first
eighth (H), the last eighth (T) and all (A).  MRU keeps the oldest pages
(H high, T low); FIFO and the kernel's own LRU keep the newest.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachepilot.agent import hookcost
from cachepilot.agent.backends.linux import LinuxBackend, kernel_has_cache_ext
from cachepilot.agent.cache_ext import (POLICY_DIR, POLICYCTL, PolicyActuator,
                                        PolicyError, running_policy)
from cachepilot.agent.cgroups import cgroup_id
from cachepilot.agent.config import config_from_dict
from cachepilot.protocol.types import Directive

from test_cache_ext_agent import dump_tids

REPO = Path(__file__).resolve().parents[1]
CXTEST = REPO / "kernel" / "out" / "tests" / "cxtest"
TEST_POLICY_DIR = REPO / "bpf" / "out" / "test-policies"
CG = Path("/sys/fs/cgroup")
ROOT = CG / "cachepilot-live"
OUTSIDE = CG / "cachepilot-outside"
PINS = Path("/sys/fs/bpf/cachepilot-live")
DATA = Path(os.environ.get("CACHEPILOT_VM_DATA", "/tmp"))
MiB = 1 << 20
LIMIT = 8 * MiB
FILE_MIB = 32
HIGH, LOW = 60, 30


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not kernel_has_cache_ext():
        return "needs the cache_ext kernel (make kernel-test runs this in the VM)"
    try:
        if "memory" not in (CG / "cgroup.controllers").read_text().split():
            return "needs cgroup v2 with the memory controller at /sys/fs/cgroup"
    except OSError:
        return "needs cgroup v2 at /sys/fs/cgroup"
    for p in (POLICYCTL, CXTEST):
        if not p.exists():
            return f"{p} is not built"
    return None


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def cx(*args) -> str:
    return subprocess.run([str(CXTEST), *map(str, args)], check=True,
                          capture_output=True, text=True).stdout


def cache_ext(cgroup: Path) -> dict[str, str]:
    out = {}
    for line in (cgroup / "memory.cache_ext").read_text().splitlines():
        k, _, v = line.partition(" ")
        out[k] = v
    return out


def residency_after_a_pass(cgroup: Path, path: Path) -> tuple[int, int, int]:
    """Drop the file's pages, read it once inside the cgroup, return H T A."""
    cx("dontneed", path)
    cx("read", path, cgroup)
    h, t, a = (int(x) for x in cx("res", path).split())
    return h, t, a


def make_cgroup(path: Path, limit: int = LIMIT):
    path.mkdir(exist_ok=True)
    (path / "memory.max").write_text(str(limit))


@pytest.fixture(scope="module")
def env():
    (CG / "cgroup.subtree_control").write_text("+memory")
    ROOT.mkdir(exist_ok=True)
    (ROOT / "cgroup.subtree_control").write_text("+memory")
    for name in "abc":
        make_cgroup(ROOT / name)
    make_cgroup(OUTSIDE)
    f = DATA / "live-f1"
    if not f.exists():
        cx("mkfile", f, FILE_MIB)
    yield f
    for cg in [ROOT / n for n in "abc"] + [OUTSIDE]:
        if cg.exists() and running_policy(cg, "linux") != "linux":
            subprocess.run([str(POLICYCTL), "--pin-root", str(PINS), "detach", str(cg)],
                           capture_output=True)


def config(policy_dir: Path = POLICY_DIR) -> dict:
    return {"node_id": "vm", "roots": [str(ROOT)],
            "tenants": [{"name": n, "cgroup": n} for n in "abc"],
            "memory": "64MiB", "interval_s": 1,
            "safety": {"floor": "4MiB", "anon_margin": "1MiB", "max_step": "64MiB"},
            "cache_ext": {"policy_dir": str(policy_dir), "pin_root": str(PINS),
                          "calibrate_dir": None}}


def backend(policy_dir: Path = POLICY_DIR) -> LinuxBackend:
    return LinuxBackend(config_from_dict(config(policy_dir)), start_sampler=False)


def apply(b: LinuxBackend, tenant: str, policy: str, limit: int = LIMIT):
    (res,) = b.apply([Directive(tenant, limit, policy)])
    return res


def pass_under(cg: Path, env, policy: str):
    """Check memory.cache_ext names `policy` ("none": the kernel's own),
    then (H, T) after a pass."""
    assert cache_ext(cg)["policy"] == policy
    h, t, _ = residency_after_a_pass(cg, env)
    print(f"under {policy}: H={h} T={t}")
    return h, t


def test_directives_attach_swap_and_detach(env):
    a = ROOT / "a"
    b = backend()
    h, t, _ = residency_after_a_pass(a, env)
    assert t >= HIGH and h <= LOW, f"kernel default: H={h} T={t}"

    res = apply(b, "a", "mru")
    print(f"mru: {res.policy_message}")
    assert res.ok and res.policy_ok and res.applied_policy == "mru"
    h, t = pass_under(a, env, "mru")
    assert h >= HIGH and t <= LOW

    res = apply(b, "a", "fifo")
    assert res.policy_ok and "swapped live" in res.policy_message, res
    h, t = pass_under(a, env, "fifo")
    assert t >= HIGH and h <= LOW

    res = apply(b, "a", "linux")
    assert res.policy_ok and "detached" in res.policy_message, res
    assert {r.tenant: r.policy for r in b.collect()}["a"] == "linux"
    h, t = pass_under(a, env, "none")
    assert t >= HIGH and h <= LOW
    assert not (PINS / str(cgroup_id(a))).exists()


AGENT = """
import json, sys, time
from cachepilot.agent.backends.linux import LinuxBackend
from cachepilot.agent.cgroups import cgroup_id
from cachepilot.agent.config import config_from_dict
from cachepilot.protocol.types import Directive
b = LinuxBackend(config_from_dict(json.loads(sys.argv[1])), start_sampler=False)
(r,) = b.apply([Directive("b", int(sys.argv[2]), "mru")])
print(r.policy_ok, r.applied_policy, r.applied_limit_bytes, flush=True)
time.sleep(3600)
"""


def test_a_policy_survives_its_agent(env, caplog):
    cg = ROOT / "b"
    limit = 12 * MiB
    agent = subprocess.Popen([sys.executable, "-c", AGENT, json.dumps(config()), str(limit)],
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = agent.stdout.readline().split()
        assert line == ["True", "mru", str(limit)], line
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    assert cache_ext(cg)["policy"] == "mru"          # the pinned link holds it
    assert int((cg / "memory.max").read_text()) == limit
    h, t, _ = residency_after_a_pass(cg, env)
    assert h >= HIGH and t <= LOW                   # and it still runs

    caplog.set_level("INFO")
    b = backend()                                   # the restarted agent
    assert any("adopted" in r.getMessage() and "mru runs" in r.getMessage()
               for r in caplog.records)
    assert {r.tenant: r.policy for r in b.collect()}["b"] == "mru"
    res = apply(b, "b", "fifo", limit)
    assert res.policy_ok and "swapped live" in res.policy_message
    assert cache_ext(cg)["policy"] == "fifo"
    assert apply(b, "b", "linux", limit).policy_ok
    assert cache_ext(cg)["policy"] == "none"


def test_refusals_change_nothing(env):
    a = ROOT / "a"
    b = backend()
    assert apply(b, "a", "mru").policy_ok

    # a policy the verifier refuses (bad_oob writes past the eviction context)
    t = backend(TEST_POLICY_DIR)
    res = apply(t, "a", "bad_oob")
    print(f"bad_oob: {res.policy_message}")
    assert not res.policy_ok and res.ok
    assert "refused" in res.policy_message and "\n" not in res.policy_message
    assert "verifier: cache_ext: write outside the candidates" in res.policy_message
    assert res.applied_policy == "mru" and cache_ext(a)["policy"] == "mru"

    # a policy named by a path outside the policy directory
    res = apply(b, "a", "../test-policies/noop")
    print(f"path: {res.policy_message}")
    assert not res.policy_ok and "not a policy name" in res.policy_message
    assert "\n" not in res.policy_message and cache_ext(a)["policy"] == "mru"

    # a cgroup outside the configured roots
    act = PolicyActuator([str(ROOT)], "linux", pin_root=PINS)
    with pytest.raises(PolicyError) as err:
        act.apply(str(OUTSIDE), "mru", cgroup_id(OUTSIDE))
    print(f"outside: {err.value}")
    assert "outside the configured roots" in str(err.value)
    assert "\n" not in str(err.value)
    assert cache_ext(OUTSIDE)["policy"] == "none"

    assert apply(b, "a", "linux").policy_ok


def test_a_cgroup_deleted_under_its_policy(env, caplog):
    c = ROOT / "c"
    cgid = cgroup_id(c)
    b = backend()
    assert apply(b, "c", "mru").policy_ok
    cx("read", env, c)                      # its pages, charged to c
    assert int(cache_ext(c)["tracked"]) > 0
    c.rmdir()                               # cxtest's reader has exited
    caplog.set_level("INFO")
    reports = b.collect()
    assert "c" not in {r.tenant for r in reports}
    said = [r.getMessage() for r in caplog.records if "pins removed" in r.getMessage()]
    assert len(said) == 1, said
    assert not (PINS / str(cgid)).exists()
    deadline = time.monotonic() + 20
    while int(cache_ext(ROOT / "a")["nodes_all_cgroups"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert int(cache_ext(ROOT / "a")["nodes_all_cgroups"]) == 0
    b.collect()                             # carries on, says nothing more
    assert len([r for r in caplog.records if "pins removed" in r.getMessage()]) == 1
    make_cgroup(c)


def test_thread_rules_fill_the_running_policys_tid_map(env, tmp_path, caplog):
    """get_scan's scan threads named by a rule: the attach carries the
    matching threads, and every interval the map follows them."""
    cg = ROOT / "a"
    scanner = tmp_path / "cpscanner"            # its comm is "cpscanner"
    scanner.symlink_to("/bin/sleep")

    def start():
        p = subprocess.Popen([str(scanner), "300"])
        (cg / "cgroup.procs").write_text(str(p.pid))
        return p

    cfg = config()
    cfg["tenants"][0]["policy_threads"] = {"get_scan": {"scan_threads": {"comm": "cpscan*"}}}
    b = LinuxBackend(config_from_dict(cfg), start_sampler=False)
    first = start()
    second = None
    try:
        res = apply(b, "a", "get_scan")
        assert res.policy_ok, res.policy_message
        pin = PINS / str(cgroup_id(cg)) / "gs_tids"
        assert dump_tids(pin) == {first.pid}
        second = start()
        b.collect()
        assert dump_tids(pin) == {first.pid, second.pid}
        first.kill()
        first.wait()
        b.collect()
        assert dump_tids(pin) == {second.pid}
        print(f"gs_tids followed the rule: {sorted(dump_tids(pin))}")
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        assert apply(b, "a", "linux").policy_ok


def test_doctor_attaches_every_library_policy(env):
    """`cachepilot doctor` on the cache_ext kernel: every policy object of
    the library attaches to its scratch cgroup through the agent's actuator
    and detaches again, and nothing of the doctor's is left behind."""
    from cachepilot import doctor
    from cachepilot.agent.cgroups import memory_hierarchy
    from cachepilot.agent.sampler import BTF

    found = memory_hierarchy()
    checks = doctor.check_cache_ext(found, BTF.read_bytes())
    assert [c.status for c in checks] == ["ok", "ok"], checks
    policies = checks[1].detail
    print(policies)
    library = sorted(p.name[:-len(".bpf.o")] for p in POLICY_DIR.glob("*.bpf.o"))
    assert library and policies == "load: " + ", ".join(library)
    assert not list(found[0].glob("cachepilot-doctor-*"))
    assert not list(Path("/sys/fs/bpf").glob("cachepilot-doctor-*"))


# policies that keep state for every page they hold (mru keeps it only for
# pages not read yet)
PER_PAGE_STATE = ("lfu", "s3fifo", "lhd", "hyperbolic", "linux", "mglru", "get_scan")
SMALL_CAPACITY = 512          # pages: a scaled-down compile-time bound


def policyctl(*args) -> str:
    return subprocess.run([str(POLICYCTL), "--pin-root", str(PINS), *map(str, args)],
                          check=True, capture_output=True, text=True).stdout


def test_policies_are_sized_to_their_cgroup_and_count_what_they_cannot_track(env):
    """Loaded for a cgroup, a policy's per-page maps hold its limit's worth
    of pages (8 MiB: 2048), and a pass over a file four times larger leaves
    nothing untracked.  Loaded with a capacity smaller than what the cgroup
    holds (512 pages, as a compile-time bound of 2^22 pages would be for a
    cgroup over 16 GiB), the policy keeps the cgroup within its limit and
    counts every page it had no room for; the agent reports the count, and
    raising the limit past the capacity loads the policy afresh for it."""
    a = ROOT / "a"
    limit_pages = LIMIT // 4096
    act = PolicyActuator([str(ROOT)], "linux", pin_root=PINS)
    for p in PER_PAGE_STATE:
        out = policyctl("attach", a, p)
        assert f"capacity {limit_pages} pages" in out, out
        cx("dontneed", env)
        cx("read", env, a)
        st, held = act.stats(str(a)), int(cache_ext(a)["tracked"])
        print(f"{p} sized for the limit: {st}, cgroup holds {held} pages")
        assert st.capacity_pages == limit_pages and st.overflow_pages == 0
        assert held > SMALL_CAPACITY
        policyctl("detach", a)

        policyctl("--capacity", SMALL_CAPACITY, "attach", a, p)
        cx("dontneed", env)
        cx("read", env, a)
        st, held = act.stats(str(a)), int(cache_ext(a)["tracked"])
        print(f"{p} with {SMALL_CAPACITY} pages of room: {st}, cgroup holds {held} pages")
        assert st.capacity_pages == SMALL_CAPACITY
        # every page held beyond the room was counted when it came in, and
        # no more pages than the pass brought in
        assert held - SMALL_CAPACITY <= st.overflow_pages <= FILE_MIB * 256
        assert int((a / "memory.current").read_text()) <= LIMIT
        if p != PER_PAGE_STATE[-1]:
            policyctl("detach", a)

    b = backend()
    (report,) = [r for r in b.collect() if r.tenant == "a"]
    assert (report.policy_capacity_pages, report.policy_overflow_pages) == \
        (st.capacity_pages, st.overflow_pages)
    res = apply(b, "a", PER_PAGE_STATE[-1], 2 * LIMIT)
    assert res.ok and res.policy_ok, res
    assert act.stats(str(a)).capacity_pages == 2 * limit_pages
    assert act.stats(str(a)).overflow_pages == 0
    assert apply(b, "a", "linux", LIMIT).policy_ok


def test_hook_costs_are_measured_per_policy_on_the_live_kernel(env):
    # every policy is measured, and what it adds to a cached read is far
    # less than a miss costs: a hit loop that missed would not give that.
    # Not bounded by a fraction of the read: under emulation the figures
    # carry offsets that hold for a whole boot (fifo, with no hook on a
    # hit, has measured +0.7 to +3.0 us over a 16 us read; s3fifo +0.5 us
    # in one boot and +9.6 us over a 21 us read in another, the least of
    # nine rounds each)
    act = PolicyActuator([str(ROOT)], "linux", pin_root=PINS)
    costs = hookcost.measure(act, ROOT, ["linux", "fifo", "s3fifo"], DATA, rounds=9)
    print(f"hook costs: a read {costs.baseline_ns:.0f} ns; {costs.ns_per_access}; "
          f"a miss {costs.miss_baseline_ns:.0f} ns; {costs.ns_per_miss}")
    assert not costs.failed and not costs.miss_failed
    assert set(costs.ns_per_access) == {"fifo", "s3fifo"} == set(costs.ns_per_miss)
    assert costs.baseline_ns > 0
    assert costs.miss_baseline_ns > 0
    assert all(0 <= v < 0.25 * costs.miss_baseline_ns for v in costs.ns_per_access.values())
    # a miss costs the reader more than a hit; s3fifo's insertion and
    # eviction (its ghost queue, two lists) cost it more than the kernel's
    # own (bench_policy_reclaim: 1.24x a missed read's CPU), which a loop
    # that did not miss, or whose evictions ran elsewhere, would not show
    assert costs.miss_baseline_ns > 2 * costs.baseline_ns
    assert 0.02 * costs.miss_baseline_ns < costs.ns_per_miss["s3fifo"] < \
        costs.miss_baseline_ns
    assert 0 <= costs.ns_per_miss["fifo"] < costs.miss_baseline_ns
    assert not (ROOT / hookcost.SCRATCH).exists()
