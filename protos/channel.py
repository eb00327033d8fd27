"""gRPC channel options of the env service: explicit message-size limits on both ends,
keepalive so a dead peer is noticed, and a server that permits the client's keepalive.

Keepalive has two halves that must agree. The client pings every `CLIENT_KEEPALIVE_MS`,
calls or not (an actor holds its channels open between episodes); a server answers pings
that come more often than its minimum interval (gRPC's default: 5 minutes) with a GOAWAY
"too_many_pings" after two strikes, which drops every idle connection and throttles the
client. So the server's minimum (`SERVER_MIN_PING_INTERVAL_MS`) sits below the client's
period. A restarted server is found again within `MAX_RECONNECT_BACKOFF_MS`, not after
gRPC's default backoff of up to two minutes.

The TLS credentials of both ends come from PEM files (a missing or unreadable file is a
ValueError naming it).
"""

from __future__ import annotations

from pathlib import Path

import grpc

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
CLIENT_KEEPALIVE_MS = 30_000
"""A client pings an idle connection this often (and gives up on it 10 s after a ping)."""
SERVER_MIN_PING_INTERVAL_MS = 10_000
"""A server accepts client pings this far apart; must not exceed CLIENT_KEEPALIVE_MS."""
MAX_RECONNECT_BACKOFF_MS = 2_000
"""Longest a client waits between attempts to reach a server that went away."""


def _sizes(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def channel_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    keepalive_ms: int = CLIENT_KEEPALIVE_MS,
) -> list[tuple[str, int]]:
    """Options of a client channel to an env server."""
    return [
        *_sizes(max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]


def server_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    min_ping_interval_ms: int = SERVER_MIN_PING_INTERVAL_MS,
) -> list[tuple[str, int]]:
    """Options of the env server: it pings idle clients too (a dead one is noticed), and
    permits client pings `min_ping_interval_ms` apart, with or without calls."""
    return [
        *_sizes(max_message_bytes),
        ("grpc.keepalive_time_ms", CLIENT_KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", min_ping_interval_ms),
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
