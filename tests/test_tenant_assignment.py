"""Issue 15, item 1: one source of truth for the tenants.

The controller's config holds them; a node receives its own at
registration, in the one model both configs use (protocol/tenant.py), so
the two cannot disagree: an agent config that follows a controller may
not list tenants, what arrives is checked by the same model, and a node
that cannot take what it is given does not register.
(The live path -- `cachepilot agent` watching only what the controller
assigns -- is test_agent_backend.py's
test_agent_follows_a_controller_over_tls_with_a_token; identity and the
registration reply are in test_identity.py.)
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import EchoEngine, FakeBackend, small_config  # noqa: E402

from cachepilot.agent.client import NodeClient
from cachepilot.agent.config import config_from_dict as agent_config
from cachepilot.controller.config import config_from_dict as controller_config
from cachepilot.controller.service import serve
from cachepilot.core.errors import UserError
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import wire
from cachepilot.protocol.tenant import PrometheusThroughput
from cachepilot.sim.backend import SimBackend


def test_an_agent_that_follows_a_controller_lists_no_tenants():
    link = {"address": "h:1", "insecure": True}
    for extra in ({"tenants": [{"name": "a", "cgroup": "a"}]}, {"cgroups": ["*"]}):
        with pytest.raises(UserError, match="the controller's config holds the tenants"):
            agent_config({"roots": ["/x"], "controller": link, **extra})
    assert agent_config({"roots": ["/x"], "controller": link}).tenants == []
    # stand-alone, an agent keeps its own list, as before
    assert agent_config({"roots": ["/x"], "tenants": [{"name": "a", "cgroup": "a"}]}).tenants


def _controller():
    return controller_config({
        "controller": {"listen": "127.0.0.1:0", "insecure": True},
        "nodes": [{"name": "n1", "memory_bytes": 1 << 30}],
        "tenants": [
            {"name": "shop", "node": "n1", "cgroup": "shop.slice",
             "slo": {"min_throughput": 100, "source": {
                 "url": "http://127.0.0.1:9200/metrics", "metric": "reqs",
                 "labels": {"h": "c"}}},
             "floor_bytes": "64MiB", "ceiling_bytes": "512MiB", "policies": ["lru", "lfu"],
             "policy_threads": {"get_scan": {"scan_threads": {"comm": "scan*"}}}},
            {"name": "db", "node": "n1", "pod": {"namespace": "x", "name": "db-0"},
             "throughput": {"source": "prometheus", "url": "http://10.0.0.1/m",
                            "metric": "ops", "kind": "gauge"}},
            {"name": "batch", "node": "n1"}]})


def test_what_a_node_receives_is_the_controllers_tenant_through_the_wire():
    cfg = _controller()
    sent = [wire.tenant_to_pb(t.node_tenant()) for t in cfg.tenants]
    got = {t.name: t for t in (wire.tenant_from_pb(m) for m in sent)}
    shop = got["shop"]
    # slo.source, parsed and never used before, is now where the node reads
    assert isinstance(shop.throughput, PrometheusThroughput)
    assert (shop.throughput.url, shop.throughput.metric, shop.throughput.labels) == (
        "http://127.0.0.1:9200/metrics", "reqs", {"h": "c"})
    assert (shop.cgroup, shop.floor, shop.ceiling, shop.policies) == (
        "shop.slice", 64 << 20, 512 << 20, ["lru", "lfu"])
    assert shop.thread_rules()["get_scan"]["scan_threads"].comm == "scan*"
    assert got["db"].pod.name == "db-0" and got["db"].throughput.kind == "gauge"
    assert got["batch"].cgroup == "batch" and got["batch"].throughput.source == "accesses"
    # the controller's config refuses a source given twice
    with pytest.raises(UserError, match="throughput source once"):
        controller_config({"nodes": [{"name": "n1", "memory_bytes": 1 << 30}],
                           "tenants": [{"name": "a", "node": "n1",
                                        "throughput": {"source": "accesses"},
                                        "slo": {"min_throughput": 1, "source": {
                                            "url": "http://h/m", "metric": "m"}}}]})


def test_a_malformed_assignment_is_a_wire_error():
    with pytest.raises(wire.WireError, match="tenant 'a' from the controller"):
        wire.tenant_from_pb(pb.TenantAssignment(name="a", spec_json='{"name": "a"}'))
    with pytest.raises(wire.WireError, match="its spec names 'b'"):
        wire.tenant_from_pb(pb.TenantAssignment(
            name="a", spec_json='{"name": "b", "cgroup": "b"}'))
    with pytest.raises(wire.WireError):
        wire.tenant_from_pb(pb.TenantAssignment(name="a", spec_json="not json"))


def test_a_node_that_cannot_take_its_tenants_does_not_register(tmp_path):
    cfg = small_config(tmp_path, tls=False)
    served = serve(cfg, engine=EchoEngine())
    try:
        class Refusing(FakeBackend):
            def assign(self, tenants):
                raise UserError("no such cgroup")
        client = NodeClient(Refusing("n1", ["n1-t0", "n1-t1"]),
                            f"127.0.0.1:{served.port}", insecure=True)
        out = client.step()
        assert not out.connected and "tenants from the controller: no such cgroup" in out.error
        client.close()
        ok = FakeBackend("n1", ["n1-t0", "n1-t1"])
        client = NodeClient(ok, f"127.0.0.1:{served.port}", insecure=True)
        assert client.step().connected and ok.assigned == ["n1-t0", "n1-t1"]
        client.close()
    finally:
        served.stop(0)


def test_a_sim_node_started_from_another_config_is_refused():
    cfg = controller_config({
        "nodes": [{"name": "n1", "memory_bytes": 16 << 20}],
        "tenants": [{"name": "a", "node": "n1", "workload": {
            "accesses_per_interval": 100, "phases": [{"kind": "uniform", "footprint": "1MiB"}]}}]})
    b = SimBackend(cfg, "n1", seed=1, curves=False)
    b.assign([t.node_tenant() for t in cfg.tenants])             # the same list: fine
    other = controller_config({"nodes": [{"name": "n1", "memory_bytes": 16 << 20}],
                               "tenants": [{"name": "zz", "node": "n1"}]})
    with pytest.raises(UserError, match="start it from the controller's config"):
        b.assign([t.node_tenant() for t in other.tenants])
    b.close()
