#!/usr/bin/env python3
"""A controller for fleets: nodes x tenants over real gRPC until one interval no longer suffices.

Synthetic agents -- many nodes per worker process, on grpc.aio -- register
with the controller replicas and stream real ReportRequests (TLS and a
token, on loopback) to them every control interval, each node at its own
offset within the interval (real agents are unsynchronised).  A node's
tenants are the controller benchmark's synthetic ones
(controller/engine/synthetic.py): a true miss-ratio curve per allowed
policy (~50 points), built once; every interval a node reports the miss
ratio and throughput its curves imply at the limit and policy the last
directives gave it (closed loop), with a little noise, by editing the
numbers of the protobuf message it keeps -- no curve is rebuilt.

Every node knows the whole list of replica addresses and starts at replica
(node index mod R).  A replica that does not own a node answers with
FAILED_PRECONDITION and trailing metadata `cachepilot-owner: host:port`;
the node then registers with the owner.  An unreachable replica
(UNAVAILABLE, DEADLINE_EXCEEDED) makes the node go on to the next address.

Per step (nodes x tenants), after the warm-up intervals:
    round_s             per interval, from the interval's start until the
                        last node's report of that interval was answered
                        (median over the measured intervals; p95 and max
                        too).  Nodes report spread over the interval, the
                        last at (N-1)/N of it, so round_s is about the
                        interval plus the last report's latency.
    late                reports not answered within one interval of when
                        they were due (the node's next report was due
                        first), and unanswered ones
    cpu_s_per_interval  CPU seconds (utime+stime, /proc/PID/stat) of the
                        replicas per interval: their sum, and per replica
    agent_cpu_...       the same for the agent worker processes, which
                        share this machine's cores with the replicas
A step fits when no report of a measured interval is late (answered
more than an interval after it was due), its rounds end within the
interval (the median round within ROUND_SLACK x interval: the last
node reports at the interval's very end, and its answer takes a moment)
and the replicas' CPU per interval is below cores x interval.  The ramp
stops after the first step that does not fit.

With --failover-nodes N (default 200), after the ramp two replicas on
etcd serve N nodes and the leader is SIGKILLed a third into the first
measured interval: how long until another leads and until its nodes are
answered again.  The leader's consolidation plan first runs
plan_every_intervals (30) intervals after start, 300 s at the default
10 s interval: later than any measured interval, so its CPU is in no
step's figures.

Writes experiments/results/bench_fleet.json and .png.
Usage: experiments/bench_fleet.py [--nodes 100,250,...] [--tenants 20]
       [--interval 10] [--intervals 3] [--warmup 1] [--replicas 1]
       [--agent-procs 2] [--connections per-node|shared] [--points 50]
       [--seed 1] [--no-stop] [--keep] [--py-spy PATH] [--out PATH]
       [--failover-nodes 200]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_lib import CLI, RESULTS, cpu_seconds, free_port, make_tls, stop  # noqa: E402
from cachepilot.protocol.channel import OWNER_HEADER  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from etcd_fixture import EtcdServer  # noqa: E402  (a loopback etcd, as the tests start it)

POLICIES = ["linux", "lru", "mru", "s3fifo", "lfu"]
NODE_BYTES = 64 << 30
PAGE = 4096
DEFAULT_NODES = (100, 250, 500, 1000, 2000, 3500, 5000)
PROJECT_NODES = 50_000
STEP_FRACTION = 0.1                 # the replicas' max_step_fraction
MAX_STEP = int(STEP_FRACTION * NODE_BYTES)
# A replica is one Python process: its decision rounds hold the GIL, so it
# gets about one core however many the host has; the projection keeps it
# below this share of that core.
REPLICA_CORES = 1.0
TARGET_UTILISATION = 0.75
ROUND_SLACK = 1.1           # a round may end this many intervals after it began


# -- the fleet: every process derives it the same way from (seed, node) -------

def node_name(i: int) -> str:
    return f"n{i:05d}"


def fleet_tenants(seed: int, node: int, tenants: int, points: int):
    """The tenants of node `node`: [(SynthTenant, allowed policies, SLO or
    None)].  Each may run the kernel's policy and one to three others;
    every third has an SLO near what an equal share gives it."""
    from cachepilot.controller.engine.synthetic import random_tenant
    rng = np.random.default_rng([seed, node])
    node_pages = NODE_BYTES / PAGE
    share_pages = node_pages / tenants
    out = []
    for j in range(tenants):
        others = rng.choice(POLICIES[1:], size=int(rng.integers(1, 4)), replace=False)
        allowed = ["linux", *sorted(str(p) for p in others)]
        st = random_tenant(rng, f"{node_name(node)}-t{j:02d}", allowed, node_pages, points)
        slo = None
        if j % 3 == 0:
            m = float(st.curves["linux"].at(share_pages * rng.uniform(0.5, 1.2)))
            slo = round(st.throughput(m), 1)
        out.append((st, allowed, slo))
    return out


def fleet_config(nodes: int, tenants: int, interval: float, seed: int, points: int,
                 tls: tuple[Path, Path, Path], state_path: Path) -> dict:
    """One replica's controller config: every node, every tenant."""
    key, cert, token = tls
    tenant_specs = []
    for i in range(nodes):
        for j, (st, allowed, slo) in enumerate(fleet_tenants(seed, i, tenants, points)):
            spec = {"name": st.name, "node": node_name(i), "policies": allowed,
                    "initial_policy": "linux", "priority": (i + j) % 3}
            if slo is not None:
                spec["slo"] = {"min_throughput": slo}
            tenant_specs.append(spec)
    return {
        "control": {"interval_s": interval, "max_step_fraction": STEP_FRACTION,
                    "autopilot_k": 3},
        "controller": {"listen": "127.0.0.1:0", "tls_cert": str(cert), "tls_key": str(key),
                       "tls_ca": str(cert), "token_file": str(token),
                       "state_path": str(state_path)},
        "nodes": [{"name": node_name(i), "memory_bytes": NODE_BYTES, "backend": "sim",
                   "policies": POLICIES} for i in range(nodes)],
        "tenants": tenant_specs,
    }


# -- the agents (worker processes) ----------------------------------------------

class SynthNode:
    """One node: its registration, the ReportRequest it keeps and edits
    every interval, and where it is connected."""

    def __init__(self, index: int, spec: dict):
        from cachepilot.protocol import cachepilot_pb2 as pb
        from cachepilot.protocol import wire
        from cachepilot.protocol.types import NodeInfo
        self.pb = pb
        self.index = index
        self.name = node_name(index)
        self.addresses = list(spec["addresses"])
        self.address = self.addresses[index % len(self.addresses)]
        self.offset = spec["interval"] * index / spec["nodes_total"]
        self.session: str | None = None
        self.seq = 0
        self.rng = random.Random(index)
        self.register_request = pb.RegisterRequest(node=wire.node_info_to_pb(
            NodeInfo(self.name, NODE_BYTES, 0, True, POLICIES, "sim")))
        share = NODE_BYTES // spec["tenants"]
        self.tenants = []       # (synth tenant, curves by policy)
        reports = []
        for st, _allowed, _slo in fleet_tenants(spec["seed"], index, spec["tenants"],
                                                spec["points"]):
            reports.append(wire.report_to_pb(st.report(share, "linux", spec["interval"])))
            self.tenants.append(st)
        self.request = pb.ReportRequest(node_id=self.name, reports=reports)
        self.limit = {st.name: share for st in self.tenants}
        self.policy = {st.name: "linux" for st in self.tenants}
        self.curves = {st.name: st.curves for st in self.tenants}
        self.step_violations = 0            # directives moving a limit by more than the step

    def next_request(self):
        """The request for this interval: each tenant's observed miss ratio
        and throughput at its limit and policy now, +-2 % noise."""
        self.seq += 1
        req = self.request
        req.seq = self.seq
        req.session = self.session or ""
        for msg, st in zip(req.reports, self.tenants):
            limit, policy = self.limit[st.name], self.policy[st.name]
            m = float(st.curves[policy].at(limit / PAGE))
            thr = st.throughput(m) * (1.0 + self.rng.uniform(-0.02, 0.02))
            msg.limit_bytes = limit
            msg.usage_file_bytes = limit
            msg.policy = policy
            msg.miss_ratio = m
            msg.throughput = thr
            msg.accesses_per_s = thr
            msg.inserts_per_s = msg.removals_per_s = thr * m
        return req

    def apply(self, reply):
        """Take the directives (they apply from the next report on) and
        keep their results for the next request."""
        applied = []
        for d in reply.directives:
            if d.tenant not in self.limit:
                continue
            if abs(int(d.limit_bytes) - self.limit[d.tenant]) > MAX_STEP + PAGE:
                self.step_violations += 1
            self.limit[d.tenant] = min(int(d.limit_bytes), NODE_BYTES)
            ok_policy = d.policy in self.curves[d.tenant]
            if ok_policy:
                self.policy[d.tenant] = d.policy
            applied.append(self.pb.ApplyResult(
                tenant=d.tenant, applied_limit_bytes=self.limit[d.tenant],
                applied_policy=self.policy[d.tenant], ok=True,
                policy_refused=not ok_policy,
                policy_message="" if ok_policy else f"{d.policy}: not emulated here"))
        del self.request.applied[:]
        self.request.applied.extend(applied)


def owner_of(err) -> str | None:
    """The owner a replica names when it refuses a node it does not own:
    trailing metadata `cachepilot-owner`, which the controller always
    sends with the refusal (service.py, _check_owner), as real agents
    read it (agent/client.py).  None: no owner named."""
    try:
        for key, value in (err.trailing_metadata() or ()):
            if key == OWNER_HEADER and value:
                return value.decode() if isinstance(value, bytes) else str(value)
    except Exception:       # noqa: BLE001 -- no metadata is no owner
        pass
    return None


class Agents:
    """Drives a worker's share of the nodes on one event loop."""

    def __init__(self, spec: dict):
        import grpc
        from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
        from cachepilot.protocol.channel import token_metadata
        self.grpc = grpc
        self.pb_grpc = pb_grpc
        self.spec = spec
        self.interval = spec["interval"]
        self.timeout = spec.get("rpc_timeout_s") or max(5.0, 2 * self.interval)
        self.metadata = token_metadata(spec["token"])
        self.root_cert = Path(spec["cert"]).read_bytes() if spec.get("cert") else None
        self.per_node = spec.get("connections", "per-node") == "per-node"
        self.stubs: dict = {}           # (node or None, address) -> (channel, stub)
        self.nodes = [SynthNode(i, spec) for i in spec["nodes"]]
        self.counts = {"registrations": 0, "redirects": 0, "failovers": 0,
                       "reregistrations": 0, "errors": 0}
        self.errors: list[str] = []

    def stub(self, node: SynthNode):
        from cachepilot.protocol.channel import make_aio_channel
        key = (node.name if self.per_node else None, node.address)
        if key not in self.stubs:
            # per node: a connection of its own, as real agents have (grpc
            # would otherwise share one subchannel among equal channels)
            extra = [("grpc.use_local_subchannel_pool", 1)] if self.per_node else []
            ch = make_aio_channel(node.address, self.root_cert,
                                  insecure=self.root_cert is None, extra_options=extra)
            self.stubs[key] = (ch, self.pb_grpc.NodeStub(ch))
        return self.stubs[key][1]

    def _handle(self, node: SynthNode, err) -> bool:
        """Act on a failed call; False when retrying cannot help."""
        code = err.code()
        SC = self.grpc.StatusCode
        node.session = None
        if code == SC.FAILED_PRECONDITION:
            owner = owner_of(err)
            if owner and owner != node.address:
                node.address = owner
                self.counts["redirects"] += 1
            else:
                self.counts["reregistrations"] += 1     # unknown session, lost: again
            return True
        if code in (SC.UNAVAILABLE, SC.DEADLINE_EXCEEDED, SC.CANCELLED):
            try:
                i = node.addresses.index(node.address)
            except ValueError:
                i = -1
            node.address = node.addresses[(i + 1) % len(node.addresses)]
            self.counts["failovers"] += 1
            return True
        self.counts["errors"] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{node.name}: {code.name}: {err.details()}")
        return False

    async def register(self, node: SynthNode, attempts: int = 0) -> bool:
        tries = attempts or 2 * len(node.addresses) + 2
        for attempt in range(tries):
            try:
                reply = await self.stub(node).Register(node.register_request,
                                                       metadata=self.metadata,
                                                       timeout=self.timeout)
            except self.grpc.aio.AioRpcError as err:
                if not self._handle(node, err):
                    return False
                await asyncio.sleep(min(1.0, 0.05 * (attempt + 1)))
                continue
            node.session = reply.session
            self.counts["registrations"] += 1
            return True
        return False

    async def report(self, node: SynthNode) -> bool:
        """One interval's report, answered (True) or given up on."""
        req = node.next_request()
        for attempt in range(2 * len(node.addresses) + 2):
            if node.session is None:
                if not await self.register(node, attempts=1):
                    await asyncio.sleep(min(1.0, 0.05 * (attempt + 1)))
                    continue
                req = node.next_request()
            try:
                reply = await self.stub(node).Report(req, metadata=self.metadata,
                                                     timeout=self.timeout)
            except self.grpc.aio.AioRpcError as err:
                if not self._handle(node, err):
                    return False
                continue
            node.apply(reply)
            return True
        return False

    async def run_node(self, node: SynthNode, t0: float, intervals: int, log: list):
        for k in range(intervals):
            start = t0 + k * self.interval
            delay = start + node.offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.monotonic()
            ok = await self.report(node)
            done = time.monotonic()
            # (interval, node, due, sent, done) relative to the interval's start
            log.append((k, node.index, round(node.offset, 6), round(sent - start, 6),
                        round(done - start, 6) if ok else None))

    async def register_all(self, concurrency: int = 64):
        sem = asyncio.Semaphore(concurrency)

        async def one(n):
            async with sem:
                return await self.register(n)
        ok = await asyncio.gather(*(one(n) for n in self.nodes))
        return sum(ok)

    async def run(self, t0: float, intervals: int) -> list:
        log: list = []
        await asyncio.gather(*(self.run_node(n, t0, intervals, log) for n in self.nodes))
        return log

    async def close(self):
        for ch, _ in self.stubs.values():
            await ch.close()


async def agents_main(spec: dict, t0_source) -> dict:
    """Build the nodes, register them, wait for the start time (t0_source:
    a coroutine function returning the shared time.monotonic() start),
    report for spec["intervals_total"] intervals; the log and counts."""
    agents = Agents(spec)
    begun = time.monotonic()
    registered = await agents.register_all()
    register_s = time.monotonic() - begun
    t0 = await t0_source(registered)
    log = await agents.run(t0, spec["intervals_total"])
    await agents.close()
    agents.counts["step_violations"] = sum(n.step_violations for n in agents.nodes)
    return {"nodes": len(agents.nodes), "registered": registered, "register_s": register_s,
            "counts": agents.counts, "errors": agents.errors, "log": log}


def worker_main(spec_path: str) -> int:
    """A worker process: tells the parent `ready N` on stdout once its nodes
    are registered, reads the start time from stdin, writes its results."""
    spec = json.loads(Path(spec_path).read_text())

    async def t0_from_parent(registered):
        print(f"ready {registered}", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return float(line)
    result = asyncio.run(agents_main(spec, t0_from_parent))
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


# -- the replicas -------------------------------------------------------------------

def start_replicas(configs: list[Path], ports: list[int], work: Path, timeout: float):
    """Start one controller process per config and wait until each says it
    listens; (processes, seconds until all listened)."""
    procs = []
    begun = time.monotonic()
    for i, (cfg, port) in enumerate(zip(configs, ports)):
        log = open(work / f"replica-{i}.log", "w")
        procs.append(subprocess.Popen([*CLI, "controller", "--config", str(cfg),
                                       "--listen", f"127.0.0.1:{port}"],
                                      stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    deadline = begun + timeout
    for i, p in enumerate(procs):
        log = work / f"replica-{i}.log"
        while "controller listening on" not in log.read_text():
            if p.poll() is not None or time.monotonic() > deadline:
                stop(procs)
                raise RuntimeError(f"replica {i} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
    return procs, time.monotonic() - begun


def start_profiles(py_spy: str | None, pids, seconds: float, work: Path) -> list:
    """py-spy sampling each replica (every thread, without stopping it) for
    the measured window; [(process, collapsed-stacks file)]."""
    if not py_spy:
        return []
    out = []
    for i, pid in enumerate(pids):
        path = work / f"replica-{i}.pyspy.txt"
        out.append((subprocess.Popen([py_spy, "record", "--pid", str(pid), "--nonblocking",
                                      "--rate", "50", "--format", "raw", "--output",
                                      str(path), "--duration", str(max(1, int(seconds)))],
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(work / f"replica-{i}.pyspy.log", "w")),
                    path))
    return out


def finish_profiles(spies, top: int = 25) -> list[dict]:
    """Per replica: the functions the samples were in (own) and under
    (inclusive), as shares of the samples, from py-spy's collapsed stacks."""
    out = []
    for proc, path in spies:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        own: dict[str, int] = {}
        incl: dict[str, int] = {}
        total = 0
        if path.exists():
            for line in path.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                if not stack or not n.isdigit():
                    continue
                frames = stack.split(";")
                total += int(n)
                own[frames[-1]] = own.get(frames[-1], 0) + int(n)
                for f in set(frames):
                    incl[f] = incl.get(f, 0) + int(n)

        def share(d):
            return [[f, round(n / total, 4)] for f, n in
                    sorted(d.items(), key=lambda kv: -kv[1])[:top]] if total else []
        out.append({"samples": total, "file": str(path), "own": share(own),
                    "inclusive": share(incl)})
    return out


def proc_cpu(pids) -> list[float]:
    out = []
    for pid in pids:
        try:
            out.append(cpu_seconds(pid))
        except OSError:
            out.append(float("nan"))
    return out


# -- one step -------------------------------------------------------------------------

def run_step(nodes: int, tenants: int, args, kill_leader: bool = False) -> dict:
    interval, warmup, intervals = args.interval, args.warmup, args.intervals
    total = warmup + intervals
    work = Path(tempfile.mkdtemp(prefix=f"bench_fleet-{nodes}x{tenants}-"))
    tls = make_tls(work)
    ports = [free_port() for _ in range(args.replicas)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    configs = []
    t = time.monotonic()
    base = fleet_config(nodes, tenants, interval, args.seed, args.points, tls,
                        work / "replica-0.state.db")
    etcd = EtcdServer(work / "etcd") if args.replicas > 1 else None
    for r in range(args.replicas):
        if etcd is not None:
            # replicas share the nodes through etcd (controller/fleet.py)
            ctl = dict(base["controller"], store=etcd.url(), replica=f"r{r}")
            ctl.pop("state_path")
        else:
            ctl = dict(base["controller"], state_path=str(work / f"replica-{r}.state.db"))
        cfg = dict(base, controller=ctl)
        path = work / f"replica-{r}.yaml"
        path.write_text(json.dumps(cfg))        # JSON is YAML, and quicker to write
        configs.append(path)
    config_s = time.monotonic() - t
    # a replica reads and checks the whole fleet's config at start
    workers, replicas = [], []
    try:
        replicas, startup_s = start_replicas(configs, ports, work,
                                             timeout=60 + 0.01 * nodes * tenants)
        procs = max(1, min(args.agent_procs, nodes))
        for w in range(procs):
            spec = {"addresses": addresses, "nodes": list(range(w, nodes, procs)),
                    "nodes_total": nodes, "tenants": tenants, "interval": interval,
                    "intervals_total": total, "seed": args.seed, "points": args.points,
                    "cert": str(tls[1]), "token": tls[2].read_text().strip(),
                    "connections": args.connections, "out": str(work / f"agents-{w}.json")}
            (work / f"agents-{w}.spec.json").write_text(json.dumps(spec))
            workers.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", str(work / f"agents-{w}.spec.json")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=open(work / f"agents-{w}.log", "w"), text=True,
                start_new_session=True))
        begun = time.monotonic()
        registered = 0
        for w, p in enumerate(workers):
            line = p.stdout.readline()
            if not line.startswith("ready"):
                raise RuntimeError(f"agent worker {w} failed:\n"
                                   f"{(work / f'agents-{w}.log').read_text()[-3000:]}")
            registered += int(line.split()[1])
        register_s = time.monotonic() - begun
        t0 = time.monotonic() + 0.5
        for p in workers:
            p.stdin.write(f"{t0!r}\n")
            p.stdin.flush()
        rpids, apids = [p.pid for p in replicas], [p.pid for p in workers]
        _sleep_until(t0 + warmup * interval)
        epids = [etcd.proc.pid] if etcd is not None else []
        r0, a0, e0, w0 = proc_cpu(rpids), proc_cpu(apids), proc_cpu(epids), time.monotonic()
        spies = start_profiles(args.py_spy, rpids, intervals * interval, work)
        killed = None
        if kill_leader:
            # a third of the way into the first measured interval, SIGKILL
            # the replica that leads: no goodbye, its lease runs out
            _sleep_until(t0 + (warmup + 0.33) * interval)
            killed = kill_the_leader(etcd, replicas)
            killed["new_leader_s"] = new_leader_after(etcd, killed, 3 * interval)
        _sleep_until(t0 + total * interval)
        r1, a1, e1, w1 = proc_cpu(rpids), proc_cpu(apids), proc_cpu(epids), time.monotonic()
        alive = [p.poll() is None for p in replicas]
        # the machine is shared: how busy it was over the step (1-minute average)
        load = Path("/proc/loadavg").read_text().split()[0]
        profiles = finish_profiles(spies)
        results = []
        for w, p in enumerate(workers):
            try:
                p.wait(timeout=2 * interval + 60)
            except subprocess.TimeoutExpired:
                p.kill()
            out = work / f"agents-{w}.json"
            if p.returncode != 0 or not out.exists():
                raise RuntimeError(f"agent worker {w} ended with {p.returncode}:\n"
                                   f"{(work / f'agents-{w}.log').read_text()[-3000:]}")
            results.append(json.loads(out.read_text()))
    finally:
        stop(workers + replicas)
        if etcd is not None:
            etcd.stop()
    if killed is not None:
        figures = failover_figures(results, t0, killed, interval, nodes)
        _done_with(work, args, figures)
        return figures
    step = summarise(nodes, tenants, args, results,
                     [b - a for a, b in zip(r0, r1)], [b - a for a, b in zip(a0, a1)],
                     w1 - w0)
    # etcd shares the cores too (the replicas' store, with two or more)
    step["store_cpu_s_per_interval"] = sum(b - a for a, b in zip(e0, e1)) * \
        (interval / (w1 - w0))
    step.update({"config_s": round(config_s, 2), "startup_s": round(startup_s, 2),
                 "register_s": round(register_s, 2), "registered": registered,
                 "replicas_alive": alive, "load_average": float(load)})
    if profiles:
        step["profile"] = profiles
    _done_with(work, args, step)
    return step


def _done_with(work: Path, args, figures: dict) -> None:
    """A step's work folder (configs, logs, etcd's data) is kept with
    --keep, and named in its figures; else removed."""
    if args.keep:
        figures["work"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)


def _sleep_until(when: float):
    """Sleep until time.monotonic() reaches `when`."""
    while True:
        left = when - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 1.0))


def summarise(nodes, tenants, args, results, replica_cpu, agent_cpu, window_s) -> dict:
    """The step's figures from the workers' logs and the CPU deltas."""
    interval, warmup, intervals = args.interval, args.warmup, args.intervals
    by_k: dict[int, list] = {k: [] for k in range(warmup, warmup + intervals)}
    for res in results:
        for k, _node, due, _sent, done in res["log"]:
            if k in by_k:
                by_k[k].append((due, done))
    rounds, late, unanswered, latencies = [], 0, 0, []
    for k, recs in sorted(by_k.items()):
        missing = nodes - len(recs)          # a node that never got so far
        bad = missing + sum(1 for _, done in recs if done is None)
        unanswered += bad
        answered = [(due, done) for due, done in recs if done is not None]
        late += sum(1 for due, done in answered if done - due > interval)
        latencies += [done - due for due, done in answered]
        rounds.append(math.inf if bad or not answered else max(d for _, d in answered))
    scaled = interval * intervals / window_s     # CPU per exactly `intervals` intervals
    per_replica = [c * scaled / intervals for c in replica_cpu]
    cpu_sum = sum(per_replica)
    agent_per = [c * scaled / intervals for c in agent_cpu]
    cores = os.cpu_count() or 1
    finite = [r for r in rounds if math.isfinite(r)]
    why = []
    if unanswered:
        why.append(f"{unanswered} report(s) unanswered")
    if late:
        why.append(f"{late} report(s) answered more than one interval after due")
    if cpu_sum >= cores * interval:
        why.append(f"replica CPU {cpu_sum:.1f} s per interval >= {cores} cores x "
                   f"{interval:g} s")
    if rounds and statistics.median(rounds) > ROUND_SLACK * interval:
        why.append(f"the median round ended {statistics.median(rounds):.1f} s after its "
                   f"interval began (> {ROUND_SLACK:g} x {interval:g} s)")
    counts = {}
    for res in results:
        for key, v in res["counts"].items():
            counts[key] = counts.get(key, 0) + v
    return {
        "nodes": nodes, "tenants": tenants, "tenants_total": nodes * tenants,
        "replicas": args.replicas, "interval_s": interval,
        "round_s": statistics.median(rounds) if rounds else None,
        "round_p95_s": float(np.percentile(rounds, 95)) if finite == rounds and rounds
        else (max(rounds) if rounds else None),
        "round_max_s": max(rounds) if rounds else None,
        "rounds_s": rounds,
        "latency_median_s": statistics.median(latencies) if latencies else None,
        "latency_p95_s": float(np.percentile(latencies, 95)) if latencies else None,
        "latency_max_s": max(latencies) if latencies else None,
        "reports": nodes * intervals, "unanswered": unanswered, "late": late,
        "cpu_s_per_interval": cpu_sum, "cpu_s_per_interval_per_replica": per_replica,
        "cpu_s_per_node_interval": cpu_sum / nodes,
        "agent_cpu_s_per_interval": sum(agent_per),
        "agent_cpu_s_per_interval_per_proc": agent_per,
        "fits": not why, "why_not": "; ".join(why),
        "agent_counts": counts,
        "agent_errors": [e for res in results for e in res["errors"]][:20],
    }


def projection(steps: list[dict], interval: float) -> dict:
    """Replicas for PROJECT_NODES nodes from the replicas' CPU per
    node-interval at the largest step that fit (else the smallest run)."""
    fitting = [s for s in steps if s["fits"]]
    base = fitting[-1] if fitting else (steps[0] if steps else None)
    if base is None:
        return {}
    c = base["cpu_s_per_node_interval"]
    budget = REPLICA_CORES * TARGET_UTILISATION * interval
    return {
        "nodes": PROJECT_NODES, "tenants": base["tenants"],
        "from_step": {"nodes": base["nodes"], "fits": base["fits"]},
        "cpu_s_per_node_interval": c,
        "replicas": math.ceil(PROJECT_NODES * c / budget),
        "formula": (f"replicas = ceil(nodes x c / (cores_per_replica x utilisation x "
                    f"interval)) = ceil({PROJECT_NODES} x {c:.5f} / ({REPLICA_CORES:g} x "
                    f"{TARGET_UTILISATION:g} x {interval:g}))"),
        "c_by_step": {s["nodes"]: s["cpu_s_per_node_interval"] for s in steps},
        "note": ("c is the replicas' CPU seconds per node per interval; a replica is one "
                 "Python process whose rounds hold the GIL, so it is given one core, used "
                 f"to {TARGET_UTILISATION:.0%}. Linear in nodes: if c grows with the "
                 "fleet (c_by_step), the figure is a lower bound."),
    }


# -- failover (filled in by the --failover mode) -----------------------------------

def kill_the_leader(etcd, replicas) -> dict:
    """SIGKILL the replica etcd names as leader; (which, when)."""
    from cachepilot.controller.etcd import Etcd
    from cachepilot.controller.fleet import LEADER
    name = Etcd(etcd.url()).leader(LEADER)
    if name is None or not name.startswith("r"):
        raise RuntimeError(f"no replica leads (leader key: {name!r})")
    proc = replicas[int(name[1:])]
    proc.send_signal(signal.SIGKILL)
    return {"replica": name, "at": time.monotonic()}


def new_leader_after(etcd, killed, timeout: float) -> float | None:
    """Seconds from the kill until etcd names another replica as leader
    (None: none within `timeout`)."""
    from cachepilot.controller.etcd import Etcd, StoreUnavailable
    from cachepilot.controller.fleet import LEADER
    client = Etcd(etcd.url())
    while time.monotonic() - killed["at"] < timeout:
        try:
            name = client.leader(LEADER)
        except StoreUnavailable:
            name = None
        if name is not None and name != killed["replica"]:
            return time.monotonic() - killed["at"]
        time.sleep(0.1)
    return None


def failover_figures(results, t0, killed, interval, nodes) -> dict:
    """From the agents' logs: per node, from its first report due after
    the kill (or the one in flight at it, if that went unanswered) until a
    report was answered again; the longest of those, in intervals (a node
    whose replica lived waits only its usual latency), and how many
    reports went unanswered."""
    at = killed["at"]
    by_node: dict[int, list] = {}
    for res in results:
        for k, node, due, _sent, done in res["log"]:
            by_node.setdefault(node, []).append((t0 + k * interval + due,
                                                 None if done is None else
                                                 t0 + k * interval + done))
    lost, missed, never, worst, most = 0, 0, 0, 0.0, 0
    for entries in by_node.values():
        began, mine = None, 0
        for due, done in sorted(entries):
            if began is None and (due >= at or (done is None and due + interval >= at)):
                began = due
            if began is None:
                continue
            if done is None:
                lost += 1
                mine += 1
                most = max(most, mine)
                continue
            worst = max(worst, done - began)
            break
        else:
            never += began is not None
        missed += any(done is None for _, done in entries)
    violations = sum(res["counts"].get("step_violations", 0) for res in results)
    lead = killed.get("new_leader_s")
    return {"killed": killed["replica"], "nodes": nodes,
            "new_leader_s": lead,
            "new_leader_intervals": None if lead is None else lead / interval,
            "nodes_that_missed_a_report": missed, "nodes_never_served_again": never,
            "reports_unanswered": lost, "most_reports_lost_by_one_node": most,
            "failover_s": worst,
            "failover_intervals": worst / interval, "step_violations": violations}


def measure_failover(args) -> dict | None:
    """Two replicas on etcd at args.failover_nodes nodes; the leader is
    SIGKILLed a third into the first measured interval.  Its nodes must be
    served by the other within two intervals (the issue's bar)."""
    if not args.failover_nodes:
        return None
    fa = argparse.Namespace(**{**vars(args), "replicas": 2, "intervals": max(args.intervals, 4)})
    return run_step(args.failover_nodes, args.tenants, fa, kill_leader=True)


# -- output -------------------------------------------------------------------------------

def plot(result: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = result["steps"]
    interval = result["interval_s"]
    xs = [s["nodes"] for s in steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))

    def finite(v):
        return v if v is not None and math.isfinite(v) else float("nan")
    ax1.plot(xs, [finite(s["round_s"]) for s in steps], "o-", label="round (median)")
    ax1.plot(xs, [finite(s["round_p95_s"]) for s in steps], "^--", label="round (p95)")
    ax1.plot(xs, [finite(s["latency_p95_s"]) for s in steps], "s:",
             label="report latency (p95)")
    ax1.axhline(interval, color="red", ls="--", label=f"interval {interval:g} s")
    for s in steps:
        if not s["fits"]:
            ax1.axvline(s["nodes"], color="grey", ls=":", lw=1)
    ax1.set_xlabel(f"nodes ({steps[0]['tenants'] if steps else '?'} tenants each)")
    ax1.set_ylabel("seconds")
    ax1.set_title("round time (interval start -> last report answered)", fontsize=9)
    ax1.legend(fontsize=8)
    reps = max((len(s["cpu_s_per_interval_per_replica"]) for s in steps), default=0)
    for r in range(reps):
        ax2.plot(xs, [s["cpu_s_per_interval_per_replica"][r] for s in steps], "o-",
                 label=f"replica {r}")
    if reps > 1:
        ax2.plot(xs, [s["cpu_s_per_interval"] for s in steps], "k.-", label="replicas, sum")
    ax2.plot(xs, [s["agent_cpu_s_per_interval"] for s in steps], "s--", color="grey",
             label="synthetic agents (same host)")
    ax2.axhline(interval, color="orange", ls="--", label="one core")
    ax2.axhline(result["cores"] * interval, color="red", ls="--",
                label=f"{result['cores']} cores")
    ax2.set_xlabel("nodes")
    ax2.set_ylabel(f"CPU s per {interval:g} s interval")
    ax2.set_title("CPU per interval", fontsize=9)
    ax2.legend(fontsize=8)
    fig.suptitle(f"bench_fleet: {result['replicas']} replica(s), {result['cores']} cores, "
                 f"interval {interval:g} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict):
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"bench_fleet: {result['replicas']} replica(s), interval "
                    f"{result['interval_s']:g} s, {result['cores']} cores")
    for col in ("nodes", "tenants", "round s (med/p95)", "latency p95 s",
                "replica CPU s/interval", "agent CPU s/interval", "late/unans.", "fits"):
        t.add_column(col, justify="right")
    for s in result["steps"]:
        per = "+".join(f"{c:.2f}" for c in s["cpu_s_per_interval_per_replica"])
        t.add_row(str(s["nodes"]), str(s["tenants"]),
                  f"{s['round_s']:.2f} / {s['round_p95_s']:.2f}",
                  f"{s['latency_p95_s']:.3f}" if s["latency_p95_s"] is not None else "-",
                  per if len(s["cpu_s_per_interval_per_replica"]) == 1
                  else f"{s['cpu_s_per_interval']:.2f} ({per})",
                  f"{s['agent_cpu_s_per_interval']:.2f}",
                  f"{s['late']}/{s['unanswered']}",
                  "yes" if s["fits"] else f"NO: {s['why_not']}")
    Console(width=max(120, Console().width)).print(t)


def _failover(args, result: dict, console) -> None:
    """measure_failover into `result` and onto the console; a harness
    failure (a worker or replica that did not start, no leader) is
    recorded as the failover's error, as a failed step is."""
    console.print(f"[bold]failover[/bold] {args.failover_nodes} nodes, 2 replicas on "
                  "etcd: SIGKILL the leader ...")
    try:
        failover = measure_failover(args)
    except RuntimeError as err:
        console.print(f"[red]failover failed:[/red] {err}")
        result["failover"] = {"nodes": args.failover_nodes, "error": str(err)}
        return
    result["failover"] = failover
    result["failover_intervals"] = failover["failover_intervals"]
    lead = failover["new_leader_intervals"]
    console.print(f"  the leader ({failover['killed']}) killed: another led after "
                  + (f"{lead:.2f} intervals" if lead is not None else "NEVER") + "; "
                  f"its nodes served again "
                  f"after {failover['failover_s']:.1f} s = "
                  f"{failover['failover_intervals']:.2f} intervals; "
                  f"{failover['reports_unanswered']} report(s) unanswered (at most "
                  f"{failover['most_reports_lost_by_one_node']} a node), "
                  f"{failover['nodes_never_served_again']} node(s) never served again, "
                  f"{failover['step_violations']} step violation(s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)),
                    help="node counts of the ramp, comma-separated")
    ap.add_argument("--tenants", type=int, default=20, help="tenants per node (20)")
    ap.add_argument("--interval", type=float, default=10.0, help="control interval, s (10)")
    ap.add_argument("--intervals", type=int, default=3, help="intervals measured per step")
    ap.add_argument("--warmup", type=int, default=1, help="intervals before measuring (1)")
    ap.add_argument("--replicas", type=int, default=1, help="controller processes (1)")
    ap.add_argument("--agent-procs", type=int, default=2, help="agent worker processes (2)")
    ap.add_argument("--connections", choices=("per-node", "shared"), default="per-node",
                    help="a TLS connection per node (default, as real agents) or one per "
                         "worker and replica")
    ap.add_argument("--points", type=int, default=50, help="points per curve (50)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-stop", action="store_true",
                    help="run every step even after one does not fit")
    ap.add_argument("--keep", action="store_true", help="keep each step's work folder")
    ap.add_argument("--py-spy", metavar="PATH",
                    help="py-spy to sample the replicas with during the measured "
                         "intervals (the step's `profile`; implies --keep for its stacks)")
    ap.add_argument("--out", default=str(RESULTS / "bench_fleet"),
                    help="output path without suffix (.json and .png are written)")
    ap.add_argument("--failover-nodes", type=int, default=200,
                    help="after the ramp, kill the leader of 2 replicas at this many nodes "
                         "and time the failover (0: skip)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    args.keep = args.keep or bool(args.py_spy)
    from rich.console import Console
    console = Console()
    node_steps = [int(x) for x in args.nodes.split(",") if x.strip()]
    cores = os.cpu_count() or 1
    result = {"interval_s": args.interval, "replicas": args.replicas, "cores": cores,
              "intervals_measured": args.intervals, "warmup_intervals": args.warmup,
              "agent_procs": args.agent_procs, "connections": args.connections,
              "curve_points": args.points, "policies": POLICIES,
              "load_average_before": Path("/proc/loadavg").read_text().split()[0],
              "note": ("The synthetic agents run on the same host and share its cores "
                       "with the replicas (agent_cpu_s_per_interval). round_s: from the "
                       "interval's start until the last node's report of it was answered; "
                       "nodes report spread evenly over the interval. A step fits when "
                       "every report is answered within one interval of being due, the "
                       f"median round ends within {ROUND_SLACK:g} x the interval, and "
                       "the replicas' CPU per interval is below cores x interval."),
              "steps": [], "failover_intervals": None}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for nodes in node_steps:
        console.print(f"[bold]step[/bold] {nodes} nodes x {args.tenants} tenants, "
                      f"{args.replicas} replica(s): {args.warmup} warm-up + "
                      f"{args.intervals} measured interval(s) of {args.interval:g} s ...")
        began = time.monotonic()
        try:
            step = run_step(nodes, args.tenants, args)
        except RuntimeError as err:
            console.print(f"[red]step {nodes} failed:[/red] {err}")
            step = {"nodes": nodes, "tenants": args.tenants, "replicas": args.replicas,
                    "round_s": None, "cpu_s_per_interval": None, "fits": False,
                    "why_not": f"harness: {str(err).splitlines()[0]}", "error": str(err)}
            result["steps"].append(step)
            break
        result["steps"].append(step)
        p95 = step["latency_p95_s"]
        console.print(
            f"  round {step['round_s']:.2f} s (p95 {step['round_p95_s']:.2f}), latency p95 "
            f"{'-' if p95 is None else f'{p95:.3f}'} s, replica CPU {step['cpu_s_per_interval']:.2f} "
            f"s/interval, agents {step['agent_cpu_s_per_interval']:.2f} s/interval, etcd "
            f"{step['store_cpu_s_per_interval']:.2f} s/interval, "
            f"late {step['late']}, unanswered {step['unanswered']}; start-up "
            f"{step['startup_s']:.1f} s, registration {step['register_s']:.1f} s; "
            f"{'fits' if step['fits'] else 'does NOT fit: ' + step['why_not']} "
            f"({time.monotonic() - began:.0f} s)")
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        if not step["fits"] and not args.no_stop:
            break
    measured = [s for s in result["steps"] if s.get("cpu_s_per_interval") is not None]
    result["projection"] = projection(measured, args.interval)
    if args.failover_nodes:
        _failover(args, result, console)
    fitting = [s for s in measured if s["fits"]]
    result["largest_fitting"] = ({"nodes": fitting[-1]["nodes"],
                                  "tenants": fitting[-1]["tenants"]} if fitting else None)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    if measured:
        table({**result, "steps": measured})
        try:
            plot({**result, "steps": measured}, out.with_suffix(".png"))
        except Exception as err:        # the JSON is the result; the plot is a view
            console.print(f"plot not written: {err}")
    p = result["projection"]
    if p:
        console.print(f"largest load that fits: {result['largest_fitting']}")
        console.print(f"projection for {p['nodes']:,} nodes x {p['tenants']} tenants: "
                      f"{p['replicas']} replica(s); {p['formula']}")
    console.print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
