"""Messages of the wrong type or shape on every subject the roles consume, against a real
nats-server: the prompt work queue (actors), the trajectory stream and its claim-check
spills (learner), the policy-version KV (actors, learner). Each is terminated (a KV value:
ignored), counted and logged; the consumer goes on with the next good message."""

import asyncio

import msgspec
import nats.js.errors
import pytest

from broker import client
from broker.codec import encode
from broker.trajectories import CLAIM_HEADER, MSG_ID_HEADER
from broker.wire import PolicyVersion
from tests.broker.builders import prompt_task, trajectory

LIMITS = client.StreamLimits(max_trajectory_bytes=64 * 1024**2)
A_VERSION = PolicyVersion(version=3, published_at=1.0)


@pytest.fixture
async def bus(nats_server, bus_names):
    nc = await client.connect(nats_server.url, name="test-wrong-messages")
    js = nc.jetstream()
    await client.ensure_streams(js, bus_names, LIMITS)
    yield js, bus_names
    await nc.close()


async def test_prompt_queue_terminates_every_wrong_message(bus):
    js, names = bus
    wrong = {
        "a trajectory": encode(trajectory(trajectory_id="t")),
        "a policy version": encode(A_VERSION),
        "JSON": b'{"task_id": "j", "step": 0, "group_size": 4}',
        "empty": b"",
        "a task with a string step": msgspec.msgpack.encode(
            {"task_id": "s", "step": "3", "group_size": 1, "env_class": "c", "prompt": []}
        ),
    }
    for i, data in enumerate(wrong.values()):
        await js.publish(names.prompts_subject, data, headers={MSG_ID_HEADER: f"w{i}"})
    await client.publish_prompts(js, names, [prompt_task(task_id="good")])
    puller = client.PromptPuller(js, names)
    received = []
    async with asyncio.timeout(30):
        while not received:
            received += await puller.fetch(batch=10, timeout_s=0.5)
    assert [r.task.task_id for r in received] == ["good"]
    assert puller.num_corrupt == len(wrong)
    await received[0].ack()
    info = await js.stream_info(names.prompts_stream)
    assert info.state.messages == 0  # terminated: nothing left to redeliver


async def test_trajectory_stream_terminates_every_wrong_message_and_frees_bad_spills(bus):
    js, names = bus
    spill = await js.object_store(names.spill_bucket)
    await spill.put("garbage-claim", b"\xc1 not msgpack")
    await spill.put("other-claim", encode(trajectory(trajectory_id="someone-else")))
    no_group = msgspec.structs.replace(trajectory(trajectory_id="g0"), group_size=0)
    wrong = [
        (encode(prompt_task(task_id="p")), {}),
        (encode(A_VERSION), {}),
        (encode(no_group), {}),
        (b"", {CLAIM_HEADER: "garbage-claim"}),
        (b"", {CLAIM_HEADER: "other-claim"}),
    ]
    for i, (data, headers) in enumerate(wrong):
        await js.publish(
            names.trajectories_subject, data, headers={MSG_ID_HEADER: f"w{i}", **headers}
        )
    good = trajectory(trajectory_id="good")
    await client.TrajectoryPublisher(js, names).publish(good)
    consumer = client.TrajectoryConsumer(js, names)
    received = []
    async with asyncio.timeout(30):
        while not received:
            received += await consumer.fetch(batch=10, timeout_s=0.5)
    assert [r.trajectory for r in received] == [good]
    assert consumer.num_corrupt == len(wrong)
    await received[0].ack()
    for claim in ("garbage-claim", "other-claim"):  # nobody will claim them: deleted
        with pytest.raises(nats.js.errors.NotFoundError):
            await spill.get(claim)


async def test_policy_kv_ignores_wrong_values_and_keeps_following(bus):
    js, names = bus
    store = client.PolicyStore(js, names)
    kv = await js.key_value(names.policy_bucket)
    await kv.put(names.policy_version_key, b"\xc1 not a version")
    assert await store.get() is None
    seen = []

    async def follow():
        async for version in store.follow(poll_interval_s=0.2):
            seen.append(version.version)
            if version.version == 4:
                return

    follower = asyncio.create_task(follow())
    impossible = [
        encode(prompt_task(task_id="p")),
        encode(PolicyVersion(version=-2, published_at=0.0)),
        encode(PolicyVersion(version=5, published_at=0.0, snapshot_version=9)),
    ]
    for value in impossible:
        await kv.put(names.policy_version_key, value)
        await asyncio.sleep(0.3)  # give the follower a look at each
    await store.publish(PolicyVersion(version=4, published_at=2.0))
    await asyncio.wait_for(follower, 30)
    assert seen == [4]
    assert store.num_corrupt >= 2  # get() saw the garbage, the follower the others
