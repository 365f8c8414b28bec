"""A real Prometheus (Debian's package, on loopback) scrapes running agents
and controllers, loads deploy/prometheus's rules, and every alert fires for
real:

  * an SLO tenant starved (its cgroup reports no throughput), then the
    agent killed (agent down) and so its node lost;
  * an agent sampling fio in a real memory cgroup through a one-page ring
    buffer drops records; an agent whose sampler cannot load (its BPF
    capabilities dropped) runs stats-only; a controller's watchdog reverts
    a policy switch that missed far more than its curve promised.

Every metric the Grafana dashboard queries must be one the processes
export.  `for:` durations are cut to seconds here; the rules' own
thresholds are checked by promtool's unit tests (test_deploy.py)."""
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


class Procs:
    """Processes a test starts, each logging to tmp/NAME.log; stop() ends
    them (TERM, then KILL)."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def start(self, cmd, name, **kw):
        log = open(self.tmp / f"{name}.log", "w")
        p = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                             cwd=self.tmp, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def start_prometheus(procs: Procs, jobs: dict[str, list[int]], port: int) -> str:
    """Debian's Prometheus on 127.0.0.1:port, scraping every second the
    loopback ports of each job, with the shipped rules and their `for:`
    cut to seconds.  Returns its URL."""
    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        pytest.skip("prometheus is not installed (make deps installs it)")
    tmp = procs.tmp
    rules = (DEPLOY / "prometheus" / "cachepilot-rules.yaml").read_text()
    rules = re.sub(r"for: \d+m", "for: 2s", rules)
    (tmp / "rules.yaml").write_text(rules)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}"
                                                               for p in ports]}]}
            for job, ports in jobs.items()]}))
    procs.start([prom_bin, "--config.file=prometheus.yml",
                 f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], "prometheus")
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def stack(tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (make deps installs it)")
    ports = {k: free_port() for k in ("grpc", "ctl_metrics", "agent_metrics", "prom")}
    procs = Procs(tmp_path)
    try:
        yield stack_of(tmp_path, procs, ports)
    finally:
        procs.stop()


def stack_of(tmp_path, procs, ports) -> dict:
    # the controller: one node, two tenants with an SLO of 1,000 ops/s
    ctl = small_config_dict(tmp_path, listen=f"127.0.0.1:{ports['grpc']}",
                            metrics_port=ports["ctl_metrics"], interval_s=0.5, lost_after=3)
    (tmp_path / "controller.yaml").write_text(yaml.safe_dump(ctl))
    procs.start([CACHEPILOT, "controller", "--config", "controller.yaml"], "controller")
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
    agent = procs.start([CACHEPILOT, "agent", "--config", "agent.yaml"], "agent")
    prom = start_prometheus(procs, {"cachepilot-agent": [ports["agent_metrics"]],
                                    "cachepilot-controller": [ports["ctl_metrics"]]},
                            ports["prom"])
    return {"prom": prom, "agent": agent, "ports": ports, "tmp": tmp_path}


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


def alerts(prom: str) -> list[dict]:
    """The labels of every firing alert."""
    doc = json.loads(get(f"{prom}/api/v1/alerts"))
    return [a["labels"] for a in doc["data"]["alerts"] if a["state"] == "firing"]


def setpriv_without_bpf() -> list[str]:
    """A prefix that runs a command as root without CAP_BPF, CAP_PERFMON and
    CAP_SYS_ADMIN (gone from its bounding and inheritable sets), as on a
    host or pod that grants the agent too little: the sampler cannot load."""
    drop = "-bpf,-perfmon,-sys_admin"
    return ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}"]


@pytest.fixture
def sampler_stack(tmp_path):
    """Three live sources of the remaining alerts, scraped by one Prometheus:
    an agent sampling fio in a real memory cgroup at rate 1 through a
    one-page ring buffer (it must drop records), an agent on the same
    cgroup whose sampler cannot load (no BPF capabilities: stats-only),
    and a controller whose watchdog reverts a policy switch
    (watchdog_revert_run.py)."""
    from cachepilot.agent.sampler import why_unavailable
    from cachepilot.agent.testbed import (SCRATCH, have, make_file, scratch_cgroup,
                                          v1_memory_available, v2_memory_root)
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (make deps installs it)")
    why = why_unavailable()
    if why:
        pytest.skip(f"the sampler cannot run here: {why}")
    root = Path("/sys/fs/cgroup/memory") if v1_memory_available() is None else v2_memory_root()
    if root is None or not have("fio") or not shutil.which("setpriv"):
        pytest.skip("needs a memory cgroup hierarchy, fio and setpriv")
    ports = {k: free_port() for k in ("drops", "stats", "ctl", "prom")}
    procs = Procs(tmp_path)
    data = make_file(SCRATCH / "prom-drops-32m.dat", 32 << 20)
    with scratch_cgroup("cp_promlive", root) as cg:
        try:
            yield sampler_stack_of(tmp_path, procs, ports, root, cg, data)
        finally:
            procs.stop()


def sampler_stack_of(tmp_path, procs, ports, root, cg, data) -> dict:
    from cachepilot.agent.testbed import in_cgroup
    procs.start(in_cgroup(cg, ["fio", "--name=r", f"--filename={data}", "--rw=randread",
                               "--bs=4k", "--time_based", "--runtime=300",
                               "--invalidate=0"]), "fio")

    def agent_config(name, port, ring_bytes):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({
            "node_id": name, "roots": [str(root)], "interval_s": 1.0,
            "tenants": [{"name": "reader", "cgroup": str(cg)}], "policies": ["lru"],
            "sampling": {"rate": 1.0, "ring_bytes": ring_bytes, "slices": 2},
            "prometheus": {"address": "127.0.0.1", "port": port}}))
        return [CACHEPILOT, "agent", "--config", f"{name}.yaml"]
    procs.start(agent_config("drops", ports["drops"], 4096), "agent-drops")
    procs.start(setpriv_without_bpf() + agent_config("stats", ports["stats"], 1 << 22),
                "agent-stats")
    procs.start([sys.executable, Path(__file__).parent / "watchdog_revert_run.py",
                 ports["ctl"], 0.5, tmp_path / "revert-go"], "revert")
    prom = start_prometheus(procs, {"cachepilot-agent": [ports["drops"], ports["stats"]],
                                    "cachepilot-controller": [ports["ctl"]]},
                            ports["prom"])
    return {"prom": prom, "ports": ports, "tmp": tmp_path}


def test_drops_stats_only_and_a_revert_fire_live(sampler_stack):
    prom, ports, tmp = sampler_stack["prom"], sampler_stack["ports"], sampler_stack["tmp"]
    drops_at, stats_at = f"127.0.0.1:{ports['drops']}", f"127.0.0.1:{ports['stats']}"
    wait_for("all three targets up", lambda: len(query(prom, "up == 1")) == 3)

    # the one-page ring buffer overflows: the sampler drops records, and
    # only the agent that runs one says so
    wait_for("CachepilotSamplerDropping from the sampling agent", lambda: any(
        a["alertname"] == "CachepilotSamplerDropping" and a["instance"] == drops_at
        and a["tenant"] == "reader" for a in alerts(prom)), timeout=120)
    drops = query(prom, 'cachepilot_sampler_total{kind="drops"}')
    by = {r["metric"]["instance"]: float(r["value"][1]) for r in drops}
    assert by[drops_at] > 0 and by.get(stats_at, 0) == 0, by

    # the agent without BPF capabilities runs stats-only, and says why
    wait_for("CachepilotAgentStatsOnly for the agent without BPF", lambda: any(
        a["alertname"] == "CachepilotAgentStatsOnly" and a["instance"] == stats_at
        for a in alerts(prom)))
    assert "stats-only" in (tmp / "agent-stats.log").read_text()
    assert not any(a["alertname"] == "CachepilotAgentStatsOnly" and a["instance"] == drops_at
                   for a in alerts(prom))

    # the watchdog undoes the lying policy's switch, counted from 0: the
    # run goes on only once Prometheus holds the counter at 0 (a first
    # sample taken after the revert would show no increase)
    wait_for("the revert counter scraped at 0", lambda: any(
        r["metric"].get("tenant") == "victim" and float(r["value"][1]) == 0
        for r in query(prom, "cachepilot_watchdog_reverts_total")))
    (tmp / "revert-go").touch()
    wait_for("CachepilotPolicyReverted for the victim", lambda: any(
        a["alertname"] == "CachepilotPolicyReverted" and a.get("tenant") == "victim"
        for a in alerts(prom)), timeout=120)
    done = wait_for("the sim run's end", lambda: re.search(
        r"done: \d+ intervals, (\d+) watchdog revert", (tmp / "revert.log").read_text()))
    assert int(done.group(1)) >= 1
    reverts = {r["metric"]["tenant"]: float(r["value"][1])
               for r in query(prom, "cachepilot_watchdog_reverts_total")}
    assert reverts["victim"] >= 1 and reverts["neighbour"] == 0, reverts
