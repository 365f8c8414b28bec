"""The arithmetic of `make e2e` (experiments/e2e_vm.py): the sweep's table,
the best static choice within the budget, the measured windows per phase,
and the two-phase tenant's shell.  The runs themselves need the cache_ext
VM (make e2e)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import e2e_lib  # noqa: E402
import e2e_vm  # noqa: E402

MiB = 1 << 20


class T:
    def __init__(self, name, policies, phased=False):
        self.name, self.policies = name, policies
        self.phase_pidfile = Path("/nonexistent") if phased else None


def trial(phase, factor, settings, ops):
    return {"phase": phase, "factor": factor,
            "settings": {n: [p, 0] for n, p in settings.items()}, "ops": ops}


def test_windows_and_phase_means():
    win = e2e_vm.windows(24, 12, 4, 3)
    assert win == {0: (4, 12), 1: (15, 24)}
    ops = [0.0] * 4 + [10.0] * 8 + [99.0] * 3 + [20.0] * 9
    assert e2e_vm.phase_means({"ops_per_s": ops}, win, True) == {0: 10.0, 1: 20.0}
    # one phase: warm-up left out, the rest pooled
    assert e2e_vm.phase_means({"ops_per_s": ops}, win, False)[0] == pytest.approx(
        sum(ops[4:]) / 20)
    # a scrape that failed (nan) is left out, not counted as zero
    assert e2e_lib.mean([1.0, float("nan"), 3.0]) == 2.0


def test_sweep_table_pools_one_phase_tenants_and_splits_two_phase_ones():
    ts = [T("a", ["linux", "mru"]), T("s", ["linux", "mru"], phased=True)]
    trials = [trial(0, 1.0, {"a": "linux", "s": "linux"}, {"a": 10, "s": 100}),
              trial(0, 1.0, {"a": "mru", "s": "mru"}, {"a": 5, "s": 200}),
              trial(1, 1.0, {"a": "linux", "s": "linux"}, {"a": 20, "s": 50}),
              trial(1, 1.0, {"a": "mru", "s": "mru"}, {"a": 7, "s": 10})]
    table = e2e_vm.sweep_table(trials, ts)
    assert table["a"] == {0: {("linux", 1.0): 15, ("mru", 1.0): 6}}
    assert table["s"] == {0: {("linux", 1.0): 100, ("mru", 1.0): 200},
                          1: {("linux", 1.0): 50, ("mru", 1.0): 10}}


def test_best_static_respects_the_budget_and_weighs_phases():
    ts = [T("a", ["linux"]), T("b", ["linux", "mru"])]
    table = {
        # a gains a lot from memory, b nothing: a gets 2 shares only if b
        # can do with half of one
        "a": {0: {("linux", 2.0): 30, ("linux", 1.0): 10, ("linux", 0.5): 5}},
        "b": {0: {("linux", 2.0): 10, ("linux", 1.0): 10, ("linux", 0.5): 10,
                  ("mru", 2.0): 12, ("mru", 1.0): 11, ("mru", 0.5): 11}},
    }
    choice, score = e2e_vm.best_static(table, ts, 200 * MiB)
    # a at 2 shares would leave b less than its smallest setting (2 + 0.5
    # > 2 shares), so the best within the budget is a at one share and b
    # under mru
    assert sum(lim for _, lim in choice.values()) <= 200 * MiB
    assert choice["b"][0] == "mru"
    assert score == pytest.approx((1.0 + 1.1) / 2)
    # a two-phase tenant scores the mean over its phases
    table2 = {"a": {0: {("linux", 1.0): 10}},
              "b": {0: {("linux", 1.0): 10, ("mru", 1.0): 30},
                    1: {("linux", 1.0): 10, ("mru", 1.0): 1}}}
    choice, score = e2e_vm.best_static(table2, ts, 200 * MiB)
    assert choice["b"][0] == "mru"          # (3.0 + 0.1) / 2 > 1.0
    assert score == pytest.approx((1.0 + 1.55) / 2)


def test_nearest_factor():
    assert e2e_vm.nearest_factor(150 * MiB, 80 * MiB) == 2.0
    assert e2e_vm.nearest_factor(70 * MiB, 80 * MiB) == 1.0
    assert e2e_vm.nearest_factor(30 * MiB, 80 * MiB) == 0.5


def test_two_phase_shell_runs_the_second_command_after_switch(tmp_path):
    pidfile = tmp_path / "phase"
    out = tmp_path / "out"
    cmd = e2e_lib.two_phase(["sleep", "60"], ["sh", "-c", f"echo second > {out}"], pidfile)
    p = subprocess.Popen(cmd)
    t = e2e_lib.Tenant("x", "fio", "ops", cmd, ["linux"], phase_pidfile=pidfile)
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    assert not out.exists()
    assert t.switch_phase()
    assert p.wait(timeout=10) == 0
    assert out.read_text() == "second\n"
    # a second switch, or a one-phase tenant's, does nothing
    assert not t.switch_phase()
    assert not e2e_lib.Tenant("y", "fio", "ops", [], ["linux"]).switch_phase()


def test_kill_all_empties_a_cgroup(tmp_path, monkeypatch):
    """kill_all kills what cgroup.procs lists until it is empty (a fake
    procs file stands in for the cgroup's)."""
    child = subprocess.Popen(["sleep", "60"])
    procs = tmp_path / "t" / "cgroup.procs"
    procs.parent.mkdir()
    procs.write_text(f"{child.pid}\n")
    cg = e2e_lib.Cgroups(tmp_path, 2)
    killed = []
    real_kill = os.kill

    def kill(pid, sig):
        killed.append((pid, sig))
        real_kill(pid, sig)
        procs.write_text("")
    monkeypatch.setattr(e2e_lib.os, "kill", kill)
    cg.kill_all("t")
    assert killed == [(child.pid, signal.SIGKILL)]
    assert child.wait(timeout=5) == -signal.SIGKILL


def test_a_run_waits_for_applied_directives_not_reports():
    """start_run waits for the agent's first applied directive; its report
    lines mention the limit too and must not count."""
    assert e2e_lib.APPLIED.search("... cachepilot.agent tenant kv: limit 83886080 -> "
                                  "62140416 bytes")
    assert e2e_lib.APPLIED.search("... cachepilot.agent tenant search: policy mru")
    assert not e2e_lib.APPLIED.search("... cachepilot.agent zipf: 166 acc/s, miss 0.136, "
                                      "limit 80 MiB, file 51 MiB, anon 5 MiB")


def test_cpu_shares_are_written_as_cpu_max_and_leave_room_for_the_agent(tmp_path):
    """set_cpu writes `quota period` into the tenant's cpu.max; a kernel
    without the cpu controller (no cpu.max) stops the run with a message
    instead of running the tenants uncapped.  The shares e2e_vm gives cover
    every tenant and leave at least half a CPU of the VM's two to the agent,
    the controller and the kernel."""
    (tmp_path / "kv").mkdir()
    (tmp_path / "kv" / "cpu.max").write_text("max 100000\n")
    cg = e2e_lib.Cgroups(tmp_path, 2)
    cg.set_cpu("kv", 0.45)
    assert (tmp_path / "kv" / "cpu.max").read_text() == "45000 100000"
    (tmp_path / "zipf").mkdir()
    with pytest.raises(SystemExit, match="cpu.max"):
        cg.set_cpu("zipf", 0.3)
    with pytest.raises(SystemExit, match="cpu.max"):
        e2e_lib.Cgroups(tmp_path, 1).set_cpu("kv", 0.3)
    assert set(e2e_vm.CPU) == set(e2e_vm.IO) == set(e2e_vm.ALLOWED)
    assert all(0 < c < 1 for c in e2e_vm.CPU.values())
    assert sum(e2e_vm.CPU.values()) <= 2 - 0.5
