"""The actor loop against a real nats-server, on the scripted engine and the fake env:
prompt task -> group of trajectories on the bus, ack only after all are published, bad
tasks terminated and counted, env outages as error stop reasons, weights gating, and a
stopped replica's task finished by another one."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import prometheus_client
import pytest

from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from broker import client as bus
from broker.codec import token_arrays
from broker.config import BrokerConfig
from broker.wire import PolicyVersion, PromptTask
from demo.data import SYSTEM_PROMPT
from demo.tokenizer import build_tokenizer
from tests.fakes import InProcessEnv, ScriptedEngine, SilentFollower, by_turn

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
ANSWER = "<answer>42</answer>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


@pytest.fixture
def broker(nats_server, bus_names) -> BrokerConfig:
    # Stream byte limits are reserved on the server: keep each test's small.
    return BrokerConfig(
        url=nats_server.url,
        namespace=bus_names.namespace,
        prompt_ack_wait_s=30.0,
        max_trajectory_bytes=64 * 1024**2,
    )


@pytest.fixture
async def js(broker):
    nc = await bus.connect(broker.url, name="test")
    js = nc.jetstream()
    await bus.ensure_streams(js, broker.names, broker.stream_limits())
    yield js
    await nc.close()


def _config(**overrides) -> ActorConfig:
    fields = dict(
        engine={"model": "unused-by-fakes"},
        env={"backoff_s": 0.0},
        heartbeat_s=0.5,
        fetch_timeout_s=0.2,
        nak_delay_s=0.2,
        drain_timeout_s=0.0,
        metrics_port=0,
        sampling={"seed": 0},
    )
    fields.update(overrides)
    return ActorConfig.model_validate(fields)


def _task(task_id="task-1", *, group_size=4, min_version=0, question="What is 17 + 25?"):
    return PromptTask(
        task_id=task_id,
        step=1,
        min_version=min_version,
        group_size=group_size,
        env_class="calculator",
        data_source="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        reward_spec={"method": "rule", "ground_truth": "42"},
    )


def _actor(tokenizer, broker, *, config=None, engine=None, env=None, actor_id="a0") -> Actor:
    return Actor(
        config=config or _config(),
        broker=broker,
        engine=engine or ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER)),
        env=env or InProcessEnv(),
        chat=ChatTemplate(tokenizer),
        actor_id=actor_id,
    )


@contextlib.asynccontextmanager
async def _running(actor: Actor):
    stop = asyncio.Event()
    task = asyncio.create_task(actor.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def _until(predicate, timeout_s=20.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _stream_messages(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


async def _trajectories(js, broker, expected: int, timeout_s=20.0):
    consumer = bus.TrajectoryConsumer(js, broker.names)
    received = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(received) < expected and asyncio.get_running_loop().time() < deadline:
        received += await consumer.fetch(batch=64, timeout_s=0.2)
    received += await consumer.fetch(batch=64, timeout_s=0.3)  # nothing more may come
    for r in received:
        await r.ack()
    return sorted((r.trajectory for r in received), key=lambda t: t.sample_index)


def _metric(name, **labels) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_task_becomes_a_group_and_is_acked_only_after_all_published(tokenizer, broker, js):
    names = broker.names
    # Sample 3 (seed 3) is slow: the other three are published while it still runs.
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER), delay_for_seed={3: 1.0})
    actor = _actor(tokenizer, broker, engine=engine)
    acked = _metric("tether_actor_tasks_total", outcome="acked")
    await bus.publish_prompts(js, names, [_task()])
    async with _running(actor):

        async def three_published():
            return await _stream_messages(js, names.trajectories.stream) >= 3

        await _until(three_published)
        assert await _stream_messages(js, names.trajectories.stream) == 3
        assert await _stream_messages(js, names.prompts.stream) == 1  # not acked yet
        info = await js.consumer_info(names.prompts.stream, names.prompts.consumer)
        assert info.num_ack_pending == 1

        async def prompt_acked():
            return await _stream_messages(js, names.prompts.stream) == 0

        await _until(prompt_acked)
        trajectories = await _trajectories(js, broker, 4)
    assert [t.trajectory_id for t in trajectories] == [f"task-1/{i}" for i in range(4)]
    assert {(t.group_id, t.group_size, t.step, t.actor_id) for t in trajectories} == {
        ("task-1", 4, 1, "a0")
    }
    assert [t.reward for t in trajectories] == [1.0] * 4
    assert {t.stop_reason for t in trajectories} == {"stop"}
    for t in trajectories:
        arrays = token_arrays(t)
        assert set(arrays.versions[arrays.loss_mask == 1].tolist()) == {0}
        assert set(arrays.versions[arrays.loss_mask == 0].tolist()) == {-1}
    assert _metric("tether_actor_tasks_total", outcome="acked") == acked + 1
    assert actor.num_published == 4


async def test_malformed_and_undecodable_tasks_are_terminated_and_counted(tokenizer, broker, js):
    names = broker.names
    rejected = _metric("tether_actor_tasks_total", outcome="rejected")
    actor = _actor(tokenizer, broker)
    await js.publish(names.prompts.subject, b"\x93not a prompt task")
    await bus.publish_prompts(js, names, [_task("bad-group", group_size=0)])
    async with _running(actor):

        async def both_gone():
            return await _stream_messages(js, names.prompts.stream) == 0

        await _until(both_gone)
    assert actor.puller.num_corrupt == 1
    assert _metric("tether_actor_tasks_total", outcome="rejected") == rejected + 1
    assert await _stream_messages(js, names.trajectories.stream) == 0


async def test_over_long_prompt_is_rejected_with_its_reason(tokenizer, broker, js, caplog):
    names = broker.names
    config = _config(rollout={"max_input_length": 16, "max_sequence_length": 64})
    actor = _actor(tokenizer, broker, config=config)
    await bus.publish_prompts(js, names, [_task("long-1")])
    with caplog.at_level(logging.ERROR, logger="broker.prompts"):
        async with _running(actor):

            async def gone():
                return await _stream_messages(js, names.prompts.stream) == 0

            await _until(gone)
    assert await _stream_messages(js, names.trajectories.stream) == 0
    assert "rejecting prompt task long-1" in caplog.text
    assert "exceeds max_input_length 16" in caplog.text
    info = await js.consumer_info(names.prompts.stream, names.prompts.consumer)
    assert info.num_redelivered == 0  # terminated, not retried


async def test_env_servers_down_give_error_stop_reasons_not_rewards(tokenizer, broker, js):
    env = InProcessEnv(("env-a", "env-b"))
    env.down.update({"env-a", "env-b"})
    actor = _actor(tokenizer, broker, env=env)
    await bus.publish_prompts(js, broker.names, [_task("down-1", group_size=2)])
    async with _running(actor):
        trajectories = await _trajectories(js, broker, 2)
    assert [t.stop_reason for t in trajectories] == ["error:env_open"] * 2
    assert [t.reward for t in trajectories] == [0.0, 0.0]
    assert all(token_arrays(t).loss_mask.sum() == 0 for t in trajectories)


async def test_new_replica_loads_the_snapshot_and_waits_for_min_version(tokenizer, broker, js):
    names = broker.names
    policy = bus.PolicyStore(js, names)
    await policy.publish(
        PolicyVersion(version=5, published_at=0.0, snapshot_path="/snap/v5", snapshot_version=5)
    )
    engine = ScriptedEngine(tokenizer, by_turn(ANSWER))
    actor = _actor(tokenizer, broker, engine=engine)
    waited = _metric("tether_actor_wait_seconds_total", what="weights")
    await bus.publish_prompts(
        js, names, [_task("now", group_size=1), _task("later", group_size=1, min_version=7)]
    )
    async with _running(actor):
        first = await _trajectories(js, broker, 1)
        assert engine.snapshots_loaded == [("/snap/v5", 5)]
        assert [t.group_id for t in first] == ["now"]
        await asyncio.sleep(0.5)  # "later" must wait for version 7
        assert await _stream_messages(js, names.trajectories.stream) == 0
        await policy.publish(
            PolicyVersion(version=7, published_at=0.0, snapshot_path="/snap/v7", snapshot_version=7)
        )
        second = await _trajectories(js, broker, 1)
    assert [t.group_id for t in second] == ["later"]
    for t, version in ((first[0], 5), (second[0], 7)):
        arrays = token_arrays(t)
        assert set(arrays.versions[arrays.loss_mask == 1].tolist()) == {version}
    assert _metric("tether_actor_wait_seconds_total", what="weights") >= waited + 0.4


async def test_engine_ahead_of_a_resumed_learner_rolls_back_to_its_snapshot(tokenizer, broker, js):
    # The learner got to v7 and died; its successor resumed from the v4 checkpoint under a
    # new lineage. Generating on v7 weights would tag every token 7 > 4 (dropped as
    # `future` until the learner got there again: a stall); the engine goes back to v4.
    names = broker.names
    policy = bus.PolicyStore(js, names)
    await policy.publish(
        PolicyVersion(
            version=7, published_at=0.0, snapshot_path="/a/v7", snapshot_version=7, lineage="a"
        )
    )
    engine = ScriptedEngine(tokenizer, by_turn(ANSWER))
    actor = _actor(tokenizer, broker, engine=engine)
    async with _running(actor):

        async def loaded_v7():
            return engine.version == 7

        await _until(loaded_v7)
        await policy.publish(
            PolicyVersion(
                version=4, published_at=1.0, snapshot_path="/b/v4", snapshot_version=4, lineage="b"
            )
        )

        async def rolled_back():
            return engine.version == 4

        await _until(rolled_back)
        await bus.publish_prompts(js, names, [_task("after", group_size=1, min_version=4)])
        (trajectory,) = await _trajectories(js, broker, 1)
    assert engine.snapshots_loaded == [("/a/v7", 7), ("/b/v4", 4)]
    assert actor.weights.num_rollbacks == 1 and actor.weights.newest_version == 4
    arrays = token_arrays(trajectory)
    assert set(arrays.versions[arrays.loss_mask == 1].tolist()) == {4}


async def test_weights_that_do_not_come_are_caught_up_from_a_snapshot_or_the_task_handed_back(
    tokenizer, broker, js, monkeypatch
):
    # The replica follows a broadcast that never delivers, as the restarted replica whose eval
    # tasks once waited for ever (docs/reliability.md). Past version_wait_s it loads the
    # announced snapshot when it is new enough, and hands the task back when not.
    monkeypatch.setattr("weights.actor_side.follower.BroadcastFollower", SilentFollower)
    names = broker.names
    policy = bus.PolicyStore(js, names)
    dead_store = "127.0.0.1:9"

    async def announce(version: int, snapshot_version: int) -> None:
        await policy.publish(
            PolicyVersion(
                version=version,
                published_at=0.0,
                snapshot_path=f"/snap/v{snapshot_version}",
                snapshot_version=snapshot_version,
                broadcast_addr=dead_store,
            )
        )

    await announce(3, 3)  # loaded at start, before the broadcast is followed
    engine = ScriptedEngine(tokenizer, by_turn(ANSWER))
    config = _config(version_wait_s=0.3)
    actor = _actor(tokenizer, broker, engine=engine, config=config)
    handed_back = _metric("tether_actor_tasks_total", outcome="nacked")

    async def seen(version: int):
        async def check():
            return actor.weights.newest_version == version

        await _until(check)

    async with _running(actor):
        await seen(3)
        await announce(5, 5)  # broadcast followed: the snapshot is not loaded by itself
        await seen(5)
        await bus.publish_prompts(js, names, [_task("needs-5", group_size=1, min_version=5)])
        (caught_up,) = await _trajectories(js, broker, 1)
        await announce(6, 5)  # no snapshot of v6: the task goes back
        await seen(6)
        await bus.publish_prompts(js, names, [_task("needs-6", group_size=1, min_version=6)])

        async def handed_back_once():
            return _metric("tether_actor_tasks_total", outcome="nacked") > handed_back

        await _until(handed_back_once)
        await announce(7, 6)
        (later,) = await _trajectories(js, broker, 1)
    assert engine.snapshots_loaded == [("/snap/v3", 3), ("/snap/v5", 5), ("/snap/v6", 6)]
    for t, version in ((caught_up, 5), (later, 6)):
        arrays = token_arrays(t)
        assert set(arrays.versions[arrays.loss_mask == 1].tolist()) == {version}


class _LateFollower(SilentFollower):
    """A broadcast this engine registered with too late: round 5 went out without it, and
    the next round comes only after the learner's next step (which waits for our data)."""

    missed_version = 5


async def test_a_missed_round_is_caught_up_from_its_snapshot_at_once(
    tokenizer, broker, js, monkeypatch
):
    # A restarted learner's first rounds went out before this replica registered again:
    # waiting out version_wait_s (30 s by default) for round 6 stalled the fault suite.
    monkeypatch.setattr("weights.actor_side.follower.BroadcastFollower", _LateFollower)
    names = broker.names
    policy = bus.PolicyStore(js, names)

    async def announce(version: int, snapshot_version: int) -> None:
        await policy.publish(
            PolicyVersion(
                version=version,
                published_at=0.0,
                broadcast_addr="127.0.0.1:9",
                snapshot_path=f"/snap/v{snapshot_version}",
                snapshot_version=snapshot_version,
            )  # fmt: skip
        )

    await announce(4, 4)
    engine = ScriptedEngine(tokenizer, by_turn(ANSWER))
    actor = _actor(tokenizer, broker, engine=engine, config=_config(version_wait_s=600.0))

    async def at_v4():
        return engine.version == 4

    async with _running(actor):
        await _until(at_v4)
        await announce(5, 4)  # missed, but no snapshot of v5 yet: the task waits
        await bus.publish_prompts(js, names, [_task("needs-5", group_size=1, min_version=5)])
        await asyncio.sleep(1.5)
        assert engine.snapshots_loaded == [("/snap/v4", 4)] and actor.num_published == 0
        await announce(5, 5)  # the learner, waiting for data, snapshots the version
        (trajectory,) = await _trajectories(js, broker, 1)  # within 20 s, not 600
    assert engine.snapshots_loaded == [("/snap/v4", 4), ("/snap/v5", 5)]
    arrays = token_arrays(trajectory)
    assert set(arrays.versions[arrays.loss_mask == 1].tolist()) == {5}


async def _hand_over(tokenizer, broker, js, task_id, *, first_engine, config=None):
    """Run `task_id` on a replica `first` until two trajectories are stored, stop it, and
    let a replica `second` finish the task; the stored trajectories and `second`."""
    names = broker.names
    first = _actor(tokenizer, broker, engine=first_engine, actor_id="first", config=config)
    await bus.publish_prompts(js, names, [_task(task_id)])
    async with _running(first):

        async def two_published():
            return await _stream_messages(js, names.trajectories.stream) >= 2

        await _until(two_published)
    # `first` stopped with samples 2 and 3 unfinished: the task was nak'd, not lost.
    second = _actor(tokenizer, broker, actor_id="second", config=config)
    async with _running(second):
        trajectories = await _trajectories(js, broker, 4)

        async def prompt_acked():
            return await _stream_messages(js, names.prompts.stream) == 0

        await _until(prompt_acked)
    assert [t.trajectory_id for t in trajectories] == [f"{task_id}/{i}" for i in range(4)]
    assert [t.actor_id for t in trajectories] == ["first", "first", "second", "second"]
    return trajectories, second


async def test_stopped_replica_hands_its_group_to_another(tokenizer, broker, js):
    slow = ScriptedEngine(tokenizer, by_turn(ANSWER), delay_for_seed={2: 60.0, 3: 60.0})
    _, second = await _hand_over(tokenizer, broker, js, "handover", first_engine=slow)
    # The samples `first` stored were marked so in the episodes bucket: not generated again.
    assert second.num_published == 2


async def test_without_episode_checkpoints_a_handed_over_group_is_played_whole(
    tokenizer, broker, js
):
    slow = ScriptedEngine(tokenizer, by_turn(ANSWER), delay_for_seed={2: 60.0, 3: 60.0})
    config = _config(episode_checkpoints=False)
    _, second = await _hand_over(tokenizer, broker, js, "whole", first_engine=slow, config=config)
    assert second.num_published == 4  # two of them were duplicates, stored once


async def test_a_handed_over_multi_turn_group_continues_from_the_last_turns(tokenizer, broker, js):
    # Samples 2 and 3 of `first` call the tool, then hang in their second turn.
    slow = ScriptedEngine(
        tokenizer, by_turn(TOOL_CALL, ANSWER), delay_for_seed={2: 60.0, 3: 60.0},
        delay_for_turn={0: 0.0},
    )  # fmt: skip
    trajectories, second = await _hand_over(tokenizer, broker, js, "turns", first_engine=slow)
    assert second.num_published == 2
    first_turns = slow.generations[:4]  # each sample's first turn, all four generated by `first`
    for trajectory in trajectories[2:]:
        assert (trajectory.resumed_turns, trajectory.num_turns) == (1, 2)
        assert trajectory.resumed_tokens == len(first_turns[0].token_ids)
        arrays = token_arrays(trajectory)
        generated = arrays.token_ids[arrays.loss_mask == 1].tolist()
        assert generated[: trajectory.resumed_tokens] == first_turns[0].token_ids
    # `second` generated only the last turns of the resumed samples.
    assert len(second.engine.calls) == 2
    assert all(t.resumed_turns == 0 for t in trajectories[:2])


async def test_a_leaving_replica_stops_at_turn_boundaries_and_nothing_is_generated_twice(
    tokenizer, broker, js
):
    """A scale-in or a preemption (SIGTERM with a grace): the episodes mid-turn finish that
    turn, are checkpointed there, and their group goes back; the next replica generates only
    the turns left. Together the two generate what one replica would have: nothing twice."""
    # Samples 2 and 3 take 2 s a turn: when `first` is told to stop (two samples stored),
    # they are in their first turn, the tool call.
    slow = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER), delay_for_seed={2: 2.0, 3: 2.0})
    handed_back = _metric("tether_actor_tasks_total", outcome="handed_back")
    config = _config(drain_timeout_s=10.0)
    trajectories, second = await _hand_over(
        tokenizer, broker, js, "leave", first_engine=slow, config=config
    )
    assert len(slow.generations) == 6  # 2 turns of samples 0 and 1, the first of 2 and 3
    assert len(second.engine.calls) == 2  # the second turns of samples 2 and 3 alone
    for trajectory, first_turn in zip(trajectories[2:], slow.generations[4:], strict=True):
        assert (trajectory.resumed_turns, trajectory.num_turns) == (1, 2)
        arrays = token_arrays(trajectory)
        generated = arrays.token_ids[arrays.loss_mask == 1].tolist()
        assert generated[: trajectory.resumed_tokens] == first_turn.token_ids
    assert _metric("tether_actor_tasks_total", outcome="handed_back") == handed_back + 1


async def test_heartbeats_keep_a_group_longer_than_the_ack_wait(tokenizer, nats_server, bus_names):
    broker = BrokerConfig(
        url=nats_server.url,
        namespace=bus_names.namespace,
        prompt_ack_wait_s=1.0,
        max_trajectory_bytes=64 * 1024**2,
    )
    engine = ScriptedEngine(tokenizer, by_turn(ANSWER), delay_for_seed={1: 3.0})
    actor = _actor(tokenizer, broker, config=_config(heartbeat_s=0.2), engine=engine)
    nc = await bus.connect(broker.url, name="test")
    js = nc.jetstream()
    await bus.ensure_streams(js, broker.names, broker.stream_limits())
    await bus.publish_prompts(js, broker.names, [_task("long-episode", group_size=2)])
    async with _running(actor):
        trajectories = await _trajectories(js, broker, 2)
    info = await js.consumer_info(broker.names.prompts.stream, broker.names.prompts.consumer)
    await nc.close()
    assert info.num_redelivered == 0 and info.num_ack_pending == 0
    assert [t.trajectory_id for t in trajectories] == ["long-episode/0", "long-episode/1"]
    assert len(engine.calls) == 2  # generated once, not re-played
