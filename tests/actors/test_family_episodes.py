"""A multi-turn episode in each model family's tool-call format through the whole actor path
on Qwen's real 151k-token vocabulary: a real vLLM engine on a tiny model of
that vocabulary taught one episode per family (tests/actors/family_model.py), the calculator env
server reading that family's format (`envserver.tool_format`), the broker, and the actor
templating with the family's chat template. Greedy decoding: each family's episode must be
a tool call that reaches the env server (its result 42 comes back, the answer scores 1),
then the answer; the trajectory's tokens must be the one-shot render of the whole
conversation, decode to the family's call and answer, with the loss mask on exactly the two
assistant turns and the engine's version on exactly their tokens. The model is taught
until each taught token leads by 3 nats (tests/actors/family_model.py); measured on the taught
sequences the lead was 4.2-7.2 nats over seeds 0-3 and 1 or 2 threads, far beyond what
another CPU's rounding moves, so greedy decoding is the episode on any machine."""

from __future__ import annotations

import numpy as np
import pytest

from broker.codec import token_arrays
from broker.config import BrokerConfig
from broker.wire import PromptTask
from demo.data import SYSTEM_PROMPT
from demo.family_templates import FAMILIES, family_tokenizer
from envservers.config import EnvServerConfig
from envservers.envs.calculator import CALCULATOR_TOOLS
from envservers.server import EnvServer
from tests.actors.actor_play import play_tasks

pytestmark = pytest.mark.vllm

FORMATS = ("hermes", "qwen3_coder", "llama3_json", "mistral")
PROMPT = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": "What is 12 + 30?"},
]
ANSWER = "<answer>42</answer>"


@pytest.fixture(scope="module")
def qwen():
    from transformers import AutoTokenizer

    from demo.qwen_vocab import RanksDownloadError, build_qwen_vocab_tokenizer

    try:
        return AutoTokenizer.from_pretrained(build_qwen_vocab_tokenizer())
    except RanksDownloadError as error:
        pytest.skip(f"no cached dashscope wheel and no PyPI: {error}")


@pytest.fixture(scope="module")
def family_model_dir(qwen, tmp_path_factory):
    from tests.actors.family_model import build_family_model

    return build_family_model(
        qwen,
        [FAMILIES[name] for name in FORMATS],
        tmp_path_factory.mktemp("families") / "model",
        prompt=PROMPT,
        tools=CALCULATOR_TOOLS.specs(),  # the rows name no subset: all four
        answer=ANSWER,
        tool_result="42",
    )


@pytest.fixture(scope="module")
async def family_engine(family_model_dir):
    from actors.vllm_engine import VllmEngine, VllmEngineConfig
    from demo.engine import tiny_engine_settings

    engine = await VllmEngine.start(VllmEngineConfig(**tiny_engine_settings(family_model_dir)))
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("tool_format", FORMATS)
async def test_a_multi_turn_episode_in_each_family_s_format_on_the_real_vocabulary(
    tool_format, qwen, family_model_dir, family_engine, nats_server, bus_names
):
    family = FAMILIES[tool_format]
    tokenizer = family_tokenizer(qwen, family)
    config = EnvServerConfig(
        port=0, envs=["calculator"], metrics_port=None, drain_s=0, tool_format=tool_format
    )
    server = EnvServer(config)
    await server.start()
    broker = BrokerConfig(
        url=nats_server.url, namespace=bus_names.namespace, max_trajectory_bytes=64 << 20
    )
    task = PromptTask(
        task_id=f"family-{tool_format}",
        step=0,
        group_size=1,
        env_class="calculator",
        data_source="calculator",
        prompt=PROMPT,
        reward_spec={"method": "rule", "ground_truth": "42"},
    )
    try:
        (trajectory,) = await play_tasks(
            engine=family_engine,
            tokenizer=tokenizer,
            broker=broker,
            env_address=server.address,
            snapshot=family_model_dir,
            tasks=[task],
            sampling={"temperature": 0.0},
            rollout={"max_turns": 4, "max_generate_length": 64, "max_input_length": 1024,
                     "max_sequence_length": 1024, "overlong_filtering": False},
        )  # fmt: skip
    finally:
        await server.stop(drain_s=0, grace_s=1)

    # The call reached the env server in this format; its result came back; the answer scored.
    arrays = token_arrays(trajectory)
    played = tokenizer.decode(arrays.token_ids[trajectory.prompt_len :], skip_special_tokens=False)
    assert (trajectory.num_turns, trajectory.num_tool_calls) == (2, 1), played
    assert (trajectory.stop_reason, trajectory.reward) == ("stop", 1.0), played
    ids, mask = arrays.token_ids.tolist(), arrays.loss_mask
    # The whole sequence is the one-shot render of the conversation, in the family's format.
    conversation = [
        *PROMPT,
        {"role": "assistant", "content": family.sample_call},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": ANSWER},
    ]
    rendered = tokenizer.apply_chat_template(
        conversation, tools=CALCULATOR_TOOLS.specs(), tokenize=False
    )
    eos = tokenizer.eos_token
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    assert rendered.startswith(decoded) and decoded.endswith(ANSWER + eos)
    # The loss mask covers exactly the two assistant turns, each closed by the EOS.
    starts = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate([mask, [0]])) == -1) + 1
    spans = zip(starts, ends, strict=True)
    turns = [tokenizer.decode(ids[a:b], skip_special_tokens=False) for a, b in spans]
    assert turns == [family.sample_call + eos, ANSWER + eos]
    # Every generated token carries the engine's version, every other one -1.
    assert set(arrays.versions[mask == 1].tolist()) == {family_engine.version}
    assert set(arrays.versions[mask == 0].tolist()) == {-1}
