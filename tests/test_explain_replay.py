"""Every decision explained and replayable (issue 44).

One recorded run of the demo (`cachepilot run --config configs/demo.yaml
--intervals 40 --record DIR`, in process) is shared by the tests:

  * `cachepilot replay DIR` ends with "replayed 80 rounds, D directives,
    0 differ", and --json gives the same three figures;
  * replayed with another configuration, the directives that change are
    listed, and K counts them;
  * every directive of the run has a trace record whose figures reproduce
    its limit to the byte, and whose explanation names the rule that set
    the limit with its figures;
  * `cachepilot admin explain` against a live controller, in words and JSON;
  * a recording's bad input (not a recording, a version from elsewhere, a
    round cut short by a kill) gets a clear answer.
"""
from __future__ import annotations

import contextlib
import io
import json
import random
import re
from pathlib import Path

import pytest
import yaml

from cachepilot.controller import recording
from cachepilot.controller.config import load_config
from cachepilot.controller.engine.trace import (LIMIT_WORDS, explain, limit_from_record,
                                                mib)
from cachepilot.controller.store import MemoryStore, SQLiteStore
from cachepilot.core.errors import UserError
from cachepilot.main import main
from cachepilot.run import run_autopilot

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
INTERVALS = 40


def cli(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rec")
    cfg = load_config(DEMO)
    _, log, controller = run_autopilot(cfg, INTERVALS, record=str(folder))
    controller.run_log = log
    return cfg, folder, controller


def test_a_recorded_run_replays_with_nothing_differing(recorded):
    _, folder, _ = recorded
    rc, out = cli("replay", folder)
    assert rc == 0
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"replayed (\d+) rounds, (\d+) directives, (\d+) differ", last)
    assert m, last
    assert int(m[1]) == 2 * INTERVALS and int(m[3]) == 0
    assert int(m[2]) == 8 * INTERVALS          # every tenant, every round
    rc, out = cli("replay", folder, "--json")
    got = json.loads(out)
    assert (got["rounds"], got["directives"], got["differ"]) == (80, int(m[2]), 0)
    # a few MiB at most
    assert (folder / recording.FILE).stat().st_size < 3 << 20


def test_a_replay_hands_each_rounds_state_to_its_caller_and_stops_when_told(recorded):
    # experiments/replan_recording.py plans from the state a replay reaches
    from cachepilot.controller import replay
    _, folder, _ = recorded
    lines = recording.read(str(folder))
    seen = []

    def after_round(line, state, cfg):
        seen.append((line["round"], sorted(state.tenants), cfg.control.interval_s))
        return line["round"] >= 10
    out = replay.replay(lines, after_round=after_round)
    assert [r for r, _, _ in seen] == list(range(1, 11))
    assert out.rounds == 10 and out.rounds < replay.replay(lines).rounds
    assert seen[-1][1] and all(iv == seen[0][2] for _, _, iv in seen)


def test_a_replay_scores_its_predictions_on_the_recorded_outcomes(recorded, tmp_path):
    # with the recorded configuration, the replay's predictions and their
    # outcomes are the run's own: every "observed" entry the run logged
    from cachepilot.controller.replay import replay
    _, folder, controller = recorded
    want = []
    for e in controller.run_log:
        p, o = e.detail.get("predicted"), e.detail.get("observed")
        if e.kind == "observed" and p is not None and o:
            want.append((p - o) / o)
    got = replay(recording.read(folder))
    assert len(want) > 10 and sorted(got.errors.values()) == pytest.approx(sorted(want))
    rc, out = cli("replay", folder, "--json")
    sc = json.loads(out)["predictions"]
    assert sc["n"] == len(want)
    assert sc["mean_abs"] == pytest.approx(sum(map(abs, want)) / len(want))
    rc, out = cli("replay", folder)
    assert f"throughput predictions scored on the recorded reports: {len(want)}," in out
    # with another configuration, a prediction made with a directive the
    # recording did not carry out is not scored: what followed was not its
    doc = yaml.safe_load(DEMO.read_text())
    doc["control"]["max_step_fraction"] = 0.05
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc))
    from cachepilot.controller import engine
    decide, observed = engine.decide, set()

    def spy(*args, **kw):
        d, state = decide(*args, **kw)
        observed.update((e.decided_round, e.tenant) for e in d.log if e.kind == "observed")
        return d, state
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "decide", spy)
        slow = replay(recording.read(folder), load_config(other))
    assert observed & slow._differed, "no prediction made with a differing directive"
    assert not set(slow.errors) & slow._differed
    assert set(slow.errors) <= observed


def test_a_recording_made_before_a_field_became_fixed_replays_and_says_so(tmp_path):
    # experiments/results/run_demo.recording was made when the control
    # section still had the fields issue 45 turned into fixed figures: it
    # replays, and the replay names what it ignored
    rec = ROOT / "experiments" / "results" / "run_demo.recording"
    rc, out = cli("replay", rec, "--json")
    got = json.loads(out)
    assert rc == 0 and got["rounds"] == 60 and got["directives"] == 240
    assert got["ignored_control"]["watchdog_cooldown"] == 20
    assert got["ignored_control"]["calibration_window"] == 0
    rc, out = cli("replay", rec, "--show", "0")
    assert "no longer has, ignored: autopilot_doubt=0.01" in out


def test_another_config_lists_what_changes(recorded, tmp_path):
    _, folder, _ = recorded
    doc = yaml.safe_load(DEMO.read_text())
    doc["control"]["max_step_fraction"] = 0.05          # a slower controller
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc))
    rc, out = cli("replay", folder, "--config", other, "--json")
    got = json.loads(out)
    assert got["differ"] == len(got["changes"]) > 0
    c = got["changes"][0]
    assert set(c) == {"round", "node", "tenant", "limit_before", "limit_after",
                      "policy_before", "policy_after"}
    # the first moves are smaller
    first = min(x["round"] for x in got["changes"])
    assert any(x["round"] == first and x["limit_after"] != x["limit_before"]
               for x in got["changes"])
    rc, text = cli("replay", folder, "--config", other, "--show", "3")
    lines = text.strip().splitlines()
    assert lines[-1] == f"replayed 80 rounds, {got['directives']} directives, " \
                        f"{got['differ']} differ"
    assert len([ln for ln in lines if ln.startswith("round ")]) == 3


def test_every_directive_is_explained_by_the_figures_that_set_it(recorded):
    cfg, folder, controller = recorded
    directives = [(line["round"], t, limit, policy)
                  for line in recording.read(folder)[1:] if line["type"] == "round"
                  for ds in line["directives"].values() for t, limit, policy, _ in ds]
    assert len(directives) == 8 * INTERVALS
    rules = set()
    for rnd, tenant, limit, policy in directives:
        reply = controller.explain(tenant, rnd)
        rec = json.loads(reply.record_json)
        assert (rec["round"], rec["tenant"], rec["limit"]["bytes"]) == (rnd, tenant, limit)
        assert rec["policy"]["chosen"] == policy
        assert limit_from_record(rec) == limit, (rnd, tenant, rec["step"])
        text = explain(rec)
        head, limit_line = text.splitlines()[:2]
        assert head.endswith(f"limit {mib(limit)}, policy {policy}")
        rule = rec["limit"]["rule"]
        rules.add(rule)
        words = LIMIT_WORDS[rule].split("{")[0]
        assert limit_line.startswith("  limit: " + words), (rule, limit_line)
        assert "{" not in text
    # the run exercised more than one way of setting a limit
    assert {"step", "in-force"} <= rules, rules
    # and a random sample of 50, to the byte, by the record's own arithmetic
    for rnd, tenant, limit, _ in random.Random(7).sample(directives, 50):
        rec = json.loads(controller.explain(tenant, rnd).record_json)
        s = rec["step"]
        stepped = s["base_pages"] + s["scale"] * s["want_pages"] - s["cut_pages"]
        new = max(stepped, s["floor_pages"])
        expect = rec["inputs"]["limit_bytes"] if new == s["in_force_pages"] and \
            rec["inputs"]["limit_bytes"] > 0 else max(int(new), int(s["floor_pages"])) * 4096
        assert expect == limit


def test_explain_refuses_what_it_does_not_keep(recorded):
    from cachepilot.controller.registry import Refused
    _, _, controller = recorded
    with pytest.raises(Refused, match="round 999 is not kept"):
        controller.explain("a-db", 999)
    with pytest.raises(Refused, match="unknown tenant"):
        controller.explain("nobody", 0)


def test_admin_explain_against_a_live_controller(tmp_path):
    from cachepilot.agent.client import NodeClient
    from cachepilot.controller.service import serve
    from cachepilot.sim.backend import SimBackend
    cfg = load_config(DEMO)
    served = serve(cfg, listen="127.0.0.1:0", watch_lost=False, store=MemoryStore())
    target = f"127.0.0.1:{served.port}"
    clients = [NodeClient(SimBackend(cfg, n.name), target, insecure=True) for n in cfg.nodes]
    try:
        for _ in range(6):
            for c in clients:
                assert c.step().connected
        rc, out = cli("admin", "--config", DEMO, "--target", target, "explain", "a-db")
        assert rc == 0
        lines = out.splitlines()
        assert lines[0].startswith("a-db on node-a, round ")
        assert any(ln.startswith("  limit: ") for ln in lines)
        assert any(ln.startswith("  SLO: ") for ln in lines)      # a-db has an SLO
        assert "bytes" not in out                                  # sizes in MiB
        rc, out = cli("admin", "--config", DEMO, "--target", target, "--json",
                      "explain", "a-db", "--round", "3")
        rec = json.loads(out)
        assert rec["round"] == 3 and rec["tenant"] == "a-db"
        assert rc == 0 and limit_from_record(rec) == rec["limit"]["bytes"]
    finally:
        for c in clients:
            c.close()
        served.stop(0)


def test_admin_explain_says_when_nothing_is_traced(tmp_path, capsys):
    from cachepilot.controller.service import serve
    cfg = load_config(DEMO)
    served = serve(cfg, listen="127.0.0.1:0", watch_lost=False, store=MemoryStore())
    try:
        rc = main(["admin", "--config", str(DEMO), "--target", f"127.0.0.1:{served.port}",
                   "explain", "a-db"])
        assert rc != 0
        assert "has no decision round yet" in capsys.readouterr().err
    finally:
        served.stop(0)


def test_traces_are_kept_for_trace_rounds(tmp_path):
    for store, slack in ((MemoryStore(), 0), (SQLiteStore(tmp_path / "s.db"), 100)):
        for rnd in range(1, 251):
            store.put_trace(rnd, ["t", "u"] if rnd % 2 else ["u"], f"r{rnd}".encode(), keep=10)
        blob, first, last = store.read_trace("t")
        assert blob == b"r249" and last == 249
        assert 239 - slack <= first <= 241
        assert store.read_trace("t", 245)[0] == b"r245"
        assert store.read_trace("t", 246)[0] is None        # t was not in that round
        assert store.read_trace("u", 246)[0] == b"r246"
        assert store.read_trace("t", 5)[0] is None
        assert store.read_trace("other") == (None, 0, 0)


def test_traces_in_memory_are_bounded_in_bytes_too(monkeypatch):
    from cachepilot.controller import store as store_mod
    monkeypatch.setattr(store_mod, "TRACE_MEMORY", 1000)
    m = MemoryStore()
    for rnd in range(1, 50):
        m.put_trace(rnd, ["t"], b"x" * 100, keep=10_000)
    assert m.read_trace("t")[1:] == (40, 49)        # the newest ten of 100 bytes


def test_a_recording_says_what_is_wrong_with_it(recorded, tmp_path):
    _, folder, _ = recorded
    with pytest.raises(UserError, match="not a zstd-compressed recording"):
        (tmp_path / "junk").write_text("hello")
        recording.read(tmp_path / "junk")
    with pytest.raises(UserError, match="cannot read a recording"):
        recording.read(tmp_path / "absent")
    other = tmp_path / "v9"
    r = recording.Recorder(other)
    r.close()
    raw = (other / recording.FILE).read_bytes()
    import zstandard
    head = json.dumps({"type": "header", "format": recording.FORMAT, "version": 9})
    (other / recording.FILE).write_bytes(zstandard.ZstdCompressor().compress(
        head.encode() + b"\n"))
    with pytest.raises(UserError, match="format version 9"):
        recording.read(other)
    assert raw
    # a kill in the middle of writing a round: the rounds before it replay
    whole = (folder / recording.FILE).read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / recording.FILE).write_bytes(whole[:len(whole) * 2 // 3])
    rc, out = cli("replay", cut)
    m = re.search(r"replayed (\d+) rounds, \d+ directives, 0 differ", out)
    assert m and 0 < int(m[1]) < 80
