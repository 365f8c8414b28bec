"""Issue 19: controller replicas that share the nodes, on a real etcd.

Rendezvous ownership on its own (every replica computes the same owner;
a replica that joins or leaves moves only the nodes it takes or held),
then two real replicas (the gRPC service, etcd on loopback) and four
nodes whose agents know both addresses:

  * every node ends up reporting to its owner, redirected when it
    started at the other;
  * the leader's process dies (its lease is left to run out, as a killed
    process leaves it): the other replica leads and serves every node
    within two intervals, taking what the dead one knew of their tenants
    from the store; no node misses more than the report in flight, and no
    limit moves by more than the step;
  * the leader plans the fleet's consolidation from the demands both
    replicas publish for their nodes;
  * etcd is killed: both replicas go on serving the nodes they own, and
    when it is back they read the member list again and lead again.
"""
import json
import logging
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from etcd_fixture import EtcdServer, wait_until  # noqa: E402
from grpc_fixtures import FakeBackend, small_config_dict  # noqa: E402

from cachepilot.agent.client import NodeClient
from cachepilot.controller.config import config_from_dict
from cachepilot.controller.fleet import owner_of
from cachepilot.controller.service import serve

NODES = ("n1", "n2", "n3", "n4")
INTERVAL = 2.0
MEMORY = 256 << 20


def test_owners_agree_and_move_only_with_the_replica_that_joins_or_leaves():
    nodes = [f"node{i}" for i in range(2000)]
    three = {"a": "x:1", "b": "x:2", "c": "x:3"}
    owned = {n: owner_of(n, three) for n in nodes}
    assert owned == {n: owner_of(n, dict(reversed(list(three.items())))) for n in nodes}
    shares = [list(owned.values()).count(r) for r in three]
    assert min(shares) > 2000 / 3 * 0.85, shares
    four = {**three, "d": "x:4"}
    moved = [n for n in nodes if owner_of(n, four) != owned[n]]
    assert all(owner_of(n, four) == "d" for n in moved) and 0.15 < len(moved) / 2000 < 0.35
    two = {"a": "x:1", "c": "x:3"}
    moved = [n for n in nodes if owner_of(n, two) != owned[n]]
    assert {owned[n] for n in moved} == {"b"}
    assert owner_of("n", {}) is None


@pytest.fixture
def etcd(tmp_path):
    server = EtcdServer(tmp_path / "etcd")
    yield server
    server.stop()


@pytest.fixture
def fleet(etcd, tmp_path):
    """make(plan_every=0) -> (replicas, config, agents); all stopped after."""
    made = []

    def make(plan_every=0):
        replicas, cfg = _replicas(etcd, tmp_path, plan_every=plan_every)
        clients = _agents(replicas)
        made.append((replicas, clients))
        return replicas, cfg, clients
    yield make
    for replicas, clients in made:
        for c in clients:
            c.close()
        for s in replicas:
            s.stop(0)


def _replicas(etcd, tmp_path, n=2, plan_every=0):
    data = small_config_dict(tmp_path, tls=False, nodes=NODES, interval_s=INTERVAL,
                             memory=MEMORY, lost_after=100)
    data["control"]["plan_every_intervals"] = plan_every
    data["controller"]["store"] = etcd.url(f"/fleet-{tmp_path.name}")
    out = []
    for i in range(n):
        cfg = config_from_dict(data, "fleet.yaml")
        cfg.controller.replica = f"r{i}"
        out.append(serve(cfg, watch_lost=False))
    return out, config_from_dict(data, "fleet.yaml")


def _agents(replicas):
    addrs = [s.address for s in replicas]
    clients = []
    for i, node in enumerate(NODES):
        backend = FakeBackend(node, [f"{node}-t0", f"{node}-t1"], memory=MEMORY)
        first = addrs[i % len(addrs)]
        clients.append(NodeClient(backend, first, insecure=True, timeout_s=1.0,
                                  backoff_s=(0.05, 0.2),
                                  fallbacks=[a for a in addrs if a != first]))
    return clients


def _step_all(clients, limits_seen):
    """One interval of every node; records each tenant's limits in turn."""
    out = []
    for c in clients:
        before = dict(c.backend.limits)
        o = c.step()
        out.append(o)
        for t, lim in c.backend.limits.items():
            limits_seen.setdefault(t, []).append((before[t], lim))
    return out


def _started(replicas, clients, limits, intervals):
    """Both replicas see each other; then `intervals` of every node."""
    assert wait_until(lambda: all(len(s.controller.fleet.members) == 2 for s in replicas), 5)
    for _ in range(intervals):
        _step_all(clients, limits)
        time.sleep(INTERVAL / 4)


def test_nodes_find_their_owner_and_move_when_the_leader_dies(fleet):
    replicas, cfg, clients = fleet()
    limits = {}
    _started(replicas, clients, limits, 3)
    for c in clients:
        owner = replicas[0].controller.fleet.owner(c.info.node_id)
        assert owner == replicas[1].controller.fleet.owner(c.info.node_id)
        assert c.target == owner[1], (c.info.node_id, c.target, owner)
        assert c.connected
    assert sum(c.moves for c in clients) >= 1          # someone was redirected
    leaders = [s for s in replicas if s.controller.fleet.leading]
    assert len(leaders) == 1
    dead = leaders[0]
    other = [s for s in replicas if s is not dead][0]
    orphans = [c for c in clients if c.target == dead.address]
    # the leader's process dies: no goodbye, its lease runs out
    dead.controller.fleet.stop(leave=False)
    dead.server.stop(0).wait()
    died = time.monotonic()
    missed = {c.info.node_id: 0 for c in clients}
    intervals = 0
    while time.monotonic() - died < 4 * INTERVAL:
        time.sleep(INTERVAL - (time.monotonic() - died) % INTERVAL)
        intervals += 1
        for c, o in zip(clients, _step_all(clients, limits)):
            missed[c.info.node_id] += not o.connected
        if other.controller.fleet.leading and all(c.target == other.address and c.connected
                                                  for c in clients):
            break
    took = time.monotonic() - died
    assert other.controller.fleet.leading
    assert all(c.target == other.address for c in clients)
    # within two intervals (the lease: 1 s, half of one)
    assert took <= 2 * INTERVAL, took
    # no report lost beyond the one in flight, and only the dead
    # replica's nodes lost even that
    assert all(missed[c.info.node_id] <= 1 for c in clients), missed
    assert all(missed[c.info.node_id] == 0 for c in clients if c not in orphans), missed
    for c in orphans:
        node = c.info.node_id
        assert other.controller.registry.nodes[node].reports > 0
        # the survivor took what the dead replica knew of the node's
        # tenants from the store: their round counts carried on
        served_here = other.controller.registry.nodes[node].reports
        for t in c.backend.limits:
            assert other.controller.engine.state.tenants[t].rounds > served_here, t
        assert any(e.kind == "adopt" and e.node == node and "took 2 tenant" in e.message
                   for e in other.controller.log)
    step = cfg.control.max_step_fraction * MEMORY
    moves = [abs(b - a) for pairs in limits.values() for a, b in pairs]
    assert moves and max(moves) <= step + 4096, max(moves)
    assert any(m > 0 for m in moves)                 # the engine did move limits



def test_replicas_serve_their_nodes_while_etcd_is_away(fleet, etcd, caplog):
    caplog.set_level(logging.WARNING, logger="cachepilot")
    replicas, _, clients = fleet()
    limits = {}
    _started(replicas, clients, limits, 2)
    targets = {c.info.node_id: c.target for c in clients}
    etcd.kill()
    assert wait_until(lambda: not any(s.controller.fleet.reachable for s in replicas), 5)
    assert not any(s.controller.fleet.leading for s in replicas)
    for _ in range(4):
        out = _step_all(clients, limits)
        assert all(o.connected for o in out), [o.error for o in out]
        time.sleep(INTERVAL / 2)
    assert {c.info.node_id: c.target for c in clients} == targets
    assert all(not s.controller.store.available for s in replicas)
    # each replica said so in its log
    away = [r.getMessage() for r in caplog.records if "serving the nodes it owns" in
            r.getMessage()]
    assert len({m.split(":")[0] for m in away}) == len(replicas), away
    etcd.start()
    assert wait_until(lambda: all(s.controller.fleet.reachable for s in replicas), 10)
    assert wait_until(lambda: sum(s.controller.fleet.leading for s in replicas) == 1, 10)
    assert wait_until(lambda: all(len(s.controller.fleet.members) == 2 for s in replicas), 5)
    _step_all(clients, limits)
    assert wait_until(lambda: all(s.controller.store.available for s in replicas), 5)
    assert {c.info.node_id: c.target for c in clients} == targets
    back = [r.getMessage() for r in caplog.records if "etcd answers again" in r.getMessage()]
    assert len({m.split(":")[0] for m in back}) == len(replicas), back


def test_the_leader_plans_from_every_replicas_demands(fleet):
    replicas, _, clients = fleet(plan_every=1)
    _started(replicas, clients, {}, 3)
    time.sleep(0.4)                 # the watch thread puts the demands
    [leader] = [s for s in replicas if s.controller.fleet.leading]
    published = leader.controller.fleet.read_demands()
    assert sorted(published) == sorted(NODES)    # both replicas' nodes
    summary = leader.controller.plan_fleet()
    assert summary["tenants"] == summary["reported"] == 2 * len(NODES)
    # eight tenants' demands on four 256 MiB hosts: fewer hosts will do
    assert 1 <= summary["lower_bound_hosts"] <= summary["hosts_used"] < len(NODES)
    stored = json.loads(leader.controller.fleet.etcd.get("plan"))
    assert stored["hosts_used"] == summary["hosts_used"]
    assert any(e.kind == "plan" for e in leader.controller.log)
    # and the leader's own thread plans every interval
    before = stored["time"]
    assert wait_until(lambda: json.loads(leader.controller.fleet.etcd.get("plan"))["time"]
                      > before, 3 * INTERVAL)
