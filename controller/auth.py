"""Who is calling: a node, an admin, or anyone holding the shared token.

With mutual TLS (controller.client_ca) every caller presents a certificate
the CA signed (`cachepilot certs` makes them).  Its subject says who it
is: organisational unit `node` with the node's name as common name, or
`admin`.  A node may call the Node service only as itself -- a report or
a registration naming another node is refused -- and never the Admin
service; an admin certificate may call the Admin service only.  Refusals
say which certificate was presented and which one the call needs, and
are made before the call touches anything.

With a shared token (the older setup, kept for single-operator hosts),
TokenInterceptor refuses every call without it; there are no roles then:
whoever holds the token may act as any node and as an admin.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass

import grpc

from cachepilot.controller.registry import Refused
from cachepilot.protocol.channel import TOKEN_HEADER

NODE = "node"       # the subject's OU on a node certificate
ADMIN = "admin"     # ... on an admin certificate
ORG = "cachepilot"


@dataclass
class Caller:
    role: str           # NODE, ADMIN, or "" for a certificate with neither
    name: str           # the certificate's common name

    def describe(self) -> str:
        if self.role == NODE:
            return f"the certificate of node {self.name!r}"
        if self.role == ADMIN:
            return f"the admin certificate {self.name!r}"
        return f"a certificate for {self.name!r} with no cachepilot role"


def caller(context) -> Caller:
    """The caller's identity from its verified client certificate."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    pem = (context.auth_context() or {}).get("x509_pem_cert")
    if not pem:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED,
                      "no client certificate: this controller wants a certificate per "
                      "node and one for admins (cachepilot certs)")
    cert = x509.load_pem_x509_certificate(pem[0])

    def one(oid):
        attrs = cert.subject.get_attributes_for_oid(oid)
        return str(attrs[0].value) if attrs else ""
    role = one(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return Caller(role if role in (NODE, ADMIN) else "", one(NameOID.COMMON_NAME))


def require_node(context, node_id: str) -> None:
    """Refuse unless the caller's certificate is node `node_id`'s."""
    who = caller(context)
    if who.role != NODE:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                      f"node calls need a node certificate; this call presented "
                      f"{who.describe()}")
    if who.name != node_id:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                      f"the call is for node {node_id!r} but presented the certificate of "
                      f"node {who.name!r}: every node needs its own (cachepilot certs "
                      f"node {node_id})")


def require_admin(context) -> None:
    """Refuse unless the caller's certificate carries the admin role."""
    who = caller(context)
    if who.role != ADMIN:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                      f"admin calls need the admin certificate (cachepilot certs admin); "
                      f"this call presented {who.describe()}")


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose metadata lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str, on_refuse=None):
        self.expected = f"Bearer {token}".encode()
        self.on_refuse = on_refuse

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get(TOKEN_HEADER, "")
        if isinstance(given, str):
            given = given.encode()
        if hmac.compare_digest(given, self.expected):
            return continuation(details)
        if self.on_refuse:
            self.on_refuse()
        return self._deny
