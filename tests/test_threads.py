"""Policy thread rules (agent/threads.py): rules are validated, matched by
thread name and by command line against /proc and cgroup trees laid out like
the kernel's (v1 `tasks`, v2 `cgroup.threads`), threads that exit and
cgroups that vanish are handled, the role table agrees with the policy
sources, and, where the machine allows it, a real thread in a real v1
memory cgroup is found."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from cachepilot.agent import threads
from cachepilot.protocol import tenant as tenant_schema
from cachepilot.agent.cgroups import CgroupError, CgroupGone
from cachepilot.agent.threads import (POLICY_ROLES, ThreadRule, match,
                                      policy_tids, threads_in)


# -- fake trees ---------------------------------------------------------------

def make_process(proc: Path, pid: int, argv: list[str], threads: dict[int, str]):
    """/proc/PID (cmdline, status, task/TID/comm) and /proc/TID/status of
    each thread, as the kernel lays them out (a thread's /proc/TID exists
    though `ls /proc` does not show it)."""
    d = proc / str(pid)
    (d / "task").mkdir(parents=True)
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    for tid, comm in threads.items():
        t = d / "task" / str(tid)
        t.mkdir()
        (t / "comm").write_text(comm + "\n")
        status = f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{tid}\n"
        (t / "status").write_text(status)
        (proc / str(tid)).mkdir(exist_ok=True)
        (proc / str(tid) / "status").write_text(status)


def make_cgroup(path: Path, version: int, tids) -> Path:
    path.mkdir(parents=True)
    lines = "".join(f"{t}\n" for t in tids)
    if version == 2:
        (path / "cgroup.controllers").write_text("memory\n")
        (path / "memory.max").write_text("max\n")
        (path / "cgroup.threads").write_text(lines)
    else:
        (path / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        (path / "tasks").write_text(lines)
    return path


@pytest.fixture
def proc(tmp_path):
    """A RocksDB-like process 100 (threads 100-104) and a shell 200."""
    p = tmp_path / "proc"
    make_process(p, 100, ["/usr/bin/db_bench", "--benchmarks=readrandom", "--db=/data"],
                 {100: "db_bench", 101: "rocksdb:low0", 102: "rocksdb:low1",
                  103: "rocksdb:high0", 104: "db_scan_7"})
    make_process(p, 200, ["bash", "-c", "sleep 5"], {200: "bash"})
    return p


ALL = [100, 101, 102, 103, 104, 200]


# -- rules --------------------------------------------------------------------

@pytest.mark.parametrize("rule", [
    {"comm": "rocksdb:low*"}, {"cmdline": "*db_bench*"},
    {"comm": "db_*", "cmdline": "/usr/bin/db_bench *"},
    {"comm": "rocksdb:[lh]*[0-9]"}, {"comm": "[!a]*"},
])
def test_good_rules(rule):
    r = ThreadRule.model_validate(rule)
    assert (r.comm, r.cmdline) == (rule.get("comm"), rule.get("cmdline"))


@pytest.mark.parametrize("rule, expect", [
    ({}, "needs `comm`"),
    ({"comm": None, "cmdline": None}, "needs `comm`"),
    ({"comm": ""}, "non-empty"),
    ({"cmdline": ""}, "non-empty"),
    ({"comm": 5}, "valid string"),
    ({"comm": ["a*"]}, "valid string"),
    ({"comm": "x", "name": "y"}, "Extra inputs"),
    ({"comm": "rocksdb:high_priority*"}, "can never match"),
    ({"comm": "sixteen_chars_xx"}, "can never match"),
    ({"cmdline": "a\0b"}, "NUL"),
])
def test_bad_rules_are_refused(rule, expect):
    with pytest.raises(ValidationError, match=expect):
        ThreadRule.model_validate(rule)


def test_comm_glob_length_counts_what_a_name_must_hold():
    assert tenant_schema._min_len("rocksdb:low*") == 11
    assert tenant_schema._min_len("a[bc]?*") == 3          # a set is one character
    assert tenant_schema._min_len("[abc") == 4             # unclosed: literal
    assert tenant_schema._min_len("*" * 40) == 0
    ThreadRule(comm="fifteen_chars_x")               # exactly 15: fine
    ThreadRule(comm="[a-z][a-z][a-z][a-z][a-z]*")    # long text, few characters


def test_rule_semantics_without_files():
    both = ThreadRule(comm="rocksdb:*", cmdline="*db_bench*")
    assert both.matches("rocksdb:low0", "/usr/bin/db_bench --x")
    assert not both.matches("rocksdb:low0", "mysqld")
    assert not both.matches("other", "/usr/bin/db_bench")
    assert not ThreadRule(comm="Rocksdb*").matches("rocksdb:low0", None)   # case counts


# -- the role table -------------------------------------------------------------

def test_roles_agree_with_the_policy_sources():
    assert POLICY_ROLES == {"get_scan": {"scan_threads": "gs_tids"},
                            "admit_filter": {"bypass_threads": "af_tids"}}
    assert threads.check_against_sources() == []


def test_role_table_disagreement_is_reported(monkeypatch):
    monkeypatch.setitem(threads.POLICY_ROLES, "get_scan", {"scan_threads": "gs_tid"})
    monkeypatch.setitem(threads.POLICY_ROLES, "nosuch", {"x": "x_tids"})
    problems = threads.check_against_sources()
    assert any("get_scan.scan_threads" in p and "no tid map gs_tid" in p for p in problems)
    assert any("gs_tids of get_scan.bpf.c has no role" in p for p in problems)
    assert "nosuch: no policy source" in problems


# -- listing a cgroup's threads -------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_threads_in_reads_tasks_or_cgroup_threads(tmp_path, version):
    cg = make_cgroup(tmp_path / "kv", version, [104, 100, 101, 100])
    assert threads_in(cg) == [100, 101, 104]


def test_threads_in_empty_gone_and_not_a_cgroup(tmp_path):
    assert threads_in(make_cgroup(tmp_path / "empty", 2, [])) == []
    with pytest.raises(CgroupGone):
        threads_in(tmp_path / "absent")
    (tmp_path / "plain").mkdir()
    with pytest.raises(CgroupError, match="not a cgroup"):
        threads_in(tmp_path / "plain")
    bad = make_cgroup(tmp_path / "bad", 1, [])
    (bad / "tasks").write_text("12\nabc\n")
    with pytest.raises(CgroupError, match="not a thread id"):
        threads_in(bad)


def test_a_cgroup_removed_between_check_and_read_is_gone(tmp_path, monkeypatch):
    cg = make_cgroup(tmp_path / "kv", 2, [100])
    real_exists = Path.exists

    def exists_then_vanish(self):          # rmdir right after the check
        found = real_exists(self)
        if self.name == "cgroup.threads" and found:
            shutil.rmtree(cg)
        return found
    monkeypatch.setattr(Path, "exists", exists_then_vanish)
    with pytest.raises(CgroupGone):
        threads_in(cg)


# -- matching -------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_match_by_comm(tmp_path, proc, version):
    cg = make_cgroup(tmp_path / "kv", version, ALL)
    assert match(cg, ThreadRule(comm="rocksdb:low*"), proc) == [101, 102]
    assert match(cg, {"comm": "rocksdb:*"}, proc) == [101, 102, 103]
    assert match(cg, {"comm": "db_scan*"}, proc) == [104]
    assert match(cg, {"comm": "mysqld*"}, proc) == []


@pytest.mark.parametrize("version", [1, 2])
def test_match_by_cmdline(tmp_path, proc, version):
    cg = make_cgroup(tmp_path / "kv", version, ALL)
    # NULs between the arguments became spaces, the trailing one is gone
    assert match(cg, {"cmdline": "/usr/bin/db_bench --benchmarks=readrandom --db=/data"},
                 proc) == [100, 101, 102, 103, 104]
    assert match(cg, {"cmdline": "bash -c sleep 5"}, proc) == [200]
    assert match(cg, {"cmdline": "*sleep*", "comm": "rocksdb*"}, proc) == []
    assert match(cg, {"cmdline": "*db_bench*", "comm": "*high*"}, proc) == [103]


def test_only_the_cgroups_own_threads_are_candidates(tmp_path, proc):
    cg = make_cgroup(tmp_path / "kv", 1, [100, 101])    # 102 lives elsewhere
    assert match(cg, {"comm": "rocksdb:low*"}, proc) == [101]


def test_threads_that_exit_are_skipped(tmp_path, proc):
    cg = make_cgroup(tmp_path / "kv", 2, ALL + [999])   # 999: no /proc entry
    shutil.rmtree(proc / "100" / "task" / "102")          # gone after its status
    (proc / "103" / "status").unlink()                    # gone before it
    assert match(cg, {"comm": "rocksdb:*"}, proc) == [101]
    shutil.rmtree(proc / "200")                           # whole process gone
    assert match(cg, {"cmdline": "*"}, proc) == [100, 101, 102, 104]


def test_a_thread_exiting_with_esrch_is_skipped(tmp_path, proc, monkeypatch):
    cg = make_cgroup(tmp_path / "kv", 2, ALL)
    real = Path.read_bytes

    def esrch(self):                   # /proc of a dying task: ESRCH on read
        if self.parts[-2:] == ("101", "comm"):
            raise ProcessLookupError(3, "No such process")
        return real(self)
    monkeypatch.setattr(Path, "read_bytes", esrch)
    assert match(cg, {"comm": "rocksdb:low*"}, proc) == [102]


def test_match_on_a_vanished_cgroup_raises(tmp_path, proc):
    with pytest.raises(CgroupGone):
        match(tmp_path / "kv", {"comm": "*"}, proc)
    with pytest.raises(CgroupGone):
        policy_tids(tmp_path / "kv", "get_scan", {"scan_threads": {"comm": "*"}}, proc)


def test_policy_tids_fills_each_roles_map(tmp_path, proc):
    cg = make_cgroup(tmp_path / "kv", 2, ALL)
    assert policy_tids(cg, "get_scan", {"scan_threads": {"comm": "db_scan*"}},
                       proc) == {"gs_tids": [104]}
    assert policy_tids(cg, "admit_filter",
                       {"bypass_threads": ThreadRule(comm="rocksdb:low*")},
                       proc) == {"af_tids": [101, 102]}
    assert policy_tids(cg, "get_scan", {}, proc) == {}      # no rule: map left alone
    with pytest.raises(ValueError, match="unknown policy 'lru'"):
        policy_tids(cg, "lru", {}, proc)
    with pytest.raises(ValueError, match="unknown role.*bypass_threads.*expected scan_threads"):
        policy_tids(cg, "get_scan", {"bypass_threads": {"comm": "*"}}, proc)


def test_policy_tids_from_a_tenant_config(tmp_path, proc):
    from cachepilot.agent.config import config_from_dict
    cg = make_cgroup(tmp_path / "kv", 1, ALL)
    cfg = config_from_dict({"roots": [str(tmp_path)], "tenants": [{
        "name": "kv", "cgroup": "kv", "policy_threads": {
            "get_scan": {"scan_threads": {"comm": "db_scan*"}},
            "admit_filter": {"bypass_threads": {"comm": "rocksdb:low*",
                                                "cmdline": "*db_bench*"}}}}]})
    got = {policy: policy_tids(cg, policy, rules, proc)
           for policy, rules in cfg.tenants[0].thread_rules().items()}
    assert got == {"get_scan": {"gs_tids": [104]},
                   "admit_filter": {"af_tids": [101, 102]}}


# -- live: a real thread in a real v1 memory cgroup -------------------------------

V1_MEMORY = Path("/sys/fs/cgroup/memory")

CHILD = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
ready = threading.Event()
def scan():
    libc.prctl(15, b"cpscanlive", 0, 0, 0)       # PR_SET_NAME
    print(threading.get_native_id(), flush=True)
    ready.set()
    time.sleep(120)
threading.Thread(target=scan, daemon=True).start()
ready.wait()
time.sleep(120)
"""


def test_live_match_finds_a_renamed_thread_in_a_v1_memory_cgroup():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a memory cgroup")
    if not (V1_MEMORY / "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup v1 memory hierarchy at {V1_MEMORY}")
    cg = V1_MEMORY / f"cachepilot-test-threads-{os.getpid()}"
    cg.mkdir()
    child = None
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, "cp-threads-marker"],
                                 stdout=subprocess.PIPE, text=True)
        tid = int(child.stdout.readline())
        (cg / "cgroup.procs").write_text(f"{child.pid}\n")
        assert set(threads_in(cg)) == {child.pid, tid}
        assert match(cg, {"comm": "cpscanlive"}) == [tid]
        assert match(cg, {"comm": "cpscan*", "cmdline": "* cp-threads-marker"}) == [tid]
        assert match(cg, {"cmdline": f"{sys.executable} -c *cp-threads-marker"}) == \
            sorted([child.pid, tid])
        assert policy_tids(cg, "get_scan", {"scan_threads": {"comm": "cpscan*"}}) == \
            {"gs_tids": [tid]}
    finally:
        if child is not None:
            child.kill()
            child.wait()
            child.stdout.close()
        for _ in range(50):              # the reaped task leaves the cgroup soon
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            cg.rmdir()
    with pytest.raises(CgroupGone):
        match(cg, {"comm": "*"})
