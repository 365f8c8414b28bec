"""`cachepilot run` on the demo host, headless, against the static equal
split (kernel default policy, same seed).  Every figure asserted here is
recomputed independently: SLO feasibility and the best policy per phase by
full simulation (models/runtime.py Cache, warm_miss_ratio) of the exact access streams the
sim tenants replayed."""
from __future__ import annotations

import json
import subprocess
import time
import sys
from pathlib import Path

import numpy as np
import pytest

from cachepilot.sim.backend import SimBackend
from cachepilot.controller.config import load_config
from cachepilot.models.mrc import PAGE_SIZE
from cachepilot.models.runtime import warm_miss_ratio

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
INTERVALS = 25
START_WINDOW = 5          # an SLO must be met within this many intervals...
PHASE_WINDOW = 5          # ...of start, and again after a phase change
SWITCH_WINDOWS = 3        # a phase change is followed within 3 windows


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One headless run of the demo (a minute or two), shared by the tests."""
    out = tmp_path_factory.mktemp("run")
    proc = subprocess.run([sys.executable, "-m", "cachepilot", "run", "--config", str(DEMO),
                           "--intervals", str(INTERVALS), "--json", str(out / "run.json"),
                           "--plots", str(out / "plots"), "--no-live"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "run.json").read_text())
    return load_config(DEMO), result, out, proc.stdout


# -- offline ground truth ------------------------------------------------------------
def phase_keys(cfg, tenant, idx, n):
    t = SimBackend(cfg, tenant.node, curves=False).tenants[tenant.name]
    return t.replay(idx, n)


def allowed(cfg, spec):
    from cachepilot.models.runtime import available_policies
    have = available_policies()
    return [p for p in (spec.policies or have) if p in have]


def slo_need_pages(cfg, spec, idx, n):
    """Least size (pages, to 1/64 of the node) meeting the SLO in phase idx
    under the best allowed policy, within the floor/ceiling; None if none."""
    keys, tids, counted = phase_keys(cfg, spec, idx, n)
    memory = cfg.node(spec.node).memory_bytes // PAGE_SIZE
    lo_cap = spec.floor_bytes // PAGE_SIZE
    hi_cap = (spec.ceiling_bytes or cfg.node(spec.node).memory_bytes) // PAGE_SIZE
    grid = [p for p in range(memory // 64, memory + 1, memory // 64) if lo_cap <= p <= hi_cap]
    best = None
    for policy in allowed(cfg, spec):
        ok = lambda p: spec.workload.service.throughput(  # noqa: E731
            warm_miss_ratio(keys, tids, policy, p, counted)) >= spec.slo.min_throughput
        if not ok(grid[-1]):
            continue
        lo, hi = 0, len(grid) - 1          # binary search on the grid
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(grid[mid]):
                hi = mid
            else:
                lo = mid + 1
        best = grid[lo] if best is None else min(best, grid[lo])
    return best


def feasible_slos(cfg, intervals):
    """Tenants whose SLOs can all be met together on their node, phase by
    phase (the largest need over a tenant's phases, plus everyone else's
    floor, must fit the node)."""
    out = set()
    for node in cfg.nodes:
        tenants = cfg.tenants_on(node.name)
        need = {}
        for t in tenants:
            if t.slo is None:
                continue
            needs = [slo_need_pages(cfg, t, i, min(200_000, (b - a + 1) *
                                                   t.workload.accesses_per_interval))
                     for i, a, b in t.workload.phase_spans(intervals)]
            if all(x is not None for x in needs):
                need[t.name] = max(needs) * PAGE_SIZE
        total = sum(need.values()) + sum(t.floor_bytes for t in tenants if t.name not in need)
        if total <= node.memory_bytes:
            out |= set(need)
    return out


# -- the tests ------------------------------------------------------------------------
@pytest.mark.slow
def test_json_has_the_documented_shape(demo):
    cfg, result, out, stdout = demo
    fields = {"name", "node", "slo", "met_fraction", "throughput", "limit_bytes", "policy"}
    assert {t["name"] for t in result["tenants"]} == {t.name for t in cfg.tenants}
    for t in result["tenants"] + result["baseline"]["tenants"]:
        assert fields <= set(t)
        assert len(t["history"]) == INTERVALS
    assert result["baseline"]["name"] == "static-equal"
    assert {t["policy"] for t in result["baseline"]["tenants"]} == {"linux"}
    for t in result["baseline"]["tenants"]:
        node = cfg.node(t["node"])
        assert t["limit_bytes"] == node.memory_bytes // len(cfg.tenants_on(node.name))
    assert result["aggregate_throughput"] == pytest.approx(
        sum(t["throughput"] for t in result["tenants"]))
    assert result["baseline_aggregate_throughput"] == pytest.approx(
        sum(t["throughput"] for t in result["baseline"]["tenants"]))
    assert "aggregate" in stdout


@pytest.mark.slow
def test_every_feasible_slo_is_met_within_five_intervals(demo):
    cfg, result, out, stdout = demo
    feasible = feasible_slos(cfg, INTERVALS)
    slo_tenants = {t.name for t in cfg.tenants if t.slo}
    assert feasible == slo_tenants, f"demo SLOs should all be feasible: {feasible}"
    base = {t["name"]: t for t in result["baseline"]["tenants"]}
    missed_by_equal = [n for n in feasible if base[n]["met_fraction"] < 1.0]
    assert missed_by_equal, "the equal split should miss some feasible SLO"
    for name in sorted(feasible):
        spec = cfg.tenant(name)
        row = next(t for t in result["tenants"] if t["name"] == name)
        grace = set(range(1, START_WINDOW + 1))
        for _, start, _ in spec.workload.phase_spans(INTERVALS)[1:]:
            grace |= set(range(start, start + PHASE_WINDOW))
        late_misses = [h["interval"] for h in row["history"]
                       if h["interval"] not in grace and h["throughput"] < row["slo"]]
        assert late_misses == [], (name, late_misses)
        assert row["first_met_interval"] is not None and \
            row["first_met_interval"] <= START_WINDOW, (name, row["first_met_interval"])


@pytest.mark.slow
def test_aggregate_throughput_beats_the_equal_split_by_1_3x(demo):
    cfg, result, out, stdout = demo
    ratio = result["aggregate_throughput"] / result["baseline_aggregate_throughput"]
    assert ratio >= 1.3, ratio


@pytest.mark.slow
def test_policy_matches_an_offline_sweep_and_follows_phase_changes(demo):
    """For every tenant phase: fully simulate the phase's stream at the size
    the tenant ended the phase with, under every allowed policy.  The
    autopilot's policy at the end of the phase matches when its modelled
    throughput is within the autopilot threshold of the best (closer than
    that the autopilot deliberately does not switch)."""
    cfg, result, out, stdout = demo
    tol = cfg.control.autopilot_threshold
    rows = {t["name"]: t["history"] for t in result["tenants"]}
    matches, phases, switch_ok = 0, 0, []
    for spec in cfg.tenants:
        hist = rows[spec.name]
        for idx, start, end in spec.workload.phase_spans(INTERVALS):
            n = min(200_000, (end - start + 1) * spec.workload.accesses_per_interval)
            keys, tids, counted = phase_keys(cfg, spec, idx, n)
            size = hist[end - 1]["limit_bytes"] // PAGE_SIZE
            tput = {p: spec.workload.service.throughput(
                        warm_miss_ratio(keys, tids, p, size, counted))
                    for p in allowed(cfg, spec)}
            best = max(tput.values())
            good = {p for p, v in tput.items() if v * (1 + tol) >= best}
            chosen = hist[end - 1]["policy"]
            phases += 1
            matches += chosen in good
            # After a phase change that calls for another policy, the
            # autopilot is on a good one within SWITCH_WINDOWS windows.  (At
            # start the sizes are still moving, and with them which policy
            # is best; the end-of-phase match above covers the first phase.)
            if idx == 0:
                continue
            before = hist[start - 2]["policy"]
            if before not in good:
                by = min(end, start + SWITCH_WINDOWS)
                switch_ok.append((spec.name, idx, hist[by - 1]["policy"] in good))
    assert phases >= len(cfg.tenants) + 1
    assert matches / phases >= 0.9, (matches, phases)
    assert switch_ok, "the demo should contain a phase change that calls for a switch"
    assert all(ok for *_, ok in switch_ok), switch_ok


@pytest.mark.slow
def test_plots_are_written(demo):
    cfg, result, out, stdout = demo
    png = out / "plots" / "run_timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_run_needs_no_privileges(tmp_path):
    """The sim touches no kernel object: the demo runs with every capability
    dropped (as root, via setpriv), as an unprivileged user would run it."""
    import os
    import shutil
    cmd = [sys.executable, "-m", "cachepilot", "run", "--config", str(DEMO), "--intervals", "2",
           "--no-live", "--json", str(tmp_path / "np.json"), "--plots", str(tmp_path / "p")]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is missing: cannot drop capabilities")
        drop = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"]
        caps = subprocess.run(drop + ["grep", "CapEff", "/proc/self/status"],
                              capture_output=True, text=True, check=True).stdout
        assert caps.split()[1] == "0000000000000000", caps
        cmd = drop + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(json.loads((tmp_path / "np.json").read_text())["tenants"]) == 8


def test_bad_run_arguments_get_one_line_errors(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("nodes: [{name: n, memory_bytes: -1}]\n")
    for args, expect in [(["--config", str(tmp_path / "absent.yaml")], "no such config file"),
                         (["--config", str(bad_yaml)], "nodes[0].memory_bytes"),
                         (["--config", str(DEMO), "--intervals", "0"], "at least 1"),
                         (["--config", str(DEMO), "--curve-rate", "0"], "a rate in (0, 1]"),
                         (["--config", str(DEMO), "--curve-rate", "1.5"], "a rate in (0, 1]")]:
        proc = subprocess.run([sys.executable, "-m", "cachepilot", "run", "--no-live",
                               "--no-plots", *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_curve_rate_samples_the_sim_nodes_curves_as_an_agent_would():
    from cachepilot.controller.config import load_config
    from cachepilot.run import run_autopilot
    cfg = load_config(DEMO)
    for rate, methods in ((1 / 64, {"shards", "minisim"}), (1.0, None)):
        _, _, controller = run_autopilot(cfg, 2, curve_rate=rate)
        curves = [c for rec in controller.registry.nodes.values()
                  for r in rec.tenants.values() for c in r.curves]
        assert curves and all(c.rate == rate for c in curves)
        if methods:
            assert {c.method for c in curves} <= methods


def test_an_unwritable_output_is_refused_before_the_run(tmp_path):
    """--json / --plots under a regular file (unwritable even for root) get
    a one-line error at once, not after the whole simulation."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (["--json", str(blocker / "out.json"), "--no-plots"],
                 ["--plots", str(blocker / "plots")]):
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "cachepilot", "run", "--no-live",
                               "--config", str(DEMO), *args],
                              capture_output=True, text=True, timeout=300)
        elapsed = time.monotonic() - started
        assert proc.returncode == 2 and "cannot write there" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert elapsed < 20, f"refused only after {elapsed:.0f} s"


def test_same_seed_gives_the_same_run(tmp_path):
    """Lock-step nodes and a deterministic engine: a run is reproducible."""
    outs = []
    for k in range(2):
        path = tmp_path / f"r{k}.json"
        proc = subprocess.run([sys.executable, "-m", "cachepilot", "run", "--config", str(DEMO),
                               "--intervals", "3", "--seed", "7", "--no-live", "--no-plots",
                               "--json", str(path)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(json.loads(path.read_text()))
    hist = [{t["name"]: t["history"] for t in o["tenants"]} for o in outs]
    assert hist[0] == hist[1]
    assert outs[0]["aggregate_throughput"] == outs[1]["aggregate_throughput"]


def test_run_speaks_tls_when_the_config_asks_for_it(tmp_path):
    import yaml
    sys.path.insert(0, str(Path(__file__).parent))
    from grpc_fixtures import TOKEN, make_cert
    key, cert = make_cert(tmp_path)
    cfg = {"controller": {"tls_cert": str(cert), "tls_key": str(key), "token": TOKEN},
           "nodes": [{"name": "n", "memory_bytes": "16MiB"}],
           "tenants": [{"name": f"t{i}", "node": "n", "policies": ["lru", "fifo"],
                        "initial_policy": "lru",
                        "workload": {"phases": [{"kind": "zipf", "footprint": "16MiB"}],
                                     "accesses_per_interval": 2000}} for i in range(2)]}
    path = tmp_path / "tls.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "cachepilot", "run", "--config", str(path),
                           "--intervals", "2", "--no-live", "--no-plots", "--json",
                           str(tmp_path / "o.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "plaintext" not in proc.stdout + proc.stderr
    assert len(json.loads((tmp_path / "o.json").read_text())["tenants"][0]["history"]) == 2
