"""Several sim agent processes against one controller process over real
sockets: on loopback, and (as root) each agent in its own network namespace
with its own address.  The controller is killed mid-run (limits must stay)
and restarted (state rebuilt from reports; no node's limits move by more
than the configured step in one interval); finally an agent is killed:
its node is marked lost and its memory leaves the pool."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import TOKEN, make_cert  # noqa: E402

PY = sys.executable
NODES = ("n1", "n2", "n3")
MEMORY = 32 << 20
STEP = 0.1
PACE = 0.25


def write_config(tmp: Path, listen: str, ips) -> Path:
    key, cert = make_cert(tmp, ips)
    tenants = []
    for n in NODES:
        tenants += [
            {"name": f"{n}-hot", "node": n, "slo": {"min_throughput": 40000}, "priority": 2,
             "policies": ["lru", "fifo"], "initial_policy": "lru",
             "workload": {"phases": [{"kind": "zipf", "skew": 0.9, "footprint": "32MiB"}],
                          "accesses_per_interval": 3000,
                          "service": {"concurrency": 8}}},
            {"name": f"{n}-flat", "node": n, "policies": ["lru", "fifo"], "initial_policy": "lru",
             "workload": {"phases": [{"kind": "uniform", "footprint": "64MiB"}],
                          "accesses_per_interval": 3000}},
        ]
    cfg = {"control": {"interval_s": PACE, "max_step_fraction": STEP, "warmup_intervals": 2,
                       "anon_margin_bytes": 0, "lost_after_intervals": 4},
           "controller": {"listen": listen, "tls_cert": str(cert), "tls_key": str(key),
                          "tls_ca": str(cert), "token": TOKEN},
           "nodes": [{"name": n, "memory_bytes": MEMORY, "seed": i + 1}
                     for i, n in enumerate(NODES)],
           "tenants": tenants}
    path = tmp / "multinode.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_controller(cfg: Path, listen: str, log: Path):
    proc = subprocess.Popen([PY, "-m", "cachepilot", "controller", "--config", str(cfg),
                             "--listen", listen], stdout=open(log, "a"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while "controller listening" not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "controller did not start"
        time.sleep(0.1)
    return proc


def start_agent(cfg: Path, node: str, target: str, status: Path, log: Path, netns=None):
    cmd = [PY, "-m", "cachepilot.simnode", "--config", str(cfg), "--node", node,
           "--target", target, "--pace", str(PACE), "--status-file", str(status)]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    return subprocess.Popen(cmd, stdout=open(log, "a"), stderr=subprocess.STDOUT)


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass        # a line being written right now
    return out


def wait_for(cond, what, timeout=40.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def admin(cfg: Path, target: str, *action) -> dict:
    out = subprocess.run([PY, "-m", "cachepilot", "admin", "--config", str(cfg),
                          "--target", target, "--json", *action],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def scenario(tmp: Path, listen: str, target: str, ips, agent_netns=None):
    cfg = write_config(tmp, listen, ips)
    status = {n: tmp / f"{n}.jsonl" for n in NODES}
    procs = []
    ctl = start_controller(cfg, listen, tmp / "controller.log")
    try:
        for i, n in enumerate(NODES):
            ns = agent_netns[i] if agent_netns else None
            procs.append(start_agent(cfg, n, target, status[n], tmp / f"{n}.log", ns))

        def connected_for(k):
            return all(sum(r["connected"] for r in lines(status[n])) >= k for n in NODES)
        wait_for(lambda: connected_for(6), "all agents to report")
        st = admin(cfg, target, "status")
        assert sorted(n["node_id"] for n in st["nodes"]) == list(NODES)
        assert all(n["state"] == "reporting" for n in st["nodes"])
        assert st["tls"] is True
        peers = {n["node_id"]: n["peer"] for n in st["nodes"]}
        # The controller is steering: some limit has left the equal split.
        wait_for(lambda: any(r["tenants"][t]["limit_bytes"] != MEMORY // 2
                             for n in NODES for r in lines(status[n]) for t in r["tenants"]),
                 "the controller to move a limit")

        # Kill the controller outright: the agents keep their limits.
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        killed_at = {n: len(lines(status[n])) for n in NODES}
        wait_for(lambda: all(sum(not r["connected"] for r in lines(status[n])[killed_at[n]:])
                             >= 4 for n in NODES), "agents to notice the controller is gone")
        for n in NODES:
            rows = lines(status[n])
            last_ok = [r for r in rows[:killed_at[n]] if r["connected"]][-1]
            away = [r for r in rows[killed_at[n]:] if not r["connected"]]
            assert away, n
            for r in away:
                assert r["tenants"] == last_ok["tenants"], (n, r)

        # Restart: agents re-register and the new controller's view is
        # rebuilt from their reports.
        restarted_at = {n: len(lines(status[n])) for n in NODES}
        ctl = start_controller(cfg, listen, tmp / "controller.log")
        wait_for(lambda: all(sum(r["connected"] for r in lines(status[n])[restarted_at[n]:])
                             >= 6 for n in NODES), "agents to resynchronise")
        view = {t["name"]: t for t in admin(cfg, target, "tenants")["tenants"]}
        for n in NODES:
            now = lines(status[n])[-1]["tenants"]
            for t, cur in now.items():
                # Give or take the one interval in flight.
                assert abs(int(view[t].get("limit_bytes", 0)) - cur["limit_bytes"]) \
                    <= STEP * MEMORY + 4096, (t, view[t], cur)
        # No limit moved by more than the step in one interval, and no more
        # than the step of memory changed hands, across the whole run
        # including the restart.
        step = STEP * MEMORY + 4096 * 2
        for n in NODES:
            rows = lines(status[n])
            for a, b in zip(rows, rows[1:]):
                delta = {t: b["tenants"][t]["limit_bytes"] - a["tenants"][t]["limit_bytes"]
                         for t in a["tenants"]}
                assert all(abs(d) <= step for d in delta.values()), (n, a, b)
                assert sum(d for d in delta.values() if d > 0) <= step, (n, a, b)

        # An agent that dies is marked lost and its memory leaves the pool.
        assert admin(cfg, target, "status")["pool_bytes"] == str(len(NODES) * MEMORY)
        procs[-1].kill()
        procs[-1].wait(10)

        def lost():
            st = admin(cfg, target, "status")
            return {n["node_id"]: n["state"] for n in st["nodes"]}[NODES[-1]] == "lost"
        wait_for(lost, "the dead agent's node to be marked lost")
        st = admin(cfg, target, "status")
        assert st["pool_bytes"] == str((len(NODES) - 1) * MEMORY)
        assert {n["node_id"]: n["state"] for n in st["nodes"]} == \
            {**{n: "reporting" for n in NODES[:-1]}, NODES[-1]: "lost"}
        return peers
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if ctl.poll() is None:
            ctl.terminate()
            ctl.wait(10)


@pytest.mark.slow
def test_three_agent_processes_on_loopback_survive_a_controller_restart(tmp_path):
    port = free_port()
    peers = scenario(tmp_path, f"127.0.0.1:{port}", f"localhost:{port}", ["127.0.0.1"])
    assert all("127.0.0.1" in p for p in peers.values()), peers


def _root_with_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "the ip tool (iproute2) is missing"
    return None


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(_root_with_netns() is not None, reason=str(_root_with_netns()))
def test_three_agents_in_their_own_network_namespaces(tmp_path):
    tag = f"cp{os.getpid() % 100000}"
    bridge = f"{tag}br"
    # A private range that exists only on the bridge and namespaces made here.
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    host_ip = f"{subnet}.1"
    namespaces, veths = [], []

    def sh(*cmd):
        subprocess.run(cmd, check=True, capture_output=True)
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{host_ip}/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for i, _ in enumerate(NODES):
            ns, host_end, ns_end = f"{tag}n{i}", f"{tag}h{i}", f"{tag}p{i}"
            sh("ip", "netns", "add", ns)
            namespaces.append(ns)
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            veths.append(host_end)
            sh("ip", "link", "set", ns_end, "netns", ns)
            sh("ip", "link", "set", host_end, "master", bridge)
            sh("ip", "link", "set", host_end, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{subnet}.{10 + i}/24",
               "dev", ns_end)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        port = free_port()
        peers = scenario(tmp_path, f"{host_ip}:{port}", f"{host_ip}:{port}", [host_ip],
                         agent_netns=namespaces)
        for i, n in enumerate(NODES):
            assert f"{subnet}.{10 + i}:" in peers[n], peers
    finally:
        for v in veths:
            subprocess.run(["ip", "link", "del", v], capture_output=True)
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
