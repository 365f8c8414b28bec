"""The state store on etcd (`controller.store: etcd://host:port[/prefix]`).

The same calls as controller/store.py's StateStore, kept as one key per
record under the prefix, each a JSON value:

    slo/<tenant>  mode/<scope>  placement/<tenant>  node/<name>
    directive/<tenant>  tenant/<tenant>  rounds
    log/<time in ns, 20 digits>-<writer>-<seq>   one per log entry

Names are percent-quoted (the controller's own scope is `mode/`).  Log
keys sort in time order, so the newest entries are one descending range
read; `writer` is random per store, so two controllers never write the
same key.  The log is pruned to the newest `log_keep` entries every
`prune_every` entries written.  etcd keeps every revision until it is
compacted: run it with --auto-compaction-retention (the store does not
compact, a cluster-wide act on a shared etcd).

A fleet writes every node's round every interval, and etcd may go away:
so a record is put only when it changed, no call waits on etcd while
holding the rounds' lock, and a store that lost etcd keeps what it must
write until etcd answers again.  EtcdStore says how.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import asdict
from urllib.parse import quote, unquote

from cachepilot.controller.etcd import TIMEOUT_S, Etcd, StoreUnavailable, put_op
from cachepilot.controller.store import (LOG_KEEP, PRUNE_EVERY, LogRecord, MemoryTraces,
                                         Saved, SavedDirective)
from cachepilot.core.errors import UserError

log = logging.getLogger("cachepilot.controller.store")

MAX_TXN_OPS = 128             # etcd's default --max-txn-ops
MAX_TXN_BYTES = 1 << 20       # of base64 payload, under etcd's 1.5 MiB request limit
OP_OVERHEAD = 64              # JSON around one put
RETRY_S = 1.0
PENDING_LOG = 20_000          # log entries kept while etcd is unreachable
KINDS = ("slo", "mode", "placement", "node", "directive", "tenant")
# what an operator sets through any replica, for all of them
SETTINGS = ("slo/", "mode/", "placement/")


def _json(value) -> str:
    # sorted and compact: the same record is the same text, so "unchanged" is a comparison
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def record_key(kind: str, name: str) -> str:
    return f"{kind}/{quote(name, safe='')}"


def _b64_len(text: str) -> int:
    return (len(text.encode()) + 2) // 3 * 4


class EtcdStore(MemoryTraces):
    """StateStore on etcd, resilient to etcd going away.

    - A fleet writes every node's round every interval, so a record is put
      only when its JSON differs from what this store last wrote or loaded:
      an unchanged record costs nothing.  Unless a value of it is still
      queued or being written: etcd may hold that one next, so the newest
      is queued after it whatever it says (else a value that went A -> B ->
      A while B was written would leave B in etcd).  What etcd holds is
      known with the revision it was read or written at, and a read never
      replaces what a later write of ours made it hold.
    - No call waits on etcd while holding the lock the rounds' calls take:
      reads (a node's tenants taken over, the log) ask etcd with it let go.
    - etcd refuses a transaction of more than 128 operations (--max-txn-ops)
      or 1.5 MiB, so pending writes go in transactions under both
      (`batches`); `rounds` goes last, after the round's records.  Each
      transaction is atomic, a round of many is not: after a crash between
      two, some records are of the newer round; each record is whole.
    - Losing etcd must not stop a controller's rounds.  A write that fails
      keeps the newest value of every record (and up to `pending_log` log
      entries) in memory, says so once in the log, marks `available` False,
      and tries again at most every `retry_s` on later calls, each try
      bounded by the client's short timeout.  When etcd answers again
      everything kept is written and the log says so.  `load()` on an
      unreachable etcd is a UserError: a controller must not start from
      nothing without saying."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S, log_keep: int = LOG_KEEP,
                 retry_s: float = RETRY_S, pending_log: int = PENDING_LOG,
                 prune_every: int = PRUNE_EVERY, write_behind_s: float | None = None):
        self.client = Etcd(url, timeout)
        self.path = self.client.url          # what messages name the store by
        self.log_keep = log_keep
        self.prune_every = prune_every
        self.retry_s = retry_s
        self.available = True
        self._lock = threading.RLock()
        self._written: dict[str, str] = {}   # key -> the JSON etcd holds (as far as we know)
        self._revs: dict[str, int] = {}      # key -> the revision _written[key] was seen at
        self._pending: dict[str, str] = {}   # key -> the newest JSON not yet written
        self._pending_log: deque[tuple[str, str]] = deque(maxlen=pending_log)
        self._dropped = 0                    # log entries the bound made us forget
        self._next_try = 0.0
        self._writer = os.urandom(4).hex()
        self._seq = itertools.count()
        self._appended = 0
        # write-behind: calls only queue, and a thread writes what is queued
        # every write_behind_s without holding the lock the calls take, so
        # a round never waits for etcd (its fsync, or its absence)
        self._behind = write_behind_s
        self._stop = threading.Event()
        self._flusher = None
        if write_behind_s:
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name="etcd-store-flush")
            self._flusher.start()

    @property
    def pending(self) -> dict[str, int]:
        """What waits to be written: {"records": n, "log": n}."""
        with self._lock:
            return {"records": len(self._pending), "log": len(self._pending_log)}

    # -- reads ---------------------------------------------------------------------
    def load(self, log_tail: int) -> Saved:
        with self._lock:
            try:
                kvs = {kind: self.client.get_prefix(kind + "/") for kind in KINDS}
                rounds = self.client.get_kv("rounds")
                tail = self.client.get_prefix("log/", limit=log_tail, newest_first=True) \
                    if log_tail else []
            except StoreUnavailable as err:
                raise UserError(f"cannot start from the controller's state store: {err}") \
                    from None
            for kind in KINDS:
                for k, v, rev in kvs[kind]:
                    self._learn(k, v, rev)
            if rounds is not None:
                self._learn("rounds", rounds[0], rounds[1])
            records = {k: v for k, v in self._written.items() if not k.startswith("log/")}
            records.update(self._pending)    # this process's newer values come first
            log_kvs = [(k, v) for k, v, _ in reversed(tail)] + list(self._pending_log)
            return _saved(records, [_entry(v) for _, v in log_kvs[-log_tail:]]
                          if log_tail else [])

    def load_tenants(self, names) -> Saved:
        """The directives and engine records of these tenants alone (a
        replica taking over a node from another: controller/fleet.py), the
        newest of etcd's and this store's own.  Raises StoreUnavailable
        when etcd cannot be asked."""
        keys = [record_key(kind, n) for n in names for kind in ("directive", "tenant")]
        stored = self.client.get_many(keys)          # not under the lock: a round may write
        with self._lock:
            for k, (v, rev) in stored.items():
                self._learn(k, v, rev)
            records = {k: self._pending.get(k, self._written.get(k)) for k in keys}
        return _saved({k: v for k, v in records.items() if v is not None}, [])

    def accept(self, kvs: list[tuple[str, str, int]]) -> Saved:
        """Records read from etcd by someone else (the fleet's watch: SLOs
        and modes another replica set), as a Saved, less those this store
        has newer values of: queued or being written (its own will land
        after them), or written by it at a later revision.  The rest are
        learnt as what etcd holds.  No call to etcd."""
        with self._lock:
            fresh = {}
            for k, v, rev in kvs:
                if k in self._pending or rev < self._revs.get(k, 0):
                    continue
                self._learn(k, v, rev)
                fresh[k] = v
        return _saved(fresh, [])

    def _learn(self, key: str, text: str, rev: int) -> None:
        """etcd holds `text` at `key` as of revision `rev`, unless we know
        of a later one (under the lock)."""
        if rev >= self._revs.get(key, 0):
            self._written[key] = text
            self._revs[key] = rev

    def read_log(self, since=0.0, tenant="", limit=50) -> list[LogRecord]:
        """Newest first, from etcd and from the entries not yet written;
        while etcd is unreachable, from the latter alone."""
        start = f"log/{int(since * 1e9):020d}" if since > 0 else ""
        with self._lock:
            out = [e for e in (_entry(v) for k, v in reversed(self._pending_log))
                   if e.time >= since and (not tenant or e.tenant == tenant)][:limit]
            backing_off = not self.available and time.monotonic() < self._next_try
        if backing_off or len(out) >= limit:
            return out
        try:                                        # not under the lock: a round may write
            out += self._read_stored(start, tenant, limit - len(out))
        except StoreUnavailable as err:
            with self._lock:
                self._lost(err)
        return out

    def _read_stored(self, start, tenant, want) -> list[LogRecord]:
        out: list[LogRecord] = []
        page, end = (want if not tenant else max(4 * want, 256)), ""
        while len(out) < want:
            kvs = self.client.get_prefix("log/", limit=page, newest_first=True, start=start,
                                         end=end)
            out += [e for e in (_entry(v) for _, v, _ in kvs)
                    if not tenant or e.tenant == tenant]
            if len(kvs) < page:
                break
            end = kvs[-1][0]
        return out[:want]

    # -- writes --------------------------------------------------------------------
    def put_slo(self, tenant, min_throughput, at):
        self._write({record_key("slo", tenant): {"min_throughput": min_throughput, "at": at}})

    def put_mode(self, scope, mode, at):
        self._write({record_key("mode", scope): {"mode": mode, "at": at}})

    def put_node(self, name, registration, at):
        self._write({record_key("node", name): {"registration": registration, "at": at}})

    def put_placement(self, tenant, node, at):
        self._write({record_key("placement", tenant): {"node": node, "at": at}})

    def write_round(self, rounds, directives, tenants, log_entries):
        records = {record_key("directive", t): asdict(d) for t, d in directives.items()}
        records.update({record_key("tenant", t): st for t, st in tenants.items()})
        records["rounds"] = rounds
        self._write(records, log_entries)

    def append_log(self, log_entries):
        if log_entries:
            self._write({}, log_entries)

    def _write(self, records: dict, entries=()):
        with self._lock:
            for key, value in records.items():
                text = _json(value)
                # equal to what etcd holds, and no other value on its way
                # there (queued or in flight: both stay in _pending until
                # written): nothing to write
                if key not in self._pending and self._written.get(key) == text:
                    continue
                self._pending[key] = text
            for e in entries:
                if len(self._pending_log) == self._pending_log.maxlen:
                    self._dropped += 1
                key = f"log/{int(e.time * 1e9):020d}-{self._writer}-{next(self._seq):010d}"
                self._pending_log.append((key, _json(asdict(e))))
            if not self._behind:
                self._sync()

    def _flush_loop(self):
        while not self._stop.wait(self._behind):
            self._sync()

    # -- writing what is pending, and losing etcd -----------------------------------------
    def _sync(self):
        """Write what is queued now.  The queues are touched only under the
        (reentrant) lock, taken again around each step: a caller that holds
        it (a call in synchronous mode, close) keeps etcd's answers under
        it, while the write-behind thread lets go of it while etcd answers.
        A record queued again meanwhile stays queued with its newer value."""
        with self._lock:
            if (not self._pending and not self._pending_log) or \
                    (not self.available and time.monotonic() < self._next_try):
                return
            kept = (len(self._pending), len(self._pending_log), self._dropped)
            items = [(k, v) for k, v in self._pending.items() if k != "rounds"]
            items += list(self._pending_log)
            if "rounds" in self._pending:
                items.append(("rounds", self._pending["rounds"]))
        try:
            for batch in batches(items):
                rev = self.client.put_all([put_op(k, v) for k, v in batch],
                                          what=f"write of {len(batch)} records")
                with self._lock:
                    self._mark_written(batch, rev)
            with self._lock:
                self._prune()
        except StoreUnavailable as err:
            with self._lock:
                self._lost(err)
            return
        with self._lock:
            self._back(kept)

    def _back(self, kept):
        if not self.available:
            self.available = True
            log.warning("state store %s reachable again: wrote the %d records and %d log "
                        "entries kept while it was not%s", self.path, kept[0], kept[1],
                        f" ({kept[2]} older log entries were dropped)" if kept[2] else "")
            self._dropped = 0

    def _lost(self, err: StoreUnavailable):
        self._next_try = time.monotonic() + self.retry_s
        if self.available:
            self.available = False
            log.warning("state store %s unreachable: %s; keeping %d records to write when "
                        "it returns", self.path, err,
                        len(self._pending) + len(self._pending_log))

    def _mark_written(self, batch, rev: int):
        for k, v in batch:
            if k.startswith("log/"):
                # the oldest entries are the ones written: only a writer
                # takes from the left, and new entries join on the right
                if self._pending_log and self._pending_log[0][0] == k:
                    self._pending_log.popleft()
                self._appended += 1
            else:
                self._learn(k, v, rev)
                if self._pending.get(k) == v:
                    self._pending.pop(k)

    def _prune(self):
        if self._appended < self.prune_every:
            return
        self._appended = 0
        excess = self.client.count_prefix("log/") - self.log_keep
        if excess > 0:
            oldest = self.client.get_prefix("log/", limit=excess, keys_only=True)
            self.client.delete_before("log/", oldest[-1][0] + "\0")

    def close(self):
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        with self._lock:
            self._next_try = 0.0
            self._sync()
            if self._pending or self._pending_log:
                log.warning("state store %s: closed with %d records and %d log entries "
                            "not written", self.path, len(self._pending),
                            len(self._pending_log))


def batches(items: list[tuple[str, str]]):
    """Consecutive runs of (key, value) each within etcd's limits on one
    transaction (a single record over the byte limit goes alone)."""
    batch, size = [], 0
    for k, v in items:
        n = _b64_len(k) + _b64_len(v) + OP_OVERHEAD
        if batch and (len(batch) >= MAX_TXN_OPS or size + n > MAX_TXN_BYTES):
            yield batch
            batch, size = [], 0
        batch.append((k, v))
        size += n
    if batch:
        yield batch


def _entry(text: str) -> LogRecord:
    return LogRecord(**json.loads(text))


def _saved(records: dict[str, str], entries: list[LogRecord]) -> Saved:
    s = Saved(log=entries)
    for key, text in records.items():
        kind, _, name = key.partition("/")
        name, value = unquote(name), json.loads(text)
        if kind == "slo":
            s.slos[name] = value["min_throughput"]
        elif kind == "mode":
            s.modes[name] = value["mode"]
        elif kind == "placement":
            s.placements[name] = value["node"]
        elif kind == "node":
            s.nodes[name] = value["registration"]
        elif kind == "directive":
            s.directives[name] = SavedDirective(**value)
        elif kind == "tenant":
            s.tenants[name] = value
        elif kind == "rounds":
            s.rounds = int(value)
    return s
