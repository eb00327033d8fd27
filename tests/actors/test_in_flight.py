"""Work in flight sized by the engine's room, so slow tools never leave it idle
(actors/in_flight.py): the rule on its own, the counts an episode's env calls keep, and
replicas on a real nats-server taking every admitted task while their episodes wait on
tools, only what their engine has room for while they generate, and spreading the work
between them."""

from __future__ import annotations

import asyncio

import pytest

from actors.in_flight import EngineDemand, tasks_to_take
from broker import client as bus
from tests.actors import test_actor_loop as loop
from tests.actors.test_actor_loop import ANSWER, TOOL_CALL, _actor, _config, _running, _task, _until
from tests.fakes import InProcessEnv, ScriptedEngine, by_turn

tokenizer, broker, js = loop.tokenizer, loop.broker, loop.js  # the actor loop's fixtures

HELD_S = 60.0
"""A delay no test outlives: what it holds stays held until the replica stops."""


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        # Before the first task the group size is unknown: one, to learn it.
        (dict(wanting_engine=0, groups=0, group_size=None), 1),
        (dict(wanting_engine=4, groups=1, group_size=None), 1),
        # 64 slots, groups of 8: as many groups as fit beside what wants the engine now.
        (dict(wanting_engine=0, groups=0, group_size=8), 8),
        (dict(wanting_engine=40, groups=5, group_size=8), 3),
        (dict(wanting_engine=60, groups=8, group_size=8), 0),
        # Episodes at a tool want nothing: 30 groups held, 8 episodes generating.
        (dict(wanting_engine=8, groups=30, group_size=8), 7),
        # A group larger than the engine still runs when the replica is idle, alone.
        (dict(wanting_engine=0, groups=0, group_size=100), 1),
        (dict(wanting_engine=0, groups=1, group_size=100), 0),
        # More wanting than slots (a group took more than room): nothing, never negative.
        (dict(wanting_engine=80, groups=10, group_size=8), 0),
    ],
)
def test_tasks_to_take_by_engine_room(counts, expected):
    assert tasks_to_take(engine_slots=64, **counts) == expected


@pytest.mark.parametrize(
    ("groups", "max_groups", "expected"), [(0, 2, 2), (1, 2, 1), (2, 2, 0), (5, 2, 0)]
)
def test_an_explicit_cap_limits_on_top(groups, max_groups, expected):
    taken = tasks_to_take(
        engine_slots=64, wanting_engine=0, groups=groups, group_size=8, max_groups=max_groups
    )
    assert taken == expected


async def test_demand_counts_episodes_at_an_env_server_as_not_wanting_the_engine():
    demand = EngineDemand()
    assert demand.take_group(4) == 4 and demand.largest_group == 4
    assert demand.take_group(0) == 0 and demand.take_group(5000) == 0  # malformed: rejected
    assert (demand.episodes, demand.largest_group) == (4, 4)
    env = demand.counting(InProcessEnv(step_delay_s=0.2))
    session = await env.open("calculator", _row())
    assert demand.at_env == 0 and demand.wanting_engine == 4
    demand.changed.clear()
    step = asyncio.create_task(session.step(ANSWER))
    await asyncio.sleep(0.05)
    assert (demand.at_env, demand.wanting_engine) == (1, 3)
    assert demand.changed.is_set()  # room opened: the pulling loop looks again
    await step
    assert (demand.at_env, demand.wanting_engine) == (0, 4)
    demand.end_episodes(4)
    assert demand.episodes == 0


async def test_an_agent_workflow_wants_the_engine_only_while_its_calls_generate():
    demand = EngineDemand()
    demand.take_group(2)
    engine = demand.for_agents(_SlowEngine())
    demand.at_env += 1  # the workflow's run, at its env server (as `counting` counts it)
    assert demand.wanting_engine == 1
    call = asyncio.create_task(engine.generate([1, 2], None))
    await asyncio.sleep(0.05)
    assert demand.wanting_engine == 2  # generating: back at the engine
    demand.changed.clear()
    await call
    assert demand.wanting_engine == 1 and demand.changed.is_set()  # room again


class _SlowEngine:
    version = 0

    async def generate(self, prompt_token_ids, turn):
        await asyncio.sleep(0.2)
        return None


def _row() -> dict:
    task = _task()
    return {
        "data_source": task.data_source,
        "env_class": task.env_class,
        "prompt": [dict(m) for m in task.prompt],
        "reward_spec": dict(task.reward_spec),
        "extra_info": {},
    }


async def _ack_pending(js, names) -> int:
    return (await js.consumer_info(names.prompts.stream, names.prompts.consumer)).num_ack_pending


async def _holds_steady(js, names, expected: int) -> None:
    """The broker sees `expected` tasks taken, and still after a while (no more pulled)."""

    async def taken():
        return await _ack_pending(js, names) == expected

    await _until(taken)
    await asyncio.sleep(1.0)
    assert await _ack_pending(js, names) == expected


def _engine_bound_config(**overrides):
    return _config(engine={"model": "unused-by-fakes", "max_num_seqs": 8}, **overrides)


async def test_episodes_waiting_on_tools_leave_room_for_every_admitted_task(tokenizer, broker, js):
    """8 engine slots, groups of 4, every tool call slow: the replica holds all 6 released
    tasks (24 episodes at the tool, none in the engine)."""
    env = InProcessEnv(step_delay_s=HELD_S)
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER))
    actor = _actor(tokenizer, broker, config=_engine_bound_config(), engine=engine, env=env)
    await bus.publish_prompts(js, broker.names, [_task(f"t-{i}") for i in range(6)])
    async with _running(actor):
        await _holds_steady(js, broker.names, 6)
        assert (actor._demand.episodes, actor._demand.at_env) == (24, 24)
        assert engine.in_flight == 0


async def test_a_fixed_cap_still_holds_when_set(tokenizer, broker, js):
    env = InProcessEnv(step_delay_s=HELD_S)
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER))
    config = _engine_bound_config(max_groups_in_flight=2)
    actor = _actor(tokenizer, broker, config=config, engine=engine, env=env)
    await bus.publish_prompts(js, broker.names, [_task(f"t-{i}") for i in range(6)])
    async with _running(actor):
        await _holds_steady(js, broker.names, 2)


async def test_episodes_generating_take_only_what_the_engine_has_room_for(tokenizer, broker, js):
    """8 slots, groups of 4, generation slow: two groups, the engine full, the rest left
    on the queue for other replicas."""
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER), delay_s=HELD_S)
    actor = _actor(tokenizer, broker, config=_engine_bound_config(), engine=engine)
    await bus.publish_prompts(js, broker.names, [_task(f"t-{i}") for i in range(6)])
    async with _running(actor):
        await _holds_steady(js, broker.names, 2)
        assert engine.in_flight == 8


async def test_several_replicas_share_the_work_by_load(tokenizer, broker, js):
    """Two replicas with full engines: each takes what its own engine has room for."""
    engines = [
        ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER), delay_s=HELD_S) for _ in range(2)
    ]
    actors = [
        _actor(tokenizer, broker, config=_engine_bound_config(), engine=e, actor_id=f"a{i}")
        for i, e in enumerate(engines)
    ]
    await bus.publish_prompts(js, broker.names, [_task(f"t-{i}") for i in range(6)])
    async with _running(actors[0]), _running(actors[1]):
        await _holds_steady(js, broker.names, 4)
        assert [e.in_flight for e in engines] == [8, 8]
