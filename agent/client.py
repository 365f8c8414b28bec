"""The node client: a backend on one side, the controller on the other.

Every interval it collects the backend's reports, sends them, and applies
the directives that come back.  When the controller is away the backend
simply keeps the last limits and policies (nothing is undone); the client
keeps collecting so the node's own view stays current, retries with
exponential backoff, registers again, and its next report tells the new
controller everything it needs to resynchronise.

A fleet may run several controller replicas that share the nodes
(controller/fleet.py).  The client then knows several addresses: a
replica that does not own this node answers with its owner's address
(`cachepilot-owner`), and the client registers there at once; an address
that does not answer sends it on to the next.  Either way the interval's
report is sent again to the new replica in the same step, so no report
is lost but the one in flight when a replica died.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import grpc

from cachepilot.core.errors import UserError
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
from cachepilot.protocol import wire
from cachepilot.protocol.channel import OWNER_HEADER, make_channel, token_metadata
from cachepilot.protocol.types import ApplyResult, Directive

log = logging.getLogger("cachepilot.agent.client")

# Errors after which the client registers again: the controller restarted
# (unknown session), marked us lost, or is unreachable for now.
_RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
          grpc.StatusCode.UNKNOWN, grpc.StatusCode.PERMISSION_DENIED,
          grpc.StatusCode.INTERNAL}


@dataclass
class StepOutcome:
    seq: int
    connected: bool
    directives: list[Directive]
    applied: list[ApplyResult]
    error: str = ""


class NodeClient:
    def __init__(self, backend, target: str, token: str | None = None,
                 root_cert: bytes | None = None, server_name: str | None = None,
                 insecure: bool = False, timeout_s: float = 5.0,
                 backoff_s: tuple[float, float] = (0.1, 5.0),
                 identity: tuple[bytes, bytes] | None = None, fallbacks=()):
        self.backend = backend
        self.info = backend.info()
        self.targets = list(dict.fromkeys([target, *fallbacks]))
        self.target = target
        self.metadata = token_metadata(token)
        self._channel_args = (root_cert, server_name, insecure, identity)
        self.moves = 0                           # redirects and failovers followed
        self.timeout_s = timeout_s
        self.backoff_min, self.backoff_max = backoff_s
        self.channel = None
        self.stub = None
        self.session: str | None = None
        self.interval_s: float | None = None
        self.seq = 0
        self.pending: list[ApplyResult] = []     # results not yet reported
        self.last_directives: dict[str, Directive] = {}
        self.backoff = self.backoff_min
        self.next_attempt = 0.0
        self.last_error = ""
        self.reconnects = 0
        self.tenants: list[str] | None = None   # as the controller last named them

    # -- connection -----------------------------------------------------------
    def _connect(self):
        if self.channel is None:
            self.channel = make_channel(self.target, *self._channel_args)
            self.stub = pb_grpc.NodeStub(self.channel)

    def _move(self, err: grpc.RpcError) -> bool:
        """Follow a replica's redirect to the node's owner, or go on to the
        next address when this one does not answer; True when the client
        now points elsewhere (and should try again at once)."""
        code = err.code() if hasattr(err, "code") else None
        owner = ""
        if code == grpc.StatusCode.FAILED_PRECONDITION and hasattr(err, "trailing_metadata"):
            owner = dict(err.trailing_metadata() or ()).get(OWNER_HEADER, "")
        if owner and owner != self.target:
            to = owner
            if owner not in self.targets:
                self.targets.append(owner)
        elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and \
                len(self.targets) > 1:
            to = self.targets[(self.targets.index(self.target) + 1) % len(self.targets)]
        else:
            return False
        log.info("%s: controller %s: %s; going to %s", self.info.node_id, self.target,
                 "redirected" if owner else code.name, to)
        if self.channel is not None:
            self.channel.close()
        self.channel, self.stub, self.target = None, None, to
        self.session = None
        self.moves += 1
        return True

    def register(self) -> bool:
        """One registration (following redirects and failing over, at most
        once to each known address); False (with last_error set) on failure."""
        reply = None
        for _ in range(len(self.targets) + 1):
            self._connect()
            try:
                reply = self.stub.Register(
                    pb.RegisterRequest(node=wire.node_info_to_pb(self.info)),
                    metadata=self.metadata, timeout=self.timeout_s)
                break
            except grpc.RpcError as err:
                last = err
                if not self._move(err):
                    break
        if reply is None:
            self._failed(last)
            return False
        if reply.assigns_tenants and not self._assign(reply.tenants):
            return False
        if self.session is not None or self.reconnects:
            log.info("%s: registered again with the controller", self.info.node_id)
        self.session, self.interval_s = reply.session, reply.interval_s
        self.backoff = self.backoff_min
        # Results of directives from an earlier session mean nothing to
        # this one (it may be a restarted controller).
        self.pending = []
        return True

    def _assign(self, assigned) -> bool:
        """Hand the backend the tenants the controller names; a tenant that
        does not make sense here stops the registration (and is logged)."""
        try:
            tenants = [wire.tenant_from_pb(t) for t in assigned]
            self.backend.assign(tenants)
        except (wire.WireError, UserError) as err:
            self.last_error = f"tenants from the controller: {err}"
            log.error("%s: %s", self.info.node_id, self.last_error)
            self.next_attempt = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, self.backoff_max)
            return False
        self.tenants = [t.name for t in tenants]
        return True

    def _failed(self, err: grpc.RpcError):
        code = err.code() if hasattr(err, "code") else None
        self.last_error = f"{code.name if code else 'error'}: " \
                          f"{err.details() if hasattr(err, 'details') else err}"
        if self.session is not None:
            log.warning("%s: lost the controller (%s); keeping the last directives",
                        self.info.node_id, self.last_error)
            self.reconnects += 1
        self.session = None
        self.next_attempt = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, self.backoff_max)
        if code not in _RETRY:
            # Wrong token or a refused report: say so; retrying will not help
            # until an operator acts, but backing off keeps the node running.
            log.error("%s: controller refused: %s", self.info.node_id, self.last_error)

    @property
    def connected(self) -> bool:
        return self.session is not None

    # -- one interval ---------------------------------------------------------
    def step(self, reports=None) -> StepOutcome:
        """Collect one interval (unless reports are given), report it, apply
        what comes back.  Never raises for controller trouble."""
        reports = self.backend.collect() if reports is None else reports
        self.seq += 1
        if self.session is None and time.monotonic() >= self.next_attempt:
            self.register()
        if self.session is None:
            return StepOutcome(self.seq, False, [], [], self.last_error)
        request = pb.ReportRequest(node_id=self.info.node_id, session=self.session, seq=self.seq,
                                   reports=[wire.report_to_pb(r) for r in reports],
                                   applied=[wire.apply_result_to_pb(a) for a in self.pending])
        try:
            reply = self.stub.Report(request, metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as err:
            if not (self._move(err) and self.register()):
                if self.session is not None:
                    self._failed(err)
                return StepOutcome(self.seq, False, [], [], self.last_error)
            # another replica serves this node now: the same report, to it
            request.session = self.session
            try:
                reply = self.stub.Report(request, metadata=self.metadata,
                                         timeout=self.timeout_s)
            except grpc.RpcError as err2:
                self._failed(err2)
                return StepOutcome(self.seq, False, [], [], self.last_error)
        for r in reply.refused:
            log.warning("%s: the controller did not take tenant %s's report: %s",
                        self.info.node_id, r.tenant, r.reason)
        directives = [wire.directive_from_pb(d) for d in reply.directives]
        applied = self.backend.apply(directives) if directives else []
        self.pending = applied
        self.last_directives.update({d.tenant: d for d in directives})
        return StepOutcome(self.seq, True, directives, applied)

    def run(self, intervals: int | None = None, pace_s: float | None = None,
            stop: threading.Event | None = None, on_step=None):
        """Step every pace_s seconds (default: the controller's interval)."""
        stop = stop or threading.Event()
        done = 0
        next_at = time.monotonic()
        while not stop.is_set() and (intervals is None or done < intervals):
            outcome = self.step()
            done += 1
            if on_step:
                on_step(self, outcome)
            period = pace_s if pace_s is not None else (self.interval_s or 1.0)
            next_at += period
            stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self):
        if self.channel is not None:
            self.channel.close()
        self.backend.close()
