"""Opening a gRPC channel to the controller and authenticating on it.

TLS by default (a root certificate to trust, optionally the name to
expect); plaintext only when asked for, for loopback demos.  A caller
proves who it is with its own certificate and key (mutual TLS: a node's
certificate names the node, an admin's carries the admin role), or, with
a controller set up for a shared token, with the token in TOKEN_HEADER as
a bearer credential on every call.
"""
from __future__ import annotations

import grpc

TOKEN_HEADER = "authorization"
# A controller replica that does not own the calling node names the one
# that does in this trailing metadata key (controller/fleet.py).
OWNER_HEADER = "cachepilot-owner"


def make_channel(target: str, root_cert: bytes | None = None, server_name: str | None = None,
                 insecure: bool = False,
                 identity: tuple[bytes, bytes] | None = None) -> grpc.Channel:
    """identity: (certificate PEM, key PEM) to present (mutual TLS)."""
    options, creds = _channel_parts(root_cert, server_name, insecure, identity)
    if creds is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, creds, options=options)


def make_aio_channel(target: str, root_cert: bytes | None = None,
                     server_name: str | None = None, insecure: bool = False,
                     identity: tuple[bytes, bytes] | None = None,
                     extra_options=()) -> "grpc.aio.Channel":
    """make_channel's channel for asyncio (grpc.aio): the same options and
    credentials, for callers that drive many nodes from one event loop
    (experiments/bench_fleet.py).  extra_options: more channel arguments."""
    options, creds = _channel_parts(root_cert, server_name, insecure, identity)
    options += list(extra_options)
    if creds is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, creds, options=options)


def _channel_parts(root_cert, server_name, insecure, identity):
    """(channel options, credentials or None for plaintext)."""
    options = [("grpc.enable_retries", 0), ("grpc.max_receive_message_length", 64 << 20),
               ("grpc.max_send_message_length", 64 << 20)]
    if insecure:
        return options, None
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    cert, key = identity if identity is not None else (None, None)
    creds = grpc.ssl_channel_credentials(root_certificates=root_cert, private_key=key,
                                         certificate_chain=cert)
    return options, creds


def read_identity(cert_path, key_path, what: str = "certificate") -> tuple[bytes, bytes]:
    """(certificate, key) PEM from their files; a UserError names the one
    that cannot be read."""
    from cachepilot.core.errors import UserError, unreadable
    out = []
    for path, kind in ((cert_path, what), (key_path, "key")):
        try:
            out.append(open(path, "rb").read())
        except OSError as err:
            raise UserError(unreadable(path, kind, err)) from None
    return out[0], out[1]


def token_metadata(token: str | None) -> tuple:
    """The call metadata that carries `token` (none without one)."""
    return ((TOKEN_HEADER, f"Bearer {token}"),) if token else ()
