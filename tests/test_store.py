"""Issue 15, item 2: the controller's state survives a restart.

The SQLite store on its own (every record kind, the log's filters, a
file that is not a store), a controller started again from the store
(SLOs, modes, the engine's memory of each tenant: watchdog holds and
probation), and the must-show: set an SLO with `admin set-slo`, SIGKILL
the controller process, start it again; the SLO and the decision log are
back and no limit moves by more than the step.
"""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from grpc_fixtures import TOKEN, report, small_config_dict  # noqa: E402
from store_records import check_every_record_kind, write_every_record_kind  # noqa: E402

from cachepilot.controller.config import load_config
from cachepilot.controller.engine.watchdog import Probation
from cachepilot.controller.service import Controller
from cachepilot.controller.store import SQLiteStore
from cachepilot.core.errors import UserError
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.protocol import wire
from cachepilot.protocol.channel import make_channel
from cachepilot.protocol.types import NodeInfo

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def test_every_record_kind_comes_back_from_the_file(tmp_path):
    path = tmp_path / "s" / "state.db"
    s = SQLiteStore(path)
    write_every_record_kind(s)
    s.close()
    s = SQLiteStore(path)
    check_every_record_kind(s)
    s.close()


def test_a_file_that_is_not_a_store_is_a_clear_error(tmp_path):
    bad = tmp_path / "state.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="cannot open the controller's state store"):
        SQLiteStore(bad)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="cannot open"):
        SQLiteStore(tmp_path / "a-file" / "below-a-file.db")


def _config(tmp_path, port=0):
    data = small_config_dict(tmp_path, listen=f"127.0.0.1:{port}")
    # never lost here; every division that gains moves (the restart test
    # checks each move against the step)
    data["control"].update(max_step_fraction=0.1, interval_s=10.0, reallocation_gain=0.0)
    path = tmp_path / "ctl.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_restarted_controller_has_its_slos_modes_and_holds(tmp_path):
    cfg_path = _config(tmp_path)
    cfg = load_config(cfg_path)
    db = tmp_path / "ctl.state.db"
    c = Controller(cfg, store=SQLiteStore(db))
    session, _, tenants = c.register(NodeInfo("n1", 64 * MiB, 2, True, ["lru", "fifo"], "sim"))
    assert sorted(t.name for t in tenants) == ["n1-t0", "n1-t1"]
    reports = [report("n1-t0"), report("n1-t1")]
    c.report("n1", session, 1, reports, [])
    c.set_slo("n1-t0", 2500.0)
    c.set_mode("n1-t1", "recommend")
    st = c.engine.state.tenants["n1-t0"]
    st.held_until = {"fifo": 60}
    st.probation = Probation(new="fifo", old="lru", since=3)
    st.m_errors = [-0.03, -0.02]                 # what its curve got wrong
    c.report("n1", session, 2, reports, [])      # the round's records go to the store
    rounds = c.rounds
    c.close()

    again = Controller(load_config(cfg_path), store=SQLiteStore(db))
    assert again.config.tenant("n1-t0").slo.min_throughput == 2500.0
    assert again.mode_of("n1-t1") == "recommend" and again.mode_of("n1-t0") == "enforce"
    st = again.engine.state.tenants["n1-t0"]
    assert st.held_until == {"fifo": 60}
    assert (st.probation.new, st.probation.old) == ("fifo", "lru")
    assert st.m_errors == [-0.03, -0.02]
    assert again.rounds == rounds
    view = {t.name: t for t in again.tenants().tenants}
    assert list(view["n1-t0"].held_off) == ["fifo"]
    kinds = [e.kind for e in again.decision_log(limit=100).entries]
    assert "restart" in kinds and "slo" in kinds and "register" in kinds and "mode" in kinds
    again.close()


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cachepilot", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def _start(cfg_path, tmp_path):
    log = open(tmp_path / "controller.log", "a")
    return subprocess.Popen([sys.executable, "-m", "cachepilot", "controller", "--config",
                             str(cfg_path)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def _register(cfg, port, deadline=30.0):
    ch = make_channel(f"localhost:{port}", cfg.controller.tls_ca.read_bytes())
    stub = pb_grpc.NodeStub(ch)
    md = (("authorization", f"Bearer {TOKEN}"),)
    info = pb.NodeInfo(node_id="n1", memory_bytes=64 * MiB, policies=["lru", "fifo"],
                       backend="sim")
    end = time.monotonic() + deadline
    while True:
        try:
            return ch, stub, md, stub.Register(pb.RegisterRequest(node=info), metadata=md,
                                               timeout=2).session
        except grpc.RpcError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_sigkill_and_restart_keep_the_slo_and_log_and_move_no_limit_past_the_step(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg_path = _config(tmp_path, port)
    cfg = load_config(cfg_path)
    step = cfg.control.max_step_fraction * 64 * MiB
    # a tenant whose curve wants far more memory than it has: every round
    # moves its limit by as much as the step allows
    hungry = [report("n1-t0", limit=8 * MiB, throughput=200.0),
              report("n1-t1", limit=48 * MiB, throughput=5000.0)]
    proc = _start(cfg_path, tmp_path)
    try:
        ch, stub, md, session = _register(cfg, port)
        limits = {r.tenant: r.limit_bytes for r in hungry}
        for seq in range(1, 4):
            reps = [wire.report_to_pb(r) for r in hungry]
            for m in reps:
                m.limit_bytes = limits[m.tenant]
            reply = stub.Report(pb.ReportRequest(node_id="n1", session=session, seq=seq,
                                                 reports=reps), metadata=md, timeout=5)
            limits = {d.tenant: d.limit_bytes for d in reply.directives}
        ch.close()
        r = _cli("admin", "--config", str(cfg_path), "set-slo", "n1-t0", "2500", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        before_log = json.loads(_cli("admin", "--config", str(cfg_path), "--json", "log",
                                     "--limit", "500", cwd=tmp_path).stdout)["entries"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

        proc = _start(cfg_path, tmp_path)
        ch, stub, md, session = _register(cfg, port)
        view = json.loads(_cli("admin", "--config", str(cfg_path), "--json", "tenants",
                               cwd=tmp_path).stdout)["tenants"]
        t0 = next(t for t in view if t["name"] == "n1-t0")
        assert t0["slo_min_throughput"] == 2500.0
        log = json.loads(_cli("admin", "--config", str(cfg_path), "--json", "log", "--limit",
                              "500", cwd=tmp_path).stdout)["entries"]
        # every entry from before the kill is still there, and the restart says so
        key = [(e["time"], e["kind"], e["message"]) for e in before_log]
        after = {(e["time"], e["kind"], e["message"]) for e in log}
        assert set(key) <= after and any(e["kind"] == "restart" for e in log)
        r = _cli("admin", "--config", str(cfg_path), "log", "--tenant", "n1-t0", "--since",
                 "1h", cwd=tmp_path)
        assert r.returncode == 0 and "SLO set to 2500" in r.stdout
        # the first round after the restart moves no node's limits past the step
        reps = [wire.report_to_pb(r) for r in hungry]
        for m in reps:
            m.limit_bytes = limits[m.tenant]
        reply = stub.Report(pb.ReportRequest(node_id="n1", session=session, seq=1,
                                             reports=reps), metadata=md, timeout=5)
        deltas = [d.limit_bytes - limits[d.tenant] for d in reply.directives]
        up, down = sum(x for x in deltas if x > 0), -sum(x for x in deltas if x < 0)
        assert 0 < up <= step + 4096 and down <= step + 4096, (up, down)
        ch.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert (tmp_path / "ctl.state.db").exists()     # beside the config, by default


def test_a_round_saves_every_record_and_only_new_directives(tmp_path):
    """The engine's records are saved every round (a restart decides as the
    controller that kept running); a directive when its policy changes,
    and every SAVE_EVERY reports regardless (a limit, which the next
    report carries anyway)."""
    from cachepilot.controller.config import config_from_dict
    from cachepilot.controller.service import SAVE_EVERY
    from cachepilot.controller.store import MemoryStore
    from cachepilot.protocol.types import Directive

    class Engine:
        def __init__(self):
            self.limit, self.held, self.policy = 16 << 20, {}, "lru"

        def decide(self, node, reports, config, advisory=False, **kw):
            return [Directive(r.tenant, self.limit, self.policy, "test") for r in reports], \
                [], []

        def records(self, tenants):
            return {t: {"rounds": 99, "held_until": dict(self.held)} for t in tenants}

    class Spy(MemoryStore):
        def __init__(self):
            super().__init__()
            self.rounds = []

        def write_round(self, rounds, directives, tenants, log):
            self.rounds.append((sorted(directives), sorted(tenants)))
            super().write_round(rounds, directives, tenants, log)

    cfg = config_from_dict(small_config_dict(tmp_path, tls=False), "t.yaml")
    eng, spy = Engine(), Spy()
    c = Controller(cfg, engine=eng, store=spy)
    session = c.register(NodeInfo("n1", 64 << 20, 1, True, ["lru", "fifo"], "sim"))[0]
    names = ["n1-t0", "n1-t1"]

    def one(seq):
        c.report("n1", session, seq, [report(t) for t in names], [])
        return spy.rounds[-1]

    assert one(1) == (names, names)                    # first: everything
    assert one(2) == ([], names)                       # no new directive
    eng.held = {"lfu": 40}
    assert one(3) == ([], names)
    eng.limit = 20 << 20
    assert one(4) == ([], names)                       # a new limit: the next report has it
    eng.policy = "fifo"
    assert one(5) == (names, names)                    # a new policy: the directives
    # an unchanged directive comes again SAVE_EVERY reports after it was last saved
    saved = {seq: one(seq) for seq in range(6, 6 + SAVE_EVERY)}
    assert {k for k, v in saved.items() if v[0]} == {5 + SAVE_EVERY}
    assert all(v[1] == names for v in saved.values())
