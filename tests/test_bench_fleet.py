"""experiments/bench_fleet.py: the fleet harness at a tiny load, for real
(a controller process, agent worker processes, gRPC with TLS and a token),
its synthetic agents following a replica's redirect to the owner of a
node and failing over past an address nobody listens on, and its report
when a step answered nothing and the failover could not be run."""
import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import grpc
import pytest

from cachepilot.protocol.channel import OWNER_HEADER

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import bench_fleet  # noqa: E402
from e2e_lib import free_port, make_tls  # noqa: E402

STEP_KEYS = {"nodes", "tenants", "replicas", "round_s", "cpu_s_per_interval"}


@pytest.mark.parametrize("replicas", [1, 2])
def test_harness_at_a_tiny_load_answers_every_report(tmp_path, replicas):
    out = tmp_path / "bench_fleet"
    began = time.monotonic()
    # with two replicas, also the failover: the leader killed at 4 nodes
    failover = "4" if replicas == 2 else "0"
    assert bench_fleet.main(["--nodes", "4", "--tenants", "3", "--interval", "1",
                             "--intervals", "3", "--warmup", "1", "--replicas", str(replicas),
                             "--agent-procs", "2", "--failover-nodes", failover,
                             "--out", str(out)]) == 0
    assert time.monotonic() - began < 60
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["largest_fitting"] == {"nodes": 4, "tenants": 3}
    if replicas == 1:
        assert result["failover_intervals"] is None and "failover" not in result
    else:
        f = result["failover"]
        # every node served again, the dead leader's after its lease ran
        # out.  The figure runs from each node's first report due after the
        # kill, which may fall late in the lease, so it can be well under
        # the lease; it is positive only if some node waited for an answer
        # after the kill (0.0 means nothing was measured)
        assert f["nodes_never_served_again"] == 0 and f["step_violations"] == 0
        assert f["new_leader_intervals"] is not None and f["new_leader_intervals"] < 4
        assert 0 < result["failover_intervals"] < 4
        assert f["reports_unanswered"] <= 2 * f["nodes_that_missed_a_report"]
    [step] = result["steps"]
    assert STEP_KEYS <= set(step)
    assert (step["nodes"], step["tenants"], step["replicas"]) == (4, 3, replicas)
    assert step["replicas_alive"] == [True] * replicas
    assert step["registered"] == 4
    # every report of every measured interval answered, within the interval
    assert step["reports"] == 4 * 3
    assert step["unanswered"] == 0 and step["late"] == 0
    assert len(step["rounds_s"]) == 3 and all(math.isfinite(r) for r in step["rounds_s"])
    # the last node reports at 3/4 of the interval; its answer comes soon after
    assert 0.7 < step["round_s"] < 1.0
    assert step["cpu_s_per_interval"] > 0
    # one figure per replica (node i starts at replica i mod R)
    assert len(step["cpu_s_per_interval_per_replica"]) == replicas
    assert sum(step["cpu_s_per_interval_per_replica"]) > 0
    assert len(step["agent_cpu_s_per_interval_per_proc"]) == 2
    assert step["fits"] and step["agent_counts"]["errors"] == 0
    assert result["projection"]["replicas"] >= 1
    assert "formula" in result["projection"]
    assert out.with_suffix(".png").stat().st_size > 0


class Redirector:
    """A replica that owns no node: every Register and Report is refused
    as controller/service.py refuses a node another replica owns
    (FAILED_PRECONDITION, its text, the owner in trailing metadata)."""

    def __init__(self, owner):
        self.owner = owner
        self.calls = 0

    def _refuse(self, request, context):
        self.calls += 1
        node = getattr(request, "node_id", "") or request.node.node_id
        context.set_trailing_metadata(((OWNER_HEADER, self.owner),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"node {node} is served by replica r1 at {self.owner}")

    Register = Report = _refuse


def test_agents_follow_the_owner_and_fail_over_past_a_dead_address(tmp_path):
    from cachepilot.controller.config import config_from_dict
    from cachepilot.controller.service import serve
    from cachepilot.controller.store import MemoryStore
    from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
    key, cert, token = make_tls(tmp_path)
    cfg = config_from_dict(bench_fleet.fleet_config(2, 2, 0.5, 1, 20, (key, cert, token),
                                                    tmp_path / "state.db"))
    real = serve(cfg, listen="127.0.0.1:0", store=MemoryStore(), watch_lost=False)
    redirector = Redirector(real.address)
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
    pb_grpc.add_NodeServicer_to_server(redirector, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())]))
    server.start()
    dead = f"127.0.0.1:{free_port()}"
    try:
        # node 0 starts at the dead address, node 1 at the redirector
        spec = {"addresses": [dead, f"127.0.0.1:{port}"], "nodes": [0, 1],
                "nodes_total": 2, "tenants": 2, "interval": 0.5, "intervals_total": 2,
                "seed": 1, "points": 20, "cert": str(cert), "token": token.read_text().strip(),
                "connections": "per-node", "rpc_timeout_s": 2.0}

        async def start(registered):
            assert registered == 2
            return time.monotonic() + 0.1
        res = asyncio.run(bench_fleet.agents_main(spec, start))
    finally:
        server.stop(0)
        real.stop(0)
    assert res["registered"] == 2
    assert len(res["log"]) == 4 and all(done is not None for *_, done in res["log"])
    assert res["counts"]["failovers"] >= 1          # node 0 went past the dead address
    assert res["counts"]["redirects"] == 2          # both were sent to the owner
    assert res["counts"]["errors"] == 0
    assert redirector.calls == 2
    nodes = real.controller.registry.nodes
    assert nodes["n00000"].reports == 2 and nodes["n00001"].reports == 2


@pytest.mark.parametrize("metadata,owner", [
    (((OWNER_HEADER, "127.0.0.1:5001"),), "127.0.0.1:5001"),
    (((OWNER_HEADER, b"127.0.0.1:5001"),), "127.0.0.1:5001"),
    ((), None)])
def test_the_owner_is_read_from_the_trailing_metadata_only(metadata, owner):
    class Err:
        def trailing_metadata(self):
            return metadata

        def details(self):          # what the controller says, not parsed
            return "node n1 is served by replica r1 at 127.0.0.1:5002"
    assert bench_fleet.owner_of(Err()) == owner


def test_a_step_that_answered_nothing_and_a_failed_failover_are_reported(tmp_path,
                                                                         monkeypatch):
    def nothing_answered(nodes, tenants, args, kill_leader=False):
        step = bench_fleet.summarise(nodes, tenants, args,
                                     [{"log": [], "counts": {}, "errors": []}], [0.1], [0.1],
                                     args.interval * args.intervals)
        step.update(store_cpu_s_per_interval=0.0, startup_s=1.0, register_s=1.0)
        return step

    def no_leader(args):
        raise RuntimeError("no replica leads (leader key: None)")
    monkeypatch.setattr(bench_fleet, "run_step", nothing_answered)
    monkeypatch.setattr(bench_fleet, "measure_failover", no_leader)
    out = tmp_path / "bench_fleet"
    assert bench_fleet.main(["--nodes", "2", "--tenants", "1", "--interval", "1",
                             "--intervals", "1", "--failover-nodes", "2",
                             "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    [step] = result["steps"]
    assert step["latency_p95_s"] is None and not step["fits"]
    assert result["failover"] == {"nodes": 2, "error": "no replica leads (leader key: None)"}
    assert result["failover_intervals"] is None


def test_a_failover_step_leaves_no_work_folder(tmp_path, monkeypatch):
    """The failover step returns its own figures: its work folder (etcd's
    data among it) goes as a measured step's does."""
    made = []
    real = bench_fleet.tempfile.mkdtemp

    def mkdtemp(**kw):
        made.append(Path(real(dir=tmp_path, **kw)))
        return str(made[-1])
    monkeypatch.setattr(bench_fleet.tempfile, "mkdtemp", mkdtemp)
    # four measured intervals, as measure_failover runs it: with two, a
    # loaded machine could end the step before the 1 s lease ran out
    args = argparse.Namespace(interval=1.0, warmup=1, intervals=4, replicas=2, seed=1,
                              points=20, agent_procs=1, connections="per-node", py_spy=None,
                              keep=False)
    figures = bench_fleet.run_step(2, 2, args, kill_leader=True)
    assert figures["nodes_never_served_again"] == 0
    assert made and not made[0].exists()
