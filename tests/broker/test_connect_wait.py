"""The first connection to a broker that is not there (broker/connection.py): one line
naming the URL and what to start, backoff instead of a retry every 0.5 s, and a bounded
wait (`broker.connect_timeout_s`). nats-py alone retries such a connect for ever."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from broker import client
from broker.config import BrokerConfig
from common.procs import free_port


async def test_an_absent_broker_is_one_line_then_a_bounded_wait(caplog):
    url = f"nats://127.0.0.1:{free_port()}"
    caplog.set_level(logging.WARNING, logger="broker.connection")
    started = time.monotonic()
    with pytest.raises(client.BrokerUnreachable) as gave_up:
        await client.connect_to(BrokerConfig(url=url, connect_timeout_s=2.0), name="test")
    waited = time.monotonic() - started
    assert 2.0 <= waited < 8.0  # generous: a loaded machine
    assert str(gave_up.value).startswith(
        f"NATS at {url} did not answer within 2s (broker.connect_timeout_s)"
    )
    assert str(gave_up.value).endswith("is `python -m broker serve` running?")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # 0.25 + 0.5 + 1 s of backoff: one line, not four
    assert warnings[0].startswith(f"test: waiting for NATS at {url} (is `python -m broker")


async def test_a_broker_that_comes_up_meanwhile_is_found_within_a_backoff_step():
    port = free_port()
    answered = []

    async def late_listener():
        await asyncio.sleep(1.0)
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
        answered.append(time.monotonic())
        return server

    listener = asyncio.create_task(late_listener())
    await client.wait_for_broker(f"nats://127.0.0.1:{port}", timeout_s=30.0)
    found = time.monotonic()
    server = await listener
    server.close()
    assert found - answered[0] < 3.0  # the next try: 0.25, 0.5, 1 s... after the refusals


async def test_connect_to_a_running_broker_is_unchanged(nats_server):
    nc = await client.connect_to(BrokerConfig(url=nats_server.url), name="test")
    try:
        assert nc.is_connected
    finally:
        await nc.close()
