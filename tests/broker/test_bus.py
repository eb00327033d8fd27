"""The wire contract against a real nats-server (session fixture on a loopback port)."""

import asyncio
import dataclasses

import msgspec
import nats.js.errors
import pytest
from nats.js.api import DiscardPolicy, StorageType

from broker import client
from broker.codec import encode, token_arrays
from broker.trajectories import CLAIM_HEADER, MSG_ID_HEADER
from broker.wire import PolicyVersion
from tests.broker.builders import prompt_task, trajectory

# Stream byte limits are reserved on the server: keep each test's small.
TEST_LIMITS = client.StreamLimits(max_trajectory_bytes=256 * 1024**2)


@pytest.fixture
async def bus(nats_server, bus_names):
    nc = await client.connect(nats_server.url, name="test")
    js = nc.jetstream()
    await client.ensure_streams(js, bus_names, TEST_LIMITS)
    yield js, bus_names
    await nc.close()


async def _drain(consumer, expected: int, timeout_s: float = 60.0):
    received = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(received) < expected and asyncio.get_running_loop().time() < deadline:
        received += await consumer.fetch(batch=512, timeout_s=0.5)
    return received


async def test_ten_thousand_trajectories_round_trip_identically(bus):
    js, names = bus
    sent = [
        trajectory(trajectory_id=f"t{i}", sample_index=i % 4, num_tokens=128, seed=i)
        for i in range(10_000)
    ]
    publisher = client.TrajectoryPublisher(js, names)
    for start in range(0, len(sent), 500):
        await publisher.publish_many(sent[start : start + 500])
    consumer = client.TrajectoryConsumer(js, names)
    received = await _drain(consumer, len(sent))
    for r in received:
        await r.ack()
    assert len(received) == len(sent)
    by_id = {r.trajectory.trajectory_id: r.trajectory for r in received}
    assert by_id == {t.trajectory_id: t for t in sent}
    assert consumer.num_corrupt == 0


async def test_retried_publish_is_stored_once(bus):
    js, names = bus
    publisher = client.TrajectoryPublisher(js, names)
    t = trajectory(trajectory_id="same-id")
    await publisher.publish(t)
    await publisher.publish(t)  # e.g. the actor retried after a lost ack
    assert publisher.num_duplicates == 1
    info = await js.stream_info(names.trajectories.stream)
    assert info.state.messages == 1


async def test_nakd_message_is_redelivered(bus):
    js, names = bus
    await client.TrajectoryPublisher(js, names).publish(trajectory(trajectory_id="n1"))
    consumer = client.TrajectoryConsumer(js, names)
    [first] = await _drain(consumer, 1)
    assert first.num_delivered == 1
    await first.nak()
    [again] = await _drain(consumer, 1)
    assert again.trajectory == first.trajectory
    assert again.num_delivered == 2
    await again.ack()
    assert await consumer.fetch(timeout_s=0.3) == []


async def test_256k_token_trajectory_round_trips(bus):
    js, names = bus
    big = trajectory(trajectory_id="big", num_tokens=256 * 1024, prompt_len=1024, seed=1)
    await client.TrajectoryPublisher(js, names).publish(big)
    [received] = await _drain(client.TrajectoryConsumer(js, names), 1)
    assert received.trajectory == big
    await received.ack()


async def test_oversized_trajectory_is_spilled_and_claimed(bus):
    js, names = bus
    # 1M tokens is ~13 MB: above the 8 MB max payload, so it must go by claim check.
    huge = trajectory(trajectory_id="huge", num_tokens=1024 * 1024, prompt_len=10, seed=2)
    publisher = client.TrajectoryPublisher(js, names)
    await publisher.publish(huge)
    assert publisher.num_spilled == 1
    [received] = await _drain(client.TrajectoryConsumer(js, names), 1)
    assert received.claim == "huge"
    assert received.trajectory == huge
    assert (token_arrays(received.trajectory).token_ids == token_arrays(huge).token_ids).all()
    await received.ack()
    spill = await js.object_store(names.spill_bucket)
    with pytest.raises(nats.js.errors.NotFoundError):
        await spill.get("huge")  # the claim is cleaned up once consumed


async def test_corrupt_messages_are_terminated_counted_and_do_not_stop_the_consumer(bus):
    js, names = bus
    good = trajectory(trajectory_id="good")
    misaligned = msgspec.structs.replace(trajectory(trajectory_id="bad"), loss_mask=b"\x01")
    await js.publish(
        names.trajectories.subject, b"\xc1 not msgpack", headers={MSG_ID_HEADER: "garbage"}
    )
    await js.publish(names.trajectories.subject, encode(misaligned), headers={MSG_ID_HEADER: "bad"})
    await js.publish(
        names.trajectories.subject, b"", headers={MSG_ID_HEADER: "claim", CLAIM_HEADER: "nowhere"}
    )
    await client.TrajectoryPublisher(js, names).publish(good)
    consumer = client.TrajectoryConsumer(js, names)
    received = await _drain(consumer, 1)
    assert [r.trajectory for r in received] == [good]
    assert consumer.num_corrupt == 3
    await received[0].ack()
    # Terminated, not redelivered: nothing is left for the consumer.
    await asyncio.sleep(0.2)
    assert await consumer.fetch(timeout_s=0.5) == []
    info = await js.consumer_info(names.trajectories.stream, names.trajectories.consumer)
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_ensure_streams_is_idempotent_and_uses_file_storage_with_discard_new(bus):
    js, names = bus
    await client.ensure_streams(js, names, TEST_LIMITS)
    await client.ensure_streams(js, names, dataclasses.replace(TEST_LIMITS, max_prompt_msgs=10))
    info = await js.stream_info(names.prompts.stream)
    assert info.config.storage == StorageType.FILE
    assert info.config.discard == DiscardPolicy.NEW
    assert info.config.max_msgs == 10
    consumer = await js.consumer_info(names.prompts.stream, names.prompts.consumer)
    assert consumer.config.max_ack_pending == client.StreamLimits().prompt_max_ack_pending


async def test_full_stream_backpressures_instead_of_dropping(bus):
    js, names = bus
    await client.ensure_streams(js, names, dataclasses.replace(TEST_LIMITS, max_prompt_msgs=2))
    await client.publish_prompts(js, names, [prompt_task(task_id="p0"), prompt_task(task_id="p1")])
    third = asyncio.create_task(client.publish_prompts(js, names, [prompt_task(task_id="p2")]))
    await asyncio.sleep(0.5)
    assert not third.done()  # waiting, not dropped and not evicting p0
    puller = client.PromptPuller(js, names)
    [p0] = await puller.fetch(batch=1)
    assert p0.task.task_id == "p0"
    await p0.ack()
    assert await asyncio.wait_for(third, 10) == 1


async def test_prompt_work_queue_delivers_each_task_once(bus):
    js, names = bus
    tasks = [prompt_task(task_id=f"p{i}", step=i) for i in range(20)]
    assert await client.publish_prompts(js, names, tasks) == 20
    assert await client.publish_prompts(js, names, tasks[:5]) == 0  # deduplicated
    a, b = client.PromptPuller(js, names), client.PromptPuller(js, names)
    got = []
    for puller in (a, b, a, b):
        for received in await puller.fetch(batch=5, timeout_s=0.5):
            got.append(received.task)
            await received.ack()
    assert sorted(t.task_id for t in got) == sorted(t.task_id for t in tasks)


async def test_malformed_prompt_is_terminated_and_counted(bus):
    js, names = bus
    await js.publish(names.prompts.subject, b"{not a task", headers={MSG_ID_HEADER: "x"})
    await client.publish_prompts(js, names, [prompt_task(task_id="ok")])
    puller = client.PromptPuller(js, names)
    received = await puller.fetch(batch=2)
    assert [r.task.task_id for r in received] == ["ok"]
    assert puller.num_corrupt == 1


async def test_policy_version_follow_sees_each_new_version(bus):
    js, names = bus
    store = client.PolicyStore(js, names)
    assert await store.get() is None
    seen = []

    async def follow():
        async for version in store.follow(poll_interval_s=0.2):
            seen.append(version.version)
            if version.version == 3:
                return

    follower = asyncio.create_task(follow())
    for v in range(4):
        await store.publish(PolicyVersion(version=v, published_at=float(v)))
        await asyncio.sleep(0.1)
    await asyncio.wait_for(follower, 10)
    assert seen[-1] == 3 and seen == sorted(set(seen))
    assert (await store.get()).version == 3


def _follow_until(store, fields, stop):
    """Follow `store` in a task: (the task, the list of `fields(version)` of every version it
    yields); the task ends after the first version where `stop(version)`."""
    seen = []

    async def follow():
        async for version in store.follow(poll_interval_s=0.2):
            seen.append(fields(version))
            if stop(version):
                return

    return asyncio.create_task(follow()), seen


async def test_policy_follow_yields_a_new_lineage_even_below_the_newest_version(bus):
    # A learner that resumed from an older checkpoint announces a lower version under a new
    # lineage: followers must see it (actors roll back); a lower version of the same
    # lineage (an out-of-order read) is not news.
    js, names = bus
    store = client.PolicyStore(js, names)
    follower, seen = _follow_until(
        store, lambda v: (v.version, v.lineage), lambda v: v.lineage == "b" and v.version == 5
    )
    for version, lineage in ((6, "a"), (7, "a"), (4, "b"), (5, "b")):
        await store.publish(PolicyVersion(version=version, published_at=0.0, lineage=lineage))
        await asyncio.sleep(0.3)  # the KV keeps only the newest: let each be seen
    await asyncio.wait_for(follower, 10)
    assert seen == [(6, "a"), (7, "a"), (4, "b"), (5, "b")]


async def test_policy_follow_yields_the_same_version_again_with_a_newer_snapshot(bus):
    # A learner that waits for data writes a snapshot of the version it already announced
    # (for engines that missed its broadcast): followers must see the new snapshot; the
    # same announcement again is not news.
    js, names = bus
    store = client.PolicyStore(js, names)
    follower, seen = _follow_until(
        store, lambda v: (v.version, v.snapshot_version), lambda v: v.snapshot_version == 8
    )
    for version, snapshot in ((8, 5), (8, 5), (8, 8)):
        path = f"/runs/weights/v{snapshot}"
        announced = PolicyVersion(
            version=version, published_at=0.0, snapshot_path=path, snapshot_version=snapshot
        )
        await store.publish(announced)
        await asyncio.sleep(0.3)
    await asyncio.wait_for(follower, 10)
    assert seen == [(8, 5), (8, 8)]
