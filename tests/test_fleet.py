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
    when it is back they read the member list again and lead again;
  * an SLO and a mode set through one replica are in force at the other
    within a second or two;
  * a replica whose name another live one holds is refused, and so is a
    wildcard listen address with no advertised one; a replica whose name
    was taken while its lease lapsed neither leads nor serves.

Then the Fleet's threads on a stand-in etcd: stop() never lets a read in
progress join again, a start that fails leaves, and an error in a read
or a plan is logged and the thread goes on.
"""
import json
import logging
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from etcd_fixture import EtcdServer, wait_until  # noqa: E402
from grpc_fixtures import FakeBackend, small_config_dict  # noqa: E402

from cachepilot.agent.client import NodeClient
from cachepilot.controller.config import config_from_dict
from cachepilot.controller.etcd import Etcd, StoreUnavailable
from cachepilot.controller.fleet import MEMBERS, Fleet, owner_of
from cachepilot.controller.service import plan_loop, serve
from cachepilot.core.errors import UserError
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.protocol.channel import make_channel

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


def _fleet_config(etcd, tmp_path, plan_every=0):
    data = small_config_dict(tmp_path, tls=False, nodes=NODES, interval_s=INTERVAL,
                             memory=MEMORY, lost_after=100)
    data["control"]["plan_every_intervals"] = plan_every
    # every division that gains moves: the failover tests watch limits
    # move across the handover and check each move against the step
    data["control"]["reallocation_gain"] = 0.0
    data["controller"]["store"] = etcd.url(f"/fleet-{tmp_path.name}")
    return data


def _replicas(etcd, tmp_path, n=2, plan_every=0):
    data = _fleet_config(etcd, tmp_path, plan_every)
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
    [leader] = [s for s in replicas if s.controller.fleet.leading]
    # the watch threads put the demands, both replicas' nodes
    assert wait_until(lambda: sorted(leader.controller.fleet.read_demands()) == sorted(NODES),
                      3 * INTERVAL)
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


def _admin(served):
    channel = make_channel(served.address, insecure=True)
    return channel, pb_grpc.AdminStub(channel)


def test_an_slo_and_a_mode_set_through_one_replica_hold_at_the_other(fleet):
    replicas, _, clients = fleet()
    _started(replicas, clients, {}, 1)
    one, other = (s.controller for s in replicas)
    channel, admin = _admin(replicas[0])
    try:
        admin.SetSLO(pb.SetSLORequest(tenant="n1-t0", min_throughput=4321.0), timeout=5)
        admin.SetMode(pb.SetModeRequest(tenant="", mode="recommend"), timeout=5)
        # the store is written within 0.25 s, the other reads it every 1/3 s
        assert wait_until(lambda: other.config.tenant("n1-t0").slo.min_throughput == 4321.0
                          and other.config.control.mode == "recommend", 2)
        # and it acts on them: its nodes' directives are recommended, not sent
        _step_all(clients, {})
        theirs = {t.name for n in other.registry.nodes for t in other.config.tenants_on(n)
                  if other.fleet.owns(n)}
        assert theirs and theirs <= set(other.recommended)
        # a change through the other replica comes back the other way,
        # clearing a tenant's own mode included
        _, admin2 = _admin(replicas[1])
        admin2.SetMode(pb.SetModeRequest(tenant="n2-t1", mode="enforce"), timeout=5)
        assert wait_until(lambda: one.mode_of("n2-t1") == "enforce", 3)
        admin2.SetMode(pb.SetModeRequest(tenant="n2-t1", mode=""), timeout=5)
        admin2.ClearSLO(pb.ClearSLORequest(tenant="n1-t0"), timeout=5)
        assert wait_until(lambda: one.mode_of("n2-t1") == "recommend"
                          and one.config.tenant("n1-t0").slo is None, 3)
        # the replica it was set through never went back to an older value
        assert one.config.control.mode == "recommend"
    finally:
        channel.close()


def test_a_second_replica_with_a_name_already_live_is_refused(etcd, tmp_path):
    data = _fleet_config(etcd, tmp_path)
    cfg = config_from_dict(data, "fleet.yaml")
    cfg.controller.replica = "r0"
    first = serve(cfg, watch_lost=False)
    try:
        with pytest.raises(UserError, match=r"cannot join the replicas at etcd://.*: replica "
                           rf"name 'r0' is held by a live replica at {first.address} .*give "
                           "each replica its own name"):
            serve(cfg, watch_lost=False)
        fleet = first.controller.fleet
        time.sleep(fleet.ttl)                      # the refused one left no trace
        assert fleet.members == {"r0": first.address} and fleet.leading
        assert Etcd(data["controller"]["store"]).get(MEMBERS + "r0") == first.address
    finally:
        first.stop(0)


def test_a_wildcard_listen_address_with_etcd_needs_an_advertised_one(etcd, tmp_path):
    data = _fleet_config(etcd, tmp_path)
    cfg = config_from_dict(data, "fleet.yaml")
    with pytest.raises(UserError, match=r"listening on 0\.0\.0\.0:0 .* needs "
                                        r"controller\.advertise \(or --advertise"):
        serve(cfg, listen="0.0.0.0:0", watch_lost=False)
    cfg.controller.advertise = "127.0.0.1:7443"
    served = serve(cfg, listen="0.0.0.0:0", watch_lost=False)
    try:
        assert served.controller.fleet.name == "127.0.0.1:7443"
    finally:
        served.stop(0)


def test_a_replica_whose_name_was_taken_while_it_lapsed_neither_leads_nor_serves(etcd):
    url = etcd.url("/lapsed")
    hung = Fleet(Etcd(url), "x", "127.0.0.1:1", 1)
    hung._join()
    hung.lease.stop()                              # hangs: its lease runs out
    assert wait_until(lambda: Etcd(url).get(MEMBERS + "x") is None, 5)
    other = Fleet(Etcd(url), "x", "127.0.0.1:2", 1).start()
    try:
        assert other.leading
        hung._read()                               # wakes up
        assert hung.refused is not None and not hung.leading
        assert not hung.owns("n1") and hung.owner("n1") == ("x", "127.0.0.1:2")
        assert other.leading and other.owns("n1")
    finally:
        other.stop()


def test_the_cli_gives_each_replica_its_own_name_and_address():
    import argparse
    from cachepilot.controller.cli import _replica_flags
    spec = config_from_dict(small_config_dict(tls=False), "x.yaml").controller
    _replica_flags(spec, argparse.Namespace(replica="r7", advertise="10.0.0.7:7443"))
    assert (spec.replica, spec.advertise) == ("r7", "10.0.0.7:7443")
    with pytest.raises(UserError, match="--replica 'a b'"):
        _replica_flags(spec, argparse.Namespace(replica="a b", advertise=None))
    with pytest.raises(UserError, match="--advertise '0.0.0.0': expected HOST:PORT"):
        _replica_flags(spec, argparse.Namespace(replica=None, advertise="0.0.0.0"))


# -- the Fleet's threads, on a stand-in etcd --------------------------------------------

class _Lease:
    def __init__(self, etcd, ttl):
        self.etcd, self.ttl, self.id = etcd, ttl, len(etcd.leases) + 1
        self.revoked = False
        self.lost = False
        etcd.leases.append(self)

    def start(self):
        return self

    def stop(self):
        pass

    def revoke(self):
        self.revoked = self.lost = True
        self.etcd.kv = {k: v for k, v in self.etcd.kv.items() if v[1] != self.id}
        self.etcd.revoked.set()


class _Etcd:
    """Enough of controller/etcd.py's Etcd for a Fleet, in memory.
    `on_read(etcd)` runs at each member-list read from the watch thread."""

    url = "etcd://fake:1/x"

    def __init__(self):
        self.kv: dict[str, tuple[str, int]] = {}     # key -> (value, lease id)
        self.leases: list[_Lease] = []
        self.revoked = threading.Event()
        self.reads = 0
        self.on_read = None
        self.fail_holder = False

    def lease(self, ttl):
        return _Lease(self, ttl)

    def txn(self, ops, compare=(), failure=(), what=""):
        if any(c[0] == "absent" and c[1] in self.kv for c in compare) or \
                any(c[0] == "lease" and self.kv.get(c[1], ("", 0))[1] != c[2] for c in compare):
            return False
        for _, k, v, lease in ops:
            self.kv[k] = (v, lease or 0)
        return True

    def get(self, key):
        return self.kv.get(key, (None, 0))[0]

    def get_prefix(self, prefix, **_):
        if threading.current_thread().name.startswith("fleet-"):
            self.reads += 1
            if self.on_read is not None:
                self.on_read(self)
        return [(k, v, 1) for k, (v, _) in sorted(self.kv.items()) if k.startswith(prefix)]

    def holder(self, key):
        if self.fail_holder:
            raise StoreUnavailable(f"{self.url}: get {key} failed: down")
        return self.kv.get(key)

    def campaign(self, key, value, lease):
        return self.txn([("put", key, value, lease.id)], compare=[("absent", key)])


def test_stop_waits_for_a_read_in_progress_which_never_joins_again():
    etcd = _Etcd()
    fleet = Fleet(etcd, "r0", "127.0.0.1:1", 1).start()
    # a read in progress when stop() comes: it answers after the lease
    # was revoked, if stop() revoked it first (else after a moment)
    etcd.on_read = lambda e: (fleet._stop.wait(5), e.revoked.wait(0.5))
    assert wait_until(lambda: etcd.reads > 0, 3)
    fleet.stop()
    assert not fleet._thread.is_alive()
    assert len(etcd.leases) == 1 and etcd.leases[0].revoked    # no second lease
    assert etcd.kv == {}                                      # no phantom member


def test_a_start_that_fails_after_joining_leaves():
    etcd = _Etcd()
    etcd.fail_holder = True                        # the campaign's read fails
    with pytest.raises(StoreUnavailable):
        Fleet(etcd, "r0", "127.0.0.1:1", 1).start()
    assert [lease.revoked for lease in etcd.leases] == [True] and etcd.kv == {}


def test_an_error_in_a_read_is_logged_and_the_watch_goes_on(caplog):
    etcd = _Etcd()
    fleet = Fleet(etcd, "r0", "127.0.0.1:1", 1).start()

    def boom(e):
        if e.reads == 1:
            raise RuntimeError("boom")
    etcd.on_read = boom
    try:
        assert wait_until(lambda: etcd.reads >= 3, 5)          # it read on
        [rec] = [r for r in caplog.records if "reading the fleet failed" in r.getMessage()]
        assert rec.exc_info and "boom" in str(rec.exc_info[1])
        assert fleet._thread.is_alive() and fleet.leading
    finally:
        fleet.stop()


def test_a_plan_that_fails_is_logged_and_the_next_comes(caplog):
    stop = threading.Event()

    class Leader:
        fleet = type("F", (), {"leading": True})()
        plans = 0

        def plan_fleet(self):
            Leader.plans += 1
            if Leader.plans == 1:
                raise KeyError("no such tenant")
            stop.set()
    thread = threading.Thread(target=plan_loop, args=(Leader(), stop, 0.05))
    thread.start()
    thread.join(5)
    assert Leader.plans == 2 and not thread.is_alive()
    [rec] = [r for r in caplog.records if "consolidation plan failed" in r.getMessage()]
    assert rec.exc_info and rec.exc_info[0] is KeyError
