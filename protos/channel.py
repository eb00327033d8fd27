"""gRPC channel options of the env service: explicit message-size limits on both ends,
keepalive so a dead peer is noticed, and a server that permits the client's keepalive.

Keepalive has two halves that must agree. The client pings every `CLIENT_KEEPALIVE_MS`,
calls or not (an actor holds its channels open between episodes); a server answers pings
that come more often than its minimum interval (gRPC's default: 5 minutes) with a GOAWAY
"too_many_pings" after two strikes, which drops every idle connection and throttles the
client. So the server's minimum (`SERVER_MIN_PING_INTERVAL_MS`) sits below the client's
period. A restarted server is found again within `MAX_RECONNECT_BACKOFF_MS`, not after
gRPC's default backoff of up to two minutes.
"""

from __future__ import annotations

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
