"""The node client: applies directives, keeps them while the controller is
away, reconnects with backoff and resynchronises a restarted controller."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from cachepilot.agent.client import NodeClient
from cachepilot.controller.service import serve

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import TOKEN, EchoEngine, FakeBackend, small_config  # noqa: E402


def client_for(cfg, port, backend, token=TOKEN):
    return NodeClient(backend, f"localhost:{port}", token=token,
                      root_cert=cfg.controller.tls_ca.read_bytes(), timeout_s=2.0,
                      backoff_s=(0.05, 0.2))


def test_directives_are_applied_and_kept_while_the_controller_is_away(tmp_path):
    cfg = small_config(tmp_path)
    served = serve(cfg, engine=EchoEngine({"n1-t0": (40 << 20, "fifo")}))
    port = served.port
    backend = FakeBackend("n1", ["n1-t0", "n1-t1"])
    client = client_for(cfg, port, backend)
    try:
        out = client.step()
        assert out.connected and backend.limits["n1-t0"] == 40 << 20
        assert backend.policies["n1-t0"] == "fifo"
        served.stop(0)
        for _ in range(3):
            out = client.step()
            assert not out.connected and out.error
        # Nothing was undone while the controller was away.
        assert backend.limits == {"n1-t0": 40 << 20, "n1-t1": 16 << 20}
        assert backend.policies["n1-t0"] == "fifo"
        assert len(backend.applied) == 1

        # A new controller on the same address: the client registers again
        # and its reports rebuild the controller's view.
        engine = EchoEngine()
        served = serve(cfg, listen=f"127.0.0.1:{port}", engine=engine)
        deadline = time.monotonic() + 5
        while not client.step().connected:
            assert time.monotonic() < deadline, client.last_error
            time.sleep(0.05)
        rec = served.controller.registry.nodes["n1"]
        assert rec.state == "reporting"
        assert rec.tenants["n1-t0"].limit_bytes == 40 << 20
        assert rec.tenants["n1-t0"].policy == "fifo"
        # The echo engine restates what it was told, so nothing moved.
        assert backend.limits["n1-t0"] == 40 << 20 and engine.calls
        assert client.reconnects == 1
    finally:
        client.close()
        served.stop(0)


def test_wrong_token_leaves_the_node_alone(tmp_path):
    cfg = small_config(tmp_path)
    served = serve(cfg, engine=EchoEngine({"n1-t0": (40 << 20, "fifo")}))
    backend = FakeBackend("n1", ["n1-t0"])
    client = client_for(cfg, served.port, backend, token="not-the-token")
    try:
        out = client.step()
        assert not out.connected and "UNAUTHENTICATED" in out.error
        assert backend.applied == [] and backend.limits["n1-t0"] == 16 << 20
        assert served.controller.registry.nodes["n1"].session is None
    finally:
        client.close()
        served.stop(0)


def test_backoff_grows_while_the_controller_is_unreachable(tmp_path):
    cfg = small_config(tmp_path)
    served = serve(cfg, engine=EchoEngine())
    port = served.port
    served.stop(0)
    backend = FakeBackend("n1", ["n1-t0"])
    client = NodeClient(backend, f"localhost:{port}", token=TOKEN,
                        root_cert=cfg.controller.tls_ca.read_bytes(), timeout_s=0.5,
                        backoff_s=(0.05, 0.4))
    try:
        waits = []
        for _ in range(5):
            client.register()
            waits.append(client.backoff)
        assert waits == [0.1, 0.2, 0.4, 0.4, 0.4]
        # Between attempts a step does not even try: it only collects.
        client.next_attempt = time.monotonic() + 60
        t0 = time.monotonic()
        out = client.step()
        assert not out.connected and time.monotonic() - t0 < 0.3
    finally:
        client.close()
