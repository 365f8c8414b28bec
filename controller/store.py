"""Where the controller keeps what a restart must not lose.

Most of what the controller knows arrives again in the next report of
every node (limits, policies, usage, curves).  What does not -- SLOs,
modes, node registrations, the last directives, the engine's memory of
each tenant, the decision log (StateStore lists them) -- is kept here.
A restarted controller starts from `load()` and from the reports.

The interface is small and record-shaped on purpose: every write is a
put of a few whole records (or an append to the log), grouped per
decision round in one `write_round` call, so that a store on a
replicated key-value service (etcd: one key per record under a prefix,
the log as keys in revision order, a round as one transaction) implements
the same calls.  `SQLiteStore` is the embedded default; `MemoryStore`
keeps nothing past the process (`cachepilot run`, tests).  `EtcdStore`
(controller/store_etcd.py) keeps the same records on etcd, for
`controller.store: etcd://host:port[/prefix]`.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from cachepilot.core.errors import UserError

# Log entries kept; older ones are pruned every PRUNE_EVERY appends.
LOG_KEEP = 200_000
PRUNE_EVERY = 5_000
TRACE_PRUNE_EVERY = 100     # rounds between prunings of old trace records
TRACE_MEMORY = 256 << 20    # bytes of traces a store in memory keeps at most


@dataclass
class LogRecord:
    """One line of the decision log."""
    round: int
    time: float
    node: str
    tenant: str
    kind: str
    message: str
    detail: dict = field(default_factory=dict)


@dataclass
class SavedDirective:
    node: str
    limit_bytes: int
    policy: str
    reason: str
    round: int
    time: float
    sent: bool                      # False: recommended only


@dataclass
class Saved:
    """Everything a restarted controller starts from."""
    slos: dict[str, float | None] = field(default_factory=dict)   # None: cleared
    modes: dict[str, str | None] = field(default_factory=dict)    # "" = the controller
    placements: dict[str, str] = field(default_factory=dict)      # tenant -> node moved to
    nodes: dict[str, dict] = field(default_factory=dict)          # name -> registration
    directives: dict[str, SavedDirective] = field(default_factory=dict)
    tenants: dict[str, dict] = field(default_factory=dict)        # engine/saved.py
    rounds: int = 0
    log: list[LogRecord] = field(default_factory=list)            # the newest, oldest first


class StateStore(Protocol):
    """What every store keeps, by kind of record:

        slo          SLOs set or cleared through the admin API
        mode         recommend or enforce, set through the admin API
                     (for the controller, or per tenant)
        node         each node's registration (what it said it is)
        directive    the last directive per tenant, and whether it was sent
                     or only recommended
        tenant       the engine's memory of each tenant (engine/saved.py):
                     autopilot streaks and watchdog holds, the last target,
                     the throughput model's observations
        log          the decision log, with predicted and observed effects
    """

    def load(self, log_tail: int) -> Saved:
        """What was saved, with the newest `log_tail` log entries."""

    def put_slo(self, tenant: str, min_throughput: float | None, at: float) -> None:
        """An SLO set through the admin API (None: cleared)."""

    def put_mode(self, scope: str, mode: str | None, at: float) -> None:
        """A mode set through the admin API; scope "" is the controller's
        own, else a tenant's (None: it follows the controller again)."""

    def put_node(self, name: str, registration: dict, at: float) -> None:
        """A node's registration."""

    def put_placement(self, tenant: str, node: str, at: float) -> None:
        """A tenant moved to `node` (a consolidation plan carried out): it
        runs there, whatever the config says, from then on."""

    def write_round(self, rounds: int, directives: dict[str, SavedDirective],
                    tenants: dict[str, dict], log: list[LogRecord]) -> None:
        """One decision round's results, all or nothing."""

    def append_log(self, log: list[LogRecord]) -> None:
        """Log entries outside a round (registrations, admin changes)."""

    def read_log(self, since: float = 0.0, tenant: str = "", limit: int = 50) -> list[LogRecord]:
        """Newest first: entries at or after `since` (unix seconds), of
        `tenant` when given, at most `limit`."""

    def put_trace(self, rnd: int, tenants: list[str], blob: bytes, keep: int) -> None:
        """One round's trace (engine/trace.py encode()) of `tenants`;
        rounds older than `keep` go."""

    def read_trace(self, tenant: str, rnd: int = 0) -> tuple[bytes | None, int, int]:
        """(the trace of round `rnd` that holds `tenant`, or of its latest
        round for 0; the first and last rounds kept for it); (None, 0, 0)
        where none is kept."""

    def close(self) -> None:
        ...


class MemoryTraces:
    """Traces kept in this process: the in-memory store's, and an etcd
    store's (a day of every tenant's traces is not what etcd is for; a
    replica keeps those of the rounds it decided).  At most `keep` rounds,
    and at most TRACE_MEMORY bytes of them: the oldest go first."""

    def _traces(self):
        if not hasattr(self, "_trace_rounds"):
            self._trace_rounds, self._trace_of = {}, {}
            self._trace_lock = threading.Lock()
            self._trace_bytes = 0
        return self._trace_rounds, self._trace_of

    def put_trace(self, rnd, tenants, blob, keep):
        rounds, of = self._traces()
        with self._trace_lock:
            self._trace_bytes += len(blob) - len(rounds.get(rnd, b""))
            rounds[rnd] = blob
            for t in tenants:
                of.setdefault(t, deque()).append(rnd)
            while rounds and (next(iter(rounds)) <= rnd - keep or
                              self._trace_bytes > TRACE_MEMORY):    # oldest first
                self._trace_bytes -= len(rounds.pop(next(iter(rounds))))
            for t in tenants:
                ring = of[t]
                while ring and ring[0] not in rounds:
                    ring.popleft()

    def read_trace(self, tenant, rnd=0):
        rounds, of = self._traces()
        with self._trace_lock:
            ring = [r for r in of.get(tenant, ()) if r in rounds]
            if not ring:
                return None, 0, 0
            want = rnd or ring[-1]
            return (rounds[want] if want in ring else None), ring[0], ring[-1]


# -- in memory -----------------------------------------------------------------------

class MemoryStore(MemoryTraces):
    """The same calls, kept in this process only."""

    def __init__(self):
        self.saved = Saved()
        self.path = None

    def load(self, log_tail: int) -> Saved:
        s = self.saved
        return Saved(dict(s.slos), dict(s.modes), dict(s.placements), dict(s.nodes),
                     dict(s.directives), dict(s.tenants), s.rounds,
                     list(s.log[-log_tail:]) if log_tail else [])

    def put_slo(self, tenant, min_throughput, at):
        self.saved.slos[tenant] = min_throughput

    def put_mode(self, scope, mode, at):
        self.saved.modes[scope] = mode

    def put_node(self, name, registration, at):
        self.saved.nodes[name] = registration

    def put_placement(self, tenant, node, at):
        self.saved.placements[tenant] = node

    def write_round(self, rounds, directives, tenants, log):
        self.saved.rounds = max(self.saved.rounds, rounds)
        self.saved.directives.update(directives)
        self.saved.tenants.update(tenants)
        self.append_log(log)

    def append_log(self, log):
        self.saved.log.extend(log)
        if len(self.saved.log) > LOG_KEEP + PRUNE_EVERY:
            del self.saved.log[:-LOG_KEEP]

    def read_log(self, since=0.0, tenant="", limit=50):
        out = []
        # a copy: the decision log is read without the controller's lock,
        # while a round may append (and prune)
        for e in reversed(list(self.saved.log)):
            if e.time < since:
                break
            if tenant and e.tenant != tenant:
                continue
            out.append(e)
            if len(out) >= limit:
                break
        return out

    def close(self):
        pass


# -- SQLite ----------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS slo (tenant TEXT PRIMARY KEY, min_throughput REAL,
                                set_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS mode (scope TEXT PRIMARY KEY, mode TEXT, set_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS placement (tenant TEXT PRIMARY KEY, node TEXT NOT NULL,
                                      at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS node (name TEXT PRIMARY KEY, registration TEXT NOT NULL,
                                 at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS directive (tenant TEXT PRIMARY KEY, node TEXT NOT NULL,
                                      limit_bytes INTEGER NOT NULL, policy TEXT NOT NULL,
                                      reason TEXT NOT NULL, round INTEGER NOT NULL,
                                      time REAL NOT NULL, sent INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tenant (name TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER NOT NULL,
                                time REAL NOT NULL, node TEXT NOT NULL, tenant TEXT NOT NULL,
                                kind TEXT NOT NULL, message TEXT NOT NULL, detail TEXT);
CREATE INDEX IF NOT EXISTS log_time ON log (time);
CREATE TABLE IF NOT EXISTS trace (round INTEGER PRIMARY KEY, blob BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS trace_tenant (tenant TEXT NOT NULL, round INTEGER NOT NULL,
                                         PRIMARY KEY (tenant, round));
CREATE INDEX IF NOT EXISTS trace_tenant_round ON trace_tenant (round);
CREATE INDEX IF NOT EXISTS log_tenant ON log (tenant, id);
"""
SCHEMA_VERSION = "1"


class SQLiteStore:
    """The embedded store: one SQLite file (stdlib sqlite3) in WAL mode, so
    a reader never waits for the writer and a commit survives the process
    being killed.  Calls come from the service's threads under its lock;
    the connection is shared, and a lock of its own keeps the store safe
    on its own too."""

    def __init__(self, path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._appended = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), check_same_thread=False,
                                      isolation_level=None, timeout=10)
            mode = self.db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise sqlite3.OperationalError(f"journal mode {mode}, not wal")
            # WAL with NORMAL: a commit is in the log file before the call
            # returns, so killing the process loses nothing committed
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            self._check_version()
        except sqlite3.DatabaseError as err:
            raise UserError(f"{self.path}: cannot open the controller's state store: "
                            f"{err}") from None
        except OSError as err:
            raise UserError(f"{self.path}: cannot open the controller's state store: "
                            f"{err.strerror or err}") from None

    def _check_version(self):
        row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {row[0]}, this controller reads "
                                        f"{SCHEMA_VERSION}")

    def _write(self, fn):
        with self._lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
                fn(self.db)
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    # -- reads ---------------------------------------------------------------------
    def load(self, log_tail: int) -> Saved:
        with self._lock:
            db = self.db
            s = Saved()
            s.slos = dict(db.execute("SELECT tenant, min_throughput FROM slo"))
            s.modes = dict(db.execute("SELECT scope, mode FROM mode"))
            s.placements = dict(db.execute("SELECT tenant, node FROM placement"))
            s.nodes = {n: json.loads(r) for n, r in
                       db.execute("SELECT name, registration FROM node")}
            s.directives = {t: SavedDirective(node, lim, pol, why, rnd, at, bool(sent))
                            for t, node, lim, pol, why, rnd, at, sent in db.execute(
                                "SELECT tenant, node, limit_bytes, policy, reason, round, "
                                "time, sent FROM directive")}
            s.tenants = {n: json.loads(st) for n, st in
                         db.execute("SELECT name, state FROM tenant")}
            row = db.execute("SELECT value FROM meta WHERE key = 'rounds'").fetchone()
            s.rounds = int(row[0]) if row else 0
            rows = db.execute("SELECT round, time, node, tenant, kind, message, detail "
                              "FROM log ORDER BY id DESC LIMIT ?", (log_tail,)).fetchall()
            s.log = [_record(r) for r in reversed(rows)]
            return s

    def read_log(self, since=0.0, tenant="", limit=50) -> list[LogRecord]:
        query = "SELECT round, time, node, tenant, kind, message, detail FROM log " \
                "WHERE time >= ?"
        args: list = [since]
        if tenant:
            query += " AND tenant = ?"
            args.append(tenant)
        query += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            return [_record(r) for r in self.db.execute(query, args)]

    # -- writes --------------------------------------------------------------------
    def put_slo(self, tenant, min_throughput, at):
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO slo VALUES (?, ?, ?)", (tenant, min_throughput, at)))

    def put_mode(self, scope, mode, at):
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO mode VALUES (?, ?, ?)", (scope, mode, at)))

    def put_placement(self, tenant, node, at):
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO placement VALUES (?, ?, ?)", (tenant, node, at)))

    def put_node(self, name, registration, at):
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO node VALUES (?, ?, ?)",
            (name, json.dumps(registration), at)))

    def write_round(self, rounds, directives, tenants, log):
        def write(db):
            db.execute("INSERT OR REPLACE INTO meta VALUES ('rounds', ?)", (str(rounds),))
            db.executemany("INSERT OR REPLACE INTO directive VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(t, d.node, int(d.limit_bytes), d.policy, d.reason, d.round,
                             d.time, int(d.sent)) for t, d in directives.items()])
            db.executemany("INSERT OR REPLACE INTO tenant VALUES (?, ?)",
                           [(t, json.dumps(st)) for t, st in tenants.items()])
            self._insert_log(db, log)
        self._write(write)

    def append_log(self, log):
        if log:
            self._write(lambda db: self._insert_log(db, log))

    def put_trace(self, rnd, tenants, blob, keep):
        def write(db):
            db.execute("INSERT OR REPLACE INTO trace VALUES (?, ?)", (rnd, blob))
            db.executemany("INSERT OR REPLACE INTO trace_tenant VALUES (?, ?)",
                           [(t, rnd) for t in tenants])
            if rnd % TRACE_PRUNE_EVERY == 0:
                db.execute("DELETE FROM trace WHERE round <= ?", (rnd - keep,))
                db.execute("DELETE FROM trace_tenant WHERE round <= ?", (rnd - keep,))
        self._write(write)

    def read_trace(self, tenant, rnd=0):
        with self._lock:
            first, last = self.db.execute("SELECT MIN(round), MAX(round) FROM trace_tenant "
                                          "WHERE tenant = ?", (tenant,)).fetchone()
            if first is None:
                return None, 0, 0
            row = self.db.execute(
                "SELECT t.blob FROM trace t JOIN trace_tenant x ON x.round = t.round "
                "WHERE x.tenant = ? AND x.round = ?", (tenant, rnd or last)).fetchone()
        return (row[0] if row else None), first, last

    def _insert_log(self, db, log):
        db.executemany("INSERT INTO log (round, time, node, tenant, kind, message, detail) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       [(e.round, e.time, e.node, e.tenant, e.kind, e.message,
                         json.dumps(e.detail, default=str) if e.detail else None)
                        for e in log])
        self._appended += len(log)
        if self._appended >= PRUNE_EVERY:
            self._appended = 0
            db.execute("DELETE FROM log WHERE id <= (SELECT MAX(id) FROM log) - ?",
                       (LOG_KEEP,))

    def close(self):
        with self._lock:
            self.db.close()


def _record(row) -> LogRecord:
    rnd, at, node, tenant, kind, message, detail = row
    return LogRecord(rnd, at, node, tenant, kind, message,
                     json.loads(detail) if detail else {})


def default_state_path(config, env=os.environ) -> Path | None:
    """controller.state_path; else <config name>.state.db in the state
    directory systemd gives the unit (STATE_DIRECTORY, from its
    StateDirectory=: the config's own folder is read-only there), else
    beside the config file; None for a config that came from no file."""
    spec = config.controller
    if spec.state_path is not None:
        return Path(spec.state_path)
    if config.source is not None:
        src = Path(config.source)
        if env.get("STATE_DIRECTORY"):
            return Path(env["STATE_DIRECTORY"].split(":")[0]) / (src.stem + ".state.db")
        return src.with_name(src.stem + ".state.db")
    return None


def open_store(config) -> StateStore:
    """The store a config asks for: etcd when controller.store names one,
    else SQLite at its state path, or in memory when the config came from
    no file and names no path."""
    if config.controller.store != "sqlite":
        from cachepilot.controller.store_etcd import EtcdStore   # it imports this module
        # written behind, every 0.25 s (a quarter interval when that is
        # shorter): a controller's rounds never wait on etcd, and a replica
        # killed loses at most that much (the next reports carry it again)
        return EtcdStore(config.controller.store,
                         write_behind_s=min(0.25, config.control.interval_s / 4))
    path = default_state_path(config)
    return SQLiteStore(path) if path is not None else MemoryStore()


def directive_record(node: str, d, rnd: int, sent: bool) -> SavedDirective:
    return SavedDirective(node, int(d.limit_bytes), d.policy, d.reason, rnd, time.time(), sent)


def as_dict(d: SavedDirective) -> dict:
    return asdict(d)
