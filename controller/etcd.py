"""A thin etcd v3 client over the gateway's JSON API, for the controller.

etcd serves its v3 API as gRPC and, on the same client port, as JSON over
HTTP (the "gateway": POST /v3/kv/range, /v3/kv/put, /v3/kv/txn,
/v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive,
/v3/lease/revoke; keys and values base64).  The controller needs only
those calls, so they are spoken here with the standard library's
http.client rather than through a client package and its dependencies.
`Etcd` is one endpoint under a key prefix, `Lease` a lease kept alive from
a thread, `Etcd.campaign` and `Etcd.leader` leader election on one key.

Every failure -- etcd unreachable, too slow, or refusing a request --
raises `StoreUnavailable`, whose message names the URL and the call.  The
timeout is short (TIMEOUT_S, 1.5 s by default): a controller round that
writes to a dead etcd waits that long at most, never for TCP's own
timeouts.
"""
from __future__ import annotations

import base64
import http.client
import json
import logging
import re
import threading
import time
from dataclasses import dataclass

from cachepilot.core.errors import UserError

log = logging.getLogger("cachepilot.controller.etcd")

DEFAULT_PREFIX = "/cachepilot"
TIMEOUT_S = 1.5
NOT_FOUND = 5          # gRPC status code
URL_RE = re.compile(r"^etcd://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})"
                    r"(?P<prefix>(/[A-Za-z0-9_.-]+)*)/?$")


class StoreUnavailable(UserError):
    """etcd did not do what was asked: unreachable, too slow, or refused.
    A UserError, so one that reaches the command line is one clear line.
    `code` is etcd's gRPC status code when etcd answered (5: not found)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    prefix: str

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}{self.prefix}"


def parse_url(url: str) -> Address:
    """``etcd://host:port[/prefix]`` -> Address; ValueError says what is wrong."""
    m = URL_RE.match(url or "")
    if m is None or not 0 < int(m["port"]) < 65536:
        raise ValueError(f"expected etcd://host:port[/prefix], got {url!r}")
    return Address(m["host"].strip("[]"), int(m["port"]), m["prefix"] or DEFAULT_PREFIX)


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s or "")


# -- transaction parts: build these, hand them to Etcd.txn -------------------------------

def put_op(key: str, value: str, lease: int | None = None) -> tuple:
    return ("put", key, value, lease)


def absent(key: str) -> tuple:
    """A compare that holds while `key` does not exist (create_revision 0)."""
    return ("absent", key)


def held_by(key: str, lease: int) -> tuple:
    """A compare that holds while `key` exists under lease `lease`."""
    return ("lease", key, lease)


class Etcd:
    """One etcd endpoint under one key prefix, from
    ``etcd://host:port[/prefix]`` (default prefix /cachepilot): every key
    given to it is relative to the prefix, and every key it returns is too."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S):
        try:
            self.address = parse_url(url)
        except ValueError as err:
            raise UserError(f"state store: {err}") from None
        self.url = self.address.url
        self.prefix = self.address.prefix.rstrip("/") + "/"
        self.timeout = timeout

    # -- the wire --------------------------------------------------------------------
    def call(self, path: str, body: dict, what: str) -> dict:
        """POST one JSON request to /v3/<path>; the decoded reply."""
        conn = http.client.HTTPConnection(self.address.host, self.address.port,
                                          timeout=self.timeout)
        try:
            conn.request("POST", "/v3/" + path, json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as err:
            why = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise StoreUnavailable(f"{self.url}: {what} failed: {why}") from None
        finally:
            conn.close()
        try:
            reply = json.loads(data or b"{}")
        except ValueError:
            reply = {"error": data[:200].decode(errors="replace")}
        if resp.status != 200 or "error" in reply:
            why = reply.get("message") or reply.get("error") or resp.reason
            raise StoreUnavailable(f"{self.url}: {what} failed: HTTP {resp.status}: {why}",
                                   reply.get("code"))
        return reply

    def key(self, key: str) -> str:
        return self.prefix + key

    def _range_end(self, prefix: str) -> str:
        """The key just past every key that starts with `prefix`."""
        raw = bytearray(self.key(prefix).encode())
        raw[-1] += 1                # prefixes here end in "/" or a name: never 0xff
        return _b64(bytes(raw))

    # -- keys ------------------------------------------------------------------------
    def _kv(self, kv: dict) -> tuple[str, str]:
        """(key under the prefix, value) of one key-value etcd returned."""
        return (_unb64(kv["key"]).decode()[len(self.prefix):],
                _unb64(kv.get("value", "")).decode())

    def get(self, key: str) -> str | None:
        kv = self.get_kv(key)
        return kv[0] if kv is not None else None

    def get_kv(self, key: str) -> tuple[str, int, int] | None:
        """(value, mod_revision, lease id or 0) of `key`; None when absent."""
        kvs = self.call("kv/range", {"key": _b64(self.key(key))}, f"get {key}").get("kvs")
        if not kvs:
            return None
        return (self._kv(kvs[0])[1], int(kvs[0].get("mod_revision", 0)),
                int(kvs[0].get("lease", 0)))

    def get_prefix(self, prefix: str, limit: int = 0, newest_first: bool = False,
                   start: str = "", end: str = "", keys_only: bool = False,
                   min_revision: int = 0) -> list[tuple[str, str, int]]:
        """(key, value, mod_revision) of the keys under `prefix` in key
        order (reversed with newest_first), at most `limit` (0: all), from
        `start` on and before `end` (keys under the prefix) when given,
        and only those changed at `min_revision` or later when given."""
        body = {"key": _b64(self.key(start or prefix)),
                "range_end": _b64(self.key(end)) if end else self._range_end(prefix),
                "limit": limit, "sort_target": "KEY",
                "sort_order": "DESCEND" if newest_first else "ASCEND", "keys_only": keys_only}
        if min_revision:
            body["min_mod_revision"] = str(min_revision)
        kvs = self.call("kv/range", body, f"get {prefix}*").get("kvs", [])
        return [(*self._kv(kv), int(kv.get("mod_revision", 0))) for kv in kvs]

    def get_many(self, keys: list[str], per_call: int = 128) -> dict[str, tuple[str, int]]:
        """key -> (value, mod_revision) of the `keys` that exist, read in
        transactions of up to `per_call` reads (etcd's default limit on a
        transaction's ops)."""
        out = {}
        for i in range(0, len(keys), per_call):
            part = keys[i:i + per_call]
            body = {"success": [{"request_range": {"key": _b64(self.key(k))}} for k in part]}
            reply = self.call("kv/txn", body, f"get {len(part)} keys")
            for r in reply.get("responses", []):
                for kv in r.get("response_range", {}).get("kvs", []):
                    key, value = self._kv(kv)
                    out[key] = (value, int(kv.get("mod_revision", 0)))
        return out

    def count_prefix(self, prefix: str) -> int:
        body = {"key": _b64(self.key(prefix)), "range_end": self._range_end(prefix),
                "count_only": True}
        return int(self.call("kv/range", body, f"count {prefix}*").get("count", 0))

    def put(self, key: str, value: str, lease: int | None = None) -> int:
        """Returns the revision the put made."""
        body = {"key": _b64(self.key(key)), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self.call("kv/put", body, f"put {key}")["header"].get("revision", 0))

    def delete_before(self, prefix: str, end: str) -> int:
        """Deletes the keys under `prefix` that sort before `end`."""
        body = {"key": _b64(self.key(prefix)), "range_end": _b64(self.key(end))}
        return int(self.call("kv/deleterange", body, f"delete {prefix}* before {end}")
                   .get("deleted", 0))

    def txn(self, ops: list[tuple], compare: list[tuple] = (), failure: list[tuple] = (),
            what: str = "transaction") -> bool:
        """Runs `ops` if every compare holds (else `failure`) in one
        transaction; returns whether the compares held."""
        body = {"compare": [self._compare(c) for c in compare],
                "success": [self._op(o) for o in ops],
                "failure": [self._op(o) for o in failure]}
        return bool(self.call("kv/txn", body, what).get("succeeded", False))

    def put_all(self, ops: list[tuple], what: str = "transaction") -> int:
        """Runs `ops` (puts, no compare) in one transaction; the revision it
        made, which every key it put now has as its mod_revision."""
        body = {"success": [self._op(o) for o in ops]}
        return int(self.call("kv/txn", body, what)["header"].get("revision", 0))

    def _op(self, op: tuple) -> dict:
        if op[0] == "put":
            _, key, value, lease = op
            put = {"key": _b64(self.key(key)), "value": _b64(value)}
            if lease:
                put["lease"] = str(lease)
            return {"request_put": put}
        raise ValueError(f"unknown transaction op {op[0]!r}")

    def _compare(self, cmp: tuple) -> dict:
        if cmp[0] == "absent":
            return {"key": _b64(self.key(cmp[1])), "target": "CREATE", "result": "EQUAL",
                    "create_revision": "0"}
        if cmp[0] == "lease":
            return {"key": _b64(self.key(cmp[1])), "target": "LEASE", "result": "EQUAL",
                    "lease": str(cmp[2])}
        raise ValueError(f"unknown compare {cmp[0]!r}")

    # -- leases and leaders ----------------------------------------------------------
    def lease(self, ttl: int) -> "Lease":
        return Lease(self, ttl)

    def campaign(self, key: str, value: str, lease: "Lease") -> bool:
        """Takes `key` for `value` if no one holds it (a transaction
        comparing its create_revision with 0: the first to create it wins);
        True when this call took it.  It stays taken while `lease` lives:
        revoked or expired, the key goes and the next campaign wins."""
        return self.txn([put_op(key, value, lease.id)], compare=[absent(key)],
                        what=f"campaign for {key}")

    def leader(self, key: str) -> str | None:
        """The value of whoever holds `key` (None: no one)."""
        return self.get(key)

    def holder(self, key: str) -> tuple[str, int] | None:
        """(value, lease id) of whoever holds `key` (None: no one): the lease
        tells two holders of the same value apart."""
        kv = self.get_kv(key)
        return (kv[0], kv[2]) if kv is not None else None


class Lease:
    """An etcd lease: granted with a TTL (seconds) when made.  `start()`
    keeps it alive from a daemon thread every TTL/3; `revoke()` ends it
    (and with it every key put under it).  `lost` is True once a keepalive
    found it expired, or none succeeded for a whole TTL: a leader whose
    lease is lost must stop acting as one."""

    def __init__(self, client: Etcd, ttl: int):
        self.client = client
        self.ttl = max(1, int(ttl))
        reply = client.call("lease/grant", {"TTL": self.ttl}, f"lease grant (TTL {self.ttl} s)")
        self.id = int(reply["ID"])
        self._alive_until = time.monotonic() + int(reply.get("TTL", self.ttl))
        self._expired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        return self._expired or time.monotonic() >= self._alive_until

    def keepalive(self) -> bool:
        """One refresh; False when etcd says the lease is gone.  Raises
        StoreUnavailable when etcd cannot be asked."""
        reply = self.client.call("lease/keepalive", {"ID": str(self.id)},
                                 f"lease {self.id:x} keepalive")
        ttl = int(reply.get("result", reply).get("TTL", 0))
        if ttl <= 0:
            self._expired = True
            return False
        self._alive_until = time.monotonic() + ttl
        return True

    def start(self) -> "Lease":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"etcd-lease-{self.id:x}")
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.keepalive():
                    log.warning("etcd lease %x expired (%s)", self.id, self.client.url)
                    return
            except StoreUnavailable as err:
                log.warning("%s", err)

    def stop(self) -> None:
        """Stops the keepalives only: the lease ends by itself after its TTL
        (what a controller that hangs or dies looks like to the others)."""
        self._stop.set()

    def revoke(self) -> None:
        """Stops the keepalives and ends the lease.  Raises StoreUnavailable
        when etcd cannot be asked (the lease then ends by itself after its
        TTL, as no one keeps it alive); one already expired is no error."""
        self._stop.set()
        self._expired = True
        try:
            self.client.call("lease/revoke", {"ID": str(self.id)}, f"lease {self.id:x} revoke")
        except StoreUnavailable as err:
            if err.code != NOT_FOUND:       # already expired: nothing to end
                raise
