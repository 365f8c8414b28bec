"""The controller's gRPC service: authentication, refusals that change
nothing, the admin API, lost-node detection and the metrics."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from cachepilot.protocol import wire
from cachepilot.protocol.channel import make_channel
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.controller.service import serve

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import TOKEN, EchoEngine, report, small_config  # noqa: E402
from lock_probe import free_elsewhere  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tls_server(tmp_path):
    cfg = small_config(tmp_path)
    served = serve(cfg, engine=EchoEngine())
    yield cfg, served
    served.stop(0)


def stubs(cfg, served, token=TOKEN):
    ch = make_channel(f"localhost:{served.port}", cfg.controller.tls_ca.read_bytes())
    md = (("authorization", f"Bearer {token}"),) if token is not None else ()
    return ch, pb_grpc.NodeStub(ch), pb_grpc.AdminStub(ch), md


def register(node_stub, md, node="n1"):
    info = pb.NodeInfo(node_id=node, memory_bytes=64 << 20, policies=["lru", "fifo"],
                       backend="sim")
    return node_stub.Register(pb.RegisterRequest(node=info), metadata=md, timeout=5).session


def code_of(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_register_report_directives_over_tls(tls_server):
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served)
    session = register(node, md)
    req = pb.ReportRequest(node_id="n1", session=session, seq=1,
                           reports=[wire.report_to_pb(report("n1-t0")),
                                    wire.report_to_pb(report("n1-t1", policy="fifo"))])
    reply = node.Report(req, metadata=md, timeout=5)
    got = {d.tenant: (d.limit_bytes, d.policy) for d in reply.directives}
    assert got == {"n1-t0": (16 << 20, "lru"), "n1-t1": (16 << 20, "fifo")}
    assert reply.round == 1
    status = admin.Status(pb.StatusRequest(), metadata=md, timeout=5)
    assert status.tls and status.rounds == 1
    assert [(n.node_id, n.state) for n in status.nodes] == [("n1", "reporting")]
    ch.close()


@pytest.mark.parametrize("token", [None, "wrong-token-123"])
def test_missing_or_wrong_token_is_refused_on_every_service(tls_server, token):
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served, token)
    assert code_of(lambda: register(node, md))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: admin.Status(pb.StatusRequest(), metadata=md, timeout=5))[0] \
        == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: admin.SetSLO(pb.SetSLORequest(tenant="n1-t0", min_throughput=5),
                                        metadata=md, timeout=5))[0] \
        == grpc.StatusCode.UNAUTHENTICATED
    assert served.controller.registry.nodes["n1"].session is None
    assert served.controller.config.tenant("n1-t0").slo.min_throughput == 1000
    ch.close()


def test_plaintext_client_cannot_talk_to_tls_server(tls_server):
    cfg, served = tls_server
    ch = grpc.insecure_channel(f"127.0.0.1:{served.port}")
    stub = pb_grpc.AdminStub(ch)
    code, _ = code_of(lambda: stub.Status(pb.StatusRequest(),
                                          metadata=(("authorization", f"Bearer {TOKEN}"),),
                                          timeout=3))
    assert code == grpc.StatusCode.UNAVAILABLE
    ch.close()


def test_unregistered_or_unknown_nodes_are_refused(tls_server):
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served)
    req = pb.ReportRequest(node_id="n1", session="made-up", seq=1,
                           reports=[wire.report_to_pb(report("n1-t0"))])
    code, details = code_of(lambda: node.Report(req, metadata=md, timeout=5))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not registered" in details
    code, details = code_of(lambda: register(node, md, node="intruder"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not in the controller's config" in details
    # A registered node with a stale session is told to register again.
    register(node, md)
    code, _ = code_of(lambda: node.Report(req, metadata=md, timeout=5))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert served.controller.rounds == 0
    ch.close()


def _bad_curve(kind):
    c = pb.Curve(policy="lru", method="exact", rate=1.0, sizes_pages=[10, 20, 30],
                 miss_ratio=[0.9, 0.5, 0.1])
    if kind == "non-monotone":
        c.sizes_pages[:] = [10, 30, 20]
    elif kind == "nan":
        c.miss_ratio[1] = math.nan
    elif kind == "above-one":
        c.miss_ratio[0] = 1.5
    elif kind == "mismatched":
        del c.miss_ratio[2]
    elif kind == "negative":
        c.miss_ratio[2] = -0.1
    elif kind == "oversized":
        c.sizes_pages[:] = list(range(1, 20_002))
        c.miss_ratio[:] = [0.5] * 20_001
    return c


@pytest.mark.parametrize("kind", ["non-monotone", "nan", "above-one", "mismatched", "negative",
                                  "oversized"])
def test_a_malformed_curve_refuses_that_tenants_curves_only(tls_server, kind):
    """The report is taken tenant by tenant: the tenant with the malformed
    curve is held (its curves refused, logged, counted), the other tenant
    is decided on, and the node stays live."""
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served)
    session = register(node, md)
    good = wire.report_to_pb(report("n1-t0", limit=8 << 20))
    node.Report(pb.ReportRequest(node_id="n1", session=session, seq=1, reports=[good]),
                metadata=md, timeout=5)
    bad = wire.report_to_pb(report("n1-t0", limit=32 << 20))
    bad.curves.append(_bad_curve(kind))
    other = wire.report_to_pb(report("n1-t1", limit=32 << 20))
    reply = node.Report(pb.ReportRequest(node_id="n1", session=session, seq=2,
                                         reports=[other, bad]), metadata=md, timeout=5)
    assert [(r.tenant, "n1-t0" in r.reason) for r in reply.refused] == [("n1-t0", True)]
    c = served.controller
    rec = c.registry.nodes["n1"]
    assert rec.state == "reporting" and rec.reports == 2 and c.rounds == 2
    assert rec.tenants["n1-t0"].curves == [] and rec.tenants["n1-t0"].refused
    assert "n1-t1" in rec.tenants and rec.tenants["n1-t1"].curves
    assert c.held["n1-t0"].startswith("refused: tenant 'n1-t0' curve")
    assert c.held["n1-t1"] == ""
    assert any(e.kind == "refused" and e.tenant == "n1-t0" for e in c.log)
    assert b'cachepilot_refused_report_entries_total{node="n1"} 1.0' in c.metrics.exposition()
    ch.close()


def test_a_malformed_entry_is_held_at_its_last_report(tls_server):
    """An entry whose numbers are not valid (NaN miss ratio) is refused;
    the tenant stands in by its last taken report, without curves."""
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served)
    session = register(node, md)
    node.Report(pb.ReportRequest(node_id="n1", session=session, seq=1,
                                 reports=[wire.report_to_pb(report("n1-t0", limit=8 << 20))]),
                metadata=md, timeout=5)
    before = served.controller.registry.nodes["n1"].tenants["n1-t0"]
    bad = wire.report_to_pb(report("n1-t0", limit=32 << 20))
    bad.miss_ratio = math.nan
    reply = node.Report(pb.ReportRequest(node_id="n1", session=session, seq=2, reports=[bad]),
                        metadata=md, timeout=5)
    assert [r.tenant for r in reply.refused] == ["n1-t0"]
    assert "miss_ratio" in reply.refused[0].reason
    # the echo engine restates what it is given: the last taken limit
    assert [(d.tenant, d.limit_bytes) for d in reply.directives] == [("n1-t0", 8 << 20)]
    assert served.controller.registry.nodes["n1"].tenants["n1-t0"] is before
    ch.close()


def test_replayed_report_is_refused(tls_server):
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served)
    session = register(node, md)
    req = pb.ReportRequest(node_id="n1", session=session, seq=5,
                           reports=[wire.report_to_pb(report("n1-t0"))])
    node.Report(req, metadata=md)
    code, details = code_of(lambda: node.Report(req, metadata=md))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not newer" in details
    assert served.controller.rounds == 1
    ch.close()


def test_an_entry_naming_a_tenant_of_another_node_is_refused(tmp_path):
    cfg = small_config(tmp_path, nodes=("n1", "n2"))
    served = serve(cfg, engine=EchoEngine())
    try:
        ch, node, admin, md = stubs(cfg, served)
        session = register(node, md)
        req = pb.ReportRequest(node_id="n1", session=session, seq=1,
                               reports=[wire.report_to_pb(report("n2-t0")),
                                        wire.report_to_pb(report("n1-t0"))])
        reply = node.Report(req, metadata=md, timeout=5)
        assert [(r.tenant, r.reason) for r in reply.refused] == [
            ("n2-t0", "not a tenant of this node in the controller's config")]
        assert [d.tenant for d in reply.directives] == ["n1-t0"]
        assert list(served.controller.registry.nodes["n1"].tenants) == ["n1-t0"]
        ch.close()
    finally:
        served.stop(0)


def test_admin_slo_changes_and_refusals(tls_server):
    cfg, served = tls_server
    ch, node, admin, md = stubs(cfg, served)
    reply = admin.SetSLO(pb.SetSLORequest(tenant="n1-t0", min_throughput=2500), metadata=md)
    assert reply.had_slo and reply.previous == 1000 and reply.current == 2500
    assert served.controller.config.tenant("n1-t0").slo.min_throughput == 2500
    # The operator's change is the controller's copy, not the caller's config.
    assert cfg.tenant("n1-t0").slo.min_throughput == 1000
    code, details = code_of(lambda: admin.SetSLO(
        pb.SetSLORequest(tenant="n1-t0", min_throughput=-5), metadata=md))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "-5" in details
    code, details = code_of(lambda: admin.SetSLO(
        pb.SetSLORequest(tenant="ghost", min_throughput=5), metadata=md))
    assert code == grpc.StatusCode.NOT_FOUND and "ghost" in details
    code, _ = code_of(lambda: admin.SetSLO(
        pb.SetSLORequest(tenant="n1-t0", min_throughput=math.nan), metadata=md))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert served.controller.config.tenant("n1-t0").slo.min_throughput == 2500
    reply = admin.ClearSLO(pb.ClearSLORequest(tenant="n1-t0"), metadata=md)
    assert reply.had_slo and not reply.has_slo
    assert served.controller.config.tenant("n1-t0").slo is None
    assert code_of(lambda: admin.ClearSLO(pb.ClearSLORequest(tenant="ghost"), metadata=md))[0] \
        == grpc.StatusCode.NOT_FOUND
    entries = admin.DecisionLog(pb.DecisionLogRequest(tenant="n1-t0"), metadata=md).entries
    assert [e.kind for e in entries] == ["slo", "slo"]
    assert "cleared" in entries[0].message
    ch.close()


def test_tenants_view_and_metrics_follow_reports(tls_server):
    cfg, served = tls_server
    served.controller.engine.script = {"n1-t1": (24 << 20, "fifo")}
    ch, node, admin, md = stubs(cfg, served)
    session = register(node, md)
    node.Report(pb.ReportRequest(node_id="n1", session=session, seq=1, reports=[
        wire.report_to_pb(report("n1-t0", throughput=1500.0)),
        wire.report_to_pb(report("n1-t1", throughput=200.0))]), metadata=md)
    view = {t.name: t for t in admin.Tenants(pb.TenantsRequest(), metadata=md).tenants}
    assert view["n1-t0"].slo_met and not view["n1-t1"].slo_met
    assert view["n1-t1"].limit_bytes == 24 << 20 and view["n1-t1"].policy == "fifo"
    text = served.controller.metrics.exposition().decode()
    assert 'cachepilot_tenant_limit_bytes{node="n1",tenant="n1-t1"} 2.5165824e+07' in text
    assert 'cachepilot_tenant_policy{policy="fifo",tenant="n1-t1"} 1.0' in text
    assert 'cachepilot_slo_met{tenant="n1-t1"} 0.0' in text
    assert 'cachepilot_decisions_total{kind="policy"} 1.0' in text
    assert "cachepilot_decision_seconds_count 1.0" in text
    log = admin.DecisionLog(pb.DecisionLogRequest(tenant="n1-t1"), metadata=md).entries
    assert log[0].kind == "policy" and "lru -> fifo" in log[0].message
    assert json.loads(log[0].detail_json) == {"predicted": 1.5}
    ch.close()


def test_silent_node_is_marked_lost_and_leaves_the_pool(tmp_path):
    cfg = small_config(tmp_path, nodes=("n1", "n2"), interval_s=0.5, lost_after=2)
    served = serve(cfg, engine=EchoEngine())
    try:
        ch, node, admin, md = stubs(cfg, served)
        sessions = {n: register(node, md, n) for n in ("n1", "n2")}
        assert admin.Status(pb.StatusRequest(), metadata=md).pool_bytes == 2 * (64 << 20)
        import time
        deadline = time.monotonic() + 8
        # n1 keeps reporting, n2 falls silent.
        seq = 0
        while time.monotonic() < deadline:
            seq += 1
            node.Report(pb.ReportRequest(node_id="n1", session=sessions["n1"], seq=seq,
                                         reports=[wire.report_to_pb(report("n1-t0"))]),
                        metadata=md)
            states = {n.node_id: n.state for n in
                      admin.Status(pb.StatusRequest(), metadata=md).nodes}
            if states["n2"] == "lost":
                break
            time.sleep(0.05)
        assert states == {"n1": "reporting", "n2": "lost"}
        assert admin.Status(pb.StatusRequest(), metadata=md).pool_bytes == 64 << 20
        # The lost node's next report is told to register again, and then it is back.
        req = pb.ReportRequest(node_id="n2", session=sessions["n2"], seq=2,
                               reports=[wire.report_to_pb(report("n2-t0"))])
        assert code_of(lambda: node.Report(req, metadata=md))[0] == \
            grpc.StatusCode.FAILED_PRECONDITION
        req.session = register(node, md, "n2")
        node.Report(req, metadata=md)
        assert admin.Status(pb.StatusRequest(), metadata=md).pool_bytes == 2 * (64 << 20)
        kinds = [e.kind for e in admin.DecisionLog(pb.DecisionLogRequest(), metadata=md).entries]
        assert "lost" in kinds
        ch.close()
    finally:
        served.stop(0)


def test_generated_modules_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run(["bash", str(ROOT / "protocol" / "gen_proto.sh"), str(tmp_path)],
                   check=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    for name in ("cachepilot_pb2.py", "cachepilot_pb2_grpc.py"):
        assert (tmp_path / name).read_text() == (ROOT / "protocol" / name).read_text(), \
            f"{name} is stale: run protocol/gen_proto.sh"


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_admin_command_talks_tls_and_reports_refusals_in_one_line(tmp_path):
    import yaml

    from grpc_fixtures import small_config_dict
    port = _free_port()
    data = small_config_dict(tmp_path, listen=f"127.0.0.1:{port}")
    cfg_path = tmp_path / "ctl.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    from cachepilot.controller.config import load_config
    served = serve(load_config(cfg_path), engine=EchoEngine())

    def admin(*args, path=cfg_path):
        return subprocess.run([sys.executable, "-m", "cachepilot", "admin", "--config", str(path),
                               "--target", f"localhost:{port}", *args],
                              capture_output=True, text=True, timeout=60)
    try:
        ok = admin("set-slo", "n1-t1", "2500")
        assert ok.returncode == 0 and "n1-t1: SLO 1000 -> 2500" in ok.stdout
        status = admin("status")
        assert status.returncode == 0 and "tls on" in status.stdout
        for args, expect in [(("set-slo", "ghost", "5"), "not_found: unknown tenant 'ghost'"),
                             (("set-slo", "n1-t0", "-5"), "invalid_argument"),
                             (("clear-slo", "ghost"), "unknown tenant")]:
            bad = admin(*args)
            assert bad.returncode == 2, bad
            assert bad.stderr.count("\n") == 1 and expect in bad.stderr, bad.stderr
            assert "Traceback" not in bad.stderr
        data["controller"]["token"] = "a-different-token"
        wrong = tmp_path / "wrong.yaml"
        wrong.write_text(yaml.safe_dump(data))
        bad = admin("status", path=wrong)
        assert bad.returncode == 2 and "unauthenticated" in bad.stderr
        assert served.controller.config.tenant("n1-t0").slo.min_throughput == 1000
        assert served.controller.config.tenant("n1-t1").slo.min_throughput == 2500
    finally:
        served.stop(0)


def test_metrics_are_served_over_http(tmp_path):
    import urllib.request

    from grpc_fixtures import small_config_dict
    from cachepilot.controller.config import config_from_dict
    port = _free_port()
    cfg = config_from_dict(small_config_dict(tmp_path, metrics_port=port), "m.yaml")
    served = serve(cfg, engine=EchoEngine())
    try:
        ch, node, admin, md = stubs(cfg, served)
        session = register(node, md)
        for seq in range(1, 8):
            node.Report(pb.ReportRequest(node_id="n1", session=session, seq=seq, reports=[
                wire.report_to_pb(report("n1-t0", throughput=1500.0 if seq % 2 else 10.0))]),
                metadata=md)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = text.decode()
        # warm-up is 5 intervals: of intervals 6 and 7, one met the SLO.
        assert 'cachepilot_slo_attainment_ratio{tenant="n1-t0"} 0.5' in text
        assert 'cachepilot_nodes{state="reporting"} 1.0' in text
        assert "cachepilot_pool_bytes 6.7108864e+07" in text
        assert "cachepilot_decision_seconds_count 7.0" in text
        ch.close()
    finally:
        served.stop(0)


def test_admin_tenants_shows_running_and_directed_policies_and_the_nodes_answer(tmp_path):
    """The policy a node reports running and the one last directed are two
    columns; a node's refusal (or note) on the last directive is shown under
    its tenant; a node without cache_ext is marked advisory and the engine
    is told so."""
    import yaml

    from grpc_fixtures import small_config_dict
    port = _free_port()
    data = small_config_dict(tmp_path, nodes=("n1", "n2"), listen=f"127.0.0.1:{port}")
    cfg_path = tmp_path / "ctl.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    from cachepilot.controller.config import load_config
    engine = EchoEngine({"n1-t0": (16 << 20, "fifo"), "n1-t1": (16 << 20, "fifo"),
                         "n2-t0": (16 << 20, "fifo")})
    served = serve(load_config(cfg_path), engine=engine)
    try:
        ch, node, admin, md = stubs(load_config(cfg_path), served)
        s1 = register(node, md, "n1")                     # a sim node: swaps
        s2 = node.Register(pb.RegisterRequest(node=pb.NodeInfo(
            node_id="n2", memory_bytes=64 << 20, cgroup_version=2, has_cache_ext=False,
            policies=["lru", "fifo"], backend="linux")), metadata=md, timeout=5).session
        reports = {n: [wire.report_to_pb(report(f"{n}-t{i}")) for i in range(2)]
                   for n in ("n1", "n2")}
        node.Report(pb.ReportRequest(node_id="n1", session=s1, seq=1, reports=reports["n1"]),
                    metadata=md)
        assert engine.advisory is False
        node.Report(pb.ReportRequest(node_id="n2", session=s2, seq=1, reports=reports["n2"]),
                    metadata=md)
        assert engine.advisory is True
        # n1 refuses to attach fifo for t0 and still runs lru everywhere
        applied = [pb.ApplyResult(tenant="n1-t0", applied_limit_bytes=16 << 20,
                                  applied_policy="lru", ok=True, policy_refused=True,
                                  policy_message="policy 'fifo': attach failed: EPERM"),
                   pb.ApplyResult(tenant="n1-t1", applied_limit_bytes=16 << 20,
                                  applied_policy="fifo", ok=True)]
        node.Report(pb.ReportRequest(node_id="n1", session=s1, seq=2, reports=reports["n1"],
                                     applied=applied), metadata=md)
        ch.close()

        def admin_cli(*args):
            out = subprocess.run([sys.executable, "-m", "cachepilot", "admin", "--config",
                                  str(cfg_path), "--target", f"localhost:{port}", *args],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout
        text = admin_cli("tenants")
        lines = text.splitlines()
        header = lines[0].split()
        assert header[-2:] == ["running", "directed"]
        rows = {ln.split()[0]: ln.split() for ln in lines[1:] if not ln.startswith(" ")}
        assert rows["n1-t0"][-2:] == ["lru", "fifo"]
        assert rows["n1-t1"][-2:] == ["lru", "fifo"]
        assert rows["n2-t0"][-3:] == ["lru", "fifo", "(advice)"]
        after_t0 = lines[lines.index(next(ln for ln in lines if ln.startswith("n1-t0"))) + 1]
        assert "REFUSED" in after_t0 and "attach failed: EPERM" in after_t0
        view = json.loads(admin_cli("--json", "tenants"))
        t0 = next(t for t in view["tenants"] if t["name"] == "n1-t0")
        assert (t0["running_policy"], t0["policy"], t0["applied"]) == ("lru", "fifo", "refused")
        assert t0["advisory"] is False
        assert next(t for t in view["tenants"] if t["name"] == "n2-t1")["advisory"] is True
        status = admin_cli("status")
        n2 = next(ln for ln in status.splitlines() if ln.strip().startswith("n2"))
        assert "policies advisory" in n2
        assert "advisory" not in next(ln for ln in status.splitlines()
                                      if ln.strip().startswith("n1"))
        log = admin_cli("log")
        assert "refused-by-node" in log and "EPERM" in log
    finally:
        served.stop(0)


def test_a_tenants_cpu_crosses_the_wire_and_a_negative_one_is_refused():
    r = report("n1-t0")
    r.cpu_per_s = 0.37
    assert wire.report_from_pb(wire.report_to_pb(r)).cpu_per_s == 0.37
    msg = wire.report_to_pb(r)
    msg.cpu_per_s = -1.0
    with pytest.raises(wire.WireError, match="cpu_per_s"):
        wire.report_from_pb(msg)


# -- a replica among several, with the fleet and the store stood in for ------------------

class _Fleet:
    """controller/fleet.py's Fleet as the Controller sees it: owns what
    `mine` says."""

    def __init__(self):
        self.mine = True
        self.reachable = True
        self.name = "r0"
        self.etcd = type("E", (), {"url": "etcd://fake:1"})()

    def owns(self, node):
        return self.mine

    def owner(self, node):
        return (self.name, "127.0.0.1:1") if self.mine else ("r1", "127.0.0.1:2")

    def publish(self, node, demands):
        pass


class _SharedStore:
    """A MemoryStore with the shared store's load_tenants, noting whether
    each call that would ask etcd found the controller's lock free, and
    every round written."""

    def __init__(self):
        from cachepilot.controller.store import MemoryStore
        self.mem = MemoryStore()
        self.controller = None
        self.free: list[bool] = []
        self.rounds: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.mem, name)

    def _probe(self):
        if self.controller is not None:
            self.free.append(free_elsewhere(self.controller.lock))

    def load_tenants(self, names):
        from cachepilot.controller.store import Saved
        self._probe()
        return Saved()

    def read_log(self, **kw):
        self._probe()
        return self.mem.read_log(**kw)

    def write_round(self, rounds, directives, tenants, log):
        self.rounds.append((dict(directives), dict(tenants)))
        self.mem.write_round(rounds, directives, tenants, log)


def _replica(tmp_path):
    from cachepilot.controller.service import Controller
    store = _SharedStore()
    c = Controller(small_config(tmp_path, tls=False), engine=EchoEngine(), store=store,
                   fleet=_Fleet())
    store.controller = c
    return c, store


def _node_info(node="n1"):
    from cachepilot.protocol.types import NodeInfo
    return NodeInfo(node, 64 << 20, 2, True, ["lru", "fifo"], "sim")


def test_a_replica_asks_the_shared_store_without_holding_its_lock(tmp_path):
    c, store = _replica(tmp_path)
    c.register(_node_info())                       # adopts n1: reads its tenants
    c.decision_log(limit=10)                       # pages through the store
    assert store.free == [True, True]



def test_a_node_that_comes_back_has_its_records_saved_again_at_once(tmp_path):
    c, store = _replica(tmp_path)
    session, _, _ = c.register(_node_info())
    c.report("n1", session, 1, [report("n1-t0"), report("n1-t1")], [])
    assert set(store.rounds[-1][0]) == {"n1-t0", "n1-t1"}      # saved when first seen
    c.fleet.mine = False                           # n1 moves to another replica ...
    c.fleet_changed({"r0": "127.0.0.1:1", "r1": "127.0.0.1:2"})
    c.fleet.mine = True                            # ... which writes its records, and dies
    session, _, _ = c.register(_node_info())
    c.report("n1", session, 1, [report("n1-t0"), report("n1-t1")], [])
    # the store holds the other replica's records: ours are written again
    assert set(store.rounds[-1][0]) == {"n1-t0", "n1-t1"}


def test_a_controller_that_is_behind_answers_without_deciding_but_decides_each_node_in_time(
        tmp_path):
    # a replica that took over a dead one's nodes: reports queue on its
    # lock.  One that waited longer than shed_after of an interval is taken
    # (the node stays live) and answered with no directive; every node is
    # still decided at least every shed_max_rounds + 1 reports.
    import threading
    import time
    from cachepilot.controller.config import config_from_dict
    from cachepilot.controller.service import Controller
    from grpc_fixtures import small_config_dict
    data = small_config_dict(tls=False, interval_s=1.0, lost_after=100)
    data["control"].update(shed_after=0.2, shed_max_rounds=2)
    engine = EchoEngine()
    from cachepilot.controller.store import SQLiteStore
    store = SQLiteStore(tmp_path / "state.db")      # the log entries go through SQLite
    c = Controller(config_from_dict(data, "t.yaml"), engine=engine, store=store)
    from cachepilot.protocol.types import NodeInfo
    session, _, _ = c.register(NodeInfo("n1", 64 << 20, 2, True, ["lru", "fifo"], "sim"))
    reps = [report("n1-t0"), report("n1-t1")]

    def busy_report(seq, hold=0.4):
        # another round holds the lock for `hold` seconds while this one comes
        taken, out = threading.Event(), {}

        def other():
            with c.lock:
                taken.set()
                time.sleep(hold)
        t = threading.Thread(target=other)
        t.start()
        taken.wait()
        out["reply"] = c.report("n1", session, seq, reps, [])
        t.join()
        return out["reply"]

    directives, _, _ = c.report("n1", session, 1, reps, [])       # on time: decided
    assert len(directives) == 2 and len(engine.calls) == 1
    got = [busy_report(seq) for seq in (2, 3, 4, 5, 6, 7)]
    decided = [bool(d) for d, _, _ in got]
    # behind every time: two answered without a round, the third decided
    assert decided == [False, False, True, False, False, True]
    assert len(engine.calls) == 3
    assert c.registry.nodes["n1"].reports == 7                     # every report taken
    assert any(e.kind == "shed" and "behind" in e.message for e in c.log)
    assert c.metrics.shed._value.get() == 4
    # caught up: decided at once again, and the log says so
    directives, _, _ = c.report("n1", session, 8, reps, [])
    assert directives and len(engine.calls) == 4
    assert any(e.kind == "shed" and "caught up: 4 reports" in e.message for e in c.log)
    assert {e.kind for e in store.read_log(limit=100)} >= {"shed", "register"}


def test_reports_that_wait_for_a_round_are_decided_together_as_each_alone_would_be():
    """Reports that queue on the lock are taken into one engine round; a
    node's decisions depend only on its own tenants, so each node gets
    the directives, log and violations it would have got alone."""
    import threading
    import time

    import numpy as np
    from cachepilot.controller.config import config_from_dict
    from cachepilot.controller.engine.synthetic import random_tenant
    from cachepilot.controller.service import Controller
    from cachepilot.protocol.types import NodeInfo
    node_bytes, nodes = 256 << 20, ["n0", "n1", "n2", "n3"]
    rng = np.random.default_rng(5)
    tenants = {n: [random_tenant(rng, f"{n}-t{j}", ["linux", "mru", "lfu"], node_bytes / 4096)
                   for j in range(5)] for n in nodes}
    data = {"control": {"interval_s": 10.0, "warmup_intervals": 0, "autopilot_k": 1},
            "controller": {"listen": "127.0.0.1:0", "insecure": True},
            "nodes": [{"name": n, "memory_bytes": node_bytes, "backend": "sim",
                       "policies": ["linux", "mru", "lfu"]} for n in nodes],
            "tenants": [{"name": st.name, "node": n, "policies": ["linux", "mru", "lfu"],
                         **({"slo": {"min_throughput": round(0.9 * st.throughput(
                             float(st.curves["linux"].at(node_bytes / 4096 / 5))), 1)}}
                            if j == 0 else {})}
                        for n in nodes for j, st in enumerate(tenants[n])]}
    alone, together = (Controller(config_from_dict(data, "t.yaml")) for _ in range(2))
    sessions = {}
    for c in (alone, together):
        for n in nodes:
            sessions[id(c), n] = c.register(NodeInfo(n, node_bytes, 2, True,
                                                     ["linux", "mru", "lfu"], "sim"))[0]
    limits = {st.name: node_bytes // 5 for n in nodes for st in tenants[n]}
    policy = {st.name: "linux" for n in nodes for st in tenants[n]}
    for seq in range(1, 5):
        reps = {n: [st.report(limits[st.name], policy[st.name], 10.0) for st in tenants[n]]
                for n in nodes}
        one = {n: alone.report(n, sessions[id(alone), n], seq, reps[n], []) for n in nodes}
        # the same reports arrive while another round holds the lock
        got, threads = {}, []
        with together.lock:
            for n in nodes:
                t = threading.Thread(target=lambda n=n: got.__setitem__(n, together.report(
                    n, sessions[id(together), n], seq, reps[n], [])))
                t.start()
                threads.append(t)
            deadline = time.monotonic() + 10
            while len(together._queue) < len(nodes) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(together._queue) == len(nodes)
        for t in threads:
            t.join(10)
        assert together.rounds == seq                   # one round a batch
        assert alone.rounds == seq * len(nodes)
        for n in nodes:
            assert [(d.tenant, d.limit_bytes, d.policy) for d in got[n][0]] == \
                [(d.tenant, d.limit_bytes, d.policy) for d in one[n][0]]
            assert [v.tenant for v in together.last_violations[n]] == \
                [v.tenant for v in alone.last_violations[n]]
            for d in one[n][0]:
                limits[d.tenant], policy[d.tenant] = d.limit_bytes, d.policy
    moved = [t for t in limits if limits[t] != node_bytes // 5]
    assert moved, "the rounds moved no limit: nothing was compared"
    # the decision log says the same of every tenant, round numbers aside
    def entries(c):
        return sorted((e.node, e.tenant, e.kind, e.message) for e in c.log
                      if e.kind not in ("register", "observed"))
    assert entries(together) == entries(alone)
