"""protos/channel.py: the client's keepalive and the server's permitted ping interval agree,
so an idle channel stays connected instead of ending in GOAWAY "too_many_pings" (seen
between episodes: the actor holds its channels open while it generates)."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos.channel import (
    CLIENT_KEEPALIVE_MS,
    SERVER_MIN_PING_INTERVAL_MS,
    channel_options,
    server_options,
)


async def _states_while_idle(server_opts, client_opts, idle_s: float = 4.0) -> list[str]:
    """Connectivity of a client channel, sampled while it sits idle after one call."""
    server = grpc.aio.server(options=server_opts)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=client_opts)
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        states = []
        for _ in range(int(idle_s / 0.25)):
            await asyncio.sleep(0.25)
            states.append(channel.get_state().name)
        return states
    finally:
        await channel.close()
        await server.stop(0)


def test_the_server_permits_the_clients_keepalive():
    assert SERVER_MIN_PING_INTERVAL_MS <= CLIENT_KEEPALIVE_MS
    client = dict(channel_options())
    server = dict(server_options())
    assert (
        server["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"]
    )
    assert server["grpc.keepalive_permit_without_calls"] == 1  # pings between calls


async def test_an_idle_channel_stays_connected():
    scale = 1 / 60  # the real periods, 60 times faster: eight pings of 500 ms while idle
    states = await _states_while_idle(
        server_options(min_ping_interval_ms=int(SERVER_MIN_PING_INTERVAL_MS * scale)),
        channel_options(keepalive_ms=int(CLIENT_KEEPALIVE_MS * scale)),
    )
    assert set(states) == {"READY"}, states


async def test_without_the_servers_permission_the_same_pings_end_in_goaway():
    # The control: gRPC's default minimum (5 minutes) turns the same keepalive into
    # "too_many_pings" and the channel drops to IDLE: the test can see the failure.
    server_default = [o for o in server_options() if "min_ping_interval" not in o[0]]
    states = await _states_while_idle(server_default, channel_options(keepalive_ms=500))
    assert states[-1] == "IDLE", states
