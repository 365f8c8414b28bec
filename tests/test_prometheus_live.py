"""A real Prometheus (Debian's package, on loopback) scrapes a running agent
and a running controller, loads deploy/prometheus's rules, and fires the
alerts this setup can provoke for real: an SLO tenant starved (its cgroup
reports no throughput), then the agent killed (agent down) and so its node
lost.  Every metric the Grafana dashboard queries must be one the two
processes export.  `for:` durations are cut to seconds here; the rules'
own thresholds are checked by promtool's unit tests (test_deploy.py)."""
from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import TOKEN, small_config_dict  # noqa: E402
from test_cgroups_tree import make_v2  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CACHEPILOT = Path(sys.executable).parent / "cachepilot"
MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout=5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom: str, expr: str) -> list:
    doc = json.loads(get(f"{prom}/api/v1/query?query={urllib.parse.quote(expr)}"))
    return doc["data"]["result"]


def firing(prom: str) -> set[tuple[str, str]]:
    doc = json.loads(get(f"{prom}/api/v1/alerts"))
    return {(a["labels"]["alertname"], a["labels"].get("tenant", a["labels"].get("instance", "")))
            for a in doc["data"]["alerts"] if a["state"] == "firing"}


def wait_for(what, check, timeout=90.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as err:       # not listening yet
            last = err
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def exported_names(metrics_text: str) -> set[str]:
    """Metric names a /metrics page declares (its # TYPE lines), with the
    sample names a counter or histogram adds."""
    names = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "counter":
                names.add(name + "_total")
            if kind == "histogram":
                names |= {name + s for s in ("_bucket", "_sum", "_count")}
    return names


def dashboard_names() -> set[str]:
    dash = json.loads((DEPLOY / "grafana" / "cachepilot.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return {m for e in exprs for m in re.findall(r"\bcachepilot[a-zA-Z0-9_:]*", e)}


@pytest.fixture
def stack(tmp_path):
    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        pytest.skip("prometheus is not installed (make deps installs it)")
    ports = {k: free_port() for k in ("grpc", "ctl_metrics", "agent_metrics", "prom")}
    procs = []

    def start(cmd, name):
        log = open(tmp_path / f"{name}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        procs.append(p)
        return p

    # the controller: one node, two tenants with an SLO of 1,000 ops/s
    ctl = small_config_dict(tmp_path, listen=f"127.0.0.1:{ports['grpc']}",
                            metrics_port=ports["ctl_metrics"], interval_s=0.5, lost_after=3)
    (tmp_path / "controller.yaml").write_text(yaml.safe_dump(ctl))
    start([str(CACHEPILOT), "controller", "--config", "controller.yaml"], "controller")
    # the agent: the tenants' cgroups are a file tree laid out like cgroup
    # v2, so it reads them without touching the host's; it reports no
    # throughput for them, which starves their SLOs
    root = tmp_path / "tenants"
    for name in ("n1-t0", "n1-t1"):
        make_v2(root / name, current=20 * MiB, file=16 * MiB, anon=1 * MiB)
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump({
        "node_id": "n1", "roots": [str(root)], "interval_s": 0.5,
        "memory": "64MiB", "prometheus": {"address": "127.0.0.1", "port": ports["agent_metrics"]},
        "safety": {"floor": "16MiB", "anon_margin": "4MiB"},
        "controller": {"address": f"localhost:{ports['grpc']}", "token_file": "token",
                       "ca_file": ctl["controller"]["tls_ca"]}}))
    agent = start([str(CACHEPILOT), "agent", "--config", "agent.yaml"], "agent")
    # Prometheus with the shipped rules, `for:` cut to seconds
    rules = (DEPLOY / "prometheus" / "cachepilot-rules.yaml").read_text()
    rules = re.sub(r"for: \d+m", "for: 2s", rules)
    (tmp_path / "rules.yaml").write_text(rules)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {"job_name": "cachepilot-agent",
             "static_configs": [{"targets": [f"127.0.0.1:{ports['agent_metrics']}"]}]},
            {"job_name": "cachepilot-controller",
             "static_configs": [{"targets": [f"127.0.0.1:{ports['ctl_metrics']}"]}]}]}))
    start([prom_bin, "--config.file=prometheus.yml", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{ports['prom']}", "--log.level=warn"], "prometheus")
    try:
        yield {"prom": f"http://127.0.0.1:{ports['prom']}", "agent": agent, "ports": ports,
               "tmp": tmp_path}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_prometheus_scrapes_both_and_the_alerts_fire(stack):
    prom, ports = stack["prom"], stack["ports"]
    # both targets up, and their metrics in Prometheus
    wait_for("both targets up", lambda: {r["metric"]["job"] for r in query(prom, "up == 1")}
             >= {"cachepilot-agent", "cachepilot-controller"})
    wait_for("the agent's cgroup metrics", lambda: query(prom, "cachepilot_cgroup_limit_bytes"))
    wait_for("the controller's SLO metrics",
             lambda: query(prom, "cachepilot_slo_min_throughput > 0"))

    # every metric the dashboard queries is exported by one of the two, or
    # recorded by the shipped rules
    names = (exported_names(get(f"http://127.0.0.1:{ports['agent_metrics']}/metrics"))
             | exported_names(get(f"http://127.0.0.1:{ports['ctl_metrics']}/metrics")))
    recorded = {r["record"] for g in yaml.safe_load(
        (DEPLOY / "prometheus" / "cachepilot-rules.yaml").read_text())["groups"]
        for r in g["rules"] if "record" in r}
    used = dashboard_names()
    assert used and used <= names | recorded, used - names - recorded

    # the starved SLOs fire
    wait_for("CachepilotSLOMissed for both tenants", lambda: {
        ("CachepilotSLOMissed", "n1-t0"), ("CachepilotSLOMissed", "n1-t1")} <= firing(prom))
    assert not any(a == "CachepilotAgentDown" for a, _ in firing(prom))

    # the agent killed: it is down, and its node is lost
    stack["agent"].send_signal(signal.SIGKILL)
    stack["agent"].wait(timeout=10)
    wait_for("CachepilotAgentDown", lambda: any(a == "CachepilotAgentDown"
                                               for a, _ in firing(prom)))
    wait_for("CachepilotNodeLost", lambda: any(a == "CachepilotNodeLost"
                                              for a, _ in firing(prom)))
