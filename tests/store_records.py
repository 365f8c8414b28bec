"""Every kind of record a state store keeps, written and checked: the
same calls for each store (tests/test_store.py, tests/test_store_etcd.py)."""
from cachepilot.controller.store import LogRecord, SavedDirective

MiB = 1 << 20


def write_every_record_kind(s) -> None:
    s.put_slo("a", 1500.0, 1.0)
    s.put_slo("b", None, 2.0)                     # cleared
    s.put_mode("", "recommend", 3.0)
    s.put_mode("a", None, 3.0)
    s.put_node("n1", {"node_id": "n1", "memory_bytes": 64}, 4.0)
    log = [LogRecord(7, 100.0 + i, "n1", "a" if i % 2 else "b", "limit", f"m{i}",
                     {"predicted": i}) for i in range(10)]
    s.write_round(7, {"a": SavedDirective("n1", 32 * MiB, "fifo", "why", 7, 5.0, True)},
                  {"a": {"streak": 2, "held_until": {"lfu": 40}}}, log)


def check_every_record_kind(s) -> None:
    """What write_every_record_kind wrote, read back from a store opened anew."""
    saved = s.load(log_tail=4)
    assert saved.slos == {"a": 1500.0, "b": None}
    assert saved.modes == {"": "recommend", "a": None}
    assert saved.nodes["n1"]["memory_bytes"] == 64
    assert saved.directives["a"].limit_bytes == 32 * MiB and saved.directives["a"].sent
    assert saved.tenants["a"]["held_until"] == {"lfu": 40}
    assert saved.rounds == 7
    assert [e.message for e in saved.log] == ["m6", "m7", "m8", "m9"]   # oldest first
    # the log's filters: newest first, by tenant, since a time, at most n
    assert [e.message for e in s.read_log(tenant="a", limit=3)] == ["m9", "m7", "m5"]
    assert [e.message for e in s.read_log(since=107.0)] == ["m9", "m8", "m7"]
    assert s.read_log(limit=1)[0].detail == {"predicted": 9}
