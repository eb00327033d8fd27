"""gRPC channel options shared by the env server and its client: explicit message-size
limits on both ends, keepalive so a dead peer is noticed; and the TLS credentials of both
ends, from PEM files (a missing or unreadable file is a ValueError naming it)."""

from __future__ import annotations

from pathlib import Path

import grpc

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e}") from None


def server_credentials(
    *, cert_file: str, key_file: str, client_ca_file: str = "", where: str = "envserver.tls"
) -> grpc.ServerCredentials:
    """TLS for a server; with `client_ca_file`, clients must present a certificate it signed."""
    pair = (_read(key_file, f"{where}.key_file"), _read(cert_file, f"{where}.cert_file"))
    client_ca = _read(client_ca_file, f"{where}.client_ca_file") if client_ca_file else None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def client_credentials(
    *, ca_file: str, cert_file: str = "", key_file: str = "", where: str = "actor.env.tls"
) -> grpc.ChannelCredentials:
    """TLS for a client: the server is verified against `ca_file`; `cert_file`/`key_file`
    add a client certificate (mutual TLS)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, f"{where}.ca_file"),
        private_key=_read(key_file, f"{where}.key_file") if key_file else None,
        certificate_chain=_read(cert_file, f"{where}.cert_file") if cert_file else None,
    )
