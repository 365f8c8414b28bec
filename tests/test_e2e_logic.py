"""The arithmetic of `make e2e` (experiments/e2e_vm.py): the sweep's table,
the best static choice within the budget, the measured windows per phase,
and the two-phase tenant's shell.  The runs themselves need the cache_ext
VM (make e2e)."""
import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
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
    # a limit below a tenant's anonymous memory is not swept for it: the
    # trial leaves it out, and so do the table and the oracle's options
    trials.append(trial(0, 0.25, {"s": "linux"}, {"s": 90}))
    table = e2e_vm.sweep_table(trials, ts)
    assert ("linux", 0.25) not in table["a"][0] and table["s"][0][("linux", 0.25)] == 90
    assert ("linux", 0.25) not in e2e_vm.sweep_error(trials, ts)["a"][0]
    choice, _ = e2e_vm.best_static(table, ts, 200 * MiB)
    assert choice["s"][1] != int(0.25 * 100 * MiB)     # not measured in its phase 1


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


def test_the_sweeps_limit_respects_the_anon_floor_or_skips_the_factor():
    MiB_ = MiB
    assert e2e_vm.sweep_limit(80 * MiB_, 5 * MiB_) == 80 * MiB_
    # a fio tenant at the floor factor: anon + margin, in whole MiB
    assert e2e_vm.sweep_limit(20 * MiB_, 5 * MiB_ + 1) == 22 * MiB_
    # RocksDB at the floor factor: would be another factor, not swept
    assert e2e_vm.sweep_limit(20 * MiB_, 40 * MiB_) == 0


def test_nearest_factor():
    assert e2e_vm.nearest_factor(150 * MiB, 80 * MiB) == 2.0
    assert e2e_vm.nearest_factor(70 * MiB, 80 * MiB) == 1.0
    assert e2e_vm.nearest_factor(30 * MiB, 80 * MiB) == 0.5
    assert e2e_vm.nearest_factor(21 * MiB, 80 * MiB) == 0.25
    # on the factors' own scale: 115 MiB is nearer 160 than 80 (113 between)
    assert e2e_vm.nearest_factor(115 * MiB, 80 * MiB) == 2.0


def test_the_sweeps_passes_start_with_another_policy_in_each_half():
    pols = ["linux", "lfu", "s3fifo"]
    for half in (0, 1):
        # every policy gets one pass in each half
        assert sorted(e2e_vm.rotation(pols, j, half) for j in range(3)) == sorted(pols)
    # and the first pass (and so the position of each) differs between halves
    assert e2e_vm.rotation(pols, 0, 0) != e2e_vm.rotation(pols, 0, 1)
    # a tenant with fewer policies than the widest repeats one
    assert [e2e_vm.rotation(["linux", "mru"], j, 0) for j in range(3)] == \
        ["linux", "mru", "linux"]


def test_a_diagnostic_sweep_repeats_its_rotation_at_the_factors_asked(monkeypatch):
    """sweep(factors=, rounds=): each phase runs the rotation `rounds`
    times, every pass filling at the first factor asked and measuring
    only those; each trial names its pass."""
    events = []

    class CG:
        def anon_bytes(self, name):
            return 0

        def set_io(self, *a):
            pass

    class Tenant(T):
        def switch_phase(self):
            events.append(("phase",))
    monkeypatch.setattr(e2e_vm, "start_run", lambda *a: "run")
    monkeypatch.setattr(e2e_vm, "finish_run", lambda *a: {})
    monkeypatch.setattr(e2e_vm, "fill", lambda run, ts, cg, i, static, data, label:
                        events.append(("fill", static["kv"])))
    monkeypatch.setattr(e2e_vm, "set_static", lambda ts, cg, static:
                        events.append(("set", static["kv"])))
    monkeypatch.setattr(e2e_vm, "measure_intervals", lambda run, ts, cg, i, n, label="":
                        {"kv": {"ops_per_s": [float(n)] * n}})
    ts = [Tenant("kv", ["linux", "get_scan", "s3fifo"], phased=True)]
    trials = e2e_vm.sweep(ts, CG(), 80 * MiB, 5.0, 1, 2, Path("/w"), Path("/d"),
                          factors=(2.0,), rounds=2)
    assert [e[0] for e in events].count("phase") == 1
    fills = [e[1][0] for e in events if e[0] == "fill"]
    # six passes a phase (the rotation twice), each filling at two shares
    assert fills == ["linux", "get_scan", "s3fifo"] * 2 + ["get_scan", "s3fifo", "linux"] * 2
    assert all(e[1][1] == 160 * MiB for e in events if e[0] == "fill")
    assert not [e for e in events if e[0] == "set"]
    assert [(t["phase"], t["pass"], t["factor"]) for t in trials] == \
        [(h, j, 2.0) for h in (0, 1) for j in range(6)]
    # pooled, each policy's two passes in a phase make one setting of the table
    table = e2e_vm.sweep_table(trials, ts)
    assert sorted(table["kv"][0]) == [("get_scan", 2.0), ("linux", 2.0), ("s3fifo", 2.0)]

    # the default: every factor once, filling at the first, stepping down after
    events.clear()
    e2e_vm.sweep([Tenant("kv", ["linux"])], CG(), 320 * MiB, 5.0, 1, 1, Path("/w"), Path("/d"))
    assert [e[0] for e in events] == ["fill"] + ["set"] * (len(e2e_vm.LIMIT_FACTORS) - 1)


def test_diagnostic_sweep_factors_parse_and_refuse_what_they_cannot_be():
    assert e2e_vm.parse_factors(None) == e2e_vm.LIMIT_FACTORS
    assert e2e_vm.parse_factors("2,0.5") == (2.0, 0.5)
    for bad, why in [("2,x", "not a list of numbers"), ("0,1", "(0, 16]"),
                     ("1,2", "largest first"), ("2,2", "distinct"), ("", "not a list")]:
        with pytest.raises(ValueError, match=re.escape(why)):
            e2e_vm.parse_factors(bad)
    script = str(Path(e2e_vm.__file__))
    for argv, why in [(["--sweep-rounds", "2"], "are for the diagnostic runs of --only"),
                      (["--only", "sweep", "--sweep-rounds", "0"], "from 1 to 8"),
                      (["--only", "sweep", "--sweep-factors", "1,2"], "largest first")]:
        got = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True,
                             timeout=60)
        assert got.returncode == 2 and why in got.stderr, got.stderr


def test_a_pass_fills_with_the_disk_limits_lifted_and_sets_them_back(monkeypatch):
    """fill(): policies back to the kernel's, caches dropped, the pass's
    settings made, io.max raised until every cache stops growing, then set
    back -- also when a measurement fails.  Raised, every tenant's together
    stay under the data disk's own throttle (the Makefile's E2E_DISK)."""
    calls = []

    class CG:
        def set_io(self, name, data, riops, rbps):
            calls.append(("set_io", name, riops, rbps))

    make = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    disk = dict(kv.split("=") for kv in
                make.split("E2E_DISK :=")[1].splitlines()[0].strip().split(","))
    up = e2e_vm.FILL_SPEEDUP
    assert sum(up[0] * r for r, _ in e2e_vm.IO.values()) < int(disk["throttling.iops-total"])
    assert sum(up[1] * b for _, b in e2e_vm.IO.values()) < int(disk["throttling.bps-total"])

    growth = iter([10, 20, 30, 30, 30])      # MiB: settles at the fourth interval
    monkeypatch.setattr(e2e_vm, "set_static", lambda ts, cg, st: calls.append(
        ("static", {n: p for n, (p, _) in st.items()})))
    monkeypatch.setattr(e2e_vm, "drop_caches", lambda: calls.append(("drop",)))

    def measure(run, ts, cg, interval, n, label=""):
        calls.append(("measure", n))
        return {"kv": {"cache_bytes": [next(growth) * MiB]}}
    monkeypatch.setattr(e2e_vm, "measure_intervals", measure)
    ts = [T("kv", ["linux", "get_scan"])]
    static = {"kv": ("get_scan", 160 * MiB)}
    e2e_vm.fill(None, ts, CG(), 5.0, static, Path("/data"), "x")
    assert calls[:3] == [("static", {"kv": "linux"}), ("drop",), ("static", {"kv": "get_scan"})]
    riops, rbps = e2e_vm.IO["kv"]
    assert calls[3] == ("set_io", "kv", up[0] * riops, up[1] * rbps)
    assert [c for c in calls if c[0] == "measure"] == [("measure", 1)] * 4
    assert calls[-1] == ("set_io", "kv", *e2e_vm.IO["kv"])

    # a cache that never settles stops at the cap; an error still sets io back
    calls.clear()
    growth = iter(range(10, 10000, 10))      # 10 MiB more every interval
    e2e_vm.fill(None, ts, CG(), 5.0, static, Path("/data"), "x")
    assert len([c for c in calls if c[0] == "measure"]) == e2e_vm.FILL_MAX_INTERVALS
    calls.clear()

    def broken(*a, **k):
        raise RuntimeError("scrape failed")
    monkeypatch.setattr(e2e_vm, "measure_intervals", broken)
    with pytest.raises(RuntimeError):
        e2e_vm.fill(None, ts, CG(), 5.0, static, Path("/data"), "x")
    assert calls[-1] == ("set_io", "kv", *e2e_vm.IO["kv"])


def test_a_cache_still_filling_is_not_settled():
    static = {"kv": ("linux", 160 * MiB), "search": ("mru", 160 * MiB)}
    # kv fills 6 MiB an interval, search has read its whole 100 MiB file
    cache = {"kv": [60 * MiB, 66 * MiB], "search": [100 * MiB, 100 * MiB]}
    assert not e2e_vm.cache_settled(cache, static)
    cache["kv"].append(67 * MiB)        # grew by 1 MiB: 0.6 % of the limit
    cache["search"].append(100 * MiB)
    assert e2e_vm.cache_settled(cache, static)
    # a cache that shrank (the limit fell) has settled as far as filling goes
    assert e2e_vm.cache_settled({"kv": [150 * MiB, 80 * MiB], "search": [1, 1]}, static)
    # one interval alone says nothing yet
    assert not e2e_vm.cache_settled({"kv": [67 * MiB], "search": [1, 1]}, static)


def test_the_agents_curves_are_read_at_each_tenants_limit():
    """agent_view reads the agent's own endpoint (AgentMetrics, served on
    loopback) and gives each policy's curve at the tenant's limit, on a log
    scale between the points around it, beside the observed miss ratio."""
    from cachepilot.agent.metrics import AgentMetrics
    from cachepilot.models.mrc import MRC
    from cachepilot.protocol.types import TenantReport
    pages = [1000, 4000, 16000, 64000]
    rep = TenantReport("zipf", "/cg/zipf", 10.0, 100.0, 7.0, 7.0, 0.0, 16000 * 4096,
                       0, 0, "linux", 5000.0, 0.07,
                       curves=[MRC(pages, [0.5, 0.3, 0.1, 0.02], "linux"),
                               MRC(pages, [0.4, 0.2, 0.08, 0.02], "lfu")])
    m = AgentMetrics()
    m.update([rep])
    port = e2e_lib.free_port()
    httpd, _ = m.serve("127.0.0.1", port)
    try:
        view = e2e_lib.agent_view(port, {"zipf": 16000 * 4096, "other": 4096})
        mid = e2e_lib.agent_view(port, {"zipf": 8000 * 4096})
    finally:
        httpd.shutdown()
    assert view["zipf"]["observed"] == pytest.approx(0.07)
    assert view["zipf"]["curves"] == {"linux": pytest.approx(0.1), "lfu": pytest.approx(0.08)}
    # halfway between 4,000 and 16,000 pages on a log scale
    assert mid["zipf"]["curves"]["linux"] == pytest.approx(0.2)
    assert "other" not in view
    assert e2e_lib.agent_view(e2e_lib.free_port(), {"zipf": 1}) == {}
    # beyond the points: the end values
    assert e2e_lib.interpolate_log([10, 100], [0.5, 0.1], 1) == 0.5
    assert e2e_lib.interpolate_log([10, 100], [0.5, 0.1], 1000) == 0.1


def test_a_curve_on_a_new_grid_leaves_no_points_of_the_old_one():
    """A builder at a new rate (or a tenant at a new limit) reports its
    curve on other sizes: the endpoint then holds the new points only, or
    a curve read from it mixes the two (make e2e's policy diagnosis read
    every policy's stale first curve, all at their cold floor)."""
    from cachepilot.agent.metrics import AgentMetrics
    from cachepilot.models.mrc import MRC
    from cachepilot.protocol.types import TenantReport

    def report(pages, ys):
        return TenantReport("zipf", "/cg/zipf", 10.0, 100.0, 7.0, 7.0, 0.0, 16000 * 4096,
                            0, 0, "linux", 5000.0, 0.07,
                            curves=[MRC(pages, ys, "linux"), MRC(pages, ys, "lfu")])
    m = AgentMetrics()
    m.update([report([1000, 4000, 16000, 64000], [0.9, 0.9, 0.9, 0.9])])
    m.update([report([2000, 8000, 32000], [0.5, 0.3, 0.1])])
    port = e2e_lib.free_port()
    httpd, _ = m.serve("127.0.0.1", port)
    try:
        view = e2e_lib.agent_view(port, {"zipf": 16000 * 4096})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        httpd.shutdown()
    # halfway between 8,000 and 32,000 pages on a log scale
    assert view["zipf"]["curves"] == {"linux": pytest.approx(0.2), "lfu": pytest.approx(0.2)}
    assert text.decode().count("cachepilot_mrc_miss_ratio{") == 6
    m.update([])                                    # the tenant gone: none left
    assert "zipf" not in str(m.curve.collect()[0].samples)


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


def test_sweep_error_and_the_policies_the_sweep_cannot_tell_apart():
    ts = [T("a", ["linux", "mru"])]
    trials = [dict(trial(0, 1.0, {"a": "linux"}, {"a": 10}), series={"a": [9, 10, 11]}),
              dict(trial(0, 1.0, {"a": "mru"}, {"a": 11}), series={"a": [10, 11, 12]}),
              dict(trial(1, 1.0, {"a": "mru"}, {"a": 11}),
                   series={"a": [11, float("nan"), 11]})]
    err = e2e_vm.sweep_error(trials, ts)
    # linux: sd 1 over 3 intervals; mru pools both halves, nan left out
    assert err["a"][0][("linux", 1.0)] == pytest.approx(1 / 3 ** 0.5)
    assert err["a"][0][("mru", 1.0)] == pytest.approx(
        e2e_vm.stdev([10, 11, 12, 11, 11]) / 5 ** 0.5)
    # passes that stray from each other more than their intervals: the
    # tenant's pooled spread between passes is every setting's error
    trials = [dict(trial(h, f, {"a": p}, {"a": x}), series={"a": [x - 0.1, x, x + 0.1]})
              for h, f, p, x in [(0, 1.0, "linux", 700), (1, 1.0, "linux", 760),
                                 (0, 1.0, "mru", 680), (1, 1.0, "mru", 700),
                                 (0, 0.5, "mru", 300)]]
    err = e2e_vm.sweep_error(trials, ts)["a"][0]
    rel = ((30 / 730) ** 2 * 2 + (10 / 690) ** 2 * 2) / 2
    assert err[("linux", 1.0)] == pytest.approx(730 * (rel / 2) ** 0.5)
    assert err[("mru", 1.0)] == pytest.approx(690 * (rel / 2) ** 0.5)
    assert err[("mru", 0.5)] == pytest.approx(300 * rel ** 0.5)     # one pass
    # which makes linux's 6 % lead a tie, as the intervals alone would not;
    # a 12 % lead stays a lead
    errs = {k: err[(k, 1.0)] for k in ("linux", "mru")}
    assert e2e_vm.best_policies({"linux": 730, "mru": 690}, errs) == ["linux", "mru"]
    assert e2e_vm.best_policies({"linux": 730, "mru": 690}, {"linux": 0.06, "mru": 0.06}) \
        == ["linux"]
    assert e2e_vm.best_policies({"linux": 730, "mru": 650}, errs) == ["linux"]
    # a two-phase tenant measured once a phase: its intervals' spread only
    tp = [T("b", ["linux"], phased=True)]
    err = e2e_vm.sweep_error([dict(trial(h, 1.0, {"b": "linux"}, {"b": x}),
                                   series={"b": [x - 1, x + 1]})
                              for h, x in [(0, 100), (1, 200)]], tp)["b"]
    assert err[0][("linux", 1.0)] == pytest.approx(1.0) == err[1][("linux", 1.0)]
    # within two standard errors of the difference: both count as best
    assert e2e_vm.best_policies({"linux": 10, "mru": 11},
                                {"linux": 0.5, "mru": 0.5}) == ["linux", "mru"]
    # far apart: only the best
    assert e2e_vm.best_policies({"linux": 10, "mru": 20},
                                {"linux": 0.5, "mru": 0.5}) == ["mru"]


def test_a_choice_is_the_policy_settled_on_judged_at_the_limit_it_ran_at():
    """search's passes: the default while its limit is large (every policy
    ties there), MRU once shrunk to a quarter share (where MRU is best):
    the choice is the policy it settled on, at the limit it settled at,
    and the share of intervals in force among the best counts each at its
    own limit; a tenant that settles on a policy the sweep ranks below the
    best is a mismatch, whatever it ran before."""
    import argparse
    ts = [T("search", ["linux", "mru"])]
    share = 80 * MiB
    trials = [trial(0, f, {"search": p}, {"search": ops})
              for f, p, ops in ((2.0, "linux", 100), (2.0, "mru", 100),
                                (0.25, "linux", 10), (0.25, "mru", 40))]
    for t in trials:
        t["series"] = {"search": [t["ops"]["search"]] * 3}
    table, errors = e2e_vm.sweep_table(trials, ts), e2e_vm.sweep_error(trials, ts)
    args = argparse.Namespace(warmup=0, intervals=8, settle=3)
    win = e2e_vm.windows(8, 8, 0, 3)

    def choose(policies):
        auto = {"search": {"policy": policies,
                           "limit_bytes": [160 * MiB] * 3 + [20 * MiB] * 5}}
        return e2e_vm.policy_choices(args, ts, auto, table, errors, share, 8, win)[0][0]

    c = choose(["none"] * 5 + ["mru"] * 3)
    assert c["autopilot_policy"] == "mru" and c["match"] and c["at_limit_factor"] == 0.25
    # the majority ran linux; every interval but two was among the best at
    # its own limit (those at a quarter share before the switch)
    assert c["majority_policy"] == "linux"
    assert c["in_best_fraction"] == pytest.approx(6 / 8)
    c = choose(["none"] * 7 + ["mru"])
    assert c["autopilot_policy"] == "linux" and not c["match"]
    assert c["in_best_fraction"] == pytest.approx(4 / 8)


def test_slos_sit_above_the_equal_split_where_the_sweep_found_headroom():
    table = {"kv": {0: {("linux", 1.0): 100.0, ("get_scan", 1.0): 400.0,
                        ("linux", 2.0): 300.0}},
             "zipf": {0: {("linux", 1.0): 100.0, ("lfu", 1.0): 125.0}},
             "search": {0: {("linux", 1.0): 100.0, ("mru", 0.5): 130.0}}}
    slos = e2e_vm.derive_slos(table, ["kv", "zipf", "search"])
    # zipf's best is within the headroom; search's just reaches it
    assert slos == {"kv": pytest.approx(100.0 * e2e_vm.SLO_GAIN),
                    "search": pytest.approx(100.0 * e2e_vm.SLO_GAIN)}
    assert 1.0 < e2e_vm.SLO_GAIN < e2e_vm.SLO_HEADROOM
    assert e2e_vm.control_intervals(3, 5.0, 10.0) == 2
    assert e2e_vm.control_intervals(4, 5.0, 10.0) == 2
    assert e2e_vm.control_intervals(None, 5.0, 10.0) is None


def test_summarise_report_and_plot_a_whole_synthetic_run(tmp_path, capsys):
    """Every configuration's series, the sweep and the overhead as make e2e
    would leave them, through summarise, report and plot: the arithmetic of
    the results file, checked on numbers whose answers are known."""
    import argparse
    ts = [T("kv", ["linux", "get_scan"]), T("search", ["linux", "mru"], phased=True)]
    for t in ts:
        t.unit = "ops"
    n, phase_at = 8, 4
    args = argparse.Namespace(interval=5.0, control_interval=10.0, intervals=n,
                              warmup=1, settle=1)
    win = e2e_vm.windows(n, phase_at, 1, 1)
    # ops per configuration: kv flat, search's phases differ
    level = {"default_equal": (100, 10, 50), "limits_only": (150, 30, 50),
             "autopilot": (200, 40, 50), "best_static": (210, 40, 50),
             "default_equal_repeat": (100, 10, 50)}
    runs = {}
    for c, (kv, s0, s1) in level.items():
        pol = "get_scan" if c in ("autopilot", "best_static") else "none"
        series = {
            "kv": {"ops_per_s": [kv] * n, "limit_bytes": [80 * MiB] * n,
                   "policy": [pol] * n, "cpu": [0.3] * n},
            "search": {"ops_per_s": [s0] * phase_at + [s1] * (n - phase_at),
                       "limit_bytes": [80 * MiB] * n, "policy": ["none"] * n,
                       "cpu": [0.2] * n},
            "_host": {"busy_cpus": [1.0] * n, "agent_cpus": [0.1] * n}}
        if c == "autopilot":
            # what the agent's curves said at kv's limit, and kv's cgroup
            series["kv"]["curves_at_limit"] = [{"linux": 0.3, "get_scan": 0.2}] * n
            series["kv"]["observed_miss_ratio"] = [0.25] * n
        runs[c] = {"series": series, "agent_cpu_fraction": 0.1}
    trials = []
    for phase in (0, 1):
        for pol_kv, pol_s, kv_ops, s_ops in (("linux", "linux", 100, 10 if phase == 0 else 50),
                                              ("get_scan", "mru", 200, 12 if phase == 0 else 40)):
            trials.append({"phase": phase, "factor": 1.0,
                           "settings": {"kv": [pol_kv, 80 * MiB], "search": [pol_s, 80 * MiB]},
                           "ops": {"kv": kv_ops, "search": s_ops},
                           "series": {"kv": [kv_ops - 1, kv_ops + 1],
                                      "search": [s_ops - 1, s_ops + 1]}})
    table, errors = e2e_vm.sweep_table(trials, ts), e2e_vm.sweep_error(trials, ts)
    static, score = e2e_vm.best_static(table, ts, 160 * MiB)
    slos = e2e_vm.derive_slos(table, ["kv"])
    assert slos == {"kv": pytest.approx(100 * e2e_vm.SLO_GAIN)}
    res = e2e_vm.summarise(args, ts, runs, trials, table, errors, static, score, slos,
                           {"ratio": 0.9}, 160 * MiB, phase_at, win, 1.0)
    conf = res["configurations"]
    assert conf["default_equal"]["normalised"] == pytest.approx(1.0)
    # kv 2x, search (4x, 1x) -> mean 2.5: normalised (2 + 2.5) / 2
    assert conf["autopilot"]["normalised"] == pytest.approx((2.0 + 2.5) / 2)
    assert res["parts"]["autopilot (c)/(d)"] == pytest.approx(2.25 / ((2.1 + 2.5) / 2))
    kv_choice = next(c for c in res["choices"] if c["tenant"] == "kv")
    assert kv_choice["autopilot_policy"] == "get_scan" and kv_choice["match"]
    assert kv_choice["curves"] == {"ran": "get_scan", "observed": pytest.approx(0.25),
                                   "predicted": {"get_scan": pytest.approx(0.2),
                                                 "linux": pytest.approx(0.3)}}
    s1 = next(c for c in res["choices"] if c["tenant"] == "search" and c["phase"] == 1)
    assert s1["best_static_policies"] == ["linux"] and s1["match"]
    # the kv SLO (~141 GETs/s) is met from the first interval of (c)
    assert res["slo"]["kv"]["autopilot_control_intervals"] == {"from_start": 1,
                                                               "after_phase_change": 1}
    assert res["slo"]["kv"]["target_met"]
    e2e_vm.report(res, ts)
    assert "normalised:" in capsys.readouterr().out
    e2e_lib.plot(res, tmp_path / "e2e.png", "title", phase_at=phase_at)
    assert (tmp_path / "e2e.png").stat().st_size > 10_000


def test_best_static_serves_slos_first():
    ts = [T("a", ["linux"]), T("b", ["linux"])]
    table = {"a": {0: {("linux", 1.5): 40, ("linux", 1.0): 10, ("linux", 0.5): 8}},
             "b": {0: {("linux", 1.5): 30, ("linux", 1.0): 20, ("linux", 0.5): 18}}}
    # without SLOs a takes the larger share (4x against b's 1.5x)
    choice, _ = e2e_vm.best_static(table, ts, 200 * MiB)
    assert choice == {"a": ("linux", 150 * MiB), "b": ("linux", 50 * MiB)}
    # b's SLO of 25/s needs the larger share: the oracle meets it first
    choice, score = e2e_vm.best_static(table, ts, 200 * MiB, {"b": 25})
    assert choice == {"a": ("linux", 50 * MiB), "b": ("linux", 150 * MiB)}
    assert score == pytest.approx((0.8 + 1.5) / 2)


@pytest.mark.parametrize("name", ["limits_only", "autopilot", "agent_sampling"])
def test_the_run_configs_are_valid_where_the_loaders_read_them(tmp_path, monkeypatch, name):
    """The controller's and the agent's configs of every configuration, for
    the real tenant list, through the loaders the processes use: tenants in
    the controller's config when there is one, in the agent's when it runs
    alone (agent_sampling); kv's scanner rule reaches its node."""
    from cachepilot.agent.config import config_from_dict as agent_cfg
    from cachepilot.controller.config import config_from_dict as controller_cfg
    monkeypatch.setattr(e2e_lib.shutil, "which", lambda _: "/bin/true")
    sizes = {"search": 100 * MiB, "zipf": 320 * MiB, "stream": 512 * MiB,
             "kv_keys": 500_000, "kv_bytes": 200 * MiB, "kv_skew": e2e_vm.KV_SKEW}
    ts = e2e_lib.tenants(tmp_path, sizes, 60, phased=True, policies=e2e_vm.ALLOWED)
    for port, t in enumerate(ts, 9000):
        t.port = port
    cg = e2e_lib.Cgroups(tmp_path / "cg", 2)
    tls = (tmp_path / "key.pem", tmp_path / "cert.pem", tmp_path / "token")
    alone = name == "agent_sampling"
    policy_name = "autopilot" if alone else name
    agent = agent_cfg(e2e_lib.agent_config(policy_name, ts, cg, 320 * MiB, 10.0, 1, tls,
                                           standalone=alone))
    if alone:
        assert agent.controller is None and [t.name for t in agent.tenants] == \
            [t.name for t in ts]
        return
    assert agent.controller is not None and agent.tenants == []
    ctl = controller_cfg(e2e_lib.controller_config(name, ts, cg, 320 * MiB, 10.0, 1, tls,
                                                   {"kv": 300.0}))
    kv = ctl.tenant("kv")
    assert kv.slo.min_throughput == 300.0 and kv.throughput.source == "prometheus"
    assert kv.policy_threads is not None
    assert kv.policies == (e2e_vm.ALLOWED["kv"] if name == "autopilot" else ["linux"])
    # kv's curves count its GET process's reads: the rule takes the
    # readrandom command line and not the scanner's
    rule = kv.node_tenant().slo_threads
    kv_t = next(t for t in ts if t.name == "kv")
    assert rule.matches("db_bench", " ".join(kv_t.command))
    assert not rule.matches("db_scan", " ".join(kv_t.helpers[0]))


def test_e2e_hosts_sim_sets_kvs_slo_by_the_real_runs_rule_and_its_controller_serves_it():
    """experiments/e2e_host.py's sim prediction: kv asks KV_SLO_GAIN times
    what the sim's own equal split gave it, as the real run's kv does of
    its real equal split, and the sim's controller gives it more than that
    split to meet it (without the SLO it sized kv below its share)."""
    import e2e_host
    from types import SimpleNamespace as NS
    kv = 40 * MiB
    ts = [NS(name="kv", sim={"kind": "get-scan", "footprint": kv, "skew": 0.0,
                             "scan_fraction": 0.5, "scan_length": kv},
             slo_threads={"cmdline": "*--benchmarks=readrandom *"}),
          NS(name="search", sim={"kind": "loop", "footprint": 40 * MiB}, slo_threads=None),
          NS(name="zipf", sim={"kind": "zipf", "footprint": 64 * MiB, "skew": 1.1},
             slo_threads=None),
          NS(name="stream", sim={"kind": "scan", "footprint": 256 * MiB}, slo_threads=None)]
    ops, slo, met = e2e_host.sim_prediction(
        ts, 64 * MiB, 16, 4, {"t_hit_s": 2e-6, "t_miss_s": 8e-5, "concurrency": 1})
    assert set(ops) == {"default_equal", "limits_only"}
    assert slo == {"kv": pytest.approx(e2e_host.KV_SLO_GAIN * ops["default_equal"]["kv"])}
    assert ops["limits_only"]["kv"] > 1.1 * ops["default_equal"]["kv"]
    assert set(met) == {"kv"} and met["kv"] >= 0.5
    # its throughput counts the GETs, as the real kv's does: with the rule
    # left out it counts the scan's misses too, and reads lower
    ts[0].slo_threads = None
    every, _, _ = e2e_host.sim_prediction(
        ts, 64 * MiB, 16, 4, {"t_hit_s": 2e-6, "t_miss_s": 8e-5, "concurrency": 1})
    assert ops["default_equal"]["kv"] > 1.1 * every["default_equal"]["kv"]


class _FakeCgroups:
    """What start_run and halt touch of e2e_lib.Cgroups, recorded."""
    def __init__(self):
        self.killed = []

    def set_limit(self, name, limit):
        pass

    def kill_all(self, name):
        self.killed.append(name)


def test_an_interrupted_or_failed_run_leaves_nothing_running(tmp_path, monkeypatch):
    """The tenants lead their own sessions, so Ctrl-C and SIGTERM reach only
    the experiment: a run interrupted while measuring, and a start that
    fails half way, stop what they started and empty the tenants' cgroups
    (a killed e2e_host left RocksDB, fio, the agent and the controller
    running)."""
    monkeypatch.setattr(e2e_lib, "reset_policies", lambda ts, cg: None)
    monkeypatch.setattr(e2e_lib, "drop_caches", lambda: None)
    started = []

    def start_tenant(t, cg, log):
        if t.name == "b":
            raise RuntimeError("b: exporter did not start")
        p = subprocess.Popen(["sleep", "60"], start_new_session=True)
        started.append(p)
        return p
    monkeypatch.setattr(e2e_lib, "start_tenant", start_tenant)
    ts = [e2e_lib.Tenant("a", "fio", "reads", ["true"], ["linux"]),
          e2e_lib.Tenant("b", "fio", "reads", ["true"], ["linux"])]
    cg = _FakeCgroups()
    with pytest.raises(RuntimeError, match="did not start"):
        e2e_lib.start_run("default_equal", ts, cg, 64 * MiB, 1.0, tmp_path, {})
    assert len(started) == 1 and started[0].wait(timeout=30) == -signal.SIGTERM
    assert cg.killed == ["a", "b"]

    # interrupted while measuring: the run's processes stopped, cgroups emptied
    ts = ts[:1]
    cg = _FakeCgroups()
    monkeypatch.setattr(e2e_lib, "scrape", lambda port: 1.0)

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(e2e_lib, "measure_intervals", interrupted)
    with pytest.raises(KeyboardInterrupt):
        e2e_lib.run_config("default_equal", ts, cg, 64 * MiB, 1.0, 4, tmp_path, {})
    assert len(started) == 2 and started[1].wait(timeout=30) == -signal.SIGTERM
    assert cg.killed == ["a"]


def test_sigterm_ends_an_experiment_through_its_cleanup():
    """exit_on_sigterm turns SIGTERM into SystemExit, so the `finally` and
    `except BaseException` that stop a run's processes run."""
    code = ("import os, signal, sys, time; sys.path.insert(0, sys.argv[1]); import e2e_lib\n"
            "e2e_lib.exit_on_sigterm()\n"
            "try:\n    os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)\n"
            "finally:\n    print('cleaned up')\n")
    out = subprocess.run([sys.executable, "-c", code, str(Path(e2e_lib.__file__).parent)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 128 + signal.SIGTERM and "cleaned up" in out.stdout


def test_the_plot_draws_every_round_and_a_wide_span_on_a_log_axis(tmp_path, monkeypatch):
    """e2e_host runs each configuration more than once: every run is drawn
    (later rounds dashed), and a tenant whose ops/s span more than LOG_SPAN
    (its data came to fit in one round) gets a log axis, the others not."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    real = plt.subplots

    def subplots(*a, **k):
        fig, axes = real(*a, **k)
        made.append(axes)
        return fig, axes
    monkeypatch.setattr(plt, "subplots", subplots)

    def run(kv, other):
        return {"series": {n: {"ops_per_s": v, "limit_bytes": [64 * MiB] * 3,
                               "policy": ["none"] * 3}
                           for n, v in (("kv", kv), ("zipf", other))}}
    result = {"tenants": [{"name": "kv"}, {"name": "zipf"}],
              "runs": {"default_equal": [run([1e3] * 3, [10.0] * 3)] * 2,
                       "limits_only": [run([1e3] * 3, [11.0] * 3),
                                       run([1e3, 1e5, 2e5], [12.0] * 3)]},
              "ratio": {"limits_only": {"kv": 66.0, "zipf": 1.1}}}
    e2e_lib.plot(result, tmp_path / "p.png", "title")
    axes = made[0]
    kv_lines, zipf_lines = axes[0][0].get_lines(), axes[0][1].get_lines()
    assert len(kv_lines) == 4 and len(zipf_lines) == 4
    assert [ln.get_linestyle() for ln in kv_lines] == ["-", "--", "-", "--"]
    assert max(kv_lines[3].get_ydata()) == 2e5
    assert axes[0][0].get_yscale() == "log" and axes[0][1].get_yscale() == "linear"
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_static_diagnostic_settings_parse_and_refuse_what_they_cannot_be():
    assert e2e_vm.parse_static("kv=get_scan@2, search=mru@0.5") == {
        "kv": ("get_scan", 2.0), "search": ("mru", 0.5)}
    assert e2e_vm.parse_static(None) == {} == e2e_vm.parse_static("")
    for bad, why in [("kv=get_scan", "TENANT=POLICY@FACTOR"), ("db=linux@1", "no tenant"),
                     ("kv=mru@1", "may run"), ("kv=linux@x", "not a number"),
                     ("kv=linux@0", "(0, 16]"), ("kv@1", "TENANT=POLICY@FACTOR")]:
        with pytest.raises(ValueError, match=re.escape(why)):
            e2e_vm.parse_static(bad)
    # the command line says so before any work starts
    got = subprocess.run([sys.executable, str(Path(e2e_vm.__file__)), "--static", "kv=linux@1"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and "--static is for the diagnostic runs of --only" in got.stderr
    got = subprocess.run([sys.executable, str(Path(e2e_vm.__file__)), "--only", "default_equal",
                          "--fill"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and "--fill is for the --static runs of --only" in got.stderr


def test_a_filled_diagnostic_run_starts_as_a_sweep_pass_does(monkeypatch):
    """--fill: the run's settings made, the caches filled by fill() before
    the measured intervals; a failure while filling still ends the run."""
    calls = []
    monkeypatch.setattr(e2e_vm, "start_run", lambda name, ts, cg, budget, interval, work, slos,
                        static: calls.append(("start", name, static)) or "run")
    monkeypatch.setattr(e2e_vm, "fill", lambda run, ts, cg, interval, static, data, label:
                        calls.append(("fill", run, static)))
    monkeypatch.setattr(e2e_vm, "measure_intervals", lambda run, ts, cg, interval, n, phase_at:
                        calls.append(("measure", n, phase_at)) or {"kv": {}})
    monkeypatch.setattr(e2e_vm, "finish_run", lambda run, ts, cg: calls.append(("finish",)) or
                        {"agent_cpu_fraction": None})
    monkeypatch.setattr(e2e_vm, "end_run", lambda run, ts, cg: calls.append(("end",)))
    args = argparse.Namespace(control_interval=10.0, interval=5.0, intervals=32, data="/d")
    static = {"kv": ("get_scan", 160 * MiB)}
    got = e2e_vm.filled_run("default_equal", [], None, 320 * MiB, args, Path("/w"), static, 16)
    assert calls == [("start", "default_equal", static), ("fill", "run", static),
                     ("measure", 32, 16), ("finish",)]
    assert got == {"series": {"kv": {}}, "agent_cpu_fraction": None}

    def broken(*a):
        raise RuntimeError("scrape failed")
    monkeypatch.setattr(e2e_vm, "fill", broken)
    calls.clear()
    with pytest.raises(RuntimeError):
        e2e_vm.filled_run("default_equal", [], None, 320 * MiB, args, Path("/w"), static, 16)
    assert calls[-1] == ("end",)


def test_a_diagnostic_run_is_plotted_without_ratios(tmp_path):
    """--only runs have no equal split to divide by: their plot has each
    tenant's ops, limit and policy, and no ratio in the titles."""
    series = {"ops_per_s": [100.0, 120.0, 130.0], "limit_bytes": [160 * MiB] * 3,
              "policy": ["get_scan"] * 3}
    result = {"tenants": [{"name": "kv"}, {"name": "zipf"}],
              "runs": {"agent_sampling": [{"series": {"kv": series, "zipf": dict(
                  series, policy=["none"] * 3)}}]}}
    e2e_lib.plot(result, tmp_path / "diag.png", "make e2e --only agent_sampling", 2)
    assert (tmp_path / "diag.png").stat().st_size > 10_000


def test_a_diagnostic_sweep_is_plotted_pass_by_pass(tmp_path, monkeypatch):
    """One point per pass and factor, each policy once in the legend, and
    the options the run was given in the title."""
    trials = [{"phase": h, "pass": j, "factor": f,
               "settings": {"kv": [pol, 0]}, "series": {"kv": [600.0 + j, 610.0, 620.0]}}
              for h in (0, 1) for j, pol in enumerate(["linux", "get_scan", "linux"])
              for f in (2.0, 1.0)]
    trials.append({"phase": 0, "pass": 0, "factor": 0.5, "error": "no room",
                   "settings": {"kv": ["linux", 0]}, "ops": {"kv": float("nan")}})
    args = argparse.Namespace(only="sweep", static=None, sweep_factors="2,1", sweep_rounds=2,
                              fill=False, sweep_warm=4, sweep_measure=8)
    title = " ".join(["make e2e", *e2e_vm.argv_of(args)])
    assert title == ("make e2e --only sweep --sweep-factors 2,1 --sweep-rounds 2 "
                     "--sweep-warm 4 --sweep-measure 8")
    import matplotlib.pyplot as plt
    shown = []
    real = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: shown.append(fig) or real(fig))
    e2e_vm.plot_sweep(trials, ["kv"], tmp_path / "s.png", title)
    ax = shown[0].axes[0]
    assert len(ax.containers) == 12                      # 6 passes x 2 factors
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["linux", "get_scan"]
    assert title in shown[0].texts[0].get_text()
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_the_agent_is_profiled_only_in_a_diagnostic_run_and_its_profile_is_kept(
        tmp_path, monkeypatch, capsys):
    # a profiled agent runs slower: a judged run refuses the flag
    with pytest.raises(SystemExit):
        e2e_vm.main(["--profile-agent"])
    assert "--profile-agent goes with --only" in capsys.readouterr().err
    # the run's profile lands beside its logs, a second run's beside the first
    work, logs = tmp_path / "run", tmp_path / "logs"
    work.mkdir()
    monkeypatch.setattr(e2e_lib, "LOG_DIR", logs)
    run = e2e_lib.Run("autopilot", work, [], None, None, 0.0)
    for _ in range(2):
        (work / "autopilot-agent.log").write_text("log")
        (work / "autopilot-agent.prof").write_bytes(b"prof")
        e2e_lib.keep_logs(run)
    assert sorted(p.name for p in logs.iterdir()) == [
        "autopilot-agent.2.log", "autopilot-agent.2.prof", "autopilot-agent.log",
        "autopilot-agent.prof"]
