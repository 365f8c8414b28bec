"""The linux backend's logic over file trees laid out like cgroup v2 (stats
only, no kernel needed), its config, its throughput sources and its
commands' handling of bad input."""
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cachepilot.agent.backends.linux import (LinuxBackend, kernel_default_policy,
                                             kernel_has_cache_ext)
from cachepilot.agent.config import config_from_dict, load_config
from cachepilot.agent.curves import make_builder, shift_by_anon
from cachepilot.agent.profile import subtract_window
from cachepilot.agent.throughput import PrometheusSource, ThroughputError, scrape
from cachepilot.protocol.types import Directive
from cachepilot.core.errors import UserError
from cachepilot.models.mrc import MRC

from test_cgroups_tree import make_v2

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def v2_tree(tmp_path):
    root = tmp_path / "tenants"
    make_v2(root / "web", max_=512 * MiB, current=300 * MiB, file=200 * MiB, anon=90 * MiB)
    make_v2(root / "db", current=100 * MiB, file=80 * MiB, anon=10 * MiB)
    return root


def backend_for(root, **extra):
    cfg = config_from_dict({"roots": [str(root)], "cgroups": ["*"], "memory": "8GiB",
                            "safety": {"floor": "64MiB", "anon_margin": "32MiB",
                                       "max_step": "1GiB"}, **extra})
    return LinuxBackend(cfg, start_sampler=False)


def test_stats_only_reports_from_a_v2_tree(tmp_path):
    root = v2_tree(tmp_path)
    b = backend_for(root)
    info = b.info()
    assert info.cgroup_version == 2 and info.memory_bytes == 8 << 30
    assert b.stats_only_reason
    (root / "web" / "memory.stat").write_text(
        f"anon {90 * MiB}\nfile {200 * MiB}\nworkingset_refault_file 517\n")
    reports = {r.tenant: r for r in b.collect()}
    assert set(reports) == {"web", "db"}
    web = reports["web"]
    assert web.limit_bytes == 512 * MiB
    assert (web.usage_file_bytes, web.usage_anon_bytes) == (200 * MiB, 90 * MiB)
    assert web.refaults_per_s > 0 and web.curves == []
    assert web.policy == "linux"


def test_apply_writes_memory_max_under_the_rules_and_reports_refusals(tmp_path):
    root = v2_tree(tmp_path)
    b = backend_for(root)
    res = {r.tenant: r for r in b.apply([
        Directive("web", 400 * MiB, "lru"),
        Directive("db", 8 * MiB, "linux"),
        Directive("nobody", 100 * MiB, "lru")])}
    assert res["web"].ok and res["web"].applied_limit_bytes == 400 * MiB
    assert (root / "web" / "memory.max").read_text() == str(400 * MiB)
    # the policy cannot be attached on this host: the policy part fails and
    # says why, the limit part stands on its own, and what runs is reported
    assert not res["web"].policy_ok
    assert "no cache_ext" in res["web"].policy_message
    assert res["web"].applied_policy == "linux"
    assert res["db"].policy_ok and res["db"].policy_message == ""
    assert res["db"].ok and res["db"].applied_limit_bytes == 64 * MiB
    assert "floor" in res["db"].message
    assert not res["nobody"].ok and "unknown tenant" in res["nobody"].message


def test_apply_with_memory_high_knob(tmp_path):
    root = v2_tree(tmp_path)
    b = backend_for(root, limit_knob="high")
    (r,) = b.apply([Directive("web", 300 * MiB, "linux")])
    assert r.ok and (root / "web" / "memory.high").read_text() == str(300 * MiB)
    assert (root / "web" / "memory.max").read_text().strip() == str(512 * MiB)


def test_a_deleted_cgroup_leaves_the_reports(tmp_path, caplog):
    root = v2_tree(tmp_path)
    b = backend_for(root)
    assert len(b.collect()) == 2
    for f in (root / "db").iterdir():
        f.unlink()
    (root / "db").rmdir()
    reports = b.collect()
    assert [r.tenant for r in reports] == ["web"]
    assert any("db" in r.getMessage() for r in caplog.records)
    (r,) = b.apply([Directive("db", 100 * MiB, "linux")])
    assert not r.ok


def test_new_cgroups_matching_a_glob_are_picked_up(tmp_path):
    root = v2_tree(tmp_path)
    b = backend_for(root)
    assert len(b.collect()) == 2
    make_v2(root / "cache")
    assert {r.tenant for r in b.collect()} == {"web", "db", "cache"}


def test_named_tenants_and_unmatched_paths(tmp_path):
    root = v2_tree(tmp_path)
    cfg = config_from_dict({"roots": [str(root)],
                            "tenants": [{"name": "shop", "cgroup": "web"},
                                        {"name": "ghost", "cgroup": "nothere"}]})
    b = LinuxBackend(cfg, start_sampler=False)
    assert {r.tenant for r in b.collect()} == {"shop"}


def test_reports_carry_disk_reads_per_second_and_unknown_stays_none(tmp_path):
    root = v2_tree(tmp_path)
    stat = root / "web" / "io.stat"
    stat.write_text("8:0 rbytes=1000 wbytes=7 rios=1 wios=1 dbytes=0 dios=0\n")
    b = backend_for(root)
    b.collect()
    stat.write_text(f"8:0 rbytes={1000 + 6 * MiB} wbytes=7 rios=9 wios=1 dbytes=0 dios=0\n"
                    f"8:16 rbytes={2 * MiB} wbytes=0 rios=3 wios=0 dbytes=0 dios=0\n")
    reports = {r.tenant: r for r in b.collect()}
    web = reports["web"]
    assert web.read_bytes_per_s * web.interval_s == pytest.approx(8 * MiB)
    assert reports["db"].read_bytes_per_s is None       # no io.stat: not known
    stat.write_text("8:0 rbytes=5 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n")
    assert {r.tenant: r for r in b.collect()}["web"].read_bytes_per_s is None  # went back


def test_the_node_says_its_disk_bandwidth_and_cores(tmp_path):
    root = v2_tree(tmp_path)
    info = backend_for(root).info()
    assert info.disk_read_bytes_per_s == 0.0         # no figure, no throttle
    assert info.cores == len(os.sched_getaffinity(0))
    # an emulated host: the root's own read throttle is its disk
    (root / "io.max").write_text("8:0 rbps=2097152 wbps=max riops=max wiops=max\n"
                                 "8:16 rbps=max wbps=max riops=max wiops=max\n")
    assert backend_for(root).info().disk_read_bytes_per_s == 2097152
    info = backend_for(root, disk_read_bytes_per_s="200MiB/s", cores=2.5).info()
    assert (info.disk_read_bytes_per_s, info.cores) == (200 * MiB, 2.5)
    assert backend_for(root, disk_read_bytes_per_s="64MiB").info() \
        .disk_read_bytes_per_s == 64 * MiB


def test_config_errors_name_file_key_and_expectation(tmp_path):
    bad = tmp_path / "agent.yaml"
    for text, match in (
            ("roots: [/sys/fs/cgroup]\ncgroups: ['*']\nsampling: {rate: 2}\n",
             r"agent.yaml: sampling.rate: expected a number <= 1, got 2"),
            ("roots: []\ncgroups: ['*']\n", r"roots"),
            ("roots: [/x]\n", "at least one entry in `cgroups` or `tenants`"),
            ("roots: [/x]\ncgroups: [a]\nsafety: {floor: lots}\n", r"safety.floor: .*size"),
            ("roots: [/x]\ncgroups: [a]\ndisk_read_bytes_per_s: fast\n",
             r"disk_read_bytes_per_s: .*size"),
            ("roots: [/x]\ncgroups: [a]\ncores: 0\n", r"cores: expected a number > 0"),
            ("roots: [/x]\ncgroups: [a]\nintervall: 3\n", r"intervall"),
            ("roots: [/x\n", "not valid YAML")):
        bad.write_text(text)
        with pytest.raises(UserError, match=match):
            load_config(bad)
    with pytest.raises(UserError, match="no such config file"):
        load_config(tmp_path / "absent.yaml")


def test_shipped_example_configs_load():
    for path in sorted((REPO / "configs").glob("agent-*.yaml")):
        cfg = load_config(path)
        assert cfg.roots
    assert list((REPO / "configs").glob("agent-*.yaml"))


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = ""

    def do_GET(self):
        data = type(self).body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_prometheus_throughput_counter_rate_and_gauge():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        _Metrics.body = ("# TYPE app_requests counter\n"
                         'app_requests_total{route="/a"} 100\n'
                         'app_requests_total{route="/b"} 50\n'
                         "# TYPE app_qps gauge\napp_qps 42.5\n")
        assert scrape(url, "app_requests", {}) == 150
        assert scrape(url, "app_requests", {"route": "/a"}) == 100
        with pytest.raises(ThroughputError, match="no sample"):
            scrape(url, "app_requests", {"route": "/c"})
        spec = config_from_dict({"roots": ["/x"], "tenants": [{
            "name": "a", "cgroup": "a", "throughput": {
                "source": "prometheus", "url": url, "metric": "app_requests",
                "labels": {"route": "/a"}}}]}).tenants[0].throughput
        src = PrometheusSource(spec)
        assert src.read(10.0) is None           # first read: no rate yet, not 0
        assert "first read" in src.error
        _Metrics.body = _Metrics.body.replace('"/a"} 100', '"/a"} 300')
        assert src.read(12.0) == pytest.approx(100.0)
        gauge = spec.model_copy(update={"metric": "app_qps", "kind": "gauge", "labels": {}})
        assert PrometheusSource(gauge).read(1.0) == 42.5
    finally:
        server.shutdown()
    # an unreachable source is logged and reads as unknown (never 0, which
    # would read as a starving tenant), and never raises
    down = PrometheusSource(spec)
    assert down.read(20.0) is None and down.error


def test_cache_ext_detection_reads_btf_type_names(tmp_path):
    fake = tmp_path / "vmlinux"
    fake.write_bytes(b"\x9f\xeb\x01\x00" + b"\x00task_struct\x00cache_ext_ops\x00")
    assert kernel_has_cache_ext(fake)
    fake.write_bytes(b"\x9f\xeb\x01\x00" + b"\x00task_struct\x00cache_ext_opsx\x00")
    assert not kernel_has_cache_ext(fake)
    assert not kernel_has_cache_ext(tmp_path / "absent")


def test_the_kernel_default_policy_follows_lru_gen(tmp_path):
    f = tmp_path / "enabled"
    for text, want in (("0x0007\n", "mglru"), ("0x0001\n", "mglru"), ("0x0000\n", "linux"),
                       ("y\n", "linux")):
        f.write_text(text)
        assert kernel_default_policy(f) == want, text
    assert kernel_default_policy(tmp_path / "absent") == "linux"     # no MGLRU in the kernel


def test_curve_shift_by_non_file_memory():
    c = MRC([100, 200], [0.5, 0.2], meta={})
    s = shift_by_anon(c, 50)
    assert s.meta["anon_offset_pages"] == 50
    assert s.at(150) == pytest.approx(0.5) and s.at(250) == pytest.approx(0.2)
    assert s.at(50) == 1.0        # a limit that only holds the anonymous memory


def test_window_subtraction_gives_the_later_accesses_curve():
    rng = np.random.default_rng(3)
    first = rng.integers(0, 1000, 20_000).astype(np.uint64)     # cold start included
    later = rng.integers(0, 1000, 30_000).astype(np.uint64)
    b = make_builder(rate=1.0)
    b.feed(first)
    early = b.snapshot()
    b.feed(later)
    total = b.snapshot()
    only_later = subtract_window(total, 50_000, early, 20_000)[0]
    # the later accesses over a warm stack: uniform over 1000 keys, so an
    # LRU of s pages misses about 1 - s/1000 and there are no cold misses
    for s in (200, 500, 800):
        assert only_later.at(s) == pytest.approx(1 - s / 1000, abs=0.03)
    assert only_later.at(1000) < 0.01 < total[0].at(1000)


def test_agent_builder_matches_an_exact_lru_simulation():
    from lru_oracle import naive_lru_miss_ratio
    rng = np.random.default_rng(7)
    keys = (rng.zipf(1.3, 30_000) % 3000).astype(np.uint64)
    b = make_builder(rate=1.0)
    b.feed(keys, total_accesses=len(keys))
    curve = b.snapshot()[0]
    # at the curve's own points (between them it interpolates)
    sizes = [int(s) for s in curve.sizes
             if 8 <= s <= 12 or 90 <= s <= 110 or 900 <= s <= 1100]
    assert len(sizes) >= 3
    for size in sizes:
        assert curve.at(size) == pytest.approx(naive_lru_miss_ratio(keys.tolist(), size),
                                               abs=1e-9), size


def run_cli(*args, user=None):
    cmd = [str(REPO / ".venv" / "bin" / "cachepilot"), *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_profile_bad_input_is_one_line():
    r = run_cli("profile", "--cgroup", "/definitely/not/here", "--duration", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr
    r = run_cli("profile", "--cgroup", "/tmp", "--rate", "3")
    assert r.returncode == 2 and "--rate" in r.stderr and "Traceback" not in r.stderr


def test_agent_bad_config_is_one_line(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text("roots: [/nope]\ncgroups: ['*']\ninterval_s: -1\n")
    r = run_cli("agent", "--config", str(cfg), "--intervals", "1")
    assert r.returncode == 2 and "interval_s" in r.stderr and "Traceback" not in r.stderr


def test_without_root_the_agent_names_what_is_missing_and_runs_stats_only():
    import shutil
    import tempfile
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to an unprivileged user")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv is not installed")
    # pytest's own tmp folders are private to root; this one is not
    base = Path(tempfile.mkdtemp(prefix="cp_nonroot_"))
    try:
        root = v2_tree(base)
        for p in [base, *base.rglob("*")]:
            p.chmod(0o777 if p.is_dir() else 0o666)
        cfg = base / "a.yaml"
        cfg.write_text(f"roots: [{root}]\ncgroups: ['*']\ninterval_s: 0.2\n"
                       "prometheus: {port: 0}\n")
        cfg.chmod(0o644)
        out = base / "reports.jsonl"
        r = run_cli("agent", "--config", str(cfg), "--intervals", "2", "--reports", str(out),
                    user=65534)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        assert "stats-only" in r.stderr and "not running as root" in r.stderr
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert len(lines) == 2
        assert {rep["tenant"] for rep in lines[-1]["reports"]} == {"web", "db"}
        r = run_cli("profile", "--cgroup", str(root / "web"), "--duration", "0.2", user=65534)
        assert r.returncode == 0 and "not running as root" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        shutil.rmtree(base)


def test_agent_serves_prometheus_metrics_while_it_runs(tmp_path):
    import socket
    import time
    import urllib.request
    root = v2_tree(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "a.yaml"
    cfg.write_text(f"roots: [{root}]\ncgroups: ['*']\ninterval_s: 0.3\n"
                   f"prometheus: {{address: 127.0.0.1, port: {port}}}\n")
    proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "cachepilot"), "agent",
                             "--config", str(cfg), "--intervals", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                if 'cachepilot_cgroup_limit_bytes{cgroup=' in text:
                    break
            except OSError:
                pass
            time.sleep(0.2)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert any(line.startswith("cachepilot_cgroup_limit_bytes{") and 'tenant="web"' in line
               and float(line.split()[-1]) == 512 * MiB for line in text.splitlines()), text
    assert "cachepilot_agent_cpu_seconds" in text
    assert "Traceback" not in err


def test_agent_follows_a_controller_over_tls_with_a_token(tmp_path):
    import time
    from cachepilot.controller.service import serve
    sys.path.insert(0, str(Path(__file__).parent))
    from grpc_fixtures import TOKEN, EchoEngine, small_config

    cfg = small_config(tmp_path)
    engine = EchoEngine({"n1-t0": (40 * MiB, "fifo")})
    served = serve(cfg, engine=engine)
    root = tmp_path / "tenants"
    for name in ("n1-t0", "n1-t1"):
        make_v2(root / name, current=20 * MiB, file=16 * MiB, anon=1 * MiB)
    (tmp_path / "token").write_text(TOKEN + "\n")
    agent_cfg = tmp_path / "agent.yaml"
    agent_cfg.write_text(
        f"node_id: n1\nroots: [{root}]\ninterval_s: 0.3\n"
        f"memory: 64MiB\nprometheus: {{port: 0}}\n"
        f"safety: {{floor: 16MiB, anon_margin: 4MiB}}\n"
        f"controller: {{address: 'localhost:{served.port}', token_file: token, "
        f"ca_file: {cfg.controller.tls_ca}}}\n")
    try:
        r = run_cli("agent", "--config", str(agent_cfg), "--intervals", "4")
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        # the controller saw the node's reports and the agent applied its answer
        assert engine.calls and engine.calls[0][0] == "n1"
        assert sorted(engine.calls[-1][1]) == ["n1-t0", "n1-t1"]
        assert (root / "n1-t0" / "memory.max").read_text() == str(40 * MiB)
        rec = served.controller.registry.nodes["n1"]
        assert rec.tenants["n1-t0"].limit_bytes == 40 * MiB
    finally:
        served.stop(0)


def test_access_batch_orders_by_time_and_interpolates_positions():
    from cachepilot.agent.sampler import access_batch
    from cachepilot.models.traces.records import RECORD_DTYPE
    recs = np.zeros(6, RECORD_DTYPE)
    recs["key"] = [10, 11, 12, 13, 14, 15]
    recs["time_ns"] = [1_500, 1_100, 1_100, 1_900, 1_000, 1_950]
    recs["op"] = [0, 0, 0, 0, 1, 0]            # an insert is not an access
    recs["tid"] = [7, 8, 9, 7, 7, 7]
    keys, tids, pos = access_batch(recs, 1_000, 2_000, 100)
    # time order (ties keep their order), the insert dropped
    assert keys.tolist() == [11, 12, 10, 13, 15] and tids.tolist() == [8, 9, 7, 7, 7]
    # 10 % of the way -> position 10; the same instant -> the next one
    assert pos.tolist() == [10, 11, 50, 90, 95]
    # more records than counted accesses (the counters lag): still distinct
    # positions within the batch
    keys, _, pos = access_batch(recs, 1_000, 2_000, 2)
    assert pos.tolist() == [0, 1, 2, 3, 4]
    assert len(access_batch(None, 0, 1, 10)[0]) == 0


def test_an_agent_behind_by_intervals_skips_them_instead_of_running_them_back_to_back():
    from cachepilot.agent.cli import _next_interval
    assert _next_interval(10.0, 1.0, 10.5) == 11.0        # on time
    assert _next_interval(10.0, 1.0, 11.2) == 12.0        # late within the next one
    # stopped for 6.5 s: the next interval ends one interval from now's
    # grid point, not five back-to-back reports
    nxt = _next_interval(10.0, 1.0, 16.5)
    assert 16.5 < nxt <= 17.5


def test_max_step_bounds_all_the_writes_of_one_interval(tmp_path, monkeypatch):
    # make chaos: an agent resumed after SIGSTOP got the directive it had
    # missed and the next one 0.3 s apart, and wrote both: 145 -> 81 ->
    # 17 MiB, two steps of 64 MiB inside one interval
    import cachepilot.agent.backends.linux as linux
    root = v2_tree(tmp_path)
    cfg = config_from_dict({"roots": [str(root)], "cgroups": ["*"], "memory": "8GiB",
                            "interval_s": 2.0,
                            "safety": {"floor": "64MiB", "anon_margin": "32MiB",
                                       "max_step": "64MiB"}})
    b = LinuxBackend(cfg, start_sampler=False)
    clock = [1000.0]
    monkeypatch.setattr(linux.time, "monotonic", lambda: clock[0])
    limit = root / "web" / "memory.max"

    def apply(mib):
        r = b.apply([Directive("web", mib * MiB, "linux")])[0]
        assert r.ok, r.message
        return int(limit.read_text()) // MiB

    assert apply(300) == 448                  # 512 - 64
    clock[0] += 0.3
    assert apply(300) == 448                  # the same interval: no further
    clock[0] += 0.9                           # the next interval
    assert apply(300) == 384
    clock[0] += 1.0
    assert apply(420) == 420                  # back up, within the step
    clock[0] += 0.2
    assert apply(500) == 448                  # 384 + 64 from where the interval began


class _QuietSampler:
    """A sampler that watches and counts nothing: the builders report
    their (empty) curves, which is all the meta below needs."""
    def watch(self, cgroup_id, threshold): pass
    def unwatch(self, cgroup_id): pass
    def counters(self): return 0, {}
    def drain(self, cgroup_id=None): return {}
    def sketches(self): return {}
    def close(self): pass


@pytest.mark.parametrize("measured", [True, False])
def test_measured_hook_costs_go_out_on_each_policys_curves(tmp_path, monkeypatch, measured):
    # the start-up measurement (agent/hookcost.py) reaches the controller
    # only as meta on each report's curves: per cached read and per miss,
    # the kernel's own policy at 0, a policy without a figure without one,
    # and a measurement that fails leaves every curve without them
    from cachepilot.agent import hookcost

    def measure(actuator, root, policies, folder):
        if not measured:
            raise hookcost.CalibrationError("the scratch cgroup could not be made")
        return hookcost.HookCosts(ns_per_access={"fifo": 250.0, "s3fifo": 420.0},
                                  baseline_ns=9000.0, failed={"lfu": "refused"},
                                  ns_per_miss={"s3fifo": 12000.0}, miss_baseline_ns=60000.0,
                                  miss_failed={"fifo": "child never ready"})

    monkeypatch.setattr(hookcost, "measure", measure)
    cfg = config_from_dict({"roots": [str(v2_tree(tmp_path))], "cgroups": ["*"],
                            "memory": "8GiB"})
    b = LinuxBackend(cfg, sampler=_QuietSampler())
    b.actuator = object()           # what _calibrate needs: a cache_ext kernel
    b._calibrate()
    reports = b.collect()
    assert {r.tenant for r in reports} == {"web", "db"}
    for r in reports:
        meta = {c.policy: c.meta for c in r.curves}
        assert {"fifo", "s3fifo", "lfu", b.default_policy} <= set(meta)
        if not measured:
            assert not any("hook_ns_per_access" in m or "hook_ns_per_miss" in m
                           for m in meta.values())
            continue
        assert meta["fifo"]["hook_ns_per_access"] == 250.0
        assert meta["s3fifo"]["hook_ns_per_access"] == 420.0
        assert meta["s3fifo"]["hook_ns_per_miss"] == 12000.0
        assert "hook_ns_per_miss" not in meta["fifo"]
        assert "hook_ns_per_access" not in meta["lfu"]
        assert meta[b.default_policy]["hook_ns_per_access"] == 0.0
        assert meta[b.default_policy]["hook_ns_per_miss"] == 0.0


def test_a_tenant_whose_operations_change_has_its_builders_count_the_new_phase(tmp_path):
    # the agent follows operations per page read by the rule the controller
    # uses (core/phase.py) and tells its builders at a jump, not at noise
    import types
    from cachepilot.core import phase

    calls = []

    class Builder:
        def new_phase(self):
            calls.append(self)

    first, handover = Builder(), Builder()
    w = types.SimpleNamespace(tenant="search", ops_per_access=None, ops_pending=None,
                              builder=first, builders=lambda: [first, handover])
    b = backend_for(v2_tree(tmp_path))
    for ops, acc in [(128, 2048), (130, 2000), (126, 2100), (None, 2000), (128, 0)]:
        b._follow_phase(w, ops, acc)          # 64 KiB passes, noise, no readings
    assert calls == [] and 0.05 < w.ops_per_access < 0.08
    b._follow_phase(w, 128, 8000)              # one interval of a cache refilling
    b._follow_phase(w, 128, 2000)              # and back: no phase
    assert calls == [] and 0.05 < w.ops_per_access < 0.08
    b._follow_phase(w, 2600, 2650)             # 4 KiB lookups
    assert calls == []                         # one reading is not yet a phase
    b._follow_phase(w, 2700, 2600)
    assert calls == [first, handover]
    assert w.ops_per_access == pytest.approx((2600 / 2650 * 2700 / 2600) ** 0.5)
    b._follow_phase(w, 2700, 2600)
    assert len(calls) == 2
    # the rule itself: two readings beyond PHASE_FACTOR either way, and
    # within it of each other, are a phase
    f = phase.PHASE_FACTOR
    ref, changed, pending = phase.follow(1.0, f * 1.01)
    assert (ref, changed, pending) == (1.0, False, f * 1.01)
    assert phase.follow(1.0, f * 1.02, pending=pending)[:2] == \
        (pytest.approx(f * (1.01 * 1.02) ** 0.5), True)
    assert not phase.follow(1.0, 1.0 / (f * 1.01), pending=pending)[1]   # the other way
    assert phase.follow(1.0, 1.0 / (f * 1.01), pending=1 / (f * 1.05))[1]
    assert phase.follow(1.0, f * 0.99, pending=pending) == \
        (pytest.approx(f ** 0.2 * 0.99 ** 0.2), False, None)
    assert phase.follow(None, 3.0) == (3.0, False, None)
    assert phase.follow(2.0, float("nan"), pending=5.0) == (2.0, False, 5.0)


def test_the_sampler_sorts_its_frames_by_cgroup_when_drained():
    """The reader thread keeps record frames as they came; drain() splits
    them by cgroup, each cgroup's records in their order, and drain(cg)
    takes one cgroup's and keeps the others' for the next drain."""
    import threading
    from cachepilot.agent.sampler import Sampler
    from cachepilot.models.traces.records import make_records
    s = Sampler.__new__(Sampler)
    s._lock, s._frames = threading.Condition(), []

    def frame(keys, cg):
        return make_records(np.array(keys, np.uint64), time_ns=np.array(keys, np.uint64),
                            cgroup_id=cg).tobytes()
    s._frames = [frame([1, 2], 7), frame([3], 9) + frame([4, 5], 7), frame([6], 9)]
    nine = s.drain(9)
    assert list(nine) == [9] and nine[9]["key"].tolist() == [3, 6]
    assert s.drain(11)[11].shape == (0,)                 # a cgroup with none: empty
    s._frames.append(frame([8], 9))
    rest = s.drain()
    assert sorted(rest) == [7, 9]
    assert rest[7]["key"].tolist() == [1, 2, 4, 5] and rest[9]["key"].tolist() == [8]
    assert s.drain() == {}
