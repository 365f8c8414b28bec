"""Issue 15, item 3: identity per node, and a separate admin role.

Certificates made by `cachepilot certs` (a CA, the controller's, one per
node, an admin's); a controller with client_ca (mutual TLS).  The
must-show: each of these is refused with a clear error and changes
nothing --
  - a node certificate used by another node's agent;
  - an admin call made with a node's credential;
  - a node call made with the admin credential.
And what should work does: a node with its own certificate registers,
receives its tenants and reports; `cachepilot admin` with the admin
certificate reads and changes.
"""
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import FakeBackend, report  # noqa: E402

from cachepilot.agent.client import NodeClient
from cachepilot.controller.config import load_config
from cachepilot.controller.service import serve
from cachepilot.controller.store import MemoryStore
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.protocol import wire
from cachepilot.protocol.channel import make_channel, read_identity

MiB = 1 << 20


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cachepilot", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("identity")
    certs = tmp / "certs"
    # init makes the admin's certificate (and one for node n0) too
    for args in (("init", "--node", "n0"), ("node", "n1"), ("node", "n2")):
        r = _cli("certs", *args, "--dir", str(certs), cwd=tmp)
        assert r.returncode == 0, r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = {
        "control": {"interval_s": 10.0},
        "controller": {"listen": f"127.0.0.1:{port}", "tls_cert": "certs/controller.crt",
                       "tls_key": "certs/controller.key", "tls_ca": "certs/ca.crt",
                       "client_ca": "certs/ca.crt", "admin_cert": "certs/admin.crt",
                       "admin_key": "certs/admin.key", "state_path": "state.db"},
        "nodes": [{"name": n, "memory_bytes": 64 * MiB} for n in ("n1", "n2")],
        "tenants": [{"name": f"{n}-t0", "node": n, "slo": {"min_throughput": 1000},
                     "policies": ["lru", "fifo"]} for n in ("n1", "n2")],
    }
    path = tmp / "ctl.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    served = serve(cfg, store=MemoryStore())
    yield tmp, path, cfg, served
    served.stop(0)


def _stubs(cfg, served, who):
    ident = read_identity(cfg.controller.client_ca.parent / f"{who}.crt",
                          cfg.controller.client_ca.parent / f"{who}.key")
    ch = make_channel(f"localhost:{served.port}", cfg.controller.tls_ca.read_bytes(),
                      identity=ident)
    return ch, pb_grpc.NodeStub(ch), pb_grpc.AdminStub(ch)


def _register(stub, node):
    info = pb.NodeInfo(node_id=node, memory_bytes=64 * MiB, policies=["lru", "fifo"],
                       backend="sim")
    return stub.Register(pb.RegisterRequest(node=info), timeout=5)


def _refused(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_a_node_with_its_own_certificate_registers_and_receives_its_tenants(deployment):
    tmp, path, cfg, served = deployment
    ch, node, _ = _stubs(cfg, served, "node-n1")
    reply = _register(node, "n1")
    assert reply.assigns_tenants and [t.name for t in reply.tenants] == ["n1-t0"]
    r = node.Report(pb.ReportRequest(node_id="n1", session=reply.session, seq=1,
                                     reports=[wire.report_to_pb(report("n1-t0"))]), timeout=5)
    assert [d.tenant for d in r.directives] == ["n1-t0"]
    ch.close()
    # the agent's own client, with its certificate: registers and steps
    ident = read_identity(tmp / "certs" / "node-n1.crt", tmp / "certs" / "node-n1.key")
    backend = FakeBackend("n1", ["n1-t0"])
    client = NodeClient(backend, f"localhost:{served.port}",
                        root_cert=cfg.controller.tls_ca.read_bytes(), identity=ident)
    out = client.step()
    assert out.connected, out.error
    assert backend.assigned == ["n1-t0"] and client.tenants == ["n1-t0"]
    client.close()


def _register_n2_refused(deployment, who):
    """Registers node n2 with `who`'s certificate; checks that the call is
    refused and n2's session kept.  Returns the channel, the node stub and
    the refusal's details."""
    tmp, path, cfg, served = deployment
    before = served.controller.registry.nodes["n2"].session
    ch, node, _ = _stubs(cfg, served, who)
    code, details = _refused(lambda: _register(node, "n2"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert served.controller.registry.nodes["n2"].session == before
    return ch, node, details


def test_a_node_certificate_used_by_another_nodes_agent_is_refused(deployment):
    tmp, path, cfg, served = deployment
    before = served.controller.registry.nodes["n2"].session
    ch, node, details = _register_n2_refused(deployment, "node-n1")
    assert "for node 'n2'" in details and "certificate of node 'n1'" in details
    # a report naming n2 with n1's certificate, too
    code, _ = _refused(lambda: node.Report(pb.ReportRequest(node_id="n2", session="x", seq=1),
                                           timeout=5))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert served.controller.registry.nodes["n2"].session == before
    ch.close()


def test_an_admin_call_with_a_node_credential_is_refused(deployment):
    tmp, path, cfg, served = deployment
    ch, _, admin = _stubs(cfg, served, "node-n1")
    code, details = _refused(lambda: admin.SetSLO(pb.SetSLORequest(tenant="n1-t0",
                                                                   min_throughput=5),
                                                  timeout=5))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "admin certificate" in details and "node 'n1'" in details
    assert served.controller.config.tenant("n1-t0").slo.min_throughput == 1000
    ch.close()
    # the same through the CLI: one clear line, no traceback
    certs = tmp / "certs"
    r = _cli("admin", "--config", str(path), "--cert", str(certs / "node-n1.crt"), "--key",
             str(certs / "node-n1.key"), "set-slo", "n1-t0", "5", cwd=tmp)
    assert r.returncode != 0 and "permission_denied" in r.stderr
    assert "Traceback" not in r.stderr
    assert served.controller.config.tenant("n1-t0").slo.min_throughput == 1000


def test_a_node_call_with_the_admin_credential_is_refused(deployment):
    ch, _, details = _register_n2_refused(deployment, "admin")
    assert "node calls need a node certificate" in details and "admin" in details
    ch.close()


def test_the_admin_certificate_reads_and_changes(deployment):
    tmp, path, cfg, served = deployment
    r = _cli("admin", "--config", str(path), "set-slo", "n2-t0", "1500", cwd=tmp)
    assert r.returncode == 0, r.stderr
    assert served.controller.config.tenant("n2-t0").slo.min_throughput == 1500
    r = _cli("admin", "--config", str(path), "status", cwd=tmp)
    assert r.returncode == 0 and "n1" in r.stdout


def test_a_caller_without_a_certificate_cannot_connect(deployment):
    tmp, path, cfg, served = deployment
    ch = make_channel(f"localhost:{served.port}", cfg.controller.tls_ca.read_bytes())
    code, _ = _refused(lambda: pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE
    ch.close()


def test_certs_never_overwrite_and_name_what_is_missing(deployment, tmp_path):
    tmp = deployment[0]
    r = _cli("certs", "node", "n1", "--dir", str(tmp / "certs"), cwd=tmp)
    assert r.returncode != 0 and "node-n1" in r.stderr and "Traceback" not in r.stderr
    r = _cli("certs", "node", "n3", "--dir", str(tmp_path / "none"), cwd=tmp_path)
    assert r.returncode != 0 and "certs init" in r.stderr and "Traceback" not in r.stderr
    r = _cli("certs", "node", "bad name", "--dir", str(tmp / "certs"), cwd=tmp)
    assert r.returncode != 0 and "bad name" in r.stderr
