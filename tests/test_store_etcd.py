"""Issue 19: the controller's state store on etcd.

Against a real etcd on loopback (tests/etcd_fixture.py; skipped, saying
so, where the `etcd` binary is missing): every record kind and the log's
filters, a round over etcd's 128 operations a transaction, unchanged
records not written again, leader election with leases, the must-show of
losing the store (SIGKILL etcd mid-use: the calls return, nothing raises,
and everything written meanwhile is in etcd once it is back), and a
controller restarted on the same etcd.  The config key needs no etcd.
"""
import logging
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from etcd_fixture import EtcdServer, wait_until  # noqa: E402
from lock_probe import free_elsewhere  # noqa: E402
from grpc_fixtures import report, small_config_dict  # noqa: E402
from store_records import check_every_record_kind, write_every_record_kind  # noqa: E402

from cachepilot.controller.config import load_config
from cachepilot.controller.etcd import Etcd, StoreUnavailable
from cachepilot.controller.service import Controller
from cachepilot.controller.store import LogRecord, SavedDirective, open_store
from cachepilot.controller.store_etcd import EtcdStore
from cachepilot.core.errors import UserError
from cachepilot.protocol.types import NodeInfo

MiB = 1 << 20


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    yield server
    server.stop()


@pytest.fixture
def url(etcd, request):
    return etcd.url("/t/" + request.node.name.replace("[", "-").rstrip("]"))


def _log(n, round_=7, t0=100.0):
    return [LogRecord(round_, t0 + i, "n1", "a" if i % 2 else "b", "limit", f"m{i}",
                      {"predicted": i}) for i in range(n)]


def test_every_record_kind_comes_back_from_etcd(url):
    s = EtcdStore(url)
    write_every_record_kind(s)
    s.close()
    s = EtcdStore(url)
    check_every_record_kind(s)
    assert s.path == url and s.available
    s.close()


def test_a_tenant_filter_pages_past_other_tenants_entries(url):
    s = EtcdStore(url)
    entries = [LogRecord(1, 10.0 + i, "n1", "rare" if i in (3, 700) else "busy", "k", f"m{i}")
               for i in range(900)]
    s.append_log(entries)
    assert [e.message for e in s.read_log(tenant="rare", limit=5)] == ["m700", "m3"]


def test_a_round_over_128_operations_is_written_whole(url):
    s = EtcdStore(url)
    n = 300                                        # 600 records and 150 log entries
    directives = {f"t{i}": SavedDirective("n1", i * MiB, "lru", "r", 3, 1.0, True)
                  for i in range(n)}
    tenants = {f"t{i}": {"obs_m": [0.1] * 50, "i": i} for i in range(n)}
    s.write_round(3, directives, tenants, _log(150))
    assert s.pending == {"records": 0, "log": 0}
    saved = EtcdStore(url).load(log_tail=1000)
    assert len(saved.directives) == n and len(saved.tenants) == n
    assert saved.directives["t299"].limit_bytes == 299 * MiB and saved.tenants["t7"]["i"] == 7
    assert len(saved.log) == 150 and saved.rounds == 3


def test_the_log_is_pruned_to_its_bound_keeping_the_newest(url):
    s = EtcdStore(url, log_keep=50, prune_every=100)
    for k in range(4):                             # 200 entries, pruned at 100 and 200
        s.append_log([LogRecord(1, 10.0 + 50 * k + i, "n1", "a", "k", f"m{50 * k + i}")
                      for i in range(50)])
    assert Etcd(url).count_prefix("log/") == 50
    assert [e.message for e in s.read_log(limit=1000)][::49] == ["m199", "m150"]


def _revisions(url, prefix):
    return {k: rev for k, _, rev in Etcd(url).get_prefix(prefix)}


def test_unchanged_records_are_not_written_again(url):
    s = EtcdStore(url)
    d = {t: SavedDirective("n1", MiB, "lru", "r", 1, 1.0, True) for t in ("a", "b")}
    s.write_round(1, d, {"a": {"x": 1}, "b": {"x": 1}}, [])
    before = _revisions(url, "")
    s.write_round(1, d, {"a": {"x": 1}, "b": {"x": 2}}, [])      # only tenant b changed
    after = _revisions(url, "")
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {"tenant/b"}
    # a store started from etcd knows what etcd holds, and writes nothing again
    again = EtcdStore(url)
    again.load(0)
    again.write_round(1, d, {"a": {"x": 1}, "b": {"x": 2}}, [])
    again.put_slo("a", None, 1.0)
    assert {k: r for k, r in _revisions(url, "").items() if k != "slo/a"} == after


def test_leader_election_with_leases(url):
    a, b = Etcd(url), Etcd(url)
    la, lb = a.lease(2).start(), b.lease(2).start()
    assert a.campaign("leader", "controller-a", la)
    assert not b.campaign("leader", "controller-b", lb)
    time.sleep(2.5)                               # past the TTL: kept alive at TTL/3
    assert not la.lost and b.leader("leader") == "controller-a"
    la.revoke()                                   # the leader steps down
    assert la.lost and a.leader("leader") is None
    assert b.campaign("leader", "controller-b", lb)
    assert a.leader("leader") == "controller-b"
    lc = a.lease(10)
    assert not a.campaign("leader", "controller-a", lc)
    lb.stop()                                     # b hangs: its lease expires, the key with it
    end = time.monotonic() + 6
    while a.leader("leader") is not None and time.monotonic() < end:
        time.sleep(0.2)
    assert a.leader("leader") is None and lb.lost and not lb.keepalive()
    assert a.campaign("leader", "controller-a", lc)
    lc.revoke()
    lb.revoke()                                   # already gone: not an error


def test_an_unreachable_etcd_is_one_typed_error_naming_the_url(etcd):
    etcd_dead = Etcd(f"etcd://127.0.0.1:{_closed_port()}/x", timeout=1)
    t = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"etcd://127\.0\.0\.1:\d+/x: get k failed"):
        etcd_dead.get("k")
    assert time.monotonic() - t < 2
    with pytest.raises(UserError, match="cannot start from the controller's state store: "
                                        r"etcd://127\.0\.0\.1:\d+/x"):
        EtcdStore(etcd_dead.url).load(10)
    live = Etcd(etcd.url("/t/undisturbed"))        # the live one is not disturbed
    live.put("k", "v")
    assert live.get("k") == "v"


def test_an_etcd_that_never_answers_costs_one_short_timeout():
    with socket.socket() as hung:                  # accepts (the backlog), never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        client = Etcd(f"etcd://127.0.0.1:{hung.getsockname()[1]}", timeout=0.5)
        t = time.monotonic()
        with pytest.raises(StoreUnavailable, match="put k failed: timed out"):
            client.put("k", "v")
        assert time.monotonic() - t < 1.5


def _closed_port():
    from etcd_fixture import free_port
    return free_port()


def test_losing_etcd_keeps_the_rounds_going_and_writes_everything_when_it_is_back(
        tmp_path, caplog):
    server = EtcdServer(tmp_path / "data")
    try:
        url = server.url("/loss")
        s = EtcdStore(url, retry_s=0.5)
        s.load(0)
        s.put_slo("a", 100.0, 1.0)
        s.write_round(1, {}, {"a": {"x": 1}}, _log(2))
        server.kill()
        caplog.set_level(logging.WARNING, logger="cachepilot.controller.store")
        calls = [lambda: s.put_slo("a", 2500.0, 2.0), lambda: s.put_mode("b", "recommend", 2.0),
                 lambda: s.put_node("n2", {"node_id": "n2"}, 2.0),
                 lambda: s.write_round(2, {}, {"a": {"x": 2}}, _log(3, 2, 200.0)),
                 lambda: s.append_log(_log(1, 2, 300.0)),
                 lambda: s.write_round(3, {}, {"a": {"x": 3}}, [])]
        for call in calls:
            t = time.monotonic()
            call()                                 # never raises
            assert time.monotonic() - t < 2
        assert not s.available
        assert s.pending == {"records": 5, "log": 4}
        lost = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(lost) == 1 and url in lost[0] and "keeping" in lost[0], lost
        assert [e.message for e in s.read_log(limit=2)] == ["m0", "m2"]   # from memory
        server.start()
        time.sleep(0.6)                            # past retry_s
        s.put_slo("c", 7.0, 3.0)                   # the next call writes everything
        assert s.available and s.pending == {"records": 0, "log": 0}
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        saved = EtcdStore(url).load(100)
        assert saved.slos == {"a": 2500.0, "c": 7.0} and saved.modes == {"b": "recommend"}
        assert "n2" in saved.nodes and saved.tenants["a"] == {"x": 3} and saved.rounds == 3
        assert len(saved.log) == 6
    finally:
        server.stop()


def test_written_behind_a_round_never_waits_for_etcd_and_loses_nothing(tmp_path, caplog):
    """The controller's store writes behind (open_store): the calls only
    queue, a thread writes; with etcd gone the calls take no time at all,
    and what they queued is written once it is back."""
    server = EtcdServer(tmp_path / "data")
    try:
        url = server.url("/behind")
        s = EtcdStore(url, retry_s=0.3, write_behind_s=0.05)
        s.load(0)
        s.write_round(1, {}, {"a": {"x": 1}}, _log(2))
        assert wait_until(lambda: s.pending == {"records": 0, "log": 0}, 3)
        assert EtcdStore(url).load(10).tenants["a"] == {"x": 1}
        server.kill()
        caplog.set_level(logging.WARNING, logger="cachepilot.controller.store")
        t = time.monotonic()
        for r in range(2, 40):
            s.write_round(r, {}, {"a": {"x": r}, f"t{r}": {"y": r}}, _log(1, r, 100.0 + r))
        assert time.monotonic() - t < 0.5          # no call waited on the dead etcd
        assert wait_until(lambda: not s.available, 5)
        server.start()
        assert wait_until(lambda: s.available and s.pending == {"records": 0, "log": 0}, 10)
        saved = EtcdStore(url).load(100)
        assert saved.tenants["a"] == {"x": 39} and saved.rounds == 39
        assert len(saved.tenants) == 39 and len(saved.log) == 2 + 38
        s.close()
    finally:
        server.stop()


def _config(tmp_path, store):
    data = small_config_dict(tmp_path)
    data["controller"]["store"] = store
    data["control"].update(max_step_fraction=0.1, interval_s=10.0)
    path = tmp_path / "ctl.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_controller_restarted_on_the_same_etcd_has_its_slo_and_mode(tmp_path, url):
    cfg_path = _config(tmp_path, url)
    c = Controller(load_config(cfg_path), store=open_store(load_config(cfg_path)))
    assert isinstance(c.store, EtcdStore)
    session, _, _ = c.register(NodeInfo("n1", 64 * MiB, 2, True, ["lru", "fifo"], "sim"))
    c.report("n1", session, 1, [report("n1-t0"), report("n1-t1")], [])
    c.set_slo("n1-t0", 2500.0)
    c.set_mode("n1-t1", "recommend")
    rounds = c.rounds
    c.close()

    again = Controller(load_config(cfg_path), store=EtcdStore(url))
    assert again.config.tenant("n1-t0").slo.min_throughput == 2500.0
    assert again.mode_of("n1-t1") == "recommend"
    assert again.rounds == rounds
    kinds = [e.kind for e in again.decision_log(limit=100).entries]
    assert "restart" in kinds and "slo" in kinds and "register" in kinds
    again.close()


@pytest.mark.parametrize("store", ["sqlite", "etcd://127.0.0.1:2379",
                                   "etcd://localhost:2379/fleet/a"])
def test_the_store_key_takes_sqlite_or_an_etcd_url(tmp_path, store):
    cfg = load_config(_config(tmp_path, store))
    assert cfg.controller.store == store


@pytest.mark.parametrize("bad", ["foo", "etcd://", "etcd://host", "etcd://h:99999",
                                 "http://127.0.0.1:2379", "etcd://h:1/a b"])
def test_a_bad_store_is_a_keyed_error(tmp_path, bad):
    with pytest.raises(UserError) as err:
        load_config(_config(tmp_path, bad))
    assert (f"controller.store: expected 'sqlite' or etcd://host:port[/prefix], got {bad!r}"
            in str(err.value)), str(err.value)


# -- the store's bookkeeping, deterministic: an etcd client stand-in ----------------------

class FakeClient:
    """Enough of controller/etcd.py's Etcd for EtcdStore, in memory:
    every put_all makes a revision.  `during` runs inside the next call
    that asks "etcd" (what a round does while a write is in flight), and
    `down` makes every call fail as an unreachable etcd does."""

    url = "etcd://fake:1/x"

    def __init__(self):
        self.kv: dict[str, tuple[str, int]] = {}
        self.rev = 0
        self.calls = 0
        self.during = None
        self.down = False

    def _ask(self):
        self.calls += 1
        if self.down:
            raise StoreUnavailable(f"{self.url}: down")
        if self.during is not None:
            during, self.during = self.during, None
            during()

    def put_all(self, ops, what=""):
        self._ask()
        self.rev += 1
        for _, k, v, _ in ops:
            self.kv[k] = (v, self.rev)
        return self.rev

    def get_many(self, keys):
        self._ask()
        return {k: self.kv[k] for k in keys if k in self.kv}

    def get_prefix(self, prefix, limit=0, newest_first=False, start="", end="",
                   keys_only=False):
        self._ask()
        return sorted(((k, v, r) for k, (v, r) in self.kv.items() if k.startswith(prefix)),
                      reverse=newest_first)[:limit or None]


def _store(**kw):
    """An EtcdStore on FakeClient whose write-behind thread never wakes:
    the test calls _sync() itself."""
    s = EtcdStore(FakeClient.url, write_behind_s=3600, **kw)
    s.client = FakeClient()
    return s


def test_a_value_that_returns_while_another_is_written_is_written_again():
    s = _store()
    s.put_slo("a", 1.0, 0.0)                       # etcd holds A
    s._sync()
    a = s.client.kv["slo/a"][0]
    s.put_slo("a", 2.0, 0.0)                       # B queued ...
    # ... and in flight when the value goes back to A
    s.client.during = lambda: s.put_slo("a", 1.0, 0.0)
    s._sync()
    assert s.client.kv["slo/a"][0] != a            # B landed
    assert s.pending == {"records": 1, "log": 0}   # A waits, not dropped as "unchanged"
    s._sync()
    assert s.client.kv["slo/a"][0] == a
    s.put_slo("a", 1.0, 0.0)                       # now truly unchanged: nothing to write
    assert s.pending == {"records": 0, "log": 0}
    s.close()


def test_reads_ask_etcd_without_the_stores_lock():
    s = _store()
    s.write_round(1, {}, {"a": {"x": 1}}, _log(3))
    s._sync()
    free = []
    s.client.during = lambda: free.append(free_elsewhere(s._lock))
    assert s.load_tenants(["a"]).tenants == {"a": {"x": 1}}
    s.client.during = lambda: free.append(free_elsewhere(s._lock))
    assert [e.message for e in s.read_log(limit=2)] == ["m2", "m1"]
    assert free == [True, True]
    s.close()


def test_a_read_older_than_our_own_write_does_not_replace_it():
    s = _store()
    s.write_round(1, {}, {"a": {"x": 1}}, [])
    s._sync()
    old = s.client.kv["tenant/a"]

    def written_meanwhile():                       # our newer value lands mid-read
        s.write_round(2, {}, {"a": {"x": 2}}, [])
        s.client.kv, kv = dict(s.client.kv), s.client.kv
        s._sync()
        s.client.kv = {**kv, "tenant/a": old}       # the read saw etcd before it
    s.client.during = written_meanwhile
    assert s.load_tenants(["a"]).tenants == {"a": {"x": 2}}
    s.write_round(3, {}, {"a": {"x": 1}}, [])      # differs from what we wrote last
    assert s.pending["records"] == 2               # tenant/a and rounds
    s.close()


def test_settings_read_by_the_fleet_leave_out_what_this_store_has_newer():
    s = _store()
    s.put_mode("", "recommend", 0.0)               # written here at mode_rev
    s._sync()
    mode_rev = s.client.kv["mode/"][1]
    s.put_slo("a", 5.0, 0.0)                       # queued here, not written yet
    got = s.accept([("slo/a", '{"at":0,"min_throughput":9.0}', 1),
                    ("mode/", '{"at":0,"mode":"enforce"}', mode_rev - 1),
                    ("slo/c", '{"at":0,"min_throughput":3.0}', 7)])
    assert got.slos == {"c": 3.0} and got.modes == {}
    # learnt: the same value again is not written
    s.put_slo("c", 3.0, 0)
    assert "slo/c" not in s._pending
    s.close()


def test_reading_the_log_while_etcd_is_away_waits_for_the_back_off():
    s = _store(retry_s=60)
    s.append_log(_log(2))
    s.client.down = True
    s._sync()                                      # the write fails: back off
    calls = s.client.calls
    assert [e.message for e in s.read_log(limit=5)] == ["m1", "m0"]   # from memory
    assert s.client.calls == calls                 # and without asking etcd
    s.client.down = False
    s.close()
