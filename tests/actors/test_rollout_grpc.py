"""The rollout against real env servers over gRPC (protos.client.GrpcEnvConnector around
protos.client.EnvClient), on the scripted engine: observations templated from what the
real calculator env returned, a dead address skipped, a server lost mid-episode replaced
by another (the episode replayed there), and env outages as error stop reasons."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout
from actors.group import run_group
from broker.wire import PromptTask
from common.procs import free_port
from demo.chat_template import observation_delta
from demo.data import SYSTEM_PROMPT
from demo.tokenizer import build_tokenizer
from envservers.config import EnvServerConfig
from envservers.server import EnvServer
from protos.client import EnvClient, GrpcEnvConnector, TaskRejected
from tests.fakes import ScriptedEngine, by_turn

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
ANSWER = "<answer>42</answer>"
LIMITS = RolloutConfig(max_turns=4, max_input_length=1024, max_sequence_length=2048)
RETRY = EnvConfig(attempts=3, backoff_s=0.05)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


@pytest.fixture
async def servers():
    started = []
    for _ in range(2):
        server = EnvServer(
            EnvServerConfig(port=0, envs=["calculator"], metrics_port=None, drain_s=0)
        )
        await server.start()
        started.append(server)
    yield started
    for server in started:
        await server.stop(drain_s=0, grace_s=1)


def _task(group_size=2, env_class="calculator") -> PromptTask:
    return PromptTask(
        task_id="g1",
        step=0,
        group_size=group_size,
        env_class=env_class,
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "What is 17 + 25?"},
        ],
        data_source="calculator",
        reward_spec={"method": "rule", "ground_truth": "42"},
    )


async def _group(tokenizer, addresses, script=None, task=None):
    async with EnvClient(addresses, timeout_s=5, max_retries=0) as client:
        return await run_group(
            Rollout(
                engine=ScriptedEngine(tokenizer, script or by_turn(TOOL_CALL, ANSWER)),
                env=GrpcEnvConnector(client),
                chat=ChatTemplate(tokenizer),
                limits=LIMITS,
                sampling=SamplingConfig(),
                env_config=RETRY,
            ),
            task or _task(),
        )


async def test_observations_come_from_the_real_env_as_template_deltas(tokenizer, servers):
    results = await _group(tokenizer, [servers[0].address])
    delta = observation_delta([{"role": "tool", "content": "42"}])
    for result in results:
        assert (result.reward, result.stop_reason, result.num_tool_calls) == (1.0, "stop", 1)
        ids, mask = np.array(result.token_ids), np.array(result.loss_mask)
        masked_out = tokenizer.decode(ids[result.prompt_len :][mask[result.prompt_len :] == 0])
        assert masked_out == delta
        assert tokenizer.decode(ids[mask == 1].tolist()) == (
            f"{TOOL_CALL}<|im_end|>{ANSWER}<|im_end|>"
        )


async def test_dead_address_is_skipped(tokenizer, servers):
    dead = f"127.0.0.1:{free_port()}"
    results = await _group(tokenizer, [dead, servers[0].address])
    assert [r.stop_reason for r in results] == ["stop", "stop"]
    assert sum(r.num_env_retries for r in results) >= 1


async def test_server_lost_mid_episode_is_replayed_on_another(tokenizer, servers):
    first, second = servers
    replies = by_turn(TOOL_CALL, ANSWER)
    stopped = []

    def script(prompt_text):
        reply = replies(prompt_text)
        if reply == ANSWER and not stopped:
            stopped.append(True)
            # The server holding the sessions goes away before turn 2 is stepped.
            asyncio.get_running_loop().create_task(first.stop(drain_s=0, grace_s=0))
        return reply

    # Sessions go round robin; with one sample, it opens on `first`.
    results = await _group(
        tokenizer, [first.address, second.address], script=script, task=_task(group_size=1)
    )
    (result,) = results
    assert (result.stop_reason, result.reward, result.num_turns) == ("stop", 1.0, 2)
    assert result.num_env_retries >= 1


async def test_all_servers_down_end_episodes_with_an_error(tokenizer):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    results = await _group(tokenizer, dead)
    assert [r.stop_reason for r in results] == ["error:env_open"] * 2
    assert [r.reward for r in results] == [0.0, 0.0]


async def test_unknown_env_class_rejects_the_task(tokenizer, servers):
    with pytest.raises(TaskRejected, match="unknown environment"):
        await _group(tokenizer, [servers[0].address], task=_task(env_class="chess"))


async def test_the_only_server_restarting_on_its_address_is_waited_for_and_replayed(tokenizer):
    # One env server (as in `make run`): it dies before turn 2 and comes back on the same
    # port a second later, with no sessions. The episode re-opens there once it answers
    # (the channel reconnects within protos.channel.MAX_RECONNECT_BACKOFF_MS) and replays.
    port = free_port()

    def config() -> EnvServerConfig:
        return EnvServerConfig(port=port, envs=["calculator"], metrics_port=None, drain_s=0)

    server = EnvServer(config())
    await server.start()
    replies = by_turn(TOOL_CALL, ANSWER)
    restarted: list[EnvServer] = []

    async def restart() -> None:
        await server.stop(drain_s=0, grace_s=0)
        await asyncio.sleep(1.0)
        again = EnvServer(config())
        await again.start()
        restarted.append(again)

    def script(prompt_text):
        reply = replies(prompt_text)
        if reply == ANSWER and not restarted:
            asyncio.get_running_loop().create_task(restart())
        return reply

    retry = EnvConfig(attempts=6, backoff_s=0.2, max_backoff_s=1.0)  # ~3.4 s of retries
    try:
        async with EnvClient([f"127.0.0.1:{port}"], timeout_s=5, max_retries=0) as client:
            (result,) = await run_group(
                Rollout(
                    engine=ScriptedEngine(tokenizer, script),
                    env=GrpcEnvConnector(client),
                    chat=ChatTemplate(tokenizer),
                    limits=LIMITS,
                    sampling=SamplingConfig(),
                    env_config=retry,
                ),
                _task(group_size=1),
            )
    finally:
        for s in restarted:
            await s.stop(drain_s=0, grace_s=0)
    assert restarted, "the server was never restarted: the test proved nothing"
    assert (result.stop_reason, result.reward, result.num_turns) == ("stop", 1.0, 2)
    assert result.num_env_retries >= 1
