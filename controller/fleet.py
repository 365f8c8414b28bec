"""Controller replicas that share a fleet's nodes, through etcd.

With `controller.store: etcd://…` every controller process is a replica.
Each one joins (replicas/<name> under a lease, which etcd drops when the
replica dies or hangs: Fleet._join), owns a share of the nodes by
rendezvous hashing of the node's name over the live replicas (owner_of),
and follows the SLOs and modes set through any replica (Fleet._read_watched).
Rendezvous hashing needs no table to agree on: every replica computes the
same owner from the same member list, and a replica that joins or leaves
moves only the nodes it takes or held.  One replica leads (Fleet._lead): it
holds the `leader` key under its lease and does the fleet-wide work.  Each
replica publishes, under demand/<node>, what its nodes' tenants need
(controller/planner.py: live_demand), and the leader packs them into the
fewest hosts now and then and puts the plan under `plan`.

Membership is read again every third of the lease.  Losing etcd stops no
replica: each goes on serving the nodes it owned, from its own memory, and
the leader stops leading (Fleet._watch says how it comes back).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import threading

from cachepilot.controller.etcd import Etcd, Lease, StoreUnavailable, absent, held_by, put_op
from cachepilot.core.errors import UserError

log = logging.getLogger("cachepilot.controller.fleet")

MEMBERS = "replicas/"
LEADER = "leader"
DEMANDS = "demand/"
PLAN = "plan"
OUTBOX_TXN = 100            # demand puts per transaction (etcd allows 128 ops)
STOP_WAIT_S = 10.0          # how long stop() waits for a read in progress


class NameTaken(UserError):
    """Another live replica holds this replica's name: both would own the
    same nodes and both would think they lead."""


def owner_of(node: str, members: dict[str, str]) -> str | None:
    """The replica (name) that owns `node` among `members`: the highest
    hash of (replica, node)."""
    best, best_score = None, b""
    for name in members:
        score = hashlib.blake2b(f"{name}\0{node}".encode(), digest_size=8).digest()
        if best is None or score > best_score:
            best, best_score = name, score
    return best


class Fleet:
    """This replica's view of the others: `owner(node)`, `leading`.

    `on_change(members)` is called from the watch thread whenever the
    member list changes (the service stops serving the nodes that moved
    away); `on_records([(key, value, mod_revision)])` with the records
    under the `watch` prefixes that changed since the last read (the first
    read: all of them).  The lease is of whole seconds, as etcd's are:
    ttl_s is rounded up."""

    def __init__(self, etcd: Etcd, name: str, address: str, ttl_s: float,
                 on_change=None, watch: tuple[str, ...] = (), on_records=None):
        self.etcd = etcd
        self.name = name
        self.address = address
        self.ttl = max(1, math.ceil(ttl_s))
        self.on_change = on_change
        self.watch = watch
        self.on_records = on_records
        self.members: dict[str, str] = {}
        self.leading = False
        self.reachable = True
        self.refused: NameTaken | None = None     # our name is another's now
        self.lease: Lease | None = None
        self._watched_rev = 0       # the newest mod_revision read under `watch`
        self._owners: dict[str, str | None] = {}
        self._outbox: dict[str, str] = {}    # node -> its demands, not yet put
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- joining and watching --------------------------------------------------------
    def start(self) -> "Fleet":
        """Join (raises StoreUnavailable when etcd cannot be reached: a
        replica does not start blind; NameTaken when another live replica
        has its name) and watch from a thread.  A start that fails after
        joining leaves at once."""
        self._join()
        try:
            self._read()
        except BaseException:
            self._revoke()
            raise
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"fleet-{self.name}")
        self._thread.start()
        return self

    def _join(self, previous: Lease | None = None):
        """Put replicas/<name> = our address under a new lease of
        controller.replica_ttl_s (default half an interval), kept alive from
        a thread: a replica that dies or hangs stops renewing it, and etcd
        drops it.  The put is a transaction on the key being absent, or
        held by `previous` (our own lease, which lapsed here): a name
        another live replica holds is refused (NameTaken), or two replicas
        would own the same nodes."""
        lease = self.etcd.lease(self.ttl)
        key, put = MEMBERS + self.name, [put_op(MEMBERS + self.name, self.address, lease.id)]
        try:
            ok = self.etcd.txn(put, compare=[absent(key)], what=f"join as {self.name}")
            if not ok and previous is not None:
                ok = self.etcd.txn(put, compare=[held_by(key, previous.id)],
                                   what=f"join again as {self.name}")
            if not ok:
                raise NameTaken(
                    f"replica name {self.name!r} is held by a live replica at "
                    f"{self.etcd.get(key) or '?'} ({self.etcd.url}): give each replica "
                    "its own name (controller.replica, or cachepilot controller "
                    "--replica NAME)")
        except BaseException:
            _revoke_quietly(lease)
            raise
        self.lease = lease.start()
        log.info("replica %s (%s) joined the fleet at %s, lease %d s", self.name,
                 self.address, self.etcd.url, self.ttl)

    def _read(self):
        members = {k[len(MEMBERS):]: v for k, v, _ in self.etcd.get_prefix(MEMBERS)}
        if self.name not in members or self.lease is None or self.lease.lost:
            if self._stop.is_set():     # stopping: never join again behind stop()
                return
            self._rejoin(members)
        self._lead()
        self._set_members(members)
        self._read_watched()

    def _rejoin(self, members):
        """Our lease lapsed (etcd was away longer than it, or we hung): put
        ourselves back before anyone counts us out for good -- unless
        another replica took our name meanwhile: then we serve no node."""
        old = self.lease
        if old is not None:
            old.stop()
        try:
            self._join(previous=old)
        except NameTaken as err:
            if self.refused is None:
                log.error("replica %s: %s; serving no node while it does", self.name, err)
            self.refused = err
            return
        if self.refused is not None:
            log.warning("replica %s: its name is its own again", self.name)
        self.refused = None
        members[self.name] = self.address

    def _lead(self):
        """Campaign when no one leads; we lead when the key is held under
        our own live lease, not merely in our name.  When the leader's
        lease ends, the next to campaign leads."""
        lease = self.lease
        if self.refused is not None or lease is None or lease.lost:
            leading = False
        else:
            holder = self.etcd.holder(LEADER)
            if holder is None:
                self.etcd.campaign(LEADER, self.name, lease)
                holder = self.etcd.holder(LEADER)
            leading = holder is not None and holder[1] == lease.id
        if leading != self.leading:
            self.leading = leading
            log.info("replica %s %s", self.name,
                     "leads the fleet" if leading else "no longer leads")

    def _set_members(self, members):
        if members != self.members:
            with self._lock:
                old, self.members, self._owners = self.members, members, {}
            log.info("replica %s: %d replica(s) live: %s (were %s)", self.name, len(members),
                     ", ".join(sorted(members)), ", ".join(sorted(old)) or "none")
            if self.on_change is not None:
                self.on_change(dict(members))

    def _read_watched(self):
        """The records under `watch` (the store's slo/ and mode/ records:
        the SLOs and modes set through any replica) changed since the last
        read (etcd returns only those, by mod_revision) go to on_records;
        they are asked for again if it raises."""
        if not self.watch or self.on_records is None:
            return
        kvs = [kv for prefix in self.watch
               for kv in self.etcd.get_prefix(prefix, min_revision=self._watched_rev + 1)]
        if kvs:
            self.on_records(kvs)
            self._watched_rev = max(self._watched_rev, *(rev for _, _, rev in kvs))

    def _watch(self):
        """Read the member list (and the watched records) every third of
        the lease.  If etcd cannot be reached, the member list stays as
        last read -- this replica goes on serving the nodes it owned, from
        its own memory, and stops leading, since it can no longer show it
        holds the key -- and when etcd answers again it puts itself back
        under a new lease if its own lapsed (_rejoin) and reads the list
        again.  Whatever else goes wrong in a read is logged with its
        traceback, and the next read comes as usual."""
        while not self._stop.wait(self.ttl / 3):
            try:
                self._read()
                self._flush_outbox()
                if not self.reachable:
                    self.reachable = True
                    log.warning("replica %s: etcd answers again; member list read again",
                                self.name)
            except StoreUnavailable as err:
                if self.reachable:
                    self.reachable = False
                    self.leading = False
                    log.warning("replica %s: %s; serving the nodes it owns from its last "
                                "state, member list kept as last read (%d replica(s))",
                                self.name, err, len(self.members))
            except Exception:       # noqa: BLE001 -- a dead watch would go unnoticed
                log.exception("replica %s: reading the fleet failed; read again in %.1f s",
                              self.name, self.ttl / 3)

    # -- demands and the plan -----------------------------------------------------------
    def publish(self, node: str, demands: list[dict]) -> None:
        """What `node`'s tenants need; put from the watch thread (a round
        never waits on etcd for it), the newest only."""
        with self._lock:
            self._outbox[node] = json.dumps(demands, separators=(",", ":"))

    def _flush_outbox(self):
        with self._lock:
            out, self._outbox = self._outbox, {}
        items = sorted(out.items())
        try:
            for i in range(0, len(items), OUTBOX_TXN):
                self.etcd.txn([put_op(DEMANDS + n, v) for n, v in items[i:i + OUTBOX_TXN]],
                              what=f"put {min(OUTBOX_TXN, len(items) - i)} nodes' demands")
        except StoreUnavailable:
            with self._lock:            # keep what was not put, unless newer came
                self._outbox = {**dict(items), **self._outbox}
            raise

    def read_demands(self) -> dict[str, list[dict]]:
        """node -> its tenants' demands, as the replicas last published them."""
        return {k[len(DEMANDS):]: json.loads(v)
                for k, v, _ in self.etcd.get_prefix(DEMANDS)}

    def put_plan(self, summary: dict) -> None:
        self.etcd.put(PLAN, json.dumps(summary, separators=(",", ":")))

    # -- asking ----------------------------------------------------------------------
    def owner(self, node: str) -> tuple[str, str]:
        """(replica name, address) that owns `node`; this replica when the
        member list is empty (not read yet).  While another replica holds
        our name (refused), the nodes of that name are its, at its address.
        A node that calls the wrong replica is redirected to its owner
        (service.py: FAILED_PRECONDITION with the owner's address in
        `cachepilot-owner`)."""
        with self._lock:
            name = self._owners.get(node)
            if name is None:
                name = owner_of(node, self.members) or self.name
                self._owners[node] = name
            return name, self.members.get(name, self.address)

    def owns(self, node: str) -> bool:
        return self.refused is None and self.owner(node)[0] == self.name

    def stop(self, leave: bool = True) -> None:
        """Stop watching; leave=True also gives the nodes up at once (the
        lease is revoked), else they move when the lease runs out.  A read
        in progress is waited for first, so it cannot join again under a
        new lease after this one is revoked."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive():
                log.warning("replica %s: the fleet's watch did not end within %g s",
                            self.name, STOP_WAIT_S)
        if leave:
            self._revoke()
        elif self.lease is not None:
            self.lease.stop()

    def _revoke(self):
        if self.lease is not None:
            try:
                self.lease.revoke()
            except StoreUnavailable as err:
                log.warning("replica %s: leaving: %s", self.name, err)


def _revoke_quietly(lease: Lease) -> None:
    """End a lease we cannot use; when etcd is away it ends by its TTL."""
    try:
        lease.revoke()
    except StoreUnavailable:
        pass

