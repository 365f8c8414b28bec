"""Opening a gRPC channel to the controller and authenticating on it.

TLS by default (a root certificate to trust, optionally the name to
expect); plaintext only when asked for, for loopback demos.  Every call
carries the token in TOKEN_HEADER as a bearer credential.
"""
from __future__ import annotations

import grpc

TOKEN_HEADER = "authorization"


def make_channel(target: str, root_cert: bytes | None = None, server_name: str | None = None,
                 insecure: bool = False) -> grpc.Channel:
    options = [("grpc.enable_retries", 0), ("grpc.max_receive_message_length", 64 << 20),
               ("grpc.max_send_message_length", 64 << 20)]
    if insecure:
        return grpc.insecure_channel(target, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=root_cert),
                               options=options)


def token_metadata(token: str | None) -> tuple:
    """The call metadata that carries `token` (none without one)."""
    return ((TOKEN_HEADER, f"Bearer {token}"),) if token else ()
