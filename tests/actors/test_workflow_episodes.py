"""Agent workflows end to end on real parts but the engine: a real env server runs the
user's agent (tests/agents/workflows.py, plain `openai` calls) against the replica's real
agent endpoint, whose engine is scripted. The episode is the calls' tokens, its reward what
the agent returned; whatever the agent's code does wrong ends its episode as an error,
never a failed group or a crashed server."""

from __future__ import annotations

import asyncio

import openai
import pytest

from actors.agent_endpoint import AgentEndpoint, family_tool_calls
from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout
from actors.group import run_group
from broker.wire import PromptTask
from demo.data import make_row
from demo.tokenizer import build_tokenizer
from envservers.config import EnvServerConfig
from envservers.server import EnvServer
from protos.client import EnvClient, GrpcEnvConnector
from tests.actors.actor_play import generated_runs
from tests.agents import workflows
from tests.fakes import ScriptedEngine, by_turn

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
LIMITS = RolloutConfig(max_turns=4, max_input_length=1024, max_sequence_length=2048)
AGENTS = "tests.agents.workflows"
NAMES = ("calculator", "with_components", "solver_and_critic", "raises", "hangs", "says_yes",
         "never_calls", "calls_after_its_end")  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


@pytest.fixture(scope="module")
async def server():
    envs = [f"agent_{name}=workflow:{AGENTS}:{name}" for name in NAMES]
    envs.append("agent_verifiers_tool=verifiers:tests.agents.vf_calculator")
    plugins = {"agent_hangs": {"time_limit_s": 1.0}, "agent_verifiers_tool": {"kind": "tool"}}
    config = EnvServerConfig(port=0, envs=["calculator", *envs], plugins=plugins,
                             metrics_port=None, drain_s=0)  # fmt: skip
    async with EnvServer(config) as running:
        yield running


def _task(env_class: str, group_size: int = 2) -> PromptTask:
    row = make_row(17, 25, split="train")
    return PromptTask(task_id=f"t-{env_class}", step=0, group_size=group_size,
                      env_class=env_class, prompt=row["prompt"], data_source="calculator",
                      reward_spec=row["reward_spec"], extra_info=row["extra_info"])  # fmt: skip


async def _group(tokenizer, server, env_class, *replies, group_size=2, linger_s=0.0,
                 delay_s=0.0):  # fmt: skip
    """The group's results, its engine (each call taking `delay_s`) and endpoint (left
    serving for `linger_s` after)."""
    script = by_turn(*(replies or ("<answer>42</answer>",)))
    engine = ScriptedEngine(tokenizer, script, delay_s=delay_s)
    chat = ChatTemplate(tokenizer)
    endpoint = AgentEndpoint(engine, chat, LIMITS, model_name="policy",
                             parse_tool_calls=family_tool_calls("hermes"))  # fmt: skip
    try:
        async with EnvClient(server.address, timeout_s=10, max_retries=0) as client:
            rollout = Rollout(engine=engine, env=GrpcEnvConnector(client), chat=chat,
                              limits=LIMITS, sampling=SamplingConfig(),
                              env_config=EnvConfig(attempts=1), agents=endpoint)  # fmt: skip
            results = await run_group(rollout, _task(f"agent_{env_class}", group_size))
            await asyncio.sleep(linger_s)
    finally:
        await endpoint.stop()
    return results, engine, endpoint


async def test_an_agent_loop_with_tools_is_trained_on_the_engines_own_tokens(tokenizer, server):
    results, engine, endpoint = await _group(tokenizer, server, "calculator",
                                             TOOL_CALL, "<answer>42</answer>")  # fmt: skip
    assert not endpoint.episodes  # every key closed
    generated = [g.token_ids for g in engine.generations]
    for result in results:
        assert (result.stop_reason, result.reward, result.num_turns) == ("stop", 1.0, 2)
        policy = [t for t, m in zip(result.token_ids, result.loss_mask, strict=True) if m]
        assert len(policy) == sum(len(ids) for ids in generated) // len(results)
        assert (
            tokenizer.decode(policy) == f"{TOOL_CALL}<|im_end|>" + "<answer>42</answer><|im_end|>"
        )
    # The second call's prompt is the first call's tokens, its answer and the tool result's
    # templated delta: what the env-stepped episode of the same task holds.
    stepped = await _stepped(tokenizer, server)
    assert results[0].token_ids == stepped.token_ids
    assert results[0].loss_mask == stepped.loss_mask


async def test_an_agents_model_calls_are_timed_as_generating_not_as_tool_time(tokenizer, server):
    # The auto staleness bound rises on time in tools: an agent whose run is mostly its model
    # calls must not read as a tool-bound episode.
    results, _, _ = await _group(tokenizer, server, "calculator", TOOL_CALL,
                                 "<answer>42</answer>", delay_s=0.5)  # fmt: skip
    for result in results:
        assert result.num_turns == 2
        assert result.timing["generate_s"] >= 2 * 0.5
        assert result.timing["env_s"] < result.timing["generate_s"]  # HTTP and its own add


async def _stepped(tokenizer, server):
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, "<answer>42</answer>"))
    async with EnvClient(server.address, timeout_s=10, max_retries=0) as client:
        rollout = Rollout(engine=engine, env=GrpcEnvConnector(client),
                          chat=ChatTemplate(tokenizer), limits=LIMITS,
                          sampling=SamplingConfig(), env_config=EnvConfig(attempts=1))  # fmt: skip
        (result,) = await run_group(rollout, _task("calculator", 1))
    return result


async def test_a_dict_score_carries_named_components(tokenizer, server):
    results, _, _ = await _group(tokenizer, server, "with_components", "<answer>41</answer>")
    for result in results:
        assert result.stop_reason == "stop" and result.reward == 0.0
        assert result.env_metrics == {
            "reward/correct": 0.0,
            "reward/length": len("<answer>41</answer>"),
            "agent_conversations": 1.0,
        }


@pytest.mark.parametrize(
    ("env_class", "stop_reason", "says"),
    [
        ("raises", "error:workflow", "RuntimeError: the agent's own bug"),
        ("hangs", "error:workflow", "ran past its time limit (1 s)"),
        ("says_yes", "error:workflow", "returned 'yes': a score must be a finite number"),
        ("never_calls", "error:workflow", "never called the model"),
    ],
)
async def test_a_failing_agent_ends_its_episodes_as_errors(tokenizer, server, env_class,
                                                           stop_reason, says):  # fmt: skip
    results, _, endpoint = await _group(tokenizer, server, env_class)
    assert not endpoint.episodes
    for result in results:
        assert result.stop_reason == stop_reason and says in result.error
        assert result.reward == 0.0 and not any(result.loss_mask)


async def test_a_second_agent_in_an_episode_is_a_conversation_of_its_own(tokenizer, server):
    """A solver, then a critic shown only the answer: one trajectory per episode holding
    both conversations one after another, the second marked where it begins; its prompt is
    templated afresh, never appended to the solver's tokens."""
    results, engine, _ = await _group(tokenizer, server, "solver_and_critic", "<answer>42</answer>")
    chat = ChatTemplate(tokenizer)
    critique = [{"role": "user", "content": "Is this right? <answer>42</answer>"}]
    for result in results:
        assert (result.stop_reason, result.reward, result.num_turns) == ("stop", 1.0, 2)
        (start,) = result.segment_starts
        second = result.token_ids[start:]
        assert second[: len(chat.prompt_ids(critique))] == chat.prompt_ids(critique)
        assert result.env_metrics["agent_conversations"] == 2.0
        assert sum(result.loss_mask[:start]) and sum(result.loss_mask[start:])


async def test_a_verifiers_tool_environment_runs_its_own_rollout_and_rubric(tokenizer, server):
    """verifiers' ToolEnv: its rollout sends its tools, runs its `add` on the parsed call and
    continues the conversation; its rubric's weighted sum is the reward, each function a
    named component."""
    results, engine, _ = await _group(tokenizer, server, "verifiers_tool",
                                      TOOL_CALL, "<answer>42</answer>")  # fmt: skip
    tool_result = ChatTemplate(tokenizer).observation_ids(
        [{"role": "tool", "content": "42", "tool_call_id": "x"}]
    )
    for result in results:
        assert (result.stop_reason, result.reward, result.num_turns) == ("stop", 1.0, 2)
        assert result.env_metrics == {"reward/correct_answer": 1.0, "reward/used_a_tool": 1.0,
                                      "agent_conversations": 1.0}  # fmt: skip
        (first, second) = generated_runs(result.loss_mask)
        assert _contains(result.token_ids[first[1] : second[0]], tool_result)


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[k : k + len(part)] == part for k in range(len(ids) - len(part) + 1))


async def test_a_call_after_the_episode_ended_is_refused(tokenizer, server):
    workflows.LEFTOVER.clear()
    results, _, _ = await _group(tokenizer, server, "calls_after_its_end", group_size=1,
                                 linger_s=1.5)  # fmt: skip
    assert results[0].stop_reason == "stop"
    (refused,) = [e for e in workflows.LEFTOVER if isinstance(e, Exception)]
    assert isinstance(refused, openai.AuthenticationError)
