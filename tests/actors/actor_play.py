"""The actor on real parts, driven as the learner would: announce a weights snapshot, publish
prompt tasks, run one `Actor` (gRPC env client, the given engine and tokenizer) until every
trajectory is stored, and return them; and where a trajectory's assistant turns lie. Shared
by the integration tests of the actor."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.config import ActorConfig
from actors.replica import grpc_actor
from broker import client as bus
from broker.config import BrokerConfig
from broker.wire import PolicyVersion
from protos.client import EnvClient


async def play_tasks(
    *, engine, tokenizer, broker: BrokerConfig, env_address: str, snapshot, tasks, **actor_fields
):
    """Announce the snapshot, publish the tasks, run the actor until every trajectory is on
    the bus; return them (acked) in (group, sample) order."""
    nc = await bus.connect(broker.url, name="test")
    js = nc.jetstream()
    await bus.ensure_streams(js, broker.names, broker.stream_limits())
    version = tasks[0].min_version
    await bus.PolicyStore(js, broker.names).publish(
        PolicyVersion(
            version=version,
            published_at=time.time(),
            snapshot_path=str(snapshot),
            snapshot_version=version,
        )
    )
    await bus.publish_prompts(js, broker.names, tasks)
    fields = dict(
        engine={"model": str(snapshot), "max_model_len": 1024},
        env={"addresses": [env_address], "backoff_s": 0.05},
        rollout={
            "max_turns": 4,
            "max_generate_length": 48,
            "max_input_length": 1024,
            "max_sequence_length": 1024,
            # keep the masks of turns cut at max_generate_length
            "overlong_filtering": False,
        },
        heartbeat_s=5.0,
        fetch_timeout_s=0.2,
        drain_timeout_s=0.0,
        metrics_port=0,
    )
    config = ActorConfig.model_validate({**fields, **actor_fields})
    client = EnvClient([env_address], timeout_s=10, max_retries=0)
    actor = grpc_actor(config, broker, engine, tokenizer, actor_id="it", client=client)
    stop = asyncio.Event()
    running = asyncio.create_task(actor.run(stop))
    consumer = bus.TrajectoryConsumer(js, broker.names)
    expected = sum(t.group_size for t in tasks)
    received = []
    deadline = time.monotonic() + 120
    try:
        while len(received) < expected:
            assert time.monotonic() < deadline, f"{len(received)} of {expected} trajectories"
            if running.done():
                running.result()  # raises the actor's error
                pytest.fail("the actor stopped before publishing every trajectory")
            received += await consumer.fetch(batch=64, timeout_s=0.5)
        for r in received:
            await r.ack()
        # The tasks are acked once all their trajectories are stored.
        while (await js.stream_info(broker.names.prompts.stream)).state.messages:
            assert time.monotonic() < deadline, "prompt tasks were not acked"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=30)
        await client.close()
        await nc.close()
    return sorted((r.trajectory for r in received), key=lambda t: (t.group_id, t.sample_index))


def generated_runs(mask, start: int = 0) -> list[tuple[int, int]]:
    """[start, end) of each run of loss-mask-1 tokens from `start` on: the assistant turns."""
    runs, run_start = [], None
    for position in range(start, len(mask) + 1):
        inside = position < len(mask) and mask[position] == 1
        if inside and run_start is None:
            run_start = position
        elif not inside and run_start is not None:
            runs.append((run_start, position))
            run_start = None
    return runs
