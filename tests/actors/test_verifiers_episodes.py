"""`verifiers` environments played through the real path: rows from `learner prepare`'s
source, a real env server hosting `verifiers:MODULE` (the environment's own rollout and
rubric), the replica's agent endpoint on the session's real vLLM engine (the shipped
calculator model), the actor's group runner. One environment of each kind verifiers has:
single-turn, multi-turn (an environment of its own), tool (ToolEnv).

Every episode's reward is what verifiers' own rubric gives the same completion, scored here
again, apart from the server; its reward functions' values are the episode's named
components; the completion the rubric saw is the engine's tokens, turn by turn."""

from __future__ import annotations

import asyncio
import json

import pytest
from transformers import AutoTokenizer

from actors.agent_endpoint import AgentEndpoint, family_tool_calls
from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.episode import Rollout
from actors.group import run_group
from broker.wire import PromptTask
from common import verifiers_envs
from demo.tinymodel import shipped_model_dir
from envservers.config import EnvServerConfig
from envservers.server import EnvServer
from protos.client import EnvClient, GrpcEnvConnector
from tests.actors.actor_play import generated_runs

pytestmark = pytest.mark.vllm

MODULE = "tests.agents.vf_calculator"
KINDS = ("single", "multi", "tool")
ROWS, GROUP = 4, 4
# Overlong filtering off: an episode whose last reply the length limit cut keeps its loss
# mask, so that its turns too are compared with the completion verifiers scored.
LIMITS = RolloutConfig(max_turns=4, max_input_length=1024, max_generate_length=96,
                       max_sequence_length=1024, overlong_filtering=False)  # fmt: skip


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory):
    return tmp_path_factory.mktemp("verifiers")


@pytest.fixture(scope="module")
async def server(transcripts):
    envs = [f"vf_{kind}=verifiers:{MODULE}" for kind in KINDS]
    plugins = {f"vf_{kind}": {"kind": kind, "transcripts": str(transcripts / f"{kind}.jsonl")}
               for kind in KINDS}  # fmt: skip
    config = EnvServerConfig(port=0, envs=envs, plugins=plugins, metrics_port=None, drain_s=0)
    async with EnvServer(config) as running:
        yield running


@pytest.fixture
async def calculator_engine(vllm_engine, tiny_model_dir):
    """The session engine holding the shipped calculator model (same architecture and
    vocabulary as the random tiny model), put back afterwards."""
    await vllm_engine.load_snapshot(str(shipped_model_dir()), 0)
    yield vllm_engine
    await vllm_engine.load_snapshot(str(tiny_model_dir), 0)


def _task(row: dict, n: int) -> PromptTask:
    return PromptTask(task_id=f"{row['env_class']}-{n}", step=0, group_size=GROUP,
                      env_class=row["env_class"], prompt=row["prompt"],
                      data_source=row["data_source"], reward_spec=row["reward_spec"],
                      extra_info=row["extra_info"])  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
async def test_a_verifiers_environment_is_scored_by_its_own_rubric(
    calculator_engine, server, transcripts, kind
):
    rows = verifiers_envs.make_rows(MODULE, size=ROWS, seed=0, settings={"kind": kind},
                                    env_class=f"vf_{kind}")  # fmt: skip
    chat = ChatTemplate(AutoTokenizer.from_pretrained(shipped_model_dir()))
    endpoint = AgentEndpoint(calculator_engine, chat, LIMITS, model_name="policy",
                             parse_tool_calls=family_tool_calls("hermes"))  # fmt: skip
    try:
        async with EnvClient(server.address, timeout_s=30, max_retries=0) as client:
            rollout = Rollout(engine=calculator_engine, env=GrpcEnvConnector(client), chat=chat,
                              limits=LIMITS, sampling=SamplingConfig(temperature=1.0),
                              env_config=EnvConfig(attempts=1), agents=endpoint)  # fmt: skip
            groups = await asyncio.gather(
                *(run_group(rollout, _task(row, n)) for n, row in enumerate(rows))
            )
    finally:
        await endpoint.stop()
    results = [result for group in groups for result in group]
    assert not endpoint.episodes and len(results) == ROWS * GROUP
    assert all(r.stop_reason in ("stop", "length") for r in results), [r.error for r in results]

    # The same completions, scored again by verifiers' own rubric of the same environment.
    env = verifiers_envs.load(MODULE, {"kind": kind})
    lines = (transcripts / f"{kind}.jsonl").read_text().splitlines()
    recorded = [json.loads(line) for line in lines]
    assert len(recorded) == len(results)
    by_replies = {}
    for record in recorded:
        replies = tuple(m["content"] for m in record["completion"] if m["role"] == "assistant")
        score = await env.rubric.score_rollout(record["prompt"], record["completion"],
                                               record["answer"], state={})  # fmt: skip
        by_replies[replies] = (score, record)
    for result in results:
        # the rubric's completion is the engine's tokens, turn by turn
        replies = tuple(chat.assistant_text(result.token_ids[start:end])
                        for start, end in generated_runs(result.loss_mask))  # fmt: skip
        score, record = by_replies[replies]
        assert result.reward == pytest.approx(score.reward, abs=1e-9)
        named = {k: v for k, v in result.env_metrics.items() if k.startswith("reward/")}
        metrics = {**score.metrics, "transcript": 0.0}  # the recorder is one of its functions
        assert named == {f"reward/{k}": pytest.approx(v) for k, v in metrics.items()}
        assert result.num_turns == len(replies)

    mean = sum(r.reward for r in results) / len(results)
    turns = sorted(r.num_turns for r in results)
    print(f"\nverifiers {kind}: {len(results)} episodes, mean reward {mean:.3f}, turns {turns}")
    if kind == "multi":  # a wrong answer was told to try again, on the same conversation
        assert any(r.num_turns > 1 for r in results)
        assert all(not r.segment_starts for r in results)
    if kind == "tool":  # the model called verifiers' tool, and saw its result
        tool_messages = [m for rec in recorded for m in rec["completion"] if m["role"] == "tool"]
        assert tool_messages and any(r.num_turns > 1 for r in results)
