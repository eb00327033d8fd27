"""A publisher against a full stream backs off exponentially (before, a new `PublishRetry`
on every pass of `publish_many` kept the wait at 50 ms forever) and is accepted once the
stream has room again (nats-py never resolves a `publish_async` future the stream answered
with an error: nats-io/nats.py#985)."""

import asyncio

import pytest

from broker import client
from broker.trajectories import PublishRetry
from tests.broker.builders import trajectory

# Room for one 64-token trajectory (about 1.2 KB on the wire), not two.
FULL_AFTER_ONE = client.StreamLimits(max_trajectory_bytes=2048)


@pytest.fixture
async def full_stream(nats_server, bus_names):
    nc = await client.connect(nats_server.url, name="test-backoff")
    js = nc.jetstream()
    await client.ensure_streams(js, bus_names, FULL_AFTER_ONE)
    await client.TrajectoryPublisher(js, bus_names).publish(trajectory(trajectory_id="first"))
    yield js, bus_names
    await nc.close()


async def test_publish_many_backs_off_exponentially_against_a_full_stream(full_stream, monkeypatch):
    js, names = full_stream
    waits: list[float] = []
    original = PublishRetry.wait

    async def recorded(self, error):
        waits.append(self.delay_s)
        await original(self, error)

    monkeypatch.setattr(PublishRetry, "wait", recorded)
    publisher = client.TrajectoryPublisher(js, names, ack_timeout_s=0.5)
    second = asyncio.create_task(publisher.publish_many([trajectory(trajectory_id="second")]))
    async with asyncio.timeout(60):  # a bound against hanging, not a speed requirement
        while len(waits) < 5:  # 50 + 100 + 200 + 400 + 800 ms of backoff
            assert not second.done()
            await asyncio.sleep(0.05)
        consumer = client.TrajectoryConsumer(js, names)
        [first] = await consumer.fetch(batch=1, timeout_s=5)
        await first.msg.ack_sync()  # the work queue frees its bytes: the retry is accepted
        await second
    assert waits[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
